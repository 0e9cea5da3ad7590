//! Tests of the block store.

use super::*;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::sync::atomic::AtomicBool;

fn store(dir: &Path, limit: u64) -> Store {
    store_evicting(dir, limit, Eviction::S3Fifo)
}

fn store_evicting(dir: &Path, limit: u64, eviction: Eviction) -> Store {
    let db = Db::open(&dir.join("index.redb")).unwrap();
    let cfg = StoreConfig {
        dir: dir.join("objects"),
        block_size: 4096,
        limit,
        high_watermark: 1.0,
        low_watermark: 0.75,
        dedup: true,
        eviction,
    };
    Store::open(cfg, db).unwrap()
}

#[test]
fn fill_read_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(dir.path(), 1 << 20);
        assert!(s.read((1, 0), 0, 10).unwrap().is_none());
        s.fill((1, 0), &[7u8; 4096], 0).unwrap();
        s.fill((1, 1), &[9u8; 100], 0).unwrap();
        assert_eq!(s.read((1, 1), 10, 200).unwrap().unwrap(), vec![9u8; 90]);
        s.db().sync().unwrap();
    }
    let s = store(dir.path(), 1 << 20);
    assert_eq!(s.stats().bytes_used, 4196);
    assert_eq!(s.read((1, 0), 4090, 100).unwrap().unwrap(), vec![7u8; 6]);
}

fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
}

#[test]
fn a_one_block_file_sharing_a_content_keeps_no_state_of_its_own_until_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let entries = |s: &Store| s.shards.iter().map(|sh| lock(&sh.state).objects.len()).sum::<usize>();
    {
        let s = store(dir.path(), 1 << 20);
        for object in 1..=20 {
            s.fill_whole(object, &content(object as u8, 1000), 0).unwrap();
        }
        // A file of two blocks keeps its state in `objects`.
        s.fill_whole(21, &content(7, 5000), 0).unwrap();
        assert_eq!(entries(&s), 1, "one-block sharers keep their state on their block");
        assert_eq!(s.stats().dedup_files, 21);
        check_figures(&s);
        s.db().sync().unwrap();
    }
    let s = store(dir.path(), 1 << 20);
    assert_eq!(entries(&s), 1, "and so after a reopen");
    assert_eq!(s.stats().dedup_files, 21);
    check_figures(&s);
    // A change gives the file its own copy; a pin or an eviction keep the figures right.
    s.write(3, 10, b"changed").unwrap();
    s.set_pinned(4, true);
    assert_eq!(s.evict_object(5), 1000);
    check_figures(&s);
    let mut want = content(3, 1000);
    want[10..17].copy_from_slice(b"changed");
    assert_eq!(s.read((3, 0), 0, 1000).unwrap().unwrap(), want);
    assert_eq!(s.read((6, 0), 0, 1000).unwrap().unwrap(), content(6, 1000));
    assert_eq!(
        s.stats().dedup_files,
        19,
        "the changed and the evicted file share no more"
    );
}

#[test]
fn identical_small_files_share_one_copy_until_one_changes() {
    let dir = tempfile::tempdir().unwrap();
    let a = content(1, 10_000);
    let b = content(2, 10_000);
    {
        let s = store(dir.path(), 1 << 20);
        for object in 1..=3 {
            s.fill_whole(object, &a, 0).unwrap();
        }
        s.fill_whole(4, &b, 0).unwrap();
        let st = s.stats();
        assert_eq!(st.logical_bytes, 40_000);
        assert_eq!(st.bytes_used, 20_000, "three copies of one content are stored once");
        assert_eq!((st.dedup_contents, st.dedup_files), (2, 4));
        // Changing one sharer gives it its own copy; the others keep the old bytes.
        s.write(2, 0, b"changed").unwrap();
        s.commit(2, [0], 10_000).unwrap();
        assert_eq!(&s.read((2, 0), 0, 7).unwrap().unwrap(), b"changed");
        assert_eq!(s.read((1, 0), 0, 4096).unwrap().unwrap(), a[..4096]);
        assert_eq!(s.read((3, 2), 0, 4096).unwrap().unwrap(), a[8192..]);
        assert_eq!(s.stats().bytes_used, 30_000);
        s.db().sync().unwrap();
    }
    // Sharing, and the copy of its own, survive a restart.
    let s = store(dir.path(), 1 << 20);
    s.retain_objects(&[1, 2, 3, 4].into_iter().collect(), &dir.path().join("lost+found"));
    let st = s.stats();
    assert_eq!((st.logical_bytes, st.bytes_used), (40_000, 30_000));
    assert_eq!(s.read((3, 1), 0, 4096).unwrap().unwrap(), a[4096..8192]);
    assert_eq!(&s.read((2, 0), 0, 7).unwrap().unwrap(), b"changed");
    // The last sharer out takes the content with it.
    s.remove_object(1);
    s.remove_object(3);
    let st = s.stats();
    assert_eq!(
        (st.logical_bytes, st.bytes_used, st.dedup_contents),
        (20_000, 20_000, 1)
    );
    assert_eq!(std::fs::read_dir(dir.path().join("objects/cas")).unwrap().count(), 1);
}

#[test]
fn a_truncated_sharer_leaves_the_others_whole() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 1 << 20);
    let a = content(7, 9000);
    s.fill_whole(1, &a, 0).unwrap();
    s.fill_whole(2, &a, 0).unwrap();
    s.truncate(2, 100).unwrap();
    assert_eq!(s.read((1, 2), 0, 4096).unwrap().unwrap(), a[8192..]);
    assert_eq!(s.read((2, 0), 0, 4096).unwrap().unwrap(), a[..100]);
}

#[test]
fn a_small_file_is_evicted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 16 * 4096);
    // Three-block files, all different: the store holds five of them at most.
    for object in 1..=12u64 {
        s.fill_whole(object, &content(object as u8, 3 * 4096), 0).unwrap();
        for object in 1..=object {
            let present = (0..3).filter(|i| s.contains((object, *i))).count();
            assert!(
                present == 0 || present == 3,
                "object {object} is partly cached: {present} blocks"
            );
        }
    }
    assert!(s.stats().evictions > 0);
}

#[test]
fn pinned_blocks_are_never_evicted_and_the_pin_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(dir.path(), 8 * 4096);
        s.fill((1, 0), &[1u8; 4096], 0).unwrap();
        s.fill((1, 1), &[1u8; 4096], 0).unwrap();
        s.set_pinned(1, true);
        for i in 0..50 {
            s.fill((2, i), &[2u8; 4096], 0).unwrap();
        }
        assert!(s.contains((1, 0)) && s.contains((1, 1)), "a pinned block was evicted");
        assert_eq!(s.stats().bytes_pinned, 8192);
        assert_eq!(s.evict_object(1), 8192, "an explicit eviction drops pinned blocks too");
        s.fill((1, 0), &[1u8; 4096], 0).unwrap();
        s.db().sync().unwrap();
    }
    let s = store(dir.path(), 8 * 4096);
    assert!(s.pinned(1));
    for i in 0..50 {
        s.fill((3, i), &[3u8; 4096], 0).unwrap();
    }
    assert!(s.contains((1, 0)));
    s.set_pinned(1, false);
    for i in 50..100 {
        s.fill((3, i), &[3u8; 4096], 0).unwrap();
    }
    assert!(!s.contains((1, 0)), "an unpinned block is evicted like any other");
}

