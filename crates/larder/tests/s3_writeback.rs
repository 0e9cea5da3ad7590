//! Integration tests of larder's write-back journal against an S3 home served by a local moto server,
//! through real FUSE mounts: run as root with /dev/fuse and python3 (`scripts/s3-server.sh` installs
//! moto[server] with pip if it is missing, and the tests fail, not skip, if it cannot).
//!
//! Every test starts its own moto server and bucket, mounts `s3://BUCKET/PREFIX` in write-back mode
//! (every mount passes `--write-mode write-back`: the harness would otherwise choose write-through), and
//! compares the bucket with a model of the acknowledged changes once `larder drain` says everything
//! reached home.

mod common;
mod moto;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use moto::*;

// Helpers ------------------------------------------------------------------------------------------------

/// The directories (relative paths) that hold the model's files.
fn parent_dirs<'a>(files: impl IntoIterator<Item = &'a String>) -> BTreeSet<String> {
    let mut dirs = BTreeSet::new();
    for f in files {
        let mut p = f.as_str();
        while let Some(i) = p.rfind('/') {
            p = &p[..i];
            dirs.insert(p.to_string());
        }
    }
    dirs
}

/// Every regular file under the mount with its bytes, relative path -> content.
fn mount_files(m: &Mount) -> BTreeMap<String, Vec<u8>> {
    walk(&m.mnt)
        .into_iter()
        .filter(|(_, md)| md.is_file())
        .map(|(rel, _)| {
            let rel = rel.to_str().expect("UTF-8 names").to_string();
            let v = read(&m.path(&rel));
            (rel, v)
        })
        .collect()
}

/// `journal.KEY` of a status.
fn journal(v: &serde_json::Value, key: &str) -> u64 {
    num(v, &format!("/journal/{key}"))
}

/// `larder conflicts MNT --json`, parsed.
fn conflicts(m: &Mount) -> serde_json::Value {
    let out = larder(&["conflicts", s(&m.mnt), "--json"]);
    assert!(out.success(), "larder conflicts --json failed:\n{out}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("conflicts is not JSON ({e}):\n{}", out.stdout))
}

/// Run `f` (a change or read through the mount) on a thread; fail the test if it takes longer than
/// `prompt` (it hangs if it takes longer than 30 s). Returns its result.
fn promptly<T: Send + 'static>(prompt: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let t0 = Instant::now();
    let r = with_deadline(Duration::from_secs(30), what, f);
    let took = t0.elapsed();
    assert!(took <= prompt, "{what} took {took:?} (more than {prompt:?})");
    r
}

// 1 ------------------------------------------------------------------------------------------------------

