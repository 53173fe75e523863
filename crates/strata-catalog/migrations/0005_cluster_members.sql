-- Agents sharing their block caches with membership from the catalog (`[cluster] cache = "catalog"`): each
-- heartbeats its row; the members are the rows seen within the TTL. `capacity` is the agent's cache capacity in
-- bytes, its placement weight.
CREATE TABLE cluster_members (
    id          TEXT PRIMARY KEY,
    capacity    BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    seen_at     BIGINT NOT NULL
);