#[test]
fn whole_files_lie_together_in_eviction_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 1 << 30);
    assert_eq!(s.block_distance_now(1000), None);
    for object in 1..=4u64 {
        s.fill_whole(object, &content(object as u8, 3 * 4096), 0).unwrap();
    }
    assert_eq!(s.block_distance_now(1000), Some(1.0));
    // Blocks of two large files filled in turns lie two apart.
    for i in 0..4 {
        s.fill((10, i), &[1u8; 4096], 0).unwrap();
        s.fill((11, i), &[2u8; 4096], 0).unwrap();
    }
    let abd = s.block_distance_now(1000).unwrap();
    assert!((abd - (4.0 * 1.0 + 2.0 * 2.0) / 6.0).abs() < 1e-9, "{abd}");
}

#[test]
fn a_held_block_stays_through_an_unpin() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 8 * 4096);
    s.fill((1, 0), &[1u8; 4096], 0).unwrap();
    s.hold(1);
    s.set_pinned(1, true);
    s.set_pinned(1, false);
    for i in 0..50 {
        s.fill((2, i), &[2u8; 4096], 0).unwrap();
    }
    assert!(s.contains((1, 0)), "a held block was evicted after an unpin");
    s.unhold(1);
    for i in 50..100 {
        s.fill((2, i), &[2u8; 4096], 0).unwrap();
    }
    assert!(
        !s.contains((1, 0)),
        "a block neither pinned nor held is evicted like any other"
    );
}

#[test]
fn corrupt_block_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(dir.path(), 1 << 20);
        s.fill((5, 0), &[1u8; 4096], 0).unwrap();
        s.db().sync().unwrap();
    }
    let f = OpenOptions::new()
        .write(true)
        .open(dir.path().join("objects/05/0000000000000005"))
        .unwrap();
    f.write_all_at(b"garbage", 100).unwrap();
    let s = store(dir.path(), 1 << 20);
    assert!(s.read((5, 0), 0, 10).unwrap().is_none());
    assert_eq!(s.stats().corrupt_blocks, 1);
    assert_eq!(s.stats().bytes_used, 0);
}

#[test]
fn eviction_keeps_usage_under_limit_and_spares_dirty_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 10 * 4096);
    s.write(99, 0, &[3u8; 4096]).unwrap();
    for i in 0..40 {
        s.fill((1, i), &[i as u8; 4096], 0).unwrap();
        assert!(s.stats().bytes_used <= 10 * 4096);
    }
    assert!(s.contains((99, 0)), "dirty block was evicted");
    assert!(s.contains((1, 39)) && !s.contains((1, 0)));
    assert!(s.stats().evictions >= 30);
}

/// A store of 20 blocks for the harvester: it evicts from 10 blocks (the high watermark) down to 5 (the
/// low one). Not started.
fn store_for_harvest(dir: &Path, dedup: bool) -> Arc<Store> {
    let db = Db::open(&dir.join("index.redb")).unwrap();
    let cfg = StoreConfig {
        dir: dir.join("objects"),
        block_size: 4096,
        limit: 20 * 4096,
        high_watermark: 0.5,
        low_watermark: 0.25,
        dedup,
        eviction: Eviction::S3Fifo,
    };
    Arc::new(Store::open(cfg, db).unwrap())
}

#[test]
fn the_harvester_evicts_so_that_fills_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let s = store_for_harvest(dir.path(), true);
    s.start_harvester().unwrap();
    for i in 0..100 {
        s.fill((1, i), &[i as u8; 4096], 0).unwrap();
        assert!(s.stats().bytes_used <= 20 * 4096, "over the limit after fill {i}");
    }
    // Past the high watermark (10 blocks) the harvester evicts down to the low one (5 blocks), so usage
    // ends at most at the high watermark, and most blocks were evicted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.stats().bytes_used > 10 * 4096 {
        assert!(
            std::time::Instant::now() < deadline,
            "usage stays at {}",
            s.stats().bytes_used
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(s.stats().evictions >= 90, "{} evictions", s.stats().evictions);
    assert!(s.contains((1, 99)), "the newest block stays");
}

#[test]
fn the_harvester_shows_each_unit_while_it_is_still_readable_before_it_goes_and_fills_show_none() {
    let dir = tempfile::tempdir().unwrap();
    let s = store_for_harvest(dir.path(), false);
    // What the hook saw: each unit (its object and blocks), and whether every block could be read then.
    type Shown = (u64, Vec<u32>, bool);
    let seen: Arc<Mutex<Vec<Shown>>> = Arc::default();
    let (weak, log) = (Arc::downgrade(&s), seen.clone());
    s.set_departing(Arc::new(move |object, indexes| {
        let store = weak.upgrade().unwrap();
        let readable = indexes
            .iter()
            .all(|&i| store.read((object, i), 0, 16).unwrap().is_some());
        log.lock().unwrap().push((object, indexes.to_vec(), readable));
    }));
    // Inline eviction (no harvester) shows nothing.
    for i in 0..30 {
        s.fill((1, i), &[i as u8; 4096], 0).unwrap();
    }
    assert!(s.stats().evictions > 0);
    assert!(
        seen.lock().unwrap().is_empty(),
        "a fill's own eviction waited for the hook"
    );
    s.start_harvester().unwrap();
    // A whole small file (object 2, two blocks) and blocks of a large one (object 3).
    // Each fill waits for the harvester to catch up, so that no fill passes the limit and evicts itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let settle = || {
        while s.stats().bytes_used > 10 * 4096 {
            assert!(std::time::Instant::now() < deadline, "the harvester does not keep up");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    };
    settle();
    s.fill_whole(2, &[5u8; 6000], 0).unwrap();
    for i in 0..30 {
        s.fill((3, i), &[i as u8; 4096], 0).unwrap();
        settle();
    }
    assert!(
        seen.lock().unwrap().iter().any(|(o, _, _)| *o == 2),
        "the harvester never showed object 2"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|(_, _, readable)| *readable), "{seen:?}");
    let whole: Vec<_> = seen.iter().filter(|(o, _, _)| *o == 2).collect();
    assert_eq!(whole.len(), 1, "a whole unit is shown once: {whole:?}");
    let mut indexes = whole[0].1.clone();
    indexes.sort();
    assert_eq!(indexes, vec![0, 1], "a whole unit is shown with all its blocks");
    // Shown, then gone (nothing read them again).
    for (o, idx, _) in &seen {
        for &i in idx {
            assert!(!s.contains((*o, i)), "({o}, {i}) stayed after it was shown");
        }
    }
}

