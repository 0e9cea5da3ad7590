//! Restarts, clean and after a kill, in the core without a mount (a real POSIX home in a temporary
//! directory, counted by the metrics layer): inode numbers and cached data are kept, blocks waiting for
//! home are not evicted, and pushes cut short are recognised after unclean stops.

use std::sync::Arc;
use std::time::Duration;

use larder_fs::{Drained, Fs, FsConfig};
use larder_home::{Fault, FaultLayer, HomeError, HomeResult, Layer, OpKind, SetAttr};

mod common;
use common::*;

/// Read the files of [`Setup::others_at_home`] whole, each checked.
fn fill_with_others(fs: &Fs) {
    for i in 0..4 {
        let g = resolve(fs, &format!("g{i}")).unwrap();
        assert!(read_file(fs, g) == pattern(4 * BS as usize, 10 + i as u8));
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
