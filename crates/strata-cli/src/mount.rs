//! `strata mount LOCATION DIR`: the command around `strata_mount` (listing, state directory, the holder in the
//! background, waiting until the mount answers).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{ApiArgs, api_base, api_client, reached};

/// `strata mount` arguments.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// What to mount: a prefix (`NAME/train/`, `s3://bucket/train/`) or a whole backend (`NAME`). The objects
    /// under it are listed once: the mount serves that version, pinned by ETag.
    pub location: String,
    /// An empty directory to mount it on (not a mount point already).
    pub dir: PathBuf,
    /// Stay in the foreground (the holder process; logs on stderr) instead of returning once mounted.
    #[arg(long)]
    pub foreground: bool,
    /// Owner of the files (default: the user running the command).
    #[arg(long, value_name = "UID")]
    pub uid: Option<u32>,
    /// Group of the files (default: the user's group).
    #[arg(long, value_name = "GID")]
    pub gid: Option<u32>,
    /// Permission bits of the files, octal; directories also get `x` where `r` is set.
    #[arg(long, value_name = "MODE", default_value = "0444", value_parser = parse_mode)]
    pub mode: u16,
    /// Let other users in (FUSE's `allow_other`); the owner, group and mode still decide who may read.
    #[arg(long)]
    pub allow_other: bool,
    /// How long a read waits for an agent that is away (restarting) before it fails with EIO.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub agent_wait: u64,
    /// Threads answering the kernel.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub threads: usize,
    /// Where the mount keeps its listing and the holder's socket. Default: /run/strata/mounts/<id> for root,
    /// else $XDG_RUNTIME_DIR/strata/mounts/<id>, else /tmp/strata-<uid>/mounts/<id>.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Where large files read whole are kept as local copies that later opens read through FUSE
    /// passthrough, at local-disk speed (Linux 6.9, root; mounts of a user make none). Shared by mounts;
    /// a copy is found only for the exact version it holds. Default for root: /var/cache/strata/mount-hot.
    #[arg(long, value_name = "DIR")]
    pub hot_dir: Option<PathBuf>,
    /// At most this many bytes of copies in --hot-dir (the least recently opened go first; no copy ever
    /// leaves its file system less than a tenth free). 0: no copies, every pass reads through FUSE's page
    /// cache (about half a local file's speed). Writing copies costs the cold read that makes them about a
    /// fifth on a slow disk (docs/mount.md).
    #[arg(long, value_name = "SIZE", default_value = "16GiB")]
    pub hot_size: strata_types::ByteSize,
    /// The job the mount's reads and metadata operations are counted to in the agent's analytics
    /// (default: $STRATA_JOB, else $SLURM_JOB_ID, else the pod's name on Kubernetes).
    #[arg(long, value_name = "JOB")]
    pub job: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
}

fn parse_mode(s: &str) -> std::result::Result<u16, String> {
    let m = u16::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("{s:?} is not an octal mode: {e}"))?;
    if m > 0o777 {
        return Err(format!("{s:?}: only permission bits (at most 0777)"));
    }
    Ok(m)
}

/// The state directory of a mount on `dir` (canonical).
fn default_state(dir: &Path) -> PathBuf {
    // FNV-1a of the path: a stable, short name per mount point.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    let id = format!("{h:016x}");
    let (uid, _) = strata_mount::holder::caller_ids();
    let base = if uid == 0 {
        PathBuf::from("/run/strata/mounts")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(x).join("strata/mounts")
    } else {
        PathBuf::from(format!("/tmp/strata-{uid}/mounts"))
    };
    base.join(id)
}