#[test]
fn blocks_read_again_survive_a_scan() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 40 * 4096);
    for i in 0..10 {
        s.fill((1, i), &[1u8; 4096], 0).unwrap();
        assert!(s.read((1, i), 0, 16).unwrap().is_some());
    }
    // One pass over 400 blocks never read again.
    for i in 0..400 {
        s.fill((2, i), &[2u8; 4096], 0).unwrap();
    }
    let kept = (0..10).filter(|i| s.contains((1, *i))).count();
    assert_eq!(kept, 10, "the blocks read again were pushed out by the scan");
}

#[test]
fn with_lru_a_scan_pushes_out_the_blocks_read_again() {
    // The baseline: the same workload as `blocks_read_again_survive_a_scan`, evicting in LRU order.
    let dir = tempfile::tempdir().unwrap();
    let s = store_evicting(dir.path(), 40 * 4096, Eviction::Lru);
    assert_eq!(s.stats().eviction, Eviction::Lru);
    for i in 0..10 {
        s.fill((1, i), &[1u8; 4096], 0).unwrap();
        assert!(s.read((1, i), 0, 16).unwrap().is_some());
    }
    for i in 0..400 {
        s.fill((2, i), &[2u8; 4096], 0).unwrap();
    }
    assert!((0..10).all(|i| !s.contains((1, i))), "LRU kept blocks through a scan");
    assert!(s.stats().bytes_used <= 40 * 4096);
    assert!(s.stats().evictions > 0);
}

#[test]
fn a_fill_fetched_before_a_local_change_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 1 << 20);
    let before = s.epoch(3);
    s.write(3, 0, &[8u8; 100]).unwrap();
    s.fill((3, 0), &[1u8; 4096], before).unwrap();
    assert_eq!(
        s.read((3, 0), 0, 100).unwrap().unwrap(),
        vec![8u8; 100],
        "the local write wins"
    );
    let before = s.epoch(4);
    s.truncate(4, 0).unwrap();
    s.fill((4, 0), &[1u8; 4096], before).unwrap();
    assert!(!s.contains((4, 0)), "no stale block after a truncate");
    let before = s.epoch(6);
    s.remove_object(6);
    s.fill((6, 0), &[1u8; 4096], before).unwrap();
    assert!(
        !dir.path().join("objects/06/0000000000000006").exists(),
        "a removed object stays removed"
    );
}

#[test]
fn truncate_keeps_the_prefix_of_the_last_block() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 1 << 20);
    s.fill((2, 0), &[1u8; 4096], 0).unwrap();
    s.fill((2, 1), &[2u8; 4096], 0).unwrap();
    s.truncate(2, 5000).unwrap();
    assert_eq!(s.stats().bytes_used, 5000);
    assert_eq!(s.read((2, 1), 0, 4096).unwrap().unwrap(), vec![2u8; 904]);
    s.truncate(2, 100).unwrap();
    assert!(!s.contains((2, 1)));
    s.remove_object(2);
    assert_eq!(s.stats().bytes_used, 0);
}

/// Pauses the store at the points `want` accepts: each one is reported on the returned receiver, and the
/// paused thread goes on when it is sent a `()`.
fn pause_at(
    s: &Store,
    want: impl Fn(Pause) -> bool + Send + Sync + 'static,
) -> (std::sync::mpsc::Receiver<Pause>, std::sync::mpsc::Sender<()>) {
    let (at_tx, at_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (at_tx, go_rx) = (Mutex::new(at_tx), Mutex::new(go_rx));
    *lock(&s.hook) = Some(Arc::new(move |at: Pause| {
        if want(at) {
            at_tx.lock().unwrap().send(at).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        }
    }));
    (at_rx, go_tx)
}

/// Until `done` has finished, or some thread waits for a fill to end.
fn until_waiting_or_finished(s: &Store, done: &std::thread::JoinHandle<()>) {
    while s.shards.iter().all(|shard| lock(&shard.state).waiting == 0) && !done.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn file_bytes(dir: &Path, object: u64) -> Vec<u8> {
    std::fs::read(dir.join(format!("objects/{:02x}/{object:016x}", object & 0xff))).unwrap()
}

#[test]
fn a_write_to_a_block_being_filled_ends_with_the_writes_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    let (at, go) = pause_at(&s, |at| matches!(at, Pause::Fill(_)));
    let epoch = s.epoch(1);
    let filler = {
        let s = s.clone();
        std::thread::spawn(move || s.fill((1, 0), &[1u8; 4096], epoch).unwrap())
    };
    // The fill has reserved the block and not written it yet.
    assert_eq!(at.recv().unwrap(), Pause::Fill((1, 0)));
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || s.write(1, 0, &[2u8; 4096]).unwrap())
    };
    until_waiting_or_finished(&s, &writer);
    go.send(()).unwrap();
    filler.join().unwrap();
    writer.join().unwrap();
    assert_eq!(
        s.read((1, 0), 0, 4096).unwrap().unwrap(),
        vec![2u8; 4096],
        "the write's bytes"
    );
    assert_eq!(file_bytes(dir.path(), 1), vec![2u8; 4096]);
    assert!(s.state(1).blocks[&(1, 0)].dirty);
}

#[test]
fn a_truncate_or_removal_of_a_block_being_filled_waits_for_the_fill() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    s.fill((1, 0), &[1u8; 4096], 0).unwrap();
    let (at, go) = pause_at(&s, |at| matches!(at, Pause::Fill(_)));
    for change in ["truncate", "remove"] {
        let epoch = s.epoch(1);
        let filler = {
            let s = s.clone();
            std::thread::spawn(move || s.fill((1, 1), &[3u8; 4096], epoch).unwrap())
        };
        assert_eq!(at.recv().unwrap(), Pause::Fill((1, 1)));
        let changer = {
            let s = s.clone();
            std::thread::spawn(move || match change {
                "truncate" => s.truncate(1, 100).unwrap(),
                _ => s.remove_object(1),
            })
        };
        until_waiting_or_finished(&s, &changer);
        go.send(()).unwrap();
        filler.join().unwrap();
        changer.join().unwrap();
        assert!(!s.contains((1, 1)), "{change}: the block filled meanwhile is gone");
        if change == "truncate" {
            assert_eq!(file_bytes(dir.path(), 1), vec![1u8; 100], "{change}: the file is cut");
        } else {
            assert!(!dir.path().join("objects/01/0000000000000001").exists(), "{change}");
        }
    }
}

/// A small xorshift generator: the stress tests need no more.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const BS: usize = 4096;

/// Home's bytes of block `index` of `object`: never constant, so never those of a local write.
fn home(object: u64, index: u32) -> Vec<u8> {
    content((object * 16 + index as u64) as u8, BS)
}

/// The bytes of an object's blocks written here and not pushed, by block.
type Local = Mutex<BTreeMap<u32, Vec<u8>>>;

