//! The catalog's behaviour, run on every database the environment offers: SQLite always, PostgreSQL when
//! `STRATA_TEST_POSTGRES_URL` is set (the test command starts one and requires it).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use strata_catalog::access::{NewPrincipal, PrincipalKind, SYSTEM};
use strata_catalog::inventory::{Listed, ObjectRecord, UsageBy};
use strata_catalog::lifecycle::{Policy, PolicyKind};
use strata_catalog::quota::{QuotaLimits, QuotaStatus};
use strata_catalog::testing::catalogs;
use strata_catalog::{Catalog, ManualClock, Role};
use strata_types::ErrorKind;

const T0: i64 = 1_800_000_000;

async fn each(f: impl AsyncFn(Catalog, Arc<ManualClock>)) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    for cat in catalogs(dir.path(), clock.clone()).await {
        clock.set(T0);
        eprintln!("-- on {:?}", cat.dialect());
        f(cat.clone(), clock.clone()).await;
        cat.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn teams_principals_roles_and_audit() {
    each(async |cat, _clock| {
        cat.create_team(SYSTEM, "team-a").await.unwrap();
        cat.create_team(SYSTEM, "team-b").await.unwrap();
        assert_eq!(
            cat.create_team(SYSTEM, "team-a").await.unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        for bad in ["", "A", "-x", "a/b", "a b", &"x".repeat(64)] {
            assert_eq!(
                cat.create_team(SYSTEM, bad).await.unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
        let admin = cat
            .bootstrap_admin(None)
            .await
            .unwrap()
            .expect("first admin token");
        assert!(
            cat.bootstrap_admin(None).await.unwrap().is_none(),
            "only once"
        );
        let admin_p = cat.authenticate(&admin).await.unwrap().unwrap();
        assert!(admin_p.is_admin);

        let cred = cat
            .create_principal(
                &admin_p.id,
                &NewPrincipal {
                    name: "alice".into(),
                    kind: PrincipalKind::Token,
                    team: Some("team-a".into()),
                    role: Some(Role::Member),
                    admin: false,
                },
            )
            .await
            .unwrap();
        let token = cred.token.unwrap();
        let alice = cat.authenticate(&token).await.unwrap().unwrap();
        assert_eq!(alice.role_in("team-a"), Some(Role::Member));
        assert!(alice.can("team-a", Role::Reader));
        assert!(!alice.can("team-a", Role::TeamAdmin));
        assert!(!alice.can("team-b", Role::Reader));
        assert_eq!(
            alice.require("team-b", Role::Reader).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        assert!(cat.authenticate("stk_wrong").await.unwrap().is_none());

        let s3 = cat
            .create_principal(
                &admin_p.id,
                &NewPrincipal {
                    name: "loader".into(),
                    kind: PrincipalKind::S3Key,
                    team: Some("team-b".into()),
                    role: None,
                    admin: false,
                },
            )
            .await
            .unwrap();
        let (secret, p) = cat
            .s3_key(s3.access_key.as_deref().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(Some(secret), s3.secret_key);
        assert_eq!(p.team.as_deref(), Some("team-b"));

        cat.set_membership(&admin_p.id, "team-b", &alice.id, Role::Reader)
            .await
            .unwrap();
        let alice = cat.authenticate(&token).await.unwrap().unwrap();
        assert_eq!(alice.role_in("team-b"), Some(Role::Reader));
        cat.remove_membership(&admin_p.id, "team-b", &alice.id)
            .await
            .unwrap();
        cat.revoke_principal(&admin_p.id, &alice.id).await.unwrap();
        assert!(cat.authenticate(&token).await.unwrap().is_none(), "revoked");

        let audit = cat
            .list_audit(Some(&["team-b".to_string()]), 100)
            .await
            .unwrap();
        let actions: Vec<&str> = audit.iter().map(|a| a.action.as_str()).collect();
        assert!(actions.contains(&"member.set"), "{actions:?}");
        assert!(actions.contains(&"member.remove"));
        assert!(audit.iter().all(|a| a.team.as_deref() == Some("team-b")));
        // An environment-given admin token works and is idempotent.
        cat.bootstrap_admin(Some("0123456789abcdef-env"))
            .await
            .unwrap();
        cat.bootstrap_admin(Some("0123456789abcdef-env"))
            .await
            .unwrap();
        let env_admin = cat
            .authenticate("0123456789abcdef-env")
            .await
            .unwrap()
            .unwrap();
        assert!(env_admin.is_admin);
        // Revoked (even by itself): a restart with the same token is a clear refusal, not a constraint
        // error, and does not bring the administrator back.
        cat.revoke_principal(&env_admin.id, &env_admin.id)
            .await
            .unwrap();
        let e = cat
            .bootstrap_admin(Some("0123456789abcdef-env"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("was revoked"), "{e}");
        assert!(
            cat.authenticate("0123456789abcdef-env")
                .await
                .unwrap()
                .is_none()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_writers_never_overshoot_the_hard_limit() {
    each(async |cat, _clock| {
        cat.create_team(SYSTEM, "t").await.unwrap();
        const PART: i64 = 1 << 20;
        const HARD: i64 = 37 * PART + 12345;
        cat.set_quota(
            SYSTEM,
            "t",
            "default",
            &QuotaLimits {
                hard_bytes: Some(HARD),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let cat = cat.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0i64;
                let mut refused = 0;
                while refused < 3 {
                    match cat.reserve("t", "default", PART, 1, 600).await {
                        Ok(r) => {
                            // The write happens here; then it is committed with its real size.
                            tokio::task::yield_now().await;
                            cat.commit_reservation(&r, PART, 1).await.unwrap();
                            admitted += 1;
                        }
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
                            assert!(e.to_string().contains("hard limit"), "{e}");
                            refused += 1;
                        }
                    }
                }
                admitted
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        let q = cat.quota("t", "default").await.unwrap();
        assert_eq!(total, 37, "exactly as many parts as fit");
        assert_eq!(q.used_bytes, 37 * PART);
        assert!(q.used_bytes <= HARD);
        assert_eq!(q.reserved_bytes, 0);
        let all = cat.quota("t", "*").await.unwrap();
        assert_eq!(all.used_bytes, 37 * PART, "the team total follows");
        // Also against a team-wide hard limit on objects, across two scopes.
        cat.set_quota(
            SYSTEM,
            "t",
            "*",
            &QuotaLimits {
                hard_objects: Some(40),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let mut tasks = Vec::new();
        for i in 0..16 {
            let cat = cat.clone();
            tasks.push(tokio::spawn(async move {
                let scope = if i % 2 == 0 { "scratch" } else { "cache" };
                let mut n = 0;
                while let Ok(r) = cat.reserve("t", scope, 1, 1, 600).await {
                    cat.commit_reservation(&r, 1, 1).await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        let mut n = 0;
        for t in tasks {
            n += t.await.unwrap();
        }
        assert_eq!(n, 3, "40 objects allowed, 37 already used");
        assert_eq!(cat.quota("t", "*").await.unwrap().used_objects, 40);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_limit_grace_period_then_refusal_then_recovery() {
    each(async |cat, clock| {
        cat.create_team(SYSTEM, "t").await.unwrap();
        cat.set_quota(
            SYSTEM,
            "t",
            "default",
            &QuotaLimits {
                soft_bytes: Some(100),
                hard_bytes: Some(1000),
                grace_secs: 3600,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let r = cat.reserve("t", "default", 150, 1, 60).await.unwrap();
        cat.commit_reservation(&r, 150, 1).await.unwrap();
        let q = cat.quota("t", "default").await.unwrap();
        assert_eq!(q.status, QuotaStatus::SoftGrace);
        assert_eq!(q.soft_since, Some(T0));
        assert_eq!(q.grace_ends_at, Some(T0 + 3600));
        clock.advance(3000);
        let r = cat.reserve("t", "default", 10, 1, 60).await.unwrap();
        cat.commit_reservation(&r, 10, 1).await.unwrap();
        clock.advance(601);
        let q = cat.quota("t", "default").await.unwrap();
        assert_eq!(q.status, QuotaStatus::GraceExpired);
        let e = cat.reserve("t", "default", 10, 1, 60).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ResourceExhausted);
        assert!(e.to_string().contains("grace"), "{e}");
        // Zero-byte requests and writes that end under the soft limit... deletions bring usage back.
        cat.adjust_usage("t", "default", -100, -1).await.unwrap();
        let q = cat.quota("t", "default").await.unwrap();
        assert_eq!(q.status, QuotaStatus::Ok);
        assert_eq!(q.soft_since, None);
        cat.reserve("t", "default", 10, 1, 60).await.unwrap();
        // Invalid limits are refused.
        let bad = QuotaLimits {
            soft_bytes: Some(10),
            hard_bytes: Some(5),
            ..Default::default()
        };
        assert_eq!(
            cat.set_quota(SYSTEM, "t", "default", &bad)
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            cat.set_quota(SYSTEM, "t", "bad scope", &QuotaLimits::default())
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_reservations_are_reaped() {
    each(async |cat, clock| {
        cat.create_team(SYSTEM, "t").await.unwrap();
        cat.set_quota(
            SYSTEM,
            "t",
            "default",
            &QuotaLimits {
                hard_bytes: Some(100),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let _dead = cat.reserve("t", "default", 100, 1, 60).await.unwrap();
        assert!(cat.reserve("t", "default", 1, 0, 60).await.is_err());
        assert_eq!(cat.reap_reservations().await.unwrap(), 0);
        clock.advance(61);
        assert_eq!(cat.reap_reservations().await.unwrap(), 1);
        let q = cat.quota("t", "default").await.unwrap();
        assert_eq!((q.reserved_bytes, q.used_bytes), (0, 0));
        // A late commit of a reaped reservation still charges the bytes, once.
        cat.commit_reservation(&_dead, 100, 1).await.unwrap();
        let q = cat.quota("t", "default").await.unwrap();
        assert_eq!((q.reserved_bytes, q.used_bytes), (0, 100));
    })
    .await;
}

fn rec(
    key: &str,
    size: i64,
    team: Option<&str>,
    job: Option<&str>,
    ds: Option<&str>,
) -> ObjectRecord {
    ObjectRecord {
        backend: "default".into(),
        key: key.into(),
        size,
        etag: format!("e-{size}"),
        modified_at: T0,
        team: team.map(Into::into),
        principal: None,
        job: job.map(Into::into),
        dataset: ds.map(Into::into),
        accessed_at: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_by_team_prefix_job_dataset_and_reconciliation() {
    each(async |cat, _clock| {
        for t in ["team-a", "team-ab"] {
            cat.create_team(SYSTEM, t).await.unwrap();
        }
        cat.set_prefix_owner(SYSTEM, "default", "team-a", "team-a")
            .await
            .unwrap();
        cat.set_prefix_owner(SYSTEM, "default", "team-ab/", "team-ab")
            .await
            .unwrap();
        cat.record_write(&rec(
            "team-a/x",
            10,
            Some("team-a"),
            Some("j1"),
            Some("ds1"),
        ))
        .await
        .unwrap();
        cat.record_write(&rec(
            "team-a/y",
            20,
            Some("team-a"),
            Some("j2"),
            Some("ds1"),
        ))
        .await
        .unwrap();
        cat.record_write(&rec("team-ab/z", 40, Some("team-ab"), Some("j1"), None))
            .await
            .unwrap();
        let by_prefix = cat.usage(UsageBy::Prefix, None).await.unwrap();
        let get = |lines: &[strata_catalog::inventory::UsageLine], g: &str| {
            lines
                .iter()
                .find(|l| l.group == g)
                .map(|l| (l.bytes, l.objects))
        };
        assert_eq!(
            get(&by_prefix, "default:team-a/"),
            Some((30, 2)),
            "look-alike prefix not counted"
        );
        assert_eq!(get(&by_prefix, "default:team-ab/"), Some((40, 1)));
        let by_team = cat.usage(UsageBy::Team, None).await.unwrap();
        assert_eq!(get(&by_team, "team-a"), Some((30, 2)));
        let by_job = cat.usage(UsageBy::Job, None).await.unwrap();
        assert_eq!(
            get(&by_job, "j1").map(|x| x.0),
            Some(10),
            "grouped per team too"
        );
        let by_ds = cat
            .usage(UsageBy::Dataset, Some(&["team-a".into()]))
            .await
            .unwrap();
        assert_eq!(by_ds.len(), 1);
        assert_eq!(get(&by_ds, "ds1"), Some((30, 2)));

        // Reconciliation: y changed size, x vanished, two unknown objects appear (one in an owned prefix).
        let listing = vec![
            Listed {
                key: "team-a/y".into(),
                size: 25,
                etag: "e-25".into(),
                modified_at: T0,
            },
            Listed {
                key: "team-a/new".into(),
                size: 5,
                etag: "n".into(),
                modified_at: T0,
            },
            Listed {
                key: "team-ab/z".into(),
                size: 40,
                etag: "e-40".into(),
                modified_at: T0,
            },
            Listed {
                key: "orphan".into(),
                size: 7,
                etag: "o".into(),
                modified_at: T0,
            },
        ];
        let rep = cat.reconcile("default", &listing).await.unwrap();
        assert_eq!((rep.added, rep.updated, rep.removed), (2, 1, 1));
        assert_eq!(rep.teams.get("team-a"), Some(&(30, 2)));
        assert_eq!(rep.teams.get(""), Some(&(7, 1)), "unowned");
        let q = cat.quota("team-a", "default").await.unwrap();
        assert_eq!((q.used_bytes, q.used_objects), (30, 2));
        assert_eq!(cat.quota("team-a", "*").await.unwrap().used_bytes, 30);
        assert_eq!(
            cat.object("default", "team-a/new")
                .await
                .unwrap()
                .unwrap()
                .team
                .as_deref(),
            Some("team-a"),
            "attributed by prefix ownership"
        );
        // Usage samples are pruned by age.
        for at in [T0 - 100, T0 - 10, T0] {
            cat.add_sample(
                "team",
                "team-a",
                strata_catalog::lifecycle::UsageSample {
                    at,
                    used: 1,
                    capacity: None,
                },
            )
            .await
            .unwrap();
        }
        assert_eq!(cat.prune_samples(T0 - 50).await.unwrap(), 1);
        assert_eq!(cat.samples("team", "team-a", 0).await.unwrap().len(), 2);
        // Access times only move forward.
        cat.touch("default", &[("team-a/y".into(), T0 + 50)])
            .await
            .unwrap();
        cat.touch("default", &[("team-a/y".into(), T0 + 10)])
            .await
            .unwrap();
        assert_eq!(
            cat.object("default", "team-a/y")
                .await
                .unwrap()
                .unwrap()
                .accessed_at,
            Some(T0 + 50)
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dangerous_policies_are_rejected() {
    each(async |cat, _clock| {
        cat.create_team(SYSTEM, "t").await.unwrap();
        let base = Policy {
            id: String::new(),
            team: "t".into(),
            backend: "default".into(),
            kind: PolicyKind::Ttl,
            prefix: Some("t/tmp".into()),
            label: None,
            age_secs: Some(86400),
            keep_last: None,
            created_at: 0,
        };
        let ok = cat.add_policy(SYSTEM, base.clone()).await.unwrap();
        assert_eq!(ok.prefix.as_deref(), Some("t/tmp/"));
        let cases: Vec<Policy> = vec![
            Policy {
                prefix: Some("".into()),
                ..base.clone()
            },
            Policy {
                prefix: Some("*".into()),
                ..base.clone()
            },
            Policy {
                prefix: Some("t/*".into()),
                ..base.clone()
            },
            Policy {
                prefix: None,
                ..base.clone()
            },
            Policy {
                age_secs: Some(0),
                ..base.clone()
            },
            Policy {
                age_secs: Some(-5),
                ..base.clone()
            },
            Policy {
                age_secs: None,
                ..base.clone()
            },
            Policy {
                prefix: None,
                label: Some("dataset:*".into()),
                ..base.clone()
            },
            Policy {
                prefix: None,
                label: Some("color:red".into()),
                ..base.clone()
            },
            Policy {
                kind: PolicyKind::KeepLast,
                age_secs: None,
                keep_last: Some(0),
                ..base.clone()
            },
            Policy {
                kind: PolicyKind::KeepLast,
                age_secs: None,
                keep_last: Some(-1),
                ..base.clone()
            },
        ];
        for p in cases {
            let e = cat.add_policy(SYSTEM, p.clone()).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{p:?}: {e}");
        }
        assert_eq!(cat.list_policies(None).await.unwrap().len(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_secrets_are_sealed_with_a_key_kept_outside_the_database() {
    use strata_catalog::secrets::CatalogKey;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/c.db", dir.path().display());
    let key = CatalogKey::generate().unwrap();
    let cat = Catalog::open(&url)
        .await
        .unwrap()
        .with_key(key.clone())
        .await
        .unwrap();
    cat.create_team(SYSTEM, "team-a").await.unwrap();
    let made = cat
        .create_principal(
            SYSTEM,
            &NewPrincipal {
                name: "loader".into(),
                kind: PrincipalKind::S3Key,
                team: Some("team-a".into()),
                role: None,
                admin: false,
            },
        )
        .await
        .unwrap();
    let (access, secret) = (made.access_key.unwrap(), made.secret_key.unwrap());
    assert_eq!(cat.s3_key(&access).await.unwrap().unwrap().0, secret);
    cat.close().await;
    // The database files alone: the access key is there, the secret is not.
    let mut dump = Vec::new();
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with("c.db") {
            dump.extend(std::fs::read(f.path()).unwrap());
        }
    }
    let has = |needle: &str| dump.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(has(&access) && !has(&secret));
    // Another key is refused at once, and changes nothing; no key reads no secret.
    let e = Catalog::open(&url)
        .await
        .unwrap()
        .with_key(CatalogKey::generate().unwrap())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let bare = Catalog::open(&url).await.unwrap();
    assert_eq!(
        bare.s3_key(&access).await.unwrap_err().kind(),
        ErrorKind::Config
    );
    bare.close().await;
    let again = Catalog::open(&url)
        .await
        .unwrap()
        .with_key(CatalogKey::from_hex(&key.to_hex()).unwrap())
        .await
        .unwrap();
    assert_eq!(again.s3_key(&access).await.unwrap().unwrap().0, secret);
    // A sealed value is bound to its principal: moved to another row, it does not open.
    let sealed = key.seal("p_one", "s3cret").unwrap();
    assert_eq!(key.open("p_one", &sealed).unwrap(), "s3cret");
    assert_eq!(
        key.open("p_two", &sealed).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    assert!(!sealed.contains("s3cret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_agent_and_reconciliation_release_what_dead_writers_reserved() {
    each(async |cat, clock| {
        cat.create_team(SYSTEM, "team-a").await.unwrap();
        let limits = QuotaLimits {
            hard_bytes: Some(100),
            ..Default::default()
        };
        cat.set_quota(SYSTEM, "team-a", "default", &limits)
            .await
            .unwrap();
        // Agent 1 admits 90 bytes and dies; agent 2 holds 5. The reservations stay held (a day's TTL).
        let one = cat.clone().with_holder("agent-1");
        let two = cat.clone().with_holder("agent-2");
        one.reserve("team-a", "default", 90, 1, 86_400)
            .await
            .unwrap();
        two.reserve("team-a", "default", 5, 1, 86_400)
            .await
            .unwrap();
        let refused = cat.reserve("team-a", "default", 10, 1, 86_400).await;
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::ResourceExhausted);
        // Agent 1 starts again: it releases its own, and only its own.
        assert_eq!(
            cat.clone()
                .with_holder("agent-1")
                .release_held()
                .await
                .unwrap(),
            1
        );
        let q = cat.quota("team-a", "default").await.unwrap();
        assert_eq!(q.reserved_bytes, 5);
        // A reconciliation releases reservations older than an hour on its scope.
        assert_eq!(cat.release_stale("default", 3600).await.unwrap(), 0);
        clock.advance(3601);
        assert_eq!(cat.release_stale("default", 3600).await.unwrap(), 1);
        assert_eq!(
            cat.quota("team-a", "default").await.unwrap().reserved_bytes,
            0
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_objects_record_and_its_charge_land_together_or_not_at_all() {
    each(async |cat, _clock| {
        if cat.dialect() != strata_catalog::Dialect::Postgres {
            // The fault below is PostgreSQL's (SQLite turns an overflowing sum into a float).
            return;
        }
        cat.create_team(SYSTEM, "team-a").await.unwrap();
        // The charge is refused by the database (the counter would overflow): the record must not stay.
        cat.set_usage("team-a", "default", i64::MAX - 5, 0)
            .await
            .unwrap();
        let rec = ObjectRecord {
            backend: "default".into(),
            key: "k".into(),
            size: 100,
            etag: "e".into(),
            modified_at: T0,
            team: Some("team-a".into()),
            principal: None,
            job: None,
            dataset: None,
            accessed_at: None,
        };
        assert!(cat.commit_write(Vec::new(), &rec).await.is_err());
        assert!(cat.object("default", "k").await.unwrap().is_none());
        // And a delete whose give-back fails leaves the record (and the charge) in place.
        cat.set_usage("team-a", "default", 0, 0).await.unwrap();
        cat.commit_write(Vec::new(), &rec).await.unwrap();
        cat.set_usage("team-a", "default", i64::MIN + 5, 0)
            .await
            .unwrap();
        assert!(cat.commit_delete("default", "k").await.is_err());
        assert!(cat.object("default", "k").await.unwrap().is_some());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_members_heartbeat_expire_and_leave() {
    each(async |cat, clock| {
        cat.heartbeat_member("http://a:7070", 100).await.unwrap();
        cat.heartbeat_member("http://b:7070", 300).await.unwrap();
        let ids = |v: Vec<strata_catalog::members::MemberRecord>| {
            v.into_iter()
                .map(|m| (m.id, m.capacity))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(cat.live_members(10).await.unwrap()),
            vec![("http://a:7070".into(), 100), ("http://b:7070".into(), 300)]
        );
        // b stops beating: it is a member until its TTL runs out, not after.
        clock.advance(6);
        cat.heartbeat_member("http://a:7070", 150).await.unwrap();
        assert_eq!(cat.live_members(10).await.unwrap().len(), 2);
        clock.advance(5);
        let live = cat.live_members(10).await.unwrap();
        assert_eq!(ids(live.clone()), vec![("http://a:7070".into(), 150)]);
        assert_eq!(
            live[0].started_at, T0,
            "a heartbeat keeps the registration time"
        );
        assert_eq!(live[0].seen_at, T0 + 6);
        // b comes back, then a leaves at once.
        cat.heartbeat_member("http://b:7070", 300).await.unwrap();
        cat.leave_member("http://a:7070").await.unwrap();
        assert_eq!(
            ids(cat.live_members(10).await.unwrap()),
            vec![("http://b:7070".into(), 300)]
        );
        cat.leave_member("http://b:7070").await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_stall_reports_keep_each_reporters_largest_total_and_stop_at_release() {
    each(async |cat, _clock| {
        cat.create_team(SYSTEM, "team-s").await.unwrap();
        let rec = strata_catalog::claims::ClaimRecord {
            id: "claim_stall".into(),
            team: "team-s".into(),
            job: "j".into(),
            principal: "p".into(),
            agent: "a".into(),
            spec: "{}".into(),
            state: strata_api::claims::ClaimState::Ready,
            reason: String::new(),
            progress: "{}".into(),
            usage: "{}".into(),
            datasets: "[]".into(),
            scratch_id: None,
            created_at: T0,
            deadline_at: T0 + 60,
            ready_at: Some(T0),
            heartbeat_at: T0,
            released_at: None,
        };
        cat.insert_claim(&rec, &[]).await.unwrap();
        assert_eq!(cat.claim_stall_ms("claim_stall").await.unwrap(), 0);
        assert!(
            cat.report_claim_stall("claim_stall", "h:1:e0", 1500)
                .await
                .unwrap()
        );
        // A retry, or an older total arriving late, changes nothing.
        assert!(
            cat.report_claim_stall("claim_stall", "h:1:e0", 1500)
                .await
                .unwrap()
        );
        assert!(
            cat.report_claim_stall("claim_stall", "h:1:e0", 700)
                .await
                .unwrap()
        );
        assert!(
            cat.report_claim_stall("claim_stall", "h:2:e0", 250)
                .await
                .unwrap()
        );
        assert_eq!(cat.claim_stall_ms("claim_stall").await.unwrap(), 1750);
        assert!(
            cat.report_claim_stall("claim_stall", "h:1:e0", 2000)
                .await
                .unwrap()
        );
        assert_eq!(cat.claim_stall_ms("claim_stall").await.unwrap(), 2250);
        assert!(
            cat.release_claim("claim_stall", "done", "{}")
                .await
                .unwrap()
        );
        assert!(
            !cat.report_claim_stall("claim_stall", "h:3:e0", 9000)
                .await
                .unwrap()
        );
        assert!(
            !cat.report_claim_stall("no-such-claim", "h:1", 1)
                .await
                .unwrap()
        );
        assert_eq!(cat.claim_stall_ms("claim_stall").await.unwrap(), 2250);
    })
    .await;
}

/// Issue 44, item 5: a limit on `bucket_root` binds every bucket a team created, together (each bucket is a
/// scope of its own, and only `*` bound them all). Its usage is the sum of the buckets' through writes,
/// overwrites, deletions, releases, a bucket deleted with a write in flight, and reconciliation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_on_the_bucket_root_binds_every_bucket_the_team_created() {
    use strata_catalog::quota::BUCKET_ROOT;
    each(async |cat, _clock| {
        cat.create_team(SYSTEM, "t").await.unwrap();
        cat.create_bucket("b-one", Some("t"), "p").await.unwrap();
        cat.create_bucket("b-two", Some("t"), "p").await.unwrap();
        // Usage from before the limit counts: the parent's row starts from the buckets'.
        let r = cat.reserve("t", "b-one", 400, 1, 600).await.unwrap();
        assert_eq!(r.parent.as_deref(), Some(BUCKET_ROOT));
        cat.commit_write(vec![r], &bucket_rec("b-one", "k1", 400))
            .await
            .unwrap();
        let q = cat
            .set_quota(
                SYSTEM,
                "t",
                BUCKET_ROOT,
                &QuotaLimits {
                    hard_bytes: Some(1_000),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!((q.used_bytes, q.used_objects), (400, 1));
        // A write into the other bucket is admitted against the root's limit too.
        let r = cat.reserve("t", "b-two", 500, 1, 600).await.unwrap();
        cat.commit_write(vec![r], &bucket_rec("b-two", "k2", 500))
            .await
            .unwrap();
        let e = cat.reserve("t", "b-two", 101, 1, 600).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
        assert!(e.to_string().contains(BUCKET_ROOT), "{e}");
        // A configured backend is not under it; the total counts each byte once.
        cat.reserve("t", "default", 5_000, 1, 600).await.unwrap();
        let total = cat.quota("t", "*").await.unwrap();
        assert_eq!((total.used_bytes, total.reserved_bytes), (900, 5_000));
        // An overwrite charges the difference there, a deletion gives back, a release gives back.
        let r = cat.reserve("t", "b-one", 100, 0, 600).await.unwrap();
        cat.commit_write(vec![r], &bucket_rec("b-one", "k1", 100))
            .await
            .unwrap();
        assert_eq!(cat.quota("t", BUCKET_ROOT).await.unwrap().used_bytes, 600);
        cat.commit_delete("b-two", "k2").await.unwrap();
        let held = cat.reserve("t", "b-two", 300, 1, 600).await.unwrap();
        let q = cat.quota("t", BUCKET_ROOT).await.unwrap();
        assert_eq!((q.used_bytes, q.reserved_bytes), (100, 300));
        // The bucket goes while a write into it is in flight: its release still gives the root back.
        cat.delete_bucket("p", "b-two").await.unwrap();
        cat.release_reservation(&held).await.unwrap();
        let q = cat.quota("t", BUCKET_ROOT).await.unwrap();
        assert_eq!(
            (q.used_bytes, q.used_objects, q.reserved_bytes),
            (100, 1, 0)
        );
        // Reconciliation of a bucket recomputes the root's usage from the buckets'.
        cat.set_usage("t", "b-one", 700, 2).await.unwrap();
        let q = cat.quota("t", BUCKET_ROOT).await.unwrap();
        assert_eq!((q.used_bytes, q.used_objects), (700, 2));
        assert_eq!(cat.quota("t", "*").await.unwrap().used_bytes, 700);
        // It is a sum: nothing is reserved, freed or set on it directly.
        for e in [
            cat.reserve("t", BUCKET_ROOT, 1, 1, 600).await.unwrap_err(),
            cat.free_usage("t", BUCKET_ROOT, 1, 1).await.unwrap_err(),
            cat.set_usage("t", BUCKET_ROOT, 1, 1).await.unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        }
    })
    .await;
}

fn bucket_rec(bucket: &str, key: &str, size: i64) -> ObjectRecord {
    ObjectRecord {
        backend: bucket.into(),
        team: Some("t".into()),
        ..rec(key, size, None, None, None)
    }
}
