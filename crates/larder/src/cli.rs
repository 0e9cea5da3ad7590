//! The command line: a view of the configuration, with a sane default for every knob.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use larder_home::WanSpec;

use crate::units::{parse_duration, parse_size, parse_wan};

#[derive(Parser, Debug)]
#[command(
    name = "larder",
    version,
    about = "A persistent caching file system in front of slow or distant storage"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Mount HOME (a directory, file:// or s3://bucket/prefix URL) at MOUNTPOINT, cached on local disk.
    Mount(Box<MountArgs>),
    /// Show a mount's counters (a table, or JSON with --json).
    Status(StatusArgs),
    /// Unmount and wait for the daemon to exit (refused while changes wait for home, unless --drain or
    /// --leave-pending).
    Unmount(UnmountArgs),
    /// Push every queued change to home now and wait until home has them all.
    Drain(DrainArgs),
    /// List the conflicts this mount recorded (home changed a file that had local changes).
    Conflicts(ConflictsArgs),
    /// Bring files into the cache now (a directory: the files in it; with --recursive, everything below).
    Prefetch(ResidencyArgs),
    /// Bring files into the cache and keep them there: never evicted, a new version from home fetched.
    Pin(ResidencyArgs),
    /// Let pinned files be evicted again.
    Unpin(ResidencyArgs),
    /// Drop the cached data of files now (changes not yet at home, and pinned files, stay).
    Evict(ResidencyArgs),
    /// Build a demo home, mount it behind an emulated slow link, read it cold then warm.
    Demo(DemoArgs),
}

fn block_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if !(4096..=(64 << 20)).contains(&v) || !v.is_power_of_two() {
        return Err(format!(
            "block size must be a power of two between 4KiB and 64MiB, not '{s}'"
        ));
    }
    Ok(v)
}

fn write_mode(s: &str) -> Result<larder_fs::WriteMode, String> {
    larder_fs::WriteMode::parse(s)
}

fn conflict_policy(s: &str) -> Result<larder_fs::ConflictPolicy, String> {
    larder_fs::ConflictPolicy::parse(s)
}

fn prefetch(s: &str) -> Result<larder_fs::Prefetch, String> {
    larder_fs::Prefetch::parse(s)
}

fn eviction(s: &str) -> Result<larder_cache::Eviction, String> {
    larder_cache::Eviction::parse(s)
}

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// The home: a directory path, file:// URL or s3://bucket/prefix URL.
    pub home: String,
    /// Where to mount (an empty directory).
    pub mountpoint: PathBuf,
    /// Cache directory [default: $XDG_CACHE_HOME/larder/<hash>, or /var/cache/larder/<hash> for root].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes of file data to keep cached.
    #[arg(long, default_value = "10GiB", value_parser = parse_size)]
    pub cache_size: u64,
    /// How long cached attributes and listings are trusted before home is asked again (0: every open).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub validity_lag: Duration,
    /// Unit of fetching and eviction for large files.
    #[arg(long, default_value = "1MiB", value_parser = block_size)]
    pub block_size: u64,
    /// Largest readahead window for sequential readers.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    pub readahead: u64,
    /// Concurrent home requests bringing in the blocks of large files ahead of their readers.
    #[arg(long, default_value_t = 8)]
    pub ingest_streams: usize,
    /// What a read of a large file brings in ahead of it: sequential (a readahead window that doubles on
    /// each sequential read, up to --readahead) or whole-file (the first read queues every block).
    #[arg(long, default_value = "sequential", value_parser = prefetch)]
    pub prefetch: larder_fs::Prefetch,
    /// Files at most this large are fetched, kept and evicted whole; larger ones per block.
    #[arg(long, default_value = "256KiB", value_parser = parse_size)]
    pub small_file_threshold: u64,
    /// Keep a copy per file even when small files are identical (by default clean small files with the
    /// same bytes share one copy in the cache).
    #[arg(long)]
    pub no_dedup: bool,
    /// Eviction policy over cache units: s3fifo (scan-resistant, default) or lru (plain least-recently-used,
    /// a baseline for benchmarks).
    #[arg(long, default_value = "s3fifo", value_parser = eviction)]
    pub eviction: larder_cache::Eviction,
    /// Serve every read through the daemon, even of files whole in the cache (by default, on read-only
    /// mounts, the kernel reads those from the cache file directly, with FUSE passthrough, where the
    /// kernel offers it).
    #[arg(long)]
    pub no_passthrough: bool,
    /// Emulate a slow link to home, e.g. latency=20ms,bandwidth=50MiB/s.
    #[arg(long, value_parser = parse_wan)]
    pub emulate_wan: Option<WanSpec>,
    /// Give up on a home call after this long (the caller gets EIO).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub home_timeout: Duration,
    /// S3 endpoint for s3:// homes on S3-compatible servers, e.g. http://127.0.0.1:9000.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// S3 region for s3:// homes [default: us-east-1].
    #[arg(long)]
    pub s3_region: Option<String>,
    /// Serve Prometheus metrics at this address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Refuse all changes (the same as --write-mode read-only).
    #[arg(long)]
    pub read_only: bool,
    /// How changes reach home: write-back (durable in the cache, pushed after the sync lag),
    /// write-through (each change returns once home has it), read-only, or local (never pushed).
    #[arg(long, default_value = "write-back", value_parser = write_mode)]
    pub write_mode: larder_fs::WriteMode,
    /// How long a change waits in the cache before it is pushed to home (write-back).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub sync_lag: Duration,
    /// Threads pushing independent changes to home in parallel (write-back).
    #[arg(long, default_value_t = 8)]
    pub flush_threads: usize,
    /// When home changed a file that has local changes: keep-both (the cache's version lands beside
    /// home's as NAME.conflict-HOST-TIME), cache-wins, or home-wins (the cache's version is kept in the
    /// cache directory's conflicts area).
    #[arg(long, default_value = "keep-both", value_parser = conflict_policy)]
    pub conflict_policy: larder_fs::ConflictPolicy,
    /// Testing aid: while this file exists, home is unreachable (every call fails).
    #[arg(long, hide = true)]
    pub fault_file: Option<PathBuf>,
    /// Threads serving FUSE requests.
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    /// Stay attached to the terminal instead of running as a daemon.
    #[arg(long)]
    pub foreground: bool,
    /// Log filter (error, warn, info, debug, trace or a tracing directive).
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UnmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// How long to wait for the daemon to exit (and, with --drain, for home to take every change).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Push every queued change to home first.
    #[arg(long, conflicts_with = "leave_pending")]
    pub drain: bool,
    /// Unmount with changes still queued; the next mount of the same cache directory pushes them.
    #[arg(long)]
    pub leave_pending: bool,
}

#[derive(Args, Debug)]
pub struct DrainArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Give up (exit non-zero) after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct ConflictsArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ResidencyArgs {
    /// Files or directories inside a larder mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Take directories whole: every file below them.
    #[arg(long, short = 'r')]
    pub recursive: bool,
    /// Prefetch: cache names and attributes only (the listing and lookups), no file data.
    #[arg(long)]
    pub metadata_only: bool,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Working directory for the demo home, mount point and cache.
    #[arg(long, default_value = "/tmp/larder-demo")]
    pub dir: PathBuf,
    /// Number of small files in the demo home.
    #[arg(long, default_value_t = 400)]
    pub small_files: usize,
    /// Size of the large file.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub big_size: u64,
    /// The emulated link to the demo home.
    #[arg(long, default_value = "latency=20ms,bandwidth=50MiB/s", value_parser = parse_wan)]
    pub wan: WanSpec,
}
