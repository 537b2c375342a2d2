-- 0006: the writer's record of rollup folds it holds back while it is behind. While `from_ts` is
-- set, raw rows from that second on whose second is not in their minute's mask in `rollup_1m`
-- have been stored but not yet folded into the rollups: a start folds them before taking any
-- batch (aggregator/src/store/writer/held.rs). NULL: nothing is held.
CREATE TABLE fold_pending (
    id       INTEGER PRIMARY KEY,
    from_ts  BIGINT
);
INSERT INTO fold_pending VALUES (0, NULL);
