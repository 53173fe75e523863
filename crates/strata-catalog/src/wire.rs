//! The catalog's records as the API shows them ([`strata_api`]): every record that leaves the agent is
//! mapped here, field by field, so a column added to a table is never an API change by accident, and the
//! API's request types are mapped back to the records the catalog stores.

use strata_api as api;

use crate::access::{AuditRecord, Credential, Membership, NewPrincipal, Principal, Team};
use crate::inventory::{OwnedPrefix, UsageLine};
use crate::lifecycle::{Plan, PlanItem, Policy, Protection, Scratch};
use crate::quota::{QuotaLimits, QuotaState, Reservation};

impl From<Membership> for api::teams::Membership {
    fn from(m: Membership) -> Self {
        Self {
            team: m.team,
            role: m.role,
        }
    }
}

impl From<Principal> for api::teams::Principal {
    fn from(p: Principal) -> Self {
        Self {
            id: p.id,
            name: p.name,
            kind: p.kind,
            is_admin: p.is_admin,
            team: p.team,
            access_key: p.access_key,
            memberships: p.memberships.into_iter().map(Into::into).collect(),
            created_at: p.created_at,
            revoked_at: p.revoked_at,
        }
    }
}

impl From<Team> for api::teams::Team {
    fn from(t: Team) -> Self {
        Self {
            name: t.name,
            created_at: t.created_at,
        }
    }
}

impl From<Credential> for api::teams::Credential {
    fn from(c: Credential) -> Self {
        Self {
            principal: c.principal.into(),
            token: c.token,
            access_key: c.access_key,
            secret_key: c.secret_key,
        }
    }
}

impl From<api::teams::NewToken> for NewPrincipal {
    fn from(t: api::teams::NewToken) -> Self {
        Self {
            name: t.name,
            kind: t.kind,
            team: t.team,
            role: t.role,
            admin: t.admin,
        }
    }
}

impl From<AuditRecord> for api::admin::AuditRecord {
    fn from(r: AuditRecord) -> Self {
        Self {
            id: r.id,
            at: r.at,
            principal: r.principal,
            team: r.team,
            action: r.action,
            target: r.target,
            detail: r.detail,
        }
    }
}

impl From<QuotaLimits> for api::quotas::QuotaLimits {
    fn from(l: QuotaLimits) -> Self {
        Self {
            soft_bytes: l.soft_bytes,
            hard_bytes: l.hard_bytes,
            soft_objects: l.soft_objects,
            hard_objects: l.hard_objects,
            grace_secs: l.grace_secs,
        }
    }
}

impl From<api::quotas::QuotaLimits> for QuotaLimits {
    fn from(l: api::quotas::QuotaLimits) -> Self {
        Self {
            soft_bytes: l.soft_bytes,
            hard_bytes: l.hard_bytes,
            soft_objects: l.soft_objects,
            hard_objects: l.hard_objects,
            grace_secs: l.grace_secs,
        }
    }
}

impl From<QuotaState> for api::quotas::QuotaState {
    fn from(q: QuotaState) -> Self {
        Self {
            team: q.team,
            scope: q.scope,
            limits: q.limits.into(),
            used_bytes: q.used_bytes,
            used_objects: q.used_objects,
            reserved_bytes: q.reserved_bytes,
            reserved_objects: q.reserved_objects,
            soft_since: q.soft_since,
            status: q.status,
            grace_ends_at: q.grace_ends_at,
        }
    }
}

impl From<Reservation> for api::quotas::Reservation {
    fn from(r: Reservation) -> Self {
        Self {
            id: r.id,
            team: r.team,
            scope: r.scope,
            parent: r.parent,
            bytes: r.bytes,
            objects: r.objects,
        }
    }
}

impl From<UsageLine> for api::usage::UsageLine {
    fn from(l: UsageLine) -> Self {
        Self {
            group: l.group,
            team: l.team,
            bytes: l.bytes,
            objects: l.objects,
        }
    }
}

impl From<OwnedPrefix> for api::usage::OwnedPrefix {
    fn from(p: OwnedPrefix) -> Self {
        Self {
            backend: p.backend,
            prefix: p.prefix,
            team: p.team,
        }
    }
}

impl From<Policy> for api::lifecycle::Policy {
    fn from(p: Policy) -> Self {
        Self {
            id: p.id,
            team: p.team,
            backend: p.backend,
            kind: p.kind,
            prefix: p.prefix,
            label: p.label,
            age_secs: p.age_secs,
            keep_last: p.keep_last,
            created_at: p.created_at,
        }
    }
}

impl From<api::lifecycle::Policy> for Policy {
    fn from(p: api::lifecycle::Policy) -> Self {
        Self {
            id: p.id,
            team: p.team,
            backend: p.backend,
            kind: p.kind,
            prefix: p.prefix,
            label: p.label,
            age_secs: p.age_secs,
            keep_last: p.keep_last,
            created_at: p.created_at,
        }
    }
}

impl From<Protection> for api::lifecycle::Protection {
    fn from(p: Protection) -> Self {
        Self {
            id: p.id,
            kind: if p.kind == "claim" {
                api::lifecycle::ProtectionKind::Claim
            } else {
                api::lifecycle::ProtectionKind::Pin
            },
            team: p.team,
            backend: p.backend,
            prefix: p.prefix,
            job: p.job,
            expires_at: p.expires_at,
            created_at: p.created_at,
        }
    }
}

impl From<api::lifecycle::Protection> for Protection {
    fn from(p: api::lifecycle::Protection) -> Self {
        Self {
            id: p.id,
            kind: match p.kind {
                api::lifecycle::ProtectionKind::Pin => "pin",
                api::lifecycle::ProtectionKind::Claim => "claim",
            }
            .into(),
            team: p.team,
            backend: p.backend,
            prefix: p.prefix,
            job: p.job,
            expires_at: p.expires_at,
            created_at: p.created_at,
        }
    }
}

impl From<Plan> for api::lifecycle::Plan {
    fn from(p: Plan) -> Self {
        Self {
            id: p.id,
            team: p.team,
            created_at: p.created_at,
            created_by: p.created_by,
            status: p.status,
            detail: p.detail,
        }
    }
}

impl From<PlanItem> for api::lifecycle::PlanItem {
    fn from(i: PlanItem) -> Self {
        Self {
            plan_id: i.plan_id,
            backend: i.backend,
            key: i.key,
            size: i.size,
            etag: i.etag,
            modified_at: i.modified_at,
            team: i.team,
            policy_id: i.policy_id,
            state: i.state,
            reason: i.reason,
            trash_key: i.trash_key,
            trashed_at: i.trashed_at,
        }
    }
}

impl From<Scratch> for api::admin::Scratch {
    fn from(s: Scratch) -> Self {
        Self {
            id: s.id,
            team: s.team,
            bytes: s.bytes,
            path: s.path,
            expires_at: s.expires_at,
            created_at: s.created_at,
            released_at: s.released_at,
        }
    }
}

/// `records`, each mapped to its API type.
pub fn all<R, A: From<R>>(records: impl IntoIterator<Item = R>) -> Vec<A> {
    records.into_iter().map(A::from).collect()
}
