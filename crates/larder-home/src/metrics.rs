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
    /// Failed operations. An answer (not found, exists, not empty: [`HomeError::is_answer`]) is not a
    /// failure.
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
        if error.is_some_and(|e| !e.is_answer()) {
            self.0.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{Home, Layered, Owner, PosixHome};

    #[test]
    fn answers_are_not_failures() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("full")).unwrap();
        std::fs::write(dir.path().join("full/f"), b"x").unwrap();
        let counters = Arc::new(HomeCounters::default());
        let inner: Arc<dyn Home> = Arc::new(PosixHome::new(dir.path(), None).unwrap());
        let home = Layered::new(inner, MetricsLayer(counters.clone()));
        for i in 0..5 {
            assert!(matches!(
                home.stat(Path::new(&format!("missing-{i}"))),
                Err(HomeError::NotFound)
            ));
        }
        assert!(matches!(
            home.mkdir(Path::new("full"), 0o755, Owner::default()),
            Err(HomeError::Exists)
        ));
        assert!(matches!(home.rmdir(Path::new("full")), Err(HomeError::NotEmpty)));
        assert_eq!((counters.ops(), counters.errors()), (7, 0));
        // A failure still counts.
        assert!(home.readlink(Path::new("full/f")).is_err());
        assert_eq!((counters.ops(), counters.errors()), (8, 1));
    }
}
