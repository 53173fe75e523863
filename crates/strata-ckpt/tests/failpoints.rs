#![allow(clippy::unwrap_used)]
//! Every step of the commit fails (error, then panic) in turn: the save reports it, training is not touched,
//! and afterwards the newest loadable checkpoint is a committed one whose bytes verify. Its own binary:
//! failpoints are process-wide.

mod common;

use common::*;
use strata_ckpt::{CheckpointConfig, Checkpointer, Retention, SaveState, Tier};
use strata_testkit::S3Server;
use strata_types::IoContext;

const POINTS: &[&str] = &[
    "ckpt-shard-write",
    "ckpt-fsync",
    "ckpt-shard-rename",
    "ckpt-record-write",
    "ckpt-record-rename",
    "ckpt-manifest-write",
    "ckpt-manifest-rename",
    "ckpt-upload-part",
    "ckpt-upload-complete",
    "ckpt-retention-delete",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_commit_step_failing_leaves_the_last_committed_checkpoint() {
    let server = S3Server::start();
    let rt = tokio::runtime::Handle::current();
    let ctx = IoContext::default();
    let mut case = 0;
    for point in POINTS {
        for (action, streamed) in [
            ("return", false),
            ("panic", false),
            ("return", true),
            ("panic", true),
        ] {
            case += 1;
            let bucket = format!("fp-{case}");
            server.create_bucket(&bucket).await;
            let dir = tempfile::tempdir().unwrap();
            let base = ckpt(dir.path(), Some(remote(&server.endpoint(), &bucket)), 0, 1);
            let c = Checkpointer::new(
                CheckpointConfig {
                    keep_local: Retention {
                        keep_last: 1,
                        keep_every: None,
                    },
                    keep_remote: Retention {
                        keep_last: 1,
                        keep_every: None,
                    },
                    ..base.config().clone()
                },
                IoContext::default(),
            )
            .unwrap();
            let h = c.save(&rt, 1, state(0, 1), meta(1)).await.unwrap();
            assert!(
                matches!(h.wait().await, SaveState::Done),
                "{point}: first save"
            );

            fail::cfg(*point, action).unwrap();
            let h = if streamed {
                // The way the Python binding saves: tensors pushed while the shard is written.
                let tensors = state(0, 2);
                let specs = tensors
                    .iter()
                    .map(|t| strata_ckpt::format::Spec {
                        name: t.name.clone(),
                        dtype: t.dtype.clone(),
                        shape: t.shape.clone(),
                    })
                    .collect();
                let (h, mut sink) = c.save_stream(&rt, 2, specs, meta(2), None).await.unwrap();
                for t in tensors {
                    sink.push(t.data).unwrap();
                }
                h
            } else {
                c.save(&rt, 2, state(0, 2), meta(2)).await.unwrap()
            };
            let outcome = h.wait().await;
            fail::remove(*point);
            if *point != "ckpt-retention-delete" {
                assert!(
                    matches!(outcome, SaveState::Failed(_)),
                    "{point}/{action}: {outcome:?}"
                );
            }

            // The newest loadable checkpoint is committed and verifies.
            let (step, tensors, _) = c.load_latest().await.unwrap().unwrap();
            assert_eq!(tensors, state(0, step), "{point}/{action}");
            // Committed in some tier (a failed local write no longer stops the upload).
            let committed: Vec<u64> = c
                .committed()
                .await
                .unwrap()
                .into_iter()
                .map(|(s, _)| s)
                .collect();
            assert!(
                committed.contains(&step),
                "{point}/{action}: step {step} loaded but never committed"
            );
            let local = Tier::Local(dir.path().to_path_buf());
            assert!(
                !local.committed(&ctx, "run-1").await.unwrap().is_empty() || committed.contains(&1),
                "{point}/{action}: no committed checkpoint left"
            );
            // And the checkpointer still works.
            let h = c.save(&rt, 3, state(0, 3), meta(3)).await.unwrap();
            assert!(
                matches!(h.wait().await, SaveState::Done),
                "{point}/{action}: save after failure"
            );
            assert_eq!(c.load_latest().await.unwrap().unwrap().0, 3);
            // Debris of the failed save (a panic leaves its temp file, as a crash would) is gone once a newer
            // checkpoint is committed: retention removes uncommitted steps older than the newest commit.
            for e in walk(dir.path()) {
                let name = e.file_name().unwrap().to_string_lossy().to_string();
                assert!(
                    !name.contains(".tmp-"),
                    "{point}/{action}: left {}",
                    e.display()
                );
            }
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
