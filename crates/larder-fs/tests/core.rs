//! The core without a mount: a real POSIX home in a temporary directory, counted by the metrics layer.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use larder_fs::tier::{FaultTier, Faults, MemoryTier, Tier};
use larder_fs::{Drained, Fs, FsConfig, FsError};
use larder_home::{
    Fault, FaultLayer, FileKind, Home, HomeCounters, HomeError, HomeResult, Layer, Layered, MetricsLayer, OpKind,
    PosixHome, SetAttr,
};

mod common;
use common::BS;

struct Setup {
    _dir: tempfile::TempDir,
    home_dir: PathBuf,
    cache_dir: PathBuf,
    /// Bytes the store holds.
    store_limit: std::cell::Cell<u64>,
}

impl Setup {
    fn new() -> Setup {
        let (dir, home_dir, cache_dir) = common::dirs();
        Setup {
            _dir: dir,
            home_dir,
            cache_dir,
            store_limit: std::cell::Cell::new(64 << 20),
        }
    }

    /// A directory `rel` at home holding `n` files `f0`, `f1`, ..., each `content`.
    fn home_dir_of_files(&self, rel: &str, n: usize, content: &[u8]) {
        std::fs::create_dir(self.home(rel)).unwrap();
        for i in 0..n {
            std::fs::write(self.home(&format!("{rel}/f{i}")), content).unwrap();
        }
    }

    /// Whether the index in the cache dir holds a record of `ino` (no file system open on it).
    fn index_has_record(&self, ino: u64) -> bool {
        let db = larder_cache::Db::open(&self.cache_dir.join("index.redb")).unwrap();
        let found = db.inode(ino).unwrap().is_some();
        db.close().unwrap();
        found
    }

    fn home(&self, rel: &str) -> PathBuf {
        self.home_dir.join(rel)
    }

    /// A file system over the home, with its counters.
    fn fs(&self, lag: Duration) -> (Fs, Arc<HomeCounters>) {
        self.fs_with_faults(lag, Arc::new(FaultLayer::default()))
    }

    /// The same, with a fault layer between the core and home.
    fn fs_with_faults(&self, lag: Duration, faults: Arc<FaultLayer>) -> (Fs, Arc<HomeCounters>) {
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
    fn write_back(&self, faults: Arc<FaultLayer>) -> Arc<Fs> {
        let (fs, _) = self.fs_configured(faults, pushing_at_once(Duration::from_secs(3600)));
        let fs = Arc::new(fs);
        fs.start();
        fs
    }

    fn fs_configured(&self, faults: Arc<FaultLayer>, cfg: FsConfig) -> (Fs, Arc<HomeCounters>) {
        self.fs_tiered(faults, cfg, &self.cache_dir, Vec::new())
    }

    /// A file system whose home is seen through `layer` as well (nearest home), then `faults`.
    fn fs_layered<L: Layer>(&self, layer: L, faults: Arc<FaultLayer>, cfg: FsConfig) -> Fs {
        let posix: Arc<dyn Home> = Arc::new(PosixHome::new(&self.home_dir, Some(Duration::from_secs(10))).unwrap());
        let held: Arc<dyn Home> = Arc::new(Layered::new(posix, layer));
        let home: Arc<dyn Home> = Arc::new(Layered::new(held, faults));
        let mut cfg = cfg;
        cfg.conflicts_dir = self.cache_dir.join("conflicts");
        std::fs::create_dir_all(&self.cache_dir).unwrap();
        let store = common::open_store_of(&self.cache_dir, self.store_limit.get()).unwrap();
        Fs::with_tiers(home, store, cfg, larder_home::Health::new(), Vec::new()).unwrap()
    }

    /// The file system started again over this cache with room for 6 blocks only (a 4-block file written
    /// here and 2 others): not started, so that the caller orders its flushers and its reads.
    fn reopened_with_room_for_six(&self, cfg: FsConfig) -> Arc<Fs> {
        self.store_limit.set(6 * BS);
        Arc::new(self.fs_configured(Arc::new(FaultLayer::default()), cfg).0)
    }

    /// Four files `g0`..`g3` of 4 blocks each at home: reads that fill a small cache.
    fn others_at_home(&self) {
        for i in 0..4 {
            std::fs::write(self.home(&format!("g{i}")), pattern(4 * BS as usize, 10 + i as u8)).unwrap();
        }
    }

    /// `rel`, written here as `ours` and waiting for home when the cache filled, still reads `ours` from
    /// the cache, and home has it after a drain. Shuts `fs` down.
    fn kept_then_pushed(&self, fs: &Fs, rel: &str, ours: &[u8]) {
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
    fn fs_tiered(
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
        let store = common::open_store_of(cache_dir, self.store_limit.get()).unwrap();
        let fs = Fs::with_tiers(home, store, cfg, larder_home::Health::new(), between).unwrap();
        (fs, counters)
    }
}

/// Write-back that pushes each change at once, one at a time, and trusts what it knows for `lag`.
fn pushing_at_once(lag: Duration) -> FsConfig {
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
fn held_back() -> FsConfig {
    FsConfig {
        validity_lag: Duration::from_secs(3600),
        write_mode: larder_fs::WriteMode::WriteBack,
        sync_lag: Duration::from_secs(3600),
        ..FsConfig::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Resolve a relative path to an inode through lookups.
fn resolve(fs: &Fs, path: &str) -> Result<u64, FsError> {
    let mut ino = 1;
    for part in Path::new(path).iter() {
        ino = fs.lookup(ino, part)?.attr.ino;
    }
    Ok(ino)
}

/// Read the files of [`Setup::others_at_home`] whole, each checked.
fn fill_with_others(fs: &Fs) {
    for i in 0..4 {
        let g = resolve(fs, &format!("g{i}")).unwrap();
        assert!(read_file(fs, g) == pattern(4 * BS as usize, 10 + i as u8));
    }
}

/// Open `ino` for writing, write `bytes` at `offset`, and close it (flush, release).
fn write_closed(fs: &Fs, ino: u64, offset: u64, bytes: &[u8]) {
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    fs.write(r.fh, offset, bytes).unwrap();
    fs.flush(r.fh).unwrap();
    fs.release(r.fh).unwrap();
}

/// Wait (at most 20 s) until `done` holds; `what` did not happen otherwise.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Rewrite `ino` with `bytes` as `O_TRUNC` then a write do, and close it.
fn rewrite(fs: &Fs, ino: u64, bytes: &[u8]) {
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    fs.setattr(
        ino,
        &SetAttr {
            size: Some(0),
            ..SetAttr::default()
        },
    )
    .unwrap();
    fs.write(r.fh, 0, bytes).unwrap();
    fs.flush(r.fh).unwrap();
    fs.release(r.fh).unwrap();
}

/// Stop `fs` without a shutdown, as a kill does: the index keeps what was written to it.
fn killed(fs: &Fs) {
    fs.stop_flushers();
    fs.store().db().close().unwrap();
}

fn read_file(fs: &Fs, ino: u64) -> Vec<u8> {
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

#[test]
fn a_miss_in_a_directory_nobody_listed_lists_it_once_and_creates_there_ask_home_nothing_first() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    for i in 0..30 {
        std::fs::write(s.home(&format!("d/old{i}")), b"x").unwrap();
    }
    let (fs, c) = s.fs_configured(
        Arc::new(FaultLayer::default()),
        // Nothing pushed while the test counts home calls.
        held_back(),
    );
    let d = resolve(&fs, "d").unwrap();
    let before = (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat));
    // The kernel looks each name up before it creates it: the first miss lists the directory, and the
    // rest of the misses, the creates and the lookups of the old names are answered from that listing.
    for i in 0..100 {
        let name = format!("new{i}");
        assert!(matches!(fs.lookup(d, OsStr::new(&name)), Err(FsError::NotFound)));
        let (_, r) = fs.create(d, OsStr::new(&name), 0o644, libc::O_WRONLY, 0, 0).unwrap();
        fs.release(r.fh).unwrap();
    }
    for i in 0..30 {
        assert_eq!(fs.lookup(d, OsStr::new(&format!("old{i}"))).unwrap().attr.size, 1);
    }
    assert_eq!(
        (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat)),
        (before.0 + 1, before.1),
        "one listing of the directory, no stat"
    );
}

#[test]
fn inodes_the_kernel_forgot_leave_memory_and_come_back_from_the_index_asking_home_nothing() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    for i in 0..50 {
        std::fs::write(s.home(&format!("d/f{i:02}")), format!("content {i}")).unwrap();
    }
    let (fs, c) = s.fs_configured(
        Arc::new(FaultLayer::default()),
        // Nothing pushed: a file written here keeps a change queued.
        held_back(),
    );
    let d = resolve(&fs, "d").unwrap();
    let mut inos = Vec::new();
    for i in 0..50 {
        let ino = fs.lookup(d, OsStr::new(&format!("f{i:02}"))).unwrap().attr.ino;
        assert_eq!(read_file(&fs, ino), format!("content {i}").as_bytes());
        inos.push(ino);
    }
    // One of them changed here, not pushed yet.
    let w = fs.open(inos[7], libc::O_WRONLY).unwrap();
    fs.write(w.fh, 0, b"CHANGED").unwrap();
    fs.release(w.fh).unwrap();
    let in_memory = fs.stats().inodes;
    assert!(in_memory >= 52, "{in_memory} inodes in memory");
    // The kernel forgets every file: all but the changed one leave memory.
    for &ino in &inos {
        fs.forget(ino, 1);
    }
    let stats = fs.stats();
    assert_eq!(
        stats.inodes,
        in_memory - 49,
        "every clean file the kernel forgot left memory"
    );
    assert_eq!(stats.inodes_reclaimed, 49);
    let before = (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat));
    // They come back from the index, the same inodes with the same content, vouched for by the listing
    // within the validity lag: home is asked nothing.
    for (i, &ino) in inos.iter().enumerate() {
        let e = fs.lookup(d, OsStr::new(&format!("f{i:02}"))).unwrap();
        assert_eq!(e.attr.ino, ino);
        let want = if i == 7 {
            "CHANGED 7".to_string()
        } else {
            format!("content {i}")
        };
        assert_eq!(fs.getattr(ino).unwrap().attr.size, want.len() as u64);
        assert_eq!(read_file(&fs, ino), want.as_bytes());
    }
    assert_eq!(fs.stats().inodes_reloaded, 49);
    // A name the listing did not have is still known absent, and a listing shows every name.
    assert!(matches!(fs.lookup(d, OsStr::new("nope")), Err(FsError::NotFound)));
    for &ino in &inos {
        fs.forget(ino, 1);
    }
    let want: Vec<String> = (0..50).map(|i| format!("f{i:02}")).collect();
    assert_eq!(list(&fs, d), want);
    assert_eq!(
        (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat)),
        before,
        "nothing asked of home for inodes that came back from the index"
    );
}

