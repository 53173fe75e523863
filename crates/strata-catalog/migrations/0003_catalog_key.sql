-- Which key the catalog's secrets (S3 secret keys) are encrypted with: a keyed check value, never the key.
CREATE TABLE catalog_keys (
    id          TEXT PRIMARY KEY,
    check_value TEXT NOT NULL
);
