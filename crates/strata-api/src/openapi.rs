//! `/openapi.json` and `docs/api.md`, generated from the endpoint types ([`crate::endpoints`]): nothing
//! about a route is written twice.
//!
//! The document is OpenAPI 3.0 (schemathesis and most generators read it): schemas come from the types'
//! `JsonSchema` derives with schemars' OpenAPI 3 settings (`nullable`, `#/components/schemas`), every route
//! lists its query parameters, its body, its answer and the error body every failure carries, and
//! `x-strata-access` / `x-strata-plane` say who may call it.

use serde_json::{Map, Value, json};

use schemars::generate::{SchemaGenerator, SchemaSettings};

use crate::{EndpointDoc, ErrorBody, Plane};

fn generator() -> SchemaGenerator {
    SchemaSettings::openapi3().into_generator()
}

/// The query parameters of `e`: (name, required, schema, description).
fn query_params(e: &EndpointDoc) -> Vec<(String, bool, Value, Option<String>)> {
    let mut settings = SchemaSettings::openapi3();
    settings.inline_subschemas = true;
    let schema = e.query_schema(&mut settings.into_generator());
    let v = schema.as_value();
    let required: Vec<&str> = v["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = v["properties"].as_object() else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, s)| {
            let mut s = s.clone();
            let description = s
                .as_object_mut()
                .and_then(|o| o.remove("description"))
                .and_then(|d| d.as_str().map(str::to_string));
            (
                name.clone(),
                required.contains(&name.as_str()),
                s,
                description,
            )
        })
        .collect()
}

/// The statuses a failure may have, with the error kinds they carry.
const ERRORS: &[(&str, &str)] = &[
    ("400", "invalid_input"),
    ("401", "unauthenticated"),
    ("403", "permission_denied"),
    ("404", "not_found"),
    ("409", "already_exists"),
    ("412", "precondition_failed"),
    ("429", "resource_exhausted (quota)"),
    ("503", "unavailable (retryable)"),
];

/// The OpenAPI 3 document of `endpoints`.
pub fn document(endpoints: &[EndpointDoc], version: &str) -> Value {
    let mut g = generator();
    let error = serde_json::to_value(g.subschema_for::<ErrorBody>()).unwrap_or(Value::Null);
    let mut paths = Map::new();
    for e in endpoints {
        let mut params: Vec<Value> = e
            .path_params()
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        for (name, required, schema, description) in query_params(e) {
            let mut p =
                json!({"name": name, "in": "query", "required": required, "schema": schema});
            if let Some(d) = description {
                p["description"] = Value::String(d);
            }
            params.push(p);
        }
        let mut responses = Map::new();
        let ok = match e.response(&mut g) {
            Some((media, schema)) => json!({
                "description": "success",
                "content": {media.content_type(): {"schema": schema}},
            }),
            None => json!({"description": "success, no body"}),
        };
        responses.insert(e.status.to_string(), ok);
        for (status, kind) in ERRORS {
            responses.insert(
                (*status).into(),
                json!({"description": kind, "content": {"application/json": {"schema": error}}}),
            );
        }
        let mut op = json!({
            "operationId": e.name,
            "summary": e.summary,
            "description": format!("Access: {}.", e.who),
            "x-strata-access": e.rule.to_json(),
            "x-strata-plane": e.plane.as_str(),
            "parameters": params,
            "responses": responses,
        });
        if e.plane == Plane::Public {
            op["security"] = json!([]);
        }
        if let Some((media, schema)) = e.request(&mut g) {
            op["requestBody"] = json!({
                "required": true,
                "content": {media.content_type(): {"schema": schema}},
            });
        }
        let entry = paths.entry(e.path.to_string()).or_insert_with(|| json!({}));
        entry[e.method.as_str().to_lowercase()] = op;
    }
    let schemas: Map<String, Value> = g.take_definitions(true).into_iter().collect();
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Strata agent API", "version": version},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
        "security": [{"bearer": []}],
        "paths": paths,
    })
}

