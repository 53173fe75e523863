-- Claims: what a job declared about its data (the spec as submitted, JSON), where it is in its life, its staging
-- progress and its accounting (JSON documents of strata-claim's types). `live_job` is `team/job` until the claim
-- is released and NULL after, so a team has at most one live claim per job.
CREATE TABLE claims (
    id            TEXT PRIMARY KEY,
    team          TEXT NOT NULL,
    job           TEXT NOT NULL,
    principal     TEXT NOT NULL,
    agent         TEXT NOT NULL,
    spec          TEXT NOT NULL,
    state         TEXT NOT NULL,
    reason        TEXT NOT NULL,
    progress      TEXT NOT NULL,
    usage         TEXT NOT NULL,
    datasets      TEXT NOT NULL,
    scratch_id    TEXT,
    created_at    BIGINT NOT NULL,
    deadline_at   BIGINT NOT NULL,
    ready_at      BIGINT,
    heartbeat_at  BIGINT NOT NULL,
    released_at   BIGINT,
    live_job      TEXT
);
CREATE UNIQUE INDEX claims_live_job ON claims (live_job);
CREATE INDEX claims_team_job ON claims (team, job);

-- The exact object versions a claim pinned when it was admitted: what staging fills and what `ready` counts.
CREATE TABLE claim_objects (
    claim_id     TEXT NOT NULL,
    dataset      TEXT NOT NULL,
    backend      TEXT NOT NULL,
    key          TEXT NOT NULL,
    size         BIGINT NOT NULL,
    etag         TEXT,
    version      TEXT,
    modified_at  BIGINT NOT NULL,
    PRIMARY KEY (claim_id, dataset, key)
);
