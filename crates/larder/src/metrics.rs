//! Prometheus text exposition of the status snapshot, on a small HTTP endpoint.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::status::StatusSource;

pub const HOME_OPS: &str = "larder_home_ops_total";
pub const HOME_ERRORS: &str = "larder_home_errors_total";
pub const HOME_BYTES_READ: &str = "larder_home_bytes_read_total";
pub const HOME_BYTES_WRITTEN: &str = "larder_home_bytes_written_total";
pub const CACHE_HITS: &str = "larder_cache_hits_total";
pub const CACHE_MISSES: &str = "larder_cache_misses_total";
pub const CACHE_BYTES_USED: &str = "larder_cache_bytes_used";
pub const CACHE_BYTES_LIMIT: &str = "larder_cache_bytes_limit";
pub const CACHE_BYTES_DIRTY: &str = "larder_cache_bytes_dirty";
pub const CACHE_EVICTIONS: &str = "larder_cache_evictions_total";
pub const CACHE_CORRUPT: &str = "larder_cache_corrupt_blocks_total";
pub const FILES_CACHED: &str = "larder_files_cached";
pub const HOME_ONLINE: &str = "larder_home_online";
pub const JOURNAL_PENDING: &str = "larder_journal_pending_ops";
pub const JOURNAL_OLDEST: &str = "larder_journal_oldest_age_seconds";
pub const JOURNAL_FAILED: &str = "larder_journal_failed_ops";
pub const JOURNAL_CONFLICTS: &str = "larder_journal_conflicts";
pub const READS: &str = "larder_reads_total";
pub const READ_BYTES: &str = "larder_read_bytes_total";
pub const CACHE_INSERTED: &str = "larder_cache_inserted_bytes_total";

