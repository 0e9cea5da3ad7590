//! Integration tests of larder's S3 home against a local S3 server (moto), through real FUSE mounts:
//! run as root with /dev/fuse and python3 (`scripts/s3-server.sh` installs moto[server] with pip if it
//! is missing).
//!
//! Every test starts its own moto server (`scripts/s3-server.sh` with a state dir of its own, so on a
//! port of its own) and its own bucket, mounts `s3://BUCKET/PREFIX` with its own cache dir, and checks
//! the objects with `scripts/s3tool.py`. Guards unmount and kill the server even when a test fails;
//! daemon logs are printed then (`<cache>/larder.log`).

mod common;
mod moto;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use moto::*;

// Helpers ------------------------------------------------------------------------------------------------

/// The content s3tool put-many gives object `i`.
fn put_many_body(i: usize, size: usize) -> Vec<u8> {
    format!("{i:05}").bytes().cycle().take(size).collect()
}

/// Read the rest of `f`, which gave `got` so far, and check that everything it gave is a prefix of `old`
/// (an error may end the reading early, a switch to another version may not).
fn read_on_old_version(mut f: File, mut got: Vec<u8>, old: &[u8], what: &str) {
    let mut buf = vec![0u8; 64 << 10];
    let end = loop {
        match f.read(&mut buf) {
            Ok(0) => break None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break Some(e),
        }
    };
    drop(f);
    eprintln!("{what}: {} bytes, then {end:?}", got.len());
    assert_same_bytes(
        &got,
        &old[..got.len().min(old.len())],
        &format!("{what}: the bytes read"),
    );
    if end.is_none() {
        assert_eq!(got.len(), old.len(), "{what}: the file ended early without an error");
    }
}

/// Which of `v1` and `v2` `got` is, or a panic naming the mix.
fn which_version(got: &[u8], v1: &[u8], v2: &[u8], what: &str) -> u8 {
    if got == v1 {
        return 1;
    }
    if got == v2 {
        return 2;
    }
    let n = got.len().min(v1.len());
    let old = (0..n).filter(|&i| got[i] == v1[i]).count();
    let new = (0..n).filter(|&i| i < v2.len() && got[i] == v2[i]).count();
    let first_old = (0..n).find(|&i| got[i] == v1[i]);
    let first_new = (0..n).find(|&i| i < v2.len() && got[i] == v2[i]);
    panic!(
        "{what}: neither version: {} bytes (versions have {}), {old} bytes of the old version (first at \
         {first_old:?}) and {new} of the new one (first at {first_new:?}): a mix of two versions",
        got.len(),
        v1.len()
    );
}

// a ------------------------------------------------------------------------------------------------------

#[test]
fn cold_then_warm_reads_equal_objects() {
    let st = S3Test::new("coldwarm", "deep/home");
    let mut rng = Rng::new(101);
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (rel, size) in [
        ("top.bin", 1000),
        ("empty.bin", 0),
        ("a/x.txt", 12_345),
        ("a/b/c/deep.bin", 300_000),
        ("d/e/f/g.bin", 70_001),
        ("big/five-mib.bin", 5 << 20),
    ] {
        let data = rng.bytes(size);
        st.put(&st.key(rel), &data);
        files.insert(rel.to_string(), data);
    }
    // Not in the home: outside the prefix, and a sibling whose key merely starts with the prefix.
    st.put("deep/outside.bin", b"not in the home");
    st.put("deep/home-sibling/y.bin", b"not in the home either");

    let m = st.mount(&["--validity-lag", "1s"]);
    let tree = walk(&m.mnt);
    let mut want: BTreeMap<PathBuf, Option<u64>> = ["a", "a/b", "a/b/c", "d", "d/e", "d/e/f", "big"]
        .into_iter()
        .map(|d| (PathBuf::from(d), None))
        .collect();
    for (rel, data) in &files {
        want.insert(PathBuf::from(rel), Some(data.len() as u64));
    }
    let got: BTreeMap<PathBuf, Option<u64>> = tree
        .iter()
        .map(|(p, md)| (p.clone(), if md.is_dir() { None } else { Some(md.len()) }))
        .collect();
    assert_eq!(got, want, "the mount's tree (None: a directory, Some: a file's size)");
    for (p, md) in &tree {
        assert!(
            md.is_dir() || md.is_file(),
            "{}: neither file nor directory",
            p.display()
        );
    }
    let listed = m.status();
    assert_eq!(
        (ops(&listed, "read"), num(&listed, "/home/bytes_read")),
        (0, 0),
        "listing and stat must not read file data"
    );

    for (rel, want) in &files {
        assert_same_bytes(&read(&m.path(rel)), want, &format!("cold read of {rel}"));
    }
    let cold = m.status();
    let total: u64 = files.values().map(|v| v.len() as u64).sum();
    assert!(ops(&cold, "read") > 0, "cold reads made no home read: {cold}");
    assert!(
        num(&cold, "/home/bytes_read") >= total,
        "cold reads of {total} bytes read only {} bytes from home",
        num(&cold, "/home/bytes_read")
    );

    // Warm: the kernel's page cache is dropped, so the daemon serves the reads from its cache.
    for (rel, want) in &files {
        assert_same_bytes(&read_uncached_ok(&m.path(rel)), want, &format!("warm read of {rel}"));
    }
    let warm = m.status();
    assert_eq!(
        (ops(&warm, "read"), num(&warm, "/home/bytes_read")),
        (ops(&cold, "read"), num(&cold, "/home/bytes_read")),
        "warm reads went to home: (read ops, bytes read) changed"
    );
    assert!(
        num(&warm, "/cache/hits") > num(&cold, "/cache/hits"),
        "warm reads did not hit the cache: hits {} -> {}",
        num(&cold, "/cache/hits"),
        num(&warm, "/cache/hits")
    );

    // After the validity lag the cached data is checked against the objects' ETags, not fetched again.
    std::thread::sleep(Duration::from_millis(1500));
    for (rel, want) in &files {
        assert_same_bytes(
            &read_uncached_ok(&m.path(rel)),
            want,
            &format!("warm read of {rel} after the lag"),
        );
    }
    let later = m.status();
    assert_eq!(
        ops(&later, "read"),
        ops(&cold, "read"),
        "unchanged objects were read again after the validity lag (revalidation must use the ETag): {}",
        later["home"]
    );
    m.unmount();
}

// b ------------------------------------------------------------------------------------------------------

