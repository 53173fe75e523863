//! A mount's two processes: the holder, which makes the mount and keeps its `/dev/fuse` descriptor for as long
//! as it is mounted, and the server it starts (again, after a crash), which answers the kernel.
//!
//! The holder ([`hold`]) lists the location once ([`crate::snapshot`]), writes the listing and the mount's
//! settings into its state directory, opens `/dev/fuse` and mounts it (`mount(2)` as root, as a node agent
//! is; a user's mount goes through the setuid `fusermount3`, which hands the descriptor back), and listens on
//! `holder.sock` there. Each server ([`serve`]) connects, receives the
//! descriptor (`SCM_RIGHTS`) and serves through the relay ([`crate::relay`]). When a server dies the holder
//! starts another, which takes over the connection; when the file system is unmounted the server exits 0
//! and the holder with it. Killing the holder itself (`SIGTERM`) unmounts.
//!
//! The holder does no I/O on the mount's behalf and holds no state a crash could lose; the server holds all
//! the code that could fail.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_client::{AgentClient, ClientOptions};
use strata_types::{Error, ErrorKind, Result};

use crate::fs::{Ownership, StrataFs, now_unix};
use crate::hot::Hot;
use crate::passthrough::{self, Handles};
use crate::reader::Reader;
use crate::relay::{Relay, Stopped};
use crate::snapshot::{Object, Snapshot, Tree, normalize_location};

/// What a mount serves and how; saved as `mount.json` in its state directory for its servers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountConfig {
    /// The location mounted (`NAME/prefix/`, a URL under a configured backend, ...).
    pub location: String,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// The agent's API (`http://127.0.0.1:7070`).
    pub api: String,
    /// Owner, group and mode of the files.
    pub ownership: Ownership,
    /// Let users other than the mount's owner in (`allow_other`; the mode bits still decide, as
    /// `default_permissions` is always on).
    pub allow_other: bool,
    /// How long one read waits for an agent that is away before it fails with `EIO`.
    pub agent_wait_secs: u64,
    /// fuser threads answering the kernel.
    pub threads: usize,
    /// Where hot copies of large files are kept for passthrough ([`crate::hot`]); none: no copies.
    #[serde(default)]
    pub hot_dir: Option<PathBuf>,
    /// At most this many bytes of hot copies in `hot_dir` (0: no copies).
    #[serde(default)]
    pub hot_bytes: u64,
    /// The job the mount's reads and metadata operations are counted to (`x-strata-job`).
    #[serde(default)]
    pub job: Option<String>,
}

/// Files in a state directory.
const CONFIG: &str = "mount.json";
const SNAPSHOT: &str = "snapshot.json";
const SOCKET: &str = "holder.sock";
/// Written by a server once the kernel's handshake is done: the mount can be used.
pub const READY: &str = "ready";

fn client(api: &str, token: Option<String>, job: Option<String>) -> Result<AgentClient> {
    AgentClient::new(
        api,
        &ClientOptions {
            token,
            job,
            ..ClientOptions::default()
        },
    )
}

/// The objects under `location`, listed through the agent at `client` (`GET /v1/list`); for
/// `claim:<id>/<dataset>`, the versions that claim admitted for that dataset (`GET /v1/claims/{id}/objects`),
/// read from the dataset's location.
pub async fn list(client: &AgentClient, location: &str) -> Result<Snapshot> {
    let claim = match location.strip_prefix("claim:") {
        Some(rest) => {
            let (id, dataset) = rest.split_once('/').ok_or_else(|| {
                Error::invalid_input(format!(
                    "{location:?}: a claim's dataset is claim:<id>/<dataset>"
                ))
            })?;
            Some((id.to_string(), dataset.to_string()))
        }
        None => None,
    };
    let mut location = match &claim {
        Some(_) => String::new(),
        None => normalize_location(location)?,
    };
    let mut objects = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = match &claim {
            Some((id, dataset)) => {
                let q = strata_api::claims::ObjectsQuery {
                    dataset: dataset.clone(),
                    after: after.clone(),
                    limit: None,
                };
                let p = client
                    .call::<strata_api::claims::ClaimObjects>(&[id], &q, &())
                    .await?;
                location = normalize_location(&p.location)?;
                strata_api::data::ListPage {
                    objects: p.objects,
                    next: p.next,
                }
            }
            None => {
                let q = strata_api::data::ListQuery {
                    location: location.clone(),
                    after: after.clone(),
                    limit: None,
                };
                client.call::<strata_api::data::List>(&[], &q, &()).await?
            }
        };
        objects.extend(page.objects.into_iter().map(|o| Object {
            name: o.name,
            size: o.size,
            etag: o.etag,
            mtime: o.last_modified_unix,
        }));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    Ok(Snapshot {
        location,
        taken_unix: now_unix(),
        objects,
    })
}

