//! Real programs on write-back (and write-through) mounts, as users run them: SQLite databases shared by
//! several processes, `rsync -a`, `cp -a`, `tar`, sparse files and times set with `touch`. Each test checks what the program
//! itself checks (SQLite's integrity check, rsync's list of changed files) and what home ends with.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// How long one `sqlite3` process may take (its busy timeout is a minute).
const SQLITE_DEADLINE: Duration = Duration::from_secs(90);

/// Run `sqlite3 DB` with `script` on its standard input; the failure message carries its output.
fn sqlite(db: &Path, script: &str) -> Result<String, String> {
    let mut child = Command::new("sqlite3")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("sqlite3 could not start: {e}"))?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .map_err(|e| format!("feeding sqlite3: {e}"))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            return if status.success() {
                Ok(text)
            } else {
                Err(format!(
                    "sqlite3 {status}: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            };
        }
        if started.elapsed() > SQLITE_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("sqlite3 took longer than {SQLITE_DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One transaction of `rows` INSERTs, in its own `sqlite3` process, waiting for the write lock as long
/// as a minute.
fn insert_transaction(db: &Path, writer: u32, txn: u32, rows: u32) -> Result<(), String> {
    let mut script = String::from(".bail on\nPRAGMA busy_timeout=60000;\nBEGIN IMMEDIATE;\n");
    for row in 0..rows {
        script.push_str(&format!(
            "INSERT INTO t VALUES({writer}, {txn}, {row}, 'row {writer}/{txn}/{row} xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx');\n"
        ));
    }
    script.push_str("COMMIT;\n");
    sqlite(db, &script).map(|_| ())
}

/// SQLite's own verdict on `db` and its row count.
fn integrity(db: &Path) -> (String, u64) {
    let out = sqlite(db, "PRAGMA integrity_check;\nSELECT count(*) FROM t;\n").unwrap_or_else(|e| e);
    let mut lines: Vec<&str> = out.lines().collect();
    let count = lines.pop().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
    (lines.join(" | "), count)
}

/// `writers` processes at once, each running `txns` `sqlite3` processes one after another, each
/// committing one transaction of `rows` rows to one database in WAL mode. Every process opens and closes
/// the database, so the last one out removes `-wal` and `-shm` and the next one makes them again, while
/// the other writer has the database open. The creating process waits for locks too: a reader may
/// already have the new file open, and switching to WAL needs it alone.
fn wal_workload(db: &Path, writers: u32, txns: u32, rows: u32) {
    sqlite(
        db,
        "PRAGMA busy_timeout=60000;\nPRAGMA journal_mode=WAL;\nCREATE TABLE t(writer INTEGER, txn INTEGER, row INTEGER, payload TEXT);\n",
    )
    .expect("create the database");
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let db = db.to_path_buf();
            std::thread::spawn(move || -> Result<(), String> {
                for txn in 0..txns {
                    insert_transaction(&db, w, txn, rows).map_err(|e| format!("writer {w} transaction {txn}: {e}"))?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer thread").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Run the two-writer WAL workload `runs` times on the mount `m`, each on a database of its own made
/// anew, and check every one of them through the mount, then at home after a drain.
fn sqlite_runs(t: &TestDir, m: &Mount, runs: u32, writers: u32) {
    let (txns, rows) = (50, 100);
    let want = (writers * txns * rows) as u64;
    let mut failures = Vec::new();
    for run in 0..runs {
        let db = m.path(&format!("run{run}.db"));
        wal_workload(&db, writers, txns, rows);
        let (verdict, count) = integrity(&db);
        if verdict != "ok" || count != want {
            failures.push(format!("run {run} on the mount: {verdict}; {count} rows of {want}"));
        }
    }
    assert!(
        failures.is_empty(),
        "SQLite in WAL mode lost data:\n{}",
        failures.join("\n")
    );
    drain_ok(m, 120);
    for run in 0..runs {
        let home_db = t.home.join(format!("run{run}.db"));
        assert!(
            !t.home.join(format!("run{run}.db-wal")).exists(),
            "run {run}: the WAL was removed, yet home has it"
        );
        let (verdict, count) = integrity(&home_db);
        assert!(
            verdict == "ok" && count == want,
            "run {run} at home after the drain: {verdict}; {count} rows of {want}"
        );
    }
}

#[test]
fn sqlite_wal_two_writers_lose_nothing() {
    sqlite_two_writers("sqlite-wal", "write-back", 20, &[]);
}

#[test]
fn sqlite_wal_two_writers_lose_nothing_with_home_10ms_away() {
    sqlite_two_writers(
        "sqlite-wal-wan",
        "write-back",
        20,
        &["--emulate-wan", "latency=10ms,bandwidth=200MiB/s"],
    );
}

/// Write-through takes every change (each SQLite commit's fsync, each removal of `-wal` and `-shm`) to
/// home before it returns, on the same change pipeline as write-back.
#[test]
fn sqlite_wal_two_writers_lose_nothing_in_write_through() {
    sqlite_two_writers("sqlite-wal-through", "write-through", 6, &[]);
}

/// The two-writer WAL workload, `runs` times, on a `mode` mount with `extra` options.
fn sqlite_two_writers(name: &str, mode: &str, runs: u32, extra: &[&str]) {
    let t = TestDir::new(name);
    let mut args = vec!["--write-mode", mode];
    args.extend_from_slice(extra);
    let m = t.mount(&args);
    sqlite_runs(&t, &m, runs, 2);
    m.unmount();
}

/// Variants: three writers on a scratch (local) mount while a fourth process keeps reading, and a writer
/// that reads the database through mmap.
#[test]
fn sqlite_wal_three_writers_and_a_reader_on_a_local_mount() {
    let t = TestDir::new("sqlite-wal-local");
    let m = t.mount(&["--write-mode", "local"]);
    let (writers, txns, rows) = (3u32, 30u32, 100u32);
    for run in 0..4 {
        let db = m.path(&format!("v{run}.db"));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (db, stop) = (db.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(300);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                    if db.exists()
                        && let Err(e) = sqlite(&db, ".bail on\nPRAGMA busy_timeout=60000;\nSELECT count(*) FROM t;\n")
                        && !e.contains("no such table")
                    {
                        errors.push(e);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                errors
            })
        };
        if run % 2 == 1 {
            // Readers map the database file.
            sqlite(
                &db,
                "PRAGMA busy_timeout=60000;\nPRAGMA journal_mode=WAL;\nCREATE TABLE t(writer, txn, row, payload);\n",
            )
            .expect("create");
            let handles: Vec<_> = (0..writers)
                .map(|w| {
                    let db = db.clone();
                    std::thread::spawn(move || {
                        for txn in 0..txns {
                            let mut script =
                                String::from(".bail on\nPRAGMA busy_timeout=60000;\nPRAGMA mmap_size=268435456;\n");
                            script.push_str("BEGIN IMMEDIATE;\n");
                            for row in 0..rows {
                                script.push_str(&format!(
                                    "INSERT INTO t VALUES({w},{txn},{row},'mmap {w}/{txn}/{row}');\n"
                                ));
                            }
                            script.push_str("COMMIT;\n");
                            sqlite(&db, &script).unwrap_or_else(|e| panic!("writer {w} transaction {txn}: {e}"));
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("writer");
            }
        } else {
            wal_workload(&db, writers, txns, rows);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reader_errors = reader.join().expect("reader");
        assert!(
            reader_errors.is_empty(),
            "run {run}: the reader failed: {reader_errors:?}"
        );
        let (verdict, count) = integrity(&db);
        let want = (writers * txns * rows) as u64;
        assert!(
            verdict == "ok" && count == want,
            "run {run}: {verdict}; {count} rows of {want}"
        );
    }
    m.unmount();
}

/// Run a shell command line (the programs users run), failing the test with its output if it fails.
#[track_caller]
fn sh(cmd: &str) -> String {
    let out = run_cmd("sh", &["-c", cmd], Duration::from_secs(120));
    assert!(out.success(), "`{cmd}` failed: {out}");
    out.stdout
}

/// Modification times (seconds, nanoseconds) of every entry under `root` but symlinks, by relative path.
fn mtimes(root: &Path) -> std::collections::BTreeMap<std::path::PathBuf, (i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    walk(root)
        .into_iter()
        .filter(|(_, m)| !m.file_type().is_symlink())
        .map(|(p, m)| (p, (m.mtime(), m.mtime_nsec())))
        .collect()
}

/// `got` has the times of `want`, to the nanosecond, or the second where `whole_seconds` (tar archives
/// hold whole seconds).
#[track_caller]
fn assert_same_times(got: &Path, want: &Path, what: &str) {
    assert_times(got, want, what, false)
}

#[track_caller]
fn assert_times(got: &Path, want: &Path, what: &str, whole_seconds: bool) {
    let secs = |m: std::collections::BTreeMap<std::path::PathBuf, (i64, i64)>| {
        m.into_iter()
            .map(|(p, (s, ns))| (p, (s, if whole_seconds { 0 } else { ns })))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (g, w) = (secs(mtimes(got)), secs(mtimes(want)));
    let wrong: Vec<String> = w
        .iter()
        .filter(|(p, t)| g.get(*p) != Some(t))
        .map(|(p, t)| format!("{}: {:?}, want {t:?}", p.display(), g.get(p)))
        .collect();
    assert!(wrong.is_empty(), "{what}: times differ:\n{}", wrong.join("\n"));
}

/// A source tree with files of several sizes, a symlink, a sparse file and directory times in the past.
fn source_tree(root: &Path) {
    let mut rng = Rng::new(7);
    std::fs::create_dir_all(root.join("a/b")).expect("mkdir");
    std::fs::create_dir_all(root.join("c")).expect("mkdir");
    for i in 0..30 {
        write_random(&root.join(format!("a/f{i}")), i * 997 + 1, &mut rng);
    }
    for i in 0..10 {
        std::fs::write(root.join(format!("a/b/g{i}")), format!("{i}\n")).expect("write");
    }
    std::os::unix::fs::symlink("a/f1", root.join("link")).expect("symlink");
    sh(&format!(
        "truncate -s 10M {0}/c/sparse && touch -d 2015-05-05 {0}/a/f3 {0}/a/b {0}/c {0}/a",
        s(root)
    ));
}

/// The validity lag of the programs' mounts: short, so that tests see what the mount shows after it.
const LAG: Duration = Duration::from_secs(2);

fn programs_mount(t: &TestDir, mode: &str) -> Mount {
    t.mount(&["--write-mode", mode, "--sync-lag", "1s", "--validity-lag", "2s"])
}

#[test]
fn times_set_before_the_push_are_the_times_home_ends_with() {
    times_are_kept("write-back");
}

#[test]
fn times_set_while_writes_are_pending_are_kept_in_write_through() {
    times_are_kept("write-through");
}

fn times_are_kept(mode: &str) {
    let t = TestDir::new("times");
    let m = programs_mount(&t, mode);
    let (a, d) = (m.path("a"), m.path("d"));
    sh(&format!(
        "echo hello > {0}; touch -d 2010-01-01 {0}; mkdir {1}; echo x > {1}/f; touch -d 2011-01-01 {1}",
        s(&a),
        s(&d)
    ));
    let (t2010, t2011) = (1_262_304_000, 1_293_840_000);
    assert_eq!(
        (mtime_secs(&a), mtime_secs(&d)),
        (t2010, t2011),
        "the mount before the push"
    );
    drain_ok(&m, 60);
    assert_eq!(
        (mtime_secs(&t.home.join("a")), mtime_secs(&t.home.join("d"))),
        (t2010, t2011),
        "home after the drain"
    );
    std::thread::sleep(LAG + Duration::from_millis(500));
    assert_eq!(
        (mtime_secs(&a), mtime_secs(&d)),
        (t2010, t2011),
        "the mount after the validity lag"
    );

    // A file written, not touched, keeps the time of its write at home, not the time of its push.
    let w = m.path("written");
    std::fs::write(&w, b"data").expect("write");
    let written = mtimes(&m.mnt)[std::path::Path::new("written")];
    std::thread::sleep(Duration::from_millis(1500));
    drain_ok(&m, 60);
    assert_eq!(
        mtimes(&t.home)[std::path::Path::new("written")],
        written,
        "a write's time at home"
    );

    // cp -a and tar -x set every time, files' and directories', before the data reaches home.
    let src = t.root().join("src");
    source_tree(&src);
    sh(&format!("cp -a {} {}", s(&src), s(&m.path("copied"))));
    sh(&format!(
        "tar -C {} -cf {}/t.tar . && mkdir {2} && tar -C {2} -xf {1}/t.tar",
        s(&src),
        s(t.root()),
        s(&m.path("untarred"))
    ));
    assert_same_times(&m.path("copied"), &src, "cp -a, on the mount");
    assert_times(&m.path("untarred"), &src, "tar -x, on the mount", true);
    drain_ok(&m, 60);
    std::thread::sleep(LAG + Duration::from_millis(500));
    for (dir, whole_seconds) in [("copied", false), ("untarred", true)] {
        assert_times(&t.home.join(dir), &src, &format!("{dir}, at home"), whole_seconds);
        assert_times(
            &m.path(dir),
            &src,
            &format!("{dir}, on the mount after the lag"),
            whole_seconds,
        );
    }
    m.unmount();
}

/// `rsync -ai` of `src` into `dst`: the changes it made, one line each (nothing when up to date).
fn rsync_changes(src: &Path, dst: &Path) -> String {
    sh(&format!("rsync -ai {}/ {}/", s(src), s(dst)))
}

#[test]
fn rsync_a_twice_copies_nothing_the_second_time() {
    rsync_twice("rsync", "write-back");
}

#[test]
fn rsync_a_twice_copies_nothing_the_second_time_in_write_through() {
    rsync_twice("rsync-through", "write-through");
}

fn rsync_twice(name: &str, mode: &str) {
    let t = TestDir::new(name);
    let m = programs_mount(&t, mode);
    let src = t.root().join("src");
    source_tree(&src);
    let dst = m.path("dst");
    let first = rsync_changes(&src, &dst);
    assert!(first.lines().count() > 40, "the first pass copies the tree: {first}");
    assert_eq!(rsync_changes(&src, &dst), "", "a second pass at once");
    drain_ok(&m, 60);
    assert_eq!(rsync_changes(&src, &dst), "", "a pass after the drain");
    std::thread::sleep(LAG + Duration::from_millis(500));
    assert_eq!(
        rsync_changes(&src, &dst),
        "",
        "a pass after the drain and the validity lag"
    );
    // Home holds the same tree, times included.
    assert_eq!(
        sh(&format!("rsync -ain {}/ {}/", s(&src), s(&t.home.join("dst")))),
        "",
        "home"
    );
    let status = m.status();
    m.unmount();
    // Nothing was pushed again: the bytes written at home are those of one copy of the tree.
    let tree_bytes: u64 = walk(&src).values().filter(|m| m.is_file()).map(|m| m.len()).sum();
    let written = num(&status, "/home/bytes_written");
    assert!(
        written <= tree_bytes + 1024 * 1024,
        "home received {written} bytes for a tree of {tree_bytes}"
    );
}

/// KiB a tree takes on disk (`du -sk`).
fn du_sk(path: &Path) -> u64 {
    let out = sh(&format!("du -sk {}", s(path)));
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du -sk prints a number")
}

#[test]
fn sparse_files_stay_sparse_in_the_cache_and_at_home() {
    use std::os::unix::fs::MetadataExt;
    let t = TestDir::new("sparse");
    let m = programs_mount(&t, "write-back");
    let f = m.path("f");
    sh(&format!("truncate -s 256M {}", s(&f)));
    let du_kib = |p: &Path| -> u64 { std::fs::metadata(p).expect("stat").blocks() / 2 };
    assert_eq!(std::fs::metadata(&f).expect("stat").len(), 256 << 20);
    assert!(
        du_kib(&f) < 1024,
        "du through the mount shows {} KiB for an empty sparse file",
        du_kib(&f)
    );
    // A little data in the middle, and a hole made by extending with truncate after it.
    sh(&format!(
        "printf middle | dd of={0} bs=1 seek=100000000 conv=notrunc status=none && truncate -s 512M {0}",
        s(&f)
    ));
    drain_ok(&m, 120);
    let written = num(&m.status(), "/home/bytes_written");
    assert!(written < 1 << 20, "the push sent {written} bytes for 6 bytes of data");
    let home = t.home.join("f");
    assert_eq!(std::fs::metadata(&home).expect("stat").len(), 512 << 20);
    assert!(
        du_kib(&home) < 1024,
        "home holds {} KiB for a sparse file",
        du_kib(&home)
    );
    let cache_kib = du_sk(&t.cache);
    assert!(
        cache_kib < 20 * 1024,
        "the cache dir takes {cache_kib} KiB after the push"
    );
    // Read cold from home after the cache lets it go: the holes come back as holes.
    let out = larder(&["evict", s(&f)]);
    assert!(out.success(), "evict: {out}");
    let sum = sh(&format!("cmp -s -n 536870912 {} {} && echo same", s(&f), s(&home)));
    assert_eq!(sum.trim(), "same", "the file reads as home holds it");
    let cache_kib = du_sk(&t.cache);
    assert!(
        cache_kib < 20 * 1024,
        "the cache dir takes {cache_kib} KiB after reading the sparse file"
    );
    m.unmount();
}

/// `git clone` into the default mount, home 10 ms away: git takes and drops lock files (`config.lock`,
/// `HEAD.lock`) by create-exclusive and rename, many times over. A name renamed away must never look
/// taken afterwards (it once did: a lookup read the index before it had taken in the rename). Then
/// `git fsck` and a second `status` on the mount, and the clone at home after the drain.
#[test]
fn git_clone_into_the_mount_then_fsck() {
    let t = TestDir::new("git");
    let repo = t.root().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    for i in 0..300 {
        let d = repo.join(format!("pkg{:02}", i % 20));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("m{i:04}.c")),
            format!("int f{i}(void) {{ return {i}; }}\n").repeat(1 + i % 7),
        )
        .unwrap();
    }
    let git = |dir: &Path, args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "tree"]);
    std::fs::create_dir_all(t.home.join("work")).unwrap();
    let m = t.mount(&[
        "--write-mode",
        "write-back",
        "--validity-lag",
        "2s",
        "--emulate-wan",
        "latency=10ms",
    ]);
    for round in 0..3 {
        let dst = m.path(&format!("work/clone{round}"));
        git(&m.path("work"), &["clone", "-q", s(&repo), s(&dst)]);
        git(&dst, &["fsck", "--strict", "--no-progress"]);
        assert_eq!(git(&dst, &["status", "--porcelain"]), "", "a fresh clone is clean");
    }
    drain_ok(&m, 120);
    let at_home = t.home.join("work/clone0");
    git(&at_home, &["fsck", "--strict", "--no-progress"]);
    assert_eq!(
        git(&at_home, &["status", "--porcelain"]),
        "",
        "the clone at home is clean"
    );
    m.unmount();
}

/// Set-user-ID and set-group-ID bits go as on the local disk: at an owner change (set-group-ID only with
/// group execute), at a write, a truncation or an allocation by a user without CAP_FSETID (set-group-ID
/// with group execute, or when the user is not in the file's group), and not at root's. larder
/// clears them itself (the kernel leaves it to the file system, sparing a request before every chown):
/// each step runs on the mount and in a directory of the local disk, and the modes must agree.
#[test]
fn set_id_bits_go_as_on_the_local_disk() {
    use std::os::unix::fs::PermissionsExt;
    let t = TestDir::new("setid");
    for d in [t.root(), &t.home, &t.mnt] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let m = programs_mount(&t, "write-back");
    let local = t.root().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::set_permissions(&local, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups";
    // (what is done, as a shell command on file $f)
    let steps = [
        ("root chowns a 6755 file", "chmod 6755 $f && chown 65534:65534 $f"),
        ("root chowns a 2745 file", "chmod 2745 $f && chown 0:0 $f"),
        ("root truncates a 6777 file", "chmod 6777 $f && truncate -s 1 $f"),
        (
            "nobody truncates a 6777 file",
            "chmod 6777 $f && $nobody truncate -s 2 $f",
        ),
        (
            "nobody writes to a 6777 file",
            "chmod 6777 $f && $nobody sh -c 'echo more >> $f'",
        ),
        (
            "nobody writes to a 6777 file again after a reopen",
            "chmod 6777 $f && $nobody sh -c 'echo more >> $f'",
        ),
        ("root writes to a 6777 file", "chmod 6777 $f && echo more >> $f"),
        ("root chowns a directory", "chmod 6755 $d && chown 65534 $d"),
        // Without group execute, set-group-ID stays for the file group's members and goes for others.
        (
            "nobody writes to a 2766 file of a group it is not in",
            "chmod 2766 $f && $nobody sh -c 'echo more >> $f'",
        ),
        (
            "nobody truncates a 2766 file of a group it is not in",
            "chmod 2766 $f && $nobody truncate -s 2 $f",
        ),
        (
            "a member of the file's group (a supplementary one) writes to a 2766 file",
            "chgrp 4321 $f && chmod 2766 $f && setpriv --reuid=65534 --regid=65534 --groups=4321 \
             sh -c 'echo more >> $f'",
        ),
        (
            "nobody allocates in a 6777 file",
            "chmod 6777 $f && $nobody fallocate -o 0 -l 8192 $f",
        ),
        (
            "nobody allocates in a 2766 file of a group it is not in",
            "chmod 2766 $f && $nobody fallocate -o 0 -l 8192 $f",
        ),
        (
            "nobody writes to a 6777 file with O_DIRECT",
            "chmod 6777 $f && $nobody dd if=/dev/zero of=$f bs=4096 count=1 oflag=direct conv=notrunc status=none",
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (what, cmd)) in steps.iter().enumerate() {
        let mut modes = Vec::new();
        for root in [&local, &m.mnt] {
            let (f, d) = (root.join(format!("f{i}")), root.join(format!("d{i}")));
            std::fs::write(&f, b"x").unwrap();
            std::fs::create_dir(&d).unwrap();
            let line = cmd.replace("$nobody", nobody).replace("$f", s(&f)).replace("$d", s(&d));
            sh(&line);
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
            modes.push((mode(&f), mode(&d)));
        }
        if modes[0] != modes[1] {
            wrong.push(format!("{what}: local disk {:o}, mount {:o}", modes[0].0, modes[1].0));
        }
    }
    assert!(wrong.is_empty(), "modes differ: {wrong:#?}");
    // And home ends with the mount's modes.
    drain_ok(&m, 120);
    for i in 0..steps.len() {
        let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(
            mode(t.home.join(format!("f{i}"))),
            mode(m.mnt.join(format!("f{i}"))),
            "f{i} at home"
        );
    }
    m.unmount();
}

/// `name=value` of every `user.` attribute of every file and directory under `root` (not following
/// symlinks), by relative path, read with Python's os.listxattr/os.getxattr.
fn xattrs_of(root: &Path) -> String {
    sh(&format!(
        "cd {} && python3 -c 'import os
for d, dirs, files in sorted(os.walk(\".\")):
    for n in sorted([d] + [os.path.join(d, f) for f in files]):
        if os.path.islink(n): continue
        for a in sorted(os.listxattr(n)):
            print(n, a, os.getxattr(n, a).hex())'",
        s(root)
    ))
}

/// Give some of `root`'s files and directories `user.` attributes, binary values included.
fn set_xattrs(root: &Path) {
    sh(&format!(
        "cd {} && python3 -c 'import os
os.setxattr(\"a/f1\", \"user.colour\", b\"blue\")
os.setxattr(\"a/f1\", \"user.bin\", bytes(range(256)))
os.setxattr(\"a/b\", \"user.dir\", b\"a directory\")
os.setxattr(\"a/f2\", \"user.empty\", b\"\")'",
        s(root)
    ));
}

#[test]
fn extended_attributes_go_through_rsync_x_tar_and_cp_and_reach_home() {
    let t = TestDir::new("xattrs");
    let m = programs_mount(&t, "write-back");
    let src = t.root().join("src");
    source_tree(&src);
    set_xattrs(&src);
    let want = xattrs_of(&src);
    assert!(want.lines().count() == 4, "the source's attributes: {want}");

    // rsync -X: the attributes come along, and a second pass copies nothing.
    let dst = m.path("rsync");
    let first = sh(&format!("rsync -aiX {}/ {}/", s(&src), s(&dst)));
    assert!(first.lines().count() > 40, "{first}");
    assert_eq!(xattrs_of(&dst), want, "rsync -X into the mount");
    assert_eq!(
        sh(&format!("rsync -aiX {}/ {}/", s(&src), s(&dst))),
        "",
        "a second rsync -X"
    );

    // tar --xattrs out of the mount and into it.
    let tarball = t.root().join("x.tar");
    sh(&format!(
        "tar --xattrs --xattrs-include='user.*' -C {} -cf {} .",
        s(&dst),
        s(&tarball)
    ));
    let untar = m.path("untar");
    std::fs::create_dir(&untar).unwrap();
    sh(&format!(
        "tar --xattrs --xattrs-include='user.*' -C {} -xf {}",
        s(&untar),
        s(&tarball)
    ));
    assert_eq!(xattrs_of(&untar), want, "tar --xattrs into the mount");

    // cp --preserve=xattr within the mount.
    let copy = m.path("copy");
    sh(&format!("cp -r --preserve=xattr {}/ {}", s(&dst), s(&copy)));
    assert_eq!(xattrs_of(&copy), want, "cp --preserve=xattr");

    // Home ends with them.
    drain_ok(&m, 60);
    for d in ["rsync", "untar", "copy"] {
        assert_eq!(xattrs_of(&t.home.join(d)), want, "home's {d}");
    }
    // And a new cache of the same home reads them from there.
    m.unmount();
    let cache2 = t.root().join("cache2");
    let m = Mount::new(&t.home, &t.mnt, &cache2, &["--write-mode", "write-back"]);
    assert_eq!(xattrs_of(&m.path("rsync")), want, "read from home by a new cache");
    // A namespace larder does not keep is refused, as by a file system without it.
    let out = run_cmd(
        "python3",
        &[
            "-c",
            &format!(
                "import os; os.setxattr('{}', 'security.x', b'1')",
                s(&m.path("rsync/a/f1"))
            ),
        ],
        COMMAND_DEADLINE,
    );
    assert!(
        !out.success() && out.stderr.contains("Operation not supported"),
        "{out}"
    );
    m.unmount();
}
