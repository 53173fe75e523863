//! The data plane: reads, listings, prefetches, warm-ups, pins, cache and cluster state, metrics, health.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Binary, Empty, Json, Ndjson, NoQuery, Role, Text, endpoint, endpoint_list};

/// An OpenAPI 3.0 document (this API's, as `GET /openapi.json` serves it).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OpenApiDocument(pub serde_json::Value);

impl JsonSchema for OpenApiDocument {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "OpenApiDocument".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "required": ["openapi", "paths"],
            "description": "An OpenAPI 3.0 document.",
        })
    }
}

/// Answer of `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Health {
    /// `ok` while the agent serves.
    pub status: String,
    /// The agent's version.
    pub version: String,
}

/// A configured backend. Where it is (its URL and canonical id: a local directory's absolute path on the
/// agent's host, an S3 endpoint) is shown to administrators only; every principal sees the names it can use
/// in locations, and each backend's kind.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BackendInfo {
    /// The name locations use (`NAME/key`).
    pub name: String,
    /// `s3`, `file`, `memory`, `gs` or `az`.
    pub scheme: String,
    /// Its URL (administrators only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its canonical id (administrators only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// Query of the routes that name one location (`NAME/key`, a URL under a configured backend, or an ad-hoc
/// `s3://bucket/key`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LocationQuery {
    /// The object location.
    pub location: String,
}

/// Body of `POST /v1/cache/warm`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Warm {
    /// What to warm: a prefix location.
    pub location: String,
    /// Blocks fetched concurrently (1..=256, default 16).
    #[serde(default)]
    pub concurrency: Option<usize>,
}

/// Body of pin and unpin.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PinLocation {
    /// The prefix location.
    pub location: String,
}

/// What an unpin removed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Unpinned {
    /// Whether a pin was there.
    pub removed: bool,
}

/// One line of a warm-up's NDJSON stream.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct WarmLine {
    /// Progress so far.
    #[serde(flatten)]
    pub progress: crate::cache::WarmProgress,
    /// True on the last line.
    pub done: bool,
    /// Set when the warm-up as a whole failed (listing failed, shutdown).
    pub error: Option<String>,
}

/// Answer of `POST /v1/prefetch`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Started {
    /// Always true: the fetches are started.
    pub started: bool,
}

/// `GET /v1/list` parameters.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// The location whose objects are listed: a key prefix (`NAME/train/`), or `NAME` for the whole backend.
    pub location: String,
    /// Start after this name (the page before's `next`).
    pub after: Option<String>,
    /// Objects per page, 1 to 1000 (default 1000).
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<usize>,
}

/// One object of a listing. `name` is the key with the location's key prefix taken off, so `location` +
/// `name` is the object's location.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListedObject {
    /// The key after the listed prefix.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// The ETag (as the backend gives it), if it has one.
    pub etag: Option<String>,
    /// The version id, if the backend versions objects.
    pub version: Option<String>,
    /// Last modification, seconds since the Unix epoch.
    pub last_modified_unix: i64,
}

/// A page of `GET /v1/list`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListPage {
    /// Objects in key order.
    pub objects: Vec<ListedObject>,
    /// Pass as `after` for the next page; absent on the last.
    pub next: Option<String>,
}

endpoint! {
    /// Liveness
    Healthz = GET "/healthz", Public, Access::Public, "anyone";
    query: NoQuery, request: Empty, response: Json<Health>
}
endpoint! {
    /// This document
    OpenApi = GET "/openapi.json", Public, Access::Public, "anyone";
    query: NoQuery, request: Empty, response: Json<OpenApiDocument>
}
endpoint! {
    /// Prometheus metrics (per-team forecasts included)
    Metrics = GET "/metrics", Data, Access::Admin, "admin";
    query: NoQuery, request: Empty, response: Text
}
endpoint! {
    /// Cache statistics
    CacheStats = GET "/v1/cache", Data, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<crate::cache::CacheStats>
}
endpoint! {
    /// Configured backends
    Backends = GET "/v1/backends", Data, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Vec<BackendInfo>>
}
endpoint! {
    /// Prefetch a prefix (NDJSON progress)
    WarmPrefix = POST "/v1/cache/warm", Data, Access::Location(Role::Reader),
        "reader of the teams owning the prefix and any owned prefix under it";
    query: NoQuery, request: Json<Warm>, response: Ndjson<WarmLine>
}
endpoint! {
    /// Pin a prefix in the cache
    Pin = POST "/v1/cache/pin", Data, Access::Location(Role::Member),
        "member of the teams owning the prefix and any owned prefix under it; charged to the owner";
    query: NoQuery, request: Json<PinLocation>, response: Json<crate::cache::PinReport>
}
endpoint! {
    /// Unpin a prefix
    Unpin = POST "/v1/cache/unpin", Data, Access::Owner(Role::Member), "member of the team the pin is charged to";
    query: NoQuery, request: Json<PinLocation>, response: Json<Unpinned>
}
endpoint! {
    /// Read an object through the cache (its Range and If-Match headers honoured)
    Read = GET "/v1/read", Data, Access::Location(Role::Reader),
        "reader of the team owning the key (any principal outside owned prefixes)";
    query: LocationQuery, request: Empty, response: Binary
}
endpoint! {
    /// List the objects under a location, a page at a time
    List = GET "/v1/list", Data, Access::Location(Role::Reader),
        "reader of every key under the location (any principal outside owned prefixes)";
    query: ListQuery, request: Empty, response: Json<ListPage>
}
endpoint! {
    /// Start fetching an object (or its Range) into the cache
    Prefetch = POST "/v1/prefetch", Data, Access::Location(Role::Reader),
        "reader of the team owning the key (any principal outside owned prefixes)";
    query: LocationQuery, request: Empty, response: Json<Started>, status: 202
}

endpoint_list!(
    Healthz, OpenApi, Metrics, CacheStats, Backends, WarmPrefix, Pin, Unpin, Read, List, Prefetch,
);