/// The real user and group ids of this process.
pub fn caller_ids() -> (u32, u32) {
    (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    )
}

fn io(context: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::from_io(e, context)
}

/// Make the mount described by `cfg` with the listing `snapshot`, and hold it until it is unmounted or
/// `shutdown` resolves (then unmount). `server` is the command that runs [`serve`] for a state directory
/// (the `strata` binary and its arguments; the state directory is appended); `token` is passed to it in
/// `STRATA_TOKEN`.
pub async fn hold(
    cfg: MountConfig,
    snapshot: Snapshot,
    state: &Path,
    server: &[std::ffi::OsString],
    token: Option<String>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    prepare_state(state)?;
    std::fs::write(
        state.join(CONFIG),
        serde_json::to_vec(&cfg).map_err(|e| Error::internal(e.to_string()))?,
    )
    .map_err(io(state.display()))?;
    snapshot.save(&state.join(SNAPSHOT))?;
    let as_root = rustix::process::geteuid().is_root();
    let dev = if as_root {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| {
                Error::from_io(
                    e,
                    "/dev/fuse (is the fuse module loaded? apt-get install fuse3)",
                )
            })?;
        let dev = OwnedFd::from(dev);
        mount(&cfg, &snapshot.location, &dev)?;
        dev
    } else {
        mount_as_user(&cfg, &snapshot.location)?
    };
    let listener =
        UnixListener::bind(state.join(SOCKET)).map_err(io(state.join(SOCKET).display()))?;
    listener
        .set_nonblocking(true)
        .map_err(io("the holder's socket"))?;
    let listener =
        tokio::net::UnixListener::from_std(listener).map_err(io("the holder's socket"))?;
    let result = supervise(&cfg, state, server, token, &dev, listener, shutdown).await;
    unmount(&cfg.mountpoint);
    let _ = std::fs::remove_file(state.join(SOCKET));
    let _ = std::fs::remove_file(state.join(READY));
    result
}

/// An empty state directory only its owner can read (the listing names every key).
fn prepare_state(state: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state)
        .map_err(io(state.display()))?;
    std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o700))
        .map_err(io(state.display()))?;
    for f in [CONFIG, SNAPSHOT, SOCKET, READY, "init.bin", "init.tmp"] {
        match std::fs::remove_file(state.join(f)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::from_io(e, state.join(f).display())),
        }
    }
    Ok(())
}

fn mount(cfg: &MountConfig, location: &str, dev: &OwnedFd) -> Result<()> {
    use rustix::mount::MountFlags;
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        dev.as_raw_fd(),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    if cfg.allow_other {
        data.push_str(",allow_other");
    }
    let data = std::ffi::CString::new(data).map_err(|e| Error::internal(e.to_string()))?;
    // The source names the location; mount(8) shows it. Commas would split the option list of fusermount,
    // not of mount(2), so the location can be given as it is.
    let source = format!("strata:{location}");
    rustix::mount::mount(
        source.as_str(),
        &cfg.mountpoint,
        "fuse.strata",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::RDONLY | MountFlags::NOATIME,
        data.as_c_str(),
    )
    .map_err(|e| {
        let hint = if e == rustix::io::Errno::PERM {
            " (mounting needs root or CAP_SYS_ADMIN, as a node agent has)"
        } else {
            ""
        };
        Error::new(
            if e == rustix::io::Errno::PERM {
                ErrorKind::PermissionDenied
            } else {
                ErrorKind::Io
            },
            format!(
                "mounting {} on {}: {e}{hint}",
                location,
                cfg.mountpoint.display()
            ),
        )
    })
}

