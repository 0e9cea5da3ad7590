//! `larder status`, and the snapshot the daemon serves on its control socket and metrics endpoint.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use larder_fs::{Fs, RefusedChange};
use larder_home::{HomeCounters, OpKind};
use serde::{Deserialize, Serialize};

use crate::cli::StatusArgs;
use crate::control::{Request, Response};
use crate::{control, mounts};

/// Everything a status snapshot is made of.
pub struct StatusSource {
    pub fs: Arc<Fs>,
    pub counters: Arc<HomeCounters>,
    pub started: Instant,
    pub mountpoint: PathBuf,
    pub home: String,
    pub cache_dir: PathBuf,
    pub block_size: u64,
    /// The peer transport's figures, in a cluster.
    pub peers: Option<Arc<larder_cluster::peer::PeerStats>>,
    /// This node's membership, and the cluster's name, in a cluster.
    pub cluster: Option<(String, Arc<larder_cluster::Membership>)>,
    /// The peer transport's client, in a cluster: a node that leaves hands its units over through it.
    pub peer_client: Option<Arc<larder_cluster::peer::PeerClient>>,
    /// The bank of shared cache servers, with `--bank`.
    pub bank: Option<Arc<larder_bank::Bank>>,
    /// Samples of the metadata counters, one a second (see [`StatusSource::sample`]).
    pub meta_samples: std::sync::Mutex<std::collections::VecDeque<(Instant, [u64; 4])>>,
}

/// How far back `larder status` looks for its rates of home calls.
const RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

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

/// Units (from the eviction end) over which the average block distance is taken: bounded, because the
/// store is locked while they are walked.
pub const ABD_UNITS: usize = 100_000;

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

impl ClusterStatus {
    pub fn of(name: &str, m: &larder_cluster::Membership, held: &[larder_fs::serve::HeldUnit]) -> ClusterStatus {
        let view = m.view();
        let me = m.me().id;
        let owned: Vec<&larder_fs::serve::HeldUnit> = held
            .iter()
            .filter(|u| view.placement().owner(&u.digest) == Some(me))
            .collect();
        let (mut held_here, mut held_elsewhere) = (0, 0);
        for (_, h) in m.held().all() {
            match serde_json::from_slice::<larder_fs::coherence::HeldRecord>(&h.value) {
                Ok(r) if r.holder == me => held_here += 1,
                Ok(_) => held_elsewhere += 1,
                Err(_) => {}
            }
        }
        ClusterStatus {
            held_here,
            held_elsewhere,
            owned_units: owned.len() as u64,
            owned_bytes: owned.iter().map(|u| u.len).sum(),
            name: name.to_string(),
            node: format!("{me:016x}"),
            node_name: m.me().name.clone(),
            etcd_online: m.online(),
            lease_ok: m.lease_ok(),
            revision: view.revision,
            members: view
                .members
                .values()
                .map(|r| MemberStatus {
                    id: format!("{:016x}", r.id),
                    name: r.name.clone(),
                    addr: r.addr.clone(),
                    weight: r.weight,
                    live: view.live.contains(&r.id),
                    serves: r.serve,
                    leaving: view.liveness.get(&r.id).is_some_and(|l| l.leaving),
                    free: view.liveness.get(&r.id).map_or(0, |l| l.free),
                    this_node: r.id == me,
                })
                .collect(),
        }
    }
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

impl StatusSource {
    /// The metadata counters now: lookups, listings, revalidations, creates.
    fn meta_counts(&self) -> [u64; 4] {
        let [lookups, listings, revalidations] = self.fs.home_meta_calls();
        let c = &self.counters;
        let creates = [
            OpKind::Create,
            OpKind::Mkdir,
            OpKind::Mknod,
            OpKind::Symlink,
            OpKind::Link,
        ]
        .iter()
        .map(|k| c.ops_of(*k))
        .sum();
        [lookups, listings, revalidations, creates]
    }

