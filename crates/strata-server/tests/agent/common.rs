//! What the suites of this binary share: an agent on embedded defaults in a temporary data directory.

use std::sync::Arc;

use strata_server::Agent;
use strata_server::config::{Config, Overrides};

/// A started agent (API on a free loopback port, gateway off) and its data directory `<dir>/d`.
pub async fn agent() -> (Arc<Agent>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let resolved = Config::default()
        .resolve(&Overrides {
            data_dir: Some(dir.path().join("d")),
            api_listen: Some("127.0.0.1:0".into()),
            ..Default::default()
        })
        .unwrap();
    (Agent::start(resolved).await.unwrap(), dir)
}
