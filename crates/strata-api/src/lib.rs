//! The contract of the Strata agent's API.
//!
//! Every route is a unit type implementing [`Endpoint`]: method, path, who may call it ([`Access`]), and the
//! types of its query, body and answer. Every type that crosses the wire is here, with serde and JSON Schema
//! derives, and so is every state enum a client reads ([`Role`], [`ClaimState`], [`HandoffState`], ...).
//! From these the server builds its route table (a handler is registered *for* an endpoint type), the client
//! sends typed calls (`strata_client::AgentClient::call`), and [`openapi::document`] writes `/openapi.json`
//! and `docs/api.md`. Nothing here knows a handler, a database row or a cache block: the server maps its
//! records to these types, so a schema change in the catalog is never an API change by accident.
//!
//! One module per resource; [`endpoints`] lists every route once.

mod contract;
pub mod openapi;

pub mod admin;
pub mod analytics;
pub mod cache;
pub mod ckpt;
pub mod claims;
pub mod cluster;
pub mod data;
pub mod lifecycle;
pub mod quotas;
pub mod teams;
pub mod usage;

pub use contract::{
    Access, Binary, Empty, Endpoint, EndpointDoc, Json, Media, Method, Ndjson, NoQuery, Payload,
    Plane, Text, trim_doc,
};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_types::{Error, ErrorKind, Result};

/// The JSON body of every failed request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// The kind's stable name (`not_found`, `resource_exhausted`, ...).
    pub error: String,
    /// What went wrong, for a person.
    pub message: String,
    /// Whether the same request may succeed if sent again.
    pub retryable: bool,
}

impl ErrorBody {
    /// The body for `e`.
    pub fn of(e: &Error) -> Self {
        Self {
            error: e.kind().as_str().to_string(),
            message: e.message().to_string(),
            retryable: e.is_retryable(),
        }
    }
}

/// A principal's role in one team. Ordered: each role can do what the ones before it can.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read the team's usage, quotas, policies, plans, forecasts and audit log.
    Reader,
    /// Also write data attributed to the team, pin and claim data, allocate scratch, plan clean-ups.
    Member,
    /// Also manage members, tokens and policies of the team, run and restore clean-ups.
    TeamAdmin,
}

impl Role {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Member => "member",
            Role::TeamAdmin => "team_admin",
        }
    }

    /// Parse a role name.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "reader" => Ok(Role::Reader),
            "member" => Ok(Role::Member),
            "team_admin" | "team-admin" => Ok(Role::TeamAdmin),
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                format!("role {s:?}: expected reader, member or team_admin"),
            )),
        }
    }
}

/// Every route of the API, once.
pub fn endpoints() -> Vec<EndpointDoc> {
    let mut all = Vec::new();
    for module in [
        data::endpoints,
        ckpt::endpoints,
        cluster::endpoints,
        teams::endpoints,
        quotas::endpoints,
        usage::endpoints,
        lifecycle::endpoints,
        admin::endpoints,
        claims::endpoints,
        analytics::endpoints,
    ] {
        all.extend(module());
    }
    all
}

/// `endpoints!` of a module: the list of its endpoint types.
#[macro_export]
#[doc(hidden)]
macro_rules! endpoint_list {
    ($($e:ty),* $(,)?) => {
        /// Every endpoint of this module.
        pub fn endpoints() -> Vec<$crate::EndpointDoc> {
            vec![$($crate::EndpointDoc::of::<$e>()),*]
        }
    };
}

#[cfg(test)]
mod tests;
