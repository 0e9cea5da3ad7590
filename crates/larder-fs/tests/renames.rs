//! Write-back renames as they land at home, in the core without a mount (a real POSIX home in a temporary
//! directory, counted by the metrics layer): reads, lookups and listings under a rename home has made and
//! the cache has not heard of yet; renames cut short and retried.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use larder_fs::{Drained, FsConfig};
use larder_home::{Fault, FaultLayer, HomeError, OpKind};

mod common;
use common::*;

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
