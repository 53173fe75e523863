//! Teams, principals and roles; the audit log.
//!
//! A principal is an API bearer token or an S3 access key. It has a *home team* (its writes are attributed
//! there) and memberships with a [`Role`] in any number of teams. A global admin may do anything; everyone else
//! sees and changes only the teams they are members of.
//!
//! Bearer tokens are stored as blake3 hashes and shown once, at creation; S3 secrets are stored sealed with the
//! catalog key ([`crate::secrets`]; SigV4 verification needs them back) and shown once too. The first start creates a global administrator
//! (`bootstrap_admin`: a given token, else a generated one). The audit log records who changed what; the
//! control plane writes a record for every change it makes.

use serde::{Deserialize, Serialize};
use sqlx::{FromRow, Row};
use strata_types::{Error, ErrorKind, Result};

use crate::{Catalog, db_err, new_id, validate_team_name};

pub use strata_api::Role;

pub use strata_api::teams::PrincipalKind;

/// An authenticated identity and what it may do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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

/// One team membership.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Membership {
    /// Team name.
    pub team: String,
    /// Role in it.
    pub role: Role,
}

impl Principal {
    /// The principal's role in `team`, if any (admins have every role everywhere).
    pub fn role_in(&self, team: &str) -> Option<Role> {
        if self.is_admin {
            return Some(Role::TeamAdmin);
        }
        self.memberships
            .iter()
            .find(|m| m.team == team)
            .map(|m| m.role)
    }

    /// Whether the principal holds at least `need` in `team`.
    pub fn can(&self, team: &str, need: Role) -> bool {
        self.role_in(team).is_some_and(|r| r >= need)
    }

    /// Err(PermissionDenied) unless [`Principal::can`]. The message never says whether the team exists.
    pub fn require(&self, team: &str, need: Role) -> Result<()> {
        if self.can(team, need) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "principal {} needs role {} in team {team:?}",
                    self.id,
                    need.as_str()
                ),
            ))
        }
    }

    /// Err(PermissionDenied) unless a global admin.
    pub fn require_admin(&self) -> Result<()> {
        if self.is_admin {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("principal {} is not an administrator", self.id),
            ))
        }
    }

    /// The teams this principal may read (None = all, for admins).
    pub fn visible_teams(&self) -> Option<Vec<String>> {
        if self.is_admin {
            None
        } else {
            Some(self.memberships.iter().map(|m| m.team.clone()).collect())
        }
    }
}

/// A team.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, sqlx::FromRow)]
pub struct Team {
    /// Unique name.
    pub name: String,
    /// Creation time.
    pub created_at: i64,
}

/// One audit record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, sqlx::FromRow)]
pub struct AuditRecord {
    /// Record id.
    pub id: String,
    /// When.
    pub at: i64,
    /// Who (principal id, or `system`).
    pub principal: String,
    /// Which team it concerns, if any.
    pub team: Option<String>,
    /// What (`team.create`, `quota.set`, `cleanup.trash`, ...).
    pub action: String,
    /// On what.
    pub target: String,
    /// Details (JSON text).
    pub detail: String,
}

/// What to create in [`Catalog::create_principal`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewPrincipal {
    /// Human name.
    pub name: String,
    /// Token or S3 key.
    pub kind: PrincipalKind,
    /// Home team (required unless `admin`).
    pub team: Option<String>,
    /// Role in the home team.
    pub role: Option<Role>,
    /// Global administrator (only an admin may create one).
    #[serde(default)]
    pub admin: bool,
}

/// The secret half of a new credential: shown once, never stored in clear (tokens) or never shown again.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

