//! A claim's mounts: each dataset with a `mount` is mounted read-only (`strata mount claim:<id>/<dataset>`)
//! once it is staged, before the claim says Ready, and unmounted when the claim is released. The other nodes
//! of a multi-node job mount it when their agents are asked (`POST /v1/claims/{id}/attach`, from the claim in
//! the catalog they share); each agent takes down, every few seconds, its mounts of claims released elsewhere
//! ([`detach_released`]).
//!
//! The mount serves exactly the claim's snapshot (the versions admitted, listed by
//! `GET /v1/claims/{id}/objects`), read through this agent. Its files belong to root and to the Unix group
//! named like the claim's team, mode 0440 (directories 0550): the job's users read them, other users of the
//! node do not. A team with no such group cannot have mounts (admission says so). The mount's processes are
//! detached from the agent: a restart of the agent leaves mounts in place (reads wait for it), and release
//! finds them again by their paths. A mount goes only where it hides nothing: an empty or new directory, not
//! a mount point, two levels below `/` at least ([`place`]).

use std::path::{Path, PathBuf};

use strata_claim::ClaimSpec;
use strata_types::{Error, ErrorKind, Result};

use crate::Agent;

/// The gid of Unix group `name` (from `/etc/group`).
fn group_id(name: &str) -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.next()?;
        f.next()?.parse().ok()
    })
}

/// The gid a claim's mounts are readable by, when it has any (and its team's group exists here).
pub(super) fn gid_of(spec: &ClaimSpec) -> Option<u32> {
    if spec.datasets.iter().all(|d| d.mount.is_none()) {
        return None;
    }
    group_id(&spec.team)
}

/// Refuse, at admission, a mount this node cannot make: `field` names it in the error.
pub(super) fn check(spec: &ClaimSpec, location: &str, mount: &str, field: &str) -> Result<()> {
    let unsupported = |why: String| Error::new(ErrorKind::Unsupported, format!("{field}: {why}"));
    if !Path::new("/dev/fuse").exists() {
        return Err(unsupported(
            "this node has no /dev/fuse; leave mount out and read through the cache".into(),
        ));
    }
    if !location.ends_with('/') {
        return Err(Error::invalid_input(format!(
            "{field}: only a prefix (a location ending with '/') can be mounted"
        )));
    }
    place(mount).map_err(|why| Error::invalid_input(format!("{field}: {mount}: {why}")))?;
    if group_id(&spec.team).is_none() {
        return Err(unsupported(format!(
            "no Unix group named {:?} on this node: a mount is readable by the team's group only",
            spec.team
        )));
    }
    Ok(())
}

/// Whether `mount` may be mounted on: absolute, two levels below `/` at least, outside the system's trees, not
/// a mount point, and an empty directory or nothing yet (so a mount hides nothing of the node's).
fn place(mount: &str) -> std::result::Result<(), &'static str> {
    let p = Path::new(mount);
    if !p.is_absolute() || p.components().count() < 3 {
        return Err("a mount must be an absolute path at least two levels below /");
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err("a mount path must not contain '..'");
    }
    const SYSTEM: [&str; 10] = [
        "/proc", "/sys", "/dev", "/etc", "/usr", "/boot", "/bin", "/sbin", "/lib", "/lib64",
    ];
    if SYSTEM.iter().any(|t| p.starts_with(t)) {
        return Err(
            "a mount cannot go under the system's trees (/proc, /sys, /dev, /etc, /usr, ...)",
        );
    }
    let mounted = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if mounted
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(m) == p)
    {
        return Err("something is mounted there already");
    }
    match std::fs::read_dir(p) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err("the directory is not empty (a mount would hide what is in it)");
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => return Err("not a directory the agent can read"),
    }
    Ok(())
}