#[test]
fn listing_10000_objects_costs_few_requests() {
    const N: usize = 10_000;
    const SIZE: usize = 37;
    let st = S3Test::new("list10k", "home");
    let t0 = Instant::now();
    st.tool_ok(&[
        "put-many",
        &st.bucket,
        &st.key("many"),
        &N.to_string(),
        &SIZE.to_string(),
    ]);
    eprintln!("put-many of {N} objects took {:?}", t0.elapsed());

    // Without metadata a listing is its pages alone (with it, a HEAD per object too: below).
    let m = st.mount(&["--s3-metadata", "off"]);
    let before = m.status();
    let http_before = st.srv.requests();
    let t1 = Instant::now();
    let mut entries: Vec<(String, u64, bool)> = Vec::new();
    let dir = std::fs::read_dir(m.path("many")).unwrap_or_else(|e| {
        panic!(
            "opendir of many/ failed after {:?}: {e}; meanwhile the server served {:?}",
            t1.elapsed(),
            st.srv.requests() - http_before
        )
    });
    for e in dir {
        let e = e.expect("dir entry");
        let md =
            std::fs::symlink_metadata(e.path()).unwrap_or_else(|err| panic!("lstat {}: {err}", e.path().display()));
        entries.push((e.file_name().to_string_lossy().into_owned(), md.len(), md.is_file()));
    }
    let took = t1.elapsed();
    let after = m.status();
    let http = st.srv.requests() - http_before;
    let lists = ops(&after, "list") - ops(&before, "list");
    let stats = ops(&after, "stat") - ops(&before, "stat");
    eprintln!("ls -l of {N} entries: {lists} list + {stats} stat home ops, HTTP requests {http:?}, in {took:?}");
    assert_eq!(entries.len(), N, "number of entries listed");
    entries.sort();
    for (i, (name, size, is_file)) in entries.iter().enumerate() {
        assert_eq!(name, &format!("f{i:05}"), "entry {i}");
        assert!(is_file, "{name} is not a regular file");
        assert_eq!(*size, SIZE as u64, "size of {name}");
    }
    assert!(
        lists + stats <= 20,
        "ls -l of {N} objects cost {lists} list and {stats} stat requests (want about N/1000 + a few, at \
         most 20): {}",
        after["home"]
    );
    assert!(
        http.list + http.head + http.get + http.other <= 20,
        "ls -l of {N} objects made {http:?} HTTP requests to the server (want about N/1000 + a few, at most 20)"
    );
    assert_eq!(ops(&after, "read"), 0, "listing read file data");
    assert_same_bytes(&read(&m.path("many/f04242")), &put_many_body(4242, SIZE), "many/f04242");
    m.unmount();

    // The same 10,000 objects at the root of a home: mounting (which checks the home answers) and
    // listing the root are as cheap.
    let (mnt2, cache2) = (st.t.root().join("mnt2"), st.t.root().join("cache2"));
    std::fs::create_dir(&mnt2).unwrap();
    let http_before = st.srv.requests();
    let t2 = Instant::now();
    let m = st.mount_url_at(
        &format!("s3://{}/{}", st.bucket, st.key("many")),
        &mnt2,
        &cache2,
        &["--home-timeout", "20s", "--s3-metadata", "off"],
    );
    let mounting = st.srv.requests() - http_before;
    eprintln!(
        "mounting a home of {N} objects took {:?} and {mounting:?}",
        t2.elapsed()
    );
    let listed = names(&m.mnt);
    let http = st.srv.requests() - http_before;
    assert_eq!(listed.len(), N, "entries at the root of a home of {N} objects");
    assert!(
        http.list + http.head + http.get + http.other <= 20,
        "mounting and listing a home of {N} objects at its root made {http:?} HTTP requests (at most 20)"
    );
    m.unmount();
}

// c ------------------------------------------------------------------------------------------------------

/// A 1 MiB rewrite inside a 40 MiB object (five 8 MiB parts) sends that part only: the four parts nothing
/// changed are copied at the server from the object as it was (UploadPartCopy), so the push reads at most
/// the changed part's other bytes, not the whole object, and home ends with the new bytes in the old.
#[test]
fn a_small_rewrite_of_a_large_object_copies_the_unchanged_parts_at_the_server() {
    const SIZE: usize = 40 << 20;
    let st = S3Test::new("partcopy", "home");
    let mut want = Rng::new(91).bytes(SIZE);
    st.put(&st.key("big.bin"), &want);
    let m = st.mount(&["--validity-lag", "1h", "--sync-lag", "1h"]);
    let change = Rng::new(92).bytes(1 << 20);
    let at = 17 << 20;
    // Counted from before the write (a block written whole is not read first).
    let before = st.srv.requests();
    {
        let f = OpenOptions::new().write(true).open(m.path("big.bin")).unwrap();
        f.write_all_at(&change, at as u64).unwrap();
        f.sync_all().unwrap();
    }
    want[at..at + change.len()].copy_from_slice(&change);
    drain_ok(&m, 120);
    let http = st.srv.requests() - before;
    eprintln!("a 1 MiB rewrite of a {} MiB object pushed with {http:?}", SIZE >> 20);
    assert_same_bytes(&st.get(&st.key("big.bin")), &want, "the object after the push");
    assert!(
        http.get <= 2,
        "the push read {} times from the object (the changed part's other bytes: at most 2; every \
         unchanged part read back and uploaded again is 4 more): {http:?}",
        http.get
    );
    // What crossed the link each way, and what the server copied, as `larder status` reports them.
    let status = m.status();
    let rewrites = &status["home"]["rewrites"];
    eprintln!("larder status: home.rewrites {rewrites}");
    let (sent, received, copied) = (
        num(&status, "/home/rewrites/sent"),
        num(&status, "/home/rewrites/received"),
        num(&status, "/home/rewrites/copied"),
    );
    assert_eq!(sent, 8 << 20, "one 8 MiB part uploaded: {rewrites}");
    assert_eq!(received, 7 << 20, "that part's 7 MiB nothing changed, read: {rewrites}");
    assert_eq!(copied, 32 << 20, "four parts copied at the server: {rewrites}");
    m.unmount();
}

/// A sequential cold read of a large object comes in large ranged GETs, several at once, not one GET per
/// block: 48 MiB read in 128 KiB pieces from a cold cache costs a few GETs per 8 MiB once the reader's
/// window has grown (a handful more while it grows), and the bytes are the object's.
#[test]
fn a_sequential_cold_read_comes_in_large_ranged_gets() {
    const SIZE: usize = 48 << 20;
    let st = S3Test::new("bigreads", "home");
    let data = Rng::new(77).bytes(SIZE);
    st.put(&st.key("big.bin"), &data);
    let m = st.mount(&["--validity-lag", "1h"]);
    // Listed first, so that only the reads below are counted.
    assert_eq!(std::fs::metadata(m.path("big.bin")).unwrap().len(), SIZE as u64);
    let before = st.srv.requests();
    let mut f = File::open(m.path("big.bin")).unwrap();
    let mut got = Vec::with_capacity(SIZE);
    let mut buf = vec![0u8; 128 << 10];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let http = st.srv.requests() - before;
    drop(f);
    eprintln!("a cold sequential read of {} MiB: {http:?}", SIZE >> 20);
    assert_same_bytes(&got, &data, "the object read through the mount");
    assert!(
        http.get <= 16,
        "a cold sequential read of {} MiB made {} GETs (at most 16: large ranges, not a GET per 1 MiB block)",
        SIZE >> 20,
        http.get
    );
    m.unmount();
}