/// Every present block's bytes against `local` (the bytes written here and not pushed, by object and
/// block; any other block must hold home's bytes), and clean blocks' checksums against their bytes.
fn check_blocks(s: &Store, local: &[Local]) {
    for shard in &s.shards {
        check_shard(s, &lock(&shard.state), local);
    }
}

fn check_shard(s: &Store, st: &ShardState, local: &[Local]) {
    assert!(st.filling.is_empty() && st.changing.is_empty() && st.waiting == 0);
    for (&(object, index), e) in &st.blocks {
        let file = s.file_locked(st, object).unwrap();
        let mut bytes = vec![0u8; e.len as usize];
        read_upto(&file, &mut bytes, index as u64 * BS as u64).unwrap();
        let mine = local[object as usize].lock().unwrap().get(&index).cloned();
        match mine {
            Some(mine) => {
                assert!(e.dirty, "block {object}/{index} holds a local write and is clean");
                assert!(
                    bytes == mine,
                    "block {object}/{index} lost a local write: len {} vs {}, first {:?} vs {:?}, home {}, diff at {:?}, shared {:?}",
                    bytes.len(),
                    mine.len(),
                    &bytes[..8.min(bytes.len())],
                    &mine[..8.min(mine.len())],
                    bytes == home(object, index)[..bytes.len()],
                    bytes.iter().zip(&mine).position(|(a, b)| a != b),
                    st.meta(object).content
                );
            }
            None => {
                assert!(!e.dirty, "block {object}/{index} is dirty with no local write");
                assert!(
                    bytes == home(object, index)[..bytes.len()],
                    "block {object}/{index} is not home's"
                );
                assert_eq!(e.crc, crc32c::crc32c(&bytes), "block {object}/{index}: checksum");
            }
        }
    }
}

#[test]
fn fills_racing_local_changes_never_overwrite_them() {
    const OBJECTS: u64 = 3;
    const BLOCKS: u32 = 4;
    let dir = tempfile::tempdir().unwrap();
    // Room for about half the blocks: eviction runs all along.
    let s = Arc::new(store(dir.path(), 6 * BS as u64));
    // Widen the windows between a fill's reservation and its write, and between a block's drop and its
    // hole punch.
    *lock(&s.hook) = Some(Arc::new(|at: Pause| {
        if matches!(at, Pause::Fill(_) | Pause::Punch(_)) {
            std::thread::yield_now();
        }
    }));
    // Object 0 is unused. Each object's local changes and its model move together under its mutex (as the
    // file system's own locks order a file's changes); fills take no lock.
    let local: Arc<Vec<Local>> = Arc::new((0..=OBJECTS).map(|_| Mutex::new(BTreeMap::new())).collect());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (s, local) = (s.clone(), local.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t + 1) * 0x1234_5678_9abc));
                for op in 0..1500u64 {
                    let object = 1 + rng.below(OBJECTS);
                    let index = rng.below(BLOCKS as u64) as u32;
                    let key = (object, index);
                    let tag = (1 + (op * 4 + t) % 255) as u8;
                    match rng.below(100) {
                        0..=44 => {
                            let epoch = s.epoch(object);
                            s.fill(key, &home(object, index), epoch).unwrap();
                        }
                        45..=49 => {
                            let epoch = s.epoch(object);
                            let whole: Vec<u8> = (0..BLOCKS).flat_map(|i| home(object, i)).collect();
                            s.fill_whole(object, &whole, epoch).unwrap();
                        }
                        50..=69 => {
                            let mut mine = local[object as usize].lock().unwrap();
                            s.write(object, index as u64 * BS as u64, &[tag; BS]).unwrap();
                            mine.insert(index, vec![tag; BS]);
                        }
                        70..=79 => {
                            // Change the start of a present block (claimed first, as a partial write is).
                            let mut mine = local[object as usize].lock().unwrap();
                            if !s.claim(key).unwrap() {
                                continue;
                            }
                            let mut bytes = match mine.get(&index) {
                                Some(b) => b.clone(),
                                None => {
                                    let len = s.state(object).blocks[&key].len as usize;
                                    home(object, index)[..len].to_vec()
                                }
                            };
                            let n = bytes.len().min(64);
                            bytes[..n].fill(tag);
                            s.write(object, index as u64 * BS as u64, &bytes[..n]).unwrap();
                            mine.insert(index, bytes);
                        }
                        80..=86 => {
                            let mut mine = local[object as usize].lock().unwrap();
                            // At a block's start or 1000 bytes into it: a block cut short is always cut at
                            // the same length, so a clean one holds home's bytes (cut at another length and
                            // then at a longer one, it would read as zeros in between).
                            let size = rng.below(BLOCKS as u64 + 1) * BS as u64 + rng.below(2) * 1000;
                            s.truncate(object, size).unwrap();
                            mine.retain(|i, _| (*i as u64) < size.div_ceil(BS as u64));
                            // The block holding the new end is indexed at its new length: past its old one
                            // (the file cut there before, or a hole) it reads as zeros.
                            if let Some(b) = mine.get_mut(&((size / BS as u64) as u32)) {
                                b.resize(size as usize % BS, 0);
                            }
                        }
                        87..=89 => {
                            let mut mine = local[object as usize].lock().unwrap();
                            s.remove_object(object);
                            mine.clear();
                        }
                        90..=94 => {
                            // Committed at the full size: a block cut short reads on as zeros.
                            let mut mine = local[object as usize].lock().unwrap();
                            let blocks: Vec<u32> = mine.keys().copied().collect();
                            s.commit(object, blocks, BLOCKS as u64 * BS as u64).unwrap();
                            for b in mine.values_mut() {
                                b.resize(BS, 0);
                            }
                        }
                        _ => {
                            let mine = local[object as usize].lock().unwrap();
                            let got = s.read(key, 0, BS).unwrap();
                            if let Some(want) = mine.get(&index) {
                                // A read stops where the file ends, and a block cut short reads on as zeros
                                // where the file goes on: the bytes past the shorter of the two are zeros.
                                let got = got.unwrap_or_else(|| panic!("{key:?} is dirty and missing"));
                                let n = got.len().min(want.len());
                                assert!(
                                    got[..n] == want[..n],
                                    "a read of {key:?} lost a local write: len {} vs {}, diff at {:?}, got {:?} want {:?}, home {:?}, entry {:?}",
                                    got.len(), want.len(),
                                    got.iter().zip(want.iter()).position(|(a, b)| a != b),
                                    &&got[100.min(n)..108.min(n)], &want[100.min(n)..108.min(n)], &home(object, index)[100..108],
                                    s.state(object).blocks.get(&key).map(|e| (e.len, e.dirty, e.crc))
                                );
                                assert!(got[n..].iter().chain(&want[n..]).all(|&b| b == 0), "{key:?}");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    check_blocks(&s, &local);
    assert!(s.stats().evictions > 0);
}

#[test]
fn a_block_written_while_it_is_indexed_is_indexed_with_its_new_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    let armed = Arc::new(AtomicBool::new(false));
    let (at, go) = {
        let armed = armed.clone();
        pause_at(&s, move |at| {
            at == Pause::Index(1) && armed.swap(false, Ordering::SeqCst)
        })
    };
    for dirty in [true, false] {
        s.write(1, 0, &[1u8; BS]).unwrap();
        if !dirty {
            // (A commit indexes a written block once: committed already, it is not read again.)
            s.commit(1, [0], BS as u64).unwrap();
        }
        armed.store(true, Ordering::SeqCst);
        let indexer = {
            let s = s.clone();
            std::thread::spawn(move || {
                if dirty {
                    s.commit(1, [0], BS as u64).unwrap()
                } else {
                    s.mark_clean(1, [0], BS as u64)
                }
            })
        };
        // It has read the block's old bytes, and recorded nothing yet.
        assert_eq!(at.recv().unwrap(), Pause::Index(1));
        s.write(1, 0, &[2u8; BS]).unwrap();
        go.send(()).unwrap();
        indexer.join().unwrap();
        let st = s.state(1);
        let e = &st.blocks[&(1, 0)];
        assert_eq!(e.dirty, dirty);
        assert_eq!(
            e.crc,
            crc32c::crc32c(&[2u8; BS]),
            "dirty: {dirty}: the checksum of the bytes read before"
        );
        drop(st);
        s.remove_object(1);
    }
}

#[test]
fn indexing_racing_writes_records_the_checksums_of_the_bytes_written() {
    const BLOCKS: u32 = 8;
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    // Widen the window between reading blocks to index and recording them.
    *lock(&s.hook) = Some(Arc::new(|at: Pause| {
        if matches!(at, Pause::Index(_)) {
            std::thread::yield_now();
        }
    }));
    let size = BLOCKS as u64 * BS as u64;
    // Two writers of one object, each writing its own half and indexing after every write: the whole file
    // (a commit) or the block just written (marked clean, as after a push). Each checks after every
    // indexing that its blocks' checksums are those of the bytes it wrote last: the other's commits index
    // them too, concurrently. A third reads.
    let writers: Vec<_> = (0..2u32)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(0x2545_f491_4f6c_dd1d + t as u64);
                let mut mine: BTreeMap<u32, u8> = BTreeMap::new();
                for op in 0..2000u32 {
                    let index = t * BLOCKS / 2 + rng.below(BLOCKS as u64 / 2) as u32;
                    let tag = (1 + (op * 2 + t) % 255) as u8;
                    s.write(1, index as u64 * BS as u64, &[tag; BS]).unwrap();
                    mine.insert(index, tag);
                    if rng.below(2) == 0 {
                        s.commit(1, 0..BLOCKS, size).unwrap();
                    } else {
                        s.mark_clean(1, [index], size);
                    }
                    let st = s.state(1);
                    for (&index, &tag) in &mine {
                        let crc = st.blocks.get(&(1, index)).map(|e| e.crc);
                        assert_eq!(crc, Some(crc32c::crc32c(&[tag; BS])), "block {index}, op {op}");
                    }
                }
            })
        })
        .collect();
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(7);
            for _ in 0..2000 {
                let _ = s.read((1, rng.below(BLOCKS as u64) as u32), 0, BS).unwrap();
            }
        })
    };
    for t in writers {
        t.join().unwrap();
    }
    reader.join().unwrap();
    let st = s.state(1);
    let file = s.file_locked(&st, 1).unwrap();
    for (&(_, index), e) in st.blocks_of(1) {
        let mut bytes = vec![0u8; e.len as usize];
        read_upto(&file, &mut bytes, index as u64 * BS as u64).unwrap();
        assert_eq!(e.crc, crc32c::crc32c(&bytes), "block {index} (dirty: {})", e.dirty);
    }
}

