//! The walk's rules, with in-memory and fault-injecting tiers.

use std::sync::Arc;
use std::time::Duration;

use larder_home::{ContentId, HomeError, Version};

use super::*;
use crate::key::{Content, HomeId, NodeId, Part, UnitKey};
use std::sync::atomic::Ordering;

const DATA: &[u8] = b"the right bytes of block two";

fn key(version: &str) -> UnitKey {
    UnitKey {
        home: HomeId::new("s3://bucket"),
        content: Content::Home(ContentId::Named {
            path: b"f".to_vec(),
            version: version.as_bytes().to_vec(),
        }),
        part: Part::Block {
            index: 2,
            block_size: 64,
            len: DATA.len() as u64,
        },
    }
}

fn want(key: &UnitKey) -> Want<'_> {
    static FILE: std::sync::LazyLock<FileVersion> = std::sync::LazyLock::new(|| FileVersion {
        object: 1,
        epoch: 0,
        path: "f".into(),
        version: Version(String::new()),
        home_end: 128 + DATA.len() as u64,
    });
    Want::new(key, 128..128 + DATA.len() as u64, &FILE)
}

/// A source holding `DATA` as `key`, behind a fault switch that counts its calls.
fn origin(key: &UnitKey) -> Arc<FaultTier> {
    let source = MemoryTier::new(1 << 20);
    source.put(Unit::new(key.digest(), Arc::new(DATA.to_vec())));
    Arc::new(FaultTier::new(Arc::new(source)))
}

/// A middle tier holding `data` as `key`, behind `faults`.
fn middle(key: &UnitKey, data: &[u8], faults: Faults) -> Arc<FaultTier> {
    let tier = MemoryTier::new(1 << 20);
    tier.put(Unit::new(key.digest(), Arc::new(data.to_vec())));
    let tier = Arc::new(FaultTier::new(Arc::new(tier)));
    tier.set(faults);
    tier
}

fn stats_of(tiers: &Tiers, i: usize) -> TierStats {
    tiers.stats()[i].clone()
}

#[test]
fn a_corrupt_answer_is_a_miss_and_the_next_tier_serves() {
    let k = key("v1");
    let near = Arc::new(MemoryTier::new(1 << 20));
    let bad = middle(
        &k,
        DATA,
        Faults {
            corrupt: true,
            ..Faults::default()
        },
    );
    let source = origin(&k);
    let tiers = Tiers::new(vec![near.clone(), bad.clone(), source.clone()]);
    assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA);
    assert_eq!(source.gets(), 1);
    assert_eq!(stats_of(&tiers, 1).rejected, 1);
    assert_eq!(stats_of(&tiers, 1).hits, 0);
    // The near tier was filled with the verified bytes, and serves them next.
    assert!(near.holds(&k.digest()));
    assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA);
    assert_eq!(source.gets(), 1);
    assert_eq!(stats_of(&tiers, 0).hits, 1);
}

#[test]
fn another_versions_answer_is_a_miss() {
    let k = key("v1");
    let stale = middle(
        &k,
        b"bytes of another version of it",
        Faults {
            wrong_version: true,
            ..Faults::default()
        },
    );
    let source = origin(&k);
    let tiers = Tiers::new(vec![stale.clone(), source.clone()]);
    assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA);
    assert_eq!(stats_of(&tiers, 0).rejected, 1);
    assert_eq!(source.gets(), 1);
    // The same bytes asked for as another version are not found either.
    let other = key("v2");
    let tiers = Tiers::new(vec![Arc::new(MemoryTier::new(1 << 20)), origin(&other)]);
    assert_eq!(&tiers.fetch(&want(&other)).unwrap()[..], DATA);
    assert_eq!(stats_of(&tiers, 0).misses, 1);
}

#[test]
fn an_answer_of_the_wrong_length_is_a_miss() {
    let k = key("v1");
    let short = middle(&k, &DATA[..4], Faults::default());
    let source = origin(&k);
    let tiers = Tiers::new(vec![short, source.clone()]);
    assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA);
    assert_eq!(stats_of(&tiers, 0).rejected, 1);
    assert_eq!(source.gets(), 1);
}