#[test]
fn a_listing_within_the_validity_lag_is_trusted_across_a_clean_restart_only() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    for i in 0..20 {
        std::fs::write(s.home(&format!("d/f{i}")), format!("v{i}")).unwrap();
    }
    let cfg = |lag: u64| FsConfig {
        validity_lag: Duration::from_millis(lag),
        write_mode: larder_fs::WriteMode::WriteBack,
        ..FsConfig::default()
    };
    let calls = |c: &HomeCounters| c.ops_of(OpKind::List) + c.ops_of(OpKind::Stat);
    let walk = |fs: &Fs| {
        let d = resolve(fs, "d").unwrap();
        assert_eq!(list(fs, d).len(), 20);
        for i in 0..20 {
            let ino = fs.lookup(d, OsStr::new(&format!("f{i}"))).unwrap().attr.ino;
            assert_eq!(fs.getattr(ino).unwrap().attr.size, format!("v{i}").len() as u64);
            assert_eq!(fs.getattr(d).unwrap().attr.kind, FileKind::Dir);
        }
    };
    {
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), cfg(3_600_000));
        walk(&fs);
        fs.shutdown().unwrap();
    }
    // A clean stop kept the listings: the walk after the restart asks home nothing (but the root's stat,
    // which every start makes).
    {
        let (fs, c) = s.fs_configured(Arc::new(FaultLayer::default()), cfg(3_600_000));
        let at_start = calls(&c);
        walk(&fs);
        assert_eq!(calls(&c), at_start, "the walk after a clean restart asked home");
        // As close to a crash as one process allows: the index let go of without the clean-stop mark.
        fs.store().db().close().unwrap();
    }
    // Without a clean stop, the listings are not trusted: each directory is listed once again.
    {
        let (fs, c) = s.fs_configured(Arc::new(FaultLayer::default()), cfg(3_600_000));
        let at_start = calls(&c);
        walk(&fs);
        assert_eq!(
            c.ops_of(OpKind::List) + c.ops_of(OpKind::Stat) - at_start,
            2,
            "root and d listed again"
        );
        fs.shutdown().unwrap();
    }
    // Past the lag, they are not trusted either.
    {
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), cfg(300));
        walk(&fs);
        fs.shutdown().unwrap();
    }
    std::thread::sleep(Duration::from_millis(400));
    let (fs, c) = s.fs_configured(Arc::new(FaultLayer::default()), cfg(300));
    let at_start = calls(&c);
    walk(&fs);
    assert!(calls(&c) > at_start, "a listing past the lag was trusted");
}

#[test]
fn lookups_missing_together_in_a_directory_make_one_listing() {
    let s = Setup::new();
    s.home_dir_of_files("big", 3000, b"x");
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let fs = Arc::new(fs);
    let d = resolve(&fs, "big").unwrap();
    let before = c.ops_of(OpKind::List);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let name = format!("f{}", t * 300);
                assert_eq!(fs.lookup(d, OsStr::new(&name)).unwrap().attr.size, 1);
                assert!(matches!(
                    fs.lookup(d, OsStr::new(&format!("none{t}"))),
                    Err(FsError::NotFound)
                ));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        c.ops_of(OpKind::List) - before,
        1,
        "one listing for every lookup that missed together"
    );
}

#[test]
fn past_the_lag_a_walk_finds_its_directories_revalidated_ahead_of_it() {
    let s = Setup::new();
    for d in 0..10 {
        std::fs::create_dir_all(s.home(&format!("t/d{d}"))).unwrap();
        for f in 0..5 {
            std::fs::write(s.home(&format!("t/d{d}/f{f}")), b"x").unwrap();
        }
    }
    let lag = Duration::from_secs(2);
    let (fs, c) = s.fs_configured(
        Arc::new(FaultLayer::default()),
        FsConfig {
            validity_lag: lag,
            write_mode: larder_fs::WriteMode::WriteBack,
            ..FsConfig::default()
        },
    );
    let fs = Arc::new(fs);
    fs.start();
    let t = resolve(&fs, "t").unwrap();
    let walk = |fs: &Fs| {
        assert_eq!(list(fs, t).len(), 10);
        for d in 0..10 {
            let ino = fs.lookup(t, OsStr::new(&format!("d{d}"))).unwrap().attr.ino;
            assert_eq!(list(fs, ino).len(), 5);
        }
    };
    walk(&fs);
    std::thread::sleep(lag + Duration::from_millis(100));
    let before = c.ops_of(OpKind::List);
    // Revalidating the top of the tree queues its subdirectories, listed before, to be listed ahead.
    assert_eq!(list(&fs, t).len(), 10);
    let ahead = |fs: &Fs| fs.stats().listings_ahead;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ahead(&fs) < 10 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ahead(&fs), 10, "every subdirectory was revalidated ahead of the walk");
    walk(&fs);
    assert_eq!(
        c.ops_of(OpKind::List) - before,
        11,
        "one listing per directory, the walk's own none"
    );
    // Past the lag again, a listing of the top alone: the walk went through the subdirectories since
    // its previous listing, so they are revalidated ahead once more.
    std::thread::sleep(lag + Duration::from_millis(100));
    assert_eq!(list(&fs, t).len(), 10);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ahead(&fs) < 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ahead(&fs), 20);
    // And once more: nobody opened them since, so an `ls` of the top now and then lists only it.
    std::thread::sleep(lag + Duration::from_millis(100));
    let before = c.ops_of(OpKind::List);
    assert_eq!(list(&fs, t).len(), 10);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ahead(&fs), 20, "subdirectories nobody opened since were listed ahead");
    assert_eq!(c.ops_of(OpKind::List) - before, 1);
    fs.stop_flushers();
}

#[test]
fn past_the_lag_one_listing_revalidates_a_directory_and_finds_what_changed() {
    let s = Setup::new();
    s.home_dir_of_files("d", 20, b"v1");
    let lag = Duration::from_millis(400);
    let (fs, c) = s.fs(lag);
    let d = resolve(&fs, "d").unwrap();
    let inos: Vec<u64> = (0..20)
        .map(|i| fs.lookup(d, OsStr::new(&format!("f{i}"))).unwrap().attr.ino)
        .collect();
    for &ino in &inos {
        assert_eq!(read_file(&fs, ino), b"v1");
    }
    std::thread::sleep(lag + Duration::from_millis(100));
    std::fs::write(s.home("d/f3"), b"v2, longer").unwrap();
    let before = (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat));
    // Past the lag every file is stale: the first revalidation lists the directory, which revalidates
    // the rest; opening each then asks home nothing more.
    for &ino in &inos {
        let _ = fs.getattr(ino).unwrap();
        let r = fs.open(ino, libc::O_RDONLY).unwrap();
        fs.release(r.fh).unwrap();
    }
    assert_eq!(
        (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat)),
        (before.0 + 1, before.1),
        "one listing and no stat revalidated the directory"
    );
    assert_eq!(fs.getattr(inos[3]).unwrap().attr.size, 10);
    assert_eq!(read_file(&fs, inos[3]), b"v2, longer");
    assert_eq!(read_file(&fs, inos[4]), b"v1");
}

#[test]
fn past_the_lag_the_root_and_a_listed_directory_are_revalidated_by_their_own_listings() {
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new();
    s.home_dir_of_files("d", 3, b"x");
    let lag = Duration::from_millis(400);
    let (fs, c) = s.fs(lag);
    let d = resolve(&fs, "d").unwrap();
    let listing = |ino: u64| {
        let fh = fs.opendir(ino).unwrap();
        let n = fs.readdir(fh, 0).unwrap().len();
        fs.releasedir(fh);
        n
    };
    assert_eq!(listing(1), 3);
    assert_eq!(listing(d), 5);
    std::thread::sleep(lag + Duration::from_millis(100));
    std::fs::set_permissions(&s.home_dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::set_permissions(s.home("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat));
    // A walk past the lag: the root's stat lists it (its own attributes come with the listing, as no
    // parent's listing carries them), and its listing is then fresh; the same for `d`, listed before
    // its stat.
    assert_eq!(fs.getattr(1).unwrap().attr.perm, 0o750);
    assert_eq!(listing(1), 3);
    assert_eq!(listing(d), 5);
    assert_eq!(fs.getattr(d).unwrap().attr.perm, 0o700);
    assert_eq!(
        (c.ops_of(OpKind::List), c.ops_of(OpKind::Stat)),
        (before.0 + 2, before.1),
        "one listing of each directory and no stat"
    );
}

#[test]
fn one_listing_gives_every_child_its_attributes_and_answers_every_lookup() {
    let s = Setup::new();
    s.home_dir_of_files("d", 50, b"x");
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let d = resolve(&fs, "d").unwrap();
    let stats_before = c.ops_of(OpKind::Stat);
    let lists_before = c.ops_of(OpKind::List);
    let fh = fs.opendir(d).unwrap();
    let items = fs.readdir(fh, 0).unwrap();
    assert_eq!(items.len(), 52, ". and .. and 50 children");
    assert!(items.iter().skip(2).all(|(_, e)| e.kind == FileKind::File));
    assert_eq!(c.ops_of(OpKind::List) - lists_before, 1);
    assert_eq!(
        c.ops_of(OpKind::Stat) - stats_before,
        0,
        "the directory's attributes came with its parent's listing; the children's with its own"
    );
    // Every child's lookup, and a missing name's, is answered from the listing.
    let ops = c.ops();
    for i in 0..50 {
        let e = fs.lookup(d, OsStr::new(&format!("f{i}"))).unwrap();
        assert_eq!(e.attr.size, 1);
    }
    assert!(matches!(fs.lookup(d, OsStr::new("nope")), Err(FsError::NotFound)));
    assert_eq!(c.ops(), ops, "lookups after the listing asked home");
    // Listing again within the lag asks home nothing.
    let ops = c.ops();
    fs.releasedir(fh);
    let fh = fs.opendir(d).unwrap();
    assert_eq!(fs.readdir(fh, 10).unwrap().len(), 42);
    assert_eq!(c.ops(), ops);
}

#[test]
fn cold_then_warm_reads_are_exact_and_warm_reads_stay_local() {
    let s = Setup::new();
    let data = pattern(5 * BS as usize + 123, 7);
    std::fs::write(s.home("big"), &data).unwrap();
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "big").unwrap();
    assert_eq!(read_file(&fs, ino), data);
    assert_eq!(c.bytes_read(), data.len() as u64);
    let reads = c.ops_of(OpKind::Read);
    assert_eq!(read_file(&fs, ino), data);
    assert_eq!(c.ops_of(OpKind::Read), reads, "warm reads make no home reads");
    // A range across a block boundary.
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    let start = BS - 10;
    assert_eq!(
        fs.read(r.fh, start, 20).unwrap(),
        data[start as usize..start as usize + 20]
    );
}

#[test]
fn a_sequential_reader_gets_adjacent_blocks_in_few_home_requests() {
    let s = Setup::new();
    let blocks = 48;
    let data = pattern(blocks * BS as usize, 9);
    std::fs::write(s.home("big"), &data).unwrap();
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "big").unwrap();
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    while out.len() < data.len() {
        let chunk = fs.read(r.fh, out.len() as u64, BS as u32).unwrap();
        assert!(!chunk.is_empty());
        out.extend(chunk);
    }
    fs.release(r.fh).unwrap();
    assert!(out == data, "the bytes read are not home's");
    let reads = c.ops_of(OpKind::Read);
    // The readahead window grows to 16 blocks; each stream (2 here) takes its share of a window's blocks
    // in one request. One request per block would be 48.
    assert!(reads <= blocks as u64 / 2, "{reads} home reads for {blocks} blocks");
    assert_eq!(read_file(&fs, ino), data);
    assert_eq!(c.ops_of(OpKind::Read), reads, "warm reads make no home reads");
}

#[test]
fn changes_at_home_wait_for_the_validity_lag_then_show() {
    let s = Setup::new();
    std::fs::write(s.home("f"), b"old content").unwrap();
    let (fs, _) = s.fs(Duration::from_millis(400));
    let ino = resolve(&fs, "f").unwrap();
    assert_eq!(read_file(&fs, ino), b"old content");
    std::fs::write(s.home("f"), b"NEW CONTENT").unwrap();
    assert_eq!(
        read_file(&fs, ino),
        b"old content",
        "within the lag the cached version is served"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(read_file(&fs, ino), b"NEW CONTENT");
}

#[test]
fn lag_zero_revalidates_every_open() {
    let s = Setup::new();
    std::fs::write(s.home("f"), b"one").unwrap();
    let (fs, c) = s.fs(Duration::ZERO);
    let ino = resolve(&fs, "f").unwrap();
    assert_eq!(read_file(&fs, ino), b"one");
    std::fs::write(s.home("f"), b"two!").unwrap();
    assert_eq!(read_file(&fs, ino), b"two!");
    let reads = c.ops_of(OpKind::Read);
    assert_eq!(read_file(&fs, ino), b"two!");
    assert_eq!(c.ops_of(OpKind::Read), reads, "unchanged version: cached data reused");
}

#[test]
fn writes_reach_home_on_flush_and_partial_blocks_keep_home_data() {
    let s = Setup::new();
    let data = pattern(3 * BS as usize, 1);
    std::fs::write(s.home("f"), &data).unwrap();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "f").unwrap();
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    // Uncached block 1, written in the middle: the rest of the block must survive.
    fs.write(r.fh, BS + 100, b"HELLO").unwrap();
    assert_eq!(std::fs::read(s.home("f")).unwrap(), data, "not at home before flush");
    fs.flush(r.fh).unwrap();
    let mut expect = data.clone();
    expect[BS as usize + 100..BS as usize + 105].copy_from_slice(b"HELLO");
    assert_eq!(std::fs::read(s.home("f")).unwrap(), expect);
    // Extend past the end with a hole.
    fs.write(r.fh, 5 * BS, b"tail").unwrap();
    fs.release(r.fh).unwrap();
    expect.resize(5 * BS as usize, 0);
    expect.extend_from_slice(b"tail");
    assert_eq!(std::fs::read(s.home("f")).unwrap(), expect);
    assert_eq!(read_file(&fs, ino), expect);
    // Truncate through setattr.
    fs.setattr(
        ino,
        &SetAttr {
            size: Some(10),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert_eq!(std::fs::read(s.home("f")).unwrap(), expect[..10]);
    assert_eq!(read_file(&fs, ino), expect[..10]);
}

#[test]
fn a_tier_between_store_and_home_is_filled_and_serves_another_node_but_never_bad_bytes() {
    let s = Setup::new();
    let big = pattern(5 * BS as usize + 99, 5);
    let small = pattern(1000, 9);
    std::fs::write(s.home("big"), &big).unwrap();
    std::fs::write(s.home("small"), &small).unwrap();
    // One tier shared by two nodes (two caches over one home), standing for a bank.
    let bank = Arc::new(MemoryTier::shared(64 << 20));
    let faulty = Arc::new(FaultTier::new(bank.clone()));
    let node = |name: &str| {
        let cfg = FsConfig {
            write_mode: larder_fs::WriteMode::WriteThrough,
            validity_lag: Duration::from_secs(3600),
            ingest_streams: 1,
            ..FsConfig::default()
        };
        s.fs_tiered(
            Arc::new(FaultLayer::default()),
            cfg,
            &s.cache_dir.join(name),
            vec![faulty.clone()],
        )
    };
    let (first, c1) = node("one");
    for name in ["big", "small"] {
        let ino = resolve(&first, name).unwrap();
        read_file(&first, ino);
    }
    assert_eq!(c1.bytes_read(), (big.len() + small.len()) as u64);
    let bank_bytes = bank.bytes();
    assert_eq!(
        bank_bytes,
        (big.len() + small.len()) as u64,
        "every unit fetched went to the bank"
    );

    // Another node finds every unit in the bank: its keys are the same.
    let (second, c2) = node("two");
    for (name, data) in [("big", &big), ("small", &small)] {
        let ino = resolve(&second, name).unwrap();
        assert_eq!(&read_file(&second, ino), data);
    }
    assert_eq!(c2.ops_of(OpKind::Read), 0, "served by the bank, not home");

    // A bank answering with damaged bytes or another version's is not served: home is.
    for faults in [
        Faults {
            corrupt: true,
            ..Faults::default()
        },
        Faults {
            wrong_version: true,
            ..Faults::default()
        },
        Faults {
            error: true,
            ..Faults::default()
        },
    ] {
        faulty.set(faults.clone());
        let dir = format!("three-{faults:?}").replace(|c: char| !c.is_ascii_alphanumeric(), "");
        let (third, c3) = node(&dir);
        for (name, data) in [("big", &big), ("small", &small)] {
            let ino = resolve(&third, name).unwrap();
            assert_eq!(&read_file(&third, ino), data, "{faults:?}");
        }
        assert_eq!(c3.bytes_read(), (big.len() + small.len()) as u64, "{faults:?}");
        let stats = third.tier_stats();
        assert_eq!(
            stats.iter().map(|t| t.name).collect::<Vec<_>>(),
            ["cache", "fault", "home"]
        );
        assert_eq!(stats[1].hits, 0);
        assert_eq!(stats[2].hits, 7, "six blocks and a small file from home");
    }
}

#[test]
fn concurrent_misses_make_one_home_read() {
    let s = Setup::new();
    let data = pattern(BS as usize, 3);
    std::fs::write(s.home("f"), &data).unwrap();
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "f").unwrap();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| assert_eq!(read_file(&fs, ino), data));
        }
    });
    assert_eq!(c.ops_of(OpKind::Read), 1);
}

