//! Directory listings and the validity lag, in the core without a mount (a real POSIX home in a temporary
//! directory, counted by the metrics layer): one listing of a directory answers its lookups and gives its
//! children their attributes; what the core knows is trusted for the validity lag (across a clean restart
//! only) and revalidated past it, ahead of a walk too; changes found at home reach the kernel; a listing
//! that crosses a change on its way neither holds the change up nor undoes it.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use larder_fs::{Drained, Fs, FsConfig, FsError};
use larder_home::{Fault, FaultLayer, FileKind, Home, HomeCounters, HomeError, Layered, OpKind, PosixHome, SetAttr};

mod common;
use common::*;

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
    // The read moved f's atime (relatime: never read since its change), which drops the kernel's
    // attributes alone; nothing else has changed.
    let early = seen.lock().unwrap().clone();
    assert!(
        early.iter().all(|w| *w == Invalidation::Attr(f)),
        "nothing changed yet: {early:?}"
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
