//! Clean-up safety, on both catalogs: protected data (pins, claims, latest checkpoints), look-alike prefixes,
//! changes and reads after planning, caps, a crash mid-run then a rerun, restore and purge, and a listing
//! error while planning.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use strata_catalog::lifecycle::{ItemState, PlanStatus};

use strata_catalog::access::SYSTEM;
use strata_catalog::lifecycle::{Policy, PolicyKind, Protection};
use strata_catalog::testing::catalogs;
use strata_catalog::{Catalog, Clock, ManualClock};
use strata_object::{Backend, BackendOptions, RetryPolicy};
use strata_quota::cleanup::{self, Caps};
use strata_quota::reconcile;
use strata_telemetry::Telemetry;
use strata_types::ErrorKind;

const DAY: i64 = 86_400;

fn write(root: &Path, key: &str, body: &str) {
    let p = root.join(key);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
}

fn real_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

const STEP: fn(u32) -> String = |n| format!("team-a/ckpt/run1/step-{n:020}");

/// Lay out the scenario; returns the keys the policies may delete.
fn layout(root: &Path) -> BTreeSet<String> {
    for k in ["team-a/tmp/old1", "team-a/tmp/old2", "team-a/tmp/sub/old3"] {
        write(root, k, &format!("data of {k}"));
    }
    write(root, "team-a/tmp/pinned", "pinned");
    write(root, "team-a/tmp/claimed", "claimed");
    write(root, "team-ab/tmp/lookalike", "other team");
    write(root, "unowned/tmp/x", "nobody's");
    for n in 1..=3 {
        write(root, &format!("{}/rank-00000.safetensors", STEP(n)), "w");
        write(root, &format!("{}/manifest.json", STEP(n)), "{}");
    }
    write(
        root,
        &format!("{}/rank-00000.safetensors", STEP(4)),
        "in progress",
    );
    let mut expect: BTreeSet<String> =
        ["team-a/tmp/old1", "team-a/tmp/old2", "team-a/tmp/sub/old3"]
            .into_iter()
            .map(String::from)
            .collect();
    for n in 1..=2 {
        expect.insert(format!("{}/rank-00000.safetensors", STEP(n)));
        expect.insert(format!("{}/manifest.json", STEP(n)));
    }
    expect
}

async fn setup(cat: &Catalog, root: &Path) -> BTreeMap<String, Backend> {
    let backend = Backend::open(
        &format!("file://{}", root.display()),
        &BackendOptions::default(),
        RetryPolicy::default(),
        Telemetry::new(),
    )
    .unwrap();
    for t in ["team-a", "team-ab"] {
        cat.create_team(SYSTEM, t).await.unwrap();
        cat.set_prefix_owner(SYSTEM, "default", t, t).await.unwrap();
    }
    let pol = |kind, prefix: &str, age: Option<i64>, keep: Option<i64>| Policy {
        id: String::new(),
        team: "team-a".into(),
        backend: "default".into(),
        kind,
        prefix: Some(prefix.into()),
        label: None,
        age_secs: age,
        keep_last: keep,
        created_at: 0,
    };
    // A TTL on the whole team prefix: it would take everything old, protected data included, and must not
    // reach team-ab/ (look-alike) nor unowned data.
    cat.add_policy(SYSTEM, pol(PolicyKind::Ttl, "team-a", Some(DAY), None))
        .await
        .unwrap();
    cat.add_policy(
        SYSTEM,
        pol(PolicyKind::KeepLast, "team-a/ckpt", None, Some(1)),
    )
    .await
    .unwrap();
    let prot = |kind: &str, prefix: &str, expires: Option<i64>| Protection {
        id: String::new(),
        kind: kind.into(),
        team: "team-a".into(),
        backend: "default".into(),
        prefix: prefix.into(),
        job: Some("job-7".into()),
        expires_at: expires,
        created_at: 0,
    };
    cat.add_protection(SYSTEM, prot("pin", "team-a/tmp/pinned", None))
        .await
        .unwrap();
    cat.add_protection(
        SYSTEM,
        prot("claim", "team-a/tmp/claimed", Some(cat.now() + 30 * DAY)),
    )
    .await
    .unwrap();
    let mut backends = BTreeMap::new();
    backends.insert("default".to_string(), backend.clone());
    reconcile::reconcile(cat, "default", &backend, 4)
        .await
        .unwrap();
    backends
}