#[test]
fn a_restart_keeps_inode_numbers_and_cached_data() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    let data = pattern(2 * BS as usize, 9);
    std::fs::write(s.home("d/f"), &data).unwrap();
    let ino = {
        let (fs, _) = s.fs(Duration::from_secs(3600));
        let ino = resolve(&fs, "d/f").unwrap();
        assert_eq!(read_file(&fs, ino), data);
        fs.shutdown().unwrap();
        ino
    };
    let (fs, c) = s.fs(Duration::from_secs(3600));
    assert_eq!(resolve(&fs, "d/f").unwrap(), ino, "same path, same inode number");
    assert_eq!(read_file(&fs, ino), data);
    assert_eq!(c.ops_of(OpKind::Read), 0, "served from the persistent cache");
}

#[test]
fn namespace_changes_go_to_home() {
    let s = Setup::new();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    let d = fs.mkdir(1, OsStr::new("d"), 0o755, 0, 0).unwrap().attr.ino;
    let (e, r) = fs.create(d, OsStr::new("f"), 0o640, libc::O_WRONLY, 0, 0).unwrap();
    fs.write(r.fh, 0, b"abc").unwrap();
    fs.release(r.fh).unwrap();
    assert_eq!(std::fs::read(s.home("d/f")).unwrap(), b"abc");
    assert!(matches!(
        fs.create(d, OsStr::new("f"), 0o640, libc::O_EXCL, 0, 0),
        Err(FsError::Exists)
    ));
    fs.rename(1, OsStr::new("d"), 1, OsStr::new("e"), Default::default())
        .unwrap();
    assert_eq!(std::fs::read(s.home("e/f")).unwrap(), b"abc");
    assert_eq!(read_file(&fs, e.attr.ino), b"abc", "the renamed file keeps its inode");
    fs.symlink(d, OsStr::new("l"), b"f", 0, 0).unwrap();
    assert_eq!(std::fs::read_link(s.home("e/l")).unwrap(), Path::new("f"));
    assert!(matches!(fs.rmdir(1, OsStr::new("e")), Err(FsError::NotEmpty)));
    fs.unlink(d, OsStr::new("f")).unwrap();
    fs.unlink(d, OsStr::new("l")).unwrap();
    fs.rmdir(1, OsStr::new("e")).unwrap();
    assert!(!s.home("e").exists());
    assert!(matches!(fs.lookup(1, OsStr::new("e")), Err(FsError::NotFound)));
}

#[test]
fn a_failed_push_keeps_the_data_and_the_next_flush_delivers_it() {
    let s = Setup::new();
    std::fs::write(s.home("f"), b"0123456789").unwrap();
    let faults = Arc::new(FaultLayer::default());
    let (fs, _) = s.fs_with_faults(Duration::from_secs(3600), faults.clone());
    let ino = resolve(&fs, "f").unwrap();
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    fs.write(r.fh, 2, b"ab").unwrap();
    faults.inject(Fault {
        op: OpKind::Write,
        error: HomeError::NoSpace,
        count: 1,
        landed: false,
    });
    assert!(
        matches!(fs.flush(r.fh), Err(FsError::Home(HomeError::NoSpace))),
        "the error reaches close/fsync"
    );
    assert_eq!(std::fs::read(s.home("f")).unwrap(), b"0123456789");
    assert_eq!(
        fs.read(r.fh, 0, 100).unwrap(),
        b"01ab456789",
        "read-your-writes while home refuses"
    );
    fs.flush(r.fh).unwrap();
    assert_eq!(std::fs::read(s.home("f")).unwrap(), b"01ab456789");
    fs.release(r.fh).unwrap();
}

/// Write-back: a push reaches home but its answer is lost; the file is written again before the retry. The
/// retry finds home's version moved on, and must recognise the move as its own (the bytes that push sent
/// are at home), not report a conflict.
#[test]
fn a_push_whose_answer_was_lost_is_recognised_on_retry() {
    let s = Setup::new();
    let old = pattern(3 * BS as usize, 1);
    std::fs::write(s.home("f"), &old).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    let ino = resolve(&fs, "f").unwrap();
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    let mut want = old.clone();
    faults.inject(Fault {
        op: OpKind::Write,
        error: HomeError::NoSpace,
        count: 1,
        landed: true,
    });
    fs.write(r.fh, 10, b"first").unwrap();
    want[10..15].copy_from_slice(b"first");
    fs.flush(r.fh).unwrap();
    wait_for("the push never ran", || fs.journal_stats().failed_ops > 0);
    assert_eq!(
        &std::fs::read(s.home("f")).unwrap()[10..15],
        b"first",
        "the push reached home"
    );
    // Written again (over part of what was pushed, and elsewhere) before the retry.
    fs.write(r.fh, 12, b"SECOND").unwrap();
    want[12..18].copy_from_slice(b"SECOND");
    fs.write(r.fh, 2 * BS + 7, b"third").unwrap();
    want[2 * BS as usize + 7..2 * BS as usize + 12].copy_from_slice(b"third");
    fs.flush(r.fh).unwrap();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert!(fs.conflicts().is_empty(), "no conflict: {:?}", fs.conflicts());
    assert_eq!(std::fs::read(s.home("f")).unwrap(), want);
    let names: Vec<_> = std::fs::read_dir(&s.home_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("f")], "nothing written beside it");
    fs.release(r.fh).unwrap();
    fs.stop_flushers();
}

