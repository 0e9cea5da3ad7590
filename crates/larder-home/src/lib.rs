//! The home: the slow or distant storage that larder caches.
//!
//! Every backend implements [`Home`]. Paths are relative to the home's root (the empty path is the root
//! itself). Cross-cutting concerns (WAN emulation, counters) are [`Layer`]s wrapped around a backend by
//! [`Layered`], which forwards every method in one place. Backends classify their own errors
//! ([`HomeError::is_temporary`]); they never speak errno to callers except through [`HomeError::Os`].

#![deny(unsafe_op_in_unsafe_fn)]

mod error;
mod extents;
#[cfg(feature = "mock")]
mod fault;
mod health;
mod layer;
mod metrics;
mod posix;
#[cfg(feature = "s3")]
mod s3;
mod types;
mod url;
mod wan;

pub use error::{HomeError, HomeResult};
#[cfg(feature = "mock")]
pub use fault::{Fault, FaultLayer};
pub use health::{Health, HealthLayer, unreachable};
pub use layer::{Layer, Layered, OpKind};
pub use metrics::{HomeCounters, MetricsLayer};
pub use posix::PosixHome;
#[cfg(feature = "s3")]
pub use s3::{Checked, MAX_KEY, S3Home, S3Spec, valid_bucket_name};
pub use types::{
    Content, ContentId, DirEntry, FileKind, HomeAttr, HomeLimits, NewFile, Owner, RenameFlags, RewriteBytes, SetAttr,
    StatFs, TimeSet, Version,
};
pub use url::{HomeSpec, OpenedHome, S3Credentials, open_home};
pub use wan::{WanLayer, WanSpec};

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::time::SystemTime;