fn keys(
    items: &[strata_catalog::lifecycle::PlanItem],
    state: Option<strata_catalog::lifecycle::ItemState>,
) -> BTreeSet<String> {
    items
        .iter()
        .filter(|i| state.is_none_or(|s| i.state == s))
        .map(|i| i.key.clone())
        .collect()
}

async fn each(f: impl AsyncFn(Catalog, Arc<ManualClock>, &Path)) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(real_now()));
    for (i, cat) in catalogs(dir.path(), clock.clone())
        .await
        .into_iter()
        .enumerate()
    {
        clock.set(real_now());
        let root = dir.path().join(format!("data-{i}"));
        eprintln!("-- on {:?}", cat.dialect());
        f(cat.clone(), clock.clone(), &root).await;
        cat.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_plans_and_runs_safely() {
    let scenario = fail::FailScenario::setup();
    each(async |cat, clock, root| {
        let expect = layout(root);
        let backends = setup(&cat, root).await;
        clock.advance(2 * DAY);

        // Dry run: the plan selects exactly the expected set and deletes nothing.
        let plan = cleanup::plan(&cat, &backends, SYSTEM, Some("team-a"))
            .await
            .unwrap();
        assert_eq!(keys(&plan.items, None), expect);
        assert_eq!(
            plan.per_team.get("team-a").map(|x| x.0),
            Some(expect.len() as u64)
        );
        // pinned, claimed, step-3 (2 files, latest) and step-4 (in progress after it).
        assert_eq!(plan.protected, 5);
        for k in &expect {
            assert!(root.join(k).exists(), "dry run deleted {k}");
        }

        // After planning: one candidate changes, another is read.
        write(root, "team-a/tmp/old2", "rewritten after the plan");
        cat.touch(
            "default",
            &[("team-a/tmp/sub/old3".into(), clock.now() + 1)],
        )
        .await
        .unwrap();
        // Caps: at most 2 objects in this run.
        let caps = Caps {
            max_objects: Some(2),
            ..Default::default()
        };
        let r = cleanup::run(&cat, &backends, SYSTEM, &plan.plan.id, &caps)
            .await
            .unwrap();
        assert_eq!(r.trashed, 2);
        assert_eq!(r.status, PlanStatus::Partial);
        let skipped: BTreeMap<_, _> = r.skipped.iter().cloned().collect();
        assert!(
            skipped["default:team-a/tmp/old2"].contains("changed"),
            "{skipped:?}"
        );
        assert!(
            skipped["default:team-a/tmp/sub/old3"].contains("read"),
            "{skipped:?}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("team-a/tmp/old2")).unwrap(),
            "rewritten after the plan"
        );
        assert!(root.join("team-a/tmp/sub/old3").exists());

        // A crash after the copy to the trash, before the delete: the run fails, nothing is lost...
        fail::cfg("cleanup-after-copy", "1*return").unwrap();
        let e = cleanup::run(&cat, &backends, SYSTEM, &plan.plan.id, &Caps::default()).await;
        assert!(e.is_err());
        fail::remove("cleanup-after-copy");
        // ...and a crash after the delete, before it is recorded.
        fail::cfg("cleanup-after-delete", "1*return").unwrap();
        let e = cleanup::run(&cat, &backends, SYSTEM, &plan.plan.id, &Caps::default()).await;
        assert!(e.is_err());
        fail::remove("cleanup-after-delete");
        // The rerun finishes the plan.
        let r = cleanup::run(&cat, &backends, SYSTEM, &plan.plan.id, &Caps::default())
            .await
            .unwrap();
        assert_eq!(r.status, PlanStatus::Done);
        let items = cat.plan_items(&plan.plan.id).await.unwrap();
        let trashed = keys(&items, Some(ItemState::Trashed));
        let mut want = expect.clone();
        want.remove("team-a/tmp/old2");
        want.remove("team-a/tmp/sub/old3");
        assert_eq!(trashed, want, "every unchanged, unread candidate, once");
        for k in &trashed {
            assert!(!root.join(k).exists(), "{k} still there");
            let t = root.join(format!(".strata-trash/{}/{k}", plan.plan.id));
            assert!(t.exists(), "{k} not in the trash");
        }
        // Protected data and other teams' data are untouched.
        for k in [
            "team-a/tmp/pinned",
            "team-a/tmp/claimed",
            "team-ab/tmp/lookalike",
            "unowned/tmp/x",
        ] {
            assert!(root.join(k).exists(), "{k} was deleted");
        }
        assert!(root.join(format!("{}/manifest.json", STEP(3))).exists());
        assert!(
            root.join(format!("{}/rank-00000.safetensors", STEP(4)))
                .exists()
        );
        // Usage follows: team-a's inventory no longer has the trashed objects.
        for k in &trashed {
            assert!(cat.object("default", k).await.unwrap().is_none());
        }

        // Restore brings the bytes back; a key written again since is not overwritten.
        write(root, "team-a/tmp/old1", "new object at the same key");
        let (n, refused) =
            cleanup::restore(&cat, &backends, SYSTEM, &plan.plan.id, Some("team-a/ckpt/"))
                .await
                .unwrap();
        assert_eq!(n, 4);
        assert!(refused.is_empty());
        assert_eq!(
            std::fs::read_to_string(root.join(format!("{}/manifest.json", STEP(1)))).unwrap(),
            "{}"
        );
        let (_, refused) = cleanup::restore(&cat, &backends, SYSTEM, &plan.plan.id, None)
            .await
            .unwrap();
        assert_eq!(refused.len(), 1, "old1 was written again: {refused:?}");
        assert_eq!(
            std::fs::read_to_string(root.join("team-a/tmp/old1")).unwrap(),
            "new object at the same key"
        );

        // The dry-run set equals the executed set when nothing changes in between.
        clock.advance(10);
        let plan2 = cleanup::plan(&cat, &backends, SYSTEM, Some("team-a"))
            .await
            .unwrap();
        let r2 = cleanup::run(&cat, &backends, SYSTEM, &plan2.plan.id, &Caps::default())
            .await
            .unwrap();
        assert!(r2.skipped.is_empty(), "{:?}", r2.skipped);
        let items2 = cat.plan_items(&plan2.plan.id).await.unwrap();
        assert_eq!(
            keys(&items2, Some(ItemState::Trashed)),
            keys(&plan2.items, None)
        );
        assert!(!keys(&plan2.items, None).is_empty());

        // Purge only after the grace period.
        assert_eq!(
            cleanup::purge(&cat, &backends, SYSTEM, 7 * DAY)
                .await
                .unwrap()
                .0,
            0
        );
        clock.advance(8 * DAY);
        let (purged, _) = cleanup::purge(&cat, &backends, SYSTEM, 7 * DAY)
            .await
            .unwrap();
        assert!(purged >= keys(&items2, Some(ItemState::Trashed)).len() as u64);
        assert!(
            !root
                .join(format!(".strata-trash/{}/team-a/tmp/old2", plan2.plan.id))
                .exists()
        );

        // Every action is audited.
        let audit = cat
            .list_audit(Some(&["team-a".into()]), 1000)
            .await
            .unwrap();
        for action in [
            "cleanup.plan",
            "cleanup.trash",
            "cleanup.run",
            "cleanup.restore",
            "cleanup.purge",
        ] {
            assert!(
                audit.iter().any(|a| a.action == action),
                "{action} not audited"
            );
        }
    })
    .await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_error_while_planning_makes_no_plan() {
    let s3 = strata_testkit::S3Server::start();
    s3.create_bucket("cleanup").await;
    let proxy = strata_testkit::FaultProxy::start(&s3.endpoint()).await;
    each(async |cat, clock, root| {
        let expect = layout(root);
        let mut backends = setup(&cat, root).await;
        let remote = Backend::open(
            "s3://cleanup/x",
            &BackendOptions {
                endpoint: Some(proxy.endpoint()),
                region: Some("us-east-1".into()),
                access_key_id: Some(strata_testkit::ACCESS_KEY.into()),
                secret_access_key: Some(strata_testkit::SECRET_KEY.into()),
                ..Default::default()
            },
            RetryPolicy {
                max_retries: 1,
                ..RetryPolicy::default()
            },
            Telemetry::new(),
        )
        .unwrap();
        backends.insert("remote".into(), remote);
        cat.add_policy(
            SYSTEM,
            Policy {
                id: String::new(),
                team: "team-a".into(),
                backend: "remote".into(),
                kind: PolicyKind::Ttl,
                prefix: Some("team-a".into()),
                label: None,
                age_secs: Some(DAY),
                keep_last: None,
                created_at: 0,
            },
        )
        .await
        .unwrap();
        clock.advance(2 * DAY);
        proxy.fail_next(1000, 503);
        let e = cleanup::plan(&cat, &backends, SYSTEM, Some("team-a"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("no plan was made"), "{e}");
        assert!(cat.list_plans(None).await.unwrap().is_empty());
        for k in &expect {
            assert!(root.join(k).exists());
        }
        proxy.fail_next(0, 503);
    })
    .await;
}
