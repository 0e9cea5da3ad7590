//! larder's FUSE-free core: the namespace mirror of home, file handles, the read and write paths, and the
//! pipeline of changes to home. It knows nothing of FUSE, of clusters or of banks: those plug into its
//! seams, the [`tier::Tier`]s of the read path, [`coherence::Coherence`] for writes across a cluster,
//! home layers (`larder_home::Layer`), and the serving API ([`serve`]) a peer server adapts.
//!
//! The FUSE adapter calls [`Fs`], a façade over three components (design note 012): the namespace, the
//! data path and the change pipeline. Tests call it directly, without a mount.
//!
//! * **Namespace.** Local inode numbers, persistent, mapped to home paths by (parent inode, name). Listings
//!   create placeholder entries (name and kind only); a lookup fills attributes. Attributes, listings and
//!   negative entries are trusted for the validity lag, then revalidated (a directory whose home version
//!   is unchanged is not listed again).
//! * **Data.** Each version of a file's content has its own cache object, so a version change at home
//!   makes the old cached data unreachable. Reads take blocks from the store or fetch them through the
//!   [`tier`]s (the store, then what the daemon puts between it and home: the peers of `larder-cluster`,
//!   the bank of `larder-bank`; then home), named by portable [`key`]s, one walk per unit however many
//!   readers wait; sequential readers get a growing readahead window, whose runs of blocks walk the tiers
//!   as one and come from home in one ranged read.
//! * **Writes** land in the file's cache object (dirty ranges tracked) and are pushed to home on
//!   `flush`/`fsync`/`release` in write-through (the call returns once home has them); in write-back and
//!   local modes the change is durable in the cache when the call returns and queued in the journal, which
//!   the flushers push to home in order (docs/design/007).
//!
//! Locks: the order is written down once, in docs/design/011-locks-and-the-hit-path.md.

#![deny(unsafe_op_in_unsafe_fn)]

mod changes;
pub mod coherence;
mod data;
mod error;
mod fetch;
mod fs;
mod journal;
#[cfg(test)]
mod journal_model;
pub mod key;
pub mod locks;
mod namespace;
mod pipeline;
mod ranges;
mod readahead;
mod record;
pub mod recovery;
pub mod serve;
mod stamp;
pub mod tier;
mod types;
mod version;

pub use changes::{InGroup, release_freed_memory};
pub use data::DamagedFile;
pub use data::{PIN_SHARE, Residency, describe_residency_error};
pub use error::{FsError, FsResult};
pub use fs::Fs;
pub use namespace::{Atime, AtimePolicy, XattrFlags};
pub use types::{
    Attr, Conflict, ConflictPolicy, DirItem, Drained, Entry, FsConfig, FsStats, Invalidation, JournalStats, OpenReply,
    Prefetch, RefusedChange, VERIFY_AT_OPEN, WriteMode,
};
pub use version::FileVersion;
