//! The aggregator's own metrics, served at its `/metrics`. Each family's help text is its doc.
//!
//! Internal events are small typed values whose `emit` both logs and counts
//! ([`IngestRejected`]), so a log line and its counter never disagree.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use gpuledger_ledger::store::writer::WriteObserver;

/// A bounded reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// One of a fixed set.
    pub reason: &'static str,
}

/// A ledger table label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabels {
    /// The table (a fixed set: `store::query::COUNTED_TABLES`).
    pub table: String,
}

/// A tenant and SLO class (empty when none). Bounded by the tenants the ledger knows.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    /// Tenant.
    pub tenant: String,
    /// SLO class, or empty.
    pub slo_class: String,
}

/// One open hoarding episode. Bounded by the instances in the fleet: a series exists only while
/// its episode is open and is removed when it ends.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EpisodeLabels {
    /// Tenant.
    pub tenant: String,
    /// Workload, or empty.
    pub workload: String,
    /// Node.
    pub node: String,
    /// GPU UUID.
    pub gpu: String,
    /// GPU instance id, empty for a whole GPU.
    pub gpu_instance: String,
    /// SLO class, or empty.
    pub slo_class: String,
}

/// A webhook endpoint (its configured name; never the URL, which may carry credentials).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// The endpoint's name.
    pub endpoint: String,
}

/// A webhook endpoint and what an attempt came to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointOutcomeLabels {
    /// The endpoint's name.
    pub endpoint: String,
    /// delivered | retry | throttled | gone | failed.
    pub outcome: &'static str,
}

/// What a request to a keep link came to (a fixed set; never the token or the path).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeepOutcomeLabels {
    /// shown | kept | forbidden | gone | bound.
    pub outcome: &'static str,
}

/// A reclaim decision: `event` with the event type, or `hold` with its reason (fixed sets).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// event | hold.
    pub decision: String,
    /// The event type or the hold's reason.
    pub reason: String,
}

/// A node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// Node name.
    pub node: String,
}

/// Why an ingest request was refused; the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// No or unknown token (401).
    Unauthorized,
    /// A token used for another node (403).
    Forbidden,
    /// The batch breaks a rule (400), or is not in a format the aggregator reads (415).
    Invalid,
    /// The body is over a limit (413).
    TooLarge,
    /// The writer is behind (503; the exporter retries).
    Overloaded,
    /// No ingest slot for this token or at all (429/503; the exporter retries).
    Throttled,
    /// The body did not arrive in time (408; the exporter retries).
    Timeout,
    /// A valid batch the store will not take (422; the exporter sets it aside).
    Unstorable,
    /// The store failed (5xx; the exporter retries).
    StoreError,
}

impl RejectReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Unauthorized => "unauthorized",
            RejectReason::Forbidden => "forbidden",
            RejectReason::Invalid => "invalid",
            RejectReason::TooLarge => "too_large",
            RejectReason::Overloaded => "overloaded",
            RejectReason::Throttled => "throttled",
            RejectReason::Timeout => "timeout",
            RejectReason::Unstorable => "unstorable",
            RejectReason::StoreError => "store_error",
        }
    }
}

/// An ingest request that was refused.
pub struct IngestRejected<'a> {
    /// Why.
    pub reason: RejectReason,
    /// The node the request claimed to speak for, when known.
    pub node: Option<&'a str>,
    /// The error's message.
    pub message: &'a str,
}

impl IngestRejected<'_> {
    /// Logs the refusal (a warning: the sender keeps or drops the batch and says so itself) and
    /// counts it.
    pub fn emit(&self, m: &AggregatorMetrics) {
        tracing::warn!(
            reason = self.reason.as_str(),
            node = self.node.unwrap_or("-"),
            message = self.message,
            "An ingest request was refused."
        );
        m.rejected
            .get_or_create(&ReasonLabels {
                reason: self.reason.as_str(),
            })
            .inc();
    }
}

