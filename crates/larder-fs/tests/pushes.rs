//! Write-back pushes, in the core without a mount (a real POSIX home in a temporary directory, counted by
//! the metrics layer): a retry recognises what an earlier attempt left at home; a change queued behind a
//! push shows until it lands; a push races a removal, or a write the kernel makes directly; removals leave
//! nothing behind in the index or the journal.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use larder_fs::{Drained, Fs, FsConfig};
use larder_home::{Fault, FaultLayer, HomeError, HomeResult, Layer, OpKind, SetAttr};

mod common;
use common::*;

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
        if op == self.gate.op && self.written.lock().unwrap().is_none() {
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
    // A file made here goes home with its content in one call, its create.
    let hold = Arc::new(HoldWrite {
        path: s.home("f"),
        gate: HoldAnswer::new(OpKind::Create),
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
    // A file made here goes home with its content in one call, its create; then its data in writes.
    let hold = Arc::new(HoldAnswer::either(OpKind::Create, OpKind::Write));
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

/// Write-back: a directory is made, given its mode at once and filled (as `rsync -a` makes them), all
/// before anything is pushed. Home stamps the directory with the moment it and each entry land, and the
/// mode's push answers with home's attributes. Once all have landed, home's directory and the mount's must
/// have the time it was made at here, not a landing's.
#[test]
fn a_directory_given_its_mode_after_mkdir_keeps_the_time_it_was_made_at() {
    let s = Setup::new();
    let fs = s.fs_layered(
        Arc::new(FaultLayer::default()),
        Arc::new(FaultLayer::default()),
        FsConfig {
            flush_threads: 4,
            ..pushing_at_once(Duration::from_secs(60))
        },
    );
    let mode = SetAttr {
        perm: Some(0o755),
        ..SetAttr::default()
    };
    let d = fs.mkdir(1, OsStr::new("d"), 0o700, 0, 0).unwrap().attr.ino;
    fs.setattr(d, &mode).unwrap();
    let e = fs.mkdir(d, OsStr::new("e"), 0o700, 0, 0).unwrap().attr.ino;
    fs.setattr(e, &mode).unwrap();
    for (dir, name) in [(e, "g"), (d, "f")] {
        let (_, r) = fs.create(dir, OsStr::new(name), 0o644, libc::O_RDWR, 0, 0).unwrap();
        fs.release(r.fh).unwrap();
    }
    let made = [(d, "d"), (e, "d/e")].map(|(ino, rel)| (ino, rel, fs.getattr(ino).unwrap().attr.mtime));
    // Home's own stamps must differ from the times the mount shows.
    std::thread::sleep(Duration::from_millis(50));
    fs.start();
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    for (ino, rel, mtime) in made {
        assert_eq!(
            std::fs::metadata(s.home(rel)).unwrap().modified().unwrap(),
            mtime,
            "home's {rel} has a landing's time, not the one it was made at"
        );
        assert_eq!(
            fs.getattr(ino).unwrap().attr.mtime,
            mtime,
            "the mount shows another time for {rel}"
        );
    }
    fs.stop_flushers();
}

/// Counts home's calls by kind, and the most under way at once; each call takes `latency` (a far home).
#[derive(Default)]
struct FarHome {
    latency: Duration,
    calls: std::sync::Mutex<std::collections::HashMap<OpKind, u64>>,
    now: std::sync::atomic::AtomicU64,
    most: std::sync::atomic::AtomicU64,
}

impl Layer for FarHome {
    fn before(&self, op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        use std::sync::atomic::Ordering;
        *self.calls.lock().unwrap().entry(op).or_default() += 1;
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        std::thread::sleep(self.latency);
        Ok(())
    }

    fn after(&self, _op: OpKind, _bytes_in: u64, _error: Option<&HomeError>) {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Write-back to a home 20 ms away: a tree of new small files reaches home in one home call per file (its
/// create, carrying its mode, time and content), and the pushers' window grows past the 8 it starts with
/// while home keeps up. Counts of home calls, not timings.
#[test]
fn new_small_files_go_home_in_one_call_each_with_many_under_way_at_once() {
    const DIRS: usize = 4;
    const PER: usize = 100;
    let s = Setup::new();
    let far = Arc::new(FarHome {
        latency: Duration::from_millis(20),
        ..FarHome::default()
    });
    let fs = s.fs_layered(
        far.clone(),
        Arc::new(FaultLayer::default()),
        FsConfig {
            sync_lag: Duration::from_secs(3600),
            flush_threads: 64,
            ..pushing_at_once(Duration::from_secs(60))
        },
    );
    fs.start();
    let mut want = Vec::new();
    for d in 0..DIRS {
        let dir = fs.mkdir(1, OsStr::new(&format!("d{d}")), 0o750, 0, 0).unwrap();
        for f in 0..PER {
            let name = format!("f{f:03}");
            let data = pattern(700 + f, (d * PER + f) as u8);
            let (e, r) = fs
                .create(dir.attr.ino, OsStr::new(&name), 0o640, libc::O_RDWR, 0, 0)
                .unwrap();
            fs.write(r.fh, 0, &data).unwrap();
            fs.flush(r.fh).unwrap();
            fs.release(r.fh).unwrap();
            want.push((format!("d{d}/{name}"), data, fs.getattr(e.attr.ino).unwrap().attr.mtime));
        }
    }
    let before: std::collections::HashMap<OpKind, u64> = far.calls.lock().unwrap().clone();
    assert_eq!(fs.drain(Duration::from_secs(120)), Drained::Empty, "the journal drains");
    let calls: std::collections::HashMap<OpKind, u64> = far
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (*k, v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let files = (DIRS * PER) as u64;
    eprintln!(
        "pushing {files} new files in {DIRS} directories: {calls:?}, at most {} at once",
        far.most.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert_eq!(
        calls.get(&OpKind::Create).copied(),
        Some(files),
        "one create per file: {calls:?}"
    );
    assert_eq!(
        calls.get(&OpKind::Write),
        None,
        "no separate write of a new file's content: {calls:?}"
    );
    // The directories' times (the root's too), each time their queued entries have all landed: a few
    // calls per directory, none per file.
    let dirs = DIRS as u64 + 1;
    let setattrs = calls.get(&OpKind::SetAttr).copied().unwrap_or(0);
    assert!(setattrs <= 3 * dirs, "setattrs: {calls:?}");
    let total: u64 = calls.values().sum();
    assert!(
        total <= files + 4 * dirs,
        "{total} home calls for {files} files: {calls:?}"
    );
    let most = far.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        most > 8,
        "the window never grew past its start: at most {most} calls at once"
    );
    for (rel, data, mtime) in &want {
        let at_home = s.home(rel);
        assert!(&std::fs::read(&at_home).unwrap() == data, "{rel}: home's bytes");
        let md = std::fs::metadata(&at_home).unwrap();
        assert_eq!(md.modified().unwrap(), *mtime, "{rel}: home's mtime is the mount's");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o7777,
            0o640,
            "{rel}: mode"
        );
    }
    fs.stop_flushers();
}
