//! The request bodies and query parameters of the API, as JSON Schema for `/openapi.json`: what clients
//! (and the bounded schemathesis run of the test command) build requests from. Each mirrors the Rust type
//! its handler parses (every one refuses unknown fields, so `additionalProperties` is false); a route that
//! takes a body and has none here fails `routes::tests::every_body_route_documents_its_body`.

use serde_json::{Value, json};

fn object(required: &[&str], props: Value) -> Value {
    json!({"type": "object", "required": required, "properties": props, "additionalProperties": false})
}

fn opt_int() -> Value {
    json!({"type": ["integer", "null"]})
}

fn opt_str() -> Value {
    json!({"type": ["string", "null"]})
}

const ROLE: &[&str] = &["reader", "member", "team_admin"];

/// The JSON body `method path` takes, if any.
pub fn request_body(method: &str, path: &str) -> Option<Value> {
    let location = || object(&["location"], json!({"location": {"type": "string"}}));
    Some(match (method, path) {
        ("POST", "/v1/cache/warm") => object(
            &["location"],
            json!({"location": {"type": "string"}, "concurrency": opt_int()}),
        ),
        ("POST", "/v1/cache/pin") | ("POST", "/v1/cache/unpin") => location(),
        ("POST", "/v1/teams") => object(&["name"], json!({"name": {"type": "string"}})),
        ("PUT", "/v1/teams/{team}/members/{principal}") => {
            object(&["role"], json!({"role": {"enum": ROLE}}))
        }
        ("POST", "/v1/tokens") => object(
            &["name", "kind"],
            json!({"name": {"type": "string"}, "kind": {"enum": ["token", "s3_key"]},
                   "team": opt_str(), "role": {"enum": [ROLE[0], ROLE[1], ROLE[2], null]},
                   "admin": {"type": "boolean"}}),
        ),
        ("PUT", "/v1/quotas/{team}/{scope}") => object(
            &[],
            json!({"soft_bytes": opt_int(), "hard_bytes": opt_int(), "soft_objects": opt_int(),
                   "hard_objects": opt_int(), "grace_secs": {"type": "integer"}}),
        ),
        ("POST", "/v1/quotas/{team}/{scope}/reserve") => object(
            &["bytes"],
            json!({"bytes": {"type": "integer"}, "objects": {"type": "integer"}, "ttl_secs": opt_int()}),
        ),
        ("POST", "/v1/quotas/{team}/{scope}/free") | ("POST", "/v1/reservations/{id}/commit") => {
            object(
                &["bytes"],
                json!({"bytes": {"type": "integer"}, "objects": {"type": "integer"}, "key": opt_str()}),
            )
        }
        ("POST", "/v1/quotas/{team}/{scope}/deleted") => {
            object(&["prefix"], json!({"prefix": {"type": "string"}}))
        }
        ("POST", "/v1/reservations/{id}/release") => object(&[], json!({})),
        ("POST", "/v1/usage/reconcile") => {
            object(&["backend"], json!({"backend": {"type": "string"}}))
        }
        ("POST", "/v1/usage/scan") => object(
            &["backend"],
            json!({"backend": {"type": "string"}, "threads": {"type": "integer", "minimum": 0}}),
        ),
        ("PUT", "/v1/prefixes") => object(
            &["backend", "prefix", "team"],
            json!({"backend": {"type": "string"}, "prefix": {"type": "string"}, "team": {"type": "string"}}),
        ),
        ("POST", "/v1/policies") => object(
            &["team", "backend", "kind"],
            json!({"id": {"type": "string"}, "team": {"type": "string"}, "backend": {"type": "string"},
                   "kind": {"enum": ["ttl", "stale", "keep_last"]}, "prefix": opt_str(), "label": opt_str(),
                   "age_secs": opt_int(), "keep_last": opt_int(), "created_at": {"type": "integer"}}),
        ),
        ("POST", "/v1/protections") => object(
            &["kind", "team", "backend", "prefix"],
            json!({"id": {"type": "string"}, "kind": {"enum": ["pin", "claim"]}, "team": {"type": "string"},
                   "backend": {"type": "string"}, "prefix": {"type": "string"}, "job": opt_str(),
                   "expires_at": opt_int(), "created_at": {"type": "integer"}}),
        ),
        ("POST", "/v1/cleanup/plans") => object(&[], json!({"team": opt_str()})),
        ("POST", "/v1/cleanup/plans/{id}/run") => object(
            &[],
            json!({"max_objects": {"type": ["integer", "null"], "minimum": 0},
                   "max_bytes": {"type": ["integer", "null"], "minimum": 0},
                   "max_team_percent": {"type": ["number", "null"]}}),
        ),
        ("POST", "/v1/cleanup/plans/{id}/restore") => object(&[], json!({"key_prefix": opt_str()})),
        ("POST", "/v1/cleanup/purge") => object(&[], json!({"grace_secs": opt_int()})),
        ("POST", "/v1/claims") | ("POST", "/v1/claims/validate") => {
            // The document as published at /v1/claims/schema, less what OpenAPI 3.0 has no place for.
            let mut v = strata_claim::schema();
            if let Some(o) = v.as_object_mut() {
                o.remove("$schema");
                o.remove("$id");
            }
            v
        }
        ("POST", "/v1/claims/{id}/heartbeat") => object(
            &[],
            json!({"stall_secs": {"type": "number", "minimum": 0}, "reporter": opt_str()}),
        ),
        ("POST", "/v1/claims/{id}/release") => object(&[], json!({"reason": opt_str()})),
        ("POST", "/v1/peer/stage") | ("POST", "/v1/peer/held") => object(
            &["backend", "block_size", "objects"],
            json!({"backend": {"type": "string"}, "block_size": {"type": "integer", "minimum": 1},
                   "objects": {"type": "array", "items": object(
                       &["key", "size", "mtime"],
                       json!({"key": {"type": "string"}, "size": {"type": "integer", "minimum": 0},
                              "etag": opt_str(), "version": opt_str(), "mtime": {"type": "integer"}}))}}),
        ),
        ("POST", "/v1/peer/invalidate") => object(
            &["from"],
            json!({"from": {"type": "string"},
                   "changes": {"type": "array", "maxItems": 1000, "items": {
                       "type": "object", "required": ["backend"],
                       "properties": {"backend": {"type": "string"}, "key": {"type": "string"},
                                      "prefix": {"type": "string"}}}}}),
        ),
        ("POST", "/v1/peer/pins") => object(
            &["from", "pins"],
            json!({"from": {"type": "string"},
                   "pins": {"type": "array", "maxItems": 10000, "items": {
                       "type": "object", "required": ["backend", "prefix"],
                       "properties": {"backend": {"type": "string"}, "prefix": {"type": "string"}}}}}),
        ),
        ("POST", "/v1/claims/{id}/attach") | ("POST", "/v1/claims/{id}/detach") => {
            object(&[], json!({}))
        }
        ("POST", "/v1/scratch") => object(
            &["team", "bytes", "ttl_secs"],
            json!({"team": {"type": "string"}, "bytes": {"type": "integer"},
                   "ttl_secs": {"type": "integer"}}),
        ),
        ("POST", "/v1/ckpt/handoff") => object(
            &[
                "run_id",
                "step",
                "rank",
                "world_size",
                "upload",
                "local_dir",
                "peers",
                "replicas",
                "keep_local",
                "keep_remote",
                "commit_timeout_ms",
            ],
            json!({"run_id": {"type": "string"}, "step": {"type": "integer", "minimum": 0},
                   "rank": {"type": "integer", "minimum": 0}, "world_size": {"type": "integer", "minimum": 0},
                   "upload": {"type": "boolean"}, "local_dir": {"type": "string"}, "remote_url": opt_str(),
                   "peers": {"type": "array", "items": {"type": "string"}},
                   "self_peer": {"type": ["integer", "null"], "minimum": 0},
                   "replicas": {"type": "integer", "minimum": 0},
                   "keep_local": {"type": "integer", "minimum": 0},
                   "keep_remote": {"type": "integer", "minimum": 0},
                   "keep_every": {"type": ["integer", "null"], "minimum": 0},
                   "commit_timeout_ms": {"type": "integer", "minimum": 0}}),
        ),
        _ => return None,
    })
}

