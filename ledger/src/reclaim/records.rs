//! What the reclaim API reads and writes, typed: decisions, exemptions and deliveries
//! (`GET /api/v1/reclaims`, `/api/v1/exemptions`, `/api/v1/webhooks/…`). Every query binds its
//! values; a `tenant:` token's scope is a bound parameter of the query, not a filter afterwards.

use duckdb::{Connection, params};
use serde::{Deserialize, Serialize};

/// One decision (a row of `reclaim_decisions`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// When (Unix seconds).
    pub decided_at: i64,
    /// The episode.
    pub episode_id: String,
    /// Tenant.
    pub tenant: Option<String>,
    /// Workload.
    pub workload: Option<String>,
    /// Node.
    pub node: String,
    /// notify | request | cancel | resolve | hold | close.
    pub decision: String,
    /// The event's cause, or the hold's reason.
    pub reason: String,
    /// The policy's sentence.
    pub detail: String,
    /// Whether the aggregator ran in dry-run.
    pub dry_run: bool,
    /// The event sent, if any (its `webhook-id`).
    pub event_id: Option<String>,
}

/// Decisions in `[from, to)`, newest first, at most `limit`.
pub fn decisions(
    conn: &Connection,
    from: i64,
    to: i64,
    tenant: Option<&str>,
    limit: i64,
) -> duckdb::Result<Vec<Decision>> {
    let mut stmt = conn.prepare_cached(
        "SELECT decided_at, episode_id, tenant, workload, node, decision, reason, detail, dry_run,
                event_id
         FROM reclaim_decisions
         WHERE decided_at >= ? AND decided_at < ? AND (? IS NULL OR tenant = ?)
         ORDER BY decided_at DESC, rowid DESC LIMIT ?",
    )?;
    stmt.query_map(params![from, to, tenant, tenant, limit], |r| {
        Ok(Decision {
            decided_at: r.get(0)?,
            episode_id: r.get(1)?,
            tenant: r.get(2)?,
            workload: r.get(3)?,
            node: r.get(4)?,
            decision: r.get(5)?,
            reason: r.get(6)?,
            detail: r.get(7)?,
            dry_run: r.get(8)?,
            event_id: r.get(9)?,
        })
    })?
    .collect()
}

/// A snooze or exemption (a row of `reclaim_exemptions`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exemption {
    /// Its id.
    pub exemption_id: String,
    /// Tenant (null: every tenant; only an admin can make one).
    pub tenant: Option<String>,
    /// Workload glob (null: every workload of the tenant).
    pub workload: Option<String>,
    /// Until (Unix seconds).
    pub until: i64,
    /// Why.
    pub reason: String,
    /// Who made it (the token's role, never the token).
    pub created_by: String,
    /// When.
    pub created_at: i64,
}

/// `POST /api/v1/exemptions`'s body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewExemption {
    /// Tenant; a `tenant:` token may only name its own (and defaults to it).
    pub tenant: Option<String>,
    /// Workload glob (`*`, `?`), e.g. a pod `ns/name` or a Slurm job id.
    pub workload: Option<String>,
    /// How long, humantime (`"4h"`).
    pub duration: String,
    /// Why (shown with the decisions it causes).
    pub reason: Option<String>,
}

/// The longest reason an exemption may carry: a sentence or two, shown beside each decision it
/// causes.
pub const MAX_REASON_BYTES: usize = 1024;

/// A page of the exemptions in force at `now` (of `tenant`, or all): at most `limit`, in the
/// order of their ids (the order they were made in), starting after the id `after`.
pub fn exemptions(
    conn: &Connection,
    now: i64,
    tenant: Option<&str>,
    after: Option<&str>,
    limit: i64,
) -> duckdb::Result<Vec<Exemption>> {
    let mut stmt = conn.prepare_cached(
        "SELECT exemption_id, tenant, workload, until, reason, created_by, created_at
         FROM reclaim_exemptions
         WHERE until > ? AND (? IS NULL OR tenant = ?) AND exemption_id > coalesce(?, '')
         ORDER BY exemption_id
         LIMIT ?",
    )?;
    stmt.query_map(params![now, tenant, tenant, after, limit], |r| {
        Ok(Exemption {
            exemption_id: r.get(0)?,
            tenant: r.get(1)?,
            workload: r.get(2)?,
            until: r.get(3)?,
            reason: r.get(4)?,
            created_by: r.get(5)?,
            created_at: r.get(6)?,
        })
    })?
    .collect()
}

/// How many exemptions of `tenant` (`None`: those for every tenant) are in force at `now`.
pub fn exemptions_in_force(
    conn: &Connection,
    now: i64,
    tenant: Option<&str>,
) -> duckdb::Result<u64> {
    conn.query_row(
        "SELECT count(*) FROM reclaim_exemptions WHERE until > ? AND tenant IS NOT DISTINCT FROM ?",
        params![now, tenant],
        |r| r.get(0),
    )
}

/// Stores one exemption, in the writer's transaction.
pub fn insert_exemption(tx: &duckdb::Transaction<'_>, e: &Exemption) -> duckdb::Result<()> {
    tx.execute(
        "INSERT INTO reclaim_exemptions VALUES (?, ?, ?, ?, ?, ?, ?)",
        params![
            e.exemption_id,
            e.tenant,
            e.workload,
            e.until,
            e.reason,
            e.created_by,
            e.created_at
        ],
    )?;
    Ok(())
}

