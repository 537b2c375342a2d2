-- 0005: reclaim — what the policy decided about each idle-hoarding episode, and the durable
-- outbox of signed webhooks (schema/WEBHOOK.md). Written by the one writer; the decision, the
-- episode's new state and the outbox rows of its event commit in one transaction, so a crash
-- either loses the whole decision (the next pass takes it again, under the same event id) or
-- keeps all of it. No indexes, like the ledger: the writer keeps (episode_id) and
-- (event_id, endpoint) unique.

-- How an episode ended: true when its holder became active again, false when the allocation
-- ended (or it goes on). Reclaim tells a cancelled reclaim (the user came back) from a done one.
ALTER TABLE hoarding_episodes ADD COLUMN resumed BOOLEAN;

-- One row per episode the policy has seen (episode_id: schema/src/webhook.rs::episode_id).
CREATE TABLE reclaim_episodes (
    episode_id       VARCHAR NOT NULL,
    tenant           VARCHAR,
    workload         VARCHAR,
    node             VARCHAR NOT NULL,
    gpu_uuid         VARCHAR NOT NULL,
    gpu_instance_id  INTEGER,
    slo_class        VARCHAR,
    started_at       BIGINT  NOT NULL,
    -- seen | notified | requested | cancelled | resolved
    state            VARCHAR NOT NULL,
    notified_at      BIGINT,
    requested_at     BIGINT,
    closed_at        BIGINT,
    -- the last hold recorded (why nothing was sent), so a hold is logged once, not every pass
    last_hold        VARCHAR,
    -- the episode as last sent (JSON EpisodeData), for events about an episode late data removed
    data             VARCHAR NOT NULL,
    updated_at       BIGINT  NOT NULL
);

-- Every decision and its reason, newest last (GET /api/v1/reclaims).
CREATE TABLE reclaim_decisions (
    decided_at  BIGINT  NOT NULL,
    episode_id  VARCHAR NOT NULL,
    tenant      VARCHAR,
    workload    VARCHAR,
    node        VARCHAR NOT NULL,
    -- notify | request | cancel | resolve | hold
    decision    VARCHAR NOT NULL,
    -- for a hold: stale | notify_only | exempt | waiting_after | waiting_notice |
    -- notice_undelivered | deferred | awaiting_alertmanager; otherwise the event's cause
    reason      VARCHAR NOT NULL,
    detail      VARCHAR NOT NULL,
    dry_run     BOOLEAN NOT NULL,
    event_id    VARCHAR
);

-- One row per event and endpoint. state: pending | delivered | failed | cancelled | disabled.
CREATE TABLE webhook_outbox (
    event_id         VARCHAR NOT NULL,
    endpoint         VARCHAR NOT NULL,
    event_type       VARCHAR NOT NULL,
    episode_id       VARCHAR NOT NULL,
    body             VARCHAR NOT NULL,
    created_at       BIGINT  NOT NULL,
    state            VARCHAR NOT NULL,
    attempts         INTEGER NOT NULL,
    next_attempt_at  BIGINT  NOT NULL,
    delivered_at     BIGINT,
    last_status      INTEGER,
    last_error       VARCHAR
);

-- Endpoints switched off by a 410 Gone (until an admin enables them again).
CREATE TABLE webhook_endpoints (
    endpoint     VARCHAR NOT NULL,
    disabled_at  BIGINT  NOT NULL,
    reason       VARCHAR NOT NULL
);

-- Snoozes: POST /api/v1/exemptions, and Alertmanager silences seen through its webhook.
CREATE TABLE reclaim_exemptions (
    exemption_id  VARCHAR NOT NULL,
    tenant        VARCHAR,
    -- a glob (* and ?) over the workload; NULL: every workload of the tenant
    workload      VARCHAR,
    until         BIGINT  NOT NULL,
    reason        VARCHAR NOT NULL,
    created_by    VARCHAR NOT NULL,
    created_at    BIGINT  NOT NULL
);

-- Episodes whose alert reached POST /api/v1/alertmanager (so was neither silenced nor
-- inhibited), with when it last did.
CREATE TABLE alertmanager_confirmations (
    episode_id    VARCHAR NOT NULL,
    confirmed_at  BIGINT  NOT NULL
);
