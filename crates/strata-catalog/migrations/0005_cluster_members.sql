-- Agents sharing their block caches with membership from the catalog (`[cluster] cache = "catalog"`): each
-- heartbeats its row; the members are the rows seen within the TTL. `capacity` is the agent's cache capacity in
-- bytes, its placement weight.
CREATE TABLE cluster_members (
    id          TEXT PRIMARY KEY,
    capacity    BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    seen_at     BIGINT NOT NULL
);

-- Facts about the catalog itself: `id`, made on first use, tells agents whether they share one catalog (the
-- peer block route decides access for a principal only when the asking agent's catalog is its own).
CREATE TABLE catalog_meta (
    name   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