/// Write-back: a file's data is pushed while a chmod of it made after the write still waits (home refuses
/// it for now). Home's attributes after the data push are not the file's: the chmod shows from the cache
/// until its own push lands, and then home has it too.
#[test]
fn a_chmod_queued_behind_a_data_push_shows_until_it_lands() {
    let s = Setup::new();
    std::fs::write(s.home("f"), b"0123456789").unwrap();
    std::fs::set_permissions(s.home("f"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    let ino = resolve(&fs, "f").unwrap();
    // The data push fails once (it waits for a retry), so the chmod is queued before it lands.
    faults.inject(Fault {
        op: OpKind::Write,
        error: HomeError::NoSpace,
        count: 1,
        landed: false,
    });
    faults.inject(Fault {
        op: OpKind::SetAttr,
        error: HomeError::NoSpace,
        count: usize::MAX,
        landed: false,
    });
    write_closed(&fs, ino, 2, b"ab");
    let chmod = SetAttr {
        perm: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(ino, &chmod).unwrap();
    wait_for("the data push never landed", || {
        std::fs::read(s.home("f")).unwrap() == b"01ab456789"
    });
    // The data push has concluded once the journal holds the chmod alone.
    wait_for("the data push never concluded", || fs.journal_stats().pending_ops <= 1);
    let mode = |fs: &Fs| fs.getattr(ino).unwrap().attr.perm & 0o7777;
    assert_eq!(
        mode(&fs),
        0o600,
        "the acknowledged chmod was undone by the data push's answer"
    );
    faults.clear();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert_eq!(mode(&fs), 0o600);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(s.home("f")).unwrap().permissions().mode() & 0o7777,
        0o600
    );
    fs.stop_flushers();
}

/// Holds the answer of the next operation of a kind home carries out, once home carried it out, until
/// released: an answer asked before something lands at home and taken in after, or a change that landed
/// at home and is not yet known to have.
struct HoldAnswer {
    op: OpKind,
    /// (armed, held, released)
    state: std::sync::Mutex<(bool, bool, bool)>,
    changed: std::sync::Condvar,
}

impl HoldAnswer {
    fn new(op: OpKind) -> HoldAnswer {
        HoldAnswer {
            op,
            state: Default::default(),
            changed: Default::default(),
        }
    }

    fn arm(&self) {
        *self.state.lock().unwrap() = (true, false, false);
    }

    fn wait_held(&self) {
        let s = self.state.lock().unwrap();
        let (s, timeout) = self
            .changed
            .wait_timeout_while(s, Duration::from_secs(20), |s| !s.1)
            .unwrap();
        assert!(!timeout.timed_out() && s.1, "no {:?} reached home", self.op);
    }

    fn release(&self) {
        self.state.lock().unwrap().2 = true;
        self.changed.notify_all();
    }
}

impl HoldAnswer {
    /// If armed and `op` is its kind: held here until released.
    fn hold(&self, op: OpKind) {
        if op != self.op {
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
struct HoldAsking(HoldAnswer);

impl Layer for HoldAsking {
    fn before(&self, op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        self.0.hold(op);
        Ok(())
    }
}

/// Holds the next write to home before it starts (not its answer), until released, and records what home
/// held at the written path once it ended.
struct HoldWrite {
    path: PathBuf,
    gate: HoldAnswer,
    written: std::sync::Mutex<Option<HomeResult<Vec<u8>>>>,
}

impl Layer for HoldWrite {
    fn before(&self, op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        self.gate.hold(op);
        Ok(())
    }

    fn after(&self, op: OpKind, _bytes_in: u64, error: Option<&HomeError>) {
        if op == OpKind::Write && self.written.lock().unwrap().is_none() {
            *self.written.lock().unwrap() = Some(match error {
                Some(e) => Err(e.clone()),
                None => Ok(std::fs::read(&self.path).unwrap_or_default()),
            });
        }
    }
}

/// Write-back: a file removed while a push of its data is under way (the push has its cache file open)
/// still sends home the bytes it had: its cache file is unlinked, not emptied and kept as a spare.
#[test]
fn a_file_removed_while_its_push_is_under_way_sends_home_its_bytes() {
    let s = Setup::new();
    let hold = Arc::new(HoldWrite {
        path: s.home("f"),
        gate: HoldAnswer::new(OpKind::Write),
        written: Default::default(),
    });
    let fs = Arc::new(s.fs_layered(
        hold.clone(),
        Arc::new(FaultLayer::default()),
        pushing_at_once(Duration::from_secs(60)),
    ));
    let data = pattern(3 * BS as usize, 23);
    hold.gate.arm();
    let (_, r) = fs.create(1, OsStr::new("f"), 0o644, libc::O_RDWR, 0, 0).unwrap();
    fs.write(r.fh, 0, &data).unwrap();
    fs.flush(r.fh).unwrap();
    fs.release(r.fh).unwrap();
    fs.start();
    hold.gate.wait_held();
    fs.unlink(1, OsStr::new("f")).unwrap();
    hold.gate.release();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    let written = hold.written.lock().unwrap().take().expect("the push ended");
    let written = written.expect("the push succeeded");
    assert!(
        written == data,
        "home got {} bytes, not the file's {}: an emptied cache file",
        written.len(),
        data.len()
    );
    assert!(!s.home("f").exists(), "then its removal");
    fs.stop_flushers();
}

/// Write-back: a writer the kernel serves from the cache file (passthrough) opens while a push of the file
/// is under way, after the push read the file, and writes a byte; the push ends before the writer closes.
/// That byte must reach home: the push's end must not index the cache file's bytes, the writer's among
/// them, as the ones home has, or the writer's close finds nothing changed.
#[test]
fn a_byte_written_directly_during_a_push_reaches_home() {
    let s = Setup::new();
    let hold = Arc::new(HoldAnswer::new(OpKind::Write));
    let fs = Arc::new(s.fs_layered(
        hold.clone(),
        Arc::new(FaultLayer::default()),
        FsConfig {
            passthrough: true,
            ..pushing_at_once(Duration::from_secs(60))
        },
    ));
    let mut want = pattern(3 * BS as usize, 31);
    hold.arm();
    let (e, r) = fs.create(1, OsStr::new("f"), 0o644, libc::O_RDWR, 0, 0).unwrap();
    fs.write(r.fh, 0, &want).unwrap();
    fs.flush(r.fh).unwrap();
    fs.release(r.fh).unwrap();
    fs.start();
    // The push wrote home; its answer waits.
    hold.wait_held();
    let w = fs.open(e.attr.ino, libc::O_RDWR).unwrap();
    assert!(w.passthrough, "whole in the cache: the kernel may serve the writer");
    let file = fs.passthrough(w.fh, false).expect("the cache file");
    // As the kernel writes for the writer: into the cache file, no request to the daemon.
    std::os::unix::fs::FileExt::write_all_at(&*file, b"!", BS + 5).unwrap();
    want[BS as usize + 5] = b'!';
    hold.release();
    wait_for("the push never ended", || fs.journal_stats().pending_ops == 0);
    fs.flush(w.fh).unwrap();
    fs.release(w.fh).unwrap();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    let home = std::fs::read(s.home("f")).unwrap();
    assert!(
        home == want,
        "home's byte at {}: {:?}",
        BS + 5,
        home.get(BS as usize + 5).map(|b| *b as char)
    );
    assert_eq!(fs.journal_stats().dirty_bytes, 0, "all of it at home");
    // A writer that opens and closes during a push without writing leaves nothing dirty behind it (with
    // no close to come, nothing would push it).
    hold.arm();
    let r = fs.open(e.attr.ino, libc::O_RDWR).unwrap();
    fs.write(r.fh, 0, b"?").unwrap();
    want[0] = b'?';
    fs.flush(r.fh).unwrap();
    fs.release(r.fh).unwrap();
    hold.wait_held();
    let w = fs.open(e.attr.ino, libc::O_RDWR).unwrap();
    fs.passthrough(w.fh, false).expect("the cache file");
    fs.flush(w.fh).unwrap();
    fs.release(w.fh).unwrap();
    hold.release();
    wait_for("the push never ended", || fs.journal_stats().pending_ops == 0);
    assert_eq!(
        fs.journal_stats().dirty_bytes,
        0,
        "nothing left dirty, with nothing queued"
    );
    assert!(std::fs::read(s.home("f")).unwrap() == want);
    fs.stop_flushers();
}

/// Write-back: a symlink whose directory's rename lands at home meanwhile reads its target from the cache.
/// A symlink's target never changes in place (a new target is a new object, which a lookup finds), so
/// once cached it is the answer: asking home again at the old path while a rename above it lands would
/// find nothing there. (Seen after `kill -9`s: a walk listed a symlink, then `readlink` said ENOENT.)
#[test]
fn a_symlink_reads_its_cached_target_while_a_rename_of_its_directory_lands() {
    let s = Setup::new();
    std::fs::create_dir(s.home("p")).unwrap();
    std::os::unix::fs::symlink("tgt", s.home("p/l")).unwrap();
    let hold = Arc::new(HoldAnswer::new(OpKind::Rename));
    let lag = Duration::from_millis(200);
    let fs = Arc::new(s.fs_layered(hold.clone(), Arc::new(FaultLayer::default()), pushing_at_once(lag)));
    fs.start();
    let l = resolve(&fs, "p/l").unwrap();
    assert_eq!(fs.readlink(l).unwrap(), b"tgt");
    // The rename reaches home; its answer is held, so the cache does not know yet.
    hold.arm();
    fs.rename(1, OsStr::new("p"), 1, OsStr::new("q"), Default::default())
        .unwrap();
    hold.wait_held();
    assert!(s.home("q/l").symlink_metadata().is_ok() && s.home("p").symlink_metadata().is_err());
    // Past the lag: nothing about the symlink is fresh.
    std::thread::sleep(lag + Duration::from_millis(100));
    let target = fs.readlink(l);
    hold.release();
    assert_eq!(target.unwrap(), b"tgt", "readlink while the rename above it lands");
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    fs.stop_flushers();
}

/// Write-back: a rename finds its source, a file the kernel forgot, then waits for home's answer about its
/// target; meanwhile the source's create reaches home and the file leaves memory (nothing refers to it).
/// The rename must still happen: the object it found is looked for again, not reported unknown.
#[test]
fn a_rename_whose_source_leaves_memory_while_home_is_asked_about_its_target_renames() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    let hold = Arc::new(HoldAsking(HoldAnswer::new(OpKind::Stat)));
    let fs = Arc::new(s.fs_layered(
        hold.clone(),
        Arc::new(FaultLayer::default()),
        pushing_at_once(Duration::ZERO),
    ));
    let d = fs.lookup(1, OsStr::new("d")).unwrap().attr.ino;
    let (e, r) = fs.create(1, OsStr::new("b"), 0o644, libc::O_WRONLY, 0, 0).unwrap();
    fs.write(r.fh, 0, b"bee").unwrap();
    fs.release(r.fh).unwrap();
    fs.forget(e.attr.ino, 1);
    hold.0.arm();
    let renaming = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.rename(1, OsStr::new("b"), d, OsStr::new("a"), Default::default()))
    };
    hold.0.wait_held();
    fs.start();
    wait_for("the pushed file never left memory", || fs.stats().inodes_reclaimed > 0);
    hold.0.release();
    let got = renaming.join().unwrap();
    assert!(got.is_ok(), "rename b -> d/a: {got:?}");
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert_eq!(std::fs::read(s.home("d/a")).unwrap(), b"bee");
    assert!(!s.home("b").exists(), "b moved");
    fs.stop_flushers();
}

/// Write-back: a block of a file fetched from home while a rename of the file's directory lands (home has
/// moved it; the cache has not heard so yet) is fetched at the new place once the rename concludes, rather
/// than answering `ENOENT`. An object store leaves that window open while it copies and deletes.
#[test]
fn a_block_read_while_a_rename_of_its_directory_lands_is_fetched_at_the_new_place() {
    let s = Setup::new();
    std::fs::create_dir(s.home("p")).unwrap();
    let data = pattern(4 * BS as usize, 19);
    std::fs::write(s.home("p/f"), &data).unwrap();
    let hold = Arc::new(HoldAnswer::new(OpKind::Rename));
    let fs = Arc::new(s.fs_layered(
        hold.clone(),
        Arc::new(FaultLayer::default()),
        FsConfig {
            // Block by block, nothing brought in ahead of the reader.
            small_file_threshold: 0,
            readahead_max: 0,
            ..pushing_at_once(Duration::from_secs(60))
        },
    ));
    fs.start();
    let f = resolve(&fs, "p/f").unwrap();
    let r = fs.open(f, libc::O_RDONLY).unwrap();
    assert_eq!(fs.read(r.fh, 0, BS as u32).unwrap(), &data[..BS as usize]);
    // The rename reaches home; its answer is held, so the cache still has the file at p/f.
    hold.arm();
    fs.rename(1, OsStr::new("p"), 1, OsStr::new("q"), Default::default())
        .unwrap();
    hold.wait_held();
    assert!(s.home("q/f").exists() && !s.home("p").exists());
    let release = {
        let hold = hold.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            hold.release();
        })
    };
    let tail = fs.read(r.fh, 3 * BS, BS as u32);
    release.join().unwrap();
    assert_eq!(
        tail.expect("a block read while the rename above it lands"),
        &data[3 * BS as usize..]
    );
    fs.release(r.fh).unwrap();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    fs.stop_flushers();
}

