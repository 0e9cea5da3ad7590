//! `larder status`, and the snapshot the daemon serves on its control socket and metrics endpoint.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use larder_fs::Fs;
use larder_home::{HomeCounters, OpKind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::cli::StatusArgs;
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

impl StatusSource {
    /// The status document. The fields of the published schema (`home.ops`, `home.bytes_read`,
    /// `home.bytes_written`, `cache.hits`, `cache.misses`, `cache.bytes_used`, `cache.bytes_limit`,
    /// `files_cached`) keep their names.
    pub fn snapshot(&self) -> Value {
        let c = &self.counters;
        let store = self.fs.store().stats();
        let fs = self.fs.stats();
        let j = self.fs.journal_stats();
        let by_kind: serde_json::Map<String, Value> = OpKind::ALL
            .iter()
            .map(|k| (k.as_str().to_string(), json!(c.ops_of(*k))))
            .collect();
        json!({
            "mountpoint": self.mountpoint,
            "pid": std::process::id(),
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "validity_lag_seconds": self.fs.validity_lag().as_secs_f64(),
            "home": {
                "url": self.home,
                "state": if j.home_online { "online" } else { "offline" },
                "ops": c.ops(),
                "errors": c.errors(),
                "bytes_read": c.bytes_read(),
                "bytes_written": c.bytes_written(),
                "ops_by_kind": by_kind,
            },
            "cache": {
                "dir": self.cache_dir,
                "hits": store.hits,
                "misses": store.misses,
                "bytes_used": store.bytes_used,
                "bytes_limit": store.bytes_limit,
                "bytes_dirty": store.bytes_dirty,
                "blocks": store.blocks,
                "block_size": self.block_size,
                "evictions": store.evictions,
                "corrupt_blocks": store.corrupt_blocks,
                "logical_bytes": store.logical_bytes,
                "bytes_pinned": store.bytes_pinned,
                "eviction": store.eviction.as_str(),
                "dedup": {
                    "contents": store.dedup_contents,
                    "files": store.dedup_files,
                    "saved_bytes": store.logical_bytes.saturating_sub(store.bytes_used),
                },
            },
            // Where readers' bytes came from. The kernel's page cache, in front of both, is not seen here.
            "tiers": {
                "cache": { "hits": store.hits, "bytes_served": fs.bytes_from_cache },
                "home": {
                    "hits": fs.home_waits,
                    "bytes_served": fs.bytes_from_home,
                    "bytes_fetched": c.bytes_read(),
                },
            },
            "files_cached": store.objects,
            "write_mode": self.fs.write_mode().as_str(),
            "journal": {
                "pending_ops": j.pending_ops,
                "dirty_bytes": j.dirty_bytes,
                "oldest_age_seconds": j.oldest_age_seconds,
                "conflicts": j.conflicts,
                "failed_ops": j.failed_ops,
                // Each change home refused: op, path, home's answer, attempts.
                "refused": self.fs.failed_ops(),
            },
            "efficiency": Efficiency::of(&fs, &store, self.fs.store().average_block_distance(ABD_UNITS)),
            "fs": {
                "inodes": fs.inodes,
                "open_handles": fs.open_handles,
                "dirty_files": fs.dirty_files,
                "readahead_blocks": fs.readahead_blocks,
            },
        })
    }
}

impl control::Handler for StatusSource {
    fn handle(&self, cmd: &str, req: &Value) -> Value {
        match cmd {
            "prefetch" | "pin" | "unpin" | "evict" => crate::residency::serve(&self.fs, cmd, req),
            "status" => self.snapshot(),
            "conflicts" => json!({ "conflicts": self.fs.conflicts(), "failed_ops": self.fs.failed_ops() }),
            drain if drain.starts_with("drain") => {
                let ms = drain
                    .split_whitespace()
                    .nth(1)
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(1000u64);
                let drained = self.fs.drain(std::time::Duration::from_millis(ms.min(5000)));
                let mut v = self.snapshot();
                v["drained"] = json!(match drained {
                    larder_fs::Drained::Empty => "empty",
                    larder_fs::Drained::Refused => "refused",
                    larder_fs::Drained::Waiting => "waiting",
                });
                v
            }
            other => json!({ "error": format!("unknown command '{other}'") }),
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
pub fn describe_refused(r: &Value) -> String {
    format!(
        "{} {}: {} ({} attempt{})",
        r["op"].as_str().unwrap_or("?"),
        r["path"].as_str().unwrap_or("?"),
        r["error"].as_str().unwrap_or("?"),
        r["attempts"],
        if r["attempts"].as_u64() == Some(1) { "" } else { "s" }
    )
}

/// Ask the daemon serving `mountpoint` for its status.
pub fn fetch(mountpoint: &std::path::Path) -> Result<Value> {
    let mnt = mounts::absolute(mountpoint)?;
    if mounts::mounted_at(&mnt) != mounts::Mounted::Larder {
        bail!("{} is not a larder mount", mnt.display());
    }
    control::request(&mounts::socket_path(&mnt), "status")
}

/// `larder status`.
pub fn run(args: StatusArgs) -> Result<()> {
    let v = fetch(&args.mountpoint)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let u = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (hits, misses) = (u("/cache/hits"), u("/cache/misses"));
    let rate = if hits + misses == 0 {
        0.0
    } else {
        100.0 * hits as f64 / (hits + misses) as f64
    };
    let limit = u("/cache/bytes_limit").max(1);
    let rows = [
        (
            "mount",
            format!(
                "{} (pid {}, up {:.0}s)",
                v["mountpoint"].as_str().unwrap_or("?"),
                v["pid"],
                v["uptime_seconds"].as_f64().unwrap_or(0.0)
            ),
        ),
        (
            "home",
            format!(
                "{} ({})",
                v["home"]["url"].as_str().unwrap_or("?"),
                v["home"]["state"].as_str().unwrap_or("?")
            ),
        ),
        ("home ops", format!("{} ({} failed)", u("/home/ops"), u("/home/errors"))),
        (
            "home bytes",
            format!(
                "{} read, {} written",
                human_bytes(u("/home/bytes_read")),
                human_bytes(u("/home/bytes_written"))
            ),
        ),
        (
            "cache",
            format!(
                "{} of {} ({:.1}%), {} dirty",
                human_bytes(u("/cache/bytes_used")),
                human_bytes(u("/cache/bytes_limit")),
                100.0 * u("/cache/bytes_used") as f64 / limit as f64,
                human_bytes(u("/cache/bytes_dirty"))
            ),
        ),
        (
            "stored",
            format!(
                "{} of file data in {} on disk ({} saved: {} files share {} copies), {} pinned",
                human_bytes(u("/cache/logical_bytes")),
                human_bytes(u("/cache/bytes_used")),
                human_bytes(u("/cache/dedup/saved_bytes")),
                u("/cache/dedup/files"),
                u("/cache/dedup/contents"),
                human_bytes(u("/cache/bytes_pinned"))
            ),
        ),
        ("files cached", u("/files_cached").to_string()),
        ("hits / misses", format!("{hits} / {misses} ({rate:.1}% hits)")),
        ("evictions", u("/cache/evictions").to_string()),
        (
            "journal",
            format!(
                "{} ({} changes waiting, {} dirty, oldest {:.1}s, {} conflicts, {} refused)",
                v["write_mode"].as_str().unwrap_or("?"),
                u("/journal/pending_ops"),
                human_bytes(u("/journal/dirty_bytes")),
                v.pointer("/journal/oldest_age_seconds")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0),
                u("/journal/conflicts"),
                u("/journal/failed_ops")
            ),
        ),
        ("cache dir", v["cache"]["dir"].as_str().unwrap_or("?").to_string()),
    ];
    for (k, val) in rows {
        println!("{k:<14} {val}");
    }
    for r in v
        .pointer("/journal/refused")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        println!("{:<14} {}", "refused", describe_refused(r));
    }
    Ok(())
}
