//! The persistent index: one redb database holding the block index and whatever the layers above persist
//! (inode records, directory entries, counters).
//!
//! Writes are submitted as [`Mutation`]s and applied in order by one committer thread, which batches
//! everything that arrived while the previous commit was being made durable (group commit). [`Db::sync`]
//! waits until everything submitted before it is durable.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::store::{CacheError, CacheResult};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
const DENTRIES: TableDefinition<(u64, &[u8]), u64> = TableDefinition::new("dentries");
/// (object, block index) -> (valid length, crc32c)
const BLOCKS: TableDefinition<(u64, u32), (u32, u32)> = TableDefinition::new("blocks");
/// object -> (flags, content length, content crc32c): per-object state of the store (whole unit, pinned,
/// stored in the content store under that length and checksum).
const OBJECTS: TableDefinition<u64, (u32, u64, u32)> = TableDefinition::new("objects");
/// Write-back journal: sequence number -> encoded operation.
const JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("journal");

/// Format of the records in the index; an index written in another format is refused, not misread.
pub const FORMAT: u64 = 4;

const MAX_BATCH: usize = 16_384;

/// One change to the index.
#[derive(Clone, Debug)]
pub enum Mutation {
    PutMeta(&'static str, u64),
    PutInode(u64, Vec<u8>),
    DelInode(u64),
    PutDentry(u64, Vec<u8>, u64),
    DelDentry(u64, Vec<u8>),
    PutBlock {
        object: u64,
        index: u32,
        len: u32,
        crc: u32,
    },
    DelBlock {
        object: u64,
        index: u32,
    },
    /// Forget an object: its blocks and its per-object state.
    DelObject(u64),
    PutObject {
        object: u64,
        flags: u32,
        len: u64,
        crc: u32,
    },
    DelObjectMeta(u64),
    PutOp(u64, Vec<u8>),
    DelOp(u64),
}

enum Msg {
    Apply(Vec<Mutation>),
    Sync(SyncSender<Result<(), String>>),
}

/// The index database and its committer.
pub struct Db {
    /// `None` once closed.
    db: Mutex<Option<Arc<Database>>>,
    sender: Mutex<Option<Sender<Msg>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

fn idx_err(e: impl std::fmt::Display) -> CacheError {
    CacheError::Index(e.to_string())
}

impl Db {
    /// Open (or create, owner-only) the index at `path` and start its committer.
    pub fn open(path: &Path) -> CacheResult<Arc<Db>> {
        let file = crate::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(CacheError::Io)?;
        let db = Database::builder()
            .set_cache_size(64 << 20)
            .create_file(file)
            .map_err(idx_err)?;
        {
            let tx = db.begin_write().map_err(idx_err)?;
            tx.open_table(META).map_err(idx_err)?;
            tx.open_table(INODES).map_err(idx_err)?;
            tx.open_table(DENTRIES).map_err(idx_err)?;
            tx.open_table(BLOCKS).map_err(idx_err)?;
            tx.open_table(JOURNAL).map_err(idx_err)?;
            tx.open_table(OBJECTS).map_err(idx_err)?;
            {
                let mut meta = tx.open_table(META).map_err(idx_err)?;
                let found = meta.get("format").map_err(idx_err)?.map(|v| v.value());
                match found {
                    Some(FORMAT) => {}
                    // Format 3 (unmarked) records are read and rewritten as format 4 as they change.
                    None => {
                        meta.insert("format", FORMAT).map_err(idx_err)?;
                    }
                    Some(other) => {
                        return Err(CacheError::Index(format!(
                            "it was written by another version of larder (format {other}, this one reads \
                             {FORMAT}); use another --cache-dir, or push its pending changes with that version first"
                        )));
                    }
                }
            }
            tx.commit().map_err(idx_err)?;
        }
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel();
        let worker_db = db.clone();
        let committer = std::thread::Builder::new()
            .name("larder-index".into())
            .spawn(move || committer(worker_db, rx))
            .map_err(CacheError::Io)?;
        Ok(Arc::new(Db {
            db: Mutex::new(Some(db)),
            sender: Mutex::new(Some(tx)),
            committer: Mutex::new(Some(committer)),
        }))
    }

