-- NOT RUN: written for issue 52 beside month.py, never executed against a Trino (no Trino here).
-- The gpuledger export (docs/multi-cluster.md) as external Hive tables in Trino's Hive connector.
-- Replace s3://BUCKET/gpuledger with the shared export directory (ROOT); catalog `hive`.
--
-- Types: the exporter writes byte counts and seconds_mask as signed INT64 (BIGINT) and instants
-- as INT64 TIMESTAMP(MICROS, isAdjustedToUTC=true), which Spark reads as TIMESTAMP and BIGINT
-- (tests/e2e/spark.rs).
-- Hive tables have no TIMESTAMP WITH TIME ZONE: timestamp(6) holds the UTC wall-clock time.
-- The partition column is the directory's `date` (a UTC day, quoted: a reserved word) and must
-- come last. `cluster` is a column, not a directory: each file is <cluster>.parquet.

CREATE SCHEMA IF NOT EXISTS hive.gpuledger WITH (location = 's3://BUCKET/gpuledger');

CREATE TABLE hive.gpuledger.rollup_tenant_1h (
    cluster                  varchar,
    bucket_start             timestamp(6),
    tenant                   varchar,
    slo_class                varchar,
    gpu_model                varchar,
    samples                  bigint,
    gpu_seconds              double,
    sm_measured_gpu_seconds  double,
    used_gpu_seconds         double,
    "date"                   date
) WITH (external_location = 's3://BUCKET/gpuledger/rollup_tenant_1h', format = 'PARQUET',
        partitioned_by = ARRAY['date']);

CREATE TABLE hive.gpuledger.rollup_gpu_1h (
    cluster           varchar,
    bucket_start      timestamp(6),
    node              varchar,
    gpu_uuid          varchar,
    gpu_model         varchar,
    observed_seconds  bigint,
    instance_seconds  bigint,
    "date"            date
) WITH (external_location = 's3://BUCKET/gpuledger/rollup_gpu_1h', format = 'PARQUET',
        partitioned_by = ARRAY['date']);

CREATE TABLE hive.gpuledger.rollup_1h (
    cluster               varchar,
    bucket_start          timestamp(6),
    node                  varchar,
    gpu_uuid              varchar,
    gpu_model             varchar,
    mig_profile           varchar,
    gpu_instance_id       integer,
    placement_start       integer,
    placement_size        integer,
    gpu_equivalents       double,
    tenant                varchar,
    workload              varchar,
    slo_class             varchar,
    samples               integer,
    sm_active_samples     integer,
    sm_active_sum         double,
    sm_active_min         double,
    sm_active_max         double,
    sm_occupancy_samples  integer,
    sm_occupancy_sum      double,
    tensor_active_samples integer,
    tensor_active_sum     double,
    dram_active_samples   integer,
    dram_active_sum       double,
    fb_used_samples       integer,
    fb_used_bytes_sum     bigint,
    fb_used_bytes_max     bigint,
    fb_total_bytes_max    bigint,
    nvlink_tx_bytes_sum   bigint,
    nvlink_rx_bytes_sum   bigint,
    "date"                date
) WITH (external_location = 's3://BUCKET/gpuledger/rollup_1h', format = 'PARQUET',
        partitioned_by = ARRAY['date']);

-- rollup_1m: rollup_1h's columns plus seconds_mask (bit s: second s of the minute stored).
CREATE TABLE hive.gpuledger.rollup_1m (
    cluster               varchar,
    bucket_start          timestamp(6),
    node                  varchar,
    gpu_uuid              varchar,
    gpu_model             varchar,
    mig_profile           varchar,
    gpu_instance_id       integer,
    placement_start       integer,
    placement_size        integer,
    gpu_equivalents       double,
    tenant                varchar,
    workload              varchar,
    slo_class             varchar,
    seconds_mask          bigint,   -- 60 bits used, written as a signed BIGINT
    samples               integer,
    sm_active_samples     integer,
    sm_active_sum         double,
    sm_active_min         double,
    sm_active_max         double,
    sm_occupancy_samples  integer,
    sm_occupancy_sum      double,
    tensor_active_samples integer,
    tensor_active_sum     double,
    dram_active_samples   integer,
    dram_active_sum       double,
    fb_used_samples       integer,
    fb_used_bytes_sum     bigint,
    fb_used_bytes_max     bigint,
    fb_total_bytes_max    bigint,
    nvlink_tx_bytes_sum   bigint,
    nvlink_rx_bytes_sum   bigint,
    "date"                date
) WITH (external_location = 's3://BUCKET/gpuledger/rollup_1m', format = 'PARQUET',
        partitioned_by = ARRAY['date']);