    /// Take a sample of the metadata counters, for the rates `larder status` shows (the daemon calls this
    /// once a second).
    pub fn sample(&self) {
        let now = Instant::now();
        let counts = self.meta_counts();
        let mut q = self.meta_samples.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back((now, counts));
        while q.len() > 2 && q.front().is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW) {
            q.pop_front();
        }
    }

    fn metadata(&self, fs: &larder_fs::FsStats) -> MetaStatus {
        let now = self.meta_counts();
        let (window, rates) = {
            let q = self.meta_samples.lock().unwrap_or_else(|p| p.into_inner());
            match q.front() {
                Some((t, then)) if t.elapsed().as_secs_f64() > 0.5 => {
                    let secs = t.elapsed().as_secs_f64();
                    let r = |i: usize| now[i].saturating_sub(then[i]) as f64 / secs;
                    (secs, [r(0), r(1), r(2), r(3)])
                }
                _ => (0.0, [0.0; 4]),
            }
        };
        MetaStatus {
            lookups: now[0],
            listings: now[1],
            listings_for_lookups: fs.listings_for_lookups,
            listings_for_revalidation: fs.listings_for_revalidation,
            listings_ahead: fs.listings_ahead,
            revalidations: now[2],
            creates: now[3],
            rate_window_seconds: window,
            lookups_per_second: rates[0],
            listings_per_second: rates[1],
            revalidations_per_second: rates[2],
            creates_per_second: rates[3],
        }
    }

