//! Integration tests of the write-back journal through real FUSE mounts, run as root with /dev/fuse:
//! minimal reproductions of the larder bugs the other write-back tests found (restarts with changes
//! queued, a directory moved out of a removed parent, rmdir of an unlisted directory, truncation inside a
//! written block, listings while pushes land).
//!
//! Every mount here passes `--write-mode write-back` (the harness defaults to write-through). Changes
//! return once they are durable in the cache dir and reach home after `--sync-lag` or `larder drain`; the
//! tests compare the plain home directory with what the mount showed or with a model of the changes.

mod common;
mod writeback;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use writeback::*;

/// Run `f` on a thread; if it does not return within `secs`, SIGKILL the daemon of `m` (so the stuck call
/// fails and the mount can be cleaned up) and fail the test.
fn within<T: Send + 'static>(m: &Mount, secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(_) => {
            let log = m.log();
            if is_larder_daemon(m.pid) {
                signal(m.pid, libc::SIGKILL);
            }
            panic!("{what} did not return within {secs} s (the daemon was killed)\n--- daemon log ---\n{log}");
        }
    }
}

/// Renames and creates queued when the daemon died are pushed by the next daemon before anything looked the
/// objects up; the mount must still find them where home now has them.
#[test]
fn ops_pushed_after_a_restart_leave_the_objects_reachable() {
    let t = TestDir::new("wb-restart-push");
    let dog = Watchdog::new(
        Duration::from_secs(90),
        "ops_pushed_after_a_restart_leave_the_objects_reachable",
    );
    std::fs::create_dir_all(t.home.join("dir/sub")).unwrap();
    std::fs::write(t.home.join("dir/sub/file"), b"hello").unwrap();
    std::fs::write(t.home.join("f1"), b"data").unwrap();
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    snapshot(&m.mnt); // everything looked up and cached
    std::fs::rename(m.path("dir"), m.path("renamed")).unwrap();
    std::fs::rename(m.path("f1"), m.path("f2")).unwrap();
    std::os::unix::fs::symlink("../target-1", m.path("link")).unwrap();
    put(&m.path("new.txt"), b"new");
    assert!(pending(&m) >= 4, "{}", m.status()["journal"]);

    // Killed with all four queued; the next daemon pushes them at once (lag 0) and nothing is looked up
    // before the drain ends.
    let m = kill_and_remount(&t, m, &["--sync-lag", "0s"]);
    dog.watch(&m);
    drain_ok(&m, 30);
    let home = names(&t.home);
    assert_eq!(home, ["f2", "link", "new.txt", "renamed"], "home after the drain");

    let mut problems = Vec::new();
    match std::fs::read_dir(m.path("renamed"))
        .and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>())
    {
        Ok(v) if v == ["sub"] => {}
        other => problems.push(format!("listing renamed/: {other:?}, want [\"sub\"]")),
    }
    match std::fs::read(m.path("renamed/sub/file")) {
        Ok(v) if v == b"hello" => {}
        other => problems.push(format!("reading renamed/sub/file: {other:?}")),
    }
    match std::fs::read(m.path("f2")) {
        Ok(v) if v == b"data" => {}
        other => problems.push(format!("reading f2: {other:?}")),
    }
    match std::fs::read_link(m.path("link")) {
        Ok(v) if v == Path::new("../target-1") => {}
        other => problems.push(format!("readlink link: {other:?}")),
    }
    match std::fs::read(m.path("new.txt")) {
        Ok(v) if v == b"new" => {}
        other => problems.push(format!("reading new.txt: {other:?}")),
    }
    assert!(
        problems.is_empty(),
        "home has every object, the mount cannot reach some:\n{}",
        problems.join("\n")
    );
    m.unmount();
}

/// A directory moved out of a parent that is then removed: until the rename reaches home, home still has the
/// directory under the removed parent. Neither the kernel forgetting the removed parent nor a restart may
/// cut the way there.
#[test]
fn a_dir_moved_out_of_a_removed_parent_stays_reachable() {
    let t = TestDir::new("wb-moved-out");
    let dog = Watchdog::new(
        Duration::from_secs(90),
        "a_dir_moved_out_of_a_removed_parent_stays_reachable",
    );
    std::fs::create_dir_all(t.home.join("a/b/c")).unwrap();
    std::fs::write(t.home.join("a/b/c/f"), b"deep").unwrap();
    std::fs::write(t.home.join("a/b/g"), b"near").unwrap();
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    // Only b is looked up (not c or the files), so reaching them later needs b's home path.
    assert!(m.path("a/b").is_dir());
    std::fs::rename(m.path("a/b"), m.path("b")).unwrap();
    std::fs::remove_dir(m.path("a")).unwrap();
    // The kernel forgets the removed directory.
    std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    assert_eq!(read(&m.path("b/g")), b"near", "before a restart");
    let m = kill_and_remount(&t, m, &["--sync-lag", "60s"]);
    dog.watch(&m);
    assert_eq!(read(&m.path("b/c/f")), b"deep", "after a restart");
    drain_ok(&m, 30);
    assert_eq!(names(&t.home), ["b"], "home after the drain");
    assert_eq!(std::fs::read(t.home.join("b/c/f")).unwrap(), b"deep");
    m.unmount();
}

