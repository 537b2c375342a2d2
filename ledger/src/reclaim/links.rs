//! Keep links' state in the ledger: the keys that sign them (`keep_link_keys`) and the keeps made
//! through them (`reclaim_keeps`), read and written here (docs/reclaim.md, "Keep links"; the
//! token itself: [`gpuledger_schema::keep`]).
//!
//! Key decision: the keys are rows of the ledger, not a key file, so issued links survive a
//! restart and a restore, with no other path to deploy or back up.

use duckdb::{Connection, params};
use gpuledger_schema::keep::Key;

use super::records::{self, Exemption};

/// The keys that verify links at `now`, the signing one (the newest without `retired_at`) first;
/// makes one with `fresh` secret bytes when none signs.
pub fn load_or_create(
    conn: &Connection,
    now: i64,
    fresh: impl FnOnce() -> Vec<u8>,
) -> duckdb::Result<Vec<Key>> {
    let signing: i64 = conn.query_row(
        "SELECT count(*) FROM keep_link_keys WHERE retired_at IS NULL",
        [],
        |r| r.get(0),
    )?;
    if signing == 0 {
        conn.execute(
            "INSERT INTO keep_link_keys
             SELECT coalesce(max(key_id), 0) + 1, ?, ?, NULL FROM keep_link_keys",
            params![fresh(), now],
        )?;
    }
    keys(conn, now)
}

/// The keys that verify links at `now`, the signing one first.
pub fn keys(conn: &Connection, now: i64) -> duckdb::Result<Vec<Key>> {
    let mut stmt = conn.prepare(
        "SELECT key_id, secret FROM keep_link_keys
         WHERE retired_at IS NULL OR retired_at > ?
         ORDER BY retired_at IS NULL DESC, key_id DESC",
    )?;
    stmt.query_map([now], |r| {
        Ok(Key {
            id: r.get::<_, i64>(0)? as u32,
            secret: r.get(1)?,
        })
    })?
    .collect()
}

/// Rotates the key, in the writer's transaction: a new key signs from now, and the one that
/// signed until now verifies until `retire_at` (now + `link_ttl`: its links work until they
/// would expire anyway; now: every link it signed is refused).
pub fn rotate(
    tx: &duckdb::Transaction<'_>,
    now: i64,
    retire_at: i64,
    secret: Vec<u8>,
) -> duckdb::Result<()> {
    tx.execute(
        "UPDATE keep_link_keys SET retired_at = ? WHERE retired_at IS NULL",
        [retire_at],
    )?;
    // The new key's id before any retired key goes: an id is never used twice.
    tx.execute(
        "INSERT INTO keep_link_keys
         SELECT coalesce(max(key_id), 0) + 1, ?, ?, NULL FROM keep_link_keys",
        params![secret, now],
    )?;
    tx.execute("DELETE FROM keep_link_keys WHERE retired_at <= ?", [now])?;
    Ok(())
}

/// Seconds kept through links for `episode_id` so far.
pub fn kept_seconds(conn: &Connection, episode_id: &str) -> duckdb::Result<i64> {
    conn.query_row(
        "SELECT coalesce(sum(seconds), 0)::BIGINT FROM reclaim_keeps WHERE episode_id = ?",
        [episode_id],
        |r| r.get(0),
    )
}

/// What a keep through a link did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeepOutcome {
    /// The exemption is stored.
    Kept,
    /// The episode's bound would be passed: `used` seconds were kept through links already.
    EpisodeBound {
        /// Seconds kept so far.
        used: i64,
    },
    /// The tenant has `n` exemptions in force, the most it may have.
    TenantBound {
        /// In force now.
        n: u64,
    },
}

/// Stores the exemption `e` made through `episode_id`'s link, `seconds` long, in the writer's
/// transaction, unless the episode would pass `max_per_episode` seconds kept through links (the
/// requested seconds count, whether or not an earlier keep is still in force) or the tenant has
/// `max_per_tenant` exemptions in force.
pub fn keep(
    tx: &duckdb::Transaction<'_>,
    e: &Exemption,
    episode_id: &str,
    seconds: i64,
    max_per_episode: i64,
    max_per_tenant: u64,
) -> duckdb::Result<KeepOutcome> {
    let used = kept_seconds(tx, episode_id)?;
    if used + seconds > max_per_episode {
        return Ok(KeepOutcome::EpisodeBound { used });
    }
    let n = records::exemptions_in_force(tx, e.created_at, e.tenant.as_deref())?;
    if n >= max_per_tenant {
        return Ok(KeepOutcome::TenantBound { n });
    }
    records::insert_exemption(tx, e)?;
    tx.execute(
        "INSERT INTO reclaim_keeps VALUES (?, ?, ?, ?)",
        params![episode_id, e.exemption_id, seconds, e.created_at],
    )?;
    Ok(KeepOutcome::Kept)
}

