//! Reads, in the core without a mount (a real POSIX home in a temporary directory, counted by the metrics
//! layer): cold and warm reads, readahead, concurrent misses, a tier between the store and home, and home
//! failing a read.

use std::sync::Arc;
use std::time::Duration;

use larder_fs::tier::{FaultTier, Faults, MemoryTier};
use larder_fs::{FsConfig, FsError};
use larder_home::{Fault, FaultLayer, HomeError, OpKind};

mod common;
use common::*;

#[test]
fn cold_then_warm_reads_are_exact_and_warm_reads_stay_local() {
    let s = Setup::new();
    let data = pattern(5 * BS as usize + 123, 7);
    std::fs::write(s.home("big"), &data).unwrap();
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "big").unwrap();
    assert_eq!(read_file(&fs, ino), data);
    assert_eq!(c.bytes_read(), data.len() as u64);
    let reads = c.ops_of(OpKind::Read);
    assert_eq!(read_file(&fs, ino), data);
    assert_eq!(c.ops_of(OpKind::Read), reads, "warm reads make no home reads");
    // A range across a block boundary.
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    let start = BS - 10;
    assert_eq!(
        fs.read(r.fh, start, 20).unwrap(),
        data[start as usize..start as usize + 20]
    );
}

#[test]
fn a_sequential_reader_gets_adjacent_blocks_in_few_home_requests() {
    let s = Setup::new();
    let blocks = 48;
    let data = pattern(blocks * BS as usize, 9);
    std::fs::write(s.home("big"), &data).unwrap();
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "big").unwrap();
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    while out.len() < data.len() {
        let chunk = fs.read(r.fh, out.len() as u64, BS as u32).unwrap();
        assert!(!chunk.is_empty());
        out.extend(chunk);
    }
    fs.release(r.fh).unwrap();
    assert!(out == data, "the bytes read are not home's");
    let reads = c.ops_of(OpKind::Read);
    // The readahead window grows to 16 blocks; each stream (2 here) takes its share of a window's blocks
    // in one request. One request per block would be 48.
    assert!(reads <= blocks as u64 / 2, "{reads} home reads for {blocks} blocks");
    assert_eq!(read_file(&fs, ino), data);
    assert_eq!(c.ops_of(OpKind::Read), reads, "warm reads make no home reads");
}

#[test]
fn a_tier_between_store_and_home_is_filled_and_serves_another_node_but_never_bad_bytes() {
    let s = Setup::new();
    let big = pattern(5 * BS as usize + 99, 5);
    let small = pattern(1000, 9);
    std::fs::write(s.home("big"), &big).unwrap();
    std::fs::write(s.home("small"), &small).unwrap();
    // One tier shared by two nodes (two caches over one home), standing for a bank.
    let bank = Arc::new(MemoryTier::shared(64 << 20));
    let faulty = Arc::new(FaultTier::new(bank.clone()));
    let node = |name: &str| {
        let cfg = FsConfig {
            write_mode: larder_fs::WriteMode::WriteThrough,
            validity_lag: Duration::from_secs(3600),
            ingest_streams: 1,
            ..FsConfig::default()
        };
        s.fs_tiered(
            Arc::new(FaultLayer::default()),
            cfg,
            &s.cache_dir.join(name),
            vec![faulty.clone()],
        )
    };
    let (first, c1) = node("one");
    for name in ["big", "small"] {
        let ino = resolve(&first, name).unwrap();
        read_file(&first, ino);
    }
    assert_eq!(c1.bytes_read(), (big.len() + small.len()) as u64);
    let bank_bytes = bank.bytes();
    assert_eq!(
        bank_bytes,
        (big.len() + small.len()) as u64,
        "every unit fetched went to the bank"
    );

    // Another node finds every unit in the bank: its keys are the same.
    let (second, c2) = node("two");
    for (name, data) in [("big", &big), ("small", &small)] {
        let ino = resolve(&second, name).unwrap();
        assert_eq!(&read_file(&second, ino), data);
    }
    assert_eq!(c2.ops_of(OpKind::Read), 0, "served by the bank, not home");

    // A bank answering with damaged bytes or another version's is not served: home is.
    for faults in [
        Faults {
            corrupt: true,
            ..Faults::default()
        },
        Faults {
            wrong_version: true,
            ..Faults::default()
        },
        Faults {
            error: true,
            ..Faults::default()
        },
    ] {
        faulty.set(faults.clone());
        let dir = format!("three-{faults:?}").replace(|c: char| !c.is_ascii_alphanumeric(), "");
        let (third, c3) = node(&dir);
        for (name, data) in [("big", &big), ("small", &small)] {
            let ino = resolve(&third, name).unwrap();
            assert_eq!(&read_file(&third, ino), data, "{faults:?}");
        }
        assert_eq!(c3.bytes_read(), (big.len() + small.len()) as u64, "{faults:?}");
        let stats = third.tier_stats();
        assert_eq!(
            stats.iter().map(|t| t.name).collect::<Vec<_>>(),
            ["cache", "fault", "home"]
        );
        assert_eq!(stats[1].hits, 0);
        assert_eq!(stats[2].hits, 7, "six blocks and a small file from home");
    }
}

