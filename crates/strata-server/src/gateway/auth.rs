//! Gateway credentials: access keys from the configuration, `STRATA_ACCESS_KEY` / `STRATA_SECRET_KEY` from the
//! environment, or (with neither) a key pair generated on first start and kept in `<data_dir>/credentials.json`.

use std::collections::HashMap;
use std::path::Path;

use strata_types::{Error, Result};

pub use crate::config::AccessKey;

/// Where the keys came from (for the start-up log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The configuration file and/or environment.
    Configured,
    /// Generated now or earlier, stored at this path.
    Generated(std::path::PathBuf),
}

/// Resolve the key set: the configured keys (the environment's root key among them, see
/// [`crate::config::Overrides::root_key`]); if there are none, the stored or a newly generated key pair.
pub fn resolve_keys(
    configured: &[AccessKey],
    data_dir: &Path,
) -> Result<(Vec<AccessKey>, KeySource)> {
    let keys = configured.to_vec();
    let mut seen = HashMap::new();
    for k in &keys {
        if k.access_key.len() < 3 || k.secret_key.len() < 8 {
            return Err(Error::config(format!(
                "gateway key {:?}: access keys need at least 3 characters and secrets at least 8",
                k.access_key
            )));
        }
        if seen.insert(k.access_key.clone(), ()).is_some() {
            return Err(Error::config(format!(
                "gateway key {:?} is defined twice",
                k.access_key
            )));
        }
    }
    if !keys.is_empty() {
        return Ok((keys, KeySource::Configured));
    }
    let path = data_dir.join("credentials.json");
    if let Ok(body) = std::fs::read(&path) {
        let key: AccessKey = serde_json::from_slice(&body).map_err(|e| {
            Error::config(format!(
                "{}: {e}; delete it to generate a new key pair",
                path.display()
            ))
        })?;
        return Ok((vec![key], KeySource::Generated(path)));
    }
    let hex = |n: usize| -> String {
        (0..n)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect()
    };
    let key = AccessKey {
        access_key: format!("STRATA{}", hex(7).to_uppercase()),
        secret_key: hex(20),
        principal: Some("root".into()),
        team: None,
        job: None,
    };
    let body = serde_json::to_vec_pretty(&key).map_err(|e| Error::internal(e.to_string()))?;
    write_private(&path, &body)?;
    Ok((vec![key], KeySource::Generated(path)))
}

fn write_private(path: &Path, body: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::from_io(e, format!("creating {}", path.display())))?;
    f.write_all(body)
        .map_err(|e| Error::from_io(e, format!("writing {}", path.display())))
}
