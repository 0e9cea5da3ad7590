//! Values the core hands to its callers.

use std::ffi::OsString;
use std::time::{Duration, SystemTime};

use larder_home::FileKind;

/// Settings of the core.
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// How long attributes, listings and negative entries are trusted before home is asked again
    /// (0: on every open and lookup).
    pub validity_lag: Duration,
    /// Largest readahead window for a sequential reader, in bytes.
    pub readahead_max: u64,
    /// Threads fetching readahead blocks from home.
    pub readahead_threads: usize,
    /// Refuse every change.
    pub read_only: bool,
    /// Give created objects the caller's uid/gid (needs a root daemon).
    pub set_owner: bool,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            validity_lag: Duration::from_secs(15),
            readahead_max: 16 << 20,
            readahead_threads: 4,
            read_only: false,
            set_owner: false,
        }
    }
}

/// Attributes as the file system presents them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    pub size: u64,
    pub blocks: u64,
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// A looked-up entry: attributes and how long the kernel may keep them.
#[derive(Clone, Debug)]
pub struct Entry {
    pub attr: Attr,
    pub ttl: Duration,
}

/// One directory entry of a listing.
#[derive(Clone, Debug)]
pub struct DirItem {
    pub ino: u64,
    pub kind: FileKind,
    pub name: OsString,
}

/// The answer to an open.
#[derive(Clone, Copy, Debug)]
pub struct OpenReply {
    pub fh: u64,
    /// The kernel's page cache still holds this version: keep it.
    pub keep_cache: bool,
}

/// Figures of the core for status output.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsStats {
    pub inodes: u64,
    pub open_handles: u64,
    pub dirty_files: u64,
    pub readahead_blocks: u64,
}
