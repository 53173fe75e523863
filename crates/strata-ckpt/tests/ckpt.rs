#![allow(clippy::unwrap_used)]
//! Save and restore across tiers: a local directory and a real S3 server (moto).

mod common;

use common::*;
use strata_ckpt::{Overlap, Retention, SaveState, Tier};
use strata_testkit::S3Server;
use strata_types::{ErrorKind, IoContext};

async fn save_all(cks: &[strata_ckpt::Checkpointer], step: u64) {
    let rt = tokio::runtime::Handle::current();
    let mut hs = Vec::new();
    for (r, c) in cks.iter().enumerate() {
        hs.push(
            c.save(&rt, step, state(r as u32, step), meta(step))
                .await
                .unwrap(),
        );
    }
    for h in hs {
        assert!(
            matches!(h.wait().await, SaveState::Done),
            "step {step}: {:?}",
            h.state()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_save_and_restore_locally() {
    let dir = tempfile::tempdir().unwrap();
    let cks = [ckpt(dir.path(), None, 0, 2), ckpt(dir.path(), None, 1, 2)];
    assert!(cks[0].load_latest().await.unwrap().is_none());
    for step in [10, 20, 30] {
        save_all(&cks, step).await;
    }
    for (r, c) in cks.iter().enumerate() {
        let (step, tensors, md) = c.load_latest().await.unwrap().unwrap();
        assert_eq!(step, 30);
        assert_eq!(tensors, state(r as u32, 30));
        assert_eq!(md["step"], "30");
        let (t20, _) = c.load(20).await.unwrap();
        assert_eq!(t20, state(r as u32, 20));
    }
    assert_eq!(
        cks[0].load(25).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // Other world size: a clear refusal.
    let other = ckpt(dir.path(), None, 0, 3);
    let e = other.load_latest().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.message().contains("2 ranks"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_falls_back_tier_by_tier_and_never_loads_a_corrupt_copy() {
    let server = S3Server::start();
    server.create_bucket("ckpts").await;
    let dir = tempfile::tempdir().unwrap();
    let cks = [
        ckpt(dir.path(), Some(remote(&server.endpoint(), "ckpts")), 0, 2),
        ckpt(dir.path(), Some(remote(&server.endpoint(), "ckpts")), 1, 2),
    ];
    save_all(&cks, 1).await;
    save_all(&cks, 2).await;
    let local_shard = |step: u64, rank: u32| {
        dir.path()
            .join("run-1")
            .join(strata_ckpt::manifest::step_dir(step))
            .join(strata_ckpt::manifest::shard_file(rank))
    };
    // Corrupt rank 1's local copy of step 2: it must come from the object store, verified.
    let p = local_shard(2, 1);
    let mut b = std::fs::read(&p).unwrap();
    let last = b.len() - 1;
    b[last] ^= 0xff;
    std::fs::write(&p, b).unwrap();
    let (step, t, _) = cks[1].load_latest().await.unwrap().unwrap();
    assert_eq!((step, t), (2, state(1, 2)));
    // Local directory gone entirely (a new node): everything from the object store.
    std::fs::remove_dir_all(dir.path().join("run-1")).unwrap();
    let (step, t, _) = cks[0].load_latest().await.unwrap().unwrap();
    assert_eq!((step, t), (2, state(0, 2)));
    // Every copy of step 2 of rank 0 corrupt: load(2) fails clearly, load_latest falls back to step 1.
    let remote_tier = remote(&server.endpoint(), "ckpts");
    let Tier::Remote(backend) = &remote_tier else {
        unreachable!()
    };
    let key = format!(
        "run-1/{}/{}",
        strata_ckpt::manifest::step_dir(2),
        strata_ckpt::manifest::shard_file(0)
    );
    let ctx = IoContext::default();
    backend
        .put(
            &ctx,
            &key,
            bytes::Bytes::from_static(b"garbage"),
            strata_object::PutMode::Overwrite,
        )
        .await
        .unwrap();
    let e = cks[0].load(2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.message().contains("rank-00000"), "{e}");
    let (step, t, _) = cks[0].load_latest().await.unwrap().unwrap();
    assert_eq!((step, t), (1, state(0, 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_per_tier_and_upload_schedule() {
    let server = S3Server::start();
    server.create_bucket("ret").await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = ckpt(dir.path(), Some(remote(&server.endpoint(), "ret")), 0, 1);
    {
        let cfg = strata_ckpt::CheckpointConfig {
            upload_every: 2,
            keep_local: Retention {
                keep_last: 2,
                keep_every: None,
            },
            keep_remote: Retention {
                keep_last: 1,
                keep_every: Some(400),
            },
            ..c.config().clone()
        };
        c = strata_ckpt::Checkpointer::new(cfg, IoContext::default()).unwrap();
    }
    for step in [100, 200, 300, 400, 500, 600, 700] {
        save_all(std::slice::from_ref(&c), step).await;
    }
    let ctx = IoContext::default();
    let local = Tier::Local(dir.path().to_path_buf());
    assert_eq!(
        local.committed(&ctx, "run-1").await.unwrap(),
        vec![600, 700]
    );
    // Uploaded: saves 1, 3, 5, 7 = steps 100, 300, 500, 700; kept: the newest and multiples of 400 (none).
    let rem = remote(&server.endpoint(), "ret");
    assert_eq!(rem.committed(&ctx, "run-1").await.unwrap(), vec![700]);
    // Another run's checkpoints are never touched.
    let other = strata_ckpt::Checkpointer::new(
        strata_ckpt::CheckpointConfig {
            run_id: "run-10".into(),
            ..c.config().clone()
        },
        IoContext::default(),
    )
    .unwrap();
    save_all(std::slice::from_ref(&other), 1).await;
    save_all(std::slice::from_ref(&c), 800).await;
    assert_eq!(local.committed(&ctx, "run-10").await.unwrap(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_saves_wait_or_skip_and_bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = ckpt(dir.path(), None, 0, 1);
    let skip = strata_ckpt::Checkpointer::new(
        strata_ckpt::CheckpointConfig {
            overlap: Overlap::Skip,
            ..base.config().clone()
        },
        IoContext::default(),
    )
    .unwrap();
    let rt = tokio::runtime::Handle::current();
    // A large state keeps the first save busy while the second arrives.
    let big = vec![strata_ckpt::blob(
        "big",
        bytes::Bytes::from(vec![7u8; 64 << 20]),
    )];
    let h1 = skip.save(&rt, 1, big, meta(1)).await.unwrap();
    let h2 = skip.save(&rt, 2, state(0, 2), meta(2)).await.unwrap();
    assert!(matches!(h2.state(), SaveState::Skipped));
    assert!(matches!(h1.wait().await, SaveState::Done));
    let bad = vec![strata_ckpt::Tensor {
        name: "x".into(),
        dtype: "F32".into(),
        shape: vec![3],
        data: bytes::Bytes::from_static(b"12"),
    }];
    assert_eq!(
        base.save(&rt, 3, bad, meta(3)).await.unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert!(
        strata_ckpt::Checkpointer::new(
            strata_ckpt::CheckpointConfig {
                run_id: "../escape".into(),
                ..base.config().clone()
            },
            IoContext::default()
        )
        .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_503s_are_retried_and_a_dead_store_fails_the_save_not_training() {
    let server = S3Server::start();
    server.create_bucket("flaky").await;
    let proxy = strata_testkit::FaultProxy::start(&server.endpoint()).await;
    let dir = tempfile::tempdir().unwrap();
    let c = ckpt(dir.path(), Some(remote(&proxy.endpoint(), "flaky")), 0, 1);
    let rt = tokio::runtime::Handle::current();
    // One 503 per attempt budget: the retry policy absorbs it.
    proxy.fail_next(1, 503);
    let h = c.save(&rt, 1, state(0, 1), meta(1)).await.unwrap();
    assert!(matches!(h.wait().await, SaveState::Done), "{:?}", h.state());
    // The store keeps failing: the save reports it; the local tier still committed the step.
    proxy.fail_next(1000, 503);
    let h = c.save(&rt, 2, state(0, 2), meta(2)).await.unwrap();
    match h.wait().await {
        SaveState::Failed(e) => assert!(e.message().contains("remote"), "{e}"),
        s => panic!("expected a failure, got {s:?}"),
    }
    proxy.fail_next(0, 503);
    let ctx = IoContext::default();
    assert_eq!(
        Tier::Local(dir.path().to_path_buf())
            .committed(&ctx, "run-1")
            .await
            .unwrap(),
        vec![1, 2]
    );
    let (step, t, _) = c.load_latest().await.unwrap().unwrap();
    assert_eq!((step, t), (2, state(0, 2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_saves_write_while_the_caller_copies_and_can_be_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    let c = ckpt(dir.path(), None, 0, 1);
    let rt = tokio::runtime::Handle::current();
    let want = state(0, 5);
    let specs: Vec<strata_ckpt::format::Spec> = want
        .iter()
        .map(|t| strata_ckpt::format::Spec {
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
        })
        .collect();
    let (h, mut sink) = c
        .save_stream(&rt, 5, specs.clone(), meta(5), None)
        .await
        .unwrap();
    for t in &want {
        sink.push(t.data.clone()).unwrap();
    }
    assert!(matches!(h.wait().await, SaveState::Done));
    assert_eq!(c.load(5).await.unwrap().0, want);
    // Abandoned after one tensor: reported, nothing committed, no temp file left.
    let (h, mut sink) = c
        .save_stream(&rt, 6, specs.clone(), meta(6), None)
        .await
        .unwrap();
    sink.push(want[0].data.clone()).unwrap();
    drop(sink);
    assert!(matches!(h.wait().await, SaveState::Failed(_)));
    // A tensor of the wrong size is refused in the caller and abandons the save.
    let (h, mut sink) = c.save_stream(&rt, 7, specs, meta(7), None).await.unwrap();
    assert_eq!(
        sink.push(bytes::Bytes::from_static(b"x"))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidInput
    );
    drop(sink);
    assert!(matches!(h.wait().await, SaveState::Failed(_)));
    assert_eq!(c.load_latest().await.unwrap().unwrap().0, 5);
    let ctx = IoContext::default();
    assert_eq!(
        Tier::Local(dir.path().to_path_buf())
            .committed(&ctx, "run-1")
            .await
            .unwrap(),
        vec![5]
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("run-1"))
        .unwrap()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_local_never_deletes_a_step_that_is_in_no_other_tier() {
    // keep_local = 1 and the object store down for two saves: the local tier must keep every step committed
    // since the last one the store has, or a step is gone everywhere.
    let server = S3Server::start();
    server.create_bucket("down").await;
    let proxy = strata_testkit::FaultProxy::start(&server.endpoint()).await;
    let dir = tempfile::tempdir().unwrap();
    let c = keeping(
        ckpt(dir.path(), Some(remote(&proxy.endpoint(), "down")), 0, 1),
        1,
        0,
    );
    save_1_then_2_and_3_with_the_store_down(&c, &proxy).await;
    proxy.fail_next(0, 503);
    let ctx = IoContext::default();
    let local = Tier::Local(dir.path().to_path_buf())
        .committed(&ctx, "run-1")
        .await
        .unwrap();
    // Step 1 is in the store (and may go locally); 2 and 3 are nowhere else, so they stay.
    assert!(local.ends_with(&[2, 3]), "local tier: {local:?}");
    let (step, t, _) = c.load_latest().await.unwrap().unwrap();
    assert_eq!((step, t), (3, state(0, 3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_run_uploads_the_steps_its_last_process_left_local_only() {
    let server = S3Server::start();
    server.create_bucket("later").await;
    let proxy = strata_testkit::FaultProxy::start(&server.endpoint()).await;
    let dir = tempfile::tempdir().unwrap();
    let store = || remote(&proxy.endpoint(), "later");
    let c = ckpt(dir.path(), Some(store()), 0, 1);
    // The store is down for two saves: committed locally, never uploaded.
    save_1_then_2_and_3_with_the_store_down(&c, &proxy).await;
    // While it is still down, finishing fails and keeps them local.
    let again = ckpt(dir.path(), Some(store()), 0, 1);
    assert!(again.finish_pending().await.is_err());
    proxy.fail_next(0, 503);
    drop(c);
    // The next process on the run finishes them.
    let next = ckpt(dir.path(), Some(store()), 0, 1);
    assert_eq!(next.finish_pending().await.unwrap(), vec![2, 3]);
    let ctx = IoContext::default();
    assert_eq!(
        store().committed(&ctx, "run-1").await.unwrap(),
        vec![1, 2, 3]
    );
    let fresh = tempfile::tempdir().unwrap();
    let remote_only = ckpt(fresh.path(), Some(store()), 0, 1);
    let (step, t, _) = remote_only.load_latest().await.unwrap().unwrap();
    assert_eq!((step, t), (3, state(0, 3)));
    assert!(next.finish_pending().await.unwrap().is_empty());
}

/// `base` keeping the newest `local` steps in the local tier and `remote` in the store (0: all).
fn keeping(
    base: strata_ckpt::Checkpointer,
    local: usize,
    remote: usize,
) -> strata_ckpt::Checkpointer {
    let keep = |keep_last| Retention {
        keep_last,
        keep_every: None,
    };
    strata_ckpt::Checkpointer::new(
        strata_ckpt::CheckpointConfig {
            keep_local: keep(local),
            keep_remote: keep(remote),
            ..base.config().clone()
        },
        IoContext::default(),
    )
    .unwrap()
}

/// Save step 1 (uploaded), then steps 2 and 3 while the store behind `proxy` fails everything (each save
/// fails, committed locally only).
async fn save_1_then_2_and_3_with_the_store_down(
    c: &strata_ckpt::Checkpointer,
    proxy: &strata_testkit::FaultProxy,
) {
    let rt = tokio::runtime::Handle::current();
    let h = c.save(&rt, 1, state(0, 1), meta(1)).await.unwrap();
    assert!(matches!(h.wait().await, SaveState::Done), "{:?}", h.state());
    proxy.fail_next(100_000, 503);
    for step in [2, 3] {
        let h = c.save(&rt, step, state(0, step), meta(step)).await.unwrap();
        assert!(
            matches!(h.wait().await, SaveState::Failed(_)),
            "{:?}",
            h.state()
        );
    }
}

/// Issue 44, finding 16: a process that keeps running through a store outage keeps every step it committed
/// locally until that very step is durable in the store (with `keep_remote` keeping all, newer steps reaching
/// the store do not make older ones expendable), and uploads them in the background once the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_committed_during_an_outage_reach_the_store_while_the_process_runs_on() {
    let server = S3Server::start();
    server.create_bucket("outage").await;
    let proxy = strata_testkit::FaultProxy::start(&server.endpoint()).await;
    let dir = tempfile::tempdir().unwrap();
    let store = || remote(&proxy.endpoint(), "outage");
    let c = keeping(ckpt(dir.path(), Some(store()), 0, 1), 1, 0);
    save_1_then_2_and_3_with_the_store_down(&c, &proxy).await;
    // The store is back; the run goes on saving, and newer steps reach the store first.
    proxy.fail_next(0, 503);
    let rt = tokio::runtime::Handle::current();
    for step in [4, 5] {
        let h = c.save(&rt, step, state(0, step), meta(step)).await.unwrap();
        assert!(matches!(h.wait().await, SaveState::Done), "{:?}", h.state());
    }
    let ctx = IoContext::default();
    let local = Tier::Local(dir.path().to_path_buf());
    // Every committed step is in some tier at every moment, and 2 and 3 reach the store without a restart.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let l = local.committed(&ctx, "run-1").await.unwrap();
        let r = store().committed(&ctx, "run-1").await.unwrap();
        for step in 1..=5u64 {
            assert!(
                l.contains(&step) || r.contains(&step),
                "step {step} is in no tier: local {l:?}, store {r:?}"
            );
        }
        if r == vec![1, 2, 3, 4, 5] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "steps 2 and 3 never reached the store: {r:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let fresh = tempfile::tempdir().unwrap();
    let remote_only = ckpt(fresh.path(), Some(store()), 0, 1);
    for step in 1..=5u64 {
        let (t, _) = remote_only.load(step).await.unwrap();
        assert_eq!(t, state(0, step));
    }
    // Once durable, the local tier keeps only what its own policy asks for.
    c.flush().await;
}

/// Issue 44, finding 17: with verified steps on local disk and the store hung (it accepts connections and
/// never answers), restore is local-first: listing waits on the store a bounded time, and the newest local
/// step loads from its verified local copy. (The bound below only catches a hang: the old code waited for
/// the store's request timeouts, over two minutes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_is_local_first_when_the_store_hangs() {
    let server = S3Server::start();
    server.create_bucket("hung").await;
    let proxy = strata_testkit::FaultProxy::start(&server.endpoint()).await;
    let dir = tempfile::tempdir().unwrap();
    let store = || remote(&proxy.endpoint(), "hung");
    let c = ckpt(dir.path(), Some(store()), 0, 1);
    save_all(std::slice::from_ref(&c), 1).await;
    save_all(std::slice::from_ref(&c), 2).await;
    drop(c);
    proxy.set_delay(std::time::Duration::from_secs(3600));
    let again = ckpt(dir.path(), Some(store()), 0, 1);
    let loaded = tokio::time::timeout(std::time::Duration::from_secs(60), again.load_latest())
        .await
        .expect("load_latest hung on the store");
    let (step, t, _) = loaded.unwrap().unwrap();
    assert_eq!((step, t), (2, state(0, 2)));
    let (t1, _) = tokio::time::timeout(std::time::Duration::from_secs(60), again.load(1))
        .await
        .expect("load hung on the store")
        .unwrap();
    assert_eq!(t1, state(0, 1));
}
