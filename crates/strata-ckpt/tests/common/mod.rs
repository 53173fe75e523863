#![allow(dead_code)]
//! Shared helpers: checkpointers over a temp dir and (optionally) moto.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use strata_ckpt::{CheckpointConfig, Checkpointer, Overlap, Retention, Tensor, Tier};
use strata_object::{Backend, BackendOptions, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_testkit::{ACCESS_KEY, SECRET_KEY};
use strata_types::IoContext;

pub fn remote(endpoint: &str, bucket: &str) -> Tier {
    let opts = BackendOptions {
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        ..Default::default()
    };
    let retry = RetryPolicy {
        max_retries: 1,
        initial_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    };
    Tier::Remote(
        Backend::open(
            &format!("s3://{bucket}/ckpts"),
            &opts,
            retry,
            Telemetry::new(),
        )
        .unwrap(),
    )
}

pub fn ckpt(local: &Path, remote: Option<Tier>, rank: u32, world: u32) -> Checkpointer {
    Checkpointer::new(
        CheckpointConfig {
            run_id: "run-1".into(),
            rank,
            world_size: world,
            local_is_shared: true,
            local: Tier::Local(local.to_path_buf()),
            remote,
            peers: Vec::new(),
            self_peer: None,
            replicas: 0,
            upload_every: 1,
            keep_local: Retention::default(),
            keep_remote: Retention::default(),
            overlap: Overlap::Wait,
            commit_timeout: Duration::from_secs(20),
            handoff: None,
            quota: None,
        },
        IoContext::default(),
    )
    .unwrap()
}

/// A rank's state at a step: deterministic, different per rank and step.
pub fn state(rank: u32, step: u64) -> Vec<Tensor> {
    let n = 1000 + rank as usize * 10;
    let w: Vec<u8> = (0..n * 4)
        .map(|i| (i as u64 * 31 + step * 7 + u64::from(rank)) as u8)
        .collect();
    vec![
        Tensor {
            name: "layer.weight".into(),
            dtype: "F32".into(),
            shape: vec![n as u64],
            data: Bytes::from(w),
        },
        strata_ckpt::blob(
            "optimizer",
            Bytes::from(format!("opt-{rank}-{step}").into_bytes()),
        ),
    ]
}

pub fn meta(step: u64) -> BTreeMap<String, String> {
    [("step".to_string(), step.to_string())].into()
}
