-- 0013: the keys that sign the notices' keep links, and every keep made through one.
-- The keys live in the ledger (not a key file) so they survive a restart and are backed up with
-- the data they sign for; retired_at NULL marks the key that signs new links, and a retired key
-- still verifies until retired_at (docs/reclaim.md, "Keep links").
CREATE TABLE keep_link_keys (
    key_id      INTEGER NOT NULL,
    secret      BLOB    NOT NULL,
    created_at  BIGINT  NOT NULL,
    retired_at  BIGINT
);
-- The per-episode bound (reclaim.max_keep_per_episode) counts these rows' seconds.
CREATE TABLE reclaim_keeps (
    episode_id    VARCHAR NOT NULL,
    exemption_id  VARCHAR NOT NULL,
    seconds       BIGINT  NOT NULL,
    created_at    BIGINT  NOT NULL
);
-- webhook | slack | teams: only a scheduler webhook's delivery of reclaim.requested counts as
-- the request delivered. DuckDB cannot add a NOT NULL column: read it as coalesce(channel, 'webhook').
ALTER TABLE webhook_outbox ADD COLUMN channel VARCHAR DEFAULT 'webhook';
