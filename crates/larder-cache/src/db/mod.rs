//! The persistent index: one redb database holding the block index and whatever the layers above persist
//! (inode records, directory entries, counters).
//!
//! Writes are submitted as [`Mutation`]s and applied in order by one committer thread, which batches
//! everything that arrived while the previous commit was being made durable (group commit). [`Db::sync`]
//! waits until everything submitted before it is durable against power loss; [`Db::settle`] until it is
//! as durable as the index's [`Durability`] promises a change to be when its call returns.
//!
//! With [`Durability::Process`], [`Db::submit`] first writes the mutations to the index's log (`wal`),
//! which survives the daemon being killed; the committer applies them without fsyncing and makes the
//! index durable (and empties the log) at most [`Db::GROUP_COMMIT`] later, or at the next `sync`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::wal::Durability;
use crate::wal::Wal;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::store::{CacheError, CacheResult};

/// Bytes of index pages redb keeps in memory.
const INDEX_CACHE: usize = 32 << 20;

/// Longest [`Db::close`] waits for reads under way to end.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

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
/// When directories were last listed from home (ms since the epoch), written at a clean stop for the
/// next start: a listing within the validity lag is trusted across a remount.
const LISTINGS: TableDefinition<u64, u64> = TableDefinition::new("listings");

/// Format of the records in the index; an index written in another format is refused, not misread.
pub const FORMAT: u64 = 4;

const MAX_BATCH: usize = 16_384;
thread_local! {
    /// Submissions gathered by [`Db::gathered`] on this thread: the index's identity, and the mutations.
    static GATHERED: std::cell::RefCell<Option<(usize, Vec<Mutation>)>> = const { std::cell::RefCell::new(None) };
}

/// How long the committer lets changes gather at process durability before it applies them, unless a
/// read or a sync waits.
const BATCH_WINDOW: Duration = Duration::from_millis(10);

/// A key of the `meta` table. (An alias, so that serde does not take it for a string borrowed from what it
/// reads: [`meta_key`] gives back the static name.)
pub type MetaKey = &'static str;

/// The keys of the `meta` table: a logged [`Mutation::PutMeta`] names one of them.
const META_KEYS: &[&str] = &["format", "next_ino", "next_object", "running", "generation"];

fn meta_key<'de, D: serde::Deserializer<'de>>(d: D) -> Result<MetaKey, D::Error> {
    let key = <String as serde::Deserialize>::deserialize(d)?;
    META_KEYS
        .iter()
        .find(|k| **k == key)
        .copied()
        .ok_or_else(|| serde::de::Error::custom(format!("unknown index setting {key:?}")))
}

/// An entry of a directory as the index has it: (name, inode, the inode's record).
pub type StoredChild = (Vec<u8>, u64, Option<Vec<u8>>);

/// One change to the index.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum Mutation {
    PutMeta(#[serde(deserialize_with = "meta_key")] MetaKey, u64),
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
    /// Directory `.0` was listed from home at `.1` ms since the epoch.
    PutListing(u64, u64),
    /// Forget every listing time.
    ClearListings,
}

enum Msg {
    Apply(Vec<Mutation>),
    Sync(SyncSender<Result<(), String>>),
}

/// What submitters and the committer share: the way to the committer and the log, under one lock so
/// that the log's order is the order the committer applies.
struct Inlet {
    sender: Sender<Msg>,
    wal: Option<Wal>,
}

struct Shared {
    /// `None` once closed.
    inlet: Mutex<Option<Inlet>>,
    /// Submissions sent to the committer, and those it has applied (committed or not): a read of the index
    /// waits until it has applied everything submitted before the read, so that it sees the changes whose
    /// calls returned.
    submitted: AtomicU64,
    applied: Mutex<u64>,
    caught_up: Condvar,
    /// A write to the log failed: until the next durable commit, [`Db::settle`] waits for one.
    wal_failed: AtomicBool,
    /// Someone waits for the committer (a read, a sync): it ends its batching window now.
    hurry: AtomicBool,
    /// The committer's thread, unparked by [`Shared::wake_committer`].
    committer: std::sync::OnceLock<std::thread::Thread>,
    /// The database: `None` once closed, and while the committer reopens it (`committer.rs`).
    database: Mutex<Option<Arc<Database>>>,
    /// A commit failed and the committer has not written the index since: reads do not wait for it.
    failing: AtomicBool,
}