/// The program that mounts and unmounts FUSE file systems for users (setuid root; Debian's `fuse3`).
const FUSERMOUNT: &str = "fusermount3";

/// Mount as a user without `CAP_SYS_ADMIN`: `fusermount3` opens `/dev/fuse`, mounts it with the user's ids,
/// and hands the descriptor back over the socket named by `_FUSE_COMMFD` (libfuse's protocol).
fn mount_as_user(cfg: &MountConfig, location: &str) -> Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair().map_err(io("a socket for fusermount3"))?;
    // fusermount3 inherits its end.
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty())
        .map_err(|e| Error::from_io(e.into(), "a socket for fusermount3"))?;
    // fusermount3 splits options at commas, but takes `\,` and `\\` in fsname as they are.
    let fsname = format!("strata:{location}")
        .replace('\\', "\\\\")
        .replace(',', "\\,");
    let mut opts =
        format!("ro,nosuid,nodev,noatime,default_permissions,subtype=strata,fsname={fsname}");
    if cfg.allow_other {
        opts.push_str(",allow_other");
    }
    let out = std::process::Command::new(FUSERMOUNT)
        .arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(&cfg.mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    drop(theirs);
    let out = out.map_err(|e| {
        Error::from_io(
            e,
            "running fusermount3 to mount as a user (apt-get install fuse3)",
        )
    })?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let kind = if why.contains("not permitted")
            || why.contains("Permission denied")
            || why.contains("allow_other")
        {
            ErrorKind::PermissionDenied
        } else {
            ErrorKind::Io
        };
        let hint = if why.contains("allow_other") {
            " (a user's allow_other needs user_allow_other in /etc/fuse.conf)"
        } else if why.contains("/dev/fuse") {
            " (users open /dev/fuse themselves: it must be crw-rw-rw-, as udev makes it)"
        } else {
            ""
        };
        return Err(Error::new(
            kind,
            format!(
                "mounting {location} on {}: {why}{hint}",
                cfg.mountpoint.display()
            ),
        ));
    }
    recv_fd(&ours).map_err(|e| e.context("fusermount3 mounted but sent no /dev/fuse descriptor"))
}

/// Take the mount at `mountpoint` down (lazily: open files keep working until closed): `umount2` as root,
/// `fusermount3 -u -z` as a user. Nothing mounted there is no error.
pub fn unmount(mountpoint: &Path) {
    if rustix::process::geteuid().is_root() {
        if let Err(e) = rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH)
            && e != rustix::io::Errno::INVAL
        {
            tracing::warn!(error = %e, mountpoint = %mountpoint.display(), "unmounting");
        }
        return;
    }
    match std::process::Command::new(FUSERMOUNT)
        .args(["-u", "-z", "-q", "--"])
        .arg(mountpoint)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, mountpoint = %mountpoint.display(), "running fusermount3 -u")
        }
    }
}

