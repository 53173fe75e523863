//! What an endpoint is: its method, path, who may call it, and the types of its query, body and answer.
//!
//! Each route of the agent's API is a unit type implementing [`Endpoint`] (declared with the `endpoint!`
//! macro of this crate). The server registers a handler *for an endpoint type*, the client calls *an
//! endpoint type*, and `/openapi.json` and `docs/api.md` are generated from the same types
//! ([`crate::openapi`]), so the four cannot disagree.

use std::marker::PhantomData;

use schemars::generate::SchemaGenerator;
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde::de::DeserializeOwned;

use strata_types::{Error, ErrorKind, Result};

use crate::Role;

/// An HTTP method of the API.
#[allow(clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// `GET`
    GET,
    /// `POST`
    POST,
    /// `PUT`
    PUT,
    /// `DELETE`
    DELETE,
}

impl Method {
    /// The method's name (`GET`).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::GET => "GET",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::DELETE => "DELETE",
        }
    }
}

/// Which part of the API a route belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// Answered without a token (`/healthz`, `/openapi.json`).
    Public,
    /// Data plane: reads, prefetches, cache state and pins, metrics.
    Data,
    /// Checkpoint replicas and handed-over saves, from other agents and training processes; the cluster's
    /// member routes.
    Peer,
    /// Teams, tokens, quotas, usage, lifecycle, claims: every route names team data.
    Control,
}

impl Plane {
    /// The plane's name in `/openapi.json` (`x-strata-plane`).
    pub fn as_str(self) -> &'static str {
        match self {
            Plane::Public => "public",
            Plane::Data => "data",
            Plane::Peer => "peer",
            Plane::Control => "control",
        }
    }
}

/// Who may call a route, as a rule the handlers enforce and the tenancy tests check; published in
/// `/openapi.json` as `x-strata-access`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token.
    Public,
    /// Any principal; what it lists is only what it may see.
    Any,
    /// Global administrators.
    Admin,
    /// The role in the team the request names (`{team}`, or the body's or query's `team`).
    Team(Role),
    /// The role in the team that owns the resource the request names (`{id}`, `{principal}`, a pin); to
    /// others the resource does not exist (404).
    Owner(Role),
    /// The role in the team owning the location the request names (prefix ownership).
    Location(Role),
    /// The role in the caller's own team, whose resources (replicas, handed-over saves) are the only ones it
    /// names.
    OwnTeam(Role),
    /// Other agents of the cluster only, with the cluster credential; no token, not even an administrator's.
    Cluster,
}

impl Access {
    /// The rule as JSON (`{"rule": "team", "role": "member"}`).
    pub fn to_json(self) -> serde_json::Value {
        let (rule, role) = match self {
            Access::Public => ("public", None),
            Access::Any => ("any", None),
            Access::Admin => ("admin", None),
            Access::Team(r) => ("team", Some(r)),
            Access::Owner(r) => ("owner", Some(r)),
            Access::Location(r) => ("location", Some(r)),
            Access::OwnTeam(r) => ("own_team", Some(r)),
            Access::Cluster => ("cluster", None),
        };
        match role {
            Some(r) => serde_json::json!({"rule": rule, "role": r.as_str()}),
            None => serde_json::json!({"rule": rule}),
        }
    }
}

/// How a body or an answer travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    /// `application/json`.
    Json,
    /// `application/octet-stream`: an object's or a replica's bytes.
    Binary,
    /// `text/plain` (Prometheus metrics).
    Text,
    /// `application/x-ndjson`: one JSON value per line, streamed.
    Ndjson,
}

impl Media {
    /// The content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Media::Json => "application/json",
            Media::Binary => "application/octet-stream",
            Media::Text => "text/plain",
            Media::Ndjson => "application/x-ndjson",
        }
    }
}

/// What a body or an answer carries: the Rust value, its media type and its schema.
pub trait Payload {
    /// The value in Rust (`()` for none).
    type Value;
    /// Its media type; `None` for no body.
    const MEDIA: Option<Media>;
    /// Its schema, registered in `g` (a `$ref` for named types).
    fn schema(g: &mut SchemaGenerator) -> Option<Schema>;
    /// The bytes that carry `v` (`None`: no body).
    fn encode(v: &Self::Value) -> Result<Option<Vec<u8>>>;
    /// `v` from the bytes that carry it (a stream of lines: the last one).
    fn decode(b: &[u8]) -> Result<Self::Value>;
}

fn bad_answer(e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Internal,
        format!("the answer is not what the contract says: {e}"),
    )
}

/// No body.
#[derive(Debug)]
pub struct Empty;

