//! The peer transport alone, in one process over loopback with mutual TLS: a server answering from memory
//! and a client asking it, so that what the transport costs is seen apart from caches, FUSE and the
//! network between namespaces.
//!
//! - 4 KiB units asked one after another: latency (median, p99) per fetch.
//! - 1 MiB units asked by several threads at once: MiB/s, and the process's CPU seconds per GiB.
//!
//! `cargo bench -p larder-cluster --bench transport [-- --seconds S --threads N --malloc-defaults
//!                                                  --out $PWD/bench/results/transport.json]`
//! (with `--out`, an absolute path: benches run in the crate's directory; a table beside it in `.md`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_cluster::peer::{Ask, PeerClient, PeerConfig, PeerServer, PeerStats, ServeError, UnitSource, digest};
use larder_cluster::{MemberRecord, NodeTls, tls};
use prost::bytes::Bytes;

struct Memory(HashMap<Vec<u8>, Bytes>);

impl UnitSource for Memory {
    fn unit(&self, ask: &Ask) -> Result<Bytes, ServeError> {
        self.0.get(ask.key).cloned().ok_or(ServeError::NotHeld)
    }
}

/// CPU seconds this process has used.
fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; it is left zeroed if it fails.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    // The allocator as the daemon sets it (`keep_large_buffers`), unless `--malloc-defaults`.
    let malloc_defaults = std::env::args().any(|a| a == "--malloc-defaults");
    if !malloc_defaults {
        // SAFETY: plain settings of the allocator, before any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        }
    }
    let seconds: f64 = arg("--seconds").unwrap_or(3.0);
    let threads: usize = arg("--threads").unwrap_or(8);
    let out: Option<String> = arg("--out");
    let dir = tempfile::tempdir().unwrap();
    tls::init(dir.path()).unwrap();
    for n in ["server", "client"] {
        tls::issue(dir.path(), n, false).unwrap();
    }
    let (s, c) = (
        NodeTls::load(dir.path(), "server").unwrap(),
        NodeTls::load(dir.path(), "client").unwrap(),
    );
    let mut units = HashMap::new();
    units.insert(b"small".to_vec(), Bytes::from(vec![7u8; 4096]));
    units.insert(b"large".to_vec(), Bytes::from(vec![9u8; 1 << 20]));
    let server = PeerServer::start(
        "127.0.0.1:0".parse().unwrap(),
        s.server_config(),
        Arc::new(|_: &tls::Peer| true),
        Duration::ZERO,
        Arc::new(Memory(units)),
        Arc::new(PeerStats::default()),
    )
    .unwrap();
    let peer = MemberRecord {
        id: 1,
        name: "server".into(),
        addr: server.addr().to_string(),
        weight: 1,
        fingerprint: s.fingerprint().to_string(),
        serve: true,
    };
    let client = Arc::new(
        PeerClient::new(
            2,
            PeerConfig::default(),
            c.client_config(),
            Arc::new(PeerStats::default()),
        )
        .unwrap(),
    );
    let fetch = |client: &PeerClient, key: &[u8]| {
        let d = digest(key);
        let ask = Ask {
            key,
            digest: &d,
            path: b"f",
            index: 0,
            forward: false,
            from: None,
            asker: 2,
        };
        client.fetch(&peer, &ask).unwrap()
    };
    for _ in 0..100 {
        fetch(&client, b"small");
    }
    let mut lat = Vec::new();
    let (cpu0, start) = (cpu_seconds(), Instant::now());
    while start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        fetch(&client, b"small");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let cpu_us = (cpu_seconds() - cpu0) * 1e6 / lat.len() as f64;
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!(
        "4 KiB one at a time: {} fetches, median {:.0} µs, p90 {:.0} µs, p99 {:.0} µs; {cpu_us:.0} CPU µs each",
        lat.len(),
        q(0.5),
        q(0.9),
        q(0.99)
    );
    if threads == 0 {
        return;
    }
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let total: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let client = &client;
                let fetch = &fetch;
                scope.spawn(move || {
                    let mut n = 0u64;
                    while t0.elapsed().as_secs_f64() < seconds {
                        n += fetch(client, b"large").len() as u64;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let (cpu, wall) = (cpu_seconds() - cpu0, t0.elapsed().as_secs_f64());
    let gib = total as f64 / (1u64 << 30) as f64;
    let (mib_s, cpu_per_gib) = (gib * 1024.0 / wall, cpu / gib);
    println!("1 MiB by {threads} threads: {mib_s:.0} MiB/s, {cpu_per_gib:.2} CPU s per GiB (client and server)");
    let Some(out) = out else { return };
    let allocator = if malloc_defaults {
        "glibc defaults"
    } else {
        "as the daemon sets it"
    };
    let result = serde_json::json!({
        "seconds": seconds, "threads": threads, "allocator": allocator,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "small": {"fetches": lat.len(), "median_us": q(0.5).round(), "p90_us": q(0.9).round(),
                  "p99_us": q(0.99).round(), "cpu_us_each": cpu_us.round()},
        "large": {"mib_per_s": mib_s.round(), "cpu_s_per_gib": (cpu_per_gib * 100.0).round() / 100.0},
    });
    std::fs::write(&out, serde_json::to_string_pretty(&result).unwrap()).unwrap();
    let md = format!(
        "# Peer transport in process\n\nA server answering from memory and a client in one process, over \
         loopback with mutual TLS; allocator {allocator}; {seconds} s per figure; \
         `cargo bench -p larder-cluster --bench transport`.\n\n\
         | figure | value |\n|---|---:|\n\
         | 4 KiB units one at a time: median µs | {:.0} |\n| p90 µs | {:.0} |\n| p99 µs | {:.0} |\n\
         | CPU µs per 4 KiB fetch (both ends) | {cpu_us:.0} |\n\
         | 1 MiB units by {threads} threads: MiB/s | {mib_s:.0} |\n\
         | CPU s per GiB (both ends) | {cpu_per_gib:.2} |\n",
        q(0.5),
        q(0.9),
        q(0.99)
    );
    std::fs::write(std::path::Path::new(&out).with_extension("md"), md).unwrap();
}