-- samples_raw: only with `gpuledger export --raw`.
CREATE TABLE hive.gpuledger.samples_raw (
    cluster          varchar,
    ts               timestamp(6),
    node             varchar,
    gpu_uuid         varchar,
    gpu_model        varchar,
    mig_profile      varchar,
    gpu_instance_id  integer,
    placement_start  integer,
    placement_size   integer,
    gpu_equivalents  double,
    tenant           varchar,
    workload         varchar,
    slo_class        varchar,
    sm_active        double,
    sm_occupancy     double,
    tensor_active    double,
    dram_active      double,
    fb_used_bytes    bigint,
    fb_total_bytes   bigint,
    nvlink_tx_bytes  bigint,
    nvlink_rx_bytes  bigint,
    "date"           date
) WITH (external_location = 's3://BUCKET/gpuledger/samples_raw', format = 'PARQUET',
        partitioned_by = ARRAY['date']);

-- New days appear as new directories: register them after each export.
CALL hive.system.sync_partition_metadata('gpuledger', 'rollup_tenant_1h', 'ADD');
CALL hive.system.sync_partition_metadata('gpuledger', 'rollup_gpu_1h', 'ADD');
CALL hive.system.sync_partition_metadata('gpuledger', 'rollup_1h', 'ADD');
CALL hive.system.sync_partition_metadata('gpuledger', 'rollup_1m', 'ADD');
CALL hive.system.sync_partition_metadata('gpuledger', 'samples_raw', 'ADD');

-- The month per cluster and tenant (month.py's answer; prices as in tests/spark/prices.toml:
-- example: H100 2.49/GPU-h, its 1g.10gb 0.39/instance-h, H200 3.39 then 3.59 from 2026-10-15 12:00 UTC).
WITH prices (gpu_model, mig_profile, valid_from, valid_to, per_gpu_second) AS (
    VALUES ('NVIDIA H100 80GB HBM3', CAST(NULL AS varchar), TIMESTAMP '2026-10-01 00:00:00', TIMESTAMP '2026-11-01 00:00:00', 2.49e0 / 3600),
           ('NVIDIA H100 80GB HBM3', '1g.10gb',             TIMESTAMP '2026-10-01 00:00:00', TIMESTAMP '2026-11-01 00:00:00', 0.39e0 * 7 / 3600),
           ('NVIDIA H200',           CAST(NULL AS varchar), TIMESTAMP '2026-10-01 00:00:00', TIMESTAMP '2026-10-15 12:00:00', 3.39e0 / 3600),
           ('NVIDIA H200',           CAST(NULL AS varchar), TIMESTAMP '2026-10-15 12:00:00', TIMESTAMP '2026-11-01 00:00:00', 3.59e0 / 3600)),
held AS (
    SELECT cluster, tenant, gpu_model, mig_profile, gpu_equivalents, samples, sm_active_sum, bucket_start AS hour
    FROM hive.gpuledger.rollup_1h
    WHERE "date" >= DATE '2026-10-01' AND "date" < DATE '2026-11-01' AND tenant IS NOT NULL)
SELECT h.cluster, h.tenant,
       sum(h.samples * h.gpu_equivalents) / 3600       AS allocated_gpu_hours,
       sum(h.sm_active_sum * h.gpu_equivalents) / 3600 AS used_gpu_hours,
       round(sum(h.samples * h.gpu_equivalents * coalesce(pp.per_gpu_second, pm.per_gpu_second, 0e0)), 2) AS cost
FROM held h
LEFT JOIN prices pp ON pp.gpu_model = h.gpu_model AND pp.mig_profile = h.mig_profile
                   AND h.hour >= pp.valid_from AND h.hour < pp.valid_to
LEFT JOIN prices pm ON pm.gpu_model = h.gpu_model AND pm.mig_profile IS NULL
                   AND h.hour >= pm.valid_from AND h.hour < pm.valid_to
GROUP BY h.cluster, h.tenant
ORDER BY h.cluster, h.tenant;
