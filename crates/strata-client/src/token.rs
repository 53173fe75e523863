//! Where a client's bearer token comes from.
//!
//! In order: a token given explicitly (`--token`), `STRATA_TOKEN` from the environment, the local agent's
//! administrator token file `<data-dir>/admin-token` (written by the agent's first start, mode 0600). This
//! module is the only place a client reads the environment: the token, and the job its I/O is for
//! ([`job_from_env`]).

use std::path::{Path, PathBuf};

/// Name of the file in an agent's data directory that holds its administrator token.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// The administrator token file of the agent whose data directory is `data_dir`.
pub fn admin_token_file(data_dir: &Path) -> PathBuf {
    data_dir.join(ADMIN_TOKEN_FILE)
}

/// `STRATA_TOKEN`, trimmed, if set and not empty.
pub fn from_env() -> Option<String> {
    clean(std::env::var("STRATA_TOKEN").ok())
}

/// The job a process's I/O is attributed to: `STRATA_JOB` (a claim gives its job this, on Slurm and in a
/// DataClaim's pods), else `SLURM_JOB_ID`, else, in a Kubernetes pod, the pod's name (`HOSTNAME` there).
pub fn job_from_env() -> Option<String> {
    // A value no header can carry is no job (every client built from the environment would fail).
    let var = |n: &str| {
        clean(std::env::var(n).ok()).filter(|v| v.len() <= 256 && !v.chars().any(char::is_control))
    };
    var("STRATA_JOB")
        .or_else(|| var("SLURM_JOB_ID"))
        .or_else(|| {
            std::env::var_os("KUBERNETES_SERVICE_HOST")
                .is_some()
                .then(|| var("HOSTNAME"))
                .flatten()
        })
}

/// The token in `<data_dir>/admin-token`, if the file is there and readable.
pub fn from_data_dir(data_dir: &Path) -> Option<String> {
    clean(std::fs::read_to_string(admin_token_file(data_dir)).ok())
}

/// `explicit`, else [`from_env`], else [`from_data_dir`] of `data_dir`.
pub fn discover(explicit: Option<String>, data_dir: Option<&Path>) -> Option<String> {
    clean(explicit)
        .or_else(from_env)
        .or_else(|| data_dir.and_then(from_data_dir))
}

fn clean(t: Option<String>) -> Option<String> {
    t.map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_wins_and_blank_is_none() {
        assert_eq!(discover(Some(" t1 \n".into()), None).as_deref(), Some("t1"));
        assert_eq!(clean(Some("  ".into())), None);
    }

    #[test]
    fn the_data_dir_file_is_read_trimmed() {
        let dir = std::env::temp_dir().join(format!("strata-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        std::fs::write(admin_token_file(&dir), "abc\n").unwrap_or_default();
        assert_eq!(from_data_dir(&dir).as_deref(), Some("abc"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
