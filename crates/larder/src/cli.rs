//! The command line: a view of the configuration, with a sane default for every knob.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use larder_bank::BankUrl;
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
    /// An option given twice (in --config's file and on the command line) takes the later value.
    #[command(args_override_self = true)]
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
    /// Save every file a cache directory holds changes of that home does not have yet (when `larder
    /// mount` refuses it: its index lost or damaged) into a directory; a damaged index is then set aside,
    /// so that the next mount starts with an empty cache.
    Recover(RecoverArgs),
    /// Build a demo home, mount it behind an emulated slow link, read it cold then warm.
    Demo(DemoArgs),
    /// A cluster of nodes: its own CA and a certificate for each node; its members.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Change a mount between read-only and read-write in place (what `mount -o remount,ro` runs).
    #[command(hide = true)]
    Remount(RemountArgs),
    /// Serve the Container Storage Interface on a Unix socket, so that Kubernetes mounts larder volumes in
    /// pods (contrib/kubernetes).
    Csi(CsiArgs),
}

/// Which CSI services `larder csi` serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CsiMode {
    /// Identity and Node: stage and publish volumes on this node (the DaemonSet).
    Node,
    /// Identity and Controller: make and delete dynamic volumes (the Deployment).
    Controller,
    /// All three.
    All,
}

#[derive(Args, Debug)]
pub struct CsiArgs {
    /// Where to serve: unix:///PATH.
    #[arg(long)]
    pub endpoint: String,
    /// This node's name, as the CO knows it (Kubernetes: the node's name); required with the Node service.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Which services to serve.
    #[arg(long, value_enum, default_value_t = CsiMode::All)]
    pub mode: CsiMode,
    /// Where the node keeps each volume's cache directory and record of its staging (a node-local disk
    /// that outlives the plugin: queued changes wait there for the volume's next staging).
    #[arg(long, default_value = "/var/lib/larder-csi")]
    pub state_dir: PathBuf,
    /// Log filter (error, warn, info, debug, trace or a tracing directive).
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

#[derive(Args, Debug)]
pub struct RemountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// The options mount(8) gives: `ro` or `rw` and the kernel's flags of the mount; larder's own options
    /// cannot change without a new mount, and are refused by name.
    #[arg(short = 'o', default_value = "")]
    pub options: String,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Make the cluster's CA in DIR: ca.pem, and ca.key readable by its owner only (refused if DIR holds a
    /// CA: every node certificate depends on it).
    Init(ClusterInitArgs),
    /// Issue node NAME's certificate with the CA in DIR: NAME.pem and NAME.key beside it.
    Cert(ClusterCertArgs),
    /// The members of the cluster a mount is in, as its node sees them (live or not, address, weight).
    Members(ClusterMembersArgs),
    /// Leave the cluster: hand the units this node owns to their new owners, then unmount.
    Leave(ClusterLeaveArgs),
}

#[derive(Args, Debug)]
pub struct ClusterLeaveArgs {
    /// How long handing units over may take; what is not handed over by then is left for home.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub hand_over_for: Duration,
    #[command(flatten)]
    pub unmount: UnmountArgs,
}

#[derive(Args, Debug)]
pub struct ClusterMembersArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Every member etcd has a record of, gone ones too (else the live and the leaving).
    #[arg(long)]
    pub all: bool,
}

