-- Which agent admitted a reservation, and when: a restarted agent releases the ones it held (its writes died
-- with it), and reconciliation releases old ones.
ALTER TABLE reservations ADD COLUMN holder TEXT;
ALTER TABLE reservations ADD COLUMN created_at BIGINT NOT NULL DEFAULT 0;
