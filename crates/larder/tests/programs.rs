//! Real programs on a write-back mount, as users run them: SQLite databases shared by several processes,
//! `rsync -a`, `cp -a`, `tar`, sparse files and times set with `touch`. Each test checks what the program
//! itself checks (SQLite's integrity check, rsync's list of changed files) and what home ends with.

mod common;

use std::io::Write;
use std::path::Path;
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
/// the other writer has the database open.
fn wal_workload(db: &Path, writers: u32, txns: u32, rows: u32) {
    sqlite(
        db,
        "PRAGMA journal_mode=WAL;\nCREATE TABLE t(writer INTEGER, txn INTEGER, row INTEGER, payload TEXT);\n",
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
    let t = TestDir::new("sqlite-wal");
    let m = t.mount(&["--write-mode", "write-back"]);
    sqlite_runs(&t, &m, 20, 2);
    m.unmount();
}

#[test]
fn sqlite_wal_two_writers_lose_nothing_with_home_10ms_away() {
    let t = TestDir::new("sqlite-wal-wan");
    let m = t.mount(&["--emulate-wan", "latency=10ms,bandwidth=200MiB/s"]);
    sqlite_runs(&t, &m, 20, 2);
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
                "PRAGMA journal_mode=WAL;\nCREATE TABLE t(writer, txn, row, payload);\n",
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