impl Shared {
    /// End the committer's batching window: someone waits for what it holds.
    fn wake_committer(&self) {
        self.hurry.store(true, Ordering::SeqCst);
        if let Some(t) = self.committer.get() {
            t.unpark();
        }
    }
}

/// The index database and its committer.
pub struct Db {
    shared: Arc<Shared>,
    committer: Mutex<Option<JoinHandle<()>>>,
    durability: Durability,
}

fn idx_err(e: impl std::fmt::Display) -> CacheError {
    CacheError::Index(e.to_string())
}

impl Db {
    /// Longest a change logged with [`Durability::Process`] waits to be made durable against power loss.
    pub const GROUP_COMMIT: Duration = Duration::from_millis(500);

    /// Open (or create, owner-only) the index at `path`, every change durable against power loss when
    /// [`Db::settle`] returns ([`Durability::Power`]).
    pub fn open(path: &Path) -> CacheResult<Arc<Db>> {
        Db::open_with(path, Durability::Power)
    }

    /// Open (or create, owner-only) the index at `path` with `durability`, replay what its log holds, and
    /// start its committer. A log that lost records to damage (see `wal.rs`) is refused
    /// ([`CacheError::IndexDamaged`]): what it lost may be a change not yet at home.
    pub fn open_with(path: &Path, durability: Durability) -> CacheResult<Arc<Db>> {
        Db::open_inner(path, durability, false).map(|(db, _)| db)
    }

    /// Open the index at `path` to save what it holds (`larder recover`): what its log could not give is
    /// left out rather than refused. Returns the index and how many records of its log were lost.
    pub fn open_salvaging(path: &Path) -> CacheResult<(Arc<Db>, u64)> {
        Db::open_inner(path, Durability::Power, true)
    }