/// The exemption in force at `now` made through a link for `tenant`'s `workload`, latest first:
/// its end.
pub fn kept_until(
    conn: &Connection,
    now: i64,
    tenant: &str,
    workload: &str,
) -> duckdb::Result<Option<i64>> {
    conn.query_row(
        "SELECT max(until) FROM reclaim_exemptions
         WHERE until > ? AND tenant = ? AND workload = ? AND created_by = 'link'",
        params![now, tenant, workload],
        |r| r.get(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Connection {
        crate::store::open(std::path::Path::new(":memory:"))
            .unwrap()
            .0
    }

    fn exemption(id: &str, now: i64, secs: i64) -> Exemption {
        Exemption {
            exemption_id: id.into(),
            tenant: Some("ml".into()),
            workload: Some("lab/nb".into()),
            until: now + secs,
            reason: "kept through the notice link".into(),
            created_by: "link".into(),
            created_at: now,
        }
    }

    #[test]
    fn a_key_is_made_once_and_found_again() {
        let conn = ledger();
        let a = load_or_create(&conn, 100, || vec![1; 32]).unwrap();
        let b = load_or_create(&conn, 200, || vec![2; 32]).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!((b[0].id, &b[0].secret), (a[0].id, &a[0].secret));
    }

    #[test]
    fn a_rotated_key_verifies_until_it_retires_and_the_new_one_signs() {
        let mut conn = ledger();
        load_or_create(&conn, 100, || vec![1; 32]).unwrap();
        let tx = conn.transaction().unwrap();
        rotate(&tx, 200, 300, vec![2; 32]).unwrap();
        tx.commit().unwrap();
        let ks = keys(&conn, 250).unwrap();
        assert_eq!(ks.iter().map(|k| k.id).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(keys(&conn, 300).unwrap().len(), 1, "retired at 300");
        let tx = conn.transaction().unwrap();
        rotate(&tx, 400, 400, vec![3; 32]).unwrap();
        tx.commit().unwrap();
        assert_eq!(keys(&conn, 400).unwrap()[0].id, 3);
        assert_eq!(keys(&conn, 400).unwrap().len(), 1, "revoked at once");
    }

    #[test]
    fn keeps_stop_at_the_episode_bound_counting_what_was_asked() {
        let mut conn = ledger();
        let tx = conn.transaction().unwrap();
        let ep = "ep_0123456789abcdef01234567";
        assert_eq!(
            keep(&tx, &exemption("exm_1", 0, 4), ep, 4, 10, 100).unwrap(),
            KeepOutcome::Kept
        );
        assert_eq!(
            keep(&tx, &exemption("exm_2", 1, 4), ep, 4, 10, 100).unwrap(),
            KeepOutcome::Kept,
            "a second keep while the first is in force counts again"
        );
        assert_eq!(
            keep(&tx, &exemption("exm_3", 10, 4), ep, 4, 10, 100).unwrap(),
            KeepOutcome::EpisodeBound { used: 8 }
        );
        assert_eq!(
            keep(
                &tx,
                &exemption("exm_4", 10, 4),
                "ep_ffffffffffffffffffffffff",
                4,
                10,
                1
            )
            .unwrap(),
            KeepOutcome::Kept
        );
        assert_eq!(
            keep(
                &tx,
                &exemption("exm_5", 11, 4),
                "ep_eeeeeeeeeeeeeeeeeeeeeeee",
                4,
                10,
                1
            )
            .unwrap(),
            KeepOutcome::TenantBound { n: 1 }
        );
        tx.commit().unwrap();
        assert_eq!(kept_seconds(&conn, ep).unwrap(), 8);
        assert_eq!(kept_until(&conn, 11, "ml", "lab/nb").unwrap(), Some(14));
    }
}
