//! Values the core hands to its callers.

use std::ffi::OsString;
use std::path::PathBuf;
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
    /// Concurrent home requests bringing in the blocks of large files ahead of their readers.
    pub ingest_streams: usize,
    /// What a read of a large file brings in besides the blocks asked for.
    pub prefetch: Prefetch,
    /// Files at most this large are fetched (and kept, and evicted) whole.
    pub small_file_threshold: u64,
    /// How changes reach home (write-back by default, as the command line's default).
    pub write_mode: WriteMode,
    /// How long a change waits in the journal before it is pushed (write-back).
    pub sync_lag: Duration,
    /// Most changes pushed in parallel (write-back): the ceiling of the pushers' window.
    pub flush_threads: usize,
    /// What happens when home changed an object that has local changes.
    pub conflict_policy: ConflictPolicy,
    /// Where `home-wins` keeps the cache's versions, and the list of conflicts lives.
    pub conflicts_dir: PathBuf,
    /// This node's name, used in conflict file names.
    pub host: String,
    /// Give created objects the caller's uid/gid (needs a root daemon).
    pub set_owner: bool,
    /// Offer files that are whole in the cache to the kernel for direct reading (FUSE passthrough).
    pub passthrough: bool,
    /// The home's name in the cache keys that nodes share (design note 010); `None`: its URL. Nodes that
    /// reach one home by different URLs (or different homes by one URL) must set it.
    pub home_id: Option<String>,
    /// Most files (and links) kept in memory beside directories and what changes, opens or pushes hold:
    /// past it, the kernel is asked to forget some, and they leave memory for the index (0: no limit).
    pub max_inodes: usize,
    /// Most bytes of a cache file not checked against their checksums since the start that an open checks
    /// before the kernel may read the file directly (passthrough); past it the daemon serves that open,
    /// and the file is checked in the background (`integrity.rs`).
    pub verify_at_open: u64,
    /// When reads move access times (`mount -o relatime|strictatime|noatime,nodiratime`).
    pub atime: crate::Atime,
}

/// Most unverified bytes an open checks before it returns, by default ([`crate::FsConfig::verify_at_open`]);
/// an object with more is checked in the background (see the module doc). At the cache disk's
/// 2.5–3 GB/s, about 0.1 s.
pub const VERIFY_AT_OPEN: u64 = 256 << 20;

/// How changes reach home (per mount).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Every change is refused with `EROFS`.
    ReadOnly,
    /// A change returns once home has it.
    WriteThrough,
    /// A change returns once it is durable in the cache; it reaches home after the sync lag, in order.
    WriteBack,
    /// Changes stay in the cache and never reach home (scratch space).
    Local,
}

impl WriteMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMode::ReadOnly => "read-only",
            WriteMode::WriteThrough => "write-through",
            WriteMode::WriteBack => "write-back",
            WriteMode::Local => "local",
        }
    }

    /// Changes are accepted while home is away (queued until it is back).
    pub fn works_offline(self) -> bool {
        matches!(self, WriteMode::WriteBack | WriteMode::Local)
    }

    /// Changes are accepted at all.
    pub fn accepts_changes(self) -> bool {
        self != WriteMode::ReadOnly
    }

    /// A change is acknowledged once home has it (else once it is durable in the cache and queued).
    pub fn acknowledges_from_home(self) -> bool {
        self == WriteMode::WriteThrough
    }

    /// Changes go to home at all: flushers run.
    pub fn pushes(self) -> bool {
        matches!(self, WriteMode::WriteBack | WriteMode::WriteThrough)
    }

    /// Changes stay in the cache for good: the journal never empties.
    pub fn keeps_changes(self) -> bool {
        self == WriteMode::Local
    }

    /// Dirty data near the cache's capacity can be sent home early to make room (write-back). Write-through
    /// sends it at the next close or fsync anyway; local mode never does.
    pub fn pushes_to_make_room(self) -> bool {
        self == WriteMode::WriteBack
    }

    /// What a change creates shows home's times, and directories whose entries changed are asked again
    /// (write-through), rather than the mount's own times kept until home has them too.
    pub fn shows_home_times(self) -> bool {
        self == WriteMode::WriteThrough
    }
}

/// What a read of a large file brings in ahead of its reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// A readahead window that doubles on each sequential read, up to the readahead limit.
    Sequential,
    /// The first read of a file queues every block of it.
    WholeFile,
}

impl Prefetch {
    pub fn as_str(self) -> &'static str {
        match self {
            Prefetch::Sequential => "sequential",
            Prefetch::WholeFile => "whole-file",
        }
    }
}

