-- 0011: how far the aggregator has rewritten raw rows in instance order (aggregator/src/store/
-- writer/compact.rs): every hour that ends at or before `until_ts` was rewritten, or was left as
-- it came by the build that wrote it. The aggregator keeps it so that a restart resumes the
-- rewrite where it stopped instead of leaving the hours that closed meanwhile in arrival order.
-- One row, written by the compactor alone; none while nothing was recorded, which costs no data
-- block (DuckDB gives every table with rows a 256 KiB block of its own, as 0010 says): a new
-- ledger, or one only `gpuledger import` wrote, has no row, and its raw window is rewritten.
CREATE TABLE raw_compacted (
    until_ts  BIGINT NOT NULL
);
-- A ledger that already holds raw rows was written by a build that left the hours before its
-- start in arrival order: the hours before the one holding its newest raw row are left so now
-- (rewriting a whole raw window at once is what that build avoided).
INSERT INTO raw_compacted
SELECT (max(ts) // 3600) * 3600 FROM samples_raw HAVING max(ts) IS NOT NULL;
