//! The hit path in process: the core and the store, no FUSE, no kernel. Warm lookups (each followed by
//! the kernel's forget), getattrs, 4 KiB reads on open handles, and whole-file reads (open, read 16 KiB,
//! close: a small-file workload) of a fully cached tree by 1 to 16 threads, with the time threads spent waiting for a held lock (see
//! `larder_util::contention`), so that contention shows even on a machine with few cores.
//!
//!     cargo bench -p larder-fs --bench hitpath -- [--files N] [--seconds S] [--threads 1,2,4,8,16]
//!                                                 [--out bench/results/hitpath.json]
//!
//! Each figure is the count completed by all threads in a fixed window. JSON to `--out`, a table on
//! stdout and as Markdown beside the JSON.

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use larder_cache::{Db, Eviction, Store, StoreConfig};
use larder_fs::{Fs, FsConfig};
use larder_home::{Home, PosixHome};

const FILE_SIZE: usize = 16 << 10;
const PER_DIR: usize = 200;

struct Args {
    files: usize,
    seconds: f64,
    threads: Vec<usize>,
    out: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        files: 10_000,
        seconds: 2.0,
        threads: vec![1, 2, 4, 8, 16],
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--files" => a.files = it.next().and_then(|v| v.parse().ok()).expect("--files N"),
            "--seconds" => a.seconds = it.next().and_then(|v| v.parse().ok()).expect("--seconds S"),
            "--threads" => {
                a.threads = it
                    .next()
                    .expect("--threads 1,2,4")
                    .split(',')
                    .map(|t| t.parse().expect("a thread count"))
                    .collect()
            }
            "--out" => a.out = it.next(),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    a
}

/// xorshift64*: each thread its own.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

struct Tree {
    /// (directory inode, file name, file inode)
    files: Vec<(u64, OsString, u64)>,
    /// Open handles of the first files, for reads.
    handles: Vec<u64>,
}

/// Run `op` on `threads` threads for `seconds`; operations per second in all, and the lock waits per
/// operation (count, ns).
fn measure(threads: usize, seconds: f64, op: &(dyn Fn(&mut Rng) + Sync)) -> (f64, f64, f64) {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let (w0, ns0) = larder_util::contention::waits();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, done) = (&stop, &done);
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        op(&mut rng);
                    }
                    n += 64;
                }
                done.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = start.elapsed().as_secs_f64();
    let (w1, ns1) = larder_util::contention::waits();
    let ops = done.load(Ordering::Relaxed) as f64;
    (ops / elapsed, (w1 - w0) as f64 / ops, (ns1 - ns0) as f64 / ops)
}