/// A schema in a line of Markdown: a type's name for a `$ref`, else its JSON type.
fn type_name(s: &Value) -> String {
    if let Some(r) = s["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("[`{name}`](#{})", name.to_lowercase());
    }
    if let Some(all) = s["allOf"].as_array()
        && all.len() == 1
    {
        return type_name(&all[0]);
    }
    if let Some(e) = s["enum"].as_array() {
        let names: Vec<String> = e.iter().map(|v| format!("`{v}`")).collect();
        return names.join(" \\| ");
    }
    if let Some(any) = s["anyOf"].as_array().or(s["oneOf"].as_array()) {
        let names: Vec<String> = any.iter().map(type_name).collect();
        return names.join(" or ");
    }
    let base = match s["type"].as_str() {
        Some("array") => format!("array of {}", type_name(&s["items"])),
        Some("object") if s["additionalProperties"].is_object() => {
            format!("map to {}", type_name(&s["additionalProperties"]))
        }
        Some(t) => match s["format"].as_str() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
        None => "any".to_string(),
    };
    if s["nullable"] == Value::Bool(true) {
        format!("{base} or null")
    } else {
        base
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// `docs/api.md`: every route (who may call it, parameters, body, answer) and every type, from `doc` (the
/// output of [`document`]).
pub fn markdown(doc: &Value) -> String {
    let mut out = String::from(include_str!("../doc/intro.md"));
    out.push_str(
        "\n# Routes\n\nEvery route but the public ones needs `Authorization: Bearer <token>`; every failure \
         answers an [`ErrorBody`](#errorbody) with the status of its kind.\n\n",
    );
    let empty = Map::new();
    let paths = doc["paths"].as_object().unwrap_or(&empty);
    for (plane, title) in [
        ("public", "Public"),
        ("data", "Data plane"),
        ("peer", "Peers and the cluster"),
        ("control", "Control plane"),
    ] {
        out.push_str(&format!("## {title}\n\n"));
        for (path, ops) in paths {
            for (method, op) in ops.as_object().unwrap_or(&empty) {
                if op["x-strata-plane"] != plane {
                    continue;
                }
                out.push_str(&format!(
                    "### `{} {path}`\n\n{}\n\n{}\n\n",
                    method.to_uppercase(),
                    op["summary"].as_str().unwrap_or(""),
                    op["description"].as_str().unwrap_or("")
                ));
                let query: Vec<&Value> = op["parameters"]
                    .as_array()
                    .map(|p| p.iter().filter(|p| p["in"] == "query").collect())
                    .unwrap_or_default();
                if !query.is_empty() {
                    out.push_str("| query | type | required | |\n|---|---|---|---|\n");
                    for p in query {
                        out.push_str(&format!(
                            "| `{}` | {} | {} | {} |\n",
                            p["name"].as_str().unwrap_or(""),
                            type_name(&p["schema"]),
                            if p["required"] == true { "yes" } else { "no" },
                            cell(p["description"].as_str().unwrap_or(""))
                        ));
                    }
                    out.push('\n');
                }
                let body = |v: &Value| -> Option<String> {
                    let (media, c) = v["content"].as_object()?.iter().next()?;
                    Some(format!("{} ({media})", type_name(&c["schema"])))
                };
                if let Some(b) = body(&op["requestBody"]) {
                    out.push_str(&format!("Body: {b}\n\n"));
                }
                let ok = op["responses"]
                    .as_object()
                    .and_then(|r| r.iter().find(|(s, _)| s.starts_with('2')));
                if let Some((status, r)) = ok {
                    let answer = body(r).unwrap_or_else(|| "no body".into());
                    out.push_str(&format!("Answer ({status}): {answer}\n\n"));
                }
            }
        }
    }
    out.push_str("# Types\n\n");
    let schemas = doc["components"]["schemas"].as_object().unwrap_or(&empty);
    for (name, s) in schemas {
        out.push_str(&format!("## {name}\n\n"));
        if let Some(d) = s["description"].as_str() {
            out.push_str(&format!("{d}\n\n"));
        }
        if let Some(props) = s["properties"].as_object() {
            let required: Vec<&str> = s["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            out.push_str("| field | type | required | |\n|---|---|---|---|\n");
            for (field, p) in props {
                out.push_str(&format!(
                    "| `{field}` | {} | {} | {} |\n",
                    type_name(p),
                    if required.contains(&field.as_str()) {
                        "yes"
                    } else {
                        "no"
                    },
                    cell(p["description"].as_str().unwrap_or(""))
                ));
            }
            out.push('\n');
        } else {
            out.push_str(&format!("{}\n\n", type_name(s)));
        }
    }
    out
}
