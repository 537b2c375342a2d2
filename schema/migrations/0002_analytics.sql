-- 0002: what the analytics read and keep (definitions: schema/ANALYTICS.md).

-- Per GPU, per UTC hour: the seconds in which the GPU was observed (any of its instances
-- reported: the fleet's capacity), and the instance-seconds stored for it. The writer keeps it
-- exact with the minute masks: a second counts once however many instances or copies bring it.
-- The analytics re-evaluate an hour whenever either number changes (late or backfilled data).
CREATE TABLE rollup_gpu_1h (
    bucket            BIGINT  NOT NULL,
    node              VARCHAR NOT NULL,
    gpu_uuid          VARCHAR NOT NULL,
    gpu_model         VARCHAR NOT NULL,
    observed_seconds  BIGINT  NOT NULL,
    instance_seconds  BIGINT  NOT NULL
);

-- The writer's scratch table for it (per instance that brought the seconds; always empty once
-- committed).
CREATE TABLE ingest_delta_gpu_1h (
    bucket            BIGINT  NOT NULL,
    instance_id       INTEGER NOT NULL,
    observed_seconds  BIGINT  NOT NULL,
    instance_seconds  BIGINT  NOT NULL
);

-- Databases from version 1 get their capacity from the minute masks.
INSERT INTO rollup_gpu_1h
SELECT bucket - bucket % 3600, node, gpu_uuid, gpu_model,
       sum(bit_count(mask))::BIGINT, sum(samples)::BIGINT
FROM (
    SELECT r.bucket, i.gpu_uuid, min(i.node) AS node, min(i.gpu_model) AS gpu_model,
           bit_or(r.seconds_mask) AS mask, sum(r.samples) AS samples
    FROM rollup_1m r JOIN instances i USING (instance_id)
    GROUP BY r.bucket, i.gpu_uuid
)
GROUP BY ALL;

-- Per allocation (instance + holder) per UTC day: what a month's per-workload or per-node
-- showback reads (30 rows per allocation instead of 720 hourly ones).
CREATE TABLE rollup_alloc_1d (
    bucket             BIGINT  NOT NULL,
    instance_id        INTEGER NOT NULL,
    holder_id          INTEGER NOT NULL,
    samples            BIGINT  NOT NULL,
    sm_active_samples  BIGINT  NOT NULL,
    sm_active_sum      DOUBLE  NOT NULL
);
INSERT INTO rollup_alloc_1d
SELECT bucket - bucket % 86400, instance_id, holder_id, sum(samples)::BIGINT,
       sum(sm_active_samples)::BIGINT, sum(sm_active_sum)
FROM rollup_1h GROUP BY ALL;

-- Per GPU, per UTC hour, as of the rollup_gpu_1h numbers it was computed from: free and
-- stranded capacity in compute-slice-seconds (7 slices = one GPU). Rewritten whenever those
-- numbers move.
CREATE TABLE fragmentation_1h (
    bucket                  BIGINT  NOT NULL,
    node                    VARCHAR NOT NULL,
    gpu_uuid                VARCHAR NOT NULL,
    gpu_model               VARCHAR NOT NULL,
    observed_seconds        BIGINT  NOT NULL,
    instance_seconds        BIGINT  NOT NULL,
    free_slice_seconds      DOUBLE  NOT NULL,
    stranded_slice_seconds  DOUBLE  NOT NULL
);

-- Idle hoarding episodes: runs of idle minutes of one allocation (instance + holder) that lasted
-- at least the detection window. ended_at is NULL while the run goes on. Recomputed from the
-- minute rollup whenever the hours they touch change, so late data corrects them.
CREATE TABLE hoarding_episodes (
    instance_id        INTEGER NOT NULL,
    holder_id          INTEGER NOT NULL,
    started_at         BIGINT  NOT NULL,
    detected_at        BIGINT  NOT NULL,
    ended_at           BIGINT,
    -- the run's last held second so far
    last_second        BIGINT  NOT NULL,
    held_seconds       BIGINT  NOT NULL,
    sm_active_samples  BIGINT  NOT NULL,
    sm_active_sum      DOUBLE  NOT NULL,
    gpu_equivalents    DOUBLE  NOT NULL,
    idle_gpu_seconds   DOUBLE  NOT NULL
);