fn token_hash(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

fn random_string(n: usize, alphabet: &[u8]) -> String {
    (0..n)
        .map(|_| alphabet[rand::random_range(0..alphabet.len())] as char)
        .collect()
}

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// The principal id used in the audit log for actions of the agent itself (reconciliation, expiry).
pub const SYSTEM: &str = "system";

impl Catalog {
    /// Write one audit record. Every change in the catalog calls this.
    pub async fn audit(
        &self,
        principal: &str,
        team: Option<&str>,
        action: &str,
        target: &str,
        detail: serde_json::Value,
    ) -> Result<()> {
        let now = self.now();
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        sqlx::query(
            "INSERT INTO audit (id, at, seq, principal, team, action, target, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(new_id("a_"))
        .bind(now)
        .bind(seq)
        .bind(principal)
        .bind(team)
        .bind(action)
        .bind(target)
        .bind(detail.to_string())
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        Ok(())
    }

    /// Audit records, newest first; `teams` None = all.
    pub async fn list_audit(
        &self,
        teams: Option<&[String]>,
        limit: i64,
    ) -> Result<Vec<AuditRecord>> {
        let limit = limit.max(0);
        let Some(teams) = teams else {
            let rows = sqlx::query(
                "SELECT id, at, principal, team, action, target, detail FROM audit \
                 ORDER BY at DESC, seq DESC LIMIT $1",
            )
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?;
            return rows
                .iter()
                .map(|r| AuditRecord::from_row(r).map_err(db_err))
                .collect();
        };
        // One indexed query per team (audit_team_at), merged newest first.
        let mut out = Vec::new();
        for team in teams {
            let rows = sqlx::query(
                "SELECT id, at, principal, team, action, target, detail FROM audit \
                 WHERE team = $1 ORDER BY at DESC, seq DESC LIMIT $2",
            )
            .bind(team)
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?;
            for r in &rows {
                out.push(AuditRecord::from_row(r).map_err(db_err)?);
            }
        }
        out.sort_by_key(|a| std::cmp::Reverse(a.at));
        out.truncate(limit as usize);
        Ok(out)
    }

    /// Create a team.
    pub async fn create_team(&self, actor: &str, name: &str) -> Result<Team> {
        validate_team_name(name)?;
        let now = self.now();
        sqlx::query("INSERT INTO teams (name, created_at) VALUES ($1, $2)")
            .bind(name)
            .bind(now)
            .execute(self.pool())
            .await
            .map_err(|e| db_err(e).context(format!("creating team {name:?}")))?;
        self.audit(
            actor,
            Some(name),
            "team.create",
            name,
            serde_json::json!({}),
        )
        .await?;
        Ok(Team {
            name: name.to_string(),
            created_at: now,
        })
    }

    /// One team, or NotFound.
    pub async fn team(&self, name: &str) -> Result<Team> {
        let row = sqlx::query("SELECT name, created_at FROM teams WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(db_err)?
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no team {name:?}")))?;
        Team::from_row(&row).map_err(db_err)
    }

    /// All teams, by name.
    pub async fn list_teams(&self) -> Result<Vec<Team>> {
        let rows = sqlx::query("SELECT name, created_at FROM teams ORDER BY name")
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|r| Team::from_row(r).map_err(db_err))
            .collect()
    }

    /// Delete a team that owns nothing (no objects, no usage, no prefixes).
    pub async fn delete_team(&self, actor: &str, name: &str) -> Result<()> {
        self.team(name).await?;
        let objects: i64 =
            sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM objects WHERE team = $1")
                .bind(name)
                .fetch_one(self.pool())
                .await
                .map_err(db_err)?;
        let prefixes: i64 =
            sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM prefixes WHERE team = $1")
                .bind(name)
                .fetch_one(self.pool())
                .await
                .map_err(db_err)?;
        if objects > 0 || prefixes > 0 {
            return Err(Error::new(
                ErrorKind::PreconditionFailed,
                format!(
                    "team {name:?} still owns {objects} objects and {prefixes} prefixes; move or delete them first"
                ),
            ));
        }
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        for sql in [
            "DELETE FROM memberships WHERE team = $1",
            "DELETE FROM quotas WHERE team = $1",
            "DELETE FROM policies WHERE team = $1",
            "DELETE FROM teams WHERE name = $1",
        ] {
            sqlx::query(sql)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        self.audit(
            actor,
            Some(name),
            "team.delete",
            name,
            serde_json::json!({}),
        )
        .await
    }

    /// Create a principal with a fresh credential. Only [`Credential`] ever carries the secret.
    pub async fn create_principal(&self, actor: &str, new: &NewPrincipal) -> Result<Credential> {
        if new.name.trim().is_empty() || new.name.len() > 200 {
            return Err(Error::invalid_input(
                "principal name must be 1 to 200 characters",
            ));
        }
        if !new.admin && new.team.is_none() {
            return Err(Error::invalid_input(
                "a principal that is not an admin needs a team",
            ));
        }
        if let Some(t) = &new.team {
            self.team(t).await?;
        }
        let id = new_id("p_");
        let now = self.now();
        let (token, access_key, secret_key) = match new.kind {
            PrincipalKind::Token => (
                Some(format!("stk_{}", random_string(40, ALNUM))),
                None,
                None,
            ),
            PrincipalKind::S3Key => (
                None,
                Some(format!(
                    "SK{}",
                    random_string(18, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
                )),
                Some(random_string(40, ALNUM)),
            ),
        };
        self.insert_principal(
            &id,
            new,
            token.as_deref(),
            access_key.as_deref(),
            secret_key.as_deref(),
            now,
        )
        .await?;
        self.audit(
            actor,
            new.team.as_deref(),
            "principal.create",
            &id,
            serde_json::json!({"name": new.name, "kind": new.kind.as_str(), "admin": new.admin,
                               "role": new.role.map(Role::as_str)}),
        )
        .await?;
        Ok(Credential {
            principal: self.principal(&id).await?,
            token,
            access_key,
            secret_key,
        })
    }

    async fn insert_principal(
        &self,
        id: &str,
        new: &NewPrincipal,
        token: Option<&str>,
        access_key: Option<&str>,
        secret_key: Option<&str>,
        now: i64,
    ) -> Result<()> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        sqlx::query(
            "INSERT INTO principals (id, name, kind, token_hash, access_key, secret_key, is_admin, team, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(id)
        .bind(&new.name)
        .bind(new.kind.as_str())
        .bind(token.map(token_hash))
        .bind(access_key)
        .bind(secret_key.map(|s| self.key()?.seal(id, s)).transpose()?)
        .bind(i64::from(new.admin))
        .bind(new.team.as_deref())
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        if let Some(team) = &new.team {
            sqlx::query("INSERT INTO memberships (principal_id, team, role) VALUES ($1, $2, $3)")
                .bind(id)
                .bind(team)
                .bind(new.role.unwrap_or(Role::Member).as_str())
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        Ok(())
    }

    /// Make sure an administrator exists. With `token` given (from the environment), that token is the
    /// administrator's (created if missing); without, a token is generated only when no administrator exists
    /// yet and returned so the caller can store it. Returns the new token, if one was generated.
    pub async fn bootstrap_admin(&self, token: Option<&str>) -> Result<Option<String>> {
        if let Some(t) = token {
            if t.len() < 16 {
                return Err(Error::config(
                    "the administrator token must be at least 16 characters",
                ));
            }
            if self.authenticate(t).await?.is_some() {
                return Ok(None);
            }
            // Revoked: restarting with the same token must not bring the administrator back.
            let revoked: Option<String> = sqlx::query_scalar(
                "SELECT id FROM principals WHERE token_hash = $1 AND revoked_at IS NOT NULL",
            )
            .bind(token_hash(t))
            .fetch_optional(self.pool())
            .await
            .map_err(db_err)?;
            if let Some(id) = revoked {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "the administrator token in STRATA_ADMIN_TOKEN was revoked (principal {id}); set a new \
                         STRATA_ADMIN_TOKEN, or unset it and use another administrator's token"
                    ),
                ));
            }
            let new = NewPrincipal {
                name: "admin (from environment)".into(),
                kind: PrincipalKind::Token,
                team: None,
                role: None,
                admin: true,
            };
            let id = new_id("p_");
            match self
                .insert_principal(&id, &new, Some(t), None, None, self.now())
                .await
            {
                Ok(_) => {}
                // Agents of a cluster start together on a fresh catalog: another one registered the same
                // token between our check and our insert.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    if self.authenticate(t).await?.is_some() {
                        return Ok(None);
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            self.audit(
                crate::access::SYSTEM,
                None,
                "principal.bootstrap",
                &id,
                serde_json::json!({}),
            )
            .await?;
            return Ok(None);
        }
        let admins: i64 = sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM principals WHERE is_admin = 1 AND revoked_at IS NULL",
        )
        .fetch_one(self.pool())
        .await
        .map_err(db_err)?;
        if admins > 0 {
            return Ok(None);
        }
        let cred = self
            .create_principal(
                SYSTEM,
                &NewPrincipal {
                    name: "admin".into(),
                    kind: PrincipalKind::Token,
                    team: None,
                    role: None,
                    admin: true,
                },
            )
            .await?;
        Ok(cred.token)
    }

    /// The principal holding `token`, if the token is valid and not revoked.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Principal>> {
        let id: Option<String> = sqlx::query_scalar(
            "SELECT id FROM principals WHERE token_hash = $1 AND revoked_at IS NULL",
        )
        .bind(token_hash(token))
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        match id {
            Some(id) => Ok(Some(self.principal(&id).await?)),
            None => Ok(None),
        }
    }

    /// The secret and principal of an S3 access key, if valid and not revoked.
    pub async fn s3_key(&self, access_key: &str) -> Result<Option<(String, Principal)>> {
        let row = sqlx::query(
            "SELECT id, secret_key FROM principals WHERE access_key = $1 AND revoked_at IS NULL",
        )
        .bind(access_key)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        match row {
            Some(r) => {
                let id: String = r.try_get("id").map_err(db_err)?;
                let secret: Option<String> = r.try_get("secret_key").map_err(db_err)?;
                match secret {
                    Some(s) => {
                        let s = if crate::secrets::is_sealed(&s) {
                            self.key()?.open(&id, &s)?
                        } else {
                            s
                        };
                        Ok(Some((s, self.principal(&id).await?)))
                    }
                    None => Ok(None),
                }
            }
            None => Ok(None),
        }
    }

    /// One principal with its memberships, or NotFound.
    pub async fn principal(&self, id: &str) -> Result<Principal> {
        let r = sqlx::query(
            "SELECT id, name, kind, access_key, is_admin, team, created_at, revoked_at \
             FROM principals WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no principal {id:?}")))?;
        let memberships =
            sqlx::query("SELECT team, role FROM memberships WHERE principal_id = $1 ORDER BY team")
                .bind(id)
                .fetch_all(self.pool())
                .await
                .map_err(db_err)?
                .into_iter()
                .map(|m| {
                    let role: String = m.try_get("role").map_err(db_err)?;
                    Ok(Membership {
                        team: m.try_get("team").map_err(db_err)?,
                        role: Role::parse(&role)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
        let kind: String = r.try_get("kind").map_err(db_err)?;
        let is_admin: i64 = r.try_get("is_admin").map_err(db_err)?;
        Ok(Principal {
            id: r.try_get("id").map_err(db_err)?,
            name: r.try_get("name").map_err(db_err)?,
            kind: PrincipalKind::parse(&kind),
            is_admin: is_admin != 0,
            team: r.try_get("team").map_err(db_err)?,
            access_key: r.try_get("access_key").map_err(db_err)?,
            memberships,
            created_at: r.try_get("created_at").map_err(db_err)?,
            revoked_at: r.try_get("revoked_at").map_err(db_err)?,
        })
    }

    /// Principals that are members of `team` (or all, for None), without secrets.
    pub async fn list_principals(&self, team: Option<&str>) -> Result<Vec<Principal>> {
        let ids: Vec<String> = match team {
            Some(t) => sqlx::query_scalar(
                "SELECT principal_id FROM memberships WHERE team = $1 ORDER BY principal_id",
            )
            .bind(t)
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?,
            None => sqlx::query_scalar("SELECT id FROM principals ORDER BY id")
                .fetch_all(self.pool())
                .await
                .map_err(db_err)?,
        };
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(self.principal(&id).await?);
        }
        Ok(out)
    }

    /// Revoke a principal's credential (it stays in the audit log).
    pub async fn revoke_principal(&self, actor: &str, id: &str) -> Result<()> {
        let p = self.principal(id).await?;
        sqlx::query("UPDATE principals SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(self.now())
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        self.audit(
            actor,
            p.team.as_deref(),
            "principal.revoke",
            id,
            serde_json::json!({}),
        )
        .await
    }

    /// Add `principal` to `team` with `role` (or change its role).
    pub async fn set_membership(
        &self,
        actor: &str,
        team: &str,
        principal: &str,
        role: Role,
    ) -> Result<()> {
        self.team(team).await?;
        self.principal(principal).await?;
        sqlx::query(
            "INSERT INTO memberships (principal_id, team, role) VALUES ($1, $2, $3) \
             ON CONFLICT (principal_id, team) DO UPDATE SET role = excluded.role",
        )
        .bind(principal)
        .bind(team)
        .bind(role.as_str())
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        self.audit(
            actor,
            Some(team),
            "member.set",
            principal,
            serde_json::json!({"role": role.as_str()}),
        )
        .await
    }

    /// Remove `principal` from `team`.
    pub async fn remove_membership(&self, actor: &str, team: &str, principal: &str) -> Result<()> {
        let n = sqlx::query("DELETE FROM memberships WHERE principal_id = $1 AND team = $2")
            .bind(principal)
            .bind(team)
            .execute(self.pool())
            .await
            .map_err(db_err)?
            .rows_affected();
        if n == 0 {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("principal {principal:?} is not a member of team {team:?}"),
            ));
        }
        self.audit(
            actor,
            Some(team),
            "member.remove",
            principal,
            serde_json::json!({}),
        )
        .await
    }
}