/// Past the validity lag, what a listing shows revalidates what the cache knows: an object whose ETag and
/// time in the listing are those its last HEAD saw keeps the attributes its metadata gave, and only an
/// object changed since is asked again. `ls -l` of 1,000 unchanged objects in 10 directories again after
/// the lag costs a listing per directory and a few requests more, not a HEAD per object.
#[test]
fn revalidating_unchanged_objects_costs_a_listing_per_directory() {
    const DIRS: usize = 10;
    const PER: usize = 100;
    let st = S3Test::new("revalidate", "home");
    for d in 0..DIRS {
        st.tool_ok(&[
            "put-many",
            &st.bucket,
            &st.key(&format!("d{d}")),
            &PER.to_string(),
            "37",
        ]);
    }
    let m = st.mount(&["--validity-lag", "1s"]);
    let walk = |what: &str| {
        let mut sizes = BTreeMap::new();
        for d in 0..DIRS {
            for e in std::fs::read_dir(m.path(&format!("d{d}"))).unwrap_or_else(|e| panic!("{what}: d{d}: {e}")) {
                let e = e.unwrap();
                let md = std::fs::symlink_metadata(e.path()).unwrap_or_else(|err| panic!("{what}: lstat: {err}"));
                sizes.insert(format!("d{d}/{}", e.file_name().to_string_lossy()), md.len());
            }
        }
        sizes
    };
    let first = walk("first ls -l");
    assert_eq!(first.len(), DIRS * PER, "objects listed");
    std::thread::sleep(Duration::from_millis(1500));
    let before = st.srv.requests();
    let again = walk("ls -l past the lag");
    let http = st.srv.requests() - before;
    eprintln!(
        "ls -l of {} objects in {DIRS} directories past the lag: {http:?}",
        DIRS * PER
    );
    assert_eq!(again, first, "what ls -l shows past the lag");
    let total = http.list + http.head + http.get + http.other;
    assert!(
        total <= 30,
        "revalidating {} unchanged objects in {DIRS} directories made {http:?} requests (at most 30)",
        DIRS * PER
    );
    assert!(http.list >= DIRS, "each directory listed again past the lag: {http:?}");

    // One object changed at home: its listing shows a new ETag, and it alone is asked again.
    st.put(&st.key("d3/f00007"), b"changed at home");
    std::thread::sleep(Duration::from_millis(1500));
    let before = st.srv.requests();
    let after_change = walk("ls -l after a change at home");
    let http = st.srv.requests() - before;
    eprintln!("ls -l past the lag after one change at home: {http:?}");
    assert_eq!(
        after_change["d3/f00007"],
        b"changed at home".len() as u64,
        "the changed object's size"
    );
    assert_eq!(
        read(&m.path("d3/f00007")),
        b"changed at home",
        "the changed object's bytes"
    );
    let total = http.list + http.head + http.get + http.other;
    assert!(total <= 32, "one changed object among {} cost {http:?}", DIRS * PER);
    m.unmount();
}

#[test]
fn replaced_object_seen_after_lag_never_mixed() {
    let lag = Duration::from_secs(2);
    let st = S3Test::new("replace", "home");
    let mut rng = Rng::new(103);
    // Two versions of equal size that differ in every byte, over several 1 MiB blocks.
    let v1 = rng.bytes((3 << 20) + 12_345);
    let v2: Vec<u8> = v1.iter().map(|b| !b).collect();
    // mid.bin and late.bin: 8 MiB, replaced while a reader is in their middle.
    let w1 = rng.bytes(8 << 20);
    let w2: Vec<u8> = w1.iter().map(|b| !b).collect();
    let v1_dir = st.t.root().join("v1");
    let v2_dir = st.t.root().join("v2");
    for (dir, v, w) in [(&v1_dir, &v1, &w1), (&v2_dir, &v2, &w2)] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("part.bin"), v).unwrap();
        std::fs::write(dir.join("poll.bin"), v).unwrap();
        std::fs::write(dir.join("mid.bin"), w).unwrap();
        std::fs::write(dir.join("late.bin"), w).unwrap();
    }
    st.tool_ok(&["put-dir", &st.bucket, &st.key("r"), s(&v1_dir)]);
    // Objects for the within-the-lag check: one per try (a busy machine may miss the window).
    const TRIES: usize = 3;
    for i in 0..TRIES {
        std::fs::create_dir_all(v1_dir.join(format!("w{i}"))).unwrap();
        std::fs::write(v1_dir.join(format!("w{i}/whole.bin")), &v1).unwrap();
    }
    let v2_file = v2_dir.join("whole.bin");
    std::fs::write(&v2_file, &v2).unwrap();
    for i in 0..TRIES {
        st.tool_ok(&[
            "put-dir",
            &st.bucket,
            &st.key(&format!("w{i}")),
            s(&v1_dir.join(format!("w{i}"))),
        ]);
    }
    let etag1 = st.tool_ok(&["etag", &st.bucket, &st.key("r/poll.bin")]);

    // A small readahead, so most of mid.bin is fetched after the change.
    let m = st.mount(&["--validity-lag", "2s", "--readahead", "1MiB"]);
    // part.bin: only its first 64 KiB are read (and so cached) before the change.
    {
        let f = File::open(m.path("r/part.bin")).unwrap();
        let mut head = vec![0u8; 65_536];
        f.read_exact_at(&mut head, 0).unwrap();
        assert_same_bytes(&head, &v1[..65_536], "the head of part.bin");
    }
    assert_same_bytes(&read(&m.path("r/poll.bin")), &v1, "first read of poll.bin");
    let mut mid = File::open(m.path("r/mid.bin")).unwrap();
    let mut mid_got = vec![0u8; 1 << 20];
    mid.read_exact(&mut mid_got).unwrap();
    assert_same_bytes(&mid_got, &w1[..1 << 20], "the first MiB of mid.bin");
    let mut late = File::open(m.path("r/late.bin")).unwrap();
    let mut late_got = vec![0u8; 1 << 20];
    late.read_exact(&mut late_got).unwrap();
    assert_same_bytes(&late_got, &w1[..1 << 20], "the first MiB of late.bin");

    // Replace the three behind larder's back, in one s3tool call.
    st.tool_ok(&["put-dir", &st.bucket, &st.key("r"), s(&v2_dir)]);
    let changed = Instant::now();
    let etag2 = st.tool_ok(&["etag", &st.bucket, &st.key("r/poll.bin")]);
    assert_ne!(etag1, etag2, "the replaced object has a new ETag");

    // The reader of mid.bin goes on at once: it may fail, but what it got is the old version only.
    read_on_old_version(mid, mid_got, &w1, "mid.bin, read on right after the change");
    // part.bin: its tail is not cached, and the object changed. Any whole version or an error is fine;
    // a mix is not.
    match read_uncached(&m.path("r/part.bin")) {
        Ok(got) => {
            let v = which_version(&got, &v1, &v2, "part.bin (partly cached)");
            eprintln!("part.bin {:?} after the change: version {v}", changed.elapsed());
        }
        Err(e) => eprintln!("part.bin {:?} after the change: error {e}", changed.elapsed()),
    }

    // Poll poll.bin across the end of the lag: always one whole version, never old after new, and the
    // new one once the lag (and a second of slack) is over.
    let mut seen: Vec<(Duration, u8)> = Vec::new();
    let end = changed + lag + Duration::from_secs(3);
    while Instant::now() < end {
        let started = Instant::now();
        let got = read_uncached_ok(&m.path("r/poll.bin"));
        let v = which_version(&got, &v1, &v2, "poll.bin");
        let at = started - changed;
        if let Some((prev_at, 2)) = seen.iter().rev().find(|(_, v)| *v == 2) {
            assert_eq!(
                v, 2,
                "poll.bin went back to the old version at {at:?} after the new one at {prev_at:?}"
            );
        }
        if started > changed + lag + Duration::from_secs(1) {
            assert_eq!(
                v, 2,
                "poll.bin is still the old version {at:?} after the change (lag {lag:?}): {seen:?}"
            );
        }
        seen.push((at, v));
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("poll.bin versions by time after the change: {seen:?}");
    // The reader of late.bin goes on after the lag: its descriptor still reads the version it started
    // on (or fails), never the new one from the middle on.
    read_on_old_version(late, late_got, &w1, "late.bin, read on after the lag");
    let got = read_uncached_ok(&m.path("r/part.bin"));
    which_version(&got, &v1, &v2, "part.bin after the lag");
    assert_same_bytes(&got, &v2, "part.bin after the lag");
    assert_same_bytes(&read_uncached_ok(&m.path("r/mid.bin")), &w2, "mid.bin after the lag");

    // Within the lag, a wholly cached file is the old version: read it (larder validates it), replace it,
    // read it again before the lag has passed since the first read. A try whose replacement took too long
    // (a busy machine) proves nothing and is made again on another object.
    let mut checked = false;
    for i in 0..TRIES {
        let rel = format!("w{i}/whole.bin");
        let first_look = Instant::now();
        assert_same_bytes(&read(&m.path(&rel)), &v1, &format!("first read of {rel}"));
        st.tool_ok(&["put", &st.bucket, &st.key(&rel), s(&v2_file)]);
        let within = Instant::now();
        let got = read_uncached_ok(&m.path(&rel));
        let done = Instant::now();
        let v = which_version(&got, &v1, &v2, &format!("{rel} within the lag"));
        if done > first_look + lag - Duration::from_millis(200) {
            eprintln!(
                "{rel}: the within-lag read ended {:?} after the first look (lag {lag:?}): too late, trying again",
                done - first_look
            );
            continue;
        }
        assert_eq!(
            v,
            1,
            "{rel} read {:?} after its first look (within the {lag:?} lag) is not the old version",
            within - first_look
        );
        std::thread::sleep((within + lag + Duration::from_secs(1)).saturating_duration_since(Instant::now()));
        assert_same_bytes(&read_uncached_ok(&m.path(&rel)), &v2, &format!("{rel} after the lag"));
        checked = true;
        break;
    }
    assert!(
        checked,
        "the machine is too slow for this test: in {TRIES} tries, replacing an object took longer than the lag"
    );
    m.unmount();
}

