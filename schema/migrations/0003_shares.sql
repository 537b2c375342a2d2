-- 0003: per-owner use of shared instances (time-slicing, MPS), from the exporters' per-process
-- view (the `shares` of a wire batch). A view beside the ledger: who is charged for an instance is
-- still its holder in samples_raw and the rollups.

-- One owner (holder_id; 0 = processes whose owner could not be named), one instance, one second;
-- kept for the raw-retention window. A share already here is not stored again, so a re-sent
-- share is a no-op for as long as the raw window keeps it (older shares are not taken).
CREATE TABLE shares_raw (
    ts                 BIGINT  NOT NULL,
    instance_id        INTEGER NOT NULL,
    holder_id          INTEGER NOT NULL,
    processes          INTEGER NOT NULL,
    memory_used_bytes  UBIGINT,
    sm_active          DOUBLE
);

-- The same per UTC hour: seconds with a share, Σ processes, Σ memory bytes over the seconds it
-- was known, Σ SM activity over the seconds it was attributable.
CREATE TABLE rollup_share_1h (
    bucket               BIGINT  NOT NULL,
    instance_id          INTEGER NOT NULL,
    holder_id            INTEGER NOT NULL,
    seconds              BIGINT  NOT NULL,
    process_seconds      BIGINT  NOT NULL,
    memory_samples       BIGINT  NOT NULL,
    memory_byte_seconds  HUGEINT NOT NULL,
    sm_active_samples    BIGINT  NOT NULL,
    sm_active_sum        DOUBLE  NOT NULL
);

-- The writer's scratch table: one write transaction's shares, emptied inside it.
CREATE TABLE ingest_shares AS SELECT * FROM shares_raw LIMIT 0;
