//! `strata mount`: a dataset version as a read-only POSIX file system, read through a Strata agent's cache.
//!
//! A mount lists its location once (the version it serves, [`snapshot`]), then answers the kernel's FUSE
//! requests with the `fuser` crate ([`fs`]): names, sizes and times from the listing, bytes through the
//! agent's `GET /v1/read` pinned to the listed ETag ([`reader`]). Unmodified programs (`cp -r`, `find`,
//! numpy, PIL, torchvision's `ImageFolder`) read it as files.
//!
//! It survives a crash of the process serving it: a small holder process keeps the `/dev/fuse` descriptor
//! and starts a new server, which takes the connection over through a relay ([`relay`], [`holder`]). Readers
//! see one slow request, not `Transport endpoint is not connected`.
//!
//! Large files read whole are kept as local hot copies ([`hot`]) that later opens hand to the kernel as
//! backing files ([`passthrough`], Linux 6.9, root): hot reads then run at local-disk speed.
//!
//! Layout: `snapshot` (listing → tree, inode numbers), `reader` (ranges through the agent, chunks,
//! read-ahead), `fs` (the `fuser::Filesystem`), `relay` (`/dev/fuse` ⇄ `fuser`, INIT replay, resend),
//! `holder` (mount, hand the descriptor over, restart the server), `hot` (copies of files read whole),
//! `passthrough` (backing files, the open-handle table kept across servers), `report` (the metadata the
//! mount answers itself, counted and sent to the agent's analytics).

pub mod fs;
pub mod holder;
pub mod hot;
pub mod passthrough;
pub mod reader;
pub mod relay;
pub mod report;
pub mod snapshot;

pub use fs::Ownership;
pub use holder::{MountConfig, READY, hold, list, serve};
pub use relay::Stopped;
pub use snapshot::{Snapshot, Tree};