// d ------------------------------------------------------------------------------------------------------

#[test]
fn big_file_written_through_mount_reaches_object() {
    let st = S3Test::new("bigwrite", "home");
    let mut rng = Rng::new(104);
    let local = st.t.root().join("local-64mib.bin");
    let mut model = rng.bytes(64 << 20);
    std::fs::write(&local, &model).unwrap();
    let m = st.mount(&[]);

    let t0 = Instant::now();
    let out = run_cmd("cp", &[s(&local), s(&m.path("big.bin"))], Duration::from_secs(300));
    assert!(out.success(), "cp of 64 MiB into the mount failed:\n{out}");
    eprintln!("cp of 64 MiB took {:?}", t0.elapsed());
    // Write-through: once cp has closed the file, the object is there.
    assert_same_bytes(&st.get(&st.key("big.bin")), &model, "the object after cp");

    // A 4 KiB write in the middle, without truncation.
    let off = (32 << 20) + 3 * 4096 + 123;
    let patch = rng.bytes(4096);
    let f = OpenOptions::new().write(true).open(m.path("big.bin")).unwrap();
    f.write_all_at(&patch, off as u64).unwrap();
    close_checked(f, "big.bin after a 4 KiB pwrite");
    model[off..off + 4096].copy_from_slice(&patch);
    let objs = st.objects();
    assert_eq!(
        objs.get("big.bin"),
        Some(&(64 << 20)),
        "the object's size after the pwrite: {objs:?}"
    );
    assert_same_bytes(&st.get(&st.key("big.bin")), &model, "the object after a 4 KiB pwrite");
    assert_same_bytes(
        &read_uncached_ok(&m.path("big.bin")),
        &model,
        "big.bin through the mount",
    );
    assert_eq!(objs.len(), 1, "only big.bin is stored: {objs:?}");
    m.unmount();
}

// e ------------------------------------------------------------------------------------------------------

#[test]
fn directory_rename_moves_every_object() {
    let st = S3Test::new("rename", "home");
    let mut rng = Rng::new(105);
    let src = st.t.root().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 0..100 {
        let name = format!("file-{i:03}.bin");
        let data = rng.bytes_between(0, 20_000);
        std::fs::write(src.join(&name), &data).unwrap();
        files.insert(name, data);
    }
    st.tool_ok(&["put-dir", &st.bucket, &st.key("old"), s(&src)]);
    let m = st.mount(&[]);
    let want_names: Vec<String> = files.keys().cloned().collect();
    assert_eq!(names(&m.path("old")), want_names, "old/ through the mount");

    let (from, to) = (m.path("old"), m.path("new"));
    with_deadline(
        Duration::from_secs(120),
        "rename of a directory of 100 files",
        move || std::fs::rename(&from, &to),
    )
    .unwrap_or_else(|e| panic!("rename old -> new failed: {e}"));

    assert_eq!(names(&m.path("new")), want_names, "new/ through the mount");
    let e = std::fs::symlink_metadata(m.path("old")).expect_err("old/ is gone after the rename");
    assert_eq!(errno(&e), libc::ENOENT, "old/ after the rename: {e}");

    let objs = st.objects();
    let stale: Vec<&String> = objs.keys().filter(|k| k.starts_with("old")).collect();
    assert!(stale.is_empty(), "objects remain under the old prefix: {stale:?}");
    let moved: BTreeMap<String, u64> = objs
        .iter()
        .filter_map(|(k, size)| Some((k.strip_prefix("new/")?.to_string(), *size)))
        .filter(|(k, _)| !k.is_empty()) // a directory marker new/ may exist
        .collect();
    let want_sizes: BTreeMap<String, u64> = files.iter().map(|(k, v)| (k.clone(), v.len() as u64)).collect();
    assert_eq!(moved, want_sizes, "objects under the new prefix (name -> size)");
    assert_eq!(
        objs.len() - moved.len(),
        objs.contains_key("new/") as usize,
        "other objects: {objs:?}"
    );

    let dest = st.t.root().join("fetched");
    st.tool_ok(&["get-dir", &st.bucket, &st.key("new"), s(&dest)]);
    for (name, data) in &files {
        assert_same_bytes(&read(&dest.join(name)), data, &format!("object new/{name}"));
    }
    for name in ["file-000.bin", "file-050.bin", "file-099.bin"] {
        assert_same_bytes(
            &read(&m.path(&format!("new/{name}"))),
            &files[name],
            &format!("new/{name} in the mount"),
        );
    }
    m.unmount();
}

/// S3 renames a directory by copying every object, then deleting the sources: a listing of the directory
/// while its rename lands finds only part of it at either prefix, and a directory below it may be there
/// without its own object (the one carrying its mode). Listed and stat'ed again and again meanwhile
/// (validity lag 0: every call asks home), the directory must show every entry every time, and the one
/// below it its mode, and after the drain too: none may be taken for gone at home.
#[test]
fn a_directory_listed_while_its_rename_lands_keeps_every_entry() {
    let st = S3Test::new("rename-listed", "home");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "0s", "--validity-lag", "0s"]);
    let mut want: Vec<String> = (0..150).map(|i| format!("f{i:03}")).collect();
    std::fs::create_dir(m.path("old")).unwrap();
    for name in &want {
        std::fs::write(m.path(&format!("old/{name}")), name.as_bytes()).unwrap();
    }
    std::fs::create_dir(m.path("old/sub")).unwrap();
    std::fs::set_permissions(m.path("old/sub"), std::fs::Permissions::from_mode(0o750)).unwrap();
    for i in 0..20 {
        std::fs::write(m.path(&format!("old/sub/g{i:02}")), b"g").unwrap();
    }
    want.push("sub".into());
    drain_ok(&m, 120);
    assert_eq!(names(&m.path("old")), want, "old/ through the mount");
    std::fs::rename(m.path("old"), m.path("new")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut listings = 0;
    loop {
        let landed = num(&m.status(), "/journal/pending_ops") == 0;
        assert_eq!(
            names(&m.path("new")),
            want,
            "new/ listed while its rename lands (listing {listings})"
        );
        let mode = std::fs::metadata(m.path("new/sub")).unwrap().permissions().mode() & 0o7777;
        assert_eq!(
            mode, 0o750,
            "new/sub's mode while its rename lands (listing {listings})"
        );
        listings += 1;
        if landed {
            break;
        }
        assert!(Instant::now() < deadline, "the rename never landed");
    }
    let moved: Vec<String> = st
        .objects()
        .keys()
        .filter_map(|k| k.strip_prefix("new/"))
        .filter(|n| !n.is_empty() && !n.starts_with("sub"))
        .map(str::to_string)
        .collect();
    assert_eq!(moved, want[..150], "objects under the new prefix");
    assert_eq!(names(&m.path("new")), want, "new/ once the rename landed");
    let mode = std::fs::metadata(m.path("new/sub")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750, "new/sub's mode once the rename landed");
    m.unmount();
}