/// Ends an exemption now; the number of rows changed (0: none with that id in scope).
pub fn end_exemption(
    tx: &duckdb::Transaction<'_>,
    id: &str,
    tenant: Option<&str>,
    now: i64,
) -> duckdb::Result<usize> {
    tx.execute(
        "UPDATE reclaim_exemptions SET until = ?
         WHERE exemption_id = ? AND until > ? AND (? IS NULL OR tenant = ?)",
        params![now, id, now, tenant, tenant],
    )
}

/// One outbox row, for the admin API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    /// The event's id (`webhook-id`).
    pub event_id: String,
    /// The endpoint's name.
    pub endpoint: String,
    /// The event type.
    pub event_type: String,
    /// The episode.
    pub episode_id: String,
    /// When it was decided, or last re-queued by a replay (`max_age` counts from it).
    pub created_at: i64,
    /// pending | delivered | failed | cancelled | disabled.
    pub state: String,
    /// Attempts made.
    pub attempts: i32,
    /// The next attempt (pending rows).
    pub next_attempt_at: i64,
    /// When it was delivered.
    pub delivered_at: Option<i64>,
    /// The last HTTP status.
    pub last_status: Option<i32>,
    /// The last error.
    pub last_error: Option<String>,
}

/// Outbox rows, newest first.
pub fn deliveries(
    conn: &Connection,
    state: Option<&str>,
    endpoint: Option<&str>,
    event_id: Option<&str>,
    limit: i64,
) -> duckdb::Result<Vec<Delivery>> {
    let mut stmt = conn.prepare_cached(
        "SELECT event_id, endpoint, event_type, episode_id, created_at, state, attempts,
                next_attempt_at, delivered_at, last_status, last_error
         FROM webhook_outbox
         WHERE (? IS NULL OR state = ?) AND (? IS NULL OR endpoint = ?) AND (? IS NULL OR event_id = ?)
         ORDER BY created_at DESC, event_id LIMIT ?",
    )?;
    stmt.query_map(
        params![state, state, endpoint, endpoint, event_id, event_id, limit],
        |r| {
            Ok(Delivery {
                event_id: r.get(0)?,
                endpoint: r.get(1)?,
                event_type: r.get(2)?,
                episode_id: r.get(3)?,
                created_at: r.get(4)?,
                state: r.get(5)?,
                attempts: r.get(6)?,
                next_attempt_at: r.get(7)?,
                delivered_at: r.get(8)?,
                last_status: r.get(9)?,
                last_error: r.get(10)?,
            })
        },
    )?
    .collect()
}

/// The outbox states.
pub const DELIVERY_STATES: [&str; 5] = ["pending", "delivered", "failed", "cancelled", "disabled"];

/// `POST /api/v1/webhooks/replay`'s body: send events again, under their own ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    /// Only this event (`webhook-id`).
    pub event_id: Option<String>,
    /// Only events decided at or after this (RFC 3339 or Unix seconds).
    pub from: Option<String>,
    /// Only events decided before this.
    pub to: Option<String>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Which states to send again (default: failed and disabled — a retry; add `delivered` to
    /// replay what a receiver lost).
    #[serde(default)]
    pub states: Vec<String>,
}

/// Puts matching rows back to `pending`, due now; returns how many.
#[allow(clippy::too_many_arguments)]
pub fn requeue(
    tx: &duckdb::Transaction<'_>,
    event_id: Option<&str>,
    from: i64,
    to: i64,
    endpoint: Option<&str>,
    states: &[String],
    now: i64,
) -> duckdb::Result<usize> {
    let mut n = 0;
    for state in states {
        // A reclaim request is only sent again while its episode is still `requested`: a
        // cancelled one, or one whose episode ended, must never reach a scheduler. The row's age
        // (max_age) counts from the re-queue.
        n += tx.execute(
            "UPDATE webhook_outbox SET state = 'pending', next_attempt_at = ?, created_at = ?,
                 attempts = 0, last_error = NULL
             WHERE state = ? AND created_at >= ? AND created_at < ?
               AND (? IS NULL OR event_id = ?) AND (? IS NULL OR endpoint = ?)
               AND (event_type <> 'reclaim.requested' OR episode_id IN
                    (SELECT episode_id FROM reclaim_episodes WHERE state = 'requested'))",
            params![
                now, now, state, from, to, event_id, event_id, endpoint, endpoint
            ],
        )?;
    }
    Ok(n)
}

/// Enables an endpoint a 410 disabled; its `disabled` rows go back to `pending`.
pub fn enable_endpoint(
    tx: &duckdb::Transaction<'_>,
    endpoint: &str,
    now: i64,
) -> duckdb::Result<usize> {
    tx.execute(
        "DELETE FROM webhook_endpoints WHERE endpoint = ?",
        [endpoint],
    )?;
    tx.execute(
        "UPDATE webhook_outbox SET state = 'pending', next_attempt_at = ?
         WHERE endpoint = ? AND state = 'disabled'
           AND (event_type <> 'reclaim.requested' OR episode_id IN
                (SELECT episode_id FROM reclaim_episodes WHERE state = 'requested'))",
        params![now, endpoint],
    )
}
