//! The cache's own integrity, seen from the core (design note 002, "Checksums"): a cache file is handed to
//! the kernel (FUSE passthrough) only once every block of it has been checked against its checksum since
//! the daemon started, and files whose unpushed data was found damaged are named in the log and by
//! `larder status`, their damaged bytes never served nor pushed.
//!
//! **Before passthrough.** An open that could be served by the kernel checks the object's unverified
//! blocks first ([`larder_cache::Store::verify`]): at once when there are at most [`crate::VERIFY_AT_OPEN`]
//! bytes of them (a read of that much from the cache disk), else in the background, one object at a time
//! (the `larder-verify` thread), while the daemon serves that open's reads, checking each block at its
//! first read as it always does; the first open after the check is passed through. A clean block that
//! fails is dropped and fetched again; a dirty one makes the file damaged.

use std::collections::{BTreeMap, HashSet};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};

use larder_cache::CacheError;

use crate::data::DataPath;
use crate::namespace::lock;

/// A file whose data not yet at home was found damaged in the cache.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DamagedFile {
    /// Its path in the mount, as last known.
    pub path: String,
    /// The damaged blocks (of `block_size` bytes) of its cache copy.
    pub blocks: Vec<u32>,
}

/// What the core keeps about its cache's integrity.
#[derive(Default)]
pub(crate) struct Integrity {
    /// Files found damaged, by inode: (cache object, path), reported once each.
    damaged: Mutex<BTreeMap<u64, (u64, String)>>,
    /// Objects waiting for the background check (inode, object), and those queued, once each.
    verifier: Mutex<Option<mpsc::Sender<(u64, u64)>>>,
    queued: Mutex<HashSet<u64>>,
}