/// What larder needs from the storage it caches.
///
/// Every call may be slow (a WAN away) and may fail; none may hang forever (backends enforce their own
/// deadline). Calls that change home return the object's attributes afterwards so the cache can record the
/// version it now holds.
pub trait Home: Send + Sync + 'static {
    /// A short human description (a path or URL) for status output and logs.
    fn describe(&self) -> String;

    /// Make sure calls reach what the home's name refers to now. A POSIX home holds a descriptor of its
    /// root directory: when the path names another directory (home was remounted, or something was mounted
    /// over it) or the descriptor no longer answers (a dead mount), it reopens the path. Returns whether
    /// the root was replaced; fails as unreachable when the path cannot be opened. Homes that hold nothing
    /// of the kind have nothing to do.
    fn reconnect(&self) -> HomeResult<bool> {
        Ok(false)
    }

    /// Attributes of one object, not following a final symlink.
    fn stat(&self, path: &Path) -> HomeResult<HomeAttr>;

    /// The entries of a directory, without `.` and `..`, each with its attributes where the backend can
    /// give them in the same call (an object store's listing carries them; a POSIX home reads them at its
    /// side): one listing then answers every lookup and stat in the directory.
    fn list(&self, path: &Path) -> HomeResult<Vec<DirEntry>>;

    /// [`Home::list`], with the directory's own attributes where the backend reads them in the same call
    /// (a POSIX home, from the directory it lists); `None` where it does not.
    fn list_with_own(&self, path: &Path) -> HomeResult<(Option<HomeAttr>, Vec<DirEntry>)> {
        Ok((None, self.list(path)?))
    }

    /// Up to `len` bytes at `offset` of the object at `version`. Short only at end of file. Fails with
    /// [`HomeError::Stale`] when the object is no longer at `version`, so a cached copy is never stitched
    /// together from two versions.
    fn read(&self, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>>;

    /// How every node names the content of the object at `path` at `version` (portable cache keys). The
    /// default names it by path and version, right for homes whose versions are per path (an object
    /// store's ETag); a home with object identities of its own says so.
    fn content_id(&self, path: &Path, version: &Version) -> ContentId {
        ContentId::named(path, version)
    }

    /// The target of a symlink.
    fn readlink(&self, path: &Path) -> HomeResult<Vec<u8>>;

    /// Create an empty regular file; fails with [`HomeError::Exists`] if the name is taken.
    fn create(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr>;

    /// Create a regular file with its mode, owner, time and content, in one call where home can: a POSIX
    /// home opens it once and writes, times and syncs it through that descriptor; an object store uploads
    /// it once, its metadata with it. Fails with [`HomeError::Exists`] if the name is taken. A call cut
    /// short may leave the file holding a prefix of its content. The default makes the calls one by one.
    fn create_file(&self, path: &Path, new: &NewFile<'_>) -> HomeResult<HomeAttr> {
        let made = self.create(path, new.mode, new.owner)?;
        match (new.content, new.mtime) {
            (Some(c), mtime) => self.write(path, c.source, c.ranges, c.size, None, mtime),
            (None, Some(t)) => self.setattr(
                path,
                &SetAttr {
                    mtime: Some(TimeSet::At(t)),
                    ..SetAttr::default()
                },
            ),
            (None, None) => Ok(made),
        }
    }

    /// Create a directory.
    fn mkdir(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr>;

    /// Create a special file (FIFO, socket, device) or an empty regular file.
    fn mknod(&self, path: &Path, mode: u32, rdev: u64, owner: Owner) -> HomeResult<HomeAttr>;

    /// Create a symlink at `path` pointing to `target`.
    fn symlink(&self, target: &[u8], path: &Path, owner: Owner) -> HomeResult<HomeAttr>;

    /// Create a hard link `new` to `existing`; returns the attributes of the linked object.
    fn link(&self, existing: &Path, new: &Path) -> HomeResult<HomeAttr>;

    /// Remove a non-directory.
    fn unlink(&self, path: &Path) -> HomeResult<()>;

    /// Remove an empty directory.
    fn rmdir(&self, path: &Path) -> HomeResult<()>;

    /// Rename `from` to `to`, replacing `to` unless `flags` say otherwise. A missing `from` is
    /// [`HomeError::NotFound`] whatever is at `to`, as with rename(2): a retried rename that had landed
    /// is told apart from a taken target by that answer.
    fn rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()>;

    /// Change attributes (mode, owner, size, times).
    fn setattr(&self, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr>;

    /// Make the object at `path` hold the content of `source` in the byte `ranges` given (the rest is
    /// unchanged) and be `size` bytes long, durably; with `mtime`, modified at that time (where the home
    /// stores times). Holes in `source` are holes at home where the backend can keep them. With `base`,
    /// fail with [`HomeError::Conflict`] unless home is still at that version. Ranges covering all `size`
    /// bytes replace the content whole: a write cut short leaves either the old content or a prefix of the
    /// new, never a mix.
    fn write(
        &self,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
        mtime: Option<SystemTime>,
    ) -> HomeResult<HomeAttr>;

    /// The extended attributes of the object at `path` (not following a final symlink): every name with its
    /// value. [`HomeError::Unsupported`] where home keeps none.
    fn xattrs(&self, path: &Path) -> HomeResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let _ = path;
        Err(HomeError::Unsupported("extended attributes"))
    }

    /// Give the object at `path` the extended attribute `name` with `value`, or take it away (`None`;
    /// taking away one it does not have is no error).
    fn set_xattr(&self, path: &Path, name: &[u8], value: Option<&[u8]>) -> HomeResult<()> {
        let _ = (path, name, value);
        Err(HomeError::Unsupported("extended attributes"))
    }

    /// Whether one object may hold all of `xattrs` at once (names with values), asking home nothing: the
    /// error a [`Home::set_xattr`] leaving the object with them would meet, if its size or names are past
    /// what home stores (`E2BIG`, `ERANGE`, `ENOSPC`, [`HomeError::Unsupported`]).
    fn check_xattrs(&self, xattrs: &[(Vec<u8>, Vec<u8>)]) -> HomeResult<()> {
        let _ = xattrs;
        Err(HomeError::Unsupported("extended attributes"))
    }

    /// Capacity figures of the home.
    fn statfs(&self) -> HomeResult<StatFs>;

    /// For a home whose rewrites move other bytes than the ones the call names (an object store reads an
    /// object's unchanged bytes and uploads whole parts, or copies parts at the server): the bytes its
    /// rewrites sent and received over the link, and those the server copied. `None` elsewhere. Asks home
    /// nothing.
    fn rewrite_bytes(&self) -> Option<RewriteBytes> {
        None
    }

    /// What this home can store (name and path lengths, name encoding, object kinds); asks home nothing.
    fn limits(&self) -> HomeLimits;
}