/// `strata mount`.
pub async fn run(a: MountArgs) -> Result<()> {
    let dir = std::fs::canonicalize(&a.dir)
        .with_context(|| format!("the mount point {}", a.dir.display()))?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    if std::fs::read_dir(&dir)
        .with_context(|| format!("the mount point {}", dir.display()))?
        .next()
        .is_some()
    {
        bail!(
            "{} is not empty: a mount would hide what is in it",
            dir.display()
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(m) == dir)
    {
        bail!("{} is a mount point already", dir.display());
    }
    let state = a.state_dir.clone().unwrap_or_else(|| default_state(&dir));
    if !a.foreground {
        return background(&a, &dir, &state).await;
    }
    let base = api_base(&a.api);
    let client = api_client(&a.api)?;
    let snapshot = strata_mount::list(&client, &a.location)
        .await
        .map_err(|e| reached(e, &base))?;
    if snapshot.objects.is_empty() {
        let hint = if a.location.ends_with('/') || a.location.starts_with("claim:") {
            ""
        } else {
            " (a location is a prefix: to read one object, mount the prefix it is under)"
        };
        bail!(
            "nothing to mount: no objects under {}{hint}",
            snapshot.location
        );
    }
    tracing::info!(
        location = %snapshot.location,
        objects = snapshot.objects.len(),
        "listed the version to mount"
    );
    let caller = strata_mount::holder::caller_ids();
    let cfg = strata_mount::MountConfig {
        location: snapshot.location.clone(),
        mountpoint: dir.clone(),
        api: base,
        ownership: strata_mount::Ownership {
            uid: a.uid.unwrap_or(caller.0),
            gid: a.gid.unwrap_or(caller.1),
            file_mode: a.mode,
        },
        allow_other: a.allow_other,
        agent_wait_secs: a.agent_wait,
        threads: a.threads,
        hot_dir: a
            .hot_dir
            .clone()
            .or_else(|| (caller.0 == 0).then(|| PathBuf::from("/var/cache/strata/mount-hot"))),
        hot_bytes: a.hot_size.bytes(),
        job: a.job.clone().or_else(strata_client::token::job_from_env),
    };
    let exe = std::env::current_exe().context("the strata binary's path")?;
    let server: Vec<OsString> = vec![exe.into(), "__mount-serve".into()];
    let token = strata_client::token::discover(
        a.api.token.clone(),
        Some(
            &a.api
                .data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("./.strata")),
        ),
    );
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    strata_mount::hold(cfg, snapshot, &state, &server, token, shutdown).await?;
    Ok(())
}

/// Start the holder detached (its log in the state directory) and return once the mount answers.
async fn background(a: &MountArgs, dir: &Path, state: &Path) -> Result<()> {
    std::fs::create_dir_all(state).with_context(|| format!("{}", state.display()))?;
    let ready = state.join(strata_mount::READY);
    let _ = std::fs::remove_file(&ready);
    let log_path = state.join("log");
    let log =
        std::fs::File::create(&log_path).with_context(|| format!("{}", log_path.display()))?;
    let exe = std::env::current_exe().context("the strata binary's path")?;
    // The token goes to the holder in its environment (readable by its user alone), never on its command
    // line (`/proc/<pid>/cmdline` is readable by every user of the node, for as long as the mount lives).
    let (mut args, token) = without_token(std::env::args_os().skip(1));
    args.push("--foreground".into());
    if a.state_dir.is_none() {
        args.push("--state-dir".into());
        args.push(state.into());
    }
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(exe);
    if let Some(t) = token.or_else(|| a.api.token.clone().map(OsString::from)) {
        cmd.env("STRATA_TOKEN", t);
    }
    let mut child = cmd
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the mount's holder")?;
    let started = Instant::now();
    loop {
        if ready.exists() {
            println!(
                "mounted {} on {} (log: {})",
                a.location,
                dir.display(),
                log_path.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the mount failed ({status}):\n{}", log.trim_end());
        }
        if started.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            bail!(
                "the mount did not answer in 300 s; see {}",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `strata __mount-serve STATE`: one server of a mount (the holder starts it). Exit 0 when unmounted.
pub fn serve(state: &Path) -> ! {
    match strata_mount::serve(state) {
        Ok(strata_mount::Stopped::Unmounted) => std::process::exit(0),
        Ok(strata_mount::Stopped::ServerGone) => {
            eprintln!("error: the FUSE session stopped while mounted");
            std::process::exit(3)
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2)
        }
    }
}

/// `strata wait-mounts` arguments.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The directories that must be Strata mounts (as this process sees them: in a pod, its own paths).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Give up after this many seconds, with the directories that are not mounted yet.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub timeout_secs: u64,
}

/// A path as `/proc/self/mountinfo` writes it: space, tab, newline and backslash as octal escapes.
fn mountinfo_escaped(p: &Path) -> String {
    let mut out = String::new();
    for c in p.to_string_lossy().chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Which of `dirs` are not Strata mounts (file system type `fuse.strata`) in `mountinfo`.
fn not_mounted<'a>(mountinfo: &str, dirs: &'a [PathBuf]) -> Vec<&'a Path> {
    let points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split(' ').next() == Some("fuse.strata")).then_some(())?;
            left.split(' ').nth(4)
        })
        .collect();
    dirs.iter()
        .map(PathBuf::as_path)
        .filter(|d| {
            let want = mountinfo_escaped(d);
            let want = want.trim_end_matches('/');
            !points.contains(&want)
        })
        .collect()
}