#[test]
fn concurrent_misses_make_one_home_read() {
    let s = Setup::new();
    let data = pattern(BS as usize, 3);
    std::fs::write(s.home("f"), &data).unwrap();
    let (fs, c) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "f").unwrap();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| assert_eq!(read_file(&fs, ino), data));
        }
    });
    assert_eq!(c.ops_of(OpKind::Read), 1);
}

/// A sequential reader whose reads skip ahead a little (the pages between came from the kernel's page
/// cache, brought in by another reader of the file) keeps its readahead window growing.
#[test]
fn a_reader_skipping_ahead_keeps_its_readahead() {
    let s = Setup::new();
    std::fs::write(s.home("f"), pattern(32 * BS as usize, 6)).unwrap();
    let (fs, counters) = s.fs_configured(
        Arc::new(FaultLayer::default()),
        FsConfig {
            write_mode: larder_fs::WriteMode::WriteThrough,
            validity_lag: Duration::from_secs(3600),
            readahead_max: 8 * BS,
            ingest_streams: 2,
            ..FsConfig::default()
        },
    );
    let ino = resolve(&fs, "f").unwrap();
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    for block in [0, 2, 4] {
        let got = fs.read(r.fh, block * BS, BS as u32).unwrap();
        assert_eq!(
            got,
            pattern(32 * BS as usize, 6)[(block * BS) as usize..((block + 1) * BS) as usize]
        );
    }
    // The window doubled at each read: after the read of block 4 it reaches block 8.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while counters.bytes_read() < 9 * BS {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} blocks came in: the skips reset the readahead",
            counters.bytes_read() / BS
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    fs.release(r.fh).unwrap();
}

#[test]
fn a_failing_home_read_is_an_error_not_a_cached_hole() {
    let s = Setup::new();
    std::fs::write(s.home("f"), pattern(1000, 5)).unwrap();
    let faults = Arc::new(FaultLayer::default());
    let (fs, _) = s.fs_with_faults(Duration::from_secs(3600), faults.clone());
    let ino = resolve(&fs, "f").unwrap();
    faults.inject(Fault {
        op: OpKind::Read,
        error: HomeError::TimedOut(Duration::from_secs(1)),
        count: 1,
        landed: false,
    });
    let r = fs.open(ino, libc::O_RDONLY).unwrap();
    assert!(matches!(
        fs.read(r.fh, 0, 100),
        Err(FsError::Home(HomeError::TimedOut(_)))
    ));
    assert_eq!(
        fs.read(r.fh, 0, 1000).unwrap(),
        pattern(1000, 5),
        "nothing wrong was cached"
    );
}
