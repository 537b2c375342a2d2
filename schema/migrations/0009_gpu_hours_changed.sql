-- 0009: the GPU-hours whose counts the writer changed since an evaluation pass last stored them,
-- so that a pass looks those up instead of joining all of rollup_gpu_1h with fragmentation_1h.
-- That join grew with the ledger's age, about 25 ms per day of a 10,000-GPU fleet on 2 cores
-- (10 s at 400 days), every 15 s (BENCHMARKS.md, "The evaluation against the ledger's age").
-- The writer appends one row per GPU-hour it folds, in the fold's transaction; a pass deletes the
-- rows of the hours it stored up to the newest `seq` its snapshot saw, so a change committed after
-- that snapshot keeps its row. Whether an hour is dirty is still decided by its counts
-- (schema/ANALYTICS.md, "Kept current and corrected").
CREATE SEQUENCE gpu_hours_changed_seq;
CREATE TABLE gpu_hours_changed (
    seq        BIGINT  NOT NULL,
    bucket     BIGINT  NOT NULL,
    node       VARCHAR NOT NULL,
    gpu_uuid   VARCHAR NOT NULL,
    gpu_model  VARCHAR NOT NULL
);
-- The hours dirty now, from one last full comparison.
INSERT INTO gpu_hours_changed
SELECT nextval('gpu_hours_changed_seq'), g.bucket, g.node, g.gpu_uuid, g.gpu_model
FROM rollup_gpu_1h g
LEFT JOIN fragmentation_1h f
  ON f.bucket = g.bucket AND f.gpu_uuid = g.gpu_uuid AND f.node = g.node
 AND f.gpu_model = g.gpu_model
WHERE f.bucket IS NULL OR f.observed_seconds <> g.observed_seconds
   OR f.instance_seconds <> g.instance_seconds;
