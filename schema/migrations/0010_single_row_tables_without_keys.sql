-- 0010: writer_probe and fold_pending hold one row each, always id 0, that the writer only
-- UPDATEs; schema_version gets one row per migration, inserted once by the migration runner in
-- the migration's own transaction. Their primary keys guarded nothing the code does not, and
-- DuckDB gives every index a 256 KiB block of its own: 0.75 MB of a 2 h ledger's 9.7 MB
-- (BENCHMARKS.md, "Storage, and the month question, against Prometheus"). A new file gets
-- schema_version without the key already (`store::open`); here it is re-created for older files.
CREATE TABLE writer_probe_new (
    id          INTEGER NOT NULL,
    checked_at  BIGINT  NOT NULL
);
INSERT INTO writer_probe_new SELECT id, checked_at FROM writer_probe;
DROP TABLE writer_probe;
ALTER TABLE writer_probe_new RENAME TO writer_probe;

CREATE TABLE fold_pending_new (
    id       INTEGER NOT NULL,
    from_ts  BIGINT
);
INSERT INTO fold_pending_new SELECT id, from_ts FROM fold_pending;
DROP TABLE fold_pending;
ALTER TABLE fold_pending_new RENAME TO fold_pending;

CREATE TABLE schema_version_new (
    version     INTEGER   NOT NULL,
    name        VARCHAR   NOT NULL,
    applied_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);
INSERT INTO schema_version_new SELECT version, name, applied_at FROM schema_version;
DROP TABLE schema_version;
ALTER TABLE schema_version_new RENAME TO schema_version;