    /// Queue changes; they become durable in order, soon.
    pub fn submit(&self, mutations: Vec<Mutation>) {
        if mutations.is_empty() {
            return;
        }
        if let Some(s) = self.sender.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = s.send(Msg::Apply(mutations));
        }
    }

    /// Wait until everything submitted so far is durable.
    pub fn sync(&self) -> CacheResult<()> {
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let guard = self.sender.lock().unwrap_or_else(|p| p.into_inner());
            let Some(s) = guard.as_ref() else {
                return Err(CacheError::Index("index is closed".into()));
            };
            s.send(Msg::Sync(tx))
                .map_err(|_| CacheError::Index("index committer stopped".into()))?;
        }
        rx.recv()
            .map_err(|_| CacheError::Index("index committer stopped".into()))?
            .map_err(CacheError::Index)
    }

    /// Make everything durable and stop the committer.
    pub fn close(&self) -> CacheResult<()> {
        if self.sender.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            return Ok(());
        }
        let result = self.sync();
        self.sender.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = self.committer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = handle.join();
        }
        self.db.lock().unwrap_or_else(|p| p.into_inner()).take();
        result
    }

    fn database(&self) -> CacheResult<Arc<Database>> {
        self.db
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| CacheError::Index("index is closed".into()))
    }

    /// A counter or setting stored under `key`.
    pub fn meta(&self, key: &str) -> CacheResult<Option<u64>> {
        let tx = self.database()?.begin_read().map_err(idx_err)?;
        let table = tx.open_table(META).map_err(idx_err)?;
        Ok(table.get(key).map_err(idx_err)?.map(|v| v.value()))
    }

    /// The stored record of inode `ino`.
    pub fn inode(&self, ino: u64) -> CacheResult<Option<Vec<u8>>> {
        let tx = self.database()?.begin_read().map_err(idx_err)?;
        let table = tx.open_table(INODES).map_err(idx_err)?;
        Ok(table.get(ino).map_err(idx_err)?.map(|v| v.value().to_vec()))
    }

    /// The inode stored for `name` in directory `parent`.
    pub fn dentry(&self, parent: u64, name: &[u8]) -> CacheResult<Option<u64>> {
        let tx = self.database()?.begin_read().map_err(idx_err)?;
        let table = tx.open_table(DENTRIES).map_err(idx_err)?;
        Ok(table.get((parent, name)).map_err(idx_err)?.map(|v| v.value()))
    }

    /// Every stored entry of directory `parent`: (name, inode).
    pub fn dentries_of(&self, parent: u64) -> CacheResult<Vec<(Vec<u8>, u64)>> {
        let tx = self.database()?.begin_read().map_err(idx_err)?;
        let table = tx.open_table(DENTRIES).map_err(idx_err)?;
        let mut out = Vec::new();
        let lo: (u64, &[u8]) = (parent, &[]);
        for row in table.range(lo..).map_err(idx_err)? {
            let (k, v) = row.map_err(idx_err)?;
            let (p, name) = k.value();
            if p != parent {
                break;
            }
            out.push((name.to_vec(), v.value()));
        }
        Ok(out)
    }

    /// Visit every inode record.
    pub fn for_each_inode(&self, f: impl FnMut(u64, &[u8])) -> CacheResult<()> {
        self.for_each_record(INODES, f)
    }

    /// Visit every journal record in sequence order.
    pub fn for_each_op(&self, f: impl FnMut(u64, &[u8])) -> CacheResult<()> {
        self.for_each_record(JOURNAL, f)
    }

    fn for_each_record(&self, def: TableDefinition<u64, &[u8]>, mut f: impl FnMut(u64, &[u8])) -> CacheResult<()> {
        let tx = self.database()?.begin_read().map_err(idx_err)?;
        let table = tx.open_table(def).map_err(idx_err)?;
        for row in table.iter().map_err(idx_err)? {
            let (k, v) = row.map_err(idx_err)?;
            f(k.value(), v.value());
        }
        Ok(())
    }

    /// Visit every object's stored state: (object, flags, content length, content crc).
    pub fn for_each_object(&self, mut f: impl FnMut(u64, u32, u64, u32)) -> CacheResult<()> {
        let tx = self.database()?.begin_read().map_err(idx_err)?;
        let table = tx.open_table(OBJECTS).map_err(idx_err)?;
        for row in table.iter().map_err(idx_err)? {
            let (k, v) = row.map_err(idx_err)?;
            let (flags, len, crc) = v.value();
            f(k.value(), flags, len, crc);
        }
        Ok(())
    }

    /// Visit every block: (object, index, length, crc).
    pub fn for_each_block(&self, mut f: impl FnMut(u64, u32, u32, u32)) -> CacheResult<()> {
        let tx = self.database()?.begin_read().map_err(idx_err)?;
        let table = tx.open_table(BLOCKS).map_err(idx_err)?;
        for row in table.iter().map_err(idx_err)? {
            let (k, v) = row.map_err(idx_err)?;
            let ((object, index), (len, crc)) = (k.value(), v.value());
            f(object, index, len, crc);
        }
        Ok(())
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn apply(db: &Database, batch: &[Mutation]) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| redb::Error::from(redb::StorageError::Corrupted(e.to_string())))?;
    {
        let mut meta = tx.open_table(META)?;
        let mut inodes = tx.open_table(INODES)?;
        let mut dentries = tx.open_table(DENTRIES)?;
        let mut blocks = tx.open_table(BLOCKS)?;
        let mut journal = tx.open_table(JOURNAL)?;
        let mut objects = tx.open_table(OBJECTS)?;
        for m in batch {
            match m {
                Mutation::PutMeta(k, v) => {
                    meta.insert(*k, *v)?;
                }
                Mutation::PutInode(ino, rec) => {
                    inodes.insert(*ino, rec.as_slice())?;
                }
                Mutation::DelInode(ino) => {
                    inodes.remove(*ino)?;
                }
                Mutation::PutDentry(parent, name, ino) => {
                    dentries.insert((*parent, name.as_slice()), *ino)?;
                }
                Mutation::DelDentry(parent, name) => {
                    dentries.remove((*parent, name.as_slice()))?;
                }
                Mutation::PutBlock {
                    object,
                    index,
                    len,
                    crc,
                } => {
                    blocks.insert((*object, *index), (*len, *crc))?;
                }
                Mutation::DelBlock { object, index } => {
                    blocks.remove((*object, *index))?;
                }
                Mutation::DelObject(object) => {
                    blocks.retain_in((*object, 0u32)..=(*object, u32::MAX), |_, _| false)?;
                    objects.remove(*object)?;
                }
                Mutation::PutObject {
                    object,
                    flags,
                    len,
                    crc,
                } => {
                    objects.insert(*object, (*flags, *len, *crc))?;
                }
                Mutation::DelObjectMeta(object) => {
                    objects.remove(*object)?;
                }
                Mutation::PutOp(seq, rec) => {
                    journal.insert(*seq, rec.as_slice())?;
                }
                Mutation::DelOp(seq) => {
                    journal.remove(*seq)?;
                }
            }
        }
    }
    tx.commit()?;
    Ok(())
}

fn committer(db: Arc<Database>, rx: Receiver<Msg>) {
    let mut batch = Vec::new();
    let mut waiters = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Apply(m) => batch.extend(m),
                Msg::Sync(w) => waiters.push(w),
            }
            if batch.len() < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        let result = if batch.is_empty() {
            Ok(())
        } else {
            apply(&db, &batch).map_err(|e| e.to_string())
        };
        if let Err(e) = &result {
            tracing::error!(error = %e, mutations = batch.len(), "cache index commit failed");
        }
        batch.clear();
        for w in waiters.drain(..) {
            let _ = w.send(result.clone());
        }
    }
}
