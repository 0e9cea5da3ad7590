//! util-linux's `fallocate` on a write-back mount, each command beside the same one on the local disk:
//! allocating past the end without a new size (`-n`), extending (`-l`), punching a hole and zeroing a
//! range leave the sizes and bytes the local disk has, and home has them after a drain.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::*;

/// Run `sh -c cmd`, failing the test with its output if it fails.
#[track_caller]
fn sh(cmd: &str) {
    let out = run_cmd("sh", &["-c", cmd], Duration::from_secs(60));
    assert!(out.success(), "`{cmd}` failed: {out}");
}

#[test]
fn fallocate_sizes_and_clears_files_as_on_the_local_disk_and_home_ends_with_the_same() {
    let t = TestDir::new("fallocate");
    let local = t.root().join("local");
    std::fs::create_dir(&local).unwrap();
    // (file, its first content's size, whether that was written through the mount rather than at home
    // before it, the `fallocate` commands run on it). A file from home is not cached: the blocks a
    // cleared range only partly covers come from home.
    let cases: [(&str, usize, bool, &[&str]); 8] = [
        ("keep-size", 100_000, true, &["-n -l 1M"]),
        ("extend", 100_000, true, &["-l 3M"]),
        ("extend-empty", 0, true, &["-l 2M"]),
        (
            "punch",
            300_000,
            true,
            &["--punch-hole -o 5000 -l 100000", "--punch-hole -o 290000 -l 1M"],
        ),
        ("punch-home", 3_000_000, false, &["--punch-hole -o 1000000 -l 1500000"]),
        (
            "zero",
            300_000,
            true,
            &["--zero-range -o 7000 -l 50000", "--zero-range -o 250000 -l 200000"],
        ),
        ("zero-home", 300_000, false, &["--zero-range -o 7000 -l 50000", "-l 1M"]),
        (
            "zero-keep-size",
            300_000,
            true,
            &["--zero-range --keep-size -o 280000 -l 1M"],
        ),
    ];
    let mut rng = Rng::new(11);
    let contents: Vec<Vec<u8>> = cases.iter().map(|(_, size, _, _)| rng.bytes(*size)).collect();
    for ((name, _, through_mount, _), data) in cases.iter().zip(&contents) {
        std::fs::write(local.join(name), data).unwrap();
        if !through_mount {
            std::fs::write(t.home.join(name), data).unwrap();
        }
    }
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "600s"]);
    for ((name, _, through_mount, _), data) in cases.iter().zip(&contents) {
        if *through_mount {
            std::fs::write(m.path(name), data).unwrap();
        }
    }
    for (name, _, _, commands) in &cases {
        for root in [&local, &m.mnt] {
            for c in *commands {
                sh(&format!("fallocate {c} {}", s(&root.join(name))));
            }
        }
    }
    let compare = |root: &Path, place: &str| {
        for (name, _, _, commands) in &cases {
            let want = read(&local.join(name));
            let got = read(&root.join(name));
            assert_eq!(
                got.len(),
                want.len(),
                "{name} {place} after {commands:?}: its size is not the local disk's"
            );
            assert_same_bytes(&got, &want, &format!("{name} {place} after {commands:?}"));
        }
    };
    compare(&m.mnt, "through the mount");
    drain_ok(&m, 120);
    compare(&t.home, "at home");
    // An extension reaches home as a truncation would make it: a hole, not zeros written.
    let allocated = std::fs::metadata(t.home.join("extend-empty")).unwrap().blocks() * 512;
    assert!(
        allocated < 1 << 20,
        "home holds {allocated} bytes of a 2 MiB file extended by fallocate"
    );
    // A punched hole or a zeroed range stays a hole through the cache and at home: home's file takes no
    // more of its disk than the local disk's (within a few blocks at the range's unaligned edges).
    for name in ["punch", "punch-home", "zero", "zero-home"] {
        let on = |root: &Path| std::fs::metadata(root.join(name)).unwrap().blocks() * 512;
        let (home, local) = (on(&t.home), on(&local));
        assert!(
            home <= local + (64 << 10),
            "{name}: home's file takes {home} bytes of disk, the local disk's {local}: the cleared range was written as zeros"
        );
    }
    m.unmount();
}

