-- 0012: measured energy (schema/ANALYTICS.md, "Energy and carbon"). The writer splits each
-- GPU-second's energy among the instance samples that came with it, once, and keeps only sums.

-- Per GPU and UTC minute. `seconds_mask`: bit s set = second s of the minute is stored (a
-- second already here is not stored again); `observed_seconds`: of those, the seconds that came
-- with instance samples of the GPU; `energy_j` the GPU's energy, `idle_j` its idle floor,
-- `uncovered_j` the part of no instance (slices without one).
CREATE TABLE energy_gpu_1m (
    bucket            BIGINT  NOT NULL,
    node              VARCHAR NOT NULL,
    gpu_uuid          VARCHAR NOT NULL,
    gpu_model         VARCHAR NOT NULL,
    seconds_mask      UBIGINT NOT NULL,
    observed_seconds  BIGINT  NOT NULL,
    energy_j          DOUBLE  NOT NULL,
    idle_j            DOUBLE  NOT NULL,
    uncovered_j       DOUBLE  NOT NULL
);

-- The same per UTC hour and day, with the count of seconds for the mask.
CREATE TABLE energy_gpu_1h (
    bucket            BIGINT  NOT NULL,
    node              VARCHAR NOT NULL,
    gpu_uuid          VARCHAR NOT NULL,
    gpu_model         VARCHAR NOT NULL,
    seconds           BIGINT  NOT NULL,
    observed_seconds  BIGINT  NOT NULL,
    energy_j          DOUBLE  NOT NULL,
    idle_j            DOUBLE  NOT NULL,
    uncovered_j       DOUBLE  NOT NULL
);
CREATE TABLE energy_gpu_1d AS SELECT * FROM energy_gpu_1h LIMIT 0;

-- Per instance, holder (an unheld instance's holder has no tenant) and UTC minute: the seconds
-- it had a share in, and its idle and active joules.
CREATE TABLE energy_1m (
    bucket       BIGINT  NOT NULL,
    instance_id  INTEGER NOT NULL,
    holder_id    INTEGER NOT NULL,
    seconds      BIGINT  NOT NULL,
    idle_j       DOUBLE  NOT NULL,
    active_j     DOUBLE  NOT NULL
);
CREATE TABLE energy_1h AS SELECT * FROM energy_1m LIMIT 0;
CREATE TABLE energy_1d AS SELECT * FROM energy_1m LIMIT 0;

-- The writer's scratch tables: one write transaction's minutes, emptied inside it.
CREATE TABLE ingest_energy_gpu AS SELECT * FROM energy_gpu_1m LIMIT 0;
CREATE TABLE ingest_energy AS SELECT * FROM energy_1m LIMIT 0;

-- The idle floor of the split per GPU model (key or NVML name), as the aggregator was last
-- configured (`[energy.models."H100-80GB"] idle_watts`): written at its start, read by the writer,
-- so an import into the ledger splits as the aggregator does. A model not here takes its
-- documented default (schema/src/mig.rs), an unknown one 0 W.
CREATE TABLE energy_idle_watts (
    gpu_model   VARCHAR NOT NULL,
    idle_watts  DOUBLE  NOT NULL
);
