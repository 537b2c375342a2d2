-- 0004: the readiness probe's row. `GET /readyz` has the writer update it in a transaction of its
-- own, so readiness says whether a commit can reach the disk (a full disk, a read-only or broken
-- file fail it), not only whether the process answers.
CREATE TABLE writer_probe (
    id          INTEGER PRIMARY KEY,
    checked_at  BIGINT  NOT NULL
);
INSERT INTO writer_probe VALUES (0, 0);