/// An allocation past the end sets its blocks aside at the call, as on a local disk: `st_blocks` counts
/// them at once and a write into them takes no more (fstests' generic/568); more than the mount's file
/// system has free (`df`, home's) is refused with `ENOSPC` and changes nothing (generic/213).
#[test]
fn an_allocation_past_the_end_takes_its_room_at_the_call_or_is_refused_there() {
    let t = TestDir::new("fallocate-room");
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "600s"]);
    let blocks = |name: &str| std::fs::metadata(m.path(name)).unwrap().blocks() * 512;

    // Two bytes across the first block boundary of an empty file.
    let f = m.path("f");
    std::fs::write(&f, b"").unwrap();
    sh(&format!("fallocate -o 4095 -l 2 {}", s(&f)));
    let before = blocks("f");
    assert!(
        before >= 8192,
        "two allocated bytes across a block boundary count {before} bytes"
    );
    sh(&format!(
        "printf ab | dd of={} bs=1 seek=4095 conv=notrunc status=none",
        s(&f)
    ));
    let after = blocks("f");
    assert!(
        after <= before,
        "a write into allocated blocks grew the file from {before} to {after} bytes of disk"
    );
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 4097);

    // 8 MiB: counted at once, read as zeros.
    let g = m.path("g");
    sh(&format!("fallocate -l 8M {}", s(&g)));
    assert!(blocks("g") >= 8 << 20, "8 MiB allocated count {} bytes", blocks("g"));
    assert_eq!(read(&g), vec![0u8; 8 << 20]);

    // Twice what df shows free: refused, and the file keeps its size.
    let out = run_cmd("df", &["-B1", "--output=avail", s(&m.mnt)], Duration::from_secs(30));
    assert!(out.success(), "df: {out}");
    let avail: u64 = out.stdout.lines().last().unwrap().trim().parse().unwrap();
    let h = m.path("h");
    std::fs::write(&h, b"kept").unwrap();
    let out = run_cmd(
        "fallocate",
        &["-l", &(avail * 2).to_string(), s(&h)],
        Duration::from_secs(60),
    );
    assert!(
        !out.success() && out.stderr.contains("No space left on device"),
        "allocating twice the free room ({avail} bytes free): {out}"
    );
    assert_eq!(read(&h), b"kept");

    drain_ok(&m, 120);
    assert_eq!(read(&t.home.join("g")), vec![0u8; 8 << 20]);
    assert_eq!(std::fs::read(t.home.join("f")).unwrap()[4095..], *b"ab");
    m.unmount();
}

/// An allocation more than the cache can hold as changes not yet at home (here more than its size) sets
/// nothing aside but still extends the file, as a truncation would: a program taking most of home's free
/// space with one `fallocate` (fstests' generic/103) gets its file, and writes into it stream through the
/// cache as any others.
#[test]
fn an_allocation_larger_than_the_cache_extends_the_file_without_setting_room_aside() {
    let t = TestDir::new("fallocate-big");
    let m = t.mount(&["--write-mode", "write-back", "--cache-size", "64M"]);
    let f = m.path("big");
    sh(&format!("fallocate -l 256M {}", s(&f)));
    let meta = std::fs::metadata(&f).unwrap();
    assert_eq!(meta.len(), 256 << 20);
    assert!(
        meta.blocks() * 512 < 64 << 20,
        "{} bytes set aside in a cache of 64 MiB",
        meta.blocks() * 512
    );
    sh(&format!(
        "dd if=/dev/urandom of={} bs=1M count=4 seek=100 conv=notrunc status=none",
        s(&f)
    ));
    drain_ok(&m, 120);
    let home = std::fs::read(t.home.join("big")).unwrap();
    assert_eq!(home.len(), 256 << 20);
    assert!(home[..100 << 20].iter().all(|b| *b == 0));
    assert_eq!(
        home[100 << 20..104 << 20],
        std::fs::read(&f).unwrap()[100 << 20..104 << 20]
    );
    m.unmount();
}