/// rmdir of a directory that is at home and whose listing the cache does not hold (never listed, or listed
/// longer than the validity lag ago) must answer, not hang.
#[test]
fn rmdir_of_an_unlisted_home_dir_does_not_hang() {
    let t = TestDir::new("wb-rmdir");
    std::fs::create_dir_all(t.home.join("empty")).unwrap();
    std::fs::create_dir_all(t.home.join("full")).unwrap();
    std::fs::write(t.home.join("full/x"), b"x").unwrap();
    let m = wb_mount(&t, &["--sync-lag", "5s"]);
    let p = m.path("full");
    let r = within(&m, 10, "rmdir of a non-empty home dir", move || std::fs::remove_dir(&p));
    assert_eq!(
        r.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOTEMPTY)),
        "rmdir full: {r:?}"
    );
    let p = m.path("empty");
    within(&m, 10, "rmdir of an empty home dir", move || std::fs::remove_dir(&p)).expect("rmdir empty");
    drain_ok(&m, 30);
    assert_eq!(names(&t.home), ["full"]);
    m.unmount();
}

/// Truncating a file inside a cached block that holds unpushed writes must leave the cache index's entry
/// of that block right: the next mount must not find the block corrupt (dropped and fetched again, or
/// worse, see `kill_9_at_random_points_without_renames_loses_nothing_acknowledged`).
#[test]
fn truncating_a_written_block_keeps_its_cache_index_right() {
    let t = TestDir::new("wb-trunc");
    let mut rng = Rng::new(707);
    let mut want = write_random(&t.home.join("f.bin"), 178_229, &mut rng);
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "the first read");
    // A write past the later truncation point, made durable, then the truncation: no dirty range is left
    // below the new size, so the push after it marks no block clean again.
    let f = OpenOptions::new().write(true).open(m.path("f.bin")).unwrap();
    f.write_all_at(&[b'X'; 1000], 100_000).unwrap();
    f.sync_all().unwrap();
    f.set_len(21_570).unwrap();
    close(f).unwrap();
    want.truncate(21_570);
    drain_ok(&m, 30);
    assert_same_bytes(&read(&t.home.join("f.bin")), &want, "home after the drain");
    m.unmount();

    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    assert_same_bytes(
        &read(&m.path("f.bin")),
        &want,
        "the mount after a clean unmount and mount",
    );
    let st = m.status();
    assert_eq!(
        num(&st, "/cache/corrupt_blocks"),
        0,
        "the cache index disagrees with the cache file after the truncation: {}\n--- daemon log ---\n{}",
        st["cache"],
        m.log()
    );
    m.unmount();
}

/// A directory listed (from home) while the flusher pushes creates into it must still show every entry:
/// each is either at home already or still queued here.
#[test]
fn listing_while_pushes_land_shows_every_entry() {
    let t = TestDir::new("wb-listrace");
    let dog = Watchdog::new(Duration::from_secs(90), "listing_while_pushes_land_shows_every_entry");
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    let n = 200;
    for i in 0..n {
        put(&m.path(&format!("f{i:03}")), b"");
    }
    let out = larder(&["unmount", s(&m.mnt), "--leave-pending"]);
    assert!(out.success(), "larder unmount --leave-pending failed:\n{out}");
    m.disarm();
    // Lag 0: the pushes start at once; validity lag 0: every listing asks home.
    let m = wb_mount(&t, &["--sync-lag", "0s", "--validity-lag", "0s"]);
    dog.watch(&m);
    let mut short = Vec::new();
    let mut listings = 0;
    let started = Instant::now();
    // List as fast as possible until home has them all.
    while started.elapsed() < Duration::from_secs(10) {
        let got = names(&m.mnt);
        listings += 1;
        if got.len() != n {
            short.push(got.len());
        }
        if names(&t.home).len() == n && listings > 5 {
            break;
        }
    }
    drain_ok(&m, 30);
    assert_eq!(names(&m.mnt).len(), n);
    assert!(
        short.is_empty(),
        "{} of {listings} listings taken while the {n} creates were pushed missed entries (they had {short:?})",
        short.len()
    );
    m.unmount();
}
