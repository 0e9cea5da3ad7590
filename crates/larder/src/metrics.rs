//! Prometheus metrics: a `prometheus-client` collector that reads the daemon's counters at each scrape,
//! served at `GET /metrics` by a small HTTP server.
//!
//! The figures already live in the core (`FsStats`, `JournalStats`, the store's `StoreStats`, the home's
//! `HomeCounters`); the collector copies them into the exposition when Prometheus asks, so nothing is
//! counted twice. The exposition is OpenMetrics text: a counter family `larder_home_ops` is exposed as
//! `larder_home_ops_total`, which is the name dashboards query.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use larder_cache::StoreStats;
use larder_fs::{FsStats, JournalStats};
use larder_home::{HomeCounters, OpKind};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::status::{ABD_UNITS, Efficiency, StatusSource};

// Metric family names. Counters are exposed with `_total` appended.
pub const HOME_OPS: &str = "larder_home_ops";
pub const HOME_ERRORS: &str = "larder_home_errors";
pub const HOME_BYTES_READ: &str = "larder_home_bytes_read";
pub const HOME_BYTES_WRITTEN: &str = "larder_home_bytes_written";
pub const HOME_ONLINE: &str = "larder_home_online";
pub const CACHE_HITS: &str = "larder_cache_hits";
pub const CACHE_MISSES: &str = "larder_cache_misses";
pub const CACHE_BYTES_USED: &str = "larder_cache_bytes_used";
pub const CACHE_BYTES_LIMIT: &str = "larder_cache_bytes_limit";
pub const CACHE_BYTES_DIRTY: &str = "larder_cache_bytes_dirty";
pub const CACHE_EVICTIONS: &str = "larder_cache_evictions";
pub const CACHE_CORRUPT: &str = "larder_cache_corrupt_blocks";
pub const CACHE_DAMAGED: &str = "larder_cache_damaged_blocks";
pub const CACHE_INSERTED: &str = "larder_cache_inserted_bytes";
pub const CACHE_CHECKSUMMED: &str = "larder_cache_checksummed_bytes";
pub const CACHE_LOGICAL: &str = "larder_cache_logical_bytes";
pub const CACHE_PINNED: &str = "larder_cache_pinned_bytes";
pub const CACHE_DEDUP_SAVED: &str = "larder_cache_dedup_saved_bytes";
pub const FILES_CACHED: &str = "larder_files_cached";
pub const JOURNAL_PENDING: &str = "larder_journal_pending_ops";
pub const JOURNAL_OLDEST: &str = "larder_journal_oldest_age_seconds";
pub const JOURNAL_FAILED: &str = "larder_journal_failed_ops";
pub const JOURNAL_CONFLICTS: &str = "larder_journal_conflicts";
pub const READS: &str = "larder_reads";
pub const READ_BYTES: &str = "larder_read_bytes";
pub const READ_SECONDS: &str = "larder_read_seconds";
pub const TIER_HITS: &str = "larder_tier_hits";
pub const TIER_BYTES_SERVED: &str = "larder_tier_bytes_served";
pub const TIER_ASKS: &str = "larder_tier_asks";
pub const TIER_ASK_SECONDS: &str = "larder_tier_ask_seconds";
pub const PEER_FETCHES: &str = "larder_peer_fetches";
pub const PEER_ANSWERS: &str = "larder_peer_answers";
pub const PEER_BYTES: &str = "larder_peer_bytes";
pub const PEER_SERVED: &str = "larder_peer_served";
pub const PEER_SERVED_BYTES: &str = "larder_peer_served_bytes";
pub const PEER_REFUSED: &str = "larder_peer_refused";
pub const PEER_TAKEN: &str = "larder_peer_taken";
pub const PEER_MIGRATED: &str = "larder_peer_migrated";
pub const PEER_MIGRATED_BYTES: &str = "larder_peer_migrated_bytes";
pub const CLUSTER_MEMBERS: &str = "larder_cluster_members";
pub const CLUSTER_ETCD_ONLINE: &str = "larder_cluster_etcd_online";
pub const CLUSTER_OWNED_UNITS: &str = "larder_cluster_owned_units";
pub const CLUSTER_OWNED_BYTES: &str = "larder_cluster_owned_bytes";
pub const CLUSTER_LEASE_OK: &str = "larder_cluster_lease_ok";
pub const BANK_GETS: &str = "larder_bank_gets";
pub const BANK_PUTS: &str = "larder_bank_puts";
pub const BANK_BYTES: &str = "larder_bank_bytes";
pub const BANK_SERVERS: &str = "larder_bank_servers";
pub const ECDAL: &str = "larder_ecdal";
pub const ECDAB: &str = "larder_ecdab";
pub const ABD: &str = "larder_abd";
pub const HOME_METADATA_CALLS: &str = "larder_home_metadata_calls";
pub const HOME_LISTINGS_FOR: &str = "larder_home_listings_for";