fn main() {
    let a = args();
    let work = tempfile::tempdir_in("/var/tmp").expect("a scratch directory");
    let home_dir = work.path().join("home");
    let cache_dir = work.path().join("cache");
    std::fs::create_dir_all(&cache_dir).unwrap();
    let dirs = a.files.div_ceil(PER_DIR);
    let body = vec![7u8; FILE_SIZE];
    for d in 0..dirs {
        let dir = home_dir.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..PER_DIR.min(a.files - d * PER_DIR) {
            std::fs::write(dir.join(format!("f{f:04}")), &body).unwrap();
        }
    }
    let home: Arc<dyn Home> = Arc::new(PosixHome::new(&home_dir, Some(Duration::from_secs(10))).unwrap());
    let db = Db::open(&cache_dir.join("index.redb")).unwrap();
    let store = Arc::new(
        Store::open(
            StoreConfig {
                dir: cache_dir.join("objects"),
                block_size: 1 << 20,
                limit: 4 << 30,
                high_watermark: 0.95,
                low_watermark: 0.9,
                dedup: true,
                eviction: Eviction::S3Fifo,
            },
            db,
        )
        .unwrap(),
    );
    let cfg = FsConfig {
        validity_lag: Duration::from_secs(3600),
        conflicts_dir: cache_dir.join("conflicts"),
        ..FsConfig::default()
    };
    let fs = Fs::new(home, store, cfg).unwrap();

    // Warm: every file looked up and read whole.
    let mut tree = Tree {
        files: Vec::new(),
        handles: Vec::new(),
    };
    for d in 0..dirs {
        let dir = fs
            .lookup(1, std::ffi::OsStr::new(&format!("d{d:03}")))
            .unwrap()
            .attr
            .ino;
        for f in 0..PER_DIR.min(a.files - d * PER_DIR) {
            let name = OsString::from(format!("f{f:04}"));
            let ino = fs.lookup(dir, &name).unwrap().attr.ino;
            let r = fs.open(ino, libc::O_RDONLY).unwrap();
            assert_eq!(fs.read(r.fh, 0, FILE_SIZE as u32).unwrap().len(), FILE_SIZE);
            if tree.handles.len() < 1000 {
                tree.handles.push(r.fh);
            } else {
                fs.release(r.fh).unwrap();
            }
            tree.files.push((dir, name, ino));
        }
    }
    let lookups = |rng: &mut Rng| {
        let (dir, name, _) = &tree.files[rng.below(tree.files.len() as u64) as usize];
        let e = fs.lookup(*dir, name).unwrap();
        fs.forget(e.attr.ino, 1);
    };
    let reads = |rng: &mut Rng| {
        let fh = tree.handles[rng.below(tree.handles.len() as u64) as usize];
        let off = rng.below((FILE_SIZE / 4096) as u64) * 4096;
        assert_eq!(fs.read(fh, off, 4096).unwrap().len(), 4096);
    };
    let getattrs = |rng: &mut Rng| {
        let (_, _, ino) = &tree.files[rng.below(tree.files.len() as u64) as usize];
        fs.getattr(*ino).unwrap();
    };
    let whole = |rng: &mut Rng| {
        let (_, _, ino) = &tree.files[rng.below(tree.files.len() as u64) as usize];
        let r = fs.open(*ino, libc::O_RDONLY).unwrap();
        assert_eq!(fs.read(r.fh, 0, FILE_SIZE as u32).unwrap().len(), FILE_SIZE);
        fs.release(r.fh).unwrap();
    };
    let mut rows = Vec::new();
    println!(
        "{} files of {} KiB, {} s per figure",
        tree.files.len(),
        FILE_SIZE >> 10,
        a.seconds
    );
    println!(
        "{:<8} {:>8} {:>14} {:>12} {:>14} {:>12}",
        "op", "threads", "ops/s", "ops/s/thread", "lock waits/op", "wait ns/op"
    );
    for (name, op) in [
        ("lookup", &lookups as &(dyn Fn(&mut Rng) + Sync)),
        ("getattr", &getattrs as &(dyn Fn(&mut Rng) + Sync)),
        ("read4k", &reads as &(dyn Fn(&mut Rng) + Sync)),
        ("openread", &whole as &(dyn Fn(&mut Rng) + Sync)),
    ] {
        for &t in &a.threads {
            let (rate, waits, wait_ns) = measure(t, a.seconds, op);
            println!(
                "{name:<8} {t:>8} {rate:>14.0} {:>12.0} {waits:>14.4} {wait_ns:>12.0}",
                rate / t as f64
            );
            rows.push(serde_json::json!({
                "op": name, "threads": t, "ops_per_s": rate.round(),
                "lock_waits_per_op": waits, "lock_wait_ns_per_op": wait_ns.round(),
            }));
        }
    }
    for fh in tree.handles {
        let _ = fs.release(fh);
    }
    let result = serde_json::json!({
        "files": tree.files.len(), "file_size": FILE_SIZE, "seconds": a.seconds,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "rows": rows,
    });
    if let Some(out) = a.out {
        std::fs::write(&out, serde_json::to_string_pretty(&result).unwrap()).unwrap();
        let mut md = format!(
            "# Hit path in process\n\n{} files of {} KiB, all cached; {} s per figure; `cargo bench -p larder-fs --bench hitpath`.\n\n| op | threads | ops/s | ops/s per thread | lock waits/op | wait ns/op |\n|---|---:|---:|---:|---:|---:|\n",
            result["files"],
            FILE_SIZE >> 10,
            a.seconds
        );
        for r in result["rows"].as_array().unwrap() {
            let rate = r["ops_per_s"].as_f64().unwrap();
            let t = r["threads"].as_u64().unwrap();
            md.push_str(&format!(
                "| {} | {t} | {rate:.0} | {:.0} | {:.4} | {} |\n",
                r["op"].as_str().unwrap(),
                rate / t as f64,
                r["lock_waits_per_op"].as_f64().unwrap(),
                r["lock_wait_ns_per_op"]
            ));
        }
        std::fs::write(std::path::Path::new(&out).with_extension("md"), md).unwrap();
        println!("JSON: {out}");
    }
}