#[derive(Args, Debug)]
pub struct ClusterInitArgs {
    /// The cluster directory (made, owner-only, if missing).
    pub dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct ClusterCertArgs {
    /// The cluster directory, holding the CA.
    pub dir: PathBuf,
    /// The node's name (letters, digits, '-' and '.') [default: this host's name].
    pub name: Option<String>,
    /// Replace an existing certificate and key of that name (the node then needs the new pair).
    #[arg(long)]
    pub force: bool,
    /// Another host name or IP address the certificate names (repeatable): for an etcd the nodes reach
    /// over TLS by that address.
    #[arg(long = "also-name", value_name = "HOST|IP")]
    pub also: Vec<String>,
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

/// A switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// What a read of bytes held by a node that is gone gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HolderLost {
    Eio,
    Home,
}

/// etcd's client endpoints, as `http://HOST:PORT` (`https://` over TLS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdEndpoints(pub Vec<String>);

impl EtcdEndpoints {
    /// Whether larder speaks TLS to etcd.
    pub fn tls(&self) -> bool {
        self.0.iter().any(|e| e.starts_with("https://"))
    }
}

/// `--bank memcache://HOST:PORT[,...]` or `redis://HOST:PORT[,...]`.
fn parse_bank(s: &str) -> Result<BankUrl, String> {
    BankUrl::parse(s)
}

/// `--cluster etcd://HOST:PORT[,HOST:PORT...]`, or `etcds://` for TLS.
fn parse_cluster(s: &str) -> Result<EtcdEndpoints, String> {
    let (scheme, rest) = if let Some(rest) = s.strip_prefix("etcd://") {
        ("http", rest)
    } else if let Some(rest) = s.strip_prefix("etcds://") {
        ("https", rest)
    } else {
        return Err(format!(
            "{s:?}: expected etcd://HOST:PORT[,HOST:PORT...] (or etcds:// for TLS)"
        ));
    };
    let endpoints: Vec<String> = rest
        .split(',')
        .map(|hp| {
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| format!("{hp:?}: expected HOST:PORT"))?;
            if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
                return Err(format!("{hp:?}: expected HOST:PORT"));
            }
            Ok(format!("{scheme}://{hp}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(EtcdEndpoints(endpoints))
}

/// `--write-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WriteModeArg {
    /// Durable in the cache, pushed after the sync lag.
    WriteBack,
    /// Each change returns once home has it.
    WriteThrough,
    /// Every change is refused.
    ReadOnly,
    /// Changes stay in the cache, never pushed.
    Local,
}

impl From<WriteModeArg> for larder_fs::WriteMode {
    fn from(m: WriteModeArg) -> Self {
        match m {
            WriteModeArg::WriteBack => larder_fs::WriteMode::WriteBack,
            WriteModeArg::WriteThrough => larder_fs::WriteMode::WriteThrough,
            WriteModeArg::ReadOnly => larder_fs::WriteMode::ReadOnly,
            WriteModeArg::Local => larder_fs::WriteMode::Local,
        }
    }
}

/// `--durability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// A change survives the daemon being killed when its call returns (it is written to the operating
    /// system); fsync, and a group commit every half second, make it durable against power loss.
    Process,
    /// Every change is fsynced in the cache before its call returns.
    Power,
}

impl From<DurabilityArg> for larder_cache::Durability {
    fn from(d: DurabilityArg) -> Self {
        match d {
            DurabilityArg::Process => larder_cache::Durability::Process,
            DurabilityArg::Power => larder_cache::Durability::Power,
        }
    }
}

/// `--conflict-policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ConflictPolicyArg {
    /// The cache's version lands beside home's as NAME.conflict-HOST-TIME.
    KeepBoth,
    /// The cache's version replaces home's.
    CacheWins,
    /// Home's version stays; the cache's is kept in the cache directory's conflicts area.
    HomeWins,
}

impl From<ConflictPolicyArg> for larder_fs::ConflictPolicy {
    fn from(p: ConflictPolicyArg) -> Self {
        match p {
            ConflictPolicyArg::KeepBoth => larder_fs::ConflictPolicy::KeepBoth,
            ConflictPolicyArg::CacheWins => larder_fs::ConflictPolicy::CacheWins,
            ConflictPolicyArg::HomeWins => larder_fs::ConflictPolicy::HomeWins,
        }
    }
}

/// `--atime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AtimeArg {
    Relatime,
    Strictatime,
    Noatime,
}

impl From<AtimeArg> for larder_fs::AtimePolicy {
    fn from(a: AtimeArg) -> Self {
        match a {
            AtimeArg::Relatime => larder_fs::AtimePolicy::Relative,
            AtimeArg::Strictatime => larder_fs::AtimePolicy::Strict,
            AtimeArg::Noatime => larder_fs::AtimePolicy::Never,
        }
    }
}

/// `--prefetch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrefetchArg {
    /// A readahead window that doubles on each sequential read.
    Sequential,
    /// The first read queues every block.
    WholeFile,
}