#[test]
fn a_failing_tier_is_a_miss_but_the_last_ones_error_is_the_reads() {
    let k = key("v1");
    let down = middle(
        &k,
        DATA,
        Faults {
            error: true,
            ..Faults::default()
        },
    );
    let source = origin(&k);
    let tiers = Tiers::new(vec![down.clone(), source.clone()]);
    assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA);
    let s = stats_of(&tiers, 0);
    assert_eq!((s.errors, s.misses, s.offers, s.offer_errors), (1, 1, 1, 1));

    source.set(Faults {
        error: true,
        ..Faults::default()
    });
    let tiers = Tiers::new(vec![Arc::new(MemoryTier::new(1 << 20)), source.clone()]);
    assert!(matches!(tiers.fetch(&want(&k)), Err(HomeError::Unavailable(_))));
    // A last tier whose answer fails verification gives no bytes either.
    source.set(Faults {
        corrupt: true,
        ..Faults::default()
    });
    assert!(matches!(tiers.fetch(&want(&k)), Err(HomeError::Os(libc::EIO))));
    assert_eq!(stats_of(&tiers, 1).rejected, 1);
}

#[test]
fn concurrent_readers_make_one_farther_fetch() {
    let k = key("v1");
    let near = Arc::new(MemoryTier::new(1 << 20));
    let source = origin(&k);
    source.set(Faults {
        delay: Duration::from_millis(150),
        ..Faults::default()
    });
    let tiers = Tiers::new(vec![near.clone(), source.clone()]);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA));
        }
    });
    assert_eq!(source.gets(), 1);
    assert!(!tiers.in_flight(&k.digest()));
    assert!(near.holds(&k.digest()));
}

#[test]
fn every_nearer_tier_is_filled_and_no_farther_one() {
    let k = key("v1");
    let (a, b) = (Arc::new(MemoryTier::new(1 << 20)), Arc::new(MemoryTier::new(1 << 20)));
    let beyond = Arc::new(FaultTier::new(Arc::new(MemoryTier::new(1 << 20))));
    let mid = middle(&k, DATA, Faults::default());
    let tiers = Tiers::new(vec![a.clone(), b.clone(), mid.clone(), beyond.clone()]);
    assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA);
    assert!(a.holds(&k.digest()) && b.holds(&k.digest()));
    assert_eq!((mid.offers(), beyond.gets(), beyond.offers()), (0, 0, 0));
}

#[test]
fn unpushed_content_is_never_offered_to_a_shared_tier() {
    let mut k = key("v1");
    k.content = Content::Unpushed {
        node: NodeId(3),
        seq: 9,
    };
    let shared = Arc::new(MemoryTier::shared(1 << 20));
    let private = Arc::new(MemoryTier::new(1 << 20));
    let tiers = Tiers::new(vec![private.clone(), shared.clone(), origin(&k)]);
    assert_eq!(&tiers.fetch(&want(&k)).unwrap()[..], DATA);
    assert!(private.holds(&k.digest()));
    assert!(!shared.holds(&k.digest()));
    assert_eq!(stats_of(&tiers, 1).offers, 0);
    // Content that is at home is.
    let k = key("v1");
    let tiers = Tiers::new(vec![shared.clone(), origin(&k)]);
    tiers.fetch(&want(&k)).unwrap();
    assert!(shared.holds(&k.digest()));
}

#[test]
fn what_is_held_comes_from_the_tiers_before_the_shared_ones_and_never_from_farther() {
    let k = key("v1");
    let private = Arc::new(MemoryTier::new(1 << 20));
    let peer = MemoryTier::shared(1 << 20);
    peer.put(Unit::new(k.digest(), Arc::new(DATA.to_vec())));
    let shared = Arc::new(FaultTier::new(Arc::new(peer)));
    let source = origin(&k);
    let tiers = Tiers::new(vec![private.clone(), shared.clone(), source.clone()]);
    // Neither a shared tier nor the source is asked for what is only held.
    assert!(tiers.held(&want(&k)).is_none());
    assert_eq!((shared.gets(), source.gets()), (0, 0));
    // Once fetched, it is held: served from the private tier.
    tiers.fetch(&want(&k)).unwrap();
    assert_eq!(&tiers.held(&want(&k)).unwrap()[..], DATA);
    assert_eq!(source.gets(), 0, "the shared tier answered the fetch");
    // Bytes the private tier holds under another key are not this unit.
    let other = key("v2");
    assert!(tiers.held(&want(&other)).is_none());
}

/// Units 0..n of one file, `BS` bytes each, and what a tier is asked for each.
const BS: u64 = 64;

fn block(index: u32) -> UnitKey {
    UnitKey {
        home: HomeId::new("s3://bucket"),
        content: Content::Home(ContentId::Named {
            path: b"f".to_vec(),
            version: b"v1".to_vec(),
        }),
        part: Part::Block {
            index,
            block_size: BS,
            len: BS,
        },
    }
}

