-- Who each holder's workload runs for, as its exporter last sent it (schema/WIRE.md, the series
-- fields `owner` and `owner_ref`): a pod's owner label or annotation and its controller, a Slurm
-- job's user and account. Named in reclaim notices; never part of a charge, so a holder's owner is
-- a fact about it, not part of its key (`holders`), and a series without them changes nothing.
CREATE TABLE holder_owners (
    holder_id INTEGER NOT NULL,
    owner     VARCHAR,
    owner_ref VARCHAR
);
