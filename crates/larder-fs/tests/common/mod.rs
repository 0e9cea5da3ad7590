//! What the core's tests share: a home and a cache directory in a scratch directory, and the store they
//! open in the cache directory; for the tests of the core without a mount, a [`Setup`] that starts file
//! systems over a real POSIX home there (counted by the metrics layer, seen through fault layers), the
//! write-back configurations they use, layers that hold a call to home until the test releases it, and
//! small helpers to resolve, read, write and list.

// Each test binary that includes this module uses a subset of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use larder_cache::{CacheResult, Db, Eviction, Store, StoreConfig};
use larder_fs::tier::Tier;
use larder_fs::{Drained, Fs, FsConfig, FsError};
use larder_home::{
    FaultLayer, FileKind, Home, HomeCounters, HomeResult, Layer, Layered, MetricsLayer, OpKind, PosixHome,
};

/// Block size of the tests' stores: small, so that a few KiB span several blocks.
pub const BS: u64 = 64 << 10;

/// A scratch directory with `home` and `cache` made in it (removed when the first value is dropped).
pub fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home_dir = dir.path().join("home");
    let cache_dir = dir.path().join("cache");
    std::fs::create_dir_all(&home_dir).unwrap();
    std::fs::create_dir_all(&cache_dir).unwrap();
    (dir, home_dir, cache_dir)
}

/// The store (and its index) in `cache_dir`: 64 MiB, blocks of [`BS`], dedup on, S3-FIFO.
pub fn open_store(cache_dir: &Path) -> CacheResult<Arc<Store>> {
    open_store_of(cache_dir, 64 << 20)
}

/// The same, holding `limit` bytes.
pub fn open_store_of(cache_dir: &Path, limit: u64) -> CacheResult<Arc<Store>> {
    let db = Db::open(&cache_dir.join("index.redb"))?;
    let cfg = StoreConfig {
        dir: cache_dir.join("objects"),
        block_size: BS,
        limit,
        high_watermark: 0.95,
        low_watermark: 0.9,
        dedup: true,
        eviction: Eviction::S3Fifo,
    };
    Ok(Arc::new(Store::open(cfg, db)?))
}

pub struct Setup {
    _dir: tempfile::TempDir,
    pub home_dir: PathBuf,
    pub cache_dir: PathBuf,
    /// Bytes the store holds.
    store_limit: std::cell::Cell<u64>,
}

impl Setup {
    pub fn new() -> Setup {
        let (dir, home_dir, cache_dir) = dirs();
        Setup {
            _dir: dir,
            home_dir,
            cache_dir,
            store_limit: std::cell::Cell::new(64 << 20),
        }
    }

    /// A directory `rel` at home holding `n` files `f0`, `f1`, ..., each `content`.
    pub fn home_dir_of_files(&self, rel: &str, n: usize, content: &[u8]) {
        std::fs::create_dir(self.home(rel)).unwrap();
        for i in 0..n {
            std::fs::write(self.home(&format!("{rel}/f{i}")), content).unwrap();
        }
    }

    /// Whether the index in the cache dir holds a record of `ino` (no file system open on it).
    pub fn index_has_record(&self, ino: u64) -> bool {
        let db = larder_cache::Db::open(&self.cache_dir.join("index.redb")).unwrap();
        let found = db.inode(ino).unwrap().is_some();
        db.close().unwrap();
        found
    }

    pub fn home(&self, rel: &str) -> PathBuf {
        self.home_dir.join(rel)
    }

    /// A file system over the home, with its counters.
    pub fn fs(&self, lag: Duration) -> (Fs, Arc<HomeCounters>) {
        self.fs_with_faults(lag, Arc::new(FaultLayer::default()))
    }

    /// The same, with a fault layer between the core and home.
    pub fn fs_with_faults(&self, lag: Duration, faults: Arc<FaultLayer>) -> (Fs, Arc<HomeCounters>) {
        self.fs_configured(
            faults,
            FsConfig {
                write_mode: larder_fs::WriteMode::WriteThrough,
                validity_lag: lag,
                ingest_streams: 2,
                ..FsConfig::default()
            },
        )
    }

    /// A started write-back file system that pushes at once, one op at a time, through `faults`.
    pub fn write_back(&self, faults: Arc<FaultLayer>) -> Arc<Fs> {
        let (fs, _) = self.fs_configured(faults, pushing_at_once(Duration::from_secs(3600)));
        let fs = Arc::new(fs);
        fs.start();
        fs
    }