fn block_bytes(index: u32) -> Vec<u8> {
    vec![index as u8 + 1; BS as usize]
}

static FILE: std::sync::LazyLock<FileVersion> = std::sync::LazyLock::new(|| FileVersion {
    object: 1,
    epoch: 0,
    path: "f".into(),
    version: Version(String::new()),
    home_end: 16 * BS,
});

fn block_wants(keys: &[UnitKey]) -> Vec<Want<'_>> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| Want::new(k, i as u64 * BS..(i as u64 + 1) * BS, &FILE))
        .collect()
}

/// A source that serves runs in one request, counting runs and single units asked, after `delay`.
struct RunSource {
    delay: Duration,
    runs: std::sync::atomic::AtomicU64,
    units: std::sync::atomic::AtomicU64,
}

impl RunSource {
    fn new(delay: Duration) -> Arc<RunSource> {
        Arc::new(RunSource {
            delay,
            runs: Default::default(),
            units: Default::default(),
        })
    }

    fn counts(&self) -> (u64, u64) {
        (self.runs.load(Ordering::SeqCst), self.units.load(Ordering::SeqCst))
    }

    fn unit(want: &Want) -> Unit {
        let index = (want.range.start / BS) as u32;
        Unit::new(want.digest, Arc::new(block_bytes(index)))
    }
}

impl Tier for RunSource {
    fn name(&self) -> &'static str {
        "source"
    }

    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError> {
        std::thread::sleep(self.delay);
        self.units.fetch_add(1, Ordering::SeqCst);
        Ok(Some(RunSource::unit(want)))
    }

    fn get_run(&self, wants: &[Want]) -> Result<Option<Vec<Unit>>, TierError> {
        std::thread::sleep(self.delay);
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(Some(wants.iter().map(RunSource::unit).collect()))
    }
}

#[test]
fn a_run_asks_nearer_tiers_unit_by_unit_and_the_source_once_for_the_rest() {
    let keys: Vec<UnitKey> = (0..6).map(block).collect();
    let near = Arc::new(MemoryTier::new(1 << 20));
    // A middle tier holds unit 2: the source is asked for 0..2 and 3..6, a request each.
    let mid = Arc::new(MemoryTier::new(1 << 20));
    mid.put(Unit::new(keys[2].digest(), Arc::new(block_bytes(2))));
    let source = RunSource::new(Duration::ZERO);
    let tiers = Tiers::new(vec![near.clone(), mid.clone(), source.clone()]);
    let results = tiers.fetch_run(&block_wants(&keys));
    assert_eq!(results.len(), 6);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.as_ref().unwrap()[..], block_bytes(i as u32)[..], "unit {i}");
        assert!(near.holds(&keys[i].digest()), "unit {i} kept in the nearest tier");
    }
    assert_eq!(source.counts(), (2, 0), "two runs, no unit asked alone");
    let home = stats_of(&tiers, 2);
    assert_eq!((home.asks, home.hits, home.bytes), (2, 5, 5 * BS));
    assert_eq!(stats_of(&tiers, 1).hits, 1);
}

#[test]
fn a_run_stops_short_of_a_unit_whose_walk_is_under_way() {
    let keys: Vec<UnitKey> = (0..4).map(block).collect();
    let source = RunSource::new(Duration::ZERO);
    let tiers = Tiers::new(vec![Arc::new(MemoryTier::new(1 << 20)), source.clone()]);
    let lead = tiers.flights.lead(keys[2].digest()).unwrap();
    let results = tiers.fetch_run(&block_wants(&keys));
    assert_eq!(results.len(), 2, "units 0 and 1 only: unit 2 is someone else's");
    assert_eq!(source.counts(), (1, 0));
    drop(lead);
}

#[test]
fn a_reader_of_a_unit_of_a_run_under_way_waits_for_the_run() {
    let keys: Vec<UnitKey> = (0..4).map(block).collect();
    let source = RunSource::new(Duration::from_millis(300));
    let tiers = Tiers::new(vec![Arc::new(MemoryTier::new(1 << 20)), source.clone()]);
    let wants = block_wants(&keys);
    std::thread::scope(|s| {
        let run = s.spawn(|| tiers.fetch_run(&wants));
        // Once the run has taken its units, a reader of unit 3 joins it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !tiers.in_flight(&keys[3].digest()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&tiers.fetch(&wants[3]).unwrap()[..], &block_bytes(3)[..]);
        assert_eq!(run.join().unwrap().len(), 4);
    });
    assert_eq!(source.counts(), (1, 0), "one request to the source in all");
}
