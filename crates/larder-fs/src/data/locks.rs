//! File locks across a cluster, as the data path takes them (design note 017): the cluster's
//! [`LockTable`] grants them; taking one takes in what other nodes changed of the file, and releasing one
//! publishes what this node wrote, as `close` and `fsync` do (NFS's lock-to-unlock visibility).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use crate::locks::{LockAsk, LockRange, LockTable};
use crate::{FsError, FsResult};

use super::DataPath;

impl DataPath {
    /// Grant locks through `table` from now on (before the mount starts: the kernel is told at its start
    /// whether the file system keeps locks).
    pub(crate) fn set_lock_table(&self, table: Arc<dyn LockTable>) {
        let _ = self.locks.set(table);
    }

    /// Whether locks are granted across a cluster (else the kernel keeps them, for this node alone).
    pub(crate) fn shares_locks(&self) -> bool {
        self.locks.get().is_some()
    }

    /// The table and the key of `ino`'s locks: its path below home's root when this node first locked it
    /// (and kept while it holds locks on it: a file removed or renamed while locked is unlocked by the
    /// key it was locked by).
    fn lock_key(&self, ino: u64) -> FsResult<(&Arc<dyn LockTable>, Vec<u8>)> {
        let table = self.locks.get().ok_or(FsError::Unsupported)?;
        if let Some(key) = self.lock_keys.lock().unwrap_or_else(|p| p.into_inner()).get(&ino) {
            return Ok((table, key.clone()));
        }
        let path = self.names.read().path_of(ino)?;
        Ok((table, path.as_os_str().as_bytes().to_vec()))
    }

    /// Keep `key` as `ino`'s while this node holds locks by it.
    fn note_lock_key(&self, table: &Arc<dyn LockTable>, ino: u64, key: Vec<u8>) {
        let mut keys = self.lock_keys.lock().unwrap_or_else(|p| p.into_inner());
        if table.holds(&key) {
            keys.insert(ino, key);
        } else {
            keys.remove(&ino);
        }
    }

    /// The lock that would stop `ask` on `ino` (`F_GETLK`), if any.
    pub(crate) fn getlk(&self, ino: u64, ask: &LockAsk) -> FsResult<Option<LockRange>> {
        let (table, key) = self.lock_key(ino)?;
        Ok(table.test(&key, ask)?)
    }

    /// Lock or unlock `ino` as `ask` says, waiting with `wait` until it is granted or `cancelled`.
    ///
    /// Before a lock changes, what this node wrote to the file is published (a waiting node that takes
    /// it next reads it); once a lock is granted, what other nodes changed of the file is taken in:
    /// their records applied, the file's attributes asked again, the kernel's pages of an older version
    /// dropped, and this node's open handles of the file moved to the newest version.
    pub(crate) fn setlk(&self, ino: u64, ask: &LockAsk, wait: bool, cancelled: &dyn Fn() -> bool) -> FsResult<()> {
        let (table, key) = self.lock_key(ino)?;
        if table.holds(&key) {
            self.publish_writes(ino)?;
        }
        let others = table.set(&key, ask, wait, cancelled);
        self.note_lock_key(table, ino, key);
        if ask.kind.is_some() && others? {
            self.take_in_changes(ino);
        }
        Ok(())
    }

    /// Every lock `owner` holds on `ino` goes (its file was closed): published first, as an unlock.
    pub(crate) fn release_locks(&self, ino: u64, owner: u64) {
        let Ok((table, key)) = self.lock_key(ino) else {
            return;
        };
        if !table.holds(&key) {
            return;
        }
        if let Err(e) = self.publish_writes(ino) {
            tracing::warn!(error = %e, "could not publish a file's changes before its locks went");
        }
        if let Err(e) = table.release_owner(&key, owner) {
            tracing::warn!(error = %e, path = %Path::new(OsStr::from_bytes(&key)).display(), "could not release a file's locks");
        }
        self.note_lock_key(table, ino, key);
    }

    /// What was written to `ino` made safe and published, as at a close.
    fn publish_writes(&self, ino: u64) -> FsResult<()> {
        self.adopt_all_direct_writes(ino);
        self.changes().commit_data(ino, false)
    }

    /// What other nodes changed of `ino` taken in, for a lock just granted.
    fn take_in_changes(&self, ino: u64) {
        // The lock table applied the records published before the lock was granted.
        if let Err(e) = self.names.getattr(ino) {
            tracing::debug!(error = %e, ino, "could not revalidate a file just locked");
            return;
        }
        self.names.kernel_barrier();
        // Handles opened before the lock read what the lock protects: the newest version.
        self.names.follow_newest(ino);
    }
}