/// Every own family.
pub struct AggregatorMetrics {
    registry: Registry,
    /// Batches stored (duplicates excluded).
    pub batches: Counter,
    /// Samples stored.
    pub samples: Counter,
    /// Batches whose id had been stored before.
    pub duplicate_batches: Counter,
    /// Samples not stored because the ledger held them already.
    pub duplicate_samples: Counter,
    /// Refused ingest requests by reason.
    pub rejected: Family<ReasonLabels, Counter>,
    /// Samples waiting for the writer.
    pub queue_samples: Gauge,
    /// The writer queue's capacity.
    pub queue_capacity: Gauge,
    /// Time to write and commit one group of batches.
    pub commit_seconds: Histogram,
    /// Newest sample second written.
    pub newest_sample: Gauge,
    /// (instance, holder, minute) deltas stored as raw rows, not yet folded into the rollups.
    pub held_rows: Gauge,
    /// Samples folded into the rollups by a recovery (after a crash or a failed write).
    pub recovered_samples: Counter,
    /// Time the fold thread takes to fold what the writer held.
    pub fold_seconds: Histogram,
    /// Rows per table.
    pub rows: Family<TableLabels, Gauge>,
    /// Database file + WAL bytes.
    pub database_bytes: Gauge,
    /// Bytes DuckDB's buffer manager holds in memory.
    pub store_memory_bytes: Gauge,
    /// The process's resident memory.
    pub resident_bytes: Gauge,
    /// Rows deleted by retention, per table.
    pub retention_deleted: Family<TableLabels, Counter>,
    /// Raw rows the hourly rewrite put in instance order.
    pub raw_rewritten: Counter,
    /// The end of the last hour whose raw rows were rewritten (0 while none was).
    pub raw_rewritten_until: Gauge,
    /// The ledger's families (tenants, hoarding, fragmentation): shown only to tokens that may
    /// read them ([`AggregatorMetrics::ledger_for`]).
    pub ledger: LedgerFamilies,
    /// The figures the ledger families were last set from, to render a tenant's own share.
    current: std::sync::Mutex<gpuledger_ledger::analytics::Current>,
    /// When the analytics last succeeded.
    pub analytics_last_success: Gauge,
    /// How long an evaluation takes.
    pub analytics_seconds: Histogram,
    /// Reclaim decisions (events sent, holds first recorded).
    pub reclaim_decisions: Family<DecisionLabels, Counter>,
    /// Reclaims held back by the blast-radius bound, per pass.
    pub reclaim_deferred: Counter,
    /// When the reclaim pass last ran.
    pub reclaim_last_pass: Gauge,
    /// Webhook attempts by endpoint and outcome.
    pub webhook_deliveries: Family<EndpointOutcomeLabels, Counter>,
    /// Requests to keep links by outcome.
    pub keep_requests: Family<KeepOutcomeLabels, Counter>,
    /// Undelivered events per endpoint.
    pub webhook_pending: Family<EndpointLabels, Gauge>,
    /// Age of the oldest undelivered event per endpoint.
    pub webhook_oldest_pending_age: Family<EndpointLabels, Gauge>,
    /// 1 while an endpoint is disabled (it answered 410).
    pub webhook_endpoint_disabled: Family<EndpointLabels, Gauge>,
    /// Time one webhook attempt takes.
    pub webhook_attempt_seconds: Histogram,
}

