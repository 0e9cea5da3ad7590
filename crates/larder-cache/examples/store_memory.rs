//! What the store keeps in memory per cached small file: N small files are filled whole (as a mount
//! fills them), the store is closed and opened again over the same index (as after a remount), and the
//! heap the open store holds is counted by a counting allocator. Prints one JSON object.
//!
//! `cargo run --release -p larder-cache --example store_memory -- [N] [--no-dedup]` (N: 100000).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use larder_cache::{Db, Eviction, Store, StoreConfig};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn open(dir: &std::path::Path, dedup: bool) -> Arc<Store> {
    let db = Db::open(&dir.join("index.redb")).expect("index");
    let cfg = StoreConfig {
        dir: dir.join("objects"),
        block_size: 1 << 20,
        limit: 64 << 30,
        high_watermark: 0.95,
        low_watermark: 0.9,
        dedup,
        eviction: Eviction::S3Fifo,
    };
    Arc::new(Store::open(cfg, db).expect("store"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(100_000);
    let dedup = !args.iter().any(|a| a == "--no-dedup");
    let dir = tempfile::tempdir().expect("scratch directory");
    let filled = {
        let before = LIVE.load(Relaxed);
        let store = open(dir.path(), dedup);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for object in 1..=n {
            // Distinct contents of 64-1,024 bytes, as the scale benchmark's files.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = 64 + (seed % 961) as usize;
            let data: Vec<u8> = (0..len).map(|i| (seed >> (i % 8 * 8)) as u8 ^ i as u8).collect();
            store.fill_whole(object, &data, store.epoch(object)).expect("fill");
        }
        store.db().sync().expect("sync");
        let held = LIVE.load(Relaxed) - before;
        store.db().close().expect("close");
        held
    };
    // The index alone, read through as the store's open reads it: its page cache.
    let index = {
        let before = LIVE.load(Relaxed);
        let db = Db::open(&dir.path().join("index.redb")).expect("index");
        db.for_each_object(|_, _, _, _| {}).expect("objects");
        db.for_each_block(|_, _, _, _| {}).expect("blocks");
        let held = LIVE.load(Relaxed) - before;
        db.close().expect("close");
        held
    };
    let before = LIVE.load(Relaxed);
    let store = open(dir.path(), dedup);
    store.db().settle().expect("settle");
    let held = LIVE.load(Relaxed) - before;
    let stats = store.stats();
    println!(
        "{{\"files\": {n}, \"dedup\": {dedup}, \"objects\": {}, \"blocks\": {}, \"dedup_files\": {}, \"heap_bytes\": {held}, \
         \"bytes_per_file\": {:.1}, \"index_cache_bytes\": {index}, \"store_bytes_per_file\": {:.1}, \
         \"filled_heap_bytes\": {filled}, \"filled_bytes_per_file\": {:.1}}}",
        stats.objects,
        stats.blocks,
        stats.dedup_files,
        held as f64 / n as f64,
        (held - index) as f64 / n as f64,
        filled as f64 / n as f64
    );
}