/// Start servers until one reports the file system unmounted, or `shutdown`.
async fn supervise(
    cfg: &MountConfig,
    state: &Path,
    server: &[std::ffi::OsString],
    token: Option<String>,
    dev: &OwnedFd,
    listener: tokio::net::UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    let mut starts: Vec<Instant> = Vec::new();
    loop {
        // A server that keeps dying is started at most 5 times a minute.
        starts.retain(|t| t.elapsed() < Duration::from_secs(60));
        if starts.len() >= 5 {
            tracing::error!(
                "the mount's server died 5 times in a minute; waiting before the next start"
            );
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                _ = &mut shutdown => return Ok(()),
            }
            starts.clear();
        }
        starts.push(Instant::now());
        let (prog, args) = server
            .split_first()
            .ok_or_else(|| Error::internal("no server command"))?;
        let mut cmd = tokio::process::Command::new(prog);
        cmd.args(args).arg(state).kill_on_drop(true);
        if let Some(t) = &token {
            cmd.env("STRATA_TOKEN", t);
        }
        let mut child = cmd.spawn().map_err(io("starting the mount's server"))?;
        // Hand the descriptor to the server that connects (only ours can: the directory is 0700).
        let handed = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(30), listener.accept()) => match r {
                Ok(Ok((stream, _))) => {
                    let stream = stream.into_std().map_err(io("the server's connection"))?;
                    stream.set_nonblocking(false).map_err(io("the server's connection"))?;
                    send_fd(&stream, dev)
                }
                Ok(Err(e)) => Err(Error::from_io(e, "accepting the mount's server")),
                Err(_) => Err(Error::new(ErrorKind::Timeout, "the mount's server did not connect in 30 s")),
            },
            status = child.wait() => Err(Error::new(ErrorKind::Internal, format!("the mount's server exited before it connected: {status:?}"))),
            _ = &mut shutdown => { let _ = child.kill().await; return Ok(()); }
        };
        if let Err(e) = handed {
            tracing::error!(error = %e, "starting the mount's server");
            let _ = child.kill().await;
            continue;
        }
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(io("waiting for the mount's server"))?;
                if status.success() {
                    tracing::info!(mountpoint = %cfg.mountpoint.display(), "unmounted");
                    return Ok(());
                }
                tracing::warn!(?status, "the mount's server died; starting another, which takes over the mount");
            }
            _ = &mut shutdown => {
                // Unmount first: the server then sees the connection end and exits by itself.
                unmount(&cfg.mountpoint);
                if tokio::time::timeout(Duration::from_secs(5), child.wait()).await.is_err() {
                    let _ = child.kill().await;
                }
                return Ok(());
            }
        }
    }
}

fn send_fd(stream: &UnixStream, fd: &OwnedFd) -> Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    let fds = [fd.as_fd()];
    control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(
        stream,
        &[IoSlice::new(b"F")],
        &mut control,
        rustix::net::SendFlags::empty(),
    )
    .map_err(|e| Error::from_io(e.into(), "handing /dev/fuse to the mount's server"))?;
    Ok(())
}

fn recv_fd(stream: &UnixStream) -> Result<OwnedFd> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        rustix::net::RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| Error::from_io(e.into(), "receiving /dev/fuse from the mount's holder"))?;
    for msg in control.drain() {
        if let rustix::net::RecvAncillaryMessage::ScmRights(mut fds) = msg
            && let Some(fd) = fds.next()
        {
            return Ok(fd);
        }
    }
    Err(Error::internal("the mount's holder sent no descriptor"))
}

/// Fill `slot` with the mount's hot copies if they are configured and the connection takes backing files
/// (`CAP_SYS_ADMIN`, Linux 6.9, negotiated at `INIT`); whether it did.
fn start_hot_copies(
    cfg: &MountConfig,
    state: &Path,
    relay: &Relay,
    location: &str,
    slot: &OnceLock<Arc<Hot>>,
) -> bool {
    let Some(dir) = cfg.hot_dir.as_ref().filter(|_| cfg.hot_bytes > 0) else {
        return false;
    };
    if !rustix::process::geteuid().is_root() {
        tracing::info!(
            "no FUSE passthrough for a user's mount (it needs CAP_SYS_ADMIN): no hot copies"
        );
        return false;
    }
    // The kernel takes backing files once it has the handshake's answer, which the relay may still be
    // forwarding when fuser's handshake returns: a refusal is tried again for a moment.
    let started = Instant::now();
    loop {
        match passthrough::probe(relay.dev(), &state.join(SNAPSHOT)) {
            Ok(()) => break,
            Err(e)
                if e.raw_os_error() == Some(libc::EPERM)
                    && started.elapsed() < Duration::from_secs(3) =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::info!(error = %e, "no FUSE passthrough here (Linux 6.9 needed): no hot copies");
                return false;
            }
        }
    }
    match Hot::new(dir, cfg.hot_bytes, &cfg.api, location) {
        Ok(hot) => {
            let _ = slot.set(Arc::new(hot));
            true
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "the hot-copy directory is unusable: no hot copies");
            false
        }
    }
}

