use std::collections::HashSet;

use super::*;

fn doc() -> serde_json::Value {
    openapi::document(&endpoints(), "test")
}

/// Whether a schema says nothing (any JSON), at its top or as the items of an array.
fn says_nothing(s: &serde_json::Value) -> bool {
    let empty = s.as_object().is_some_and(|o| o.is_empty()) || *s == serde_json::Value::Bool(true);
    empty || (s["type"] == "array" && says_nothing(&s["items"]))
}

#[test]
fn every_route_is_declared_once() {
    let mut seen = HashSet::new();
    for e in endpoints() {
        assert!(seen.insert((e.method, e.path)), "{e:?} twice");
    }
    let n: usize = doc()["paths"]
        .as_object()
        .map(|p| {
            p.values()
                .map(|ops| ops.as_object().map_or(0, |o| o.len()))
                .sum()
        })
        .unwrap_or(0);
    assert_eq!(n, seen.len());
}

#[test]
fn every_route_has_a_typed_answer() {
    // A route whose answer is "any JSON" (a `serde_json::Value`) is not part of the contract: give it a type.
    let doc = doc();
    for e in endpoints() {
        let op = &doc["paths"][e.path][e.method.as_str().to_lowercase()];
        let ok = &op["responses"][e.status.to_string()];
        let schema = ok["content"]
            .as_object()
            .and_then(|c| c.values().next())
            .map(|c| c["schema"].clone());
        assert!(
            !schema.as_ref().is_some_and(says_nothing),
            "{} {} answers untyped JSON: give it a type",
            e.method.as_str(),
            e.path
        );
        // No body only with "accepted" or "no content".
        assert!(schema.is_some() || matches!(e.status, 202 | 204), "{e:?}");
    }
}

#[test]
fn every_route_that_changes_something_documents_its_body() {
    // Routes that take no body although they change something: the location is in the query.
    const NO_BODY: &[&str] = &["POST /v1/prefetch"];
    for e in endpoints() {
        let name = format!("{} {}", e.method.as_str(), e.path);
        if matches!(e.method, Method::POST | Method::PUT) && !NO_BODY.contains(&name.as_str()) {
            let mut g = schemars::SchemaGenerator::default();
            assert!(
                e.request(&mut g).is_some(),
                "{name} takes a body it does not declare"
            );
        }
    }
}

#[test]
fn every_type_has_one_name() {
    // schemars numbers a second type of the same name (`Deleted2`): two types would share a name in the
    // document and in docs/api.md.
    let doc = doc();
    for name in doc["components"]["schemas"]
        .as_object()
        .into_iter()
        .flat_map(|s| s.keys())
    {
        assert!(
            !name.ends_with(|c: char| c.is_ascii_digit()),
            "{name}: two API types share a name"
        );
    }
}

#[test]
fn docs_api_md_is_what_the_types_say() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.md");
    let want = openapi::markdown(&openapi::document(&endpoints(), "-"));
    if std::env::var_os("UPDATE_API_DOC").is_some() {
        std::fs::write(path, &want).expect("writing docs/api.md");
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/api.md is not what the endpoint types say: run UPDATE_API_DOC=1 cargo test -p strata-api"
    );
}

#[test]
fn queries_and_bodies_are_described_as_the_handlers_parse_them() {
    let doc = doc();
    // A required query parameter, an optional one with its range, and an enum.
    let list = &doc["paths"]["/v1/list"]["get"]["parameters"];
    let p = |name: &str| {
        list.as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(p("location")["required"], true);
    assert_eq!(p("limit")["required"], false);
    assert_eq!(p("limit")["schema"]["maximum"], 1000);
    let usage = &doc["paths"]["/v1/usage"]["get"]["parameters"][0];
    assert_eq!(usage["name"], "by");
    // Bodies refuse unknown fields as the handlers do.
    let teams = &doc["components"]["schemas"]["NewTeam"];
    assert_eq!(teams["additionalProperties"], false);
    assert_eq!(
        doc["paths"]["/v1/prefetch"]["post"]["responses"]["202"]["content"]["application/json"]["schema"]
            ["$ref"],
        "#/components/schemas/Started"
    );
}

#[test]
fn an_untyped_answer_is_caught() {
    crate::endpoint! {
        /// A route answering any JSON
        Loose = GET "/loose", Data, Access::Any, "any principal";
        query: NoQuery, request: Empty, response: Json<Vec<serde_json::Value>>
    }
    let doc = openapi::document(&[EndpointDoc::of::<Loose>()], "test");
    let schema =
        &doc["paths"]["/loose"]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
    assert!(says_nothing(schema), "{schema}");
}

#[test]
fn plan_and_item_states_round_trip_through_their_stored_names_and_refuse_others() {
    use crate::lifecycle::{ItemState, PlanStatus};
    for s in [
        ItemState::Planned,
        ItemState::Trashed,
        ItemState::Skipped,
        ItemState::Deferred,
    ]
    .into_iter()
    .chain([ItemState::Restored, ItemState::Purged])
    {
        assert_eq!(ItemState::try_from(s.as_str().to_string()).ok(), Some(s));
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
    for s in [
        PlanStatus::Planned,
        PlanStatus::Running,
        PlanStatus::Done,
        PlanStatus::Partial,
    ] {
        assert_eq!(PlanStatus::try_from(s.as_str().to_string()).ok(), Some(s));
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
    let e = ItemState::try_from("moved".to_string()).unwrap_err();
    assert_eq!(e.kind(), strata_types::ErrorKind::InvalidInput);
    assert!(
        e.to_string().contains("\"moved\"") && e.to_string().contains("trashed"),
        "{e}"
    );
}