    /// The status document now.
    pub fn snapshot(&self) -> Status {
        let c = &self.counters;
        let store = self.fs.store().stats();
        let fs = self.fs.stats();
        let j = self.fs.journal_stats();
        Status {
            mountpoint: self.mountpoint.clone(),
            pid: std::process::id(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            validity_lag_seconds: self.fs.validity_lag().as_secs_f64(),
            home: HomeStatus {
                url: self.home.clone(),
                state: if j.home_online {
                    HomeState::Online
                } else {
                    HomeState::Offline
                },
                ops: c.ops(),
                errors: c.errors(),
                bytes_read: c.bytes_read(),
                bytes_written: c.bytes_written(),
                ops_by_kind: OpKind::ALL
                    .iter()
                    .map(|k| (k.as_str().to_string(), c.ops_of(*k)))
                    .collect(),
            },
            cache: CacheStatus {
                dir: self.cache_dir.clone(),
                hits: store.hits,
                misses: store.misses,
                bytes_used: store.bytes_used,
                bytes_limit: store.bytes_limit,
                bytes_dirty: store.bytes_dirty,
                blocks: store.blocks,
                block_size: self.block_size,
                evictions: store.evictions,
                evictions_by_fills: store.evictions_by_fills,
                corrupt_blocks: store.corrupt_blocks,
                damaged_files: self.fs.damaged_files(),
                logical_bytes: store.logical_bytes,
                bytes_pinned: store.bytes_pinned,
                eviction: store.eviction.as_str().to_string(),
                dedup: Dedup {
                    contents: store.dedup_contents,
                    files: store.dedup_files,
                    saved_bytes: store.logical_bytes.saturating_sub(store.bytes_used),
                },
            },
            tiers: Tiers {
                cache: CacheTier {
                    hits: store.hits,
                    bytes_served: fs.bytes_from_cache,
                },
                home: HomeTier {
                    hits: fs.home_waits,
                    bytes_served: fs.bytes_from_home,
                    bytes_fetched: c.bytes_read(),
                },
                walk: self
                    .fs
                    .tier_stats()
                    .into_iter()
                    .map(|t| WalkTier {
                        name: t.name.to_string(),
                        hits: t.hits,
                        misses: t.misses,
                        errors: t.errors,
                        rejected: t.rejected,
                        bytes: t.bytes,
                        mean_us: if t.asks == 0 {
                            0.0
                        } else {
                            t.nanos as f64 / t.asks as f64 / 1000.0
                        },
                    })
                    .collect(),
            },
            files_cached: store.objects,
            write_mode: self.fs.write_mode().as_str().to_string(),
            durability: self.fs.durability().name().to_string(),
            journal: JournalStatus {
                pending_ops: j.pending_ops,
                dirty_bytes: j.dirty_bytes,
                oldest_age_seconds: j.oldest_age_seconds,
                conflicts: j.conflicts,
                failed_ops: j.failed_ops,
                refused: self.fs.failed_ops(),
            },
            efficiency: Efficiency::of(&fs, &store, self.fs.store().average_block_distance(ABD_UNITS)),
            fs: FsStatus {
                inodes: fs.inodes,
                inodes_reclaimed: fs.inodes_reclaimed,
                inodes_reloaded: fs.inodes_reloaded,
                inodes_trimmed: fs.inodes_trimmed,
                open_handles: fs.open_handles,
                dirty_files: fs.dirty_files,
                readahead_blocks: fs.readahead_blocks,
            },
            metadata: self.metadata(&fs),
            peers: self.peer_status(),
            cluster: self
                .cluster
                .as_ref()
                .map(|(name, m)| ClusterStatus::of(name, m, &self.fs.held_units())),
            bank: self.bank.as_ref().map(|b| BankStatus {
                url: b.url().to_string(),
                stats: b.stats(),
            }),
        }
    }
}

impl StatusSource {
    /// The peer transport's figures now, in a cluster.
    pub fn peer_status(&self) -> Option<PeerStatus> {
        self.peers.as_ref().map(|p| {
            let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            PeerStatus {
                fetches: n(&p.fetches),
                hits: n(&p.hits),
                misses: n(&p.misses),
                failures: n(&p.failures),
                corrupt: n(&p.corrupt),
                skipped: n(&p.skipped),
                bytes: n(&p.bytes),
                served: n(&p.served),
                served_bytes: n(&p.served_bytes),
                refused: n(&p.refused),
                taken: n(&p.taken),
                migrated: n(&p.migrated),
                migrated_bytes: n(&p.migrated_bytes),
                migrate_no_room: n(&p.migrate_no_room),
                migrate_over_rate: n(&p.migrate_over_rate),
            }
        })
    }
}

impl control::Handler for StatusSource {
    fn handle(&self, request: Request) -> Response {
        match request {
            Request::Status => Response::Status(Box::new(self.snapshot())),
            Request::Conflicts => Response::Conflicts {
                conflicts: self.fs.conflicts(),
                failed_ops: self.fs.failed_ops(),
            },
            Request::Drain { wait_ms } => {
                let drained = self
                    .fs
                    .drain(Duration::from_millis(wait_ms.min(control::DRAIN_STEP_MAX_MS)));
                Response::Drain {
                    drained: drained.into(),
                    status: Box::new(self.snapshot()),
                }
            }
            Request::Residency { action, inos } => crate::residency::serve(&self.fs, action, &inos),
            Request::Leave { within_ms } => match (&self.cluster, &self.peer_client) {
                (Some((_, membership)), Some(client)) => {
                    match crate::leave::hand_over(&self.fs, membership, client, Duration::from_millis(within_ms)) {
                        Ok(done) => Response::Left(done),
                        Err(e) => Response::Error { message: e.to_string() },
                    }
                }
                _ => Response::Error {
                    message: "not in a cluster (mounted without --cluster)".into(),
                },
            },
        }
    }
}

/// Bytes as a short human figure.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// One refused change of a status's `journal.refused`: "create a/b: home's answer (3 attempts)".
pub fn describe_refused(r: &RefusedChange) -> String {
    format!(
        "{} {}: {} ({} attempt{})",
        r.op,
        r.path,
        r.error,
        r.attempts,
        if r.attempts == 1 { "" } else { "s" }
    )
}

/// Ask the daemon serving `mountpoint` for its status.
pub fn fetch(mountpoint: &std::path::Path) -> Result<Status> {
    let mnt = mounts::absolute(mountpoint)?;
    if mounts::mounted_at(&mnt) != mounts::Mounted::Larder {
        bail!("{} is not a larder mount", mnt.display());
    }
    control::status(&mounts::daemon_socket(&mnt)?)
}

/// `larder status`.
pub fn run(args: StatusArgs) -> Result<()> {
    let v = fetch(&args.mountpoint)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let (hits, misses) = (v.cache.hits, v.cache.misses);
    let rate = if hits + misses == 0 {
        0.0
    } else {
        100.0 * hits as f64 / (hits + misses) as f64
    };
    let limit = v.cache.bytes_limit.max(1);
    let rows = [
        (
            "mount",
            format!(
                "{} (pid {}, up {:.0}s)",
                v.mountpoint.display(),
                v.pid,
                v.uptime_seconds
            ),
        ),
        (
            "home",
            format!(
                "{} ({})",
                v.home.url,
                match v.home.state {
                    HomeState::Online => "online",
                    HomeState::Offline => "offline",
                }
            ),
        ),
        ("home ops", format!("{} ({} failed)", v.home.ops, v.home.errors)),
        (
            "inodes",
            format!(
                "{} in memory; {} left memory for the index, {} loaded back, {} the kernel was asked to forget",
                v.fs.inodes, v.fs.inodes_reclaimed, v.fs.inodes_reloaded, v.fs.inodes_trimmed
            ),
        ),
        (
            "home metadata",
            format!(
                "per second over {:.0}s: {:.1} lookups, {:.1} listings, {:.1} revalidations, {:.1} creates \
                 (in all: {} lookups, {} listings of which {} for a lookup, {} to revalidate and {} ahead of a \
                 walk, {} revalidations, {} creates)",
                v.metadata.rate_window_seconds,
                v.metadata.lookups_per_second,
                v.metadata.listings_per_second,
                v.metadata.revalidations_per_second,
                v.metadata.creates_per_second,
                v.metadata.lookups,
                v.metadata.listings,
                v.metadata.listings_for_lookups,
                v.metadata.listings_for_revalidation,
                v.metadata.listings_ahead,
                v.metadata.revalidations,
                v.metadata.creates
            ),
        ),
        (
            "home bytes",
            format!(
                "{} read, {} written",
                human_bytes(v.home.bytes_read),
                human_bytes(v.home.bytes_written)
            ),
        ),
        (
            "cache",
            format!(
                "{} of {} ({:.1}%), {} dirty",
                human_bytes(v.cache.bytes_used),
                human_bytes(v.cache.bytes_limit),
                100.0 * v.cache.bytes_used as f64 / limit as f64,
                human_bytes(v.cache.bytes_dirty)
            ),
        ),
        (
            "stored",
            format!(
                "{} of file data in {} on disk ({} saved: {} files share {} copies), {} pinned",
                human_bytes(v.cache.logical_bytes),
                human_bytes(v.cache.bytes_used),
                human_bytes(v.cache.dedup.saved_bytes),
                v.cache.dedup.files,
                v.cache.dedup.contents,
                human_bytes(v.cache.bytes_pinned)
            ),
        ),
        ("files cached", v.files_cached.to_string()),
        ("hits / misses", format!("{hits} / {misses} ({rate:.1}% hits)")),
        ("evictions", v.cache.evictions.to_string()),
        (
            "journal",
            format!(
                "{}, {} durability ({} changes waiting, {} dirty, oldest {:.1}s, {} conflicts, {} refused)",
                v.write_mode,
                v.durability,
                v.journal.pending_ops,
                human_bytes(v.journal.dirty_bytes),
                v.journal.oldest_age_seconds,
                v.journal.conflicts,
                v.journal.failed_ops
            ),
        ),
        ("cache dir", v.cache.dir.display().to_string()),
    ];
    for (k, val) in rows {
        println!("{k:<14} {val}");
    }
    for d in &v.cache.damaged_files {
        println!(
            "{:<14} /{}: changes not yet at home were damaged in the cache ({} blocks); reads of them fail \
             and it is not pushed until written again or removed",
            "DAMAGED",
            d.path,
            d.blocks.len()
        );
    }
    if let Some(p) = &v.peers {
        println!(
            "{:<14} asked {}: {} hits, {} misses, {} failed, {} skipped; served {} ({}), refused {}; \
             migrated {} ({}), took {}",
            "peers",
            p.fetches,
            p.hits,
            p.misses,
            p.failures,
            p.skipped,
            p.served,
            human_bytes(p.served_bytes),
            p.refused,
            p.migrated,
            human_bytes(p.migrated_bytes),
            p.taken
        );
    }
    if let Some(b) = &v.bank {
        let s = &b.stats;
        println!(
            "{:<14} {}: {} gets, {} hits, {} errors, {} failed checks; {} kept ({}), {} dropped; {} of {} \
             servers skipped",
            "bank",
            b.url,
            s.gets,
            s.hits,
            s.errors,
            s.bad,
            s.puts - s.put_errors,
            human_bytes(s.bytes_written),
            s.dropped,
            s.servers_down,
            s.servers
        );
    }
    if let Some(c) = &v.cluster {
        let live = c.members.iter().filter(|m| m.live).count();
        println!(
            "{:<14} {} as {} ({}): {live} of {} members live; etcd {}{}",
            "cluster",
            c.name,
            c.node_name,
            c.node,
            c.members.len(),
            if c.etcd_online {
                "online"
            } else {
                "away (last view kept)"
            },
            if c.lease_ok {
                ""
            } else {
                "; liveness not renewed lately"
            }
        );
        println!(
            "{:<14} owns {} units ({}) of what it holds; holds changes of {} paths for the others, \
             reads {} held elsewhere",
            "",
            c.owned_units,
            human_bytes(c.owned_bytes),
            c.held_here,
            c.held_elsewhere
        );
    }
    if v.tiers.walk.len() > 2 {
        let walk: Vec<String> = v
            .tiers
            .walk
            .iter()
            .map(|t| {
                format!(
                    "{} {} hits ({}), {:.0} µs mean",
                    t.name,
                    t.hits,
                    human_bytes(t.bytes),
                    t.mean_us
                )
            })
            .collect();
        println!("{:<14} {}", "walk", walk.join("; "));
    }
    for r in &v.journal.refused {
        println!("{:<14} {}", "refused", describe_refused(r));
    }
    Ok(())
}

/// `larder cluster members MNT`: the members of the cluster the mount is in, as its node sees them.
pub fn members(mountpoint: &std::path::Path, json: bool) -> Result<()> {
    let socket = mounts::daemon_socket(&mounts::absolute(mountpoint)?)?;
    let status = control::status(&socket)?;
    let Some(c) = status.cluster else {
        bail!(
            "{} is not in a cluster (mounted without --cluster)",
            mountpoint.display()
        );
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(());
    }
    println!("cluster {} (view at etcd revision {})", c.name, c.revision);
    println!(
        "{:<16} {:<20} {:<22} {:>10} {:<8} {:<6} {:>10}",
        "id", "name", "address", "weight", "live", "serves", "free"
    );
    for m in &c.members {
        println!(
            "{:<16} {:<20} {:<22} {:>10} {:<8} {:<6} {:>10}{}",
            m.id,
            m.name,
            if m.addr.is_empty() { "-" } else { &m.addr },
            human_bytes(m.weight),
            match (m.live, m.leaving) {
                (true, true) => "leaving",
                (true, false) => "yes",
                _ => "no",
            },
            if m.serves { "yes" } else { "no" },
            if m.live { human_bytes(m.free) } else { "-".into() },
            if m.this_node { "  (this node)" } else { "" }
        );
    }
    Ok(())
}
