-- The month per cluster and tenant, Spark SQL (run: Spark 4.3.0 local mode, session time zone UTC; matched showback to the cent).
-- ${ROOT}: the export directory. Dedup needs nothing: one file per (table, day, cluster).
CREATE OR REPLACE TEMPORARY VIEW rollup_1h
USING parquet OPTIONS (path '${ROOT}/rollup_1h', basePath '${ROOT}/rollup_1h');

-- The price book as prices of a GPU-second per model, profile (NULL: the model's GPU-hour price)
-- and period: deploy/config's H100 2.49, 1g.10gb 0.39 per instance-hour (= 0.39 * 7 per GPU-hour),
-- H200 3.39 then 3.59 from 2026-10-15T12:00Z. Models without a price: default_price (0 here).
CREATE OR REPLACE TEMPORARY VIEW prices AS
SELECT * FROM VALUES
  ('NVIDIA H100 80GB HBM3', CAST(NULL AS STRING), TIMESTAMP '2026-10-01 00:00:00', TIMESTAMP '2026-11-01 00:00:00', 2.49D / 3600),
  ('NVIDIA H100 80GB HBM3', '1g.10gb',            TIMESTAMP '2026-10-01 00:00:00', TIMESTAMP '2026-11-01 00:00:00', 0.39D * 7 / 3600),
  ('NVIDIA H200',           CAST(NULL AS STRING), TIMESTAMP '2026-10-01 00:00:00', TIMESTAMP '2026-10-15 12:00:00', 3.39D / 3600),
  ('NVIDIA H200',           CAST(NULL AS STRING), TIMESTAMP '2026-10-15 12:00:00', TIMESTAMP '2026-11-01 00:00:00', 3.59D / 3600)
  AS p(gpu_model, mig_profile, valid_from, valid_to, per_gpu_second);

WITH held AS (
  SELECT cluster, tenant, gpu_model, mig_profile, gpu_equivalents, samples, sm_active_sum,
         CAST(bucket_start AS TIMESTAMP) AS hour          -- NTZ today: correct only in a UTC session
  FROM rollup_1h
  WHERE date >= DATE '2026-10-01' AND date < DATE '2026-11-01'   -- partition pruning
    AND tenant IS NOT NULL)
SELECT h.cluster, h.tenant,
       sum(h.samples * h.gpu_equivalents) / 3600       AS allocated_gpu_hours,
       sum(h.sm_active_sum * h.gpu_equivalents) / 3600 AS used_gpu_hours,
       round(sum(h.samples * h.gpu_equivalents
                 * coalesce(pp.per_gpu_second, pm.per_gpu_second, 0.0D)), 2) AS cost
FROM held h
LEFT JOIN prices pp ON pp.gpu_model = h.gpu_model AND pp.mig_profile = h.mig_profile
                   AND h.hour >= pp.valid_from AND h.hour < pp.valid_to
LEFT JOIN prices pm ON pm.gpu_model = h.gpu_model AND pm.mig_profile IS NULL
                   AND h.hour >= pm.valid_from AND h.hour < pm.valid_to
GROUP BY h.cluster, h.tenant
ORDER BY h.cluster, h.tenant;