    fn open_inner(path: &Path, durability: Durability, salvage: bool) -> CacheResult<(Arc<Db>, u64)> {
        let file = larder_util::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(CacheError::Io)?;
        let db = database_of(file).map_err(idx_err)?;
        {
            let tx = db.begin_write().map_err(idx_err)?;
            tx.open_table(META).map_err(idx_err)?;
            tx.open_table(INODES).map_err(idx_err)?;
            tx.open_table(DENTRIES).map_err(idx_err)?;
            tx.open_table(BLOCKS).map_err(idx_err)?;
            tx.open_table(JOURNAL).map_err(idx_err)?;
            tx.open_table(OBJECTS).map_err(idx_err)?;
            tx.open_table(LISTINGS).map_err(idx_err)?;
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
        // Whatever mode it last ran in, what the log holds goes into the index first.
        let recovered = crate::wal::recover(path).map_err(CacheError::Io)?;
        let lost = recovered.lost;
        if lost > 0 && !salvage {
            return Err(CacheError::IndexDamaged(format!(
                "its log ({}.log0, .log1) is damaged: {lost} of the changes it held since the last commit \
                 cannot be read",
                path.display()
            )));
        }
        if recovered.mended > 0 {
            tracing::warn!(
                records = recovered.mended,
                "records of the index's log were damaged and read from their second copies"
            );
        }
        let (logged, files, generation) = (recovered.mutations, recovered.files, recovered.next_generation);
        if !logged.is_empty() {
            let n = logged.len();
            apply(&db, &logged, Durability::Power).map_err(idx_err)?;
            tracing::info!(
                changes = n,
                "applied the changes the index's log held since its last commit"
            );
        }
        let wal = match durability {
            Durability::Process => Some(Wal::start(files, generation).map_err(CacheError::Io)?),
            Durability::Power => {
                for f in &files {
                    f.set_len(0).map_err(CacheError::Io)?;
                }
                None
            }
        };
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            inlet: Mutex::new(Some(Inlet { sender: tx, wal })),
            wal_failed: AtomicBool::new(false),
            submitted: AtomicU64::new(0),
            applied: Mutex::new(0),
            caught_up: Condvar::new(),
            hurry: AtomicBool::new(false),
            committer: std::sync::OnceLock::new(),
            database: Mutex::new(Some(db.clone())),
            failing: AtomicBool::new(false),
        });
        let worker_shared = shared.clone();
        let worker_path = path.to_path_buf();
        let committer = std::thread::Builder::new()
            .name("larder-index".into())
            .spawn(move || committer(db, worker_shared, rx, durability, &worker_path))
            .map_err(CacheError::Io)?;
        Ok((
            Arc::new(Db {
                shared,
                committer: Mutex::new(Some(committer)),
                durability,
            }),
            lost,
        ))
    }

    /// Submissions made so far: each reaches the log as one record, applied after a crash whole or not at
    /// all.
    pub fn submissions(&self) -> u64 {
        self.shared.submitted.load(Ordering::SeqCst)
    }

    /// How durable a change is once [`Db::settle`] returns.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Queue changes; they reach the index in order. With [`Durability::Process`] they are in the log (the
    /// operating system has them) when this returns.
    pub fn submit(&self, mutations: Vec<Mutation>) {
        if mutations.is_empty() {
            return;
        }
        let Some(mutations) = GATHERED.with(|g| match g.borrow_mut().as_mut() {
            Some((db, gathered)) if *db == self.id() => {
                gathered.extend(mutations);
                None
            }
            _ => Some(mutations),
        }) else {
            return;
        };
        self.submit_now(mutations);
    }

    /// Gather what this thread submits while `f` runs into one submission (one write to the log, one
    /// message to the committer), made when `f` returns: for many small records made under one hold of the
    /// lock that orders them (a listing binding thousands of entries). A read of the index meanwhile
    /// submits what was gathered first, so that it sees it.
    pub fn gathered<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Gathering<'a>(&'a Db, bool);
        impl Drop for Gathering<'_> {
            fn drop(&mut self) {
                if self.1 {
                    let gathered = GATHERED.with(|g| g.borrow_mut().take()).map(|(_, m)| m);
                    self.0.submit_now(gathered.unwrap_or_default());
                }
            }
        }
        let outermost = GATHERED.with(|g| {
            let mut g = g.borrow_mut();
            if g.is_some() {
                return false;
            }
            *g = Some((self.id(), Vec::new()));
            true
        });
        let _gathering = Gathering(self, outermost);
        f()
    }

    /// What this thread gathered for this index so far, submitted now (the gathering goes on): for a
    /// caller that must submit under a lock it lets go of before the gathering ends.
    pub fn submit_gathered(&self) {
        let gathered = GATHERED.with(|g| match g.borrow_mut().as_mut() {
            Some((db, m)) if *db == self.id() => std::mem::take(m),
            _ => Vec::new(),
        });
        self.submit_now(gathered);
    }

    fn id(&self) -> usize {
        self as *const Db as usize
    }

    fn submit_now(&self, mutations: Vec<Mutation>) {
        if mutations.is_empty() {
            return;
        }
        let mut guard = self.shared.inlet.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(inlet) = guard.as_mut() {
            if let Some(wal) = inlet.wal.as_mut()
                && let Err(e) = wal.append(&mutations)
                && !self.shared.wal_failed.swap(true, Ordering::SeqCst)
            {
                tracing::warn!(error = %e, "writing the index's log failed; changes wait for the index's commit until it works again");
            }
            if inlet.sender.send(Msg::Apply(mutations)).is_ok() {
                self.shared.submitted.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Wait (bounded) until the committer has applied everything submitted so far: reads of the index
    /// see every change whose call returned, even one only logged yet.
    fn caught_up(&self) {
        self.submit_gathered();
        let target = self.shared.submitted.load(Ordering::SeqCst);
        if self.shared.failing.load(Ordering::SeqCst) {
            // The committer cannot write the index now: waiting would not help.
            return;
        }
        let mut applied = self.shared.applied.lock().unwrap_or_else(|p| p.into_inner());
        if *applied < target {
            self.shared.wake_committer();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while *applied < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!("the index's committer is behind; reading the index as it is");
                return;
            }
            applied = self
                .shared
                .caught_up
                .wait_timeout(applied, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Wait until everything submitted so far is as durable as the index promises a change to be: in the
    /// log ([`Durability::Process`], nothing to wait for unless a log write failed), or committed and
    /// fsynced ([`Durability::Power`]).
    pub fn settle(&self) -> CacheResult<()> {
        if self.durability == Durability::Process && !self.shared.wal_failed.load(Ordering::SeqCst) {
            if self.shared.inlet.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
                return Err(CacheError::Index("index is closed".into()));
            }
            return Ok(());
        }
        self.sync()
    }

    /// Wait until everything submitted so far (and gathered on this thread) is durable against power loss.
    pub fn sync(&self) -> CacheResult<()> {
        self.submit_gathered();
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let guard = self.shared.inlet.lock().unwrap_or_else(|p| p.into_inner());
            let Some(inlet) = guard.as_ref() else {
                return Err(CacheError::Index("index is closed".into()));
            };
            inlet
                .sender
                .send(Msg::Sync(tx))
                .map_err(|_| CacheError::Index("index committer stopped".into()))?;
        }
        self.shared.wake_committer();
        rx.recv()
            .map_err(|_| CacheError::Index("index committer stopped".into()))?
            .map_err(CacheError::Index)
    }

    /// Make everything durable and stop the committer.
    pub fn close(&self) -> CacheResult<()> {
        if self.shared.inlet.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            return Ok(());
        }
        let result = self.sync();
        // Dropping the sender ends the committer once it has applied what is queued.
        let wal = self
            .shared
            .inlet
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .and_then(|i| i.wal);
        if let Some(handle) = self.committer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = handle.join();
        }
        // Everything is in the index, durably: the log has nothing left to give.
        if result.is_ok()
            && let Some(mut wal) = wal
        {
            let _ = wal.clear();
        }
        // Closed means the file is let go of, its lock with it, so that it can be opened again at once: a
        // read under way (each holds the database, see `reading`) ends first.
        let db = self.shared.database.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut db) = db {
            let deadline = Instant::now() + CLOSE_WAIT;
            while let Err(shared) = Arc::try_unwrap(db) {
                if Instant::now() > deadline {
                    tracing::warn!("a read of the index outlasted its close; the index is let go of after it");
                    break;
                }
                db = shared;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        result
    }

    /// A read transaction that sees every change submitted before it, holding the database while it lives
    /// (a transaction alone would keep the file open after [`Db::close`]).
    fn reading(&self) -> CacheResult<Reading> {
        self.caught_up();
        let db = self
            .shared
            .database
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| CacheError::Index("index is closed, or being reopened after a write failed".into()))?;
        let tx = db.begin_read().map_err(idx_err)?;
        Ok(Reading { tx, _db: db })
    }

    /// A counter or setting stored under `key`.
    pub fn meta(&self, key: &str) -> CacheResult<Option<u64>> {
        let tx = self.reading()?;
        let table = tx.open_table(META).map_err(idx_err)?;
        Ok(table.get(key).map_err(idx_err)?.map(|v| v.value()))
    }

    /// The stored record of inode `ino`.
    pub fn inode(&self, ino: u64) -> CacheResult<Option<Vec<u8>>> {
        let tx = self.reading()?;
        let table = tx.open_table(INODES).map_err(idx_err)?;
        Ok(table.get(ino).map_err(idx_err)?.map(|v| v.value().to_vec()))
    }

    /// The inode stored for `name` in directory `parent`.
    pub fn dentry(&self, parent: u64, name: &[u8]) -> CacheResult<Option<u64>> {
        let tx = self.reading()?;
        let table = tx.open_table(DENTRIES).map_err(idx_err)?;
        Ok(table.get((parent, name)).map_err(idx_err)?.map(|v| v.value()))
    }

    /// Every stored entry of directory `parent`: (name, inode).
    pub fn dentries_of(&self, parent: u64) -> CacheResult<Vec<(Vec<u8>, u64)>> {
        let tx = self.reading()?;
        let table = tx.open_table(DENTRIES).map_err(idx_err)?;
        let mut out = Vec::new();
        each_dentry(&table, parent, |name, ino| {
            out.push((name.to_vec(), ino));
            Ok(())
        })?;
        Ok(out)
    }

    /// Every stored entry of directory `parent` with the record of its inode, in one read.
    pub fn children_of(&self, parent: u64) -> CacheResult<Vec<StoredChild>> {
        let tx = self.reading()?;
        let dentries = tx.open_table(DENTRIES).map_err(idx_err)?;
        let inodes = tx.open_table(INODES).map_err(idx_err)?;
        let mut out = Vec::new();
        each_dentry(&dentries, parent, |name, ino| {
            let rec = inodes.get(ino).map_err(idx_err)?.map(|r| r.value().to_vec());
            out.push((name.to_vec(), ino, rec));
            Ok(())
        })?;
        Ok(out)
    }

    /// The listing times kept at the last clean stop: (directory, ms since the epoch).
    pub fn listings(&self) -> CacheResult<Vec<(u64, u64)>> {
        let tx = self.reading()?;
        let table = tx.open_table(LISTINGS).map_err(idx_err)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(idx_err)? {
            let (k, v) = row.map_err(idx_err)?;
            out.push((k.value(), v.value()));
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
        let tx = self.reading()?;
        let table = tx.open_table(def).map_err(idx_err)?;
        for row in table.iter().map_err(idx_err)? {
            let (k, v) = row.map_err(idx_err)?;
            f(k.value(), v.value());
        }
        Ok(())
    }

    /// Visit every directory entry: the inode each names.
    pub fn for_each_dentry(&self, mut f: impl FnMut(u64)) -> CacheResult<()> {
        let tx = self.reading()?;
        let table = tx.open_table(DENTRIES).map_err(idx_err)?;
        for row in table.iter().map_err(idx_err)? {
            let (_, v) = row.map_err(idx_err)?;
            f(v.value());
        }
        Ok(())
    }

    /// Visit every object's stored state: (object, flags, content length, content crc).
    pub fn for_each_object(&self, mut f: impl FnMut(u64, u32, u64, u32)) -> CacheResult<()> {
        let tx = self.reading()?;
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
        let tx = self.reading()?;
        let table = tx.open_table(BLOCKS).map_err(idx_err)?;
        for row in table.iter().map_err(idx_err)? {
            let (k, v) = row.map_err(idx_err)?;
            let ((object, index), (len, crc)) = (k.value(), v.value());
            f(object, index, len, crc);
        }
        Ok(())
    }
}

/// See [`Db::reading`]. (Fields drop in order: the transaction before the database.)
struct Reading {
    tx: redb::ReadTransaction,
    _db: Arc<Database>,
}

impl std::ops::Deref for Reading {
    type Target = redb::ReadTransaction;

    fn deref(&self) -> &redb::ReadTransaction {
        &self.tx
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Visit the stored entries of directory `parent` in `table`, in order of name: (name, inode).
fn each_dentry(
    table: &redb::ReadOnlyTable<(u64, &'static [u8]), u64>,
    parent: u64,
    mut each: impl FnMut(&[u8], u64) -> CacheResult<()>,
) -> CacheResult<()> {
    let lo: (u64, &[u8]) = (parent, &[]);
    for row in table.range(lo..).map_err(idx_err)? {
        let (k, v) = row.map_err(idx_err)?;
        let (p, name) = k.value();
        if p != parent {
            break;
        }
        each(name, v.value())?;
    }
    Ok(())
}

mod committer;

use committer::{apply, committer};

/// The database in `file`, opened (or made): redb repairs it first if its last writer did not end well.
/// The index's pages are in the page cache as well: its own cache is kept small, since the daemon's memory
/// is a budget of its own (a million cached files in 256 MiB).
fn database_of(file: std::fs::File) -> Result<Database, redb::DatabaseError> {
    Database::builder().set_cache_size(INDEX_CACHE).create_file(file)
}

/// The database at `path`, opened again (see [`database_of`]).
fn open_database(path: &Path) -> Result<Database, String> {
    let file = larder_util::private::options()
        .read(true)
        .write(true)
        .create(false)
        .open(path)
        .map_err(|e| e.to_string())?;
    database_of(file).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "LARDER_DB_KILLED_CHILD";

    /// Run in a child process: log changes at `durability`, then die by SIGKILL before any group commit.
    fn child(dir: &Path, durability: Durability) -> ! {
        let db = Db::open_with(&dir.join("index.redb"), durability).unwrap();
        for ino in 0..1000u64 {
            db.submit(vec![Mutation::PutInode(ino, ino.to_le_bytes().to_vec())]);
            db.settle().unwrap();
        }
        // SAFETY: kill(2) of this very process; nothing runs after it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!("SIGKILL returned")
    }

    fn killed_child_keeps_everything_settled(test: &str, durability: Durability) {
        if let Ok(dir) = std::env::var(CHILD) {
            child(Path::new(&dir), durability);
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env(CHILD, dir.path())
            .status()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "the child did not die by SIGKILL: {status:?}"
        );
        let db = Db::open(&dir.path().join("index.redb")).unwrap();
        for ino in 0..1000u64 {
            assert_eq!(
                db.inode(ino).unwrap(),
                Some(ino.to_le_bytes().to_vec()),
                "inode {ino} was settled before the kill and is gone"
            );
        }
        // Replayed once, the log is empty: a second open finds the same.
        db.close().unwrap();
        assert!(
            crate::wal::recover(&dir.path().join("index.redb"))
                .unwrap()
                .mutations
                .is_empty()
        );
    }

    /// Closed, the index can be opened again at once, also when a read was under way at the close (a
    /// read transaction alone keeps the file, and its lock, open).
    #[test]
    fn a_closed_index_opens_again_at_once_after_a_read_under_way_at_its_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.redb");
        let db = Db::open(&path).unwrap();
        db.submit(vec![Mutation::PutInode(1, vec![1])]);
        db.settle().unwrap();
        let (began, ends) = (std::sync::Barrier::new(2), Duration::from_millis(200));
        std::thread::scope(|s| {
            s.spawn(|| {
                let tx = db.reading().unwrap();
                began.wait();
                std::thread::sleep(ends);
                drop(tx);
            });
            began.wait();
            db.close().unwrap();
            let again = Db::open(&path).expect("opened again after its close");
            assert_eq!(again.inode(1).unwrap(), Some(vec![1]));
        });
    }

    #[test]
    fn changes_settled_at_process_durability_survive_a_kill_before_the_group_commit() {
        killed_child_keeps_everything_settled(
            "db::tests::changes_settled_at_process_durability_survive_a_kill_before_the_group_commit",
            Durability::Process,
        );
    }

    #[test]
    fn changes_settled_at_power_durability_survive_a_kill() {
        killed_child_keeps_everything_settled(
            "db::tests::changes_settled_at_power_durability_survive_a_kill",
            Durability::Power,
        );
    }

    #[test]
    fn a_read_sees_every_change_submitted_before_it_even_before_the_committer_applied_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open_with(&dir.path().join("index.redb"), Durability::Process).unwrap();
        for i in 0..2000u64 {
            let name = format!("n{i}").into_bytes();
            db.submit(vec![Mutation::PutDentry(1, name.clone(), i)]);
            assert_eq!(db.dentry(1, &name).unwrap(), Some(i), "entry {i} just made");
            db.submit(vec![Mutation::DelDentry(1, name.clone())]);
            assert_eq!(db.dentry(1, &name).unwrap(), None, "entry {i} just removed");
        }
    }

    #[test]
    fn gathered_changes_are_one_log_write_and_reads_meanwhile_see_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.redb");
        let db = Db::open_with(&path, Durability::Process).unwrap();
        let other = Db::open_with(&dir.path().join("other.redb"), Durability::Process).unwrap();
        let logged = || std::fs::metadata(&crate::wal::paths(&path)[0]).unwrap().len();
        let before = logged();
        db.gathered(|| {
            for i in 0..100u64 {
                db.submit(vec![Mutation::PutDentry(1, format!("n{i}").into_bytes(), i)]);
            }
            // Another index's changes are not held back with these.
            other.submit(vec![Mutation::PutInode(7, b"o".to_vec())]);
            assert_eq!(other.inode(7).unwrap(), Some(b"o".to_vec()));
            assert_eq!(logged(), before, "gathered changes were written one by one");
            // A read while gathering sees what was gathered.
            assert_eq!(db.dentry(1, b"n99").unwrap(), Some(99));
            db.submit(vec![Mutation::PutDentry(1, b"late".to_vec(), 1000)]);
        });
        assert!(logged() > before, "the gathered changes were not logged");
        assert_eq!(db.dentry(1, b"late").unwrap(), Some(1000));
        assert_eq!(db.dentries_of(1).unwrap().len(), 101);
    }

    #[test]
    fn a_sync_at_process_durability_commits_and_empties_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.redb");
        let db = Db::open_with(&path, Durability::Process).unwrap();
        db.submit(vec![Mutation::PutInode(1, b"a".to_vec())]);
        let logged = |i: usize| std::fs::metadata(&crate::wal::paths(&path)[i]).unwrap().len();
        assert!(logged(0) > 16, "the change is not in the log");
        db.sync().unwrap();
        // The log went on in its other file; the first was emptied once the commit was durable.
        assert_eq!(logged(0), 0);
        assert_eq!(db.inode(1).unwrap(), Some(b"a".to_vec()));
        // Left alone, the group commit does the same within GROUP_COMMIT.
        db.submit(vec![Mutation::PutInode(2, b"b".to_vec())]);
        assert!(logged(1) > 16);
        std::thread::sleep(Db::GROUP_COMMIT * 3);
        assert_eq!(logged(1), 0, "no group commit came");
    }
}