impl From<PrefetchArg> for larder_fs::Prefetch {
    fn from(p: PrefetchArg) -> Self {
        match p {
            PrefetchArg::Sequential => larder_fs::Prefetch::Sequential,
            PrefetchArg::WholeFile => larder_fs::Prefetch::WholeFile,
        }
    }
}

/// `--eviction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EvictionArg {
    /// S3-FIFO: scan-resistant.
    #[value(name = "s3fifo")]
    S3Fifo,
    /// Plain least-recently-used.
    Lru,
}

impl From<EvictionArg> for larder_cache::Eviction {
    fn from(e: EvictionArg) -> Self {
        match e {
            EvictionArg::S3Fifo => larder_cache::Eviction::S3Fifo,
            EvictionArg::Lru => larder_cache::Eviction::Lru,
        }
    }
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
    /// Largest readahead window for sequential readers (at most an eighth of the cache): it is asked of
    /// home half a window at a time, in large ranged requests shared among --ingest-streams.
    #[arg(long, default_value = "128MiB", value_parser = parse_size)]
    pub readahead: u64,
    /// Concurrent home requests bringing in the blocks of large files ahead of their readers.
    #[arg(long, default_value_t = 8)]
    pub ingest_streams: usize,
    /// What a read of a large file brings in ahead of it (the sequential window grows up to --readahead).
    #[arg(long, value_enum, default_value_t = PrefetchArg::Sequential)]
    pub prefetch: PrefetchArg,
    /// Files at most this large are fetched, kept and evicted whole; larger ones per block.
    #[arg(long, default_value = "256KiB", value_parser = parse_size)]
    pub small_file_threshold: u64,
    /// Keep a copy per file even when small files are identical (by default clean small files with the
    /// same bytes share one copy in the cache).
    #[arg(long)]
    pub no_dedup: bool,
    /// Eviction policy over cache units (lru is a baseline for benchmarks).
    #[arg(long, value_enum, default_value_t = EvictionArg::S3Fifo)]
    pub eviction: EvictionArg,
    /// Serve every read and write through the daemon, even of files whole in the cache (by default the
    /// kernel reads and writes those in their cache files directly, with FUSE passthrough, where the
    /// kernel offers it; what it wrote is taken in at close and fsync).
    #[arg(long)]
    pub no_passthrough: bool,
    /// When a read moves a file's access time, as mount(8)'s options of the same names: relatime (when it
    /// is not after the file's last change, or is a day old), strictatime (every read), noatime (never).
    /// Access times are the mount's: never sent to home.
    #[arg(long, value_enum, default_value_t = AtimeArg::Relatime)]
    pub atime: AtimeArg,
    /// Reads of directories (listings) never move their access time.
    #[arg(long)]
    pub nodiratime: bool,
    /// Most files the daemon keeps in memory (about 1 KiB each) beside directories and files being
    /// changed or open: past it, the kernel is asked to forget some, and a later lookup loads them from
    /// the index, asking home nothing within the validity lag (0: no limit).
    #[arg(long, default_value_t = 131_072)]
    pub max_inodes: usize,
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
    /// S3 keys for s3:// homes from this file, in the AWS shared-credentials format (profile $AWS_PROFILE,
    /// else default), readable by its owner only [default: the AWS environment variables and files].
    #[arg(long, value_name = "FILE")]
    pub s3_credentials: Option<PathBuf>,
    /// Keep modes, owners, times and symlinks of s3:// homes in object metadata, as s3fs does (s3fs and
    /// rclone see them; a listing then asks each object for it). Off: objects carry none (files 0644, no
    /// symlinks), and a listing is its pages alone.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub s3_metadata: OnOff,
    /// Serve Prometheus metrics at this address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Join a cluster whose membership lives in etcd: etcd://HOST:PORT[,HOST:PORT...], or etcds://... to
    /// speak TLS to etcd (trusting the cluster's CA, presenting this node's certificate). Its nodes serve
    /// each other's cached units before going to home.
    #[arg(long, value_parser = parse_cluster)]
    pub cluster: Option<EtcdEndpoints>,
    /// The cluster's name: clusters sharing one etcd keep apart by it.
    #[arg(long, default_value = "larder")]
    pub cluster_name: String,
    /// Where this node serves its cached units to the other nodes, as they reach it (IP:PORT).
    #[arg(long, requires = "cluster")]
    pub listen: Option<std::net::SocketAddr>,
    /// This node's name in the cluster, and its certificate's [default: the host name].
    #[arg(long, requires = "cluster")]
    pub node_name: Option<String>,
    /// The cluster's certificates, as `larder cluster init` and `larder cluster cert` made them: ca.pem and
    /// this node's NAME.pem and NAME.key. Required with --cluster: every peer connection is mutual TLS.
    #[arg(long, value_name = "DIR", requires = "cluster")]
    pub cluster_tls: Option<PathBuf>,
    /// Serve cached units to the other nodes (off: a short-lived client that only reads).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub peer_serve: OnOff,
    /// Give up on a peer's answer after this long: a unit then comes from the next node or home, and
    /// bytes held by a node that does not answer are an error (EIO).
    #[arg(long, default_value = "5s", value_parser = parse_duration, requires = "cluster")]
    pub peer_timeout: Duration,
    /// What a read of a file whose changes another node holds, and that node is gone, gets: an error
    /// (eio), or home's version as if those changes were never made (home).
    #[arg(long, value_enum, default_value_t = HolderLost::Eio, requires = "cluster")]
    pub holder_lost: HolderLost,
    /// Close-to-open across the cluster: each open and opendir first reads the changes other nodes
    /// published (one etcd read). Off: they are seen when etcd's watch brings them, a moment later.
    #[arg(long, value_enum, default_value_t = OnOff::On, requires = "cluster")]
    pub close_to_open: OnOff,
    /// File locks (flock, fcntl and lockf) across the cluster: a lock taken on one node excludes
    /// processes on every node, taking one shows what others wrote before they released theirs, and
    /// releasing one publishes what this node wrote. Off: locks hold on this node only, as the kernel
    /// keeps them.
    #[arg(long, value_enum, default_value_t = OnOff::On, requires = "cluster")]
    pub cluster_locks: OnOff,
    /// Remove the record of a member not live for this long from etcd (it is listed, and asked for
    /// nothing, no more; it registers again when it comes back).
    #[arg(long, default_value = "1h", value_parser = parse_duration, requires = "cluster")]
    pub forget_gone_after: Duration,
    /// Bytes a second of units this node owns that it may send to members with room instead of evicting
    /// them (0: evict as a lone node does).
    #[arg(long, default_value = "64MiB", value_parser = parse_size, requires = "cluster")]
    pub migrate_rate: u64,
    /// A bank of shared cache servers behind the peers (or alone): memcache://HOST:PORT[,HOST:PORT...] or
    /// redis://HOST:PORT[,...]. Units fetched from home are kept there for every node; with a validity
    /// lag of a second or more, home's attributes and listings too. Any bank failure is a miss.
    #[arg(long, value_parser = parse_bank)]
    pub bank: Option<BankUrl>,
    /// Give up on a bank server's answer after this long (a miss), and skip the server for a while.
    #[arg(long, default_value = "500ms", value_parser = parse_duration, requires = "bank")]
    pub bank_timeout: Duration,
    /// How long units stay in the bank at most (0: until the servers evict them). Redis evicts only when
    /// run with maxmemory and an allkeys policy.
    #[arg(long, default_value = "1d", value_parser = parse_duration, requires = "bank")]
    pub bank_ttl: Duration,
    /// Refuse all changes (the same as --write-mode read-only).
    #[arg(long)]
    pub read_only: bool,
    /// How changes reach home.
    #[arg(long, value_enum, default_value_t = WriteModeArg::WriteBack)]
    pub write_mode: WriteModeArg,
    /// How long a change waits in the cache before it is pushed to home (write-back).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub sync_lag: Duration,
    /// How durable a change made in the cache is when its call returns (write-back, local)
    #[arg(long, value_enum, default_value_t = DurabilityArg::Process)]
    pub durability: DurabilityArg,
    /// Most changes pushed to home at once (write-back): the pushers start at 8 and grow towards this
    /// while home answers as fast as with fewer, shrinking when it slows down.
    #[arg(long, default_value_t = 64)]
    pub flush_threads: usize,
    /// What to do when home changed a file that has local changes.
    #[arg(long, value_enum, default_value_t = ConflictPolicyArg::KeepBoth)]
    pub conflict_policy: ConflictPolicyArg,
    /// Testing aid: while this file exists, home is unreachable (every call fails).
    #[arg(long, hide = true)]
    pub fault_file: Option<PathBuf>,
    /// Most bytes of a cache file not yet checked since the start that an open checks before the kernel
    /// may read the file directly; past it the file is checked in the background (a testing aid for now:
    /// the default suits every disk measured).
    #[arg(long, hide = true, value_parser = parse_size, default_value = "256MiB")]
    pub verify_at_open: u64,
    /// Threads serving FUSE requests [default: 4 per CPU, at least 8 and at most 64]. Each request waiting
    /// on home (a cold read, a listing) holds one; requests answered from the cache contend for the CPUs
    /// beyond a few per CPU. Raise it for more readers reading cold at once than this.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Stay attached to the terminal instead of running as a daemon (under a service manager: it is told
    /// when the mount is ready, through $NOTIFY_SOCKET).
    #[arg(long)]
    pub foreground: bool,
    /// Print nothing once mounted, even on a terminal (by default a terminal is told the daemon's pid;
    /// anything else, mount(8) included, gets nothing on success).
    #[arg(long)]
    pub quiet: bool,
    /// Take options from this TOML file: its keys are the long options above without their dashes
    /// (`validity-lag = "30s"`, `no-dedup = true`), and `home` and `mountpoint`; the command line's
    /// options override the file's.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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
pub struct RecoverArgs {
    /// The cache directory (the `--cache-dir` of its mounts; not mounted now).
    pub cache_dir: PathBuf,
    /// Where to save the files, each at its path in the mount (made if missing; must be empty, and
    /// outside the cache directory).
    #[arg(long)]
    pub to: PathBuf,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_endpoints_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(
            parse_cluster("etcd://10.0.0.1:2379,etcd-b:2379").unwrap(),
            EtcdEndpoints(vec!["http://10.0.0.1:2379".into(), "http://etcd-b:2379".into()])
        );
        let tls = parse_cluster("etcds://10.0.0.1:2379").unwrap();
        assert_eq!(tls, EtcdEndpoints(vec!["https://10.0.0.1:2379".into()]));
        assert!(tls.tls() && !parse_cluster("etcd://a:1").unwrap().tls());
        for bad in [
            "http://a:2379",
            "https://a:2379",
            "etcds://a",
            "etcd://a",
            "etcd://a:b",
            "etcd://:2379",
            "etcd://a:2379,",
        ] {
            let e = parse_cluster(bad).unwrap_err();
            assert!(e.contains("expected"), "{bad}: {e}");
        }
    }

    /// The names the options take are the ones status output and the docs use.
    #[test]
    fn choices_are_named_as_the_core_names_them() {
        fn name(v: &impl ValueEnum) -> String {
            v.to_possible_value().expect("a visible value").get_name().to_string()
        }
        for m in WriteModeArg::value_variants() {
            assert_eq!(name(m), larder_fs::WriteMode::from(*m).as_str());
        }
        for p in ConflictPolicyArg::value_variants() {
            assert_eq!(name(p), larder_fs::ConflictPolicy::from(*p).as_str());
        }
        for p in PrefetchArg::value_variants() {
            assert_eq!(name(p), larder_fs::Prefetch::from(*p).as_str());
        }
        for e in EvictionArg::value_variants() {
            assert_eq!(name(e), larder_cache::Eviction::from(*e).as_str());
        }
        for d in DurabilityArg::value_variants() {
            assert_eq!(name(d), larder_cache::Durability::from(*d).name());
        }
    }

    #[test]
    fn unknown_choices_are_refused_with_the_list() {
        let e = Cli::try_parse_from(["larder", "mount", "h", "m", "--write-mode", "sometimes"]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("write-back") && text.contains("local"), "{text}");
    }
}
