//! The mounter: claims' mounts made by another process on the agent's behalf, so that they outlive the agent's
//! process group, cgroup or container.
//!
//! A claim's mount is a `strata mount` whose holder keeps the `/dev/fuse` descriptor and restarts its server
//! (docs/mount.md); started by the agent, the holder is detached from it but stays in the agent's cgroup, and
//! whatever ends a cgroup (a container that restarts: a crash, an OOM kill, a rolling update) ends the
//! holder and takes the node's mounts with it. With `[claims] mounter = SOCKET` the agent asks
//! `strata mounter --socket SOCKET` (on Kubernetes, a container of its own in the agents' pod) to run the
//! `strata mount` instead: the holder is the mounter's, and an agent that restarts finds its mounts in place
//! (their reads wait for it). Unmounting needs no mounter: it is by path, from the agent.
//!
//! The wire: one JSON line each way per connection on a Unix socket ([`MountRequest`], [`MountAnswer`]). The
//! socket is created mode 0600 in a directory of mode 0700: only root in the same pod (or on the same node)
//! reaches it. The mounter runs nothing but `strata mount` of a location on a directory, with the fields
//! checked; [`MAX_CONCURRENT`] at once, [`MOUNT_TIMEOUT`] each.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use strata_types::{Error, ErrorKind, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The longest request or answer line.
const MAX_LINE: usize = 64 << 10;
/// Mounts made at once.
pub const MAX_CONCURRENT: usize = 8;
/// The longest one `strata mount` may take to answer.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest a caller may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the agent asks the mounter for: `strata mount LOCATION DIR` with these options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountRequest {
    /// What to mount (`claim:<id>/<dataset>`).
    pub location: String,
    /// Where (an absolute path).
    pub dir: PathBuf,
    /// The agent's API the mount reads through (`http://...`).
    pub api: String,
    /// The agent's data directory.
    pub data_dir: PathBuf,
    /// The mount's state directory (absolute).
    pub state_dir: PathBuf,
    /// Owner and group of the files.
    pub uid: u32,
    /// Group of the files.
    pub gid: u32,
    /// File mode, octal (`0440`).
    pub mode: String,
    /// The token the mount reads with.
    pub token: String,
    /// The claim's job, which the mount's I/O is counted to.
    #[serde(default)]
    pub job: Option<String>,
}

/// The mounter's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountAnswer {
    /// Whether the mount answers now.
    pub ok: bool,
    /// Why not (the mount's own message).
    #[serde(default)]
    pub message: String,
}

impl MountRequest {
    /// Refuse a request the mounter must not run.
    fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::invalid_input(why));
        if !self.location.starts_with("claim:") || self.location.len() > 512 {
            return bad(format!(
                "location {:?}: only a claim's dataset",
                self.location
            ));
        }
        for (name, p) in [
            ("dir", &self.dir),
            ("data_dir", &self.data_dir),
            ("state_dir", &self.state_dir),
        ] {
            if !p.is_absolute() {
                return bad(format!("{name} {}: not an absolute path", p.display()));
            }
        }
        if !self.api.starts_with("http://") && !self.api.starts_with("https://") {
            return bad(format!("api {:?}: not an http(s) URL", self.api));
        }
        if let Some(j) = &self.job
            && (j.is_empty() || j.len() > 256 || j.chars().any(char::is_control))
        {
            return bad(format!("job {j:?}: 1 to 256 bytes, no control characters"));
        }
        if u32::from_str_radix(&self.mode, 8).map_or(true, |m| m > 0o777) {
            return bad(format!("mode {:?}: not an octal file mode", self.mode));
        }
        Ok(())
    }

    /// The `strata mount` command of this request (the binary `exe`).
    pub fn command(&self, exe: &Path) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(exe);
        c.arg("mount")
            .arg(&self.location)
            .arg(&self.dir)
            .arg("--api")
            .arg(&self.api)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--state-dir")
            .arg(&self.state_dir)
            // Hot copies (FUSE passthrough) on the agent's own disk, shared by the node's claim mounts.
            .arg("--hot-dir")
            .arg(self.data_dir.join("mount-hot"))
            .args([
                "--uid",
                &self.uid.to_string(),
                "--gid",
                &self.gid.to_string(),
            ])
            .args(["--mode", &self.mode, "--allow-other"])
            .args(self.job.iter().map(|j| format!("--job={j}")))
            .env("STRATA_TOKEN", &self.token)
            .kill_on_drop(true);
        c
    }
}