impl DataPath {
    /// `e` came from the store about `ino`: if it says the file's unpushed data is damaged, the file is
    /// named (in the log once, and by [`crate::Fs::damaged_files`] while it stays so).
    pub(crate) fn damaged_found(&self, ino: u64, e: &CacheError) {
        let CacheError::Damaged { object, .. } = e else { return };
        let path = self
            .names
            .read()
            .path_of(ino)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| format!("(inode {ino})"));
        let new = lock(&self.integrity.damaged)
            .insert(ino, (*object, path.clone()))
            .is_none_or(|(o, _)| o != *object);
        if new {
            let blocks = self.core.store.damaged_blocks(*object);
            tracing::error!(
                path = %path,
                ?blocks,
                "the cache copy of /{path} holds changes not yet at home that were damaged in the cache \
                 directory (their checksums fail): reads of those bytes fail with EIO and the file is not \
                 pushed; write the file again (or remove it) to replace them"
            );
        }
    }

    /// The files whose unpushed data is damaged in the cache now (see [`DataPath::damaged_found`]).
    pub(crate) fn damaged_files(&self) -> Vec<DamagedFile> {
        let mut found = lock(&self.integrity.damaged);
        found.retain(|ino, (object, _)| {
            self.names.read().inodes.get(ino).is_some_and(|n| n.object == *object)
                && !self.core.store.damaged_blocks(*object).is_empty()
        });
        found
            .iter()
            .map(|(_, (object, path))| DamagedFile {
                path: path.clone(),
                blocks: self.core.store.damaged_blocks(*object),
            })
            .collect()
    }

    /// Whether every block of `ino`'s `object` has been checked against its checksum, so that the kernel
    /// may be given its cache file: checked now if few are not (see the module doc), else queued for the
    /// background check and `false` for this open.
    pub(crate) fn verified_for_kernel(&self, ino: u64, object: u64) -> bool {
        let unverified = self.core.store.unverified_bytes(object);
        if unverified == 0 {
            return true;
        }
        if unverified > self.cfg.verify_at_open {
            self.verify_later(ino, object);
            return false;
        }
        self.verify_now(ino, object)
    }

    /// Check `object`'s unverified blocks now: whether all passed.
    fn verify_now(&self, ino: u64, object: u64) -> bool {
        match self.core.store.verify(object) {
            Ok(v) if v.damaged.is_empty() => v.dropped.is_empty(),
            Ok(v) => {
                let e = CacheError::Damaged {
                    object,
                    block: v.damaged[0],
                };
                self.damaged_found(ino, &e);
                false
            }
            Err(e) => {
                tracing::warn!(ino, error = %e, "checking a cache file before passing it to the kernel failed");
                false
            }
        }
    }

    /// Queue `object` (of `ino`) for the background check.
    fn verify_later(&self, ino: u64, object: u64) {
        if !lock(&self.integrity.queued).insert(object) {
            return;
        }
        let sent = lock(&self.integrity.verifier)
            .as_ref()
            .is_some_and(|tx| tx.send((ino, object)).is_ok());
        if !sent {
            lock(&self.integrity.queued).remove(&object);
        }
    }

    /// Whether the cache file of `ino`'s `object` ends where the file does, so that the kernel, which
    /// reads it to its end, reads exactly the file: bytes past the end (left by a write cut short by a full
    /// cache disk before this was mended, or by anything else) are cut off, with a line in the log. Under
    /// the file's write lock, so that no write extending it lands meanwhile. `false` if it cannot be
    /// checked or cut.
    pub(crate) fn cache_file_fits(&self, ino: u64, object: u64) -> bool {
        let Ok(write_lock) = self.names.read().inode(ino).map(|n| n.write_lock.clone()) else {
            return false;
        };
        let _w = lock(&write_lock);
        let (size, writers) = {
            let ns = self.names.read();
            let Ok(node) = ns.inode(ino) else { return false };
            if node.object != object {
                return false;
            }
            let Some(size) = node.attr.as_ref().map(|a| a.size) else {
                return false;
            };
            (size, node.pt_writers.load(std::sync::atomic::Ordering::Relaxed))
        };
        let Ok(len) = self
            .core
            .store
            .file(object)
            .and_then(|f| f.metadata().map_err(CacheError::Io))
        else {
            return false;
        };
        let len = len.len();
        if len <= size || writers > 0 {
            // (Writers the kernel serves grow the cache file before the file takes its size: theirs.)
            return true;
        }
        match self
            .core
            .store
            .writable_file(object)
            .and_then(|f| f.set_len(size).map_err(CacheError::Io))
        {
            Ok(()) => {
                tracing::warn!(
                    ino,
                    object,
                    extra = len - size,
                    "a cache file held bytes past its file's end; they were cut off"
                );
                true
            }
            Err(e) => {
                tracing::warn!(ino, error = %e, "cannot cut a cache file to its file's size");
                false
            }
        }
    }

    /// Label `ino`'s cache file as holding changes not yet at home, with the file's path now
    /// (`larder_cache::unpushed`): once, when they are first committed, and again after a rename. A cache
    /// disk that keeps no extended attributes gets a warning, once: the changes are safe as long as the
    /// index is, but could not be told apart from orphans without it.
    pub(crate) fn label_unpushed(&self, ino: u64) {
        let (object, label) = {
            let ns = self.names.read();
            let Ok(node) = ns.inode(ino) else { return };
            if node.labelled || node.dirty.is_empty() || node.object == 0 || node.removed {
                return;
            }
            let Ok(path) = ns.path_of(ino) else { return };
            let label = larder_cache::unpushed::Label {
                ino,
                path: std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec(),
                mode: node.attr.as_ref().map_or(0o644, |a| a.perm),
            };
            (node.object, label)
        };
        match self.core.store.label(object, &label) {
            Ok(()) => {
                if let Ok(node) = self.names.write().inode_mut(ino)
                    && node.object == object
                {
                    node.labelled = true;
                }
            }
            Err(e) => {
                static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "cannot label cache files holding changes not yet at home (extended attributes on the \
                         cache disk): they are safe while the index is, but a lost index could not tell them \
                         from orphans"
                    );
                }
            }
        }
    }

    /// Home has all of `object`'s data (the cache file of `ino`): its label goes.
    pub(crate) fn unlabel(&self, ino: u64, object: u64) {
        if let Err(e) = self.core.store.unlabel(object) {
            tracing::debug!(ino, error = %e, "taking the label off a cache file failed");
        }
    }

    /// Start the background checker (see the module doc).
    pub(crate) fn start_verifier(self: &Arc<Self>) {
        let (tx, rx) = mpsc::channel::<(u64, u64)>();
        *lock(&self.integrity.verifier) = Some(tx);
        let fs: Weak<DataPath> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("larder-verify".into()).spawn(move || {
            while let Ok((ino, object)) = rx.recv() {
                let Some(fs) = fs.upgrade() else { return };
                fs.verify_now(ino, object);
                lock(&fs.integrity.queued).remove(&object);
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the thread that checks cache files in the background");
            *lock(&self.integrity.verifier) = None;
        }
    }

    /// Stop the background checker: what is queued is dropped (checked again at the next open).
    pub(crate) fn stop_verifier(&self) {
        *lock(&self.integrity.verifier) = None;
    }
}
