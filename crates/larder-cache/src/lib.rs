//! larder's local store.
//!
//! Each cached file version is one sparse file under the cache directory, named by an **object id** that
//! is never reused for another version, so a stale block cannot be found (the version is in every key).
//! Which blocks of it are present, with their checksums, lives in a persistent index ([`Db`]), written by a
//! group-commit thread. Eviction is by block (a small file is one block), in S3-FIFO order ([`S3Fifo`]), by
//! a harvester thread between watermarks so that fills do not wait for it; dirty blocks are never evicted.
//! A plain LRU order ([`Lru`], chosen with [`Eviction::Lru`]) is there as a baseline for benchmarks.
//! Everything under the cache directory is its owner's alone ([`private`]).

#![deny(unsafe_op_in_unsafe_fn)]

mod db;
mod lru;
mod policy;
mod s3fifo;
mod store;
pub mod unpushed;
mod wal;

pub use db::{Db, Durability, Mutation};
pub use lru::Lru;
pub use policy::{Eviction, Policy};
pub use s3fifo::{PolicyStats, S3Fifo};
pub use store::{BlockKey, CacheError, CacheResult, Departing, Retained, Store, StoreConfig, StoreStats, Verification};