#[test]
fn a_read_whose_block_is_dropped_before_it_reads_the_bytes_is_a_miss_not_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    s.fill((1, 0), &[7u8; 4096], 0).unwrap();
    // Verified once, so the next read takes the unlocked path.
    assert_eq!(s.read((1, 0), 0, 4096).unwrap().unwrap(), vec![7u8; 4096]);
    let (at, go) = pause_at(&s, |at| matches!(at, Pause::Read(_)));
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || s.read((1, 0), 0, 4096).unwrap())
    };
    assert_eq!(at.recv().unwrap(), Pause::Read((1, 0)));
    // Dropped (its bytes punched out) between the reader's look and its pread.
    *lock(&s.hook) = None;
    s.truncate(1, 0).unwrap();
    go.send(()).unwrap();
    let got = reader.join().unwrap();
    assert!(
        got.is_none(),
        "a dropped block's bytes were served ({:?} bytes)",
        got.map(|b| b.len())
    );
}

#[test]
fn a_hit_of_one_object_does_not_wait_for_the_lock_of_another_objects_shard() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    let (a, b) = (1u64, 2u64);
    assert_ne!(shard_of(a), shard_of(b), "the test needs objects in different shards");
    s.fill((b, 0), &[5u8; 4096], 0).unwrap();
    // A's shard is locked, as by a long operation of A (an unshare's copy, a small file's whole fill).
    let held = s.state(a);
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || {
            // More hits than a touch buffer holds: passing them to the policy waits for no other shard.
            let mut got = None;
            for _ in 0..2 * TOUCH_BATCH {
                got = s.read((b, 0), 0, 4096).unwrap();
            }
            let stats = s.stats();
            let _ = tx.send((got, stats.hits, stats.blocks));
        })
    };
    let done = rx.recv_timeout(std::time::Duration::from_secs(5));
    drop(held);
    reader.join().unwrap();
    let (got, hits, blocks) = done.expect("the hit waited for another object's shard lock");
    assert_eq!(got, Some(vec![5u8; 4096]));
    assert_eq!((hits, blocks), (2 * TOUCH_BATCH as u64, 1));
}

#[test]
fn hits_buffered_in_one_shard_protect_its_blocks_from_a_scan_of_another() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 40 * 4096);
    let (reread, scanned) = (1u64, 2u64);
    assert_ne!(
        shard_of(reread),
        shard_of(scanned),
        "the test needs objects in different shards"
    );
    for i in 0..10 {
        s.fill((reread, i), &[1u8; 4096], 0).unwrap();
    }
    for i in 0..10 {
        assert!(s.read((reread, i), 0, 16).unwrap().is_some());
    }
    // The hits are still in their shard's buffer, not in the policy: eviction must pass them on first.
    assert_eq!(s.state(reread).touched.len(), 10);
    for i in 0..400 {
        s.fill((scanned, i), &[2u8; 4096], 0).unwrap();
    }
    assert!(s.stats().evictions > 0);
    let kept = (0..10).filter(|i| s.contains((reread, *i))).count();
    assert_eq!(
        kept, 10,
        "the blocks read again were pushed out by a scan of another shard"
    );
    // Readers of the eviction order see the buffered hits too.
    s.read((reread, 0), 0, 16).unwrap().unwrap();
    assert_eq!(s.state(reread).touched.len(), 1);
    s.block_distance_now(1000);
    assert!(s.shards.iter().all(|shard| lock(&shard.state).touched.is_empty()));
}