    pub fn fs_configured(&self, faults: Arc<FaultLayer>, cfg: FsConfig) -> (Fs, Arc<HomeCounters>) {
        self.fs_tiered(faults, cfg, &self.cache_dir, Vec::new())
    }

    /// A file system whose home is seen through `layer` as well (nearest home), then `faults`.
    pub fn fs_layered<L: Layer>(&self, layer: L, faults: Arc<FaultLayer>, cfg: FsConfig) -> Fs {
        let posix: Arc<dyn Home> = Arc::new(PosixHome::new(&self.home_dir, Some(Duration::from_secs(10))).unwrap());
        let held: Arc<dyn Home> = Arc::new(Layered::new(posix, layer));
        let home: Arc<dyn Home> = Arc::new(Layered::new(held, faults));
        let mut cfg = cfg;
        cfg.conflicts_dir = self.cache_dir.join("conflicts");
        std::fs::create_dir_all(&self.cache_dir).unwrap();
        let store = open_store_of(&self.cache_dir, self.store_limit.get()).unwrap();
        Fs::with_tiers(home, store, cfg, larder_home::Health::new(), Vec::new()).unwrap()
    }

    /// The file system started again over this cache with room for 6 blocks only (a 4-block file written
    /// here and 2 others): not started, so that the caller orders its flushers and its reads.
    pub fn reopened_with_room_for_six(&self, cfg: FsConfig) -> Arc<Fs> {
        self.store_limit.set(6 * BS);
        Arc::new(self.fs_configured(Arc::new(FaultLayer::default()), cfg).0)
    }

    /// Four files `g0`..`g3` of 4 blocks each at home: reads that fill a small cache.
    pub fn others_at_home(&self) {
        for i in 0..4 {
            std::fs::write(self.home(&format!("g{i}")), pattern(4 * BS as usize, 10 + i as u8)).unwrap();
        }
    }

    /// `rel`, written here as `ours` and waiting for home when the cache filled, still reads `ours` from
    /// the cache, and home has it after a drain. Shuts `fs` down.
    pub fn kept_then_pushed(&self, fs: &Fs, rel: &str, ours: &[u8]) {
        let f = resolve(fs, rel).unwrap();
        assert!(
            read_file(fs, f) == ours,
            "{rel}, waiting for home, lost its bytes in the cache"
        );
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
        assert!(
            std::fs::read(self.home(rel)).unwrap() == ours,
            "home lacks {rel}'s written bytes"
        );
        fs.shutdown().unwrap();
        fs.stop_flushers();
    }

    /// A file system caching in `cache_dir`, reading through `between` after its store and before home.
    pub fn fs_tiered(
        &self,
        faults: Arc<FaultLayer>,
        mut cfg: FsConfig,
        cache_dir: &Path,
        between: Vec<Arc<dyn Tier>>,
    ) -> (Fs, Arc<HomeCounters>) {
        // The default is shared by the whole machine: each test keeps its conflicts to itself.
        cfg.conflicts_dir = cache_dir.join("conflicts");
        let counters = Arc::new(HomeCounters::default());
        let posix: Arc<dyn Home> = Arc::new(PosixHome::new(&self.home_dir, Some(Duration::from_secs(10))).unwrap());
        let faulty: Arc<dyn Home> = Arc::new(Layered::new(posix, faults));
        let home: Arc<dyn Home> = Arc::new(Layered::new(faulty, MetricsLayer(counters.clone())));
        std::fs::create_dir_all(cache_dir).unwrap();
        let store = open_store_of(cache_dir, self.store_limit.get()).unwrap();
        let fs = Fs::with_tiers(home, store, cfg, larder_home::Health::new(), between).unwrap();
        (fs, counters)
    }
}

/// Write-back that pushes each change at once, one at a time, and trusts what it knows for `lag`.
pub fn pushing_at_once(lag: Duration) -> FsConfig {
    FsConfig {
        validity_lag: lag,
        write_mode: larder_fs::WriteMode::WriteBack,
        sync_lag: Duration::ZERO,
        flush_threads: 1,
        ..FsConfig::default()
    }
}

