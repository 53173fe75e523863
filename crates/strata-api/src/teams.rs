//! Teams, their members, and principals (bearer tokens and S3 keys).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Empty, Json, NoQuery, Role, endpoint, endpoint_list};

/// The kind of credential behind a principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    /// A bearer token for the agent's API.
    Token,
    /// An S3 access key pair for the gateway.
    S3Key,
}

impl PrincipalKind {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Token => "token",
            PrincipalKind::S3Key => "s3_key",
        }
    }

    /// The kind a stored name stands for (anything but `s3_key` is a token).
    pub fn parse(s: &str) -> Self {
        if s == "s3_key" {
            PrincipalKind::S3Key
        } else {
            PrincipalKind::Token
        }
    }
}

/// One team membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Membership {
    /// Team name.
    pub team: String,
    /// Role in it.
    pub role: Role,
}

/// An authenticated identity and what it may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Principal {
    /// Stable id (`p_...`).
    pub id: String,
    /// Human name (who or what holds the credential).
    pub name: String,
    /// Token or S3 key.
    pub kind: PrincipalKind,
    /// Global administrator.
    pub is_admin: bool,
    /// Home team: writes are attributed to it.
    pub team: Option<String>,
    /// S3 access key id, for S3 principals.
    pub access_key: Option<String>,
    /// Team memberships.
    pub memberships: Vec<Membership>,
    /// Creation time (unix seconds).
    pub created_at: i64,
    /// Revocation time, if revoked.
    pub revoked_at: Option<i64>,
}

/// A team.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Team {
    /// Unique name.
    pub name: String,
    /// Creation time (unix seconds).
    pub created_at: i64,
}

/// Body of `POST /v1/teams`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTeam {
    /// The team's name (lower-case letters, digits, `-` and `_`).
    pub name: String,
}

/// Body of `PUT /v1/teams/{team}/members/{principal}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRole {
    /// The principal's role in the team.
    pub role: Role,
}

/// A membership as set.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MemberSet {
    /// The team.
    pub team: String,
    /// The principal's id.
    pub principal: String,
    /// Its role there now.
    pub role: Role,
}

/// Query of `GET /v1/tokens`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokensQuery {
    /// Only this team's principals (else those of every team the caller administers).
    pub team: Option<String>,
}

/// Body of `POST /v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// Human name.
    pub name: String,
    /// Token or S3 key.
    pub kind: PrincipalKind,
    /// Home team (required unless `admin`).
    pub team: Option<String>,
    /// Role in the home team (default member).
    pub role: Option<Role>,
    /// Global administrator (only an administrator may create one).
    #[serde(default)]
    pub admin: bool,
}

/// The secret half of a new credential: shown once, never stored in clear (tokens) or never shown again.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Credential {
    /// The new principal.
    pub principal: Principal,
    /// Bearer token (for tokens).
    pub token: Option<String>,
    /// S3 access key id (for S3 keys).
    pub access_key: Option<String>,
    /// S3 secret key (for S3 keys).
    pub secret_key: Option<String>,
}

/// What a `DELETE` of a named thing removed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Deleted {
    /// The name or id deleted.
    pub deleted: String,
}

/// The member removed from a team.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Removed {
    /// The principal's id.
    pub removed: String,
}

/// The principal whose credential was revoked.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Revoked {
    /// The principal's id.
    pub revoked: String,
}

endpoint! {
    /// The calling principal and its memberships
    WhoAmI = GET "/v1/whoami", Control, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Principal>
}
endpoint! {
    /// Teams the caller can see
    ListTeams = GET "/v1/teams", Control, Access::Any, "any principal (admins see all)";
    query: NoQuery, request: Empty, response: Json<Vec<Team>>
}
endpoint! {
    /// Create a team
    CreateTeam = POST "/v1/teams", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<NewTeam>, response: Json<Team>
}
endpoint! {
    /// One team
    GetTeam = GET "/v1/teams/{team}", Control, Access::Team(Role::Reader), "reader of the team";
    query: NoQuery, request: Empty, response: Json<Team>
}
endpoint! {
    /// Delete a team that owns nothing
    DeleteTeam = DELETE "/v1/teams/{team}", Control, Access::Admin, "admin";
    query: NoQuery, request: Empty, response: Json<Deleted>
}
endpoint! {
    /// Members of a team
    ListMembers = GET "/v1/teams/{team}/members", Control, Access::Team(Role::Reader), "reader of the team";
    query: NoQuery, request: Empty, response: Json<Vec<Principal>>
}
endpoint! {
    /// Add a member or change its role
    SetMember = PUT "/v1/teams/{team}/members/{principal}", Control, Access::Team(Role::TeamAdmin),
        "team_admin of the team";
    query: NoQuery, request: Json<SetRole>, response: Json<MemberSet>
}
endpoint! {
    /// Remove a member
    RemoveMember = DELETE "/v1/teams/{team}/members/{principal}", Control, Access::Team(Role::TeamAdmin),
        "team_admin of the team";
    query: NoQuery, request: Empty, response: Json<Removed>
}
endpoint! {
    /// Principals (tokens and S3 keys) of a team
    ListTokens = GET "/v1/tokens", Control, Access::Team(Role::TeamAdmin), "team_admin of the team (admins: all)";
    query: TokensQuery, request: Empty, response: Json<Vec<Principal>>
}
endpoint! {
    /// Create a bearer token or an S3 key pair; the secret is returned once
    CreateToken = POST "/v1/tokens", Control, Access::Team(Role::TeamAdmin),
        "team_admin of the team (admin for admin principals)";
    query: NoQuery, request: Json<NewToken>, response: Json<Credential>
}
endpoint! {
    /// Revoke a principal's credential
    RevokeToken = DELETE "/v1/tokens/{id}", Control, Access::Owner(Role::TeamAdmin),
        "team_admin of its team, or itself";
    query: NoQuery, request: Empty, response: Json<Revoked>
}

endpoint_list!(
    WhoAmI,
    ListTeams,
    CreateTeam,
    GetTeam,
    DeleteTeam,
    ListMembers,
    SetMember,
    RemoveMember,
    ListTokens,
    CreateToken,
    RevokeToken,
);