/// Write 9 MiB to `file`, push it, call `pushed`, rename `from` to `to` (the file or a directory above
/// it), append to the file at its new place `moved` and push again: no conflict, nothing beside it, home
/// has every byte. Returns the file's bytes.
#[allow(clippy::too_many_arguments)]
fn written_renamed_appended(
    st: &S3Test,
    m: &Mount,
    seed: u64,
    file: &str,
    (from, to): (&str, &str),
    moved: &str,
    move_lands_first: bool,
    pushed: impl Fn(),
) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut want = rng.bytes(9 << 20);
    std::fs::write(m.path(file), &want).unwrap();
    drain_ok(m, 120);
    pushed();
    std::fs::rename(m.path(from), m.path(to)).unwrap();
    if move_lands_first {
        // The move reaches home while the file has no change queued.
        drain_ok(m, 120);
    }
    let more = rng.bytes(50_000);
    OpenOptions::new()
        .append(true)
        .open(m.path(moved))
        .unwrap()
        .write_all(&more)
        .unwrap();
    want.extend_from_slice(&more);
    drain_ok(m, 120);
    let st_json = m.status();
    assert_eq!(num(&st_json, "/journal/conflicts"), 0, "{}", st_json["journal"]);
    let (dir, name) = moved.rsplit_once('/').unwrap_or(("", moved));
    assert_eq!(names(&m.path(dir)), [name], "nothing set aside beside it");
    assert_same_bytes(&st.get(&st.key(moved)), &want, "the object after the append");
    want
}

/// An object uploaded in parts (over 8 MiB) gets a new ETag when S3 copies it, and a rename is a copy: a
/// file renamed, then written again, is pushed on the renamed object's version, not refused as a
/// conflict with itself.
#[test]
fn a_large_file_renamed_then_appended_to_is_no_conflict() {
    let st = S3Test::new("rename-append", "home");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    let want = written_renamed_appended(&st, &m, 77, "big", ("big", "moved"), "moved", false, || {});
    // Renamed once more and read back from home (its cached blocks dropped): at the version home has
    // now, not the one the copy replaced.
    std::fs::rename(m.path("moved"), m.path("again")).unwrap();
    drain_ok(&m, 120);
    let out = larder(&["evict", s(&m.path("again"))]);
    assert!(out.success(), "larder evict failed:\n{out}");
    assert_same_bytes(&read(&m.path("again")), &want, "the file read back from home");
    m.unmount();
}

/// The same for a file in a directory that is renamed: the move copies every object below it, and the
/// file's next push must be based on its copy's version.
#[test]
fn a_large_file_in_a_renamed_directory_then_appended_to_is_no_conflict() {
    let st = S3Test::new("dir-rename-append", "home");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    std::fs::create_dir(m.path("d")).unwrap();
    written_renamed_appended(&st, &m, 78, "d/big", ("d", "e"), "e/big", false, || {});
    m.unmount();
}

/// The same when the move reached home before the append was made: every file below the moved directory
/// takes its copy's version, not only those with changes queued when the move lands.
#[test]
fn a_large_file_appended_to_after_its_directorys_move_landed_is_no_conflict() {
    let st = S3Test::new("dir-rename-landed-append", "home");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    std::fs::create_dir(m.path("d")).unwrap();
    written_renamed_appended(&st, &m, 79, "d/big", ("d", "e"), "e/big", true, || {});
    m.unmount();
}

/// The same for a file that left the daemon's memory before the move (the kernel forgot it): it is loaded
/// from the index and takes its copy's version too.
#[test]
fn a_large_file_out_of_memory_appended_to_after_its_directorys_move_landed_is_no_conflict() {
    let st = S3Test::new("dir-rename-landed-append-forgotten", "home");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    std::fs::create_dir(m.path("d")).unwrap();
    written_renamed_appended(&st, &m, 80, "d/big", ("d", "e"), "e/big", true, || {
        let before = num(&m.status(), "/fs/inodes_reclaimed");
        // The kernel forgets every inode it can; the daemon lets the forgotten ones go.
        std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || num(&m.status(), "/fs/inodes_reclaimed")
                > before),
            "no inode left the daemon's memory: {}",
            m.status()["fs"]
        );
    });
    m.unmount();
}

// f ------------------------------------------------------------------------------------------------------

#[test]
fn names_s3_cannot_store_are_refused() {
    let st = S3Test::new("longnames", "home");
    let m = st.mount(&[]);
    // Four directories of 200 bytes: the key of a file in the last one starts with 5 + 4 * 201 = 809
    // bytes ("home/" and "X…X/" four times).
    let dirs: Vec<String> = ["a", "b", "c", "d"].iter().map(|c| c.repeat(200)).collect();
    let rel_dir = dirs.join("/");
    std::fs::create_dir_all(m.path(&rel_dir)).unwrap_or_else(|e| panic!("mkdir of 4 levels of 200-byte names: {e}"));
    let dir_key_len = st.key(&rel_dir).len() + 1;
    assert_eq!(dir_key_len, 809);
    let src = format!("{rel_dir}/src.txt");
    create_with(&m.path(&src), b"src");

    // 1025 bytes and more: refused, and nothing is created.
    let refused_ok = |what: &str, r: std::io::Result<()>| match r {
        Ok(()) => panic!("{what} succeeded; want ENAMETOOLONG or EINVAL"),
        Err(e) => assert!(
            [libc::ENAMETOOLONG, libc::EINVAL].contains(&errno(&e)),
            "{what}: want ENAMETOOLONG or EINVAL, got {e}"
        ),
    };
    let long_path = m.path(&format!("{rel_dir}/{}", "g".repeat(1025 - dir_key_len)));
    refused_ok(
        "creating a file with a 1025-byte key",
        File::create(&long_path).map(drop),
    );
    let longer_path = m.path(&format!("{rel_dir}/{}", "h".repeat(250)));
    refused_ok(
        "creating a file with a 1059-byte key",
        File::create(&longer_path).map(drop),
    );
    refused_ok("mkdir with a 1060-byte marker key", std::fs::create_dir(&longer_path));
    let dir_1025 = m.path(&format!("{rel_dir}/{}", "j".repeat(1025 - dir_key_len - 1)));
    refused_ok("mkdir with a 1025-byte marker key", std::fs::create_dir(&dir_1025));
    refused_ok(
        "renaming a file to a 1025-byte key",
        std::fs::rename(m.path(&src), &long_path),
    );
    let moved_dir = m.path(&format!("{rel_dir}/{}", "i".repeat(250)));
    std::fs::create_dir(m.path("short")).unwrap();
    create_with(&m.path("short/x"), b"x");
    refused_ok(
        "renaming a directory so that its file's key is too long",
        std::fs::rename(m.path("short"), &moved_dir),
    );
    for p in [&long_path, &longer_path, &moved_dir, &dir_1025] {
        let e = std::fs::symlink_metadata(p).expect_err("a refused name does not exist");
        assert!(
            [libc::ENOENT, libc::ENAMETOOLONG, libc::EINVAL].contains(&errno(&e)),
            "lstat of a refused name: {e}"
        );
    }
    assert_same_bytes(&read(&m.path(&src)), b"src", "the file a refused rename left");
    assert_same_bytes(&read(&m.path("short/x")), b"x", "short/x after a refused rename");

    let objs = st.objects();
    let too_long: Vec<usize> = objs
        .keys()
        .map(|k| st.prefix.len() + 1 + k.len())
        .filter(|n| *n > 1024)
        .collect();
    assert!(
        too_long.is_empty(),
        "objects with keys longer than 1024 bytes: lengths {too_long:?}"
    );
    let files: Vec<&str> = objs.keys().filter(|k| !k.ends_with('/')).map(String::as_str).collect();
    let mut want = vec![src.as_str(), "short/x"];
    want.sort();
    assert_eq!(files, want, "the file objects after the refusals");

    // Exactly 1024 bytes of key: S3 stores them, so they are allowed (a file, and a directory's marker).
    let fits = format!("{rel_dir}/{}", "f".repeat(1024 - dir_key_len));
    assert_eq!(st.key(&fits).len(), 1024);
    let r = File::create(m.path(&fits)).map(drop);
    assert!(
        r.is_ok(),
        "creating a file whose key is exactly 1024 bytes failed: {r:?}"
    );
    create_with(&m.path(&fits), b"fits");
    assert_eq!(st.get(&st.key(&fits)), b"fits", "the object of a 1024-byte key");
    let fits_dir = format!("{rel_dir}/{}", "k".repeat(1024 - dir_key_len - 1));
    assert_eq!(st.key(&fits_dir).len() + 1, 1024);
    let r = std::fs::create_dir(m.path(&fits_dir));
    assert!(
        r.is_ok(),
        "mkdir of a directory whose marker key is exactly 1024 bytes failed: {r:?}"
    );
    assert_eq!(
        st.objects().get(&format!("{fits_dir}/")),
        Some(&0),
        "the 1024-byte marker"
    );
    m.unmount();
}