/// Create `dir` and its missing parents with mode 0755 whatever the agent's umask (0077: its own files are
/// private), so the job's users can reach the mount.
fn make_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let missing: Vec<&Path> = dir.ancestors().take_while(|p| !p.exists()).collect();
    for d in missing.into_iter().rev() {
        std::fs::create_dir(d)?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

fn state_dir(a: &Agent, id: &str, dataset: &str) -> PathBuf {
    a.config()
        .data_dir
        .join("mounts")
        .join(format!("{id}-{dataset}"))
}

/// Mount every dataset of claim `id` that asks for it; the first failure is the error.
pub(super) async fn mount_all(a: &Agent, id: &str, spec: &ClaimSpec) -> Result<()> {
    if spec.datasets.iter().all(|d| d.mount.is_none()) {
        return Ok(());
    }
    let Some(api) = a.api_url.get() else {
        return Err(Error::internal("the agent's API address is not known yet"));
    };
    // The mount reads as the agent's administrator (its process environment is root's alone): what it may
    // read was decided at admission, and it reads only the claim's admitted objects.
    let token = match &a.config().admin_token {
        Some(t) => t.clone(),
        None => {
            let f = crate::control::admin_token_file(&a.config().data_dir);
            std::fs::read_to_string(&f)
                .map_err(|e| Error::from_io(e, f.display()))?
                .trim()
                .to_string()
        }
    };
    let exe = std::env::current_exe()
        .map_err(|e| Error::from_io(e, "the strata binary (to start a mount)"))?;
    for (i, d) in spec.datasets.iter().enumerate() {
        let Some(mount) = &d.mount else { continue };
        if mounted_here(a, mount, id, &d.name) {
            continue; // attached again: already there
        }
        let gid = group_id(&spec.team).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!("no Unix group named {:?} on this node", spec.team),
            )
        })?;
        place(mount)
            .map_err(|why| Error::invalid_input(format!("datasets[{i}].mount: {mount}: {why}")))?;
        make_dirs(Path::new(mount)).map_err(|e| Error::from_io(e, mount))?;
        let req = super::mounter::MountRequest {
            location: format!("claim:{id}/{}", d.name),
            dir: PathBuf::from(mount),
            api: api.clone(),
            data_dir: a.config().data_dir.clone(),
            state_dir: state_dir(a, id, &d.name),
            uid: 0,
            gid,
            mode: "0440".into(),
            token: token.clone(),
            job: Some(spec.job.clone()),
        };
        let done = match &a.config().mounter {
            Some(socket) => super::mounter::mount_via(socket, &req).await,
            None => super::mounter::mount_here(&exe, &req).await,
        };
        done.map_err(|e| Error::new(e.kind(), format!("datasets[{i}].mount: {e}")))?;
        tracing::info!(claim = %id, dataset = %d.name, %mount, "mounted");
    }
    Ok(())
}

/// A field of `/proc/self/mountinfo`, its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The file a mount's server writes in its state directory once it answers (`strata_mount::holder::READY`).
const MOUNT_READY: &str = "ready";

/// Whether claim `id`'s `dataset` is mounted on `path` in this agent's mount namespace: a strata mount is there
/// and the one this agent made for it says it is ready.
fn mounted_here(a: &Agent, path: &str, id: &str, dataset: &str) -> bool {
    if !state_dir(a, id, dataset).join(MOUNT_READY).exists() {
        return false;
    }
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let Some((left, right)) = l.split_once(" - ") else {
                return false;
            };
            let point = left.split(' ').nth(4).map(unescape);
            point.as_deref() == Some(path) && right.split(' ').next() == Some("fuse.strata")
        })
}

/// Take down this node's mounts of claims that are released (by another agent: the staging agent's release
/// unmounts only its own node's) or gone from the catalog, and forget their state. Run every few seconds.
pub(crate) async fn detach_released(a: &Agent) -> Result<u64> {
    let dir = a.config().data_dir.join("mounts");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(0);
    };
    let mut ids: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.split_once('-').map(|(id, _)| id.to_string()))
        .collect();
    ids.sort();
    ids.dedup();
    let mut n = 0;
    for id in ids {
        let rec = match a.catalog().claim(&id).await {
            Ok(r) if r.released_at.is_none() => continue,
            Ok(r) => Some(r),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Some(spec) = rec.and_then(|r| serde_json::from_str::<ClaimSpec>(&r.spec).ok()) {
            unmount_all(&id, &spec);
            n += 1;
        }
        // The listings of a claim that is over are not kept.
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with(&format!("{id}-")) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(n)
}

/// Unmount what [`mount_all`] mounted (lazily: a reader still inside lets go when it is done). Mounts that
/// are not there are skipped.
pub(super) fn unmount_all(id: &str, spec: &ClaimSpec) {
    for d in &spec.datasets {
        let Some(mount) = &d.mount else { continue };
        match rustix::mount::unmount(mount.as_str(), rustix::mount::UnmountFlags::DETACH) {
            Ok(()) => tracing::info!(claim = %id, dataset = %d.name, %mount, "unmounted"),
            // Not mounted (never was, or already gone).
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
            Err(e) => tracing::warn!(claim = %id, %mount, error = %e, "unmounting"),
        }
    }
}