/// The snapshot `v` in Prometheus text format.
pub fn render(v: &Value) -> String {
    let u = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
    };
    metric(
        HOME_ERRORS,
        "counter",
        "Home operations that failed (answers are not failures: not found, exists, not empty).",
        u("/home/errors"),
    );
    metric(
        HOME_BYTES_READ,
        "counter",
        "Bytes of file data read from home.",
        u("/home/bytes_read"),
    );
    metric(
        HOME_BYTES_WRITTEN,
        "counter",
        "Bytes of file data written to home.",
        u("/home/bytes_written"),
    );
    metric(
        CACHE_HITS,
        "counter",
        "Block reads served from the local cache.",
        u("/cache/hits"),
    );
    metric(
        CACHE_MISSES,
        "counter",
        "Block reads that missed the local cache.",
        u("/cache/misses"),
    );
    metric(
        CACHE_BYTES_USED,
        "gauge",
        "Bytes of cached file data.",
        u("/cache/bytes_used"),
    );
    metric(
        CACHE_BYTES_LIMIT,
        "gauge",
        "Most bytes of file data the cache keeps.",
        u("/cache/bytes_limit"),
    );
    metric(
        CACHE_BYTES_DIRTY,
        "gauge",
        "Bytes written locally and not yet at home.",
        u("/cache/bytes_dirty"),
    );
    metric(
        CACHE_EVICTIONS,
        "counter",
        "Blocks evicted from the cache.",
        u("/cache/evictions"),
    );
    metric(
        CACHE_CORRUPT,
        "counter",
        "Cached blocks that failed their checksum.",
        u("/cache/corrupt_blocks"),
    );
    metric(
        FILES_CACHED,
        "gauge",
        "Files with data in the cache.",
        u("/files_cached"),
    );
    metric(
        HOME_ONLINE,
        "gauge",
        "1 while home answers, 0 while it is away (changes wait in the journal).",
        u64::from(v.pointer("/home/state").and_then(Value::as_str) == Some("online")),
    );
    metric(
        JOURNAL_PENDING,
        "gauge",
        "Changes made here and not yet at home.",
        u("/journal/pending_ops"),
    );
    metric(
        JOURNAL_FAILED,
        "gauge",
        "Queued changes home refused, waiting to be retried.",
        u("/journal/failed_ops"),
    );
    metric(
        JOURNAL_CONFLICTS,
        "gauge",
        "Conflicts recorded in this cache directory (see `larder conflicts`).",
        u("/journal/conflicts"),
    );
    metric(
        READS,
        "counter",
        "Read requests served by the mount.",
        u("/efficiency/reads"),
    );
    metric(
        READ_BYTES,
        "counter",
        "Bytes served by read requests.",
        u("/efficiency/read_bytes"),
    );
    metric(
        CACHE_INSERTED,
        "counter",
        "Bytes put into the local cache (fetched from home or written here).",
        u("/efficiency/cache_inserted_bytes"),
    );
    metric(
        "larder_cache_logical_bytes",
        "gauge",
        "Bytes of file data cached, counting each file (identical small files are stored once).",
        u("/cache/logical_bytes"),
    );
    metric(
        "larder_cache_pinned_bytes",
        "gauge",
        "Bytes of pinned files (never evicted).",
        u("/cache/bytes_pinned"),
    );
    metric(
        "larder_cache_dedup_saved_bytes",
        "gauge",
        "Bytes not stored because identical small files share one copy.",
        u("/cache/dedup/saved_bytes"),
    );
    out.push_str(
        "# HELP larder_tier_hits_total Reads served per tier (cache: blocks found; home: blocks waited for).\n\
         # TYPE larder_tier_hits_total counter\n",
    );
    for tier in ["cache", "home"] {
        out.push_str(&format!(
            "larder_tier_hits_total{{tier=\"{tier}\"}} {}\n",
            u(&format!("/tiers/{tier}/hits"))
        ));
    }
    out.push_str(
        "# HELP larder_tier_bytes_served_total Bytes handed to readers per tier.\n\
         # TYPE larder_tier_bytes_served_total counter\n",
    );
    for tier in ["cache", "home"] {
        out.push_str(&format!(
            "larder_tier_bytes_served_total{{tier=\"{tier}\"}} {}\n",
            u(&format!("/tiers/{tier}/bytes_served"))
        ));
    }
    let f = |p: &str| v.pointer(p).and_then(Value::as_f64);
    out.push_str(&format!(
        "# HELP larder_read_seconds_total Time spent serving read requests.\n# TYPE larder_read_seconds_total counter\n\
         larder_read_seconds_total {:.6}\n",
        f("/efficiency/read_seconds").unwrap_or(0.0)
    ));
    for (name, key, help) in [
        (
            "larder_ecdal",
            "ecdal",
            "HCCache ECDAL over the mount's life: 1 / (read latency x cache insert bytes).",
        ),
        (
            "larder_ecdab",
            "ecdab",
            "HCCache ECDAB over the mount's life: read bytes / (read time x cache insert bytes).",
        ),
        (
            "larder_abd",
            "abd",
            "HCCache average block distance of files in eviction order (1: a file's blocks lie together).",
        ),
    ] {
        if let Some(x) = f(&format!("/efficiency/{key}")) {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n{name} {x:e}\n"));
        }
    }
    let oldest = v
        .pointer("/journal/oldest_age_seconds")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    out.push_str(&format!(
        "# HELP {JOURNAL_OLDEST} Age of the oldest change not yet at home.\n# TYPE {JOURNAL_OLDEST} gauge\n\
         {JOURNAL_OLDEST} {oldest:.3}\n"
    ));
    out.push_str(&format!(
        "# HELP {HOME_OPS} Home operations by kind.\n# TYPE {HOME_OPS} counter\n"
    ));
    if let Some(kinds) = v.pointer("/home/ops_by_kind").and_then(Value::as_object) {
        for (k, n) in kinds {
            out.push_str(&format!("{HOME_OPS}{{op=\"{k}\"}} {}\n", n.as_u64().unwrap_or(0)));
        }
    }
    out
}

/// Serve `/metrics` (any path, in fact) at `addr`.
pub fn serve(addr: SocketAddr, source: Arc<StatusSource>) -> Result<()> {
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot serve metrics at {addr}"))?;
    std::thread::Builder::new().name("larder-metrics".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut reader = BufReader::new(match conn.try_clone() {
                Ok(c) => c,
                Err(_) => continue,
            });
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let body = render(&source.snapshot());
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    })?;
    Ok(())
}
