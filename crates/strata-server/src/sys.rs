//! The few OS facts the agent needs that std does not expose.

use std::path::Path;

/// The space of the file system holding `path` (`statvfs`), as `df` counts it ([`strata_types::FsSpace`]).
pub(crate) fn statvfs(path: &Path) -> Option<strata_types::FsSpace> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    Some(strata_types::FsSpace::from_blocks(
        s.blocks() as u64,
        s.blocks_free() as u64,
        s.blocks_available() as u64,
        s.fragment_size() as u64,
    ))
}
