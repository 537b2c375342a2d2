-- 0001: the ledger. (Rewritten before any aggregator ran: no database at version 1 predates it.)
--
-- Time is Unix seconds (BIGINT, UTC); a sample covers [ts, ts + 1). Buckets are named by their
-- first second. Fact tables carry small integer ids into two dimension tables, which keeps raw
-- rows small; no fact table has an index: the single writer keeps keys unique (see
-- aggregator/src/store/writer.rs), and DuckDB's zone maps serve the time-range scans.

-- One row per distinct instance description (a MIG slice, or a whole GPU with
-- gpu_instance_id = -1). Ids are assigned by the writer.
CREATE TABLE instances (
    instance_id      INTEGER PRIMARY KEY,
    node             VARCHAR NOT NULL,
    gpu_uuid         VARCHAR NOT NULL,
    gpu_instance_id  INTEGER NOT NULL,
    gpu_model        VARCHAR NOT NULL,
    mig_profile      VARCHAR,
    placement_start  INTEGER,
    placement_size   INTEGER,
    -- compute slices / 7; a whole GPU is 1
    gpu_equivalents  DOUBLE  NOT NULL
);

-- Who held an instance: holder 0 is "nobody" (unallocated).
CREATE TABLE holders (
    holder_id  INTEGER PRIMARY KEY,
    tenant     VARCHAR,
    workload   VARCHAR,
    slo_class  VARCHAR
);
INSERT INTO holders VALUES (0, NULL, NULL, NULL);

-- Raw 1 s samples, kept for the raw-retention window.
CREATE TABLE samples_raw (
    ts               BIGINT  NOT NULL,
    instance_id      INTEGER NOT NULL,
    holder_id        INTEGER NOT NULL,
    sm_active        DOUBLE,
    sm_occupancy     DOUBLE,
    tensor_active    DOUBLE,
    dram_active      DOUBLE,
    fb_used_bytes    UBIGINT,
    fb_total_bytes   UBIGINT,
    nvlink_tx_bytes  UBIGINT,
    nvlink_rx_bytes  UBIGINT
);

-- Per instance and holder, per UTC minute. seconds_mask has bit s set when second s of the minute
-- is stored (under any holder): it is what makes a second copy of an (instance, second) a no-op,
-- for as long as the minute rollup is kept. *_samples count the seconds a counter was measured.
CREATE TABLE rollup_1m (
    bucket               BIGINT  NOT NULL,
    instance_id          INTEGER NOT NULL,
    holder_id            INTEGER NOT NULL,
    seconds_mask         UBIGINT NOT NULL,
    samples              INTEGER NOT NULL,
    sm_active_samples    INTEGER NOT NULL,
    sm_active_sum        DOUBLE  NOT NULL,
    sm_active_min        DOUBLE,
    sm_active_max        DOUBLE,
    sm_occupancy_samples INTEGER NOT NULL,
    sm_occupancy_sum     DOUBLE  NOT NULL,
    tensor_active_samples INTEGER NOT NULL,
    tensor_active_sum    DOUBLE  NOT NULL,
    dram_active_samples  INTEGER NOT NULL,
    dram_active_sum      DOUBLE  NOT NULL,
    fb_used_samples      INTEGER NOT NULL,
    fb_used_bytes_sum    UBIGINT NOT NULL,
    fb_used_bytes_max    UBIGINT,
    fb_total_bytes_max   UBIGINT,
    nvlink_tx_bytes_sum  UBIGINT NOT NULL,
    nvlink_rx_bytes_sum  UBIGINT NOT NULL
);

-- The same per UTC hour (no mask: the minute rollup deduplicates).
CREATE TABLE rollup_1h (
    bucket               BIGINT  NOT NULL,
    instance_id          INTEGER NOT NULL,
    holder_id            INTEGER NOT NULL,
    samples              INTEGER NOT NULL,
    sm_active_samples    INTEGER NOT NULL,
    sm_active_sum        DOUBLE  NOT NULL,
    sm_active_min        DOUBLE,
    sm_active_max        DOUBLE,
    sm_occupancy_samples INTEGER NOT NULL,
    sm_occupancy_sum     DOUBLE  NOT NULL,
    tensor_active_samples INTEGER NOT NULL,
    tensor_active_sum    DOUBLE  NOT NULL,
    dram_active_samples  INTEGER NOT NULL,
    dram_active_sum      DOUBLE  NOT NULL,
    fb_used_samples      INTEGER NOT NULL,
    fb_used_bytes_sum    UBIGINT NOT NULL,
    fb_used_bytes_max    UBIGINT,
    fb_total_bytes_max   UBIGINT,
    nvlink_tx_bytes_sum  UBIGINT NOT NULL,
    nvlink_rx_bytes_sum  UBIGINT NOT NULL
);

-- Per tenant (NULL: unallocated), SLO class and GPU model, per UTC hour: what a month's
-- showback reads. gpu_seconds = Σ gpu_equivalents over the samples; used_gpu_seconds =
-- Σ sm_active × gpu_equivalents over the samples where sm_active was measured, whose size-weighted
-- seconds are sm_measured_gpu_seconds.
CREATE TABLE rollup_tenant_1h (
    bucket                   BIGINT  NOT NULL,
    tenant                   VARCHAR,
    slo_class                VARCHAR,
    gpu_model                VARCHAR NOT NULL,
    samples                  BIGINT  NOT NULL,
    gpu_seconds              DOUBLE  NOT NULL,
    sm_measured_gpu_seconds  DOUBLE  NOT NULL,
    used_gpu_seconds         DOUBLE  NOT NULL
);

-- Every batch id stored, kept for the raw-retention window: a re-sent batch is acknowledged
-- without being looked at again. (The minute masks make a re-sent sample a no-op regardless.)
CREATE TABLE ingested_batches (
    batch_id     UUID    NOT NULL,
    node         VARCHAR NOT NULL,
    received_at  BIGINT  NOT NULL,
    samples      INTEGER NOT NULL,
    stored       INTEGER NOT NULL
);

-- The writer's scratch table: the minute deltas of one write transaction, appended and deleted
-- inside it, so always empty once committed.
CREATE TABLE ingest_delta_1m AS SELECT * FROM rollup_1m LIMIT 0;