/// Run `req`'s `strata mount` here (the binary `exe`), within [`MOUNT_TIMEOUT`].
pub async fn mount_here(exe: &Path, req: &MountRequest) -> Result<()> {
    let out = tokio::time::timeout(MOUNT_TIMEOUT, req.command(exe).output())
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "{} was not mounted in {} s",
                    req.dir.display(),
                    MOUNT_TIMEOUT.as_secs()
                ),
            )
        })?
        .map_err(|e| Error::from_io(e, "starting strata mount"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Io,
        format!(
            "mounting on {}: {}",
            req.dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    ))
}

/// Ask the mounter at `socket` to make `req`'s mount.
pub async fn mount_via(socket: &Path, req: &MountRequest) -> Result<()> {
    let unavailable = |e: std::io::Error| {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "the mounter at {} ([claims] mounter): {e}",
                socket.display()
            ),
        )
    };
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(unavailable)?;
    let mut line = serde_json::to_vec(req).map_err(|e| Error::internal(e.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line).await.map_err(unavailable)?;
    let mut answer = String::new();
    let mut reader = BufReader::new(stream).take(MAX_LINE as u64);
    tokio::time::timeout(
        MOUNT_TIMEOUT + Duration::from_secs(10),
        reader.read_line(&mut answer),
    )
    .await
    .map_err(|_| {
        Error::new(
            ErrorKind::Timeout,
            format!("the mounter at {} did not answer", socket.display()),
        )
    })?
    .map_err(unavailable)?;
    let answer: MountAnswer = serde_json::from_str(answer.trim()).map_err(|e| {
        Error::new(
            ErrorKind::Unavailable,
            format!("the mounter at {}: a bad answer: {e}", socket.display()),
        )
    })?;
    if answer.ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Io, answer.message))
    }
}

/// Serve mount requests on `socket` with the binary `exe` until `shutdown` resolves. The socket's directory
/// is created mode 0700 if missing; a stale socket file is replaced.
pub async fn serve(
    socket: &Path,
    exe: PathBuf,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = socket.parent().filter(|d| !d.exists()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::from_io(e, dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::from_io(e, dir.display()))?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::from_io(e, socket.display())),
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .map_err(|e| Error::from_io(e, format!("binding {}", socket.display())))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::from_io(e, socket.display()))?;
    tracing::info!(socket = %socket.display(), "mounter ready");
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    let exe = Arc::new(exe);
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => r.map_err(|e| Error::from_io(e, "accepting a mount request"))?,
            _ = &mut shutdown => break,
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let exe = exe.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(read).take(MAX_LINE as u64);
            let got = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
            let result = match got {
                Ok(Ok(_)) => match serde_json::from_str::<MountRequest>(line.trim()) {
                    Ok(req) => match req.check() {
                        Ok(()) => {
                            let r = mount_here(&exe, &req).await;
                            match &r {
                                Ok(()) => {
                                    tracing::info!(location = %req.location, dir = %req.dir.display(), "mounted")
                                }
                                Err(e) => {
                                    tracing::warn!(location = %req.location, error = %e, "mount failed")
                                }
                            }
                            r
                        }
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(Error::invalid_input(format!("mount request: {e}"))),
                },
                Ok(Err(e)) => Err(Error::from_io(e, "reading a mount request")),
                Err(_) => Err(Error::new(ErrorKind::Timeout, "no mount request in time")),
            };
            let answer = match result {
                Ok(()) => MountAnswer {
                    ok: true,
                    message: String::new(),
                },
                Err(e) => MountAnswer {
                    ok: false,
                    message: e.to_string(),
                },
            };
            let mut out = serde_json::to_vec(&answer).unwrap_or_default();
            out.push(b'\n');
            let _ = write.write_all(&out).await;
        });
    }
    let _ = std::fs::remove_file(socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> MountRequest {
        MountRequest {
            location: "claim:clm_1/train".into(),
            dir: "/var/lib/strata/mounts/a/train".into(),
            api: "http://127.0.0.1:7070".into(),
            data_dir: "/var/lib/strata/data".into(),
            state_dir: "/var/lib/strata/data/mounts/clm_1-train".into(),
            uid: 0,
            gid: 1000,
            mode: "0440".into(),
            token: "t".into(),
            job: Some("4242".into()),
        }
    }

    #[test]
    fn only_a_claims_mount_with_absolute_paths_and_a_mode_is_run() {
        assert!(req().check().is_ok());
        for bad in [
            MountRequest {
                location: "origin/anything/".into(),
                ..req()
            },
            MountRequest {
                dir: "relative/x".into(),
                ..req()
            },
            MountRequest {
                api: "file:///etc/passwd".into(),
                ..req()
            },
            MountRequest {
                mode: "4755x".into(),
                ..req()
            },
            MountRequest {
                mode: "7777".into(),
                ..req()
            },
            MountRequest {
                job: Some("a\nb".into()),
                ..req()
            },
            MountRequest {
                job: Some("j".repeat(257)),
                ..req()
            },
        ] {
            let e = bad.check().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        }
    }
}
