-- 0001: the ledger's first tables.
-- Raw 1 s samples, one row per instance per second; identity is (node, gpu_uuid, gpu_instance_id,
-- ts) with gpu_instance_id = -1 for a whole GPU (a primary key cannot hold NULL).
CREATE TABLE samples_raw (
    ts               TIMESTAMP NOT NULL,
    node             VARCHAR   NOT NULL,
    gpu_uuid         VARCHAR   NOT NULL,
    gpu_instance_id  INTEGER   NOT NULL,
    gpu_model        VARCHAR   NOT NULL,
    mig_profile      VARCHAR,
    placement_start  INTEGER,
    placement_size   INTEGER,
    tenant           VARCHAR,
    workload         VARCHAR,
    slo_class        VARCHAR,
    sm_active        DOUBLE,
    sm_occupancy     DOUBLE,
    tensor_active    DOUBLE,
    dram_active      DOUBLE,
    fb_used_bytes    UBIGINT,
    fb_total_bytes   UBIGINT,
    nvlink_tx_bytes  UBIGINT,
    nvlink_rx_bytes  UBIGINT,
    PRIMARY KEY (node, gpu_uuid, gpu_instance_id, ts)
);

-- Every batch id stored, so a re-sent batch is acknowledged and not stored twice.
CREATE TABLE ingested_batches (
    batch_id     UUID      PRIMARY KEY,
    node         VARCHAR   NOT NULL,
    received_at  TIMESTAMP NOT NULL,
    samples      INTEGER   NOT NULL
);
