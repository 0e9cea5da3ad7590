//! Where a status comes from: the daemon gathers it from its running file system, its home's counters and,
//! in a cluster, its membership and peers, and serves it on the control socket, where a client fetches it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use larder_fs::Fs;
use larder_home::{HomeCounters, OpKind};

use super::{
    BankStatus, CacheStatus, CacheTier, ClusterStatus, Dedup, Efficiency, FsStatus, HomeState, HomeStatus, HomeTier,
    JournalStatus, MemberStatus, MetaStatus, PeerStatus, Status, Tiers, WalkTier,
};
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

/// Units (from the eviction end) over which the average block distance is taken: bounded, because the
/// store is locked while they are walked.
pub const ABD_UNITS: usize = 100_000;

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
                rewrites: self.fs.home_rewrite_bytes(),
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
            atime: self.fs.atime().describe(),
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

/// Ask the daemon serving `mountpoint` for its status.
pub fn fetch(mountpoint: &std::path::Path) -> Result<Status> {
    let mnt = mounts::absolute(mountpoint)?;
    if mounts::mounted_at(&mnt) != mounts::Mounted::Larder {
        bail!("{} is not a larder mount", mnt.display());
    }
    control::status(&mounts::daemon_socket(&mnt)?)
}
