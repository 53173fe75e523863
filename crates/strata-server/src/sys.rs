//! The few OS facts the agent needs that std does not expose.

use std::path::Path;

/// (total, available) bytes of the file system holding `path` (`statvfs`).
pub(crate) fn statvfs(path: &Path) -> Option<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = s.fragment_size() as u64;
    Some((s.blocks() as u64 * frag, s.blocks_available() as u64 * frag))
}