/// Serve the mount whose state directory is `state` (the holder starts this), until it is unmounted
/// (`Ok(Stopped::Unmounted)`). The token is read from `STRATA_TOKEN`.
pub fn serve(state: &Path) -> Result<Stopped> {
    let cfg: MountConfig = serde_json::from_slice(
        &std::fs::read(state.join(CONFIG)).map_err(io(state.join(CONFIG).display()))?,
    )
    .map_err(|e| Error::new(ErrorKind::Corrupt, format!("{CONFIG}: {e}")))?;
    let snapshot = Snapshot::load(&state.join(SNAPSHOT))?;
    let stream =
        UnixStream::connect(state.join(SOCKET)).map_err(io(state.join(SOCKET).display()))?;
    let dev = recv_fd(&stream)?;
    drop(stream);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("strata-mount")
        .enable_all()
        .build()
        .map_err(io("the mount's runtime"))?;
    let token = strata_client::token::from_env();
    let client = client(&cfg.api, token, cfg.job.clone())?;
    let tree = Arc::new(Tree::build(snapshot));
    if tree.skipped > 0 {
        tracing::warn!(
            skipped = tree.skipped,
            examples = ?tree.skipped_examples,
            "objects whose keys cannot be paths are not in the mount"
        );
    }
    let reader = Arc::new(Reader::new(
        client.clone(),
        tree.snapshot.location.clone(),
        Duration::from_secs(cfg.agent_wait_secs),
    ));
    let resuming = Relay::resuming(state);
    let (relay, far) = Relay::new(dev, state)?;
    let relay = Arc::new(relay);
    let hot_slot = reader.hot_slot();
    let location = tree.snapshot.location.clone();
    let mut fs = StrataFs::new(
        tree,
        reader,
        rt.handle().clone(),
        cfg.ownership,
        relay.max_io(),
    );
    {
        let _enter = rt.enter();
        crate::report::start(fs.counts(), client, location.clone());
    }
    // Counted from the first open on, before the kernel can send one (passthrough or not is decided later).
    let handles = match Handles::open(state, resuming, relay.dev_shared()) {
        Ok(h) => {
            let h = Arc::new(h);
            fs = fs.with_passthrough(h.clone(), hot_slot.clone());
            Some(h)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no handle table: no passthrough");
            None
        }
    };
    let mut fcfg = fuser::Config::default();
    fcfg.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::DefaultPermissions,
    ];
    fcfg.acl = if cfg.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    fcfg.n_threads = Some(cfg.threads.max(1));
    let acl = fcfg.acl;
    let relaying = if resuming {
        relay.replay_init()?;
        None
    } else {
        let r = relay.clone();
        Some(std::thread::spawn(move || r.run()))
    };
    let session = fuser::Session::from_fd(fs, far, acl, fcfg)
        .map_err(|e| Error::from_io(e, "the FUSE handshake"))?;
    let relaying = match relaying {
        Some(h) => h,
        None => {
            relay.drop_init_answer()?;
            let r = relay.clone();
            std::thread::spawn(move || r.run())
        }
    };
    let _enter = rt.enter();
    let passthrough = start_hot_copies(&cfg, state, &relay, &location, &hot_slot);
    if let (Some(hot), Some(handles)) = (hot_slot.get(), handles) {
        // A copy in place with no handle reading through the page cache: the file's pages go now, not in
        // the next (passthrough) open ([`Handles::drop_pages`]).
        hot.on_placed(move |ino| {
            if !handles.cached_open(ino) {
                handles.drop_pages(ino);
            }
        });
    }
    drop(_enter);
    std::fs::write(state.join(READY), b"").map_err(io(state.join(READY).display()))?;
    tracing::info!(
        passthrough,
        mountpoint = %cfg.mountpoint.display(),
        resumed = resuming,
        max_io = relay.max_io(),
        "serving"
    );
    let _session = session
        .spawn()
        .map_err(|e| Error::from_io(e, "starting the FUSE session"))?;
    let stopped = relaying
        .join()
        .map_err(|_| Error::internal("the FUSE relay panicked"))?;
    rt.shutdown_background();
    Ok(stopped)
}
