-- Buckets made through the gateway's CreateBucket under `[gateway] bucket_root`: the team owning them (none for
-- a root key without a team), who made them and when.
CREATE TABLE buckets (
    name        TEXT PRIMARY KEY,
    team        TEXT,
    creator     TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