/// Bodies that are bytes, not JSON.
pub fn binary_body(method: &str, path: &str) -> bool {
    (method, path) == ("PUT", "/v1/peer/ckpt/{run}/{step}/{file}")
}

/// The query parameters `method path` reads: (name, required, schema).
pub fn query(method: &str, path: &str) -> Vec<(&'static str, bool, Value)> {
    let s = || json!({"type": "string"});
    let int = || json!({"type": "integer", "minimum": 0});
    match (method, path) {
        ("GET", "/v1/read") | ("POST", "/v1/prefetch") => vec![("location", true, s())],
        ("GET", "/v1/list") => vec![
            ("location", true, s()),
            ("after", false, s()),
            (
                "limit",
                false,
                json!({"type": "integer", "minimum": 1, "maximum": 1000}),
            ),
        ],
        ("GET", "/v1/ckpt/handoff") => {
            vec![
                ("run", true, s()),
                ("step", true, int()),
                ("rank", true, int()),
            ]
        }
        ("GET", "/v1/tokens") => vec![("team", false, s())],
        ("GET", "/v1/coverage") => vec![("location", true, s()), ("team", false, s())],
        ("GET", "/v1/claims/{id}/objects") => vec![
            ("dataset", true, s()),
            ("after", false, s()),
            (
                "limit",
                false,
                json!({"type": "integer", "minimum": 1, "maximum": 1000}),
            ),
        ],
        ("GET", "/v1/claims") => vec![
            ("team", false, s()),
            ("job", false, s()),
            ("released", false, json!({"type": "boolean"})),
        ],
        ("GET", "/v1/audit") => vec![("team", false, s()), ("limit", false, int())],
        ("GET", "/v1/usage") => vec![(
            "by",
            false,
            json!({"enum": ["team", "prefix", "job", "dataset"]}),
        )],
        _ => Vec::new(),
    }
}
