//! What the core's tests share: a home and a cache directory in a scratch directory, and the store they
//! open in the cache directory.

// Each test binary that includes this module uses a subset of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_cache::{CacheResult, Db, Eviction, Store, StoreConfig};

/// Block size of the tests' stores: small, so that a few KiB span several blocks.
pub const BS: u64 = 64 << 10;

/// A scratch directory with `home` and `cache` made in it (removed when the first value is dropped).
pub fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home_dir = dir.path().join("home");
    let cache_dir = dir.path().join("cache");
    std::fs::create_dir_all(&home_dir).unwrap();
    std::fs::create_dir_all(&cache_dir).unwrap();
    (dir, home_dir, cache_dir)
}

/// The store (and its index) in `cache_dir`: 64 MiB, blocks of [`BS`], dedup on, S3-FIFO.
pub fn open_store(cache_dir: &Path) -> CacheResult<Arc<Store>> {
    open_store_of(cache_dir, 64 << 20)
}

/// The same, holding `limit` bytes.
pub fn open_store_of(cache_dir: &Path, limit: u64) -> CacheResult<Arc<Store>> {
    let db = Db::open(&cache_dir.join("index.redb"))?;
    let cfg = StoreConfig {
        dir: cache_dir.join("objects"),
        block_size: BS,
        limit,
        high_watermark: 0.95,
        low_watermark: 0.9,
        dedup: true,
        eviction: Eviction::S3Fifo,
    };
    Ok(Arc::new(Store::open(cfg, db)?))
}
