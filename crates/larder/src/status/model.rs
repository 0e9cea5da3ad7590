//! The status document: what `larder status --json` prints, the control socket serves and the metrics
//! endpoint is made from.

use std::collections::BTreeMap;
use std::path::PathBuf;

use larder_fs::RefusedChange;
use serde::{Deserialize, Serialize};

/// Why the namespace asked home: totals over the mount's life, and rates over the last seconds. Tells a
/// user why a lookup, an open or a create was slow (a home call each, or one listing per directory).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaStatus {
    /// Stats of one name at home (a lookup the cache could not answer).
    pub lookups: u64,
    /// Listings of a directory at home (each revalidates all its entries).
    pub listings: u64,
    /// Of them, listings made to answer a lookup, and to revalidate a file past the validity lag.
    pub listings_for_lookups: u64,
    pub listings_for_revalidation: u64,
    /// Of them, listings made ahead of a walk of a tree (its directories revalidated in parallel).
    #[serde(default)]
    pub listings_ahead: u64,
    /// Stats of a known object past the validity lag, one by one.
    pub revalidations: u64,
    /// Objects made at home (files, directories, links, special files).
    pub creates: u64,
    /// The same per second, over the last `rate_window_seconds`.
    pub rate_window_seconds: f64,
    pub lookups_per_second: f64,
    pub listings_per_second: f64,
    pub revalidations_per_second: f64,
    pub creates_per_second: f64,
}

/// HCCache's cache-efficiency metrics over the mount's life: ECDAL = 1 / (Σ read latency × Σ bytes put
/// into the cache) and ECDAB = Σ bytes read / (I/O time × Σ bytes put into the cache), the I/O time being
/// the time spent in reads here (one client). Larger is better: the same latency or bandwidth bought with
/// less cache traffic. A ratio is `None` (`null`) until there is something to divide by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    pub reads: u64,
    pub read_bytes: u64,
    pub read_seconds: f64,
    pub cache_inserted_bytes: u64,
    pub hit_rate: Option<f64>,
    pub ecdal: Option<f64>,
    pub ecdab: Option<f64>,
    /// Average block distance of files in eviction order (1: a file's blocks lie together).
    pub abd: Option<f64>,
}

impl Efficiency {
    pub fn of(fs: &larder_fs::FsStats, store: &larder_cache::StoreStats, abd: Option<f64>) -> Efficiency {
        let cda = store.inserted_bytes as f64;
        let ratio = |num: f64, den: f64| (den > 0.0).then(|| num / den);
        Efficiency {
            reads: fs.reads,
            read_bytes: fs.read_bytes,
            read_seconds: fs.read_seconds,
            cache_inserted_bytes: store.inserted_bytes,
            hit_rate: ratio(store.hits as f64, (store.hits + store.misses) as f64),
            ecdal: ratio(1.0, fs.read_seconds * cda),
            ecdab: ratio(fs.read_bytes as f64, fs.read_seconds * cda),
            abd,
        }
    }
}