/// What a push does when home changed the object since the version the local changes were made on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictPolicy {
    /// Home's version stays; the cache's is written beside it as `NAME.conflict-HOST-TIMESTAMP`.
    KeepBoth,
    /// The cache's version replaces home's.
    CacheWins,
    /// Home's version stays; the cache's is kept in the cache directory's conflicts area.
    HomeWins,
}

impl ConflictPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictPolicy::KeepBoth => "keep-both",
            ConflictPolicy::CacheWins => "cache-wins",
            ConflictPolicy::HomeWins => "home-wins",
        }
    }
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            validity_lag: Duration::from_secs(15),
            readahead_max: 128 << 20,
            ingest_streams: 8,
            prefetch: Prefetch::Sequential,
            small_file_threshold: 256 << 10,
            write_mode: WriteMode::WriteBack,
            sync_lag: Duration::from_secs(5),
            flush_threads: 64,
            conflict_policy: ConflictPolicy::KeepBoth,
            conflicts_dir: std::env::temp_dir().join("larder-conflicts"),
            host: "localhost".into(),
            set_owner: false,
            passthrough: true,
            home_id: None,
            max_inodes: 131_072,
            verify_at_open: VERIFY_AT_OPEN,
            atime: crate::Atime::default(),
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

/// Something the kernel caches that larder learned is out of date at home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// The file's data and attributes (home has a new version).
    Inode(u64),
    /// The file's attributes only (its access time moved while the kernel may hold the old one).
    Attr(u64),
    /// A name in a directory (home no longer has it, or has something else there).
    Entry(u64, OsString),
}

/// The answer to an open.
#[derive(Clone, Copy, Debug)]
pub struct OpenReply {
    pub fh: u64,
    /// The kernel's page cache still holds this version: keep it.
    pub keep_cache: bool,
    /// The file is whole and clean in the cache and opened for reading: the kernel may read it from the
    /// cache file directly (see [`crate::Fs::passthrough`]).
    pub passthrough: bool,
}

/// Figures of the core for status output.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsStats {
    /// Inodes in memory, and over the mount's life those that left it and those loaded back from the index.
    pub inodes: u64,
    pub inodes_reclaimed: u64,
    pub inodes_reloaded: u64,
    /// Entries the kernel was asked to forget to keep memory within `--max-inodes`.
    pub inodes_trimmed: u64,
    pub open_handles: u64,
    pub dirty_files: u64,
    pub readahead_blocks: u64,
    /// Read requests served, their bytes, and the time spent serving them.
    pub reads: u64,
    pub read_bytes: u64,
    pub read_seconds: f64,
    /// Bytes readers got from the local cache and from home, and the blocks they waited for home to give.
    pub bytes_from_cache: u64,
    pub bytes_from_home: u64,
    pub home_waits: u64,
    /// Of the listings the namespace made at home ([`crate::Fs::home_meta_calls`]), those made to answer
    /// a lookup and to revalidate a file by its directory.
    pub listings_for_lookups: u64,
    pub listings_for_revalidation: u64,
    /// Listings made ahead of a walk of a tree, to revalidate its directories in parallel.
    pub listings_ahead: u64,
}

/// The write-back journal, for status output.
#[derive(Clone, Copy, Debug, Default)]
pub struct JournalStats {
    pub pending_ops: u64,
    pub dirty_bytes: u64,
    pub oldest_age_seconds: f64,
    pub conflicts: u64,
    /// Ops waiting to retry after home refused them.
    pub failed_ops: u64,
    pub home_online: bool,
}

/// How [`crate::Fs::drain`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drained {
    /// Home has every change.
    Empty,
    /// Home refused some changes (tried again at the drain's start); nothing else can be pushed until
    /// they are taken or set aside.
    Refused,
    /// Changes still wait (the timeout passed, home is away, or the mode does not push).
    Waiting,
}

/// A queued change home refused, as `larder status` and `larder drain` name it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefusedChange {
    /// The operation (create, mkdir, data, rename, ...).
    pub op: String,
    /// Its home path.
    pub path: String,
    /// Home's answer at the last attempt.
    pub error: String,
    /// Times home refused it so far.
    pub attempts: u32,
}

/// One conflict, as `larder conflicts` lists it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Conflict {
    /// UTC time, RFC 3339.
    pub time: String,
    /// The home path whose change conflicted.
    pub path: String,
    pub policy: String,
    /// Where the cache's version went: a home path (keep-both), a local file (home-wins), or home's path.
    pub kept_at: String,
    /// Whether every byte of the cache's version was in the cache (else missing blocks read as zeros).
    pub complete: bool,
    pub detail: String,
}
