-- What the job's processes report about a claim with their heartbeats: each reporter (a loader process:
-- host:pid) sends its running total of I/O stall, so a repeated or retried report counts once; the claim's
-- stall is the sum over its reporters.
CREATE TABLE claim_reports (
    claim_id     TEXT NOT NULL,
    reporter     TEXT NOT NULL,
    stall_ms     BIGINT NOT NULL,
    reported_at  BIGINT NOT NULL,
    PRIMARY KEY (claim_id, reporter)
);
