//! Counters of home operations and bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{HomeError, Layer, OpKind};

/// Counters shared between the layer and whoever reports them.
#[derive(Debug, Default)]
pub struct HomeCounters {
    ops: [AtomicU64; OpKind::ALL.len()],
    errors: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl HomeCounters {
    /// All operations so far.
    pub fn ops(&self) -> u64 {
        self.ops.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
    /// Operations of one kind.
    pub fn ops_of(&self, kind: OpKind) -> u64 {
        self.ops[kind.index()].load(Ordering::Relaxed)
    }
    /// Failed operations.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    /// Bytes of file content read from home.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
    /// Bytes of file content written to home.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }
}

/// Counts every operation into [`HomeCounters`].
pub struct MetricsLayer(pub Arc<HomeCounters>);

impl Layer for MetricsLayer {
    fn before(&self, op: OpKind, bytes_out: u64) -> crate::HomeResult<()> {
        self.0.ops[op.index()].fetch_add(1, Ordering::Relaxed);
        self.0.bytes_written.fetch_add(bytes_out, Ordering::Relaxed);
        Ok(())
    }
    fn after(&self, _op: OpKind, bytes_in: u64, error: Option<&HomeError>) {
        self.0.bytes_read.fetch_add(bytes_in, Ordering::Relaxed);
        if error.is_some() {
            self.0.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
