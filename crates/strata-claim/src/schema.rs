//! The claim's JSON Schema, written to mirror [`crate::ClaimSpec`] (every object refuses unknown fields, as
//! the parser does). A test checks it against the spec's own examples and rules.

use serde_json::{Value, json};

/// The JSON Schema (draft 2020-12) of a claim document.
pub fn schema() -> Value {
    let location = json!({"type": "string", "minLength": 1, "maxLength": 4096});
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://strata.dev/schemas/claim-v1.json",
        "title": "Strata claim",
        "description": "What a job declares about its data: datasets (staged, pinned or streamed; mounted), its checkpoint location, and scratch.",
        "type": "object",
        "additionalProperties": false,
        "required": ["version", "job", "team"],
        "properties": {
            "version": {"const": crate::SPEC_VERSION},
            "job": {"type": "string", "pattern": "^[A-Za-z0-9._:/-]{1,128}$"},
            "team": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,62}$"},
            "datasets": {
                "type": "array",
                "maxItems": 64,
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["name", "location"],
                    "properties": {
                        "name": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,62}$"},
                        "location": location,
                        "mode": {"enum": ["stage", "pin", "stream"], "default": "stage"},
                        "mount": {"type": "string", "pattern": "^/.+"},
                        "replicas": {"type": "integer", "minimum": 1, "maximum": crate::spec::MAX_REPLICAS}
                    }
                }
            },
            "checkpoint": {
                "type": "object",
                "additionalProperties": false,
                "required": ["location"],
                "properties": {
                    "location": location,
                    "keep_last": {"type": "integer", "minimum": 1, "maximum": 1000}
                }
            },
            "scratch": {
                "type": "object",
                "additionalProperties": false,
                "required": ["size", "ttl_secs"],
                "properties": {
                    "size": {"anyOf": [
                        {"type": "integer", "minimum": 1},
                        {"type": "string", "pattern": "^\\s*[0-9.]+\\s*[A-Za-z]*\\s*$"}
                    ]},
                    "ttl_secs": {"type": "integer", "minimum": 1, "maximum": 7776000}
                }
            },
            "ttl_secs": {"type": "integer", "minimum": 10, "maximum": 2592000},
            "stage_deadline_secs": {"type": "integer", "minimum": 10, "maximum": 604800}
        }
    })
}

/// A claim document's schema is the published one ([`schema`]), less what OpenAPI 3.0 has no place for: the
/// API's contract describes claims with it.
impl schemars::JsonSchema for crate::ClaimSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ClaimSpec".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut v = schema();
        if let Some(o) = v.as_object_mut() {
            o.remove("$schema");
            o.remove("$id");
        }
        schemars::Schema::try_from(v).unwrap_or_default()
    }
}