#[test]
fn a_victim_that_changes_before_eviction_locks_its_shard_stays() {
    for change in ["write", "pin", "hold"] {
        let dir = tempfile::tempdir().unwrap();
        // Eviction starts past 8 blocks and stops at 6.
        let s = Arc::new(store(dir.path(), 8 * BS as u64));
        for i in 0..8 {
            s.fill((1, i), &home(1, i), 0).unwrap();
        }
        let armed = Arc::new(AtomicBool::new(true));
        let (at, go) = {
            let armed = armed.clone();
            pause_at(&s, move |at| {
                matches!(at, Pause::Evict(_)) && armed.swap(false, Ordering::SeqCst)
            })
        };
        let filler = {
            let s = s.clone();
            std::thread::spawn(move || s.fill((2, 0), &home(2, 0), 0).unwrap())
        };
        // The fill's eviction has taken its first victim from the policy and not yet locked its shard.
        let Pause::Evict(victim) = at.recv().unwrap() else {
            unreachable!()
        };
        assert_eq!(victim.0, 1);
        match change {
            "write" => {
                assert!(s.claim(victim).unwrap());
                s.write(1, victim.1 as u64 * BS as u64, &[9u8; 100]).unwrap();
            }
            "pin" => s.set_pinned(1, true),
            _ => s.hold(1),
        }
        go.send(()).unwrap();
        filler.join().unwrap();
        assert!(s.contains(victim), "{change}: the victim was evicted after it changed");
        let mut want = home(1, victim.1);
        if change == "write" {
            want[..100].fill(9);
            assert!(s.state(1).blocks[&victim].dirty);
        }
        assert_eq!(s.read(victim, 0, BS).unwrap().unwrap(), want, "{change}");
        check_figures(&s);
    }
}

/// The store's running figures against a recount from the blocks present, and the policy against the
/// blocks it may evict (with no operation under way).
fn check_figures(s: &Store) {
    let (mut used, mut logical, mut dirty, mut pinned, mut blocks, mut objects) = (0, 0, 0, 0, 0, 0);
    let mut candidates = HashMap::new();
    let mut sharers = 0;
    for shard in &s.shards {
        let st = lock(&shard.state);
        assert!(st.filling.is_empty() && st.changing.is_empty() && st.waiting == 0);
        objects += st.objects_with_blocks().count() as u64;
        for (&key, e) in &st.blocks {
            let meta = st.meta(key.0);
            let len = e.len as u64;
            logical += len;
            blocks += 1;
            if meta.content.is_none() {
                used += len;
            }
            if e.dirty {
                dirty += len;
            }
            if meta.pinned {
                pinned += len;
            }
            if !e.dirty && st.evictable(key.0) {
                candidates.insert(key, len);
            }
        }
        sharers += st
            .objects_with_blocks()
            .filter(|o| st.meta(*o).content.is_some())
            .count() as u64;
        // A shared mark only on the one block of an object with no entry of its own, whose key it is.
        for (&(o, i), e) in &st.blocks {
            if e.shared {
                assert!(
                    i == 0 && !st.objects.contains_key(&o) && st.blocks_of(o).count() == 1,
                    "{o}/{i}"
                );
            }
        }
    }
    let contents = lock(&s.contents);
    used += contents.refs.keys().map(|k| k.0 as u64).sum::<u64>();
    assert_eq!(contents.shares, sharers, "sharers");
    assert_eq!(contents.refs.values().map(|&n| n as u64).sum::<u64>(), sharers);
    drop(contents);
    let stats = s.stats();
    assert_eq!(
        (
            stats.bytes_used,
            stats.logical_bytes,
            stats.bytes_dirty,
            stats.bytes_pinned
        ),
        (used, logical, dirty, pinned),
        "used, logical, dirty, pinned"
    );
    assert_eq!((stats.blocks, stats.objects), (blocks, objects), "blocks, objects");
    let policy = lock(&s.policy);
    assert_eq!(policy.stats().units, candidates.len() as u64, "units in the policy");
    assert_eq!(policy.bytes(), candidates.values().sum::<u64>(), "bytes in the policy");
    assert!(
        candidates.keys().all(|k| policy.contains(k)),
        "a clean block out of the policy"
    );
}