impl AggregatorMetrics {
    /// Registers every family.
    pub fn new() -> AggregatorMetrics {
        let mut r = Registry::default();
        let m = AggregatorMetrics {
            registry: Registry::default(),
            batches: Counter::default(),
            samples: Counter::default(),
            duplicate_batches: Counter::default(),
            duplicate_samples: Counter::default(),
            rejected: Family::default(),
            queue_samples: Gauge::default(),
            queue_capacity: Gauge::default(),
            commit_seconds: Histogram::new([
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            newest_sample: Gauge::default(),
            held_rows: Gauge::default(),
            recovered_samples: Counter::default(),
            fold_seconds: Histogram::new([0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            rows: Family::default(),
            database_bytes: Gauge::default(),
            store_memory_bytes: Gauge::default(),
            resident_bytes: Gauge::default(),
            retention_deleted: Family::default(),
            raw_rewritten: Counter::default(),
            raw_rewritten_until: Gauge::default(),
            ledger: LedgerFamilies::new(),
            current: std::sync::Mutex::default(),
            analytics_last_success: Gauge::default(),
            analytics_seconds: Histogram::new([
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            reclaim_decisions: Family::default(),
            reclaim_deferred: Counter::default(),
            reclaim_last_pass: Gauge::default(),
            webhook_deliveries: Family::default(),
            keep_requests: Family::default(),
            webhook_pending: Family::default(),
            webhook_oldest_pending_age: Family::default(),
            webhook_endpoint_disabled: Family::default(),
            webhook_attempt_seconds: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        };
        m.register_ingest(&mut r);
        m.register_store(&mut r);
        m.register_analytics(&mut r);
        m.register_webhooks(&mut r);
        AggregatorMetrics { registry: r, ..m }
    }

    /// Registers the families of the ingest path and the writer.
    fn register_ingest(&self, r: &mut Registry) {
        r.register(
            "gpuledger_aggregator_build",
            "The aggregator's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        r.register(
            "gpuledger_aggregator_ingest_batches",
            "Batches stored (a re-sent batch id is counted in ingest_duplicate_batches instead)",
            self.batches.clone(),
        );
        r.register(
            "gpuledger_aggregator_ingest_samples",
            "Instance-seconds stored",
            self.samples.clone(),
        );
        r.register(
            "gpuledger_aggregator_ingest_duplicate_batches",
            "Batches acknowledged without storing anything because their id was stored before",
            self.duplicate_batches.clone(),
        );
        r.register(
            "gpuledger_aggregator_ingest_duplicate_samples",
            "Instance-seconds not stored because the ledger held that instance and second already",
            self.duplicate_samples.clone(),
        );
        r.register(
            "gpuledger_aggregator_ingest_rejected",
            "Ingest requests refused, by reason: unauthorized, forbidden, invalid, too_large, overloaded, throttled, timeout, unstorable, store_error",
            self.rejected.clone(),
        );
        r.register(
            "gpuledger_aggregator_writer_queue_samples",
            "Instance-seconds accepted and waiting for the writer",
            self.queue_samples.clone(),
        );
        r.register(
            "gpuledger_aggregator_writer_queue_capacity_samples",
            "Instance-seconds the writer queue holds before ingest answers 503",
            self.queue_capacity.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_writer_commit_duration",
            "Time to append and commit one group of batches (raw rows and rollups)",
            Unit::Seconds,
            self.commit_seconds.clone(),
        );
        r.register(
            "gpuledger_aggregator_writer_held_rows",
            "Minute deltas (instance, holder, minute) whose samples are stored but not yet folded into the rollups; the writer holds them while batches wait, then the fold thread folds them",
            self.held_rows.clone(),
        );
        r.register(
            "gpuledger_aggregator_writer_recovered_samples",
            "Samples stored before a crash or a failed write and folded into the rollups only by the recovery that followed",
            self.recovered_samples.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_writer_fold_duration",
            "Time the fold thread takes to fold the deltas the writer held while batches waited into the rollups (one transaction, beside the writer's)",
            Unit::Seconds,
            self.fold_seconds.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_newest_sample_timestamp",
            "Unix time of the newest sample second written",
            Unit::Seconds,
            self.newest_sample.clone(),
        );
    }

    /// Registers the families of the ledger on disk and in memory, retention and the hourly rewrite.
    fn register_store(&self, r: &mut Registry) {
        r.register(
            "gpuledger_aggregator_store_rows",
            "Rows per ledger table",
            self.rows.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_store",
            "Bytes of the ledger on disk: the DuckDB file and its write-ahead log",
            Unit::Bytes,
            self.database_bytes.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_store_memory",
            "Bytes DuckDB's buffer manager holds in memory (duckdb_memory()); --memory-limit bounds it",
            Unit::Bytes,
            self.store_memory_bytes.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_resident_memory",
            "Resident memory of the aggregator process (DuckDB's included)",
            Unit::Bytes,
            self.resident_bytes.clone(),
        );
        r.register(
            "gpuledger_aggregator_retention_deleted_rows",
            "Rows deleted by retention, per table",
            self.retention_deleted.clone(),
        );
        r.register(
            "gpuledger_aggregator_raw_rewritten_rows",
            "Raw rows the hourly rewrite put in instance order (docs/perf/storage.md, \"Row order matters\": about 2.5x smaller)",
            self.raw_rewritten.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_raw_rewritten_until_timestamp",
            "Unix time up to which closed hours' raw rows were rewritten in instance order (0: none yet)",
            Unit::Seconds,
            self.raw_rewritten_until.clone(),
        );
    }

    /// Registers the families of the evaluation and the reclaim pass.
    fn register_analytics(&self, r: &mut Registry) {
        r.register_with_unit(
            "gpuledger_aggregator_analytics_last_success_timestamp",
            "Unix time the hoarding and fragmentation evaluation last succeeded",
            Unit::Seconds,
            self.analytics_last_success.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_analytics_duration",
            "Time one hoarding and fragmentation evaluation takes",
            Unit::Seconds,
            self.analytics_seconds.clone(),
        );
        r.register(
            "gpuledger_aggregator_reclaim_decisions",
            "Reclaim decisions: decision=event with reason the event type sent, or decision=hold with the reason nothing was sent (counted when a hold starts)",
            self.reclaim_decisions.clone(),
        );
        r.register(
            "gpuledger_aggregator_reclaim_deferred",
            "Reclaims the blast-radius bound held back, summed over passes (each pass counts what it deferred)",
            self.reclaim_deferred.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_reclaim_last_pass_timestamp",
            "Unix time the reclaim pass last ran",
            Unit::Seconds,
            self.reclaim_last_pass.clone(),
        );
    }

    /// Registers the families of webhook delivery.
    fn register_webhooks(&self, r: &mut Registry) {
        r.register(
            "gpuledger_aggregator_keep_requests",
            "Requests to keep links by outcome: shown (GET), kept, forbidden (403), gone (410), bound (the per-episode bound reached)",
            self.keep_requests.clone(),
        );
        r.register(
            "gpuledger_aggregator_webhook_deliveries",
            "Webhook and chat attempts by endpoint and outcome: delivered, retry, throttled (429: the endpoint paused), gone (410: endpoint disabled), failed (past max_age, or a chat endpoint's 400/403/404)",
            self.webhook_deliveries.clone(),
        );
        r.register(
            "gpuledger_aggregator_webhook_pending_events",
            "Events waiting in the outbox per endpoint",
            self.webhook_pending.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_webhook_oldest_pending_age",
            "Age of the oldest event waiting in the outbox per endpoint",
            Unit::Seconds,
            self.webhook_oldest_pending_age.clone(),
        );
        r.register(
            "gpuledger_aggregator_webhook_endpoint_disabled",
            "1 while an endpoint is disabled because it answered 410 Gone",
            self.webhook_endpoint_disabled.clone(),
        );
        r.register_with_unit(
            "gpuledger_aggregator_webhook_attempt_duration",
            "Time one webhook attempt takes",
            Unit::Seconds,
            self.webhook_attempt_seconds.clone(),
        );
    }

    /// Replaces the analytics families with `current`: series of tenants, episodes and nodes no
    /// longer in it are removed.
    pub fn set_current(&self, current: &gpuledger_ledger::analytics::Current) {
        self.ledger.set(current, None);
        *self.current.lock().expect("metrics lock") = current.clone();
    }

    /// The ledger families `scope` may see: every tenant's (`None`, the shared families), or a
    /// fresh set holding only tenant `t`'s own series (`Some(t)`; fleet-wide figures withheld).
    pub fn ledger_for(&self, scope: Option<&str>) -> std::borrow::Cow<'_, LedgerFamilies> {
        match scope {
            None => std::borrow::Cow::Borrowed(&self.ledger),
            Some(t) => {
                let own = LedgerFamilies::new();
                own.set(&self.current.lock().expect("metrics lock"), Some(t));
                std::borrow::Cow::Owned(own)
            }
        }
    }

    /// The operational families (ingest, writer, store, analytics runs): no tenant in them.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The process's resident set, from `/proc/self/statm` (Linux); `None` where it cannot be read.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages.saturating_mul(u64::try_from(page).ok()?))
}

impl Default for AggregatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteObserver for AggregatorMetrics {
    fn committed(&self, _batches: usize, seconds: f64) {
        self.commit_seconds.observe(seconds);
    }

    fn newest_sample(&self, ts: i64) {
        // Batches may arrive out of order; the gauge only moves forward.
        let current = self.newest_sample.get();
        if ts > current {
            self.newest_sample.set(ts);
        }
    }

    fn held(&self, rows: usize) {
        self.held_rows.set(i64::try_from(rows).unwrap_or(i64::MAX));
    }

    fn recovered(&self, samples: u64) {
        self.recovered_samples.inc_by(samples);
    }

    fn folded(&self, _rows: usize, seconds: f64) {
        self.fold_seconds.observe(seconds);
    }
}

/// The families computed from the ledger (tenants' allocation and use, open hoarding episodes,
/// per-node fragmentation). Unlike the operational families they name tenants, workloads and
/// nodes, so `/metrics` serves them only with a token that may read them (docs/metrics.md, "Who
/// sees which metrics").
#[derive(Clone)]
pub struct LedgerFamilies {
    registry: std::sync::Arc<Registry>,
    /// Per tenant: allocated GPU-equivalents over the newest complete minute.
    tenant_allocated: Family<TenantLabels, Gauge<f64, AtomicU64>>,
    /// Per tenant: used GPU-equivalents.
    tenant_used: Family<TenantLabels, Gauge<f64, AtomicU64>>,
    /// Per tenant: allocated − used.
    tenant_idle: Family<TenantLabels, Gauge<f64, AtomicU64>>,
    /// Open hoarding episodes: seconds idle so far.
    episode_idle_seconds: Family<EpisodeLabels, Gauge>,
    /// Open hoarding episodes: size.
    episode_gpu_equivalents: Family<EpisodeLabels, Gauge<f64, AtomicU64>>,
    /// Per node: GPUs observed.
    node_capacity: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    /// Per node: free GPU-equivalents.
    node_free: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    /// Per node: stranded GPU-equivalents.
    node_stranded: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    /// Per budgeted tenant: spent / this month's budget.
    budget_spent: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
    /// Per budgeted tenant: the month-end forecast / this month's budget.
    budget_forecast: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
    /// Per tenant: what its rightsizing recommendations would have saved this month so far.
    rightsizing_savings: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
    /// Per tenant: measured energy of its slices this month so far, joules.
    tenant_energy: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
    /// Per tenant: its CO₂e this month so far, grams.
    tenant_co2e: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
}

/// A budget series' labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    tenant: String,
}

impl LedgerFamilies {
    /// Registers every ledger family, empty.
    pub fn new() -> LedgerFamilies {
        let mut r = Registry::default();
        let l = LedgerFamilies {
            registry: std::sync::Arc::new(Registry::default()),
            tenant_allocated: Family::default(),
            tenant_used: Family::default(),
            tenant_idle: Family::default(),
            episode_idle_seconds: Family::default(),
            episode_gpu_equivalents: Family::default(),
            node_capacity: Family::default(),
            node_free: Family::default(),
            node_stranded: Family::default(),
            budget_spent: Family::default(),
            budget_forecast: Family::default(),
            rightsizing_savings: Family::default(),
            tenant_energy: Family::default(),
            tenant_co2e: Family::default(),
        };
        let ge = || Unit::Other("gpu_equivalents".into());
        r.register_with_unit(
            "gpuledger_tenant_allocated",
            "GPU-equivalents a tenant held over the newest complete minute (a 3g MIG slice is 3/7)",
            ge(),
            l.tenant_allocated.clone(),
        );
        r.register_with_unit(
            "gpuledger_tenant_used",
            "GPU-equivalents a tenant used over the newest complete minute: SM activity x size",
            ge(),
            l.tenant_used.clone(),
        );
        r.register_with_unit(
            "gpuledger_tenant_idle",
            "GPU-equivalents a tenant held but did not use over the newest complete minute",
            ge(),
            l.tenant_idle.clone(),
        );
        r.register_with_unit(
            "gpuledger_hoarding_episode_idle_duration",
            "Open idle-hoarding episodes: seconds from the idle run's start to its newest held second",
            Unit::Seconds,
            l.episode_idle_seconds.clone(),
        );
        r.register_with_unit(
            "gpuledger_hoarding_episode",
            "Open idle-hoarding episodes: the size of the idle allocation",
            ge(),
            l.episode_gpu_equivalents.clone(),
        );
        r.register_with_unit(
            "gpuledger_fragmentation_capacity",
            "GPUs of a node observed at the newest second",
            ge(),
            l.node_capacity.clone(),
        );
        r.register_with_unit(
            "gpuledger_fragmentation_free",
            "Free GPU-equivalents of a node: unpartitioned slices and instances nobody holds",
            ge(),
            l.node_free.clone(),
        );
        r.register_with_unit(
            "gpuledger_fragmentation_stranded",
            "Free GPU-equivalents of a node that the demand mix of MIG profiles cannot use",
            ge(),
            l.node_stranded.clone(),
        );
        r.register_with_unit(
            "gpuledger_tenant_budget_spent",
            "What a tenant has spent this month, as a ratio of its monthly budget (the bill's total)",
            Unit::Other("ratio".into()),
            l.budget_spent.clone(),
        );
        r.register_with_unit(
            "gpuledger_tenant_budget_forecast",
            "A tenant's month-end spend forecast (spent + the last whole days' rate for the days left), as a ratio of its monthly budget",
            Unit::Other("ratio".into()),
            l.budget_forecast.clone(),
        );
        r.register(
            "gpuledger_tenant_rightsizing_savings",
            "What moving a tenant's workloads to the MIG profiles rightsizing recommends would have saved this month so far, in the price book's currency",
            l.rightsizing_savings.clone(),
        );
        r.register_with_unit(
            "gpuledger_tenant_energy",
            "Measured GPU energy of a tenant's slices this UTC month so far, split per second by slices and SM activity (schema/ANALYTICS.md, Energy and carbon)",
            Unit::Other("joules".into()),
            l.tenant_energy.clone(),
        );
        r.register_with_unit(
            "gpuledger_tenant_co2e",
            "CO2e of a tenant's measured GPU energy this UTC month so far, at the configured carbon intensity",
            Unit::Other("grams".into()),
            l.tenant_co2e.clone(),
        );
        LedgerFamilies {
            registry: std::sync::Arc::new(r),
            ..l
        }
    }

    /// Replaces the series with `current`'s, only tenant `scope`'s when given: series of
    /// tenants, episodes and nodes no longer current are removed.
    pub fn set(&self, current: &gpuledger_ledger::analytics::Current, scope: Option<&str>) {
        for f in [&self.tenant_allocated, &self.tenant_used, &self.tenant_idle] {
            f.clear();
        }
        let mine = |tenant: &str| scope.is_none_or(|t| t == tenant);
        for ((tenant, slo_class), (allocated, used)) in &current.tenants {
            if !mine(tenant) {
                continue;
            }
            let l = TenantLabels {
                tenant: tenant.clone(),
                slo_class: slo_class.clone(),
            };
            self.tenant_allocated.get_or_create(&l).set(*allocated);
            self.tenant_used.get_or_create(&l).set(*used);
            self.tenant_idle.get_or_create(&l).set(allocated - used);
        }
        self.episode_idle_seconds.clear();
        self.episode_gpu_equivalents.clear();
        for e in current.episodes.iter().filter(|e| mine(&e.labels[0])) {
            let [tenant, workload, node, gpu, gpu_instance, slo_class] = e.labels.clone();
            let l = EpisodeLabels {
                tenant,
                workload,
                node,
                gpu,
                gpu_instance,
                slo_class,
            };
            self.episode_idle_seconds
                .get_or_create(&l)
                .set(e.idle_seconds);
            self.episode_gpu_equivalents
                .get_or_create(&l)
                .set(e.gpu_equivalents);
        }
        for f in [&self.budget_spent, &self.budget_forecast] {
            f.clear();
        }
        for (tenant, (spent, forecast)) in current.budgets.iter().filter(|(t, _)| mine(t)) {
            let l = BudgetLabels {
                tenant: tenant.clone(),
            };
            self.budget_spent.get_or_create(&l).set(*spent);
            self.budget_forecast.get_or_create(&l).set(*forecast);
        }
        self.rightsizing_savings.clear();
        for (tenant, savings) in current.savings.iter().filter(|(t, _)| mine(t)) {
            let l = BudgetLabels {
                tenant: tenant.clone(),
            };
            self.rightsizing_savings.get_or_create(&l).set(*savings);
        }
        for f in [&self.tenant_energy, &self.tenant_co2e] {
            f.clear();
        }
        for (tenant, (joules, grams)) in current.energy.iter().filter(|(t, _)| mine(t)) {
            let l = BudgetLabels {
                tenant: tenant.clone(),
            };
            self.tenant_energy.get_or_create(&l).set(*joules);
            if let Some(g) = grams {
                self.tenant_co2e.get_or_create(&l).set(*g);
            }
        }
        for f in [&self.node_capacity, &self.node_free, &self.node_stranded] {
            f.clear();
        }
        // Fragmentation is fleet-wide: no tenant scope sees it.
        let fleet = if scope.is_none() {
            &current.nodes[..]
        } else {
            &[]
        };
        for (node, (capacity, free, stranded)) in fleet {
            let l = NodeLabels { node: node.clone() };
            self.node_capacity.get_or_create(&l).set(*capacity);
            self.node_free.get_or_create(&l).set(*free);
            self.node_stranded.get_or_create(&l).set(*stranded);
        }
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

impl Default for LedgerFamilies {
    fn default() -> Self {
        Self::new()
    }
}
