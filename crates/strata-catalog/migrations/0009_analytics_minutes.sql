-- Access-analytics rollups shared by the agents of a fleet: each agent upserts its per-minute rows (the
-- minute in progress again as it grows) under its name and process start, and any agent answers the fleet
-- view by grouping them. Pruned past the retention by the agents themselves.
CREATE TABLE analytics_minutes (
    agent       TEXT NOT NULL,
    minute      BIGINT NOT NULL,
    team        TEXT NOT NULL,
    job         TEXT NOT NULL,
    dataset     TEXT NOT NULL,
    prefix      TEXT NOT NULL,
    class       TEXT NOT NULL,
    ops         BIGINT NOT NULL,
    errors      BIGINT NOT NULL,
    bytes       BIGINT NOT NULL,
    latency_us  BIGINT NOT NULL,
    ram         BIGINT NOT NULL,
    disk        BIGINT NOT NULL,
    peer        BIGINT NOT NULL,
    origin      BIGINT NOT NULL,
    PRIMARY KEY (agent, minute, team, job, dataset, prefix, class)
);
CREATE INDEX analytics_minutes_by_minute ON analytics_minutes (minute);