#[test]
fn operations_on_objects_in_many_shards_racing_keep_blocks_and_figures_true() {
    // Pairs of objects 16 apart have the same home bytes (`home` wraps), so whole fills share contents
    // across shards.
    const OBJECTS: [u64; 8] = [1, 2, 3, 4, 17, 18, 19, 20];
    const BLOCKS: u32 = 4;
    let shards: HashSet<usize> = OBJECTS.iter().map(|&o| shard_of(o)).collect();
    assert_eq!(
        shards.len(),
        OBJECTS.len(),
        "the test wants each object in a shard of its own"
    );
    let dir = tempfile::tempdir().unwrap();
    // Room for under two thirds of the 32 blocks, dirty ones included: eviction runs all along, by the
    // filling threads, and clean whole files still stay long enough to share their contents.
    let s = Arc::new(store(dir.path(), 20 * BS as u64));
    // Widen the windows between a fill's reservation and its write, between eviction's choice of a victim
    // and its look under the victim's shard lock, and between a block's drop and its hole punch.
    *lock(&s.hook) = Some(Arc::new(|at: Pause| {
        if matches!(at, Pause::Fill(_) | Pause::Evict(_) | Pause::Punch(_)) {
            std::thread::yield_now();
        }
    }));
    // As in `fills_racing_local_changes_never_overwrite_them`: each object's local changes and its model
    // move together under its mutex; fills, reads and evictions take none.
    let local: Arc<Vec<Local>> = Arc::new((0..=20).map(|_| Mutex::new(BTreeMap::new())).collect());
    // Every object starts whole, sharing its content with the object 16 apart (in another shard).
    for object in OBJECTS {
        let whole: Vec<u8> = (0..BLOCKS).flat_map(|i| home(object, i)).collect();
        s.fill_whole(object, &whole, 0).unwrap();
    }
    let stats = s.stats();
    assert_eq!((stats.dedup_contents, stats.dedup_files), (4, 8));
    check_figures(&s);
    let start = std::time::Instant::now();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (s, local) = (s.clone(), local.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x5851_f42d_4c95_7f2d ^ ((t + 1) * 0x9876_5432_10fe));
                for op in 0..1500u64 {
                    let object = OBJECTS[rng.below(OBJECTS.len() as u64) as usize];
                    let index = rng.below(BLOCKS as u64) as u32;
                    let key = (object, index);
                    let tag = (1 + (op * 4 + t) % 255) as u8;
                    match rng.below(100) {
                        0..=34 => {
                            let epoch = s.epoch(object);
                            s.fill(key, &home(object, index), epoch).unwrap();
                        }
                        35..=42 => {
                            let epoch = s.epoch(object);
                            let whole: Vec<u8> = (0..BLOCKS).flat_map(|i| home(object, i)).collect();
                            s.fill_whole(object, &whole, epoch).unwrap();
                        }
                        43..=57 => {
                            let mut mine = local[object as usize].lock().unwrap();
                            s.write(object, index as u64 * BS as u64, &[tag; BS]).unwrap();
                            mine.insert(index, vec![tag; BS]);
                        }
                        58..=64 => {
                            let mut mine = local[object as usize].lock().unwrap();
                            let size = rng.below(BLOCKS as u64 + 1) * BS as u64 + rng.below(2) * 1000;
                            s.truncate(object, size).unwrap();
                            mine.retain(|i, _| (*i as u64) < size.div_ceil(BS as u64));
                            if let Some(b) = mine.get_mut(&((size / BS as u64) as u32)) {
                                b.resize(size as usize % BS, 0);
                            }
                        }
                        65..=68 => {
                            let mut mine = local[object as usize].lock().unwrap();
                            s.remove_object(object);
                            mine.clear();
                        }
                        69..=74 => {
                            // Clean blocks only: the model's are all dirty.
                            s.evict_object(object);
                        }
                        75..=77 => {
                            let pinned = s.pinned(object);
                            s.set_pinned(object, !pinned);
                        }
                        78..=82 => {
                            let mut mine = local[object as usize].lock().unwrap();
                            let blocks: Vec<u32> = mine.keys().copied().collect();
                            s.commit(object, blocks, BLOCKS as u64 * BS as u64).unwrap();
                            for b in mine.values_mut() {
                                b.resize(BS, 0);
                            }
                        }
                        _ => {
                            let mine = local[object as usize].lock().unwrap();
                            let got = s.read(key, 0, BS).unwrap();
                            if let Some(want) = mine.get(&index) {
                                let got = got.unwrap_or_else(|| panic!("{key:?} is dirty and missing"));
                                let n = got.len().min(want.len());
                                assert!(got[..n] == want[..n], "a read of {key:?} lost a local write");
                                assert!(got[n..].iter().chain(&want[n..]).all(|&b| b == 0), "{key:?}");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(start.elapsed() < std::time::Duration::from_secs(60));
    // Nothing pinned any more: eviction may take every clean block, and the figures follow.
    for object in OBJECTS {
        s.set_pinned(object, false);
    }
    check_blocks(&s, &local);
    check_figures(&s);
    let stats = s.stats();
    assert!(stats.evictions > 0, "{stats:?}");
    s.evict_to(0, usize::MAX, false);
    let stats = s.stats();
    assert_eq!(
        (stats.bytes_used, stats.bytes_dirty),
        (stats.bytes_dirty, stats.bytes_dirty)
    );
    check_figures(&s);
}

/// Pauses the store at the points `want` accepts, each on its own: each is reported by `next`, and the
/// thread paused there goes on when it is released.
struct Gates {
    arrived: std::sync::mpsc::Receiver<Pause>,
    open: Arc<Mutex<HashMap<Pause, std::sync::mpsc::Sender<()>>>>,
}

impl Gates {
    fn new(s: &Store, want: impl Fn(Pause) -> bool + Send + Sync + 'static) -> Gates {
        let (at_tx, arrived) = std::sync::mpsc::channel();
        let at_tx = Mutex::new(at_tx);
        let open: Arc<Mutex<HashMap<Pause, std::sync::mpsc::Sender<()>>>> = Arc::default();
        let gates = open.clone();
        *lock(&s.hook) = Some(Arc::new(move |at: Pause| {
            if want(at) {
                let (go_tx, go_rx) = std::sync::mpsc::channel();
                gates.lock().unwrap().insert(at, go_tx);
                at_tx.lock().unwrap().send(at).unwrap();
                go_rx.recv().unwrap();
            }
        }));
        Gates { arrived, open }
    }

    /// The next point a thread is paused at.
    fn next(&self) -> Pause {
        self.arrived
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("no thread reached a pause point")
    }

    fn release(&self, at: Pause) {
        self.open.lock().unwrap().remove(&at).unwrap().send(()).unwrap();
    }
}

/// Another object of `object`'s shard.
fn same_shard_as(object: u64) -> u64 {
    (object + 1..).find(|&o| shard_of(o) == shard_of(object)).unwrap()
}

#[test]
fn hits_of_a_shard_do_not_wait_for_its_hole_punches_and_a_block_being_punched_is_a_miss() {
    for how in ["evict_object", "evict_to"] {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(store(dir.path(), 1 << 20));
        let (a, b) = (1u64, same_shard_as(1));
        s.fill((a, 0), &[1u8; BS], 0).unwrap();
        s.fill((b, 0), &[2u8; BS], 0).unwrap();
        let gates = Gates::new(&s, |at| matches!(at, Pause::Punch(_)));
        let evictor = {
            let s = s.clone();
            std::thread::spawn(move || match how {
                "evict_object" => assert_eq!(s.evict_object(a), BS as u64),
                _ => {
                    s.evict_to(0, 1, false);
                }
            })
        };
        // A block has been dropped, and its hole is not punched yet.
        let Pause::Punch(victim) = gates.next() else {
            unreachable!()
        };
        let (other, want) = if victim == (a, 0) { ((b, 0), 2u8) } else { ((a, 0), 1u8) };
        assert_eq!(victim.1, 0, "{how}");
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let s = s.clone();
            std::thread::spawn(move || {
                // More hits than a touch buffer holds: passing them to the policy waits for no punch.
                let mut got = None;
                for _ in 0..2 * TOUCH_BATCH {
                    got = s.read(other, 0, BS).unwrap();
                }
                let punched = s.read(victim, 0, BS).unwrap();
                let _ = tx.send((got, punched));
            })
        };
        let done = rx.recv_timeout(std::time::Duration::from_secs(5));
        let (got, punched) = done.unwrap_or_else(|_| panic!("{how}: a hit waited for a hole punch of its shard"));
        assert_eq!(got, Some(vec![want; BS]), "{how}: the other block");
        assert!(
            punched.is_none(),
            "{how}: the block being punched was served ({:?} bytes)",
            punched.map(|b| b.len())
        );
        reader.join().unwrap();
        gates.release(Pause::Punch(victim));
        evictor.join().unwrap();
        assert_eq!(s.read(victim, 0, BS).unwrap(), None, "{how}");
        assert!(s.read(other, 0, BS).unwrap().is_some(), "{how}");
        assert_eq!(s.allocated_blocks(victim.0), 0, "{how}: the hole was punched");
        check_figures(&s);
    }
}

#[test]
fn a_read_that_looked_before_a_drop_and_reads_after_its_punch_is_a_miss_not_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    s.fill((1, 0), &[7u8; BS], 0).unwrap();
    assert_eq!(s.read((1, 0), 0, BS).unwrap().unwrap(), vec![7u8; BS]);
    let gates = Gates::new(&s, |at| matches!(at, Pause::Read(_) | Pause::Punch(_)));
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || s.read((1, 0), 0, BS).unwrap())
    };
    // The reader has looked at the block under the lock, and not read its bytes yet.
    assert_eq!(gates.next(), Pause::Read((1, 0)));
    let evictor = {
        let s = s.clone();
        std::thread::spawn(move || s.evict_object(1))
    };
    assert_eq!(gates.next(), Pause::Punch((1, 0)));
    // The hole is punched and the block released before the reader reads.
    gates.release(Pause::Punch((1, 0)));
    assert_eq!(evictor.join().unwrap(), BS as u64);
    assert_eq!(s.allocated_blocks(1), 0, "the hole was punched");
    gates.release(Pause::Read((1, 0)));
    let got = reader.join().unwrap();
    assert!(
        got.is_none(),
        "a punched block's hole was served ({:?} bytes)",
        got.map(|b| b.len())
    );
    check_figures(&s);
}