/// Write-back: a listing home answered before a queued chmod of one of its entries landed, taken in after
/// the chmod's push concluded, leaves the chmod's mode: home's answer predates our own change. (Seen after a
/// `kill -9`: the queue pushed at the start while a walk listed the directory above, and the directory
/// showed its mode from before the chmod until the validity lag ran out.)
#[test]
fn a_listing_answered_before_a_queued_chmod_landed_does_not_undo_it() {
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    std::fs::set_permissions(s.home("d"), PermissionsExt::from_mode(0o755)).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let hold = Arc::new(HoldAnswer::new(OpKind::List));
    let lag = Duration::from_millis(300);
    let fs = Arc::new(s.fs_layered(hold.clone(), faults.clone(), pushing_at_once(lag)));
    fs.start();
    let d = resolve(&fs, "d").unwrap();
    // The chmod waits in the queue: home refuses it for now.
    faults.inject(Fault {
        op: OpKind::SetAttr,
        error: HomeError::NoSpace,
        count: usize::MAX,
        landed: false,
    });
    let chmod = SetAttr {
        perm: Some(0o700),
        ..SetAttr::default()
    };
    fs.setattr(d, &chmod).unwrap();
    // Past the lag, the root is listed again: home answers (d at 755), and the answer is held.
    std::thread::sleep(lag + Duration::from_millis(100));
    hold.arm();
    let lister = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let fh = fs.opendir(1).unwrap();
            let names = fs.readdir(fh, 0).unwrap().len();
            fs.releasedir(fh);
            names
        })
    };
    hold.wait_held();
    // Meanwhile the chmod lands and its push concludes.
    faults.clear();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the chmod is pushed");
    assert_eq!(
        std::fs::metadata(s.home("d")).unwrap().permissions().mode() & 0o7777,
        0o700
    );
    hold.release();
    assert!(lister.join().unwrap() >= 3, "the listing came back (., .., d)");
    assert_eq!(
        fs.getattr(d).unwrap().attr.perm & 0o7777,
        0o700,
        "home's listing, asked before the chmod landed, undid it"
    );
    fs.stop_flushers();
}

/// Write-back: files removed while the kernel still holds them (looked up, as after any `ls -l`) leave
/// the index for good, also once their changes and their removal were pushed: a record written back for a
/// removed file would keep its cache object alive, and once its directory goes too, the next start finds
/// it cut off from the root.
#[test]
fn a_removed_file_leaves_no_record_behind_once_its_changes_are_pushed() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    std::fs::write(s.home("d/f"), b"0123456789").unwrap();
    std::fs::write(s.home("d/g"), b"abc").unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    let (f, g) = (resolve(&fs, "d/f").unwrap(), resolve(&fs, "d/g").unwrap());
    let d = resolve(&fs, "d").unwrap();
    write_closed(&fs, f, 2, b"ab");
    let chmod = SetAttr {
        perm: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(g, &chmod).unwrap();
    fs.unlink(d, OsStr::new("f")).unwrap();
    fs.unlink(d, OsStr::new("g")).unwrap();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert!(!s.home("d/f").exists() && !s.home("d/g").exists());
    fs.shutdown().unwrap();
    drop(fs);
    for (name, ino) in [("f", f), ("g", g)] {
        assert!(
            !s.index_has_record(ino),
            "the index holds a record of {name}, removed and pushed"
        );
    }
}

/// Write-back: a small file never read is extended by a truncation without a write; after a restart it is
/// prefetched: its bytes from home are cached whole, kept once (shared, read-only) with another file of
/// the same bytes by dedup. Its push extends the file at home (the tail reads as zeros), instead of failing
/// on the shared cache file again and again until it is set aside as a conflict.
#[test]
fn a_whole_cached_file_extended_by_truncation_reaches_home() {
    let s = Setup::new();
    std::fs::write(s.home("f"), b"0123456789").unwrap();
    std::fs::write(s.home("g"), b"0123456789").unwrap();
    let mut want = b"0123456789".to_vec();
    want.resize(3 * BS as usize + 5, 0);
    {
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), held_back());
        let f = resolve(&fs, "f").unwrap();
        let grow = SetAttr {
            size: Some(3 * BS + 5),
            ..SetAttr::default()
        };
        fs.setattr(f, &grow).unwrap();
        fs.shutdown().unwrap();
    }
    let faults = Arc::new(FaultLayer::default());
    // Not pushed until both files are cached.
    faults.inject(Fault {
        op: OpKind::Write,
        error: HomeError::NoSpace,
        count: usize::MAX,
        landed: false,
    });
    let fs = s.write_back(faults.clone());
    let g = resolve(&fs, "g").unwrap();
    assert_eq!(read_file(&fs, g), b"0123456789");
    let f = resolve(&fs, "f").unwrap();
    // Brought into the cache (`larder prefetch`), then read.
    for r in fs.prefetch(&[f]) {
        r.unwrap();
    }
    assert!(read_file(&fs, f) == want, "read after the restart");
    faults.clear();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert!(fs.conflicts().is_empty(), "no conflict: {:?}", fs.conflicts());
    assert!(
        std::fs::read(s.home("f")).unwrap() == want,
        "home's file is not the extended one"
    );
    assert!(read_file(&fs, f) == want);
    assert_eq!(std::fs::read(s.home("g")).unwrap(), b"0123456789");
    fs.stop_flushers();
}

#[test]
fn a_start_while_home_is_away_lists_directories_from_the_cache() {
    let s = Setup::new();
    s.home_dir_of_files("d", 3, b"x");
    let write_back = |lag| FsConfig {
        validity_lag: lag,
        ..held_back()
    };
    {
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), write_back(Duration::from_secs(3600)));
        let d = resolve(&fs, "d").unwrap();
        let fh = fs.opendir(d).unwrap();
        assert_eq!(fs.readdir(fh, 0).unwrap().len(), 5);
        fs.releasedir(fh);
        let (_, open) = fs.create(d, OsStr::new("new"), 0o644, libc::O_WRONLY, 0, 0).unwrap();
        fs.release(open.fh).unwrap();
        fs.shutdown().unwrap();
    }
    // Home away from the start; the listing the last run kept is past this run's lag.
    let faults = Arc::new(FaultLayer::default());
    for op in [OpKind::Stat, OpKind::List] {
        faults.inject(Fault {
            op,
            error: HomeError::Unavailable("home is away".into()),
            count: usize::MAX,
            landed: false,
        });
    }
    let (fs, _) = s.fs_configured(faults, write_back(Duration::from_millis(1)));
    std::thread::sleep(Duration::from_millis(5));
    let d = resolve(&fs, "d").unwrap();
    let fh = fs.opendir(d).expect("the cached listing, home being away");
    let mut names: Vec<String> = fs
        .readdir(fh, 0)
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.name.into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".", "..", "f0", "f1", "f2", "new"]);
}

/// Write-back: a directory made and removed before either change reached home (both leave the journal
/// unpushed) leaves no record behind, not even once its parent goes too.
#[test]
fn a_directory_made_and_removed_before_home_saw_it_leaves_no_record() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), held_back());
    let d = resolve(&fs, "d").unwrap();
    let x = fs.mkdir(d, OsStr::new("x"), 0o755, 0, 0).unwrap().attr.ino;
    fs.rmdir(d, OsStr::new("x")).unwrap();
    assert_eq!(fs.journal_stats().pending_ops, 0, "the mkdir and the rmdir cancel out");
    fs.shutdown().unwrap();
    drop(fs);
    assert!(
        !s.index_has_record(x),
        "the index holds a record of the removed directory"
    );
}

/// Write-back: data written here waits for home across a restart with a cache too small for everything it
/// held (remounted with a smaller `--cache-size`). Reads of other files fill the cache past its limit
/// before anything looks the written file up again: its blocks are the only copy of those bytes, and
/// must not be evicted for the fills (the push would send what is left, zeros).
#[test]
fn written_blocks_waiting_for_home_are_not_evicted_after_a_restart_before_their_file_is_looked_up() {
    let s = Setup::new();
    let ours = pattern(4 * BS as usize, 3);
    std::fs::write(s.home("f"), vec![b'x'; 4 * BS as usize]).unwrap();
    s.others_at_home();
    let write_back = |sync_lag| FsConfig {
        sync_lag,
        flush_threads: 1,
        ..held_back()
    };
    {
        // Nothing is pushed within an hour: the write waits in the cache.
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), write_back(Duration::from_secs(3600)));
        let f = resolve(&fs, "f").unwrap();
        write_closed(&fs, f, 0, &ours);
        fs.shutdown().unwrap();
    }
    let fs = s.reopened_with_room_for_six(write_back(Duration::from_secs(3600)));
    fs.start();
    fill_with_others(&fs);
    s.kept_then_pushed(&fs, "f", &ours);
}

/// Write-back: a push of a small file is cut short part way (the daemon killed, home gone mid-write). A
/// small file goes whole, home cutting it to nothing first, so what is left there is a prefix of our
/// content: the retry must take it for its own, not for someone else's change. A shorter file that is
/// not such a prefix is still a conflict.
#[test]
fn a_small_file_push_cut_short_leaves_a_prefix_the_retry_recognises() {
    let s = Setup::new();
    let old = pattern(2 * BS as usize + 100, 1);
    std::fs::write(s.home("f"), &old).unwrap();
    std::fs::write(s.home("g"), &old).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    let cut_short = |name: &str, left: &dyn Fn(&[u8]) -> Vec<u8>| {
        let ino = resolve(&fs, name).unwrap();
        let r = fs.open(ino, libc::O_RDWR).unwrap();
        // The whole file is cached (read), then a few bytes change in its second block.
        assert_eq!(fs.read(r.fh, 0, 4 * BS as u32).unwrap(), old);
        let mut want = old.clone();
        fs.write(r.fh, BS + 10, b"changed").unwrap();
        want[BS as usize + 10..BS as usize + 17].copy_from_slice(b"changed");
        let failed = fs.journal_stats().failed_ops;
        faults.inject(Fault {
            op: OpKind::Write,
            error: HomeError::NoSpace,
            count: 1,
            landed: false,
        });
        fs.flush(r.fh).unwrap();
        wait_for("the push never ran", || fs.journal_stats().failed_ops != failed);
        // What the push cut short left at home.
        std::fs::write(s.home(name), left(&want)).unwrap();
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
        fs.release(r.fh).unwrap();
        want
    };
    // Cut short in the first block: everything after it was never written.
    let want = cut_short("f", &|want| want[..BS as usize / 2].to_vec());
    assert!(fs.conflicts().is_empty(), "no conflict: {:?}", fs.conflicts());
    assert_eq!(std::fs::read(s.home("f")).unwrap(), want, "the retry finished the push");
    // Not a prefix of ours: the second block holds home's bytes from before, as an in-place write of
    // the changed range alone would have left them (or as someone else may have written them).
    let want = cut_short("g", &|want| {
        let mut mixed = want[..BS as usize + 20].to_vec();
        mixed[BS as usize + 10..BS as usize + 17].copy_from_slice(&old[BS as usize + 10..BS as usize + 17]);
        mixed
    });
    assert_eq!(fs.conflicts().len(), 1, "{:?}", fs.conflicts());
    let kept = std::fs::read_dir(&s.home_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with("g.conflict-"))
        .expect("the cache's version kept beside");
    assert_eq!(std::fs::read(s.home(&kept)).unwrap(), want);
    fs.stop_flushers();
}

