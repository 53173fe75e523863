//! The few OS facts the agent needs that std does not expose.

use std::path::Path;

/// (usable, available) bytes of the file system holding `path` (`statvfs`), as `df` counts them: usable is
/// used + available, so blocks reserved for root count neither as capacity nor as used
/// ([`strata_types::FsSpace`]).
pub(crate) fn statvfs(path: &Path) -> Option<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let space = strata_types::FsSpace::from_blocks(
        s.blocks() as u64,
        s.blocks_free() as u64,
        s.blocks_available() as u64,
        s.fragment_size() as u64,
    );
    Some((space.usable, space.available))
}