// g ------------------------------------------------------------------------------------------------------

#[test]
fn short_outage_mid_read_is_retried() {
    const SIZE: usize = 32 << 20;
    const CHUNK: usize = 128 << 10;
    let st = S3Test::new("outage", "home");
    let mut rng = Rng::new(107);
    let data = Arc::new(rng.bytes(SIZE));
    st.put(&st.key("slow.bin"), &data);
    let m = st.mount(&["--home-timeout", "10s", "--readahead", "1MiB"]);
    let p = m.path("slow.bin");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), SIZE as u64);

    // A slow reader: 128 KiB at a time with a pause, so 32 MiB take at least 256 * 20 ms.
    let progress = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let progress = progress.clone();
        std::thread::spawn(move || {
            let r = (|| -> std::io::Result<Vec<u8>> {
                let mut f = File::open(&p)?;
                let mut v = Vec::with_capacity(SIZE);
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        return Ok(v);
                    }
                    v.extend_from_slice(&buf[..n]);
                    progress.store(v.len() as u64, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })();
            let _ = tx.send(r);
        });
    }
    assert!(
        wait_until(Duration::from_secs(60), || progress.load(Ordering::SeqCst) >= 8 << 20),
        "the reader did not get 8 MiB within 60 s (at {} bytes)",
        progress.load(Ordering::SeqCst)
    );
    st.srv.stop_process();
    let at_stop = progress.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(2));
    let at_cont = progress.load(Ordering::SeqCst);
    st.srv.continue_process();
    eprintln!("moto stopped for 2 s with the reader at {at_stop} bytes; it was at {at_cont} on SIGCONT");
    assert!(
        (at_cont as usize) < SIZE - (2 << 20),
        "the read was (almost) done before the server came back ({at_cont} of {SIZE} bytes): the outage did not \
         hit it, so this test proves nothing"
    );
    let got = match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!(
            "the read across a 2 s outage failed after {} bytes: {e}",
            progress.load(Ordering::SeqCst)
        ),
        Err(_) => panic!(
            "the read across a 2 s outage did not finish within 90 s (at {} bytes)",
            progress.load(Ordering::SeqCst)
        ),
    };
    assert_same_bytes(&got, &data, "slow.bin read across the outage");
    m.unmount();
}

// h ------------------------------------------------------------------------------------------------------

/// Read `path` on a thread; fail the test if it takes longer than `deadline`. Returns the result and
/// how long it took.
fn timed_read(path: PathBuf, deadline: Duration, what: &str) -> (std::io::Result<Vec<u8>>, Duration) {
    let t0 = Instant::now();
    let r = with_deadline(deadline, what, move || std::fs::read(&path));
    (r, t0.elapsed())
}