/// Keeps every write to home waiting before it reaches home, as a daemon killed mid-push never sends it;
/// after `limit` the write fails as unreachable.
struct HoldWrites {
    limit: Duration,
    reached: std::sync::Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Layer for HoldWrites {
    fn before(&self, op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        if op != OpKind::Write {
            return Ok(());
        }
        *self.reached.lock().unwrap() = true;
        self.changed.notify_all();
        std::thread::sleep(self.limit);
        Err(HomeError::Unavailable("held".into()))
    }
}

/// Write-back: the daemon is killed while a push of a file is under way. A push moves what it sends from
/// the file's dirty ranges to its record of the attempt, so the next start must keep those blocks too: a
/// start with a smaller cache that fills it with other reads must not evict them (home never got them).
#[test]
fn blocks_of_a_push_under_way_at_a_kill_are_not_evicted_after_the_restart() {
    let s = Setup::new();
    let ours = pattern(4 * BS as usize, 3);
    // In a directory of its own, which nothing lists before the cache fills.
    std::fs::create_dir(s.home("p")).unwrap();
    std::fs::write(s.home("p/f"), vec![b'x'; 4 * BS as usize]).unwrap();
    s.others_at_home();
    {
        let hold = Arc::new(HoldWrites {
            limit: Duration::from_secs(120),
            reached: Default::default(),
            changed: Default::default(),
        });
        let fs = Arc::new(s.fs_layered(
            hold.clone(),
            Arc::new(FaultLayer::default()),
            pushing_at_once(Duration::from_secs(3600)),
        ));
        fs.start();
        let f = resolve(&fs, "p/f").unwrap();
        write_closed(&fs, f, 0, &ours);
        // The push has recorded its attempt and waits at home's door: the daemon dies there (the index
        // keeps what was written to it; the held push never reaches home).
        let reached = hold.reached.lock().unwrap();
        let (reached, _) = hold
            .changed
            .wait_timeout_while(reached, Duration::from_secs(20), |r| !*r)
            .unwrap();
        assert!(*reached, "the push never started");
        drop(reached);
        fs.store().db().close().unwrap();
    }
    let fs = s.reopened_with_room_for_six(held_back());
    // Other reads fill the cache before anything looks the file up, the flusher included (started after
    // them here; in a daemon it is busy with the other queued changes): only what the start claimed
    // stays.
    fill_with_others(&fs);
    fs.start();
    s.kept_then_pushed(&fs, "p/f", &ours);
}

/// Write-back: a small file's push (sent whole, home cutting the file to nothing first) is cut short, and
/// the daemon stops without a shutdown twice before the retry. The second start must still know the push
/// was of the whole file, so that the retry takes the prefix home holds for its own: the first start
/// rewrote the file's record with the bytes it could still compare (none: all were queued again), and the
/// whole-ness was read back from those.
#[test]
fn a_small_file_push_cut_short_is_recognised_after_two_unclean_stops() {
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new();
    let old = pattern(2 * BS as usize + 100, 1);
    std::fs::write(s.home("f"), &old).unwrap();
    let mut want = old.clone();
    want[BS as usize + 10..BS as usize + 17].copy_from_slice(b"changed");
    {
        let faults = Arc::new(FaultLayer::default());
        let fs = s.write_back(faults.clone());
        let f = resolve(&fs, "f").unwrap();
        let r = fs.open(f, libc::O_RDWR).unwrap();
        assert_eq!(fs.read(r.fh, 0, 4 * BS as u32).unwrap(), old);
        fs.write(r.fh, BS + 10, b"changed").unwrap();
        faults.inject(Fault {
            op: OpKind::Write,
            error: HomeError::NoSpace,
            count: usize::MAX,
            landed: false,
        });
        fs.flush(r.fh).unwrap();
        wait_for("the push never ran", || fs.journal_stats().failed_ops > 0);
        fs.release(r.fh).unwrap();
        killed(&fs);
    }
    // What the push cut short left at home: the start of our bytes.
    std::fs::write(s.home("f"), &want[..BS as usize / 2]).unwrap();
    {
        // A start that pushes nothing, in which the file's record is written again (a chmod of it).
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), held_back());
        let f = resolve(&fs, "f").unwrap();
        let chmod = SetAttr {
            perm: Some(0o600),
            ..SetAttr::default()
        };
        fs.setattr(f, &chmod).unwrap();
        killed(&fs);
    }
    let fs = s.write_back(Arc::new(FaultLayer::default()));
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert!(fs.conflicts().is_empty(), "no conflict: {:?}", fs.conflicts());
    assert!(
        std::fs::read(s.home("f")).unwrap() == want,
        "the retry finished the push"
    );
    assert_eq!(
        std::fs::metadata(s.home("f")).unwrap().permissions().mode() & 0o7777,
        0o600
    );
    fs.stop_flushers();
}

/// Write-back: a small file's push lands at home whole but its answer is lost (a kill), then the file is
/// rewritten shorter (`O_TRUNC`) and the daemon killed again. The retry must not compare home's bytes past
/// the new end with bytes the cache no longer has: the rewrite is pushed, no conflict.
#[test]
fn a_file_rewritten_shorter_after_its_whole_push_was_cut_short_is_pushed_after_a_kill() {
    rewritten_shorter_after_a_push_landed_unanswered(|s, second| {
        // Rewritten shorter in a start that pushes nothing, then killed.
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), held_back());
        let f = resolve(&fs, "f").unwrap();
        rewrite(&fs, f, second);
        killed(&fs);
    });
}

/// Write-back: as above, but the start after the first kill pushes the shorter rewrite, and that push is
/// cut short before it reaches home (its record then replaces the first push's), and the daemon killed
/// again. Home still holds what the first push sent: that is ours, and the rewrite must be pushed, not set
/// aside as a conflict.
#[test]
fn a_push_cut_short_after_another_cut_short_one_landed_is_pushed_after_a_kill() {
    rewritten_shorter_after_a_push_landed_unanswered(|s, second| {
        // Rewritten shorter, then pushed: the push is on record, and refused before it reaches home.
        let faults = Arc::new(FaultLayer::default());
        let (fs, _) = s.fs_configured(faults.clone(), pushing_at_once(Duration::from_secs(3600)));
        let fs = Arc::new(fs);
        faults.inject(Fault {
            op: OpKind::Write,
            error: HomeError::NoSpace,
            count: usize::MAX,
            landed: false,
        });
        let f = resolve(&fs, "f").unwrap();
        rewrite(&fs, f, second);
        fs.start();
        wait_for("the push never ran", || fs.journal_stats().failed_ops > 0);
        killed(&fs);
    });
}

/// A small file at home is rewritten and pushed whole; the push lands, its answer is lost, and the daemon is
/// killed. `then` runs the next start, which rewrites the file shorter with the bytes it is given and is
/// killed too, before anything of the rewrite reaches home. The start after must push the shorter rewrite,
/// with no conflict.
fn rewritten_shorter_after_a_push_landed_unanswered(then: impl FnOnce(&Setup, &[u8])) {
    let s = Setup::new();
    let first = pattern(3 * BS as usize / 2, 5);
    let second = pattern(1156, 6);
    std::fs::write(s.home("f"), pattern(3000, 4)).unwrap();
    {
        let faults = Arc::new(FaultLayer::default());
        let fs = s.write_back(faults.clone());
        let f = resolve(&fs, "f").unwrap();
        // The push reaches home, its answer does not.
        faults.inject(Fault {
            op: OpKind::Write,
            error: HomeError::Unavailable("answer lost".into()),
            count: usize::MAX,
            landed: true,
        });
        rewrite(&fs, f, &first);
        wait_for("the push never reached home", || {
            std::fs::read(s.home("f")).unwrap() == first
        });
        killed(&fs);
    }
    then(&s, &second);
    assert!(
        std::fs::read(s.home("f")).unwrap() == first,
        "home holds the first push's bytes"
    );
    let fs = s.write_back(Arc::new(FaultLayer::default()));
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert!(fs.conflicts().is_empty(), "no conflict: {:?}", fs.conflicts());
    assert!(std::fs::read(s.home("f")).unwrap() == second, "home has the rewrite");
    fs.stop_flushers();
}

/// A removal reaches the index as one submission (one record of its log, applied after a kill whole or not
/// at all): the entry and record removed, the op queued and the queued ops it cancels. Split, a kill
/// between the parts left a file no entry names with its create still queued: home got a file the cache
/// no longer had, and the next file made under that name was set aside as a conflict.
#[test]
fn a_removal_reaches_the_index_as_one_submission() {
    let s = Setup::new();
    std::fs::write(s.home("there"), b"at home").unwrap();
    let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), held_back());
    let (_, r) = fs.create(1, OsStr::new("made"), 0o644, libc::O_RDWR, 0, 0).unwrap();
    fs.write(r.fh, 0, &pattern(3 * BS as usize, 3)).unwrap();
    fs.release(r.fh).unwrap();
    let there = resolve(&fs, "there").unwrap();
    assert_eq!(read_file(&fs, there), b"at home");
    fs.mkdir(1, OsStr::new("d"), 0o755, 0, 0).unwrap();
    // Each file is held open, as SQLite holds its log, so that its cache object stays until the last close
    // (without a handle it goes right after, in a submission of its own).
    let held: Vec<_> = ["made", "there"]
        .iter()
        .map(|n| fs.open(resolve(&fs, n).unwrap(), libc::O_RDONLY).unwrap())
        .collect();
    let db = fs.store().db().clone();
    for (name, dir) in [("made", false), ("there", false), ("d", true)] {
        let before = db.submissions();
        if dir {
            fs.rmdir(1, OsStr::new(name)).unwrap();
        } else {
            fs.unlink(1, OsStr::new(name)).unwrap();
        }
        assert_eq!(db.submissions() - before, 1, "removing {name}");
    }
    for h in held {
        fs.release(h.fh).unwrap();
    }
    assert_eq!(
        fs.journal_stats().pending_ops,
        1,
        "the removal of the file home has, alone"
    );
}

/// Write-through: a removal's op, and a rename's, are on record (as repeats) before home is asked, so that a
/// kill during the call finds them and pushes them again.
#[test]
fn write_through_removals_and_renames_are_on_record_before_home_is_asked() {
    for (op, kind) in [("unlink", OpKind::Unlink), ("rename", OpKind::Rename)] {
        let s = Setup::new();
        std::fs::write(s.home("f"), b"x").unwrap();
        let hold = Arc::new(HoldAsking(HoldAnswer::new(kind)));
        let fs = Arc::new(s.fs_layered(
            hold.clone(),
            Arc::new(FaultLayer::default()),
            FsConfig {
                write_mode: larder_fs::WriteMode::WriteThrough,
                ..FsConfig::default()
            },
        ));
        resolve(&fs, "f").unwrap();
        hold.0.arm();
        let changing = {
            let fs = fs.clone();
            std::thread::spawn(move || match kind {
                OpKind::Unlink => fs.unlink(1, OsStr::new("f")),
                _ => fs.rename(1, OsStr::new("f"), 1, OsStr::new("g"), Default::default()),
            })
        };
        hold.0.wait_held();
        let mut recorded = 0;
        fs.store().db().for_each_op(|_, _| recorded += 1).unwrap();
        hold.0.release();
        changing.join().unwrap().unwrap();
        assert_eq!(recorded, 1, "the {op} on record while home was asked");
    }
}

/// Write-back: a file removed while open, then written, truncated and chmodded through its handle, queues
/// nothing for home: it has no name there to take the changes, and a change queued at its old path would
/// land on whatever takes that name next.
#[test]
fn changes_to_a_file_removed_while_open_queue_nothing() {
    let s = Setup::new();
    std::fs::write(s.home("there"), pattern(3 * BS as usize, 7)).unwrap();
    let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), held_back());
    let f = resolve(&fs, "there").unwrap();
    let h = fs.open(f, libc::O_RDWR).unwrap();
    fs.unlink(1, OsStr::new("there")).unwrap();
    assert_eq!(fs.journal_stats().pending_ops, 1, "the removal");
    fs.write(h.fh, 5, b"after").unwrap();
    fs.flush(h.fh).unwrap();
    fs.fsync(h.fh).unwrap();
    fs.setattr(
        f,
        &SetAttr {
            size: Some(100),
            perm: Some(0o600),
            ..SetAttr::default()
        },
    )
    .unwrap();
    fs.release(h.fh).unwrap();
    assert_eq!(fs.journal_stats().pending_ops, 1, "the removal alone");
}

/// Write-back: a rename whose push landed at home but whose answer was lost (as after a stop that cut it
/// short) waits for its retry. Meanwhile a read of the file's data the cache does not hold must find it
/// where home has it now, not fail with `ENOENT` at its old path; in a directory moved the same way too.
#[test]
fn a_file_whose_rename_landed_unanswered_is_read_at_its_new_place_before_the_retry() {
    let s = Setup::new();
    let data = pattern(3 * BS as usize + 5, 8);
    std::fs::write(s.home("f"), &data).unwrap();
    std::fs::create_dir(s.home("d")).unwrap();
    std::fs::write(s.home("d/x"), &data[..1000]).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    let d = resolve(&fs, "d").unwrap();
    for (dir, name) in [(1, "f"), (d, "x")] {
        fs.lookup(dir, OsStr::new(name)).unwrap();
    }
    for (from, to) in [("f", "g"), ("d", "e")] {
        let failed = fs.journal_stats().failed_ops;
        faults.inject(Fault {
            op: OpKind::Rename,
            error: HomeError::NoSpace,
            count: 1,
            landed: true,
        });
        fs.rename(1, OsStr::new(from), 1, OsStr::new(to), Default::default())
            .unwrap();
        wait_for("the push never ran", || fs.journal_stats().failed_ops != failed);
        assert!(!s.home(from).exists(), "the rename landed at home");
    }
    let g = resolve(&fs, "g").unwrap();
    let x = resolve(&fs, "e/x").unwrap();
    assert!(read_file(&fs, g) == data, "the renamed file's bytes");
    assert_eq!(read_file(&fs, x), data[..1000]);
    assert_eq!(
        fs.journal_stats().failed_ops,
        2,
        "the reads came before the renames' retries (1 s later)"
    );
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty);
    assert!(fs.conflicts().is_empty(), "{:?}", fs.conflicts());
    assert!(read_file(&fs, g) == data);
    fs.stop_flushers();
}