/// `strata wait-mounts DIR...`: return once every directory is a Strata mount; an error naming those that are
/// not after `--timeout-secs`.
pub async fn wait(a: WaitArgs) -> Result<()> {
    let started = Instant::now();
    let limit = Duration::from_secs(a.timeout_secs);
    let mut said = false;
    loop {
        let info = std::fs::read_to_string("/proc/self/mountinfo")
            .context("reading /proc/self/mountinfo")?;
        let missing = not_mounted(&info, &a.dirs);
        if missing.is_empty() {
            println!(
                "mounted: {}",
                a.dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            return Ok(());
        }
        let names: Vec<String> = missing.iter().map(|d| d.display().to_string()).collect();
        if started.elapsed() >= limit {
            bail!(
                "not Strata mounts after {} s: {} (the operator has the agent of this node mount a DataClaim's \
                 datasets once the pod is bound here: see the DataClaim's events)",
                a.timeout_secs,
                names.join(" ")
            );
        }
        if !said {
            eprintln!("waiting for the Strata mounts on {}", names.join(" "));
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_strata_mounts_at_exactly_the_paths_count() {
        let info = "\
36 25 0:32 / /data/train rw,nosuid,nodev - fuse.strata strata rw,user_id=0,group_id=0
37 25 0:33 / /data/with\\040space rw - fuse.strata strata rw
38 25 0:34 / /data/other rw - fuse.s3fs s3fs rw
39 25 8:1 / /data/val rw - ext4 /dev/vda rw
";
        let dirs: Vec<PathBuf> = [
            "/data/train/",
            "/data/with space",
            "/data/other",
            "/data/val",
            "/data/none",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let missing = not_mounted(info, &dirs);
        assert_eq!(
            missing,
            [
                Path::new("/data/other"),
                Path::new("/data/val"),
                Path::new("/data/none")
            ]
        );
    }

    #[test]
    fn the_holders_command_line_carries_no_token() {
        let args = [
            "mount",
            "--token",
            "T1",
            "loc",
            "--token=T2",
            "/mnt",
            "--",
            "--token",
            "x",
        ]
        .into_iter()
        .map(OsString::from);
        let (rest, token) = without_token(args);
        assert_eq!(token, Some("T2".into()));
        assert_eq!(rest, ["mount", "loc", "/mnt", "--", "--token", "x"]);
    }
}

/// `strata mounter` arguments.
#[derive(clap::Args, Debug)]
pub struct MounterArgs {
    /// The Unix socket to serve (the agents' `[claims] mounter`); its directory is created mode 0700.
    #[arg(long, default_value = "/run/strata/mounter.sock")]
    socket: std::path::PathBuf,
}

/// Serve mount requests until `shutdown` resolves.
pub async fn mounter(
    a: MounterArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding the strata binary")?;
    strata_server::claims::mounter::serve(&a.socket, exe, shutdown)
        .await
        .with_context(|| format!("strata mounter on {}", a.socket.display()))
}

/// `args` without `--token T` / `--token=T`, and the token they named.
fn without_token(args: impl Iterator<Item = OsString>) -> (Vec<OsString>, Option<OsString>) {
    let mut out = Vec::new();
    let mut token = None;
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        if arg == "--token" {
            token = args.next();
        } else if let Some(t) = arg.to_str().and_then(|s| s.strip_prefix("--token=")) {
            token = Some(t.into());
        } else if arg == "--" {
            out.push(arg);
            out.extend(args.by_ref());
        } else {
            out.push(arg);
        }
    }
    (out, token)
}