/// `larder status --json` must answer within 10 s.
fn status_answers(m: &Mount) -> serde_json::Value {
    let out = run_cmd(LARDER, &["status", s(&m.mnt), "--json"], Duration::from_secs(10));
    assert!(out.success(), "larder status failed while the server is away:\n{out}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("status is not JSON ({e}):\n{}", out.stdout))
}

#[test]
fn stopped_server_gives_eio_within_home_timeout() {
    let timeout = Duration::from_secs(5);
    let st = S3Test::new("stopped", "home");
    let mut rng = Rng::new(108);
    let a = rng.bytes(1 << 20);
    let b = rng.bytes(1 << 20);
    st.put(&st.key("a.bin"), &a);
    st.put(&st.key("b.bin"), &b);
    let m = st.mount(&["--home-timeout", "5s", "--validity-lag", "60s"]);
    assert_eq!(names(&m.mnt), ["a.bin", "b.bin"]);

    st.srv.stop_process();
    expect_eio_and_unreachable(&m, "a.bin", timeout, "reading a.bin while moto is stopped");

    st.srv.continue_process();
    wait_online(&m, 30, "after moto resumed");
    let (r, _) = timed_read(
        m.path("b.bin"),
        Duration::from_secs(30),
        "reading b.bin after moto resumed",
    );
    assert_same_bytes(
        &r.expect("b.bin once the server answers again"),
        &b,
        "b.bin after the outage",
    );
    let (r, _) = timed_read(
        m.path("a.bin"),
        Duration::from_secs(30),
        "reading a.bin after moto resumed",
    );
    assert_same_bytes(
        &r.expect("a.bin once the server answers again"),
        &a,
        "a.bin after the outage",
    );
    assert_eq!(m.status()["home"]["state"], "online");
    m.unmount();
}

#[test]
fn server_gone_gives_eio_and_status_answers() {
    let timeout = Duration::from_secs(5);
    let st = S3Test::new("gone", "home");
    let mut rng = Rng::new(109);
    let a = rng.bytes(1 << 20);
    let c = rng.bytes(100_000);
    st.put(&st.key("a.bin"), &a);
    st.put(&st.key("c.bin"), &c);
    let m = st.mount(&["--home-timeout", "5s"]);
    assert_eq!(names(&m.mnt), ["a.bin", "c.bin"]);
    assert_same_bytes(&read(&m.path("c.bin")), &c, "c.bin before the server goes");

    st.srv.kill();
    expect_eio_and_unreachable(&m, "a.bin", timeout, "reading a.bin with moto gone");
    // Cached data is still served (the validity lag has not run out).
    let (r, _) = timed_read(
        m.path("c.bin"),
        Duration::from_secs(20),
        "reading cached c.bin with moto gone",
    );
    assert_same_bytes(
        &r.expect("cached c.bin with the server gone"),
        &c,
        "cached c.bin with the server gone",
    );
    m.unmount();
}

// i ------------------------------------------------------------------------------------------------------

#[test]
fn changes_through_mount_reach_s3() {
    let st = S3Test::new("changes", "home");
    let mut rng = Rng::new(110);
    let m = st.mount(&[]);
    let objs = |want: &[(&str, u64)], what: &str| {
        let want: BTreeMap<String, u64> = want.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        assert_eq!(st.objects(), want, "objects under the prefix {what}");
    };

    // create + write, then append: the object follows each close.
    create_with(&m.path("new.txt"), b"hello s3\n");
    assert_eq!(st.get(&st.key("new.txt")), b"hello s3\n", "new.txt after create");
    let mut f = OpenOptions::new().append(true).open(m.path("new.txt")).unwrap();
    f.write_all(b"more\n").unwrap();
    close_checked(f, "new.txt after append");
    assert_eq!(st.get(&st.key("new.txt")), b"hello s3\nmore\n", "new.txt after append");

    // An empty file is an empty object; an empty directory a marker.
    create_with(&m.path("empty.txt"), b"");
    std::fs::create_dir(m.path("emptydir")).unwrap();
    std::fs::create_dir_all(m.path("m1/m2")).unwrap();
    let fbin = rng.bytes(10_000);
    create_with(&m.path("m1/m2/f.bin"), &fbin);
    let all = st.objects();
    assert_eq!(all.get("new.txt"), Some(&14), "{all:?}");
    assert_eq!(all.get("empty.txt"), Some(&0), "empty.txt is an empty object: {all:?}");
    assert_eq!(
        all.get("emptydir/"),
        Some(&0),
        "an empty directory is a zero-byte marker: {all:?}"
    );
    assert_eq!(all.get("m1/m2/f.bin"), Some(&10_000), "{all:?}");
    let extra: Vec<&String> = all
        .keys()
        .filter(|k| !["new.txt", "empty.txt", "emptydir/", "m1/m2/f.bin", "m1/", "m1/m2/"].contains(&k.as_str()))
        .collect();
    assert!(extra.is_empty(), "unexpected objects: {extra:?} in {all:?}");
    assert_same_bytes(&st.get(&st.key("m1/m2/f.bin")), &fbin, "the object m1/m2/f.bin");

    // A second mount with a cache of its own sees it all from S3.
    {
        let m2 = st.mount_fresh(2, &[]);
        assert_eq!(
            names(&m2.mnt),
            ["empty.txt", "emptydir", "m1", "new.txt"],
            "root of a second mount"
        );
        assert!(
            std::fs::metadata(m2.path("emptydir")).unwrap().is_dir(),
            "emptydir is a directory"
        );
        assert!(names(&m2.path("emptydir")).is_empty(), "emptydir is empty");
        assert_eq!(names(&m2.path("m1/m2")), ["f.bin"]);
        assert_same_bytes(&read(&m2.path("m1/m2/f.bin")), &fbin, "m1/m2/f.bin in a second mount");
        assert_eq!(read(&m2.path("new.txt")), b"hello s3\nmore\n");
        assert_eq!(std::fs::metadata(m2.path("empty.txt")).unwrap().len(), 0);
        m2.unmount();
    }

    // rmdir of non-empty directories is refused.
    for d in ["m1", "m1/m2"] {
        let e = std::fs::remove_dir(m.path(d)).expect_err("rmdir of a non-empty directory");
        assert_eq!(errno(&e), libc::ENOTEMPTY, "rmdir {d}: {e}");
    }
    // unlink removes the object; the now empty directory stays (as a marker).
    std::fs::remove_file(m.path("m1/m2/f.bin")).unwrap();
    let all = st.objects();
    assert!(!all.contains_key("m1/m2/f.bin"), "m1/m2/f.bin after unlink: {all:?}");
    assert!(
        std::fs::metadata(m.path("m1/m2")).is_ok_and(|md| md.is_dir()),
        "m1/m2 is gone after unlinking its only file"
    );
    assert_eq!(
        all.get("m1/m2/"),
        Some(&0),
        "the emptied m1/m2 must keep a marker: {all:?}"
    );

    // rmdir removes markers.
    std::fs::remove_dir(m.path("m1/m2")).unwrap();
    std::fs::remove_dir(m.path("m1")).unwrap();
    std::fs::remove_dir(m.path("emptydir")).unwrap();
    std::fs::remove_file(m.path("new.txt")).unwrap();
    objs(
        &[("empty.txt", 0)],
        "after rmdir m1/m2, m1, emptydir and unlink new.txt",
    );

    // Truncation, setattr size and rename of a file.
    create_with(&m.path("t.bin"), &rng.bytes(5000));
    let f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path("t.bin"))
        .unwrap();
    f.write_all_at(b"0123456789", 0).unwrap();
    close_checked(f, "t.bin after O_TRUNC and a write");
    assert_eq!(st.get(&st.key("t.bin")), b"0123456789", "t.bin after O_TRUNC");
    let f = OpenOptions::new().write(true).open(m.path("t.bin")).unwrap();
    f.set_len(3).unwrap();
    close_checked(f, "t.bin after ftruncate(3)");
    assert_eq!(st.get(&st.key("t.bin")), b"012", "t.bin after ftruncate(3)");
    std::fs::rename(m.path("t.bin"), m.path("renamed.bin")).unwrap();
    objs(&[("empty.txt", 0), ("renamed.bin", 3)], "after the rename of t.bin");
    assert_eq!(names(&m.mnt), ["empty.txt", "renamed.bin"]);
    m.unmount();
}

/// Reading the uncached `name` fails with EIO within the home timeout (plus slack), not a hang, and the
/// daemon still answers `status`, reporting home unreachable.
fn expect_eio_and_unreachable(m: &Mount, name: &str, timeout: Duration, what: &str) {
    let (r, took) = timed_read(m.path(name), timeout + Duration::from_secs(20), what);
    match r {
        Ok(v) => panic!("{what}: returned {} bytes instead of failing", v.len()),
        Err(e) => assert_eq!(errno(&e), libc::EIO, "{what}: want EIO, got {e}"),
    }
    eprintln!("{name} failed with EIO after {took:?}");
    assert!(
        took <= timeout + Duration::from_secs(5),
        "{what}: EIO came {took:?} after the read started (home timeout {timeout:?})"
    );
    let v = status_answers(m);
    assert_eq!(v["home"]["state"], "offline", "{what}: home.state {}", v["home"]);
}

/// A write made on the cached version must not overwrite a change made at home meanwhile: the push is
/// conditional on the version the changes were made on, and fails (EIO for now) leaving home's version.
#[test]
fn change_at_home_under_pending_writes_is_a_conflict() {
    let t = S3Test::new("conflict", "home");
    t.put(&t.key("f.txt"), b"original content");
    let m = t.mount(&["--validity-lag", "60s"]);
    let p = m.path("f.txt");
    assert_eq!(std::fs::read(&p).unwrap(), b"original content");
    // Changed at home while no descriptor is open (the helper runs a subprocess, and a fork closing a
    // duplicate of an open descriptor would push first); the mount still trusts the cached version.
    t.put(&t.key("f.txt"), b"theirs, changed at home");
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"LOCAL", 0).unwrap();
    let err = f.sync_all().expect_err("fsync must report the conflict");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "want EIO, got {err}");
    assert_eq!(
        t.get(&t.key("f.txt")),
        b"theirs, changed at home",
        "home's version was overwritten"
    );
    drop(f);
}

#[test]
fn keys_come_from_a_credentials_file_only_its_owner_may_read() {
    use std::os::unix::fs::PermissionsExt;
    let st = S3Test::new("credfile", "p");
    st.put(&st.key("f"), b"signed with the file's keys");
    let creds = st.t.root().join("s3.credentials");
    std::fs::write(
        &creds,
        "[default]\naws_access_key_id = test\naws_secret_access_key = test\n",
    )
    .unwrap();
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o644)).unwrap();
    let args = st.mount_args(&["--s3-credentials", s(&creds)]);
    let out = Mount::try_new_env(&st.url(), &st.t.mnt, &st.t.cache, &args, &st.srv.env())
        .err()
        .expect("a credentials file others may read was taken");
    assert!(
        out.stderr.contains("may be read by others (mode 0644)") && out.stderr.contains("s3.credentials"),
        "{out}"
    );
    assert!(!is_mounted(&st.t.mnt));
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = st.mount_at(&st.t.mnt, &st.t.cache, &["--s3-credentials", s(&creds)]);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"signed with the file's keys");
    m.unmount();
}