/// Write-back over a home that renames by copying, then deleting (an object store): an attempt cut short
/// leaves a copy at the target. The retry must see that copy as its own and finish the rename, for a file
/// and for a directory part-copied, rather than set the copy aside as a conflict.
#[test]
fn a_rename_cut_short_after_its_copy_is_finished_on_retry() {
    let s = Setup::new();
    std::fs::write(s.home("f"), pattern(5000, 2)).unwrap();
    std::fs::create_dir(s.home("d")).unwrap();
    std::fs::write(s.home("d/a"), pattern(100, 3)).unwrap();
    std::fs::write(s.home("d/b"), pattern(200, 4)).unwrap();
    std::fs::create_dir_all(s.home("p/s")).unwrap();
    std::fs::write(s.home("p/a"), pattern(300, 5)).unwrap();
    std::fs::write(s.home("p/b"), pattern(400, 6)).unwrap();
    std::fs::write(s.home("p/s/x"), pattern(500, 7)).unwrap();
    std::fs::set_permissions(s.home("p"), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    for name in ["f", "d", "p"] {
        resolve(&fs, name).unwrap();
    }
    let cut_short_landed = |from: &str, to: &str, landed: bool, copy: &dyn Fn()| {
        let failed = fs.journal_stats().failed_ops;
        faults.inject(Fault {
            op: OpKind::Rename,
            error: HomeError::NoSpace,
            count: 1,
            landed,
        });
        fs.rename(1, OsStr::new(from), 1, OsStr::new(to), Default::default())
            .unwrap();
        wait_for("the push never ran", || fs.journal_stats().failed_ops != failed);
        // What the cut-short attempt left at home.
        copy();
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    };
    let cut_short = |from: &str, to: &str, copy: &dyn Fn()| cut_short_landed(from, to, false, copy);
    cut_short("f", "g", &|| {
        std::fs::copy(s.home("f"), s.home("g")).unwrap();
    });
    cut_short("d", "e", &|| {
        std::fs::create_dir(s.home("e")).unwrap();
        std::fs::copy(s.home("d/a"), s.home("e/a")).unwrap();
    });
    // A directory copied whole, and some of its sources deleted already (a file, a whole subdirectory):
    // what was deleted is only at the target now, and must stay there. The target directory itself was
    // made without the source's mode (an object store copies the directory's own object last).
    cut_short("p", "q", &|| {
        std::fs::create_dir_all(s.home("q/s")).unwrap();
        std::fs::set_permissions(s.home("q"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        for f in ["a", "b", "s/x"] {
            std::fs::copy(s.home(&format!("p/{f}")), s.home(&format!("q/{f}"))).unwrap();
        }
        std::fs::remove_file(s.home("p/a")).unwrap();
        std::fs::remove_file(s.home("p/s/x")).unwrap();
        std::fs::remove_dir(s.home("p/s")).unwrap();
    });
    // Done whole, the answer lost: the retry finds the source gone and the target there.
    cut_short_landed("g", "g2", true, &|| {});
    cut_short_landed("g2", "g", true, &|| {});
    assert!(fs.conflicts().is_empty(), "no conflict: {:?}", fs.conflicts());
    let mut names: Vec<_> = std::fs::read_dir(&s.home_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["e", "g", "q"]);
    assert_eq!(std::fs::read(s.home("g")).unwrap(), pattern(5000, 2));
    assert_eq!(std::fs::read(s.home("q/a")).unwrap(), pattern(300, 5));
    assert_eq!(std::fs::read(s.home("q/b")).unwrap(), pattern(400, 6));
    assert_eq!(std::fs::read(s.home("q/s/x")).unwrap(), pattern(500, 7));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(s.home("q")).unwrap().permissions().mode() & 0o7777,
        0o700,
        "the moved directory's mode"
    );
    assert_eq!(std::fs::read(s.home("e/a")).unwrap(), pattern(100, 3));
    assert_eq!(std::fs::read(s.home("e/b")).unwrap(), pattern(200, 4));
    // Something else at the target (home gained it meanwhile) is still a conflict: kept beside, not
    // replaced.
    cut_short("g", "h", &|| {
        std::fs::write(s.home("h"), b"someone else's").unwrap();
    });
    assert_eq!(fs.conflicts().len(), 1, "{:?}", fs.conflicts());
    assert_eq!(std::fs::read(s.home("h")).unwrap(), pattern(5000, 2));
    let kept = std::fs::read_dir(&s.home_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with("h.conflict-"))
        .expect("home's object kept beside");
    assert_eq!(std::fs::read(s.home(&kept)).unwrap(), b"someone else's");
    fs.stop_flushers();
}

/// A sequential reader whose reads skip ahead a little (the pages between came from the kernel's page
/// cache, brought in by another reader of the file) keeps its readahead window growing.
#[test]
fn a_reader_skipping_ahead_keeps_its_readahead() {
    let s = Setup::new();
    std::fs::write(s.home("f"), pattern(32 * BS as usize, 6)).unwrap();
    let (fs, counters) = s.fs_configured(
        Arc::new(FaultLayer::default()),
        FsConfig {
            write_mode: larder_fs::WriteMode::WriteThrough,
            validity_lag: Duration::from_secs(3600),
            readahead_max: 8 * BS,
            ingest_streams: 2,
            ..FsConfig::default()
        },
    );
    let ino = resolve(&fs, "f").unwrap();
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    for block in [0, 2, 4] {
        let got = fs.read(r.fh, block * BS, BS as u32).unwrap();
        assert_eq!(
            got,
            pattern(32 * BS as usize, 6)[(block * BS) as usize..((block + 1) * BS) as usize]
        );
    }
    // The window doubled at each read: after the read of block 4 it reaches block 8.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while counters.bytes_read() < 9 * BS {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} blocks came in: the skips reset the readahead",
            counters.bytes_read() / BS
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    fs.release(r.fh).unwrap();
}

#[test]
fn a_failing_home_read_is_an_error_not_a_cached_hole() {
    let s = Setup::new();
    std::fs::write(s.home("f"), pattern(1000, 5)).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let (fs, _) = s.fs_with_faults(Duration::from_secs(3600), faults.clone());
    let ino = resolve(&fs, "f").unwrap();
    faults.inject(Fault {
        op: OpKind::Read,
        error: HomeError::TimedOut(Duration::from_secs(1)),
        count: 1,
        landed: false,
    });
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    assert!(matches!(
        fs.read(r.fh, 0, 100),
        Err(FsError::Home(HomeError::TimedOut(_)))
    ));
    assert_eq!(
        fs.read(r.fh, 0, 1000).unwrap(),
        pattern(1000, 5),
        "nothing wrong was cached"
    );
}

#[test]
fn hard_links_are_one_inode_with_several_names() {
    let s = Setup::new();
    std::fs::write(s.home("a"), b"shared").unwrap();
    std::fs::hard_link(s.home("a"), s.home("b")).unwrap();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    // Listed first: both names are placeholders until looked up.
    let fh = fs.opendir(1).unwrap();
    assert_eq!(fs.readdir(fh, 2).unwrap().len(), 2);
    let a = resolve(&fs, "a").unwrap();
    assert_eq!(resolve(&fs, "b").unwrap(), a, "a link made at home is the same inode");
    let c = fs.link(a, 1, OsStr::new("c")).unwrap();
    assert_eq!(c.attr.ino, a);
    assert_eq!(c.attr.nlink, 3);
    fs.unlink(1, OsStr::new("a")).unwrap();
    assert_eq!(
        fs.getattr(a).unwrap().attr.nlink,
        2,
        "the remaining names see the new link count"
    );
    assert_eq!(read_file(&fs, a), b"shared");
    fs.rename(1, OsStr::new("b"), 1, OsStr::new("d"), Default::default())
        .unwrap();
    assert_eq!(resolve(&fs, "d").unwrap(), a);
    assert_eq!(resolve(&fs, "c").unwrap(), a);
    fs.shutdown().unwrap();
    drop(fs);
    let (fs, _) = s.fs(Duration::from_secs(3600));
    let c = resolve(&fs, "c").unwrap();
    assert_eq!(resolve(&fs, "d").unwrap(), c, "still one inode after a restart");
}

#[test]
fn changes_found_at_home_are_passed_on_to_the_kernel() {
    use larder_fs::Invalidation;
    let s = Setup::new();
    std::fs::write(s.home("f"), b"one").unwrap();
    std::fs::write(s.home("g"), b"gone soon").unwrap();
    let (fs, _) = s.fs(Duration::ZERO);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    fs.set_invalidator(Box::new(move |what| sink.lock().unwrap().push(what)));
    let f = resolve(&fs, "f").unwrap();
    resolve(&fs, "g").unwrap();
    assert_eq!(read_file(&fs, f), b"one");
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing changed yet: {:?}",
        seen.lock().unwrap()
    );
    // A new version found at an open drops the kernel's copy of the file; a name gone from a listing
    // drops the kernel's entry.
    std::fs::write(s.home("f"), b"two!").unwrap();
    assert_eq!(read_file(&fs, f), b"two!");
    std::fs::remove_file(s.home("g")).unwrap();
    let dir = fs.opendir(1).unwrap();
    fs.readdir(dir, 0).unwrap();
    fs.releasedir(dir);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.contains(&Invalidation::Inode(f)), "{seen:?}");
    assert!(seen.contains(&Invalidation::Entry(1, "g".into())), "{seen:?}");
}

#[test]
fn write_back_offline_names_not_known_look_absent_and_can_be_made() {
    let s = Setup::new();
    std::fs::write(s.home("there"), b"at home").unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    // Home cannot be reached and the root was never listed: the cache cannot say what is in it.
    for op in [OpKind::Stat, OpKind::List] {
        faults.inject(Fault {
            op,
            error: HomeError::Unavailable("test".into()),
            count: 1000,
            landed: false,
        });
    }
    assert!(matches!(fs.lookup(1, OsStr::new("there")), Err(FsError::NotFound)));
    let (_, r) = fs.create(1, OsStr::new("new"), 0o640, libc::O_WRONLY, 0, 0).unwrap();
    fs.write(r.fh, 0, b"made offline").unwrap();
    fs.release(r.fh).unwrap();
    let d = fs.mkdir(1, OsStr::new("d"), 0o755, 0, 0).unwrap().attr.ino;
    fs.rename(1, OsStr::new("new"), d, OsStr::new("moved"), Default::default())
        .unwrap();
    faults.clear();
    // Home answers again: the name that looked absent is asked again, not remembered as absent.
    assert!(fs.lookup(1, OsStr::new("there")).is_ok());
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert_eq!(std::fs::read(s.home("d/moved")).unwrap(), b"made offline");
    assert!(!s.home("new").exists());
}