/// The content type of the exposition `prometheus_client::encoding::text::encode` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Everything one scrape reports, copied from the daemon's typed counters.
pub struct Figures<'a> {
    pub home: &'a HomeCounters,
    pub fs: FsStats,
    pub store: StoreStats,
    pub journal: JournalStats,
    pub efficiency: Efficiency,
    /// In a cluster: the peer transport's figures, and the membership as this node sees it.
    pub peers: Option<crate::status::PeerStatus>,
    pub cluster: Option<ClusterFigures>,
    /// The read path's walk, tier by tier, nearest first.
    pub walk: Vec<larder_fs::tier::TierStats>,
    /// The bank's figures, with `--bank`.
    pub bank: Option<larder_bank::BankStats>,
    /// Home metadata calls: lookups, listings, revalidations (`Fs::home_meta_calls`).
    pub meta: [u64; 3],
}

/// The membership, for metrics: members live and registered, and this node's standing with etcd.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterFigures {
    pub live: u64,
    pub members: u64,
    pub etcd_online: bool,
    pub lease_ok: bool,
    /// Units this node holds and owns, and their bytes.
    pub owned_units: u64,
    pub owned_bytes: u64,
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, value: impl EncodeCounterValue) -> fmt::Result {
    ConstCounter::new(value).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, value: impl EncodeGaugeValue) -> fmt::Result {
    ConstGauge::new(value).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl Figures<'_> {
    fn encode_bank(&self, enc: &mut DescriptorEncoder, b: &larder_bank::BankStats) -> fmt::Result {
        let mut gets = enc.encode_descriptor(
            BANK_GETS,
            "Values asked of the bank (units, attributes, listings), by result: hit, miss (absent, or one \
             of the failures), error (a server failed, timed out or was skipped), bad (failed its checks).",
            None,
            MetricType::Counter,
        )?;
        for (result, n) in [("hit", b.hits), ("miss", b.misses), ("error", b.errors), ("bad", b.bad)] {
            ConstCounter::new(n).encode(gets.encode_family(&[("result", result)])?)?;
        }
        let mut puts = enc.encode_descriptor(
            BANK_PUTS,
            "Values given to the bank, by result: kept, failed, dropped (the fill queue was full).",
            None,
            MetricType::Counter,
        )?;
        for (result, n) in [
            ("kept", b.puts - b.put_errors),
            ("failed", b.put_errors),
            ("dropped", b.dropped),
        ] {
            ConstCounter::new(n).encode(puts.encode_family(&[("result", result)])?)?;
        }
        let mut bytes = enc.encode_descriptor(
            BANK_BYTES,
            "Bytes read from and written to the bank.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(b.bytes_read).encode(bytes.encode_family(&[("direction", "read")])?)?;
        ConstCounter::new(b.bytes_written).encode(bytes.encode_family(&[("direction", "written")])?)?;
        let mut servers = enc.encode_descriptor(
            BANK_SERVERS,
            "The bank's servers: all, and those skipped after a failure now.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(b.servers as i64).encode(servers.encode_family(&[("state", "all")])?)?;
        ConstGauge::new(b.servers_down as i64).encode(servers.encode_family(&[("state", "skipped")])?)?;
        Ok(())
    }

    /// Write every metric to `enc`.
    pub fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let (home, fs, store, j, e) = (self.home, &self.fs, &self.store, &self.journal, &self.efficiency);
        let enc = &mut enc;
        let mut ops = enc.encode_descriptor(HOME_OPS, "Home operations by kind.", None, MetricType::Counter)?;
        for kind in OpKind::ALL {
            ConstCounter::new(home.ops_of(kind)).encode(ops.encode_family(&[("op", kind.as_str())])?)?;
        }
        let mut meta = enc.encode_descriptor(
            HOME_METADATA_CALLS,
            "Metadata calls to home by kind: lookup (one name), listing (a directory with its entries' \
             attributes), revalidation (one file's attributes past the validity lag).",
            None,
            MetricType::Counter,
        )?;
        for (call, n) in ["lookup", "listing", "revalidation"].into_iter().zip(self.meta) {
            ConstCounter::new(n).encode(meta.encode_family(&[("call", call)])?)?;
        }
        let mut why = enc.encode_descriptor(
            HOME_LISTINGS_FOR,
            "Listings of a directory at home by reason: a name the cache could not answer, or a file's \
             revalidation past the validity lag.",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in [
            ("lookup", fs.listings_for_lookups),
            ("revalidation", fs.listings_for_revalidation),
        ] {
            ConstCounter::new(n).encode(why.encode_family(&[("reason", reason)])?)?;
        }
        counter(
            enc,
            HOME_ERRORS,
            "Home operations that failed (answers are not failures: not found, exists, not empty).",
            home.errors(),
        )?;
        counter(
            enc,
            HOME_BYTES_READ,
            "Bytes of file data read from home.",
            home.bytes_read(),
        )?;
        counter(
            enc,
            HOME_BYTES_WRITTEN,
            "Bytes of file data written to home.",
            home.bytes_written(),
        )?;
        gauge(
            enc,
            HOME_ONLINE,
            "1 while home answers, 0 while it is away (changes wait in the journal).",
            u32::from(j.home_online),
        )?;
        counter(enc, CACHE_HITS, "Block reads served from the local cache.", store.hits)?;
        counter(
            enc,
            CACHE_MISSES,
            "Block reads that missed the local cache.",
            store.misses,
        )?;
        gauge(enc, CACHE_BYTES_USED, "Bytes of cached file data.", store.bytes_used)?;
        gauge(
            enc,
            CACHE_BYTES_LIMIT,
            "Most bytes of file data the cache keeps.",
            store.bytes_limit,
        )?;
        gauge(
            enc,
            CACHE_BYTES_DIRTY,
            "Bytes written locally and not yet at home.",
            store.bytes_dirty,
        )?;
        counter(enc, CACHE_EVICTIONS, "Blocks evicted from the cache.", store.evictions)?;
        counter(
            enc,
            CACHE_CORRUPT,
            "Cached blocks that failed their checksum.",
            store.corrupt_blocks,
        )?;
        gauge(
            enc,
            CACHE_DAMAGED,
            "Cached blocks of changes not yet at home that failed their checksum (never served nor pushed).",
            store.damaged_blocks,
        )?;
        counter(
            enc,
            CACHE_INSERTED,
            "Bytes put into the local cache (fetched from home or written here).",
            store.inserted_bytes,
        )?;
        counter(
            enc,
            CACHE_CHECKSUMMED,
            "Bytes read back from cache files to be checksummed (commits, pushes, passthrough writers' closes, first reads).",
            store.checksummed_bytes,
        )?;
        gauge(
            enc,
            CACHE_LOGICAL,
            "Bytes of file data cached, counting each file (identical small files are stored once).",
            store.logical_bytes,
        )?;
        gauge(
            enc,
            CACHE_PINNED,
            "Bytes of pinned files (never evicted).",
            store.bytes_pinned,
        )?;
        gauge(
            enc,
            CACHE_DEDUP_SAVED,
            "Bytes not stored because identical small files share one copy.",
            store.logical_bytes.saturating_sub(store.bytes_used),
        )?;
        gauge(enc, FILES_CACHED, "Files with data in the cache.", store.objects)?;
        gauge(
            enc,
            JOURNAL_PENDING,
            "Changes made here and not yet at home.",
            j.pending_ops,
        )?;
        gauge(
            enc,
            JOURNAL_OLDEST,
            "Age of the oldest change not yet at home.",
            j.oldest_age_seconds,
        )?;
        gauge(
            enc,
            JOURNAL_FAILED,
            "Queued changes home refused, waiting to be retried.",
            j.failed_ops,
        )?;
        gauge(
            enc,
            JOURNAL_CONFLICTS,
            "Conflicts recorded in this cache directory (see `larder conflicts`).",
            j.conflicts,
        )?;
        counter(enc, READS, "Read requests served by the mount.", fs.reads)?;
        counter(enc, READ_BYTES, "Bytes served by read requests.", fs.read_bytes)?;
        counter(enc, READ_SECONDS, "Time spent serving read requests.", fs.read_seconds)?;
        let mut hits = enc.encode_descriptor(
            TIER_HITS,
            "Reads served per tier (cache: blocks found; home: blocks waited for).",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(store.hits).encode(hits.encode_family(&[("tier", "cache")])?)?;
        if let Some(p) = &self.peers {
            ConstCounter::new(p.hits).encode(hits.encode_family(&[("tier", "peer")])?)?;
        }
        ConstCounter::new(fs.home_waits).encode(hits.encode_family(&[("tier", "home")])?)?;
        let mut served = enc.encode_descriptor(
            TIER_BYTES_SERVED,
            "Bytes handed to readers per tier.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(fs.bytes_from_cache).encode(served.encode_family(&[("tier", "cache")])?)?;
        ConstCounter::new(fs.bytes_from_home).encode(served.encode_family(&[("tier", "home")])?)?;
        if let Some(p) = &self.peers {
            ConstCounter::new(p.bytes).encode(served.encode_family(&[("tier", "peer")])?)?;
        }
        let mut asks = enc.encode_descriptor(
            TIER_ASKS,
            "Units the read path asked of each tier, hit or miss (the cache: blocks not found by a read's \
             first look).",
            None,
            MetricType::Counter,
        )?;
        for t in &self.walk {
            ConstCounter::new(t.asks).encode(asks.encode_family(&[("tier", t.name)])?)?;
        }
        let mut seconds = enc.encode_descriptor(
            TIER_ASK_SECONDS,
            "Time each tier took to answer the read path's asks: with the asks, its mean latency.",
            None,
            MetricType::Counter,
        )?;
        for t in &self.walk {
            ConstCounter::new(t.nanos as f64 / 1e9).encode(seconds.encode_family(&[("tier", t.name)])?)?;
        }
        if let Some(p) = &self.peers {
            counter(enc, PEER_FETCHES, "Units asked of peers.", p.fetches)?;
            let mut answers = enc.encode_descriptor(
                PEER_ANSWERS,
                "Answers to units asked of peers: hit, miss (not held, another version), failure \
                 (unreachable, timed out, refused, corrupt), corrupt (among the failures), skipped (breaker open).",
                None,
                MetricType::Counter,
            )?;
            for (result, n) in [
                ("hit", p.hits),
                ("miss", p.misses),
                ("failure", p.failures),
                ("corrupt", p.corrupt),
                ("skipped", p.skipped),
            ] {
                ConstCounter::new(n).encode(answers.encode_family(&[("result", result)])?)?;
            }
            counter(enc, PEER_BYTES, "Bytes of units got from peers.", p.bytes)?;
            counter(enc, PEER_SERVED, "Units served to peers.", p.served)?;
            counter(
                enc,
                PEER_SERVED_BYTES,
                "Bytes of units served to peers.",
                p.served_bytes,
            )?;
            counter(
                enc,
                PEER_REFUSED,
                "Peer connections and calls refused (failed TLS handshakes, certificates not a live member's).",
                p.refused,
            )?;
            counter(
                enc,
                PEER_TAKEN,
                "Units taken over from members that left or migrated them here.",
                p.taken,
            )?;
            counter(
                enc,
                PEER_MIGRATED,
                "Units this node owned sent to a member with room instead of being evicted.",
                p.migrated,
            )?;
            counter(
                enc,
                PEER_MIGRATED_BYTES,
                "Bytes of the units sent to members with room instead of being evicted.",
                p.migrated_bytes,
            )?;
        }
        if let Some(b) = &self.bank {
            self.encode_bank(enc, b)?;
        }
        if let Some(c) = &self.cluster {
            let mut members = enc.encode_descriptor(
                CLUSTER_MEMBERS,
                "Cluster members in this node's view.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(c.live as i64).encode(members.encode_family(&[("state", "live")])?)?;
            ConstGauge::new(c.members as i64).encode(members.encode_family(&[("state", "registered")])?)?;
            gauge(
                enc,
                CLUSTER_ETCD_ONLINE,
                "1 while etcd answers this node.",
                c.etcd_online as i64,
            )?;
            gauge(
                enc,
                CLUSTER_LEASE_OK,
                "1 while this node renewed its liveness within half its lease.",
                c.lease_ok as i64,
            )?;
            gauge(
                enc,
                CLUSTER_OWNED_UNITS,
                "Units this node holds and owns by the cluster's placement.",
                c.owned_units as i64,
            )?;
            gauge(
                enc,
                CLUSTER_OWNED_BYTES,
                "Bytes of the units this node holds and owns.",
                c.owned_bytes as i64,
            )?;
        }
        // The ratios are left out until they are defined.
        for (name, help, value) in [
            (
                ECDAL,
                "HCCache ECDAL over the mount's life: 1 / (read latency x cache insert bytes).",
                e.ecdal,
            ),
            (
                ECDAB,
                "HCCache ECDAB over the mount's life: read bytes / (read time x cache insert bytes).",
                e.ecdab,
            ),
            (
                ABD,
                "HCCache average block distance of files in eviction order (1: a file's blocks lie together).",
                e.abd,
            ),
        ] {
            if let Some(x) = value {
                gauge(enc, name, help, x)?;
            }
        }
        Ok(())
    }
}

/// Reads the daemon's counters at each scrape.
struct LarderCollector(Arc<StatusSource>);

impl fmt::Debug for LarderCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LarderCollector").finish_non_exhaustive()
    }
}

impl Collector for LarderCollector {
    fn encode(&self, enc: DescriptorEncoder) -> fmt::Result {
        let fs = self.0.fs.stats();
        let store = self.0.fs.store().stats();
        let abd = self.0.fs.store().average_block_distance(ABD_UNITS);
        Figures {
            home: &self.0.counters,
            fs,
            store,
            journal: self.0.fs.journal_stats(),
            efficiency: Efficiency::of(&fs, &store, abd),
            peers: self.0.peer_status(),
            cluster: self.0.cluster.as_ref().map(|(name, m)| {
                let c = crate::status::ClusterStatus::of(name, m, &self.0.fs.held_units());
                ClusterFigures {
                    live: c.members.iter().filter(|m| m.live).count() as u64,
                    members: c.members.len() as u64,
                    etcd_online: c.etcd_online,
                    lease_ok: c.lease_ok,
                    owned_units: c.owned_units,
                    owned_bytes: c.owned_bytes,
                }
            }),
            walk: self.0.fs.tier_stats(),
            bank: self.0.bank.as_ref().map(|b| b.stats()),
            meta: self.0.fs.home_meta_calls(),
        }
        .encode(enc)
    }
}

/// The answer to one HTTP request: status code, content type and body.
fn answer(registry: &Registry, method: &tiny_http::Method, url: &str) -> (u16, &'static str, String) {
    const PLAIN: &str = "text/plain; charset=utf-8";
    let path = url.split('?').next().unwrap_or(url);
    if path != "/metrics" {
        return (404, PLAIN, "not found: metrics are at /metrics\n".into());
    }
    if *method != tiny_http::Method::Get {
        return (405, PLAIN, format!("{method} is not allowed: use GET\n"));
    }
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (200, CONTENT_TYPE, body),
        Err(_) => (500, PLAIN, "the metrics could not be encoded\n".into()),
    }
}

/// What to tell whoever serves the metrics at `addr` when others can read them there: at any address
/// but a loopback one (IPv4 127.0.0.0/8, IPv6 ::1), the server answers anyone who reaches it, and asks
/// for no credentials.
pub fn exposure_warning(addr: SocketAddr) -> Option<String> {
    if addr.ip().to_canonical().is_loopback() {
        return None;
    }
    Some(format!(
        "the metrics at http://{addr}/metrics can be read by anyone who can reach that address (this mount's \
         activity: home operations and bytes, cache use, changes waiting for home; no file names); serve them at \
         a loopback address, e.g. --metrics-addr 127.0.0.1:{}, to keep them on this host",
        addr.port()
    ))
}

/// Serve `GET /metrics` at `addr` from a thread of its own; at an address others can reach, with a
/// warning in the log.
pub fn serve(addr: SocketAddr, source: Arc<StatusSource>) -> Result<()> {
    let server = tiny_http::Server::http(addr).map_err(|e| anyhow!("cannot serve metrics at {addr}: {e}"))?;
    if let Some(warning) = exposure_warning(addr) {
        tracing::warn!("{warning}");
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(LarderCollector(source)));
    std::thread::Builder::new()
        .name("larder-metrics".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let (code, content_type, body) = answer(&registry, request.method(), request.url());
                let mut response = tiny_http::Response::from_string(body).with_status_code(code);
                if let Ok(header) = tiny_http::Header::from_bytes("Content-Type", content_type) {
                    response.add_header(header);
                }
                if code == 405
                    && let Ok(header) = tiny_http::Header::from_bytes("Allow", "GET")
                {
                    response.add_header(header);
                }
                let _ = request.respond(response);
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collector over fixed figures.
    #[derive(Debug, Default)]
    struct Fixed {
        home: HomeCounters,
        fs: FsStats,
        store: StoreStats,
        journal: JournalStats,
        peers: Option<crate::status::PeerStatus>,
        cluster: Option<ClusterFigures>,
        walk: Vec<larder_fs::tier::TierStats>,
        bank: Option<larder_bank::BankStats>,
        meta: [u64; 3],
    }

    impl Collector for Fixed {
        fn encode(&self, enc: DescriptorEncoder) -> fmt::Result {
            Figures {
                home: &self.home,
                fs: self.fs,
                store: self.store,
                journal: self.journal,
                efficiency: Efficiency::of(&self.fs, &self.store, None),
                peers: self.peers,
                cluster: self.cluster,
                walk: self.walk.clone(),
                bank: self.bank.clone(),
                meta: self.meta,
            }
            .encode(enc)
        }
    }

    fn exposition(fixed: Fixed) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(fixed));
        let (code, content_type, body) = answer(&registry, &tiny_http::Method::Get, "/metrics");
        assert_eq!((code, content_type), (200, CONTENT_TYPE));
        body
    }

    fn value(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l[name.len()..].trim().parse().ok())
    }

    #[test]
    fn exposes_the_daemons_counters_under_their_names() {
        let fs = FsStats {
            reads: 3,
            read_bytes: 30_000,
            read_seconds: 0.5,
            bytes_from_home: 7,
            ..FsStats::default()
        };
        let store = StoreStats {
            bytes_used: 20_000,
            inserted_bytes: 20_000,
            hits: 2,
            ..StoreStats::default()
        };
        let journal = JournalStats {
            pending_ops: 4,
            oldest_age_seconds: 1.5,
            home_online: true,
            ..JournalStats::default()
        };
        let text = exposition(Fixed {
            fs,
            store,
            journal,
            meta: [5, 2, 1],
            ..Fixed::default()
        });
        assert_eq!(value(&text, "larder_home_ops_total{op=\"read\"}"), Some(0.0), "{text}");
        assert_eq!(
            value(&text, "larder_home_metadata_calls_total{call=\"lookup\"}"),
            Some(5.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "larder_home_metadata_calls_total{call=\"listing\"}"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "larder_home_metadata_calls_total{call=\"revalidation\"}"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(value(&text, "larder_cache_bytes_used"), Some(20_000.0), "{text}");
        assert_eq!(value(&text, "larder_journal_pending_ops"), Some(4.0), "{text}");
        assert_eq!(value(&text, "larder_journal_oldest_age_seconds"), Some(1.5), "{text}");
        assert_eq!(value(&text, "larder_home_online"), Some(1.0), "{text}");
        assert_eq!(value(&text, "larder_read_bytes_total"), Some(30_000.0), "{text}");
        assert_eq!(value(&text, "larder_read_seconds_total"), Some(0.5), "{text}");
        assert_eq!(
            value(&text, "larder_cache_inserted_bytes_total"),
            Some(20_000.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "larder_tier_bytes_served_total{tier=\"home\"}"),
            Some(7.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "larder_tier_hits_total{tier=\"cache\"}"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(value(&text, "larder_ecdab"), Some(3.0), "{text}");
        assert!(!text.contains("larder_abd"), "abd is undefined yet:\n{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_cluster_nodes_peers_and_members_are_exposed_and_a_lone_nodes_are_not() {
        let peers = crate::status::PeerStatus {
            fetches: 10,
            hits: 6,
            misses: 2,
            failures: 2,
            corrupt: 1,
            skipped: 3,
            bytes: 6 << 20,
            served: 5,
            served_bytes: 5 << 20,
            refused: 4,
            taken: 1,
            migrated: 2,
            migrated_bytes: 2 << 20,
            ..Default::default()
        };
        let cluster = ClusterFigures {
            live: 2,
            members: 3,
            etcd_online: true,
            lease_ok: false,
            owned_units: 12,
            owned_bytes: 12 << 20,
        };
        let tier = |name, asks, nanos| larder_fs::tier::TierStats {
            name,
            asks,
            nanos,
            ..Default::default()
        };
        let text = exposition(Fixed {
            peers: Some(peers),
            cluster: Some(cluster),
            walk: vec![
                tier("cache", 20, 2_000_000),
                tier("peer", 10, 5_000_000),
                tier("home", 4, 40_000_000),
            ],
            ..Fixed::default()
        });
        for (name, want) in [
            ("larder_peer_fetches_total", 10.0),
            ("larder_peer_answers_total{result=\"hit\"}", 6.0),
            ("larder_peer_answers_total{result=\"miss\"}", 2.0),
            ("larder_peer_answers_total{result=\"failure\"}", 2.0),
            ("larder_peer_answers_total{result=\"corrupt\"}", 1.0),
            ("larder_peer_answers_total{result=\"skipped\"}", 3.0),
            ("larder_peer_bytes_total", (6 << 20) as f64),
            ("larder_peer_served_total", 5.0),
            ("larder_peer_served_bytes_total", (5 << 20) as f64),
            ("larder_peer_refused_total", 4.0),
            ("larder_tier_hits_total{tier=\"peer\"}", 6.0),
            ("larder_cluster_members{state=\"live\"}", 2.0),
            ("larder_cluster_members{state=\"registered\"}", 3.0),
            ("larder_cluster_etcd_online", 1.0),
            ("larder_cluster_lease_ok", 0.0),
            ("larder_cluster_owned_units", 12.0),
            ("larder_peer_taken_total", 1.0),
            ("larder_peer_migrated_total", 2.0),
            ("larder_peer_migrated_bytes_total", (2 << 20) as f64),
            ("larder_cluster_owned_bytes", (12 << 20) as f64),
            ("larder_tier_bytes_served_total{tier=\"peer\"}", (6 << 20) as f64),
            ("larder_tier_asks_total{tier=\"cache\"}", 20.0),
            ("larder_tier_asks_total{tier=\"peer\"}", 10.0),
            ("larder_tier_ask_seconds_total{tier=\"peer\"}", 0.005),
            ("larder_tier_ask_seconds_total{tier=\"home\"}", 0.04),
        ] {
            assert_eq!(value(&text, name), Some(want), "{name}:\n{text}");
        }
        let lone = exposition(Fixed::default());
        assert!(
            !lone.contains("larder_peer") && !lone.contains("larder_cluster"),
            "{lone}"
        );
        assert!(!lone.contains("tier=\"peer\""), "{lone}");
    }

    #[test]
    fn the_banks_figures_are_exposed_with_a_bank_only() {
        let bank = larder_bank::BankStats {
            gets: 10,
            hits: 6,
            misses: 4,
            errors: 1,
            bad: 2,
            puts: 5,
            put_errors: 1,
            dropped: 3,
            bytes_read: 600,
            bytes_written: 400,
            servers: 2,
            servers_down: 1,
            ..Default::default()
        };
        let text = exposition(Fixed {
            bank: Some(bank),
            ..Fixed::default()
        });
        for (name, want) in [
            ("larder_bank_gets_total{result=\"hit\"}", 6.0),
            ("larder_bank_gets_total{result=\"miss\"}", 4.0),
            ("larder_bank_gets_total{result=\"error\"}", 1.0),
            ("larder_bank_gets_total{result=\"bad\"}", 2.0),
            ("larder_bank_puts_total{result=\"kept\"}", 4.0),
            ("larder_bank_puts_total{result=\"failed\"}", 1.0),
            ("larder_bank_puts_total{result=\"dropped\"}", 3.0),
            ("larder_bank_bytes_total{direction=\"read\"}", 600.0),
            ("larder_bank_bytes_total{direction=\"written\"}", 400.0),
            ("larder_bank_servers{state=\"all\"}", 2.0),
            ("larder_bank_servers{state=\"skipped\"}", 1.0),
        ] {
            assert_eq!(value(&text, name), Some(want), "{name}:\n{text}");
        }
        assert!(!exposition(Fixed::default()).contains("larder_bank"));
    }

    #[test]
    fn only_get_metrics_is_served() {
        let registry = Registry::default();
        assert_eq!(answer(&registry, &tiny_http::Method::Get, "/").0, 404);
        assert_eq!(answer(&registry, &tiny_http::Method::Get, "/metricsx").0, 404);
        assert_eq!(answer(&registry, &tiny_http::Method::Post, "/metrics").0, 405);
        assert_eq!(answer(&registry, &tiny_http::Method::Get, "/metrics?x=1").0, 200);
    }

    #[test]
    fn only_a_loopback_address_keeps_the_metrics_from_a_warning() {
        for addr in [
            "127.0.0.1:9464",
            "127.3.2.1:9464",
            "[::1]:9464",
            "[::ffff:127.0.0.1]:9464",
        ] {
            assert_eq!(exposure_warning(addr.parse().unwrap()), None, "{addr}");
        }
        for addr in ["0.0.0.0:9464", "10.0.0.5:9464", "[::]:9464", "[fe80::1]:9464"] {
            let warning = exposure_warning(addr.parse().unwrap()).unwrap_or_default();
            assert!(
                warning.contains("anyone") && warning.contains("127.0.0.1:9464"),
                "{addr}: {warning}"
            );
        }
    }
}
