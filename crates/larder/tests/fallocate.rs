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