impl Payload for Empty {
    type Value = ();
    const MEDIA: Option<Media> = None;
    fn schema(_: &mut SchemaGenerator) -> Option<Schema> {
        None
    }
    fn encode(_: &()) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    fn decode(_: &[u8]) -> Result<()> {
        Ok(())
    }
}

/// A JSON body of type `T`.
#[derive(Debug)]
pub struct Json<T>(PhantomData<fn() -> T>);

impl<T: JsonSchema + Serialize + DeserializeOwned> Payload for Json<T> {
    type Value = T;
    const MEDIA: Option<Media> = Some(Media::Json);
    fn schema(g: &mut SchemaGenerator) -> Option<Schema> {
        Some(g.subschema_for::<T>())
    }
    fn encode(v: &T) -> Result<Option<Vec<u8>>> {
        serde_json::to_vec(v)
            .map(Some)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("encoding a body: {e}")))
    }
    fn decode(b: &[u8]) -> Result<T> {
        // An empty answer reads as `null` (an optional answer).
        let b: &[u8] = if b.iter().all(u8::is_ascii_whitespace) {
            b"null"
        } else {
            b
        };
        serde_json::from_slice(b).map_err(bad_answer)
    }
}

/// Bytes.
#[derive(Debug)]
pub struct Binary;

impl Payload for Binary {
    type Value = Vec<u8>;
    const MEDIA: Option<Media> = Some(Media::Binary);
    fn schema(_: &mut SchemaGenerator) -> Option<Schema> {
        Some(schemars::json_schema!({"type": "string", "format": "binary"}))
    }
    fn encode(v: &Vec<u8>) -> Result<Option<Vec<u8>>> {
        Ok(Some(v.clone()))
    }
    fn decode(b: &[u8]) -> Result<Vec<u8>> {
        Ok(b.to_vec())
    }
}

/// Text.
#[derive(Debug)]
pub struct Text;

impl Payload for Text {
    type Value = String;
    const MEDIA: Option<Media> = Some(Media::Text);
    fn schema(_: &mut SchemaGenerator) -> Option<Schema> {
        Some(schemars::json_schema!({"type": "string"}))
    }
    fn encode(v: &String) -> Result<Option<Vec<u8>>> {
        Ok(Some(v.clone().into_bytes()))
    }
    fn decode(b: &[u8]) -> Result<String> {
        String::from_utf8(b.to_vec()).map_err(bad_answer)
    }
}

/// A stream of JSON values of type `T`, one per line.
#[derive(Debug)]
pub struct Ndjson<T>(PhantomData<fn() -> T>);

impl<T: JsonSchema + Serialize + DeserializeOwned> Payload for Ndjson<T> {
    type Value = T;
    const MEDIA: Option<Media> = Some(Media::Ndjson);
    fn schema(g: &mut SchemaGenerator) -> Option<Schema> {
        Some(g.subschema_for::<T>())
    }
    fn encode(v: &T) -> Result<Option<Vec<u8>>> {
        Json::<T>::encode(v)
    }
    fn decode(b: &[u8]) -> Result<T> {
        let last = b
            .split(|c| *c == b'\n')
            .rfind(|l| !l.iter().all(u8::is_ascii_whitespace))
            .unwrap_or_default();
        Json::<T>::decode(last)
    }
}

/// The query of a route that reads none.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, JsonSchema)]
pub struct NoQuery {}

/// One route of the API.
pub trait Endpoint {
    /// Its method.
    const METHOD: Method;
    /// Its path, with `{param}` segments (each one a string).
    const PATH: &'static str;
    /// What it does, in one line.
    const SUMMARY: &'static str;
    /// Who may call it, in words.
    const WHO: &'static str;
    /// Who may call it, as a rule.
    const RULE: Access;
    /// The part of the API it belongs to.
    const PLANE: Plane;
    /// Its query parameters ([`NoQuery`] for none); every field is one parameter.
    type Query: Serialize + DeserializeOwned + JsonSchema;
    /// Its body.
    type Request: Payload;
    /// Its answer on success.
    type Response: Payload;
    /// The status of a success.
    const STATUS: u16 = 200;
}