/// `(mode & 07777, uid, gid, mtime)` of `p`, not following a symlink.
fn owned(p: &Path) -> (u32, u32, u32, SystemTime) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    (m.mode() & 0o7777, m.uid(), m.gid(), m.modified().unwrap())
}

#[test]
fn modes_owners_times_and_symlinks_survive_a_remount_with_an_empty_cache() {
    let st = S3Test::new("meta", "p");
    st.put(&st.key("plain"), b"put by another client, without metadata");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "100ms"]);
    std::fs::write(m.path("f"), b"kept with its mode").unwrap();
    let run = |args: &[&str]| {
        let out = run_cmd(args[0], &args[1..], COMMAND_DEADLINE);
        assert!(out.success(), "{args:?}: {out}");
    };
    run(&["chmod", "640", s(&m.path("f"))]);
    run(&["chown", "1234:5678", s(&m.path("f"))]);
    run(&["touch", "-m", "-d", "2001-02-03 04:05:06.5", s(&m.path("f"))]);
    std::os::unix::fs::symlink("f", m.path("link")).unwrap();
    std::fs::create_dir(m.path("tree")).unwrap();
    for i in 0..20 {
        let p = m.path(&format!("tree/{i}"));
        std::fs::write(&p, format!("file {i}")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600 + i)).unwrap();
    }
    let want_f = owned(&m.path("f"));
    assert_eq!(&want_f.0, &0o640);
    m.unmount();

    // A new cache: everything comes from the bucket.
    let m = st.mount_fresh(2, &[]);
    assert_eq!(owned(&m.path("f")), want_f, "f after a remount with an empty cache");
    assert_eq!(std::fs::read_link(m.path("link")).unwrap(), Path::new("f"));
    assert_eq!(std::fs::read(m.path("link")).unwrap(), b"kept with its mode");
    // A listing brings the modes of what it lists: each file's mode is its own.
    let before = st.srv.requests();
    for i in 0..20u32 {
        assert_eq!(owned(&m.path(&format!("tree/{i}"))).0, 0o600 + i, "tree/{i}");
    }
    let http = st.srv.requests() - before;
    assert!(
        http.list <= 2 && http.head <= 22,
        "listing 20 files with their metadata made {http:?}"
    );
    // An object no tool gave metadata: the defaults.
    let (mode, ..) = owned(&m.path("plain"));
    assert_eq!(mode, 0o644);
    // A directory renamed keeps its mode, and so do the directories below it (their markers are copied).
    std::fs::create_dir(m.path("tree/sub")).unwrap();
    std::fs::set_permissions(m.path("tree/sub"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::set_permissions(m.path("tree"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::rename(m.path("tree"), m.path("moved")).unwrap();
    m.unmount();
    let m = st.mount_fresh(3, &[]);
    assert_eq!(owned(&m.path("moved")).0, 0o700, "a renamed directory's mode");
    assert_eq!(
        owned(&m.path("moved/sub")).0,
        0o750,
        "the mode of a directory below a renamed one"
    );
    assert_eq!(owned(&m.path("moved/3")).0, 0o603, "a file below a renamed directory");
    m.unmount();
}

/// What the mount makes shows the time it was made here, never the later time its push reached the bucket:
/// a symlink, an empty file and a directory with an entry made after it show the same times, to the
/// nanosecond, after a remount with an empty cache. (`rsync -a` leaves a symlink's time alone when it falls
/// in the source's second, and compares it again on its next run.)
#[test]
fn times_of_what_the_mount_made_survive_a_remount_with_an_empty_cache() {
    use std::os::unix::fs::MetadataExt;
    let st = S3Test::new("made-times", "p");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "300ms"]);
    std::os::unix::fs::symlink("empty", m.path("link")).unwrap();
    std::fs::File::create(m.path("empty")).unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(m.path("dir/f"), b"an entry made after its directory").unwrap();
    let times = |m: &Mount| {
        ["link", "empty", "dir", "dir/f"].map(|n| {
            let md = std::fs::symlink_metadata(m.path(n)).unwrap();
            (n, md.mtime(), md.mtime_nsec())
        })
    };
    let made = times(&m);
    m.unmount();
    let m = st.mount_fresh(2, &[]);
    assert_eq!(times(&m), made, "times after a remount with an empty cache");
    m.unmount();
}

#[test]
fn rsync_a_twice_onto_an_s3_home_copies_nothing_the_second_time_even_from_an_empty_cache() {
    let st = S3Test::new("rsync", "p");
    let src = st.t.root().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for (i, name) in ["a", "b", "sub/c", "sub/d"].iter().enumerate() {
        let p = src.join(name);
        std::fs::write(&p, format!("content of {name}").repeat(i + 1)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600 | (i as u32 * 0o10))).unwrap();
    }
    std::os::unix::fs::symlink("a", src.join("to-a")).unwrap();
    // Directory times well apart from the mount's start: a directory S3 holds no metadata for shows the
    // time the mount started, and rsync compares whole seconds where it cannot tell nanoseconds.
    for dir in [src.join("sub"), src.clone()] {
        let out = run_cmd("touch", &["-d", "2001-02-03 04:05:06", s(&dir)], COMMAND_DEADLINE);
        assert!(out.success(), "{out}");
    }
    let rsync = |dst: &Path| {
        let out = run_cmd(
            "rsync",
            &["-ai", &format!("{}/", s(&src)), &format!("{}/", s(dst))],
            COMMAND_DEADLINE,
        );
        assert!(out.success(), "rsync: {out}");
        out.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "100ms"]);
    let first = rsync(&m.mnt);
    assert!(first.len() >= 6, "the first rsync copied {first:?}");
    assert_eq!(rsync(&m.mnt), Vec::<String>::new(), "the second rsync, same mount");
    m.unmount();
    let m = st.mount_fresh(2, &[]);
    assert_eq!(
        rsync(&m.mnt),
        Vec::<String>::new(),
        "rsync -a onto a new cache of the same bucket"
    );
    m.unmount();
}

/// A key ending in `/` that holds bytes (some tools store data there) is a directory in the mount, and
/// removing that directory is refused rather than losing the bytes; an empty marker goes as ever.
#[test]
fn a_directory_marker_holding_data_is_never_removed() {
    let st = S3Test::new("marker-data", "p");
    st.put(&st.key("d/"), b"bytes a tool kept in a directory marker");
    st.put(&st.key("e/"), b"");
    // Write-through: home's refusal is the call's answer.
    let m = st.mount(&["--write-mode", "write-through"]);
    assert!(std::fs::metadata(m.path("d")).unwrap().is_dir());
    assert_eq!(names(&m.path("d")), Vec::<String>::new());
    let e = std::fs::remove_dir(m.path("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    std::fs::remove_dir(m.path("e")).unwrap();
    m.unmount();
    assert_eq!(st.get(&st.key("d/")), b"bytes a tool kept in a directory marker");
    assert_eq!(st.try_get(&st.key("e/")), None, "the empty marker stayed");
    // Write-back: the removal is taken in the cache, and home refuses it when it is pushed.
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "100ms"]);
    std::fs::remove_dir(m.path("d")).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || m.log().contains("home refused a change")),
        "the push of the removal was not refused:\n{}",
        m.log()
    );
    assert_eq!(st.get(&st.key("d/")), b"bytes a tool kept in a directory marker");
    m.force_cleanup();
    m.disarm();
}