/// Names of the entries of directory `ino` (without `.` and `..`), sorted.
fn list(fs: &Fs, ino: u64) -> Vec<String> {
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

/// A directory under two renamed parents, after a restart while the first rename had landed at home but
/// its answer was lost: home lacks the directory where the cache last knew it, and cannot say yet where
/// it is. Its listing and its entries, known here, are the cache's, never empty or "not found".
#[test]
fn a_directory_under_two_renamed_parents_lists_and_finds_its_entries_while_unsure() {
    let s = Setup::new();
    std::fs::create_dir_all(s.home("a/b/d")).unwrap();
    std::fs::write(s.home("a/b/d/x"), pattern(100, 1)).unwrap();
    std::fs::write(s.home("a/b/d/y"), pattern(200, 2)).unwrap();
    let faults = Arc::new(FaultLayer::default());
    {
        let fs = s.write_back(faults.clone());
        let d = resolve(&fs, "a/b/d").unwrap();
        assert_eq!(list(&fs, d), ["x", "y"]);
        // Known here, content and all.
        for (name, seed) in [("x", 1), ("y", 2)] {
            let ino = fs.lookup(d, OsStr::new(name)).unwrap().attr.ino;
            assert_eq!(read_file(&fs, ino).len(), 100 * seed as usize);
        }
        // The first rename reaches home; its answer does not come back.
        faults.inject(Fault {
            op: OpKind::Rename,
            error: HomeError::NoSpace,
            count: 1,
            landed: true,
        });
        fs.rename(1, OsStr::new("a"), 1, OsStr::new("a2"), Default::default())
            .unwrap();
        wait_for("the first rename was never pushed", || {
            fs.journal_stats().failed_ops > 0
        });
        // From now on renames are refused: the journal keeps both.
        faults.inject(Fault {
            op: OpKind::Rename,
            error: HomeError::NoSpace,
            count: 1000,
            landed: false,
        });
        let a2 = resolve(&fs, "a2").unwrap();
        fs.rename(a2, OsStr::new("b"), a2, OsStr::new("b2"), Default::default())
            .unwrap();
        assert!(s.home("a2/b/d/x").exists(), "the first rename landed at home");
        fs.stop_flushers();
        fs.shutdown().unwrap();
    }
    // After the restart every rename is still refused: the cache cannot learn where home has `d`.
    let fs = s.write_back(faults.clone());
    let d = resolve(&fs, "a2/b2/d").unwrap();
    assert_eq!(list(&fs, d), ["x", "y"], "the listing under two renamed parents");
    let x = fs
        .lookup(d, OsStr::new("x"))
        .expect("an entry under two renamed parents")
        .attr
        .ino;
    assert_eq!(read_file(&fs, x), pattern(100, 1));
    faults.clear();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert!(fs.conflicts().is_empty(), "no conflict: {:?}", fs.conflicts());
    assert_eq!(std::fs::read(s.home("a2/b2/d/y")).unwrap(), pattern(200, 2));
    assert!(!s.home("a").exists() && !s.home("a2/b").exists());
    assert_eq!(list(&fs, d), ["x", "y"]);
    fs.stop_flushers();
}

/// A name the cache knew before a restart is still known while home is away after it: made again, it is
/// refused as existing, not made over home's object (which would be a conflict at push).
#[test]
fn write_back_offline_after_a_restart_names_known_before_still_exist() {
    let s = Setup::new();
    std::fs::write(s.home("there"), b"at home").unwrap();
    let faults = Arc::new(FaultLayer::default());
    {
        let fs = s.write_back(faults.clone());
        assert!(fs.lookup(1, OsStr::new("there")).is_ok());
        // Home goes away with a change queued (a mount with nothing queued does not start offline).
        for op in [OpKind::Stat, OpKind::Create] {
            faults.inject(Fault {
                op,
                error: HomeError::Unavailable("test".into()),
                count: 1000,
                landed: false,
            });
        }
        let (_, r) = fs.create(1, OsStr::new("new"), 0o640, libc::O_WRONLY, 0, 0).unwrap();
        fs.release(r.fh).unwrap();
        fs.stop_flushers();
        fs.shutdown().unwrap();
    }
    let fs = s.write_back(faults.clone());
    assert!(
        matches!(
            fs.create(1, OsStr::new("there"), 0o640, libc::O_WRONLY | libc::O_EXCL, 0, 0),
            Err(FsError::Exists)
        ),
        "a known name made again while home is away"
    );
    let there = fs
        .lookup(1, OsStr::new("there"))
        .expect("known from before the restart");
    assert_eq!(there.attr.size, 7);
    assert_eq!(std::fs::read(s.home("there")).unwrap(), b"at home");
    fs.stop_flushers();
}

/// Names and attributes of `dir` as the core shows them: (name, kind, perm, size, nlink), sorted.
fn shown(fs: &Fs, dir: u64) -> Vec<(String, FileKind, u32, u64, u32)> {
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

/// The same of home's directory `rel`.
fn at_home(s: &Setup, rel: &str) -> Vec<(String, FileKind, u32, u64, u32)> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut out: Vec<_> = std::fs::read_dir(s.home(rel))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let kind = if m.is_dir() {
                FileKind::Dir
            } else if m.file_type().is_symlink() {
                FileKind::Symlink
            } else {
                FileKind::File
            };
            let size = if m.is_dir() { 0 } else { m.len() };
            (
                e.file_name().to_string_lossy().into_owned(),
                kind,
                m.permissions().mode() & 0o7777,
                size,
                m.nlink() as u32,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn write_through_changes_home_refuses_fail_at_the_call_and_leave_nothing_behind() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    std::fs::create_dir(s.home("d/empty")).unwrap();
    std::fs::write(s.home("d/a"), b"aaa").unwrap();
    std::fs::write(s.home("d/c"), b"ccccc").unwrap();
    let faults = Arc::new(FaultLayer::default());
    let (fs, _) = s.fs_with_faults(Duration::from_secs(3600), faults.clone());
    let d = resolve(&fs, "d").unwrap();
    let a = resolve(&fs, "d/a").unwrap();
    let before = at_home(&s, "d");
    // Directory sizes differ between the two views; compare everything else.
    let strip = |v: Vec<(String, FileKind, u32, u64, u32)>| -> Vec<_> {
        v.into_iter()
            .map(|(n, k, p, size, l)| (n, k, p, if k == FileKind::Dir { 0 } else { size }, l))
            .collect()
    };
    assert_eq!(strip(shown(&fs, d)), before);
    let refuse = |op: OpKind| {
        faults.inject(Fault {
            op,
            error: HomeError::PermissionDenied,
            count: 1,
            landed: false,
        })
    };
    let denied = |r: Result<(), FsError>, what: &str| {
        assert!(
            matches!(r, Err(FsError::Home(HomeError::PermissionDenied))),
            "{what}: {r:?}"
        );
    };
    let n = OsStr::new;
    refuse(OpKind::Create);
    denied(
        fs.create(d, n("new"), 0o644, libc::O_WRONLY, 0, 0).map(|_| ()),
        "create",
    );
    refuse(OpKind::Mkdir);
    denied(fs.mkdir(d, n("sub"), 0o755, 0, 0).map(|_| ()), "mkdir");
    refuse(OpKind::Symlink);
    denied(fs.symlink(d, n("l"), b"a", 0, 0).map(|_| ()), "symlink");
    refuse(OpKind::Link);
    denied(fs.link(a, d, n("hard")).map(|_| ()), "link");
    refuse(OpKind::Unlink);
    denied(fs.unlink(d, n("a")), "unlink");
    refuse(OpKind::Rmdir);
    denied(fs.rmdir(d, n("empty")), "rmdir");
    refuse(OpKind::Rename);
    denied(fs.rename(d, n("a"), d, n("b"), Default::default()), "rename");
    refuse(OpKind::Rename);
    denied(
        fs.rename(d, n("a"), d, n("c"), Default::default()),
        "rename onto a file",
    );
    refuse(OpKind::SetAttr);
    let chmod = SetAttr {
        perm: Some(0o600),
        ..SetAttr::default()
    };
    denied(fs.setattr(a, &chmod).map(|_| ()), "chmod");
    assert_eq!(at_home(&s, "d"), before, "home refused every change");
    assert_eq!(strip(shown(&fs, d)), before, "the cache shows home's directory again");
    assert_eq!(
        resolve(&fs, "d/a").unwrap(),
        a,
        "a name whose removal was refused keeps its inode"
    );
    assert_eq!(read_file(&fs, a), b"aaa");
    assert_eq!(read_file(&fs, resolve(&fs, "d/c").unwrap()), b"ccccc");
    // And what home accepts afterwards lands as usual.
    fs.rename(d, n("a"), d, n("b"), Default::default()).unwrap();
    assert_eq!(std::fs::read(s.home("d/b")).unwrap(), b"aaa");
    assert!(!s.home("d/a").exists());
}

#[test]
fn write_through_create_of_a_name_home_gained_meanwhile_is_eexist_and_shows_home_s_file() {
    let s = Setup::new();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    // The cache lists the directory, and takes a name not in the listing as absent for the validity lag.
    assert!(shown(&fs, 1).is_empty());
    std::fs::write(s.home("x"), b"theirs").unwrap();
    let r = fs.create(1, OsStr::new("x"), 0o644, libc::O_WRONLY | libc::O_EXCL, 0, 0);
    assert!(
        matches!(r, Err(FsError::Exists)),
        "home has the name: {:?}",
        r.map(|_| ())
    );
    assert_eq!(
        std::fs::read(s.home("x")).unwrap(),
        b"theirs",
        "home's file is untouched"
    );
    let x = resolve(&fs, "x").unwrap();
    assert_eq!(
        read_file(&fs, x),
        b"theirs",
        "the cache shows home's file, not an empty one of its own"
    );
}

/// Holds the answer of the next home listing (home has made it) until released.
#[derive(Default)]
struct ListGate {
    holding: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl larder_home::Layer for ListGate {
    fn answer(&self, op: OpKind) -> larder_home::HomeResult<()> {
        // Taken out first: the lock is not held while the listing waits (other listings pass).
        let armed = if op == OpKind::List {
            self.holding.lock().unwrap().take()
        } else {
            None
        };
        if let Some(tx) = armed {
            let rx = self.release.lock().unwrap().take().expect("armed with a release");
            let _ = tx.send(());
            let _ = rx.recv_timeout(Duration::from_secs(60));
        }
        Ok(())
    }
}

#[test]
fn a_listing_waiting_on_home_holds_up_no_change_and_undoes_none_made_meanwhile() {
    let s = Setup::new();
    std::fs::create_dir(s.home("a")).unwrap();
    std::fs::write(s.home("a/old"), b"o").unwrap();
    let gate = Arc::new(ListGate::default());
    let posix: Arc<dyn Home> = Arc::new(PosixHome::new(&s.home_dir, Some(Duration::from_secs(10))).unwrap());
    let home: Arc<dyn Home> = Arc::new(Layered::new(posix, gate.clone()));
    std::fs::create_dir_all(&s.cache_dir).unwrap();
    let cfg = FsConfig {
        write_mode: larder_fs::WriteMode::WriteThrough,
        validity_lag: Duration::from_secs(3600),
        conflicts_dir: s.cache_dir.join("conflicts"),
        ..FsConfig::default()
    };
    let fs = Arc::new(Fs::new(home, common::open_store(&s.cache_dir).unwrap(), cfg).unwrap());
    let a = resolve(&fs, "a").unwrap();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    *gate.holding.lock().unwrap() = Some(held_tx);
    *gate.release.lock().unwrap() = Some(release_rx);
    let lister = {
        let fs = fs.clone();
        std::thread::spawn(move || shown(&fs, a))
    };
    held_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the listing reached home");
    // Home has answered the listing (without "new"); the answer is on its way back. A create in the same
    // directory goes to home and returns meanwhile.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let creator = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs
                .create(a, OsStr::new("new"), 0o644, libc::O_WRONLY, 0, 0)
                .map(|(e, r)| (e.attr.ino, r.fh));
            let _ = done_tx.send(());
            r
        })
    };
    let finished = done_rx.recv_timeout(Duration::from_secs(10)).is_ok();
    release_tx.send(()).unwrap();
    let (new_ino, fh) = creator.join().unwrap().expect("create");
    fs.release(fh).unwrap();
    let listed = lister.join().unwrap();
    assert!(
        finished,
        "a create waited for a listing of its directory to come back from home"
    );
    assert!(
        s.home("a/new").exists(),
        "write-through: at home when the call returned"
    );
    let names: Vec<&str> = listed.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names,
        ["new", "old"],
        "the listing keeps what was created while home answered it"
    );
    assert_eq!(resolve(&fs, "a/new").unwrap(), new_ino);
}
