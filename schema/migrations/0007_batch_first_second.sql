-- 0007: each stored batch id with its batch's earliest second (over samples and shares), so that
-- the writer looks a group's ids up among the batch ids of those seconds only: rows arrive
-- roughly in that order, so DuckDB's zone maps skip the rest. Looking ids up among every batch
-- id of the raw window scanned the whole table for each group: at 10 M rows a group of one batch
-- took 48 ms instead of 29 (BENCHMARKS.md), and a 10,000-GPU fleet stores 43 M in 48 h.
-- NULL: a batch without seconds, or one stored before this migration (a re-send of it is found
-- by its samples' minute masks instead: stored once).
ALTER TABLE ingested_batches ADD COLUMN first_ts BIGINT;