/// The status document, as `larder status --json` prints it. The fields of the published schema
/// (`home.ops`, `home.bytes_read`, `home.bytes_written`, `cache.hits`, `cache.misses`, `cache.bytes_used`,
/// `cache.bytes_limit`, `files_cached`) keep their names.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub mountpoint: PathBuf,
    pub pid: u32,
    pub uptime_seconds: f64,
    pub validity_lag_seconds: f64,
    pub home: HomeStatus,
    pub cache: CacheStatus,
    /// Where readers' bytes came from. The kernel's page cache, in front of both, is not seen here.
    pub tiers: Tiers,
    pub files_cached: u64,
    pub write_mode: String,
    /// The mount's atime options, as mount(8) spells them (`relatime`, `strictatime,nodiratime`, ...).
    #[serde(default)]
    pub atime: String,
    /// How durable a change is when its call returns: `process` (survives the daemon's death) or `power`.
    #[serde(default)]
    pub durability: String,
    pub journal: JournalStatus,
    pub efficiency: Efficiency,
    pub fs: FsStatus,
    /// Home calls made for the namespace, and why.
    #[serde(default)]
    pub metadata: MetaStatus,
    /// The peer transport, in a cluster: units asked of peers and served to them, and peers refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<PeerStatus>,
    /// The cluster this node is in, as its last view of the membership has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// The bank of shared cache servers (units, attributes and listings), with its URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bank: Option<BankStatus>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BankStatus {
    pub url: String,
    #[serde(flatten)]
    pub stats: larder_bank::BankStats,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub name: String,
    /// This node's id (16 hex digits) and name.
    pub node: String,
    pub node_name: String,
    /// Whether etcd answered the last call, and whether this node renewed its liveness within half the
    /// lease (if not, the others may soon count it gone).
    pub etcd_online: bool,
    pub lease_ok: bool,
    /// The etcd revision of the view.
    pub revision: i64,
    /// Every member registered, live or not.
    pub members: Vec<MemberStatus>,
    /// The units this node holds and owns (by the placement of its view), and their bytes.
    #[serde(default)]
    pub owned_units: u64,
    #[serde(default)]
    pub owned_bytes: u64,
    /// Paths whose changes, not at home yet, this node holds for the others (its held records), and
    /// paths other nodes hold.
    #[serde(default)]
    pub held_here: u64,
    #[serde(default)]
    pub held_elsewhere: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: String,
    pub name: String,
    pub addr: String,
    /// Its weight in placement: its cache size in bytes.
    pub weight: u64,
    pub live: bool,
    pub serves: bool,
    /// Handing its units over before it goes.
    #[serde(default)]
    pub leaving: bool,
    /// The free space of its cache, as it last said.
    #[serde(default)]
    pub free: u64,
    pub this_node: bool,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Units asked of peers: got, answered "not held" or "another version", failed (unreachable, timed
    /// out, refused, corrupt), corrupt among them, and not asked because a peer's breaker was open.
    pub fetches: u64,
    pub hits: u64,
    pub misses: u64,
    pub failures: u64,
    pub corrupt: u64,
    pub skipped: u64,
    /// Bytes of the units got from peers.
    #[serde(default)]
    pub bytes: u64,
    /// Units served to peers, and their bytes.
    pub served: u64,
    pub served_bytes: u64,
    /// Connections and calls refused: failed TLS handshakes, and certificates not a live member's.
    pub refused: u64,
    /// Units taken over from members that left or migrated them here.
    #[serde(default)]
    pub taken: u64,
    /// Units this node owned that went to a member with room instead of being evicted, and their bytes;
    /// evicted because no member had room, or because migration was over its rate.
    #[serde(default)]
    pub migrated: u64,
    #[serde(default)]
    pub migrated_bytes: u64,
    #[serde(default)]
    pub migrate_no_room: u64,
    #[serde(default)]
    pub migrate_over_rate: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HomeState {
    Online,
    Offline,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HomeStatus {
    pub url: String,
    pub state: HomeState,
    pub ops: u64,
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub ops_by_kind: BTreeMap<String, u64>,
    /// An object store's rewrites: the bytes they sent and received over the link, and those the server
    /// copied (parts nothing changed). `bytes_written` counts what the changes were; this, what moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrites: Option<larder_home::RewriteBytes>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CacheStatus {
    pub dir: PathBuf,
    pub hits: u64,
    pub misses: u64,
    pub bytes_used: u64,
    pub bytes_limit: u64,
    pub bytes_dirty: u64,
    pub blocks: u64,
    pub block_size: u64,
    pub evictions: u64,
    /// Of them, blocks evicted by reads and writes themselves because the harvester fell behind.
    #[serde(default)]
    pub evictions_by_fills: u64,
    pub corrupt_blocks: u64,
    /// Files whose changes not yet at home were found damaged in the cache directory: their damaged
    /// bytes are never served (EIO) nor pushed until the file is written again or removed.
    #[serde(default)]
    pub damaged_files: Vec<larder_fs::DamagedFile>,
    pub logical_bytes: u64,
    pub bytes_pinned: u64,
    pub eviction: String,
    pub dedup: Dedup,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Dedup {
    pub contents: u64,
    pub files: u64,
    pub saved_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tiers {
    pub cache: CacheTier,
    pub home: HomeTier,
    /// The read path's walk for units not in the store, nearest first (the store, peers where the node
    /// is in a cluster, home): each tier's answers.
    #[serde(default)]
    pub walk: Vec<WalkTier>,
}

/// One tier of the read path's walk, as counted since the start.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WalkTier {
    pub name: String,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    /// Answers refused: another version, the wrong length, or a failed checksum.
    pub rejected: u64,
    /// Bytes of its hits, and the mean time it took to answer (hit or miss), in microseconds.
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub mean_us: f64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct CacheTier {
    pub hits: u64,
    pub bytes_served: u64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct HomeTier {
    pub hits: u64,
    pub bytes_served: u64,
    pub bytes_fetched: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JournalStatus {
    pub pending_ops: u64,
    pub dirty_bytes: u64,
    pub oldest_age_seconds: f64,
    pub conflicts: u64,
    pub failed_ops: u64,
    /// Each change home refused: op, path, home's answer, attempts.
    pub refused: Vec<RefusedChange>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct FsStatus {
    /// Inodes in memory, and over the mount's life those that left it (the kernel forgot them; the index
    /// keeps them) and those loaded back from the index.
    pub inodes: u64,
    #[serde(default)]
    pub inodes_reclaimed: u64,
    #[serde(default)]
    pub inodes_reloaded: u64,
    #[serde(default)]
    pub inodes_trimmed: u64,
    pub open_handles: u64,
    pub dirty_files: u64,
    pub readahead_blocks: u64,
}