/// An endpoint as a value: what the route table, `/openapi.json` and `docs/api.md` are built from.
#[derive(Clone, Copy)]
pub struct EndpointDoc {
    /// Its method.
    pub method: Method,
    /// Its path.
    pub path: &'static str,
    /// What it does.
    pub summary: &'static str,
    /// Who may call it, in words.
    pub who: &'static str,
    /// Who may call it, as a rule.
    pub rule: Access,
    /// The part of the API it belongs to.
    pub plane: Plane,
    /// The endpoint type's name (`ListTeams`).
    pub name: &'static str,
    /// The status of a success.
    pub status: u16,
    query: fn(&mut SchemaGenerator) -> Schema,
    request: fn(&mut SchemaGenerator) -> Option<Schema>,
    request_media: Option<Media>,
    response: fn(&mut SchemaGenerator) -> Option<Schema>,
    response_media: Option<Media>,
}

impl std::fmt::Debug for EndpointDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.method.as_str(), self.path, self.name)
    }
}

impl EndpointDoc {
    /// The record of endpoint `E`.
    pub fn of<E: Endpoint>() -> Self {
        let name = std::any::type_name::<E>();
        Self {
            method: E::METHOD,
            path: E::PATH,
            summary: E::SUMMARY,
            who: E::WHO,
            rule: E::RULE,
            plane: E::PLANE,
            name: name.rsplit("::").next().unwrap_or(name),
            status: E::STATUS,
            query: |g| g.root_schema_for::<E::Query>(),
            request: E::Request::schema,
            request_media: <E::Request as Payload>::MEDIA,
            response: E::Response::schema,
            response_media: <E::Response as Payload>::MEDIA,
        }
    }

    /// The schema of its query as an object (its properties are the parameters).
    pub fn query_schema(&self, g: &mut SchemaGenerator) -> Schema {
        (self.query)(g)
    }

    /// Its body: media type and schema.
    pub fn request(&self, g: &mut SchemaGenerator) -> Option<(Media, Schema)> {
        Some((self.request_media?, (self.request)(g)?))
    }

    /// Its answer: media type and schema.
    pub fn response(&self, g: &mut SchemaGenerator) -> Option<(Media, Schema)> {
        Some((self.response_media?, (self.response)(g)?))
    }

    /// Its path with `args` in its `{param}` segments, in order, each percent-encoded as one segment.
    pub fn fill(&self, args: &[&str]) -> Result<String> {
        let mut args = args.iter();
        let mut out = String::with_capacity(self.path.len());
        for seg in self.path.split('/').skip(1) {
            out.push('/');
            if seg.starts_with('{') {
                let a = args.next().ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        format!("{}: too few path arguments", self.path),
                    )
                })?;
                out.push_str(&strata_types::encode_segment(a));
            } else {
                out.push_str(seg);
            }
        }
        if args.next().is_some() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{}: too many path arguments", self.path),
            ));
        }
        Ok(out)
    }

    /// The names of its `{param}` path segments, in order.
    pub fn path_params(&self) -> impl Iterator<Item = &'static str> {
        self.path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
    }
}

/// Declare an endpoint: a unit type and its [`Endpoint`] impl.
///
/// ```ignore
/// endpoint! {
///     /// The calling principal and its memberships.
///     WhoAmI = GET "/v1/whoami", Control, Access::Any, "any principal";
///     query: NoQuery, request: Empty, response: Json<Principal>
/// }
/// ```
#[macro_export]
macro_rules! endpoint {
    ($(#[doc = $doc:literal])+
     $name:ident = $method:ident $path:literal, $plane:ident, $rule:expr, $who:literal;
     query: $q:ty, request: $req:ty, response: $resp:ty $(, status: $status:literal)?) => {
        $(#[doc = $doc])+
        #[doc = ""]
        #[doc = concat!("`", stringify!($method), " ", $path, "`: ", $who, ".")]
        #[derive(Debug, Clone, Copy)]
        pub struct $name;

        impl $crate::Endpoint for $name {
            const METHOD: $crate::Method = $crate::Method::$method;
            const PATH: &'static str = $path;
            const SUMMARY: &'static str = $crate::first_line!($($doc)+);
            const WHO: &'static str = $who;
            const RULE: $crate::Access = $rule;
            const PLANE: $crate::Plane = $crate::Plane::$plane;
            type Query = $q;
            type Request = $req;
            type Response = $resp;
            $(const STATUS: u16 = $status;)?
        }
    };
}

/// The first line of a doc comment, without its leading space.
#[doc(hidden)]
#[macro_export]
macro_rules! first_line {
    ($first:literal $($rest:literal)*) => {
        $crate::trim_doc($first)
    };
}

/// `s` without its leading space (a doc comment's line).
#[doc(hidden)]
pub const fn trim_doc(s: &'static str) -> &'static str {
    match s.as_bytes() {
        [b' ', rest @ ..] => match std::str::from_utf8(rest) {
            Ok(t) => t,
            Err(_) => s,
        },
        _ => s,
    }
}