/// Changes made at several levels, a directory rename, a removal and a file that lived and died locally
/// all wait for the sync lag; `larder drain` then takes them home in an order that yields exactly the
/// local tree, and the short-lived file never reaches home.
#[test]
fn s3_write_back_drains_in_order() {
    let st = S3Test::new("s3wb-order", "home");
    let mut rng = Rng::new(201);
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "60s"]);
    let before = m.status();
    assert_eq!(before["write_mode"], "write-back", "{before}");

    std::fs::create_dir_all(m.path("a/b")).unwrap();
    let top = b"top level\n".to_vec();
    let one = rng.bytes(10_000);
    let two = rng.bytes(300_000);
    create_with(&m.path("top.txt"), &top);
    create_with(&m.path("a/one.txt"), &one);
    create_with(&m.path("a/b/two.bin"), &two);
    create_with(&m.path("a/b/three.txt"), b"three, removed later");
    // A second write of a file joins its queued data.
    let mut f = OpenOptions::new().append(true).open(m.path("top.txt")).unwrap();
    f.write_all(b"appended\n").unwrap();
    close_checked(f, "top.txt after append");
    let top = [top, b"appended\n".to_vec()].concat();
    std::fs::rename(m.path("a"), m.path("z")).unwrap();
    std::fs::remove_file(m.path("z/b/three.txt")).unwrap();
    for transient in ["transient.tmp", "z/b/transient.tmp"] {
        create_with(&m.path(transient), &rng.bytes(5000));
        std::fs::remove_file(m.path(transient)).unwrap();
    }

    let model: BTreeMap<String, Vec<u8>> = [("top.txt", top), ("z/one.txt", one), ("z/b/two.bin", two)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(mount_files(&m), model, "the mount's files before the drain");

    // Nothing has reached home: the sync lag is a minute.
    let pending = m.status();
    assert_eq!(st.objects(), BTreeMap::new(), "objects before the sync lag ran out");
    assert!(
        journal(&pending, "pending_ops") > 0,
        "nothing pending: {}",
        pending["journal"]
    );
    assert!(
        journal(&pending, "dirty_bytes") > 0,
        "no dirty bytes: {}",
        pending["journal"]
    );

    drain_ok(&m, 60);
    let after = m.status();
    for k in ["pending_ops", "dirty_bytes", "conflicts", "failed_ops"] {
        assert_eq!(
            journal(&after, k),
            0,
            "journal.{k} after the drain: {}",
            after["journal"]
        );
    }
    eprintln!(
        "home calls by kind during the drain: {}",
        ["create", "mkdir", "write", "rename", "unlink", "rmdir"]
            .iter()
            .map(|k| format!("{k} {}", ops(&after, k) - ops(&pending, k)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Home was asked (lookups of the new names) but changed only for the kept files, each made with its
    // content in one call (no write after the create).
    for (kind, want) in [("create", 3), ("write", 0), ("unlink", 0)] {
        assert_eq!(
            ops(&after, kind) - ops(&pending, kind),
            want,
            "home {kind} calls during the drain (3 files kept): {}",
            after["home"]
        );
    }
    st.assert_home_is(&model, &m, "after larder drain");
    st.assert_markers_within(&parent_dirs(model.keys()), "after larder drain");
    let touched: Vec<String> = st
        .srv
        .request_lines()
        .into_iter()
        .filter(|l| l.contains("transient") && !l.contains("\"GET ") && !l.contains("\"HEAD "))
        .collect();
    assert!(
        touched.is_empty(),
        "the transient files were written at home: {touched:#?}"
    );
    assert!(
        st.try_get(&st.key("transient.tmp")).is_none() && st.try_get(&st.key("z/b/transient.tmp")).is_none(),
        "a transient file is at home"
    );
    m.unmount();
}

// 2 ------------------------------------------------------------------------------------------------------

/// With the server stopped (connections hang), the first home call fails within the home timeout and
/// takes home offline; changes and cached reads then go on locally without waiting for home, and once
/// the server is back the journal takes everything home.
#[test]
fn s3_server_stopped_workload_continues_and_drains() {
    let home_timeout = Duration::from_secs(3);
    let st = S3Test::new("s3wb-stopped", "home");
    let mut rng = Rng::new(202);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (rel, size) in [
        ("keep.bin", 100_000),
        ("overwrite.bin", 50_000),
        ("append.txt", 3000),
        ("mv-src.bin", 20_000),
        ("gone.bin", 1000),
        ("uncached-rm.bin", 1000),
        ("uncached.bin", 200_000),
        ("d/inner.txt", 500),
    ] {
        let data = rng.bytes(size);
        st.put(&st.key(rel), &data);
        model.insert(rel.to_string(), data);
    }
    let m = st.mount(&[
        "--write-mode",
        "write-back",
        "--home-timeout",
        "3s",
        "--sync-lag",
        "1s",
        "--validity-lag",
        "60s",
    ]);
    assert_eq!(
        names(&m.mnt),
        [
            "append.txt",
            "d",
            "gone.bin",
            "keep.bin",
            "mv-src.bin",
            "overwrite.bin",
            "uncached-rm.bin",
            "uncached.bin"
        ]
    );
    assert_eq!(names(&m.path("d")), ["inner.txt"]);
    for rel in [
        "keep.bin",
        "overwrite.bin",
        "append.txt",
        "mv-src.bin",
        "gone.bin",
        "d/inner.txt",
    ] {
        assert_same_bytes(&read(&m.path(rel)), &model[rel], &format!("{rel} before the outage"));
    }
    assert_eq!(m.status()["home"]["state"], "online");

    st.srv.stop_process();
    // A home call: the uncached object cannot be fetched.
    let p = m.path("uncached.bin");
    let t0 = Instant::now();
    let r = with_deadline(
        Duration::from_secs(30),
        "reading uncached.bin with moto stopped",
        move || std::fs::read(&p),
    );
    let took = t0.elapsed();
    match r {
        Ok(v) => panic!("reading uncached.bin with moto stopped returned {} bytes", v.len()),
        Err(e) => assert_eq!(errno(&e), libc::EIO, "reading uncached.bin with moto stopped: {e}"),
    }
    eprintln!("uncached.bin failed with EIO after {took:?}");
    assert!(
        took <= home_timeout * 2 + Duration::from_secs(1),
        "EIO came {took:?} after the read started (home timeout {home_timeout:?})"
    );
    assert!(
        wait_until(Duration::from_secs(10), || m.status()["home"]["state"] == "offline"),
        "home is not offline 10 s after a home call timed out: {}",
        m.status()["home"]
    );

    // Changes go on locally, each promptly (no home call: it would take the home timeout).
    let fast = Duration::from_secs(2);
    let new = rng.bytes(70_000);
    {
        let (p, data) = (m.path("new.bin"), new.clone());
        promptly(fast, "create new.bin offline", move || create_with(&p, &data));
    }
    model.insert("new.bin".into(), new);
    {
        let p = m.path("newdir");
        promptly(fast, "mkdir newdir offline", move || std::fs::create_dir(&p).unwrap());
    }
    let inner = rng.bytes(4000);
    {
        let (p, data) = (m.path("newdir/inner.bin"), inner.clone());
        promptly(fast, "create newdir/inner.bin offline", move || create_with(&p, &data));
    }
    model.insert("newdir/inner.bin".into(), inner);
    let over = rng.bytes(30_000);
    {
        let (p, data) = (m.path("overwrite.bin"), over.clone());
        promptly(fast, "overwrite overwrite.bin offline", move || create_with(&p, &data));
    }
    model.insert("overwrite.bin".into(), over);
    let tail = rng.bytes(2000);
    {
        let (p, data) = (m.path("append.txt"), tail.clone());
        promptly(fast, "append to append.txt offline", move || {
            let mut f = OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            close_checked(f, "append.txt");
        });
    }
    model.get_mut("append.txt").unwrap().extend_from_slice(&tail);
    {
        let (a, b) = (m.path("mv-src.bin"), m.path("newdir/mv-dst.bin"));
        promptly(fast, "rename mv-src.bin offline", move || {
            std::fs::rename(&a, &b).unwrap()
        });
    }
    let moved = model.remove("mv-src.bin").unwrap();
    model.insert("newdir/mv-dst.bin".into(), moved);
    {
        let (a, b) = (m.path("new.bin"), m.path("d/new-moved.bin"));
        promptly(fast, "rename new.bin offline", move || std::fs::rename(&a, &b).unwrap());
    }
    let moved = model.remove("new.bin").unwrap();
    model.insert("d/new-moved.bin".into(), moved);
    for rel in ["gone.bin", "uncached-rm.bin"] {
        let p = m.path(rel);
        promptly(fast, &format!("unlink {rel} offline"), move || {
            std::fs::remove_file(&p).unwrap()
        });
        model.remove(rel);
    }
    {
        let (p, data) = (m.path("transient.tmp"), rng.bytes(1000));
        promptly(fast, "create and unlink transient.tmp offline", move || {
            create_with(&p, &data);
            std::fs::remove_file(&p).unwrap();
        });
    }
    // Cached reads are served.
    for rel in [
        "keep.bin",
        "d/inner.txt",
        "overwrite.bin",
        "append.txt",
        "newdir/mv-dst.bin",
    ] {
        let p = m.path(rel);
        let got = promptly(fast, &format!("reading cached {rel} offline"), move || {
            read_uncached(&p)
        });
        assert_same_bytes(
            &got.unwrap_or_else(|e| panic!("reading cached {rel} offline: {e}")),
            &model[rel],
            &format!("{rel} offline"),
        );
    }
    let offline = m.status();
    assert_eq!(offline["home"]["state"], "offline", "{}", offline["home"]);
    assert!(journal(&offline, "pending_ops") > 0, "{}", offline["journal"]);
    assert_eq!(journal(&offline, "conflicts"), 0, "{}", offline["journal"]);

    st.srv.continue_process();
    wait_online(&m, 30, "of moto resuming");
    drain_ok(&m, 60);
    let after = m.status();
    for k in ["pending_ops", "conflicts", "failed_ops"] {
        assert_eq!(
            journal(&after, k),
            0,
            "journal.{k} after the drain: {}",
            after["journal"]
        );
    }
    st.assert_home_is(&model, &m, "after the outage and larder drain");
    st.assert_markers_within(
        &parent_dirs(model.keys())
            .union(&["newdir".to_string()].into())
            .cloned()
            .collect(),
        "after the outage and larder drain",
    );
    // The object that failed to load offline loads now.
    assert_same_bytes(
        &read(&m.path("uncached.bin")),
        &model["uncached.bin"],
        "uncached.bin after the outage",
    );
    m.unmount();
}

// 3 ------------------------------------------------------------------------------------------------------

/// A file written locally while home changed it (the mount trusts its cached version for a minute): the
/// push finds home's new version and applies the mount's conflict policy, and lists the conflict.
#[test]
fn s3_conflicts_under_each_policy() {
    for policy in ["keep-both", "cache-wins", "home-wins"] {
        let st = S3Test::new(&format!("s3wb-{policy}"), "home");
        st.put(&st.key("f.txt"), b"v0");
        let m = st.mount(&[
            "--write-mode",
            "write-back",
            "--sync-lag",
            "30s",
            "--validity-lag",
            "60s",
            "--conflict-policy",
            policy,
        ]);
        assert_eq!(read(&m.path("f.txt")), b"v0", "{policy}: f.txt through the mount");
        create_with(&m.path("f.txt"), b"local");
        // Changed at home after the local change was closed (no descriptor of the mount is open).
        st.put(&st.key("f.txt"), b"home-change");
        drain_ok(&m, 60);

        let files = st.home_files();
        let aside: Vec<&String> = files.keys().filter(|k| k.starts_with("f.txt.conflict")).collect();
        match policy {
            "keep-both" => {
                assert_eq!(
                    files.get("f.txt").map(Vec::as_slice),
                    Some(&b"home-change"[..]),
                    "{policy}"
                );
                assert_eq!(
                    aside.len(),
                    1,
                    "{policy}: want one conflict copy at home: {:?}",
                    files.keys()
                );
                assert!(
                    is_conflict_name(aside[0], "f.txt"),
                    "{policy}: the conflict copy's name {:?} is not f.txt.conflict-HOST-YYYYMMDDTHHMMSSZ",
                    aside[0]
                );
                assert_eq!(files[aside[0]], b"local", "{policy}: the conflict copy");
                assert_eq!(files.len(), 2, "{policy}: objects {:?}", files.keys());
            }
            "cache-wins" => {
                assert_eq!(files.get("f.txt").map(Vec::as_slice), Some(&b"local"[..]), "{policy}");
                assert_eq!(files.len(), 1, "{policy}: objects {:?}", files.keys());
            }
            _ => {
                assert_eq!(
                    files.get("f.txt").map(Vec::as_slice),
                    Some(&b"home-change"[..]),
                    "{policy}"
                );
                assert_eq!(files.len(), 1, "{policy}: objects {:?}", files.keys());
                let kept: Vec<PathBuf> = std::fs::read_dir(m.cache.join("conflicts"))
                    .unwrap_or_else(|e| panic!("{policy}: no conflicts area in the cache dir: {e}"))
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.file_name().unwrap().to_string_lossy().ends_with("-f.txt"))
                    .collect();
                assert_eq!(kept.len(), 1, "{policy}: files kept in <cache>/conflicts: {kept:?}");
                assert_eq!(read(&kept[0]), b"local", "{policy}: {}", kept[0].display());
            }
        }

        // The mount shows the version that stayed at home (the kernel's view included), and keep-both's
        // copy beside it.
        let (winner, listing): (&[u8], Vec<String>) = match policy {
            "keep-both" => (b"home-change", vec!["f.txt".into(), aside[0].clone()]),
            "cache-wins" => (b"local", vec!["f.txt".into()]),
            _ => (b"home-change", vec!["f.txt".into()]),
        };
        let got = read_uncached(&m.path("f.txt")).unwrap_or_else(|e| panic!("{policy}: f.txt after the drain: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(winner),
            "{policy}: f.txt through the mount after the conflict"
        );
        assert_eq!(names(&m.mnt), listing, "{policy}: the mount's root after the conflict");

        let c = conflicts(&m);
        let list = c["conflicts"]
            .as_array()
            .unwrap_or_else(|| panic!("no conflicts list: {c}"));
        assert_eq!(list.len(), 1, "{policy}: larder conflicts: {c:#}");
        assert_eq!(
            list[0]["path"].as_str().map(|p| p.trim_start_matches('/')),
            Some("f.txt"),
            "{policy}: {c:#}"
        );
        assert_eq!(list[0]["policy"], policy, "{policy}: {c:#}");
        assert_eq!(list[0]["complete"], true, "{policy}: {c:#}");
        if policy == "keep-both" {
            let kept_at = list[0]["kept_at"].as_str().unwrap_or_default();
            assert!(
                kept_at.ends_with(aside[0].as_str()),
                "{policy}: kept_at {kept_at:?}, copy {}",
                aside[0]
            );
        }
        assert_eq!(
            c["failed_ops"].as_array().map(Vec::len),
            Some(0),
            "{policy}: failed ops: {c:#}"
        );
        let v = m.status();
        assert_eq!(journal(&v, "conflicts"), 1, "{policy}: {}", v["journal"]);
        assert_eq!(journal(&v, "pending_ops"), 0, "{policy}: {}", v["journal"]);
        m.unmount();
    }
}

// 4 ------------------------------------------------------------------------------------------------------

/// One change of the kill-9 workload, applied through the mount and to the model once acknowledged.
#[derive(Debug)]
enum Change {
    Create(String, Vec<u8>),
    Overwrite(String, Vec<u8>),
    Rename(String, String),
    Unlink(String),
}

impl Change {
    fn random(rng: &mut Rng, model: &BTreeMap<String, Vec<u8>>) -> Change {
        const NAMES: [&str; 12] = [
            "f0", "f1", "f2", "f3", "f4", "f5", "d/g0", "d/g1", "d/g2", "d/g3", "d/e/h0", "d/e/h1",
        ];
        let pick = |rng: &mut Rng| NAMES[rng.below(NAMES.len() as u64) as usize].to_string();
        let existing: Vec<&String> = model.keys().collect();
        let size = |rng: &mut Rng| match rng.below(4) {
            0 => rng.below(100) as usize,
            1 | 2 => rng.below(64 << 10) as usize,
            _ => (1 << 20) + rng.below(1 << 20) as usize,
        };
        let roll = if existing.is_empty() { 0 } else { rng.below(10) };
        match roll {
            0..=4 => {
                let name = pick(rng);
                let n = size(rng);
                if model.contains_key(&name) {
                    Change::Overwrite(name, rng.bytes(n))
                } else {
                    Change::Create(name, rng.bytes(n))
                }
            }
            5..=6 => {
                let name = existing[rng.below(existing.len() as u64) as usize].clone();
                let n = size(rng);
                Change::Overwrite(name, rng.bytes(n))
            }
            7..=8 => {
                let from = existing[rng.below(existing.len() as u64) as usize].clone();
                let mut to = pick(rng);
                if to == from {
                    to = format!("{to}-r");
                }
                Change::Rename(from, to)
            }
            _ => Change::Unlink(existing[rng.below(existing.len() as u64) as usize].clone()),
        }
    }

    /// Apply through the mount at `mnt` (on the calling thread); panics if any call fails.
    fn apply(&self, mnt: &Path) {
        match self {
            Change::Create(name, data) => create_with(&mnt.join(name), data),
            Change::Overwrite(name, data) => {
                let p = mnt.join(name);
                let mut f = OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&p)
                    .unwrap_or_else(|e| panic!("open {name} to overwrite: {e}"));
                f.write_all(data).unwrap_or_else(|e| panic!("overwrite {name}: {e}"));
                f.sync_all().unwrap_or_else(|e| panic!("fsync {name}: {e}"));
                close_checked(f, name);
            }
            Change::Rename(from, to) => {
                std::fs::rename(mnt.join(from), mnt.join(to)).unwrap_or_else(|e| panic!("rename {from} {to}: {e}"))
            }
            Change::Unlink(name) => {
                std::fs::remove_file(mnt.join(name)).unwrap_or_else(|e| panic!("unlink {name}: {e}"))
            }
        }
    }

    fn apply_to_model(self, model: &mut BTreeMap<String, Vec<u8>>) {
        match self {
            Change::Create(name, data) | Change::Overwrite(name, data) => {
                model.insert(name, data);
            }
            Change::Rename(from, to) => {
                let data = model.remove(&from).expect("renamed file in the model");
                model.insert(to, data);
            }
            Change::Unlink(name) => {
                model.remove(&name);
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Change::Create(n, d) => format!("create {n} ({} bytes)", d.len()),
            Change::Overwrite(n, d) => format!("overwrite+fsync {n} ({} bytes)", d.len()),
            Change::Rename(a, b) => format!("rename {a} -> {b}"),
            Change::Unlink(n) => format!("unlink {n}"),
        }
    }
}

/// A random workload whose daemon is killed with SIGKILL between changes again and again, the same cache
/// dir mounted again each time: every acknowledged change survives in the mount, and once drained the
/// bucket is exactly the model.
#[test]
fn s3_kill_9_then_remount_pushes_everything() {
    const KILLS: usize = 8;
    let st = S3Test::new("s3wb-kill9", "home");
    let mut rng = Rng::new(204);
    let args = ["--write-mode", "write-back", "--sync-lag", "1s"];
    let mut m = st.mount(&args);
    std::fs::create_dir_all(m.path("d/e")).unwrap();
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut history: Vec<String> = Vec::new();
    let t0 = Instant::now();
    let mut kills = 0;
    let mut changes = 0;
    let mut kills_with_pending = 0;
    while kills < KILLS && t0.elapsed() < Duration::from_secs(60) {
        // A run of changes, then a kill: at once (every change still queued: the sync lag is 1 s) or after
        // a random pause (pushes under way, or done).
        for _ in 0..2 + rng.below(10) {
            let c = Change::random(&mut rng, &model);
            let what = c.describe();
            history.push(what.clone());
            let mnt = m.mnt.clone();
            let c = with_deadline(Duration::from_secs(30), &what, move || {
                c.apply(&mnt);
                c
            });
            c.apply_to_model(&mut model);
            changes += 1;
        }
        if kills % 2 == 1 {
            std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));
        }
        if journal(&m.status(), "pending_ops") > 0 {
            kills_with_pending += 1;
        }
        let pid = m.pid;
        assert!(is_larder_daemon(pid), "the daemon {pid} is gone before the kill");
        signal(pid, libc::SIGKILL);
        assert!(
            wait_until(Duration::from_secs(10), || !alive(pid)),
            "daemon {pid} survived SIGKILL"
        );
        kills += 1;
        history.push(format!("--- kill -9 #{kills} ---"));
        // Mount the same cache dir again (larder clears the dead mount); the old guard cleans up if this
        // fails.
        let m2 = st.mount(&args);
        m.disarm();
        m = m2;
        let got = mount_files(&m);
        if got != model {
            panic!(
                "after kill -9 #{kills} and a new mount, the mount lost acknowledged changes:\n  {}\n--- changes ---\n{}\n--- daemon log ---\n{}",
                differences(&got, &model).join("\n  "),
                history.join("\n"),
                m.log()
            );
        }
    }
    eprintln!(
        "{changes} changes, {kills} kills ({kills_with_pending} with changes queued) in {:?}; {} files in the model",
        t0.elapsed(),
        model.len()
    );
    assert!(kills >= 5, "only {kills} kills within 60 s");
    assert!(
        kills_with_pending >= 1,
        "no kill found changes queued: the test proves little"
    );
    drain_ok(&m, 60);
    let v = m.status();
    for k in ["pending_ops", "failed_ops", "conflicts"] {
        assert_eq!(journal(&v, k), 0, "journal.{k} after the drain: {}", v["journal"]);
    }
    if st.home_files() != model {
        panic!(
            "the bucket after {kills} kills and a drain differs from the model:\n  {}\n--- changes ---\n{}\n--- daemon log ---\n{}",
            differences(&st.home_files(), &model).join("\n  "),
            history.join("\n"),
            m.log()
        );
    }
    let mut dirs = parent_dirs(model.keys());
    dirs.extend(["d".to_string(), "d/e".to_string()]);
    st.assert_markers_within(&dirs, "after the kills and the drain");
    m.unmount();
}