/// Write-back that pushes nothing within an hour and trusts what it knows as long: changes wait in the
/// cache.
pub fn held_back() -> FsConfig {
    FsConfig {
        validity_lag: Duration::from_secs(3600),
        write_mode: larder_fs::WriteMode::WriteBack,
        sync_lag: Duration::from_secs(3600),
        ..FsConfig::default()
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Resolve a relative path to an inode through lookups.
pub fn resolve(fs: &Fs, path: &str) -> Result<u64, FsError> {
    let mut ino = 1;
    for part in Path::new(path).iter() {
        ino = fs.lookup(ino, part)?.attr.ino;
    }
    Ok(ino)
}

/// Open `ino` for writing, write `bytes` at `offset`, and close it (flush, release).
pub fn write_closed(fs: &Fs, ino: u64, offset: u64, bytes: &[u8]) {
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    fs.write(r.fh, offset, bytes).unwrap();
    fs.flush(r.fh).unwrap();
    fs.release(r.fh).unwrap();
}

/// Wait (at most 20 s) until `done` holds; `what` did not happen otherwise.
pub fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn read_file(fs: &Fs, ino: u64) -> Vec<u8> {
    let reply = fs.open(ino, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    loop {
        let chunk = fs.read(reply.fh, out.len() as u64, 100_000).unwrap();
        if chunk.is_empty() {
            break;
        }
        out.extend(chunk);
    }
    fs.release(reply.fh).unwrap();
    out
}

/// Holds the answer of the next operation of a kind home carries out, once home carried it out, until
/// released: an answer asked before something lands at home and taken in after, or a change that landed
/// at home and is not yet known to have.
pub struct HoldAnswer {
    pub op: OpKind,
    /// A second kind it holds as well.
    pub or: Option<OpKind>,
    /// (armed, held, released)
    state: std::sync::Mutex<(bool, bool, bool)>,
    changed: std::sync::Condvar,
}

impl HoldAnswer {
    pub fn new(op: OpKind) -> HoldAnswer {
        HoldAnswer {
            op,
            or: None,
            state: Default::default(),
            changed: Default::default(),
        }
    }

    /// Holds operations of either kind: a file's data goes home in its create (a file made here) or in a
    /// write (one home has).
    pub fn either(op: OpKind, or: OpKind) -> HoldAnswer {
        HoldAnswer {
            or: Some(or),
            ..HoldAnswer::new(op)
        }
    }

    pub fn arm(&self) {
        *self.state.lock().unwrap() = (true, false, false);
    }

    pub fn wait_held(&self) {
        let s = self.state.lock().unwrap();
        let (s, timeout) = self
            .changed
            .wait_timeout_while(s, Duration::from_secs(20), |s| !s.1)
            .unwrap();
        assert!(!timeout.timed_out() && s.1, "no {:?} reached home", self.op);
    }

    pub fn release(&self) {
        self.state.lock().unwrap().2 = true;
        self.changed.notify_all();
    }
}

impl HoldAnswer {
    /// If armed and `op` is its kind: held here until released.
    pub fn hold(&self, op: OpKind) {
        if op != self.op && Some(op) != self.or {
            return;
        }
        let mut s = self.state.lock().unwrap();
        if !s.0 {
            return;
        }
        s.0 = false;
        s.1 = true;
        self.changed.notify_all();
        let _released = self
            .changed
            .wait_timeout_while(s, Duration::from_secs(20), |s| !s.2)
            .unwrap();
    }
}

impl Layer for HoldAnswer {
    fn answer(&self, op: OpKind) -> HomeResult<()> {
        self.hold(op);
        Ok(())
    }
}

/// Holds the next call of its kind before home is asked (whatever home answers), until released.
pub struct HoldAsking(pub HoldAnswer);

impl Layer for HoldAsking {
    fn before(&self, op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        self.0.hold(op);
        Ok(())
    }
}

/// Names of the entries of directory `ino` (without `.` and `..`), sorted.
pub fn list(fs: &Fs, ino: u64) -> Vec<String> {
    let fh = fs.opendir(ino).unwrap();
    let mut names: Vec<String> = fs
        .readdir(fh, 0)
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.name.into_string().unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    fs.releasedir(fh);
    names.sort();
    names
}

/// Names and attributes of `dir` as the core shows them: (name, kind, perm, size, nlink), sorted.
pub fn shown(fs: &Fs, dir: u64) -> Vec<(String, FileKind, u32, u64, u32)> {
    let fh = fs.opendir(dir).unwrap();
    let items = fs.readdir(fh, 0).unwrap();
    fs.releasedir(fh);
    let mut out: Vec<_> = items
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e.name != "." && e.name != "..")
        .map(|e| {
            let a = fs.lookup(dir, &e.name).unwrap().attr;
            (
                e.name.to_string_lossy().into_owned(),
                a.kind,
                a.perm & 0o7777,
                a.size,
                a.nlink,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