#[test]
fn a_fill_or_write_of_a_block_being_punched_waits_for_the_punch_and_keeps_its_bytes() {
    for change in ["fill", "write"] {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(store(dir.path(), 1 << 20));
        s.fill((1, 0), &[1u8; BS], 0).unwrap();
        let gates = Gates::new(&s, |at| matches!(at, Pause::Punch(_)));
        let evictor = {
            let s = s.clone();
            std::thread::spawn(move || assert_eq!(s.evict_object(1), BS as u64))
        };
        assert_eq!(gates.next(), Pause::Punch((1, 0)));
        let epoch = s.epoch(1);
        let changer = {
            let s = s.clone();
            std::thread::spawn(move || match change {
                "fill" => s.fill((1, 0), &[3u8; BS], epoch).unwrap(),
                _ => s.write(1, 0, &[4u8; BS]).unwrap(),
            })
        };
        until_waiting_or_finished(&s, &changer);
        let waited = !changer.is_finished();
        gates.release(Pause::Punch((1, 0)));
        evictor.join().unwrap();
        changer.join().unwrap();
        let want = vec![if change == "fill" { 3u8 } else { 4u8 }; BS];
        let got = s.read((1, 0), 0, BS).unwrap();
        assert!(
            got.as_ref() == Some(&want),
            "{change}: the punch landed on the new bytes: read {:?}",
            got.map(|b| (b.len(), b.iter().filter(|&&x| x == 0).count()))
        );
        assert!(file_bytes(dir.path(), 1) == want, "{change}: the file's bytes");
        assert!(waited, "{change}: it did not wait for the punch");
        assert_eq!(s.state(1).blocks[&(1, 0)].dirty, change == "write");
        check_figures(&s);
    }
}

#[test]
fn a_punch_that_unwinds_still_punches_and_releases_its_block() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(store(dir.path(), 1 << 20));
    s.fill((1, 0), &[1u8; BS], 0).unwrap();
    *lock(&s.hook) = Some(Arc::new(|at: Pause| {
        if matches!(at, Pause::Punch(_)) {
            panic!("unwinding at {at:?}");
        }
    }));
    let evictor = {
        let s = s.clone();
        std::thread::spawn(move || s.evict_object(1))
    };
    assert!(evictor.join().is_err());
    *lock(&s.hook) = None;
    assert!(s.state(1).filling.is_empty(), "the block stays reserved");
    assert_eq!(s.allocated_blocks(1), 0, "the hole was not punched");
    check_figures(&s);
    let epoch = s.epoch(1);
    s.fill((1, 0), &[2u8; BS], epoch).unwrap();
    assert_eq!(s.read((1, 0), 0, BS).unwrap(), Some(vec![2u8; BS]));
}

fn inode_of(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[test]
fn a_removed_objects_file_is_emptied_and_given_to_the_next_new_object() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 1 << 20);
    s.write(1, 0, &[1u8; 6000]).unwrap();
    let first = inode_of(&s.path_of(1));
    s.remove_object(1);
    assert!(!s.path_of(1).exists());
    assert_eq!(s.spare_files(), 1);
    // The new object gets the same inode, empty: none of the old bytes show, in the file or in reads.
    s.write(2, 4096, b"new").unwrap();
    assert_eq!(
        inode_of(&s.path_of(2)),
        first,
        "the spare was taken, not a new file made"
    );
    assert_eq!(s.spare_files(), 0);
    assert_eq!(file_bytes(dir.path(), 2), [&[0u8; 4096][..], b"new"].concat());
    assert!(
        s.read((2, 0), 0, 4096).unwrap().is_none(),
        "block 0 was never written to object 2"
    );
    // With no spare left, a new object gets a file of its own.
    s.write(3, 0, b"three").unwrap();
    assert_eq!(file_bytes(dir.path(), 3), b"three");
    check_figures(&s);
}

#[test]
fn spares_survive_a_restart_and_files_the_kernel_reads_or_shared_contents_are_not_emptied() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(dir.path(), 1 << 20);
        for object in 1..=3 {
            s.write(object, 0, &[object as u8; 100]).unwrap();
        }
        s.remove_object(1);
        s.remove_object(2);
        // A held object (a passthrough reader has its file): unlinked, its bytes left to the reader.
        let held = s.file(3).unwrap();
        s.hold(3);
        s.remove_object(3);
        s.unhold(3);
        let mut bytes = vec![0u8; 100];
        held.read_exact_at(&mut bytes, 0).unwrap();
        assert_eq!(bytes, [3u8; 100], "the reader's bytes stayed");
        assert_eq!(s.spare_files(), 2);
        // A shared content (two identical clean files): removing one leaves the other's bytes.
        s.fill_whole(10, &content(9, 700), 0).unwrap();
        s.fill_whole(11, &content(9, 700), 0).unwrap();
        assert_eq!(s.stats().dedup_files, 2);
        s.remove_object(10);
        assert_eq!(s.read((11, 0), 0, 700).unwrap().unwrap(), content(9, 700));
        assert_eq!(s.spare_files(), 2);
        s.db().sync().unwrap();
    }
    // A stray non-empty file in `spare/` (not one the store made) is not kept.
    std::fs::write(dir.path().join("objects/spare/999"), b"junk").unwrap();
    let s = store(dir.path(), 1 << 20);
    assert_eq!(s.spare_files(), 2);
    assert!(!dir.path().join("objects/spare/999").exists());
    s.retain_objects(&[11u64].into_iter().collect(), &dir.path().join("lost+found"));
    assert_eq!(s.spare_files(), 2, "retain_objects leaves the spares alone");
    s.write(20, 0, b"x").unwrap();
    s.write(21, 0, b"y").unwrap();
    assert_eq!(s.spare_files(), 0);
    assert_eq!(file_bytes(dir.path(), 20), b"x");
    assert_eq!(file_bytes(dir.path(), 21), b"y");
    assert_eq!(s.read((11, 0), 0, 700).unwrap().unwrap(), content(9, 700));
}
