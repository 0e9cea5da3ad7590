//! The caching file system, without FUSE, as its callers see it: a thin façade over its three
//! components (design note 012), which it builds and wires ([`Fs::with_tiers`]) and starts
//! ([`Fs::start`]):
//! - the **namespace** ([`Names`]): names, inodes, home locations, renames in flight, open handles,
//!   listings and lookups of home;
//! - the **data path** ([`DataPath`]): home, the store and the tiers between, prefetch, open, read and
//!   write, passthrough, the checks of cache files, residency, serving peers;
//! - the **change pipeline** ([`Changes`]): changes of names and attributes, the journal, the flushers
//!   that push it to home in order, conflicts.
//!
//! Each keeps its state to itself; every call here is one component's, or wires two.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering::{self, Relaxed};
use std::time::Duration;

use larder_cache::Store;
use larder_home::{RenameFlags, SetAttr, StatFs};

use crate::changes::{Changes, InGroup, release_freed_memory};
use crate::coherence::{Coherence, GiveUp, Handover, HeldRecord};
use crate::data::{Core, DamagedFile, DataPath, Residency};
use crate::namespace::{Names, XattrFlags, lock};
use crate::pipeline::Pipeline;
use crate::serve::{HeldRead, HeldUnit, ServeResult, UnitAsk};
use crate::tier::TierStats;
use crate::{Conflict, DirItem, Drained, Entry, FsConfig, FsResult, FsStats, JournalStats, OpenReply, RefusedChange};

mod open;

/// How often the inodes in memory are brought back within `--max-inodes`.
const TRIM_EVERY: Duration = Duration::from_millis(500);
/// Inodes let go between two returns of freed memory to the system.
const RELEASE_AFTER: u64 = 10_000;

/// The caching file system, without FUSE: see the module doc.
pub struct Fs {
    cfg: FsConfig,
    core: Arc<Core>,
    health: Arc<larder_home::Health>,
    pipeline: Arc<Pipeline>,
    pub(crate) names: Arc<Names>,
    pub(crate) data: Arc<DataPath>,
    pub(crate) changes: Arc<Changes>,
    /// The generation of every inode number this cache gives out (see [`Fs::generation`]).
    generation: u32,
}

impl Fs {
    /// Counts of the read path's tiers, nearest first (the store, ..., home).
    pub fn tier_stats(&self) -> Vec<TierStats> {
        self.core.tiers.stats()
    }

    /// Whether home is believed reachable.
    pub fn home_online(&self) -> bool {
        self.health.online()
    }

    /// The generation the kernel is told for every inode, and puts in the file handles it makes
    /// (`name_to_handle_at`, an NFS server's handles): drawn at random when the cache directory is made and
    /// kept in its index. Inode numbers are never given out twice by one cache, so within it the number
    /// alone names the file; a handle made on an earlier cache in the same place (wiped, made again, its
    /// numbers given out anew) carries another generation, and the kernel answers `ESTALE` for it instead
    /// of opening whatever file has that number now.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// When reads move access times.
    pub fn atime(&self) -> crate::Atime {
        self.cfg.atime
    }

    /// How changes reach home.
    pub fn write_mode(&self) -> crate::WriteMode {
        self.cfg.write_mode
    }

    /// How durable a change made in the cache is when its call returns.
    pub fn durability(&self) -> larder_cache::Durability {
        self.core.store.db().durability()
    }

    /// Wake the flushers (home came back).
    pub fn wake(&self) {
        self.pipeline.notify();
    }

    /// Home, the store and the tiers between.
    #[cfg(test)]
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The local store.
    pub fn store(&self) -> &Arc<Store> {
        &self.core.store
    }

    /// Capacity of home.
    pub fn statfs(&self) -> FsResult<StatFs> {
        Ok(self.core.home.statfs()?)
    }

    /// Figures for status output.
    pub fn stats(&self) -> FsStats {
        let (inodes, dirty_files) = {
            let ns = self.names.read();
            let dirty = ns.inodes.values().filter(|n| !n.dirty.is_empty()).count() as u64;
            (ns.inodes.len() as u64, dirty)
        };
        let meta = self.names.meta_counters();
        let reads = self.data.read_counters();
        FsStats {
            inodes,
            inodes_reclaimed: meta.reclaimed.load(Relaxed),
            inodes_reloaded: meta.reloaded.load(Relaxed),
            inodes_trimmed: meta.trimmed.load(Relaxed),
            open_handles: self.names.handles().len() as u64,
            dirty_files,
            readahead_blocks: self.data.readahead().submitted(),
            reads: reads.reads.load(Relaxed),
            read_bytes: reads.bytes.load(Relaxed),
            read_seconds: reads.nanos.load(Relaxed) as f64 / 1e9,
            bytes_from_cache: reads.cache_bytes.load(Relaxed),
            bytes_from_home: reads.home_bytes.load(Relaxed),
            home_waits: reads.home_waits.load(Relaxed),
            listings_for_lookups: meta.listings_for_lookups.load(Relaxed),
            listings_for_revalidation: meta.listings_for_revalidation.load(Relaxed),
            listings_ahead: meta.listings_ahead.load(Relaxed),
        }
    }

    /// Start the background work: the check of cache files, the trimming of inodes in memory, the
    /// revalidation of directories ahead of a walk, and the flusher threads (write-back; in write-through
    /// they push only what a crash left queued, callers push their own changes).
    pub fn start(&self) {
        self.data.start_verifier();
        let changes = Arc::downgrade(&self.changes);
        self.health
            .set_explainer(move |online| changes.upgrade().map(|c| c.explain_health(online)).unwrap_or_default());
        let (names, pipeline) = (Arc::downgrade(&self.names), self.pipeline.clone());
        let trimmer = std::thread::Builder::new().name("larder-trim".into()).spawn(move || {
            let mut trimmed_at = 0;
            loop {
                std::thread::sleep(TRIM_EVERY);
                let Some(names) = names.upgrade() else { return };
                if pipeline.stopping.load(Ordering::SeqCst) {
                    return;
                }
                names.trim_inodes();
                // Many inodes let go (the kernel forgot them, or was asked to): the allocator's freed
                // memory goes back to the system, or the daemon's resident size would never shrink.
                let reclaimed = names.meta_counters().reclaimed.load(Ordering::Relaxed);
                if reclaimed >= trimmed_at + RELEASE_AFTER {
                    trimmed_at = reclaimed;
                    release_freed_memory();
                }
            }
        });
        if let Err(e) = trimmer {
            tracing::error!(error = %e, "cannot start the thread that keeps inodes within --max-inodes");
        }
        self.names.start_walk_ahead();
        if !self.cfg.write_mode.pushes() {
            return;
        }
        let mut flushers = lock(&self.pipeline.flushers);
        for i in 0..self.cfg.flush_threads.max(1) {
            let changes = self.changes.clone();
            match std::thread::Builder::new()
                .name(format!("larder-flush-{i}"))
                .spawn(move || changes.flush_worker(i))
            {
                Ok(h) => flushers.push(h),
                Err(e) => tracing::error!(error = %e, "cannot start a flusher thread"),
            }
        }
    }

    /// The validity lag, which is also the kernel's attribute and entry timeout.
    pub fn validity_lag(&self) -> std::time::Duration {
        self.names.validity_lag()
    }

    /// How to wait until the invalidations sent so far reached the kernel: see [`Names::kernel_barrier`].
    pub fn set_kernel_barrier(&self, f: Box<dyn Fn() + Send + Sync>) {
        self.names.set_kernel_barrier(f)
    }

    /// Send the kernel's invalidations to `f` (it must not block: it is called with locks held).
    pub fn set_invalidator(&self, f: Box<dyn Fn(crate::Invalidation) + Send + Sync>) {
        self.names.set_invalidator(f)
    }

    /// Home calls the namespace made: stats of one name, listings, revalidations by stat (three counters
    /// read, nothing walked: sampled every second for status rates).
    pub fn home_meta_calls(&self) -> [u64; 3] {
        self.names.home_meta_calls()
    }

    /// What home's rewrites moved, where it moves other bytes than the calls name (an object store).
    pub fn home_rewrite_bytes(&self) -> Option<larder_home::RewriteBytes> {
        self.core.home.rewrite_bytes()
    }

    /// Look `name` up in `parent`; counts one kernel reference on success.
    ///
    /// `.` and `..` are the kernel's lookups of an inode by its number alone, and of its parent, for a file
    /// handle (`open_by_handle_at`, an NFS server) whose inode it no longer holds: see
    /// `Names::lookup_number`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        match name.as_encoded_bytes() {
            b"." => self.names.lookup_number(parent),
            b".." => self.names.lookup_parent(parent),
            _ => self.names.lookup(parent, name),
        }
    }

    /// The kernel dropped `n` references to `ino`.
    /// The count drops with the namespace shared (the kernel forgets as often as it looks up); only the
    /// last reference, which may let the inode leave memory, takes it alone.
    pub fn forget(&self, ino: u64, n: u64) {
        self.names.forget(ino, n)
    }

    /// Attributes of `ino`, revalidated against home once the validity lag has passed.
    pub fn getattr(&self, ino: u64) -> FsResult<Entry> {
        self.names.getattr(ino)
    }

    /// Read the target of a symlink.
    /// A symlink's target never changes in place: another target is another object, which the lookup or
    /// revalidation that reached this inode found (and which then holds no cached target). So a cached
    /// target is the answer, fresh or not; home is asked only for one never read.
    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        self.names.readlink(ino)
    }

    /// Keep the files in memory within `--max-inodes`: idle ones nothing refers to leave at once, and
    /// the kernel is asked to forget idle ones it holds (its forget then lets them go). At most
    /// [`TRIM_BATCH`] a call; returns how many were let go or asked about.
    pub fn trim_inodes(&self) -> usize {
        self.names.trim_inodes()
    }

    /// Open a directory: its listing, revalidated if needed, is fixed for this handle.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        self.names.opendir(ino)
    }

    /// Entries of an open directory from position `offset` on (0 is `.`, 1 is `..`).
    /// A listing from the start is a read of the directory: its access time moves as the mount's atime
    /// option says.
    pub fn readdir(&self, fh: u64, offset: u64) -> FsResult<Vec<(u64, DirItem)>> {
        let entries = self.names.readdir(fh, offset)?;
        if offset == 0
            && let Some(ino) = self.names.handles().ino(fh)
        {
            self.names.accessed(ino);
        }
        Ok(entries)
    }

    /// Close an open directory.
    pub fn releasedir(&self, fh: u64) {
        self.names.releasedir(fh)
    }

    /// The value of `ino`'s extended attribute `name` (`ENODATA` if it has none of that name).
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        self.names.getxattr(ino, name)
    }

    /// The names of `ino`'s extended attributes.
    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        self.names.listxattr(ino)
    }

    /// Give `ino` the extended attribute `name` with `value`.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> FsResult<()> {
        self.changes.setxattr(ino, name, value, flags)
    }

    /// Take `ino`'s extended attribute `name` away (`ENODATA` if it has none).
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.changes.removexattr(ino, name)
    }

    /// Use `c` for writes across the cluster: publish this node's changes, apply the others' before
    /// opens.
    pub fn set_coherence(&self, c: Arc<dyn Coherence>) {
        self.names.set_coherence(c)
    }

    /// Grant file locks through `table`, across the cluster (design note 017). Set before the mount
    /// starts; without it the kernel keeps locks, for this node alone.
    pub fn set_lock_table(&self, table: Arc<dyn crate::locks::LockTable>) {
        self.data.set_lock_table(table)
    }

    /// Whether file locks are granted across a cluster.
    pub fn shares_locks(&self) -> bool {
        self.data.shares_locks()
    }

    /// The lock that would stop `ask` on `ino` (`F_GETLK`), if any.
    pub fn getlk(&self, ino: u64, ask: &crate::locks::LockAsk) -> FsResult<Option<crate::locks::LockRange>> {
        self.data.getlk(ino, ask)
    }

    /// Lock or unlock `ino` (`F_SETLK`, `F_SETLKW` with `wait`, `flock`): see the design note 017.
    /// `cancelled` is asked while waiting whether the caller gave up (an interrupt).
    pub fn setlk(
        &self,
        ino: u64,
        ask: &crate::locks::LockAsk,
        wait: bool,
        cancelled: &dyn Fn() -> bool,
    ) -> FsResult<()> {
        self.data.setlk(ino, ask, wait, cancelled)
    }

    /// Every lock `owner` holds on `ino` goes: a close by its process (POSIX locks) or of its open file
    /// (`flock`).
    pub fn release_locks(&self, ino: u64, owner: u64) {
        self.data.release_locks(ino, owner)
    }

    /// Let this node's changes of `path` go before it gives the file's write token up to a peer: pushed
    /// to home (the whole journal is drained, within `drain_within`), or, when home cannot take them, handed
    /// over to the peer (see [`GiveUp`]). The cluster removes this node's held records and the token after.
    pub fn give_up(&self, path: &[u8], drain_within: std::time::Duration) -> Result<GiveUp, String> {
        self.changes.give_up(path, drain_within)
    }

    /// The peer `path`'s changes were handed over to answered: with `taken`, it has them, and they are
    /// dropped here; else they are this node's again, pushed to home as before.
    pub fn handed_over(&self, path: &[u8], taken: bool) -> FsResult<()> {
        self.changes.handed_over(path, taken)
    }

    /// Make the changes of `path` another node hands over (`h`) this node's own, durably: see
    /// [`Handover`].
    pub fn take_handover(&self, path: &[u8], h: &Handover) -> FsResult<()> {
        self.changes.take_handover(path, h)
    }

    /// The home version of `path` as this node has it clean, if it does.
    pub fn home_version(&self, path: &[u8]) -> Option<larder_home::Version> {
        self.changes.home_version(path)
    }

    /// `path`, cached here as `from` (another node's held version), is `to` at home now: see
    /// [`GiveUp::NothingHere`].
    pub fn rebase(&self, path: &[u8], from: &larder_home::Version, to: larder_home::Version) {
        self.changes.rebase(path, from, to)
    }

    /// Undo [`Fs::take_handover`] of `path`: the giver kept its changes.
    pub fn abandon_handover(&self, path: &[u8]) {
        self.changes.abandon_handover(path)
    }

    /// This node's records of `paths`, as it has them now: see [`held_record`].
    pub fn held_records(&self, me: u64, paths: Vec<Vec<u8>>) -> Vec<(Vec<u8>, HeldRecord)> {
        self.names.held_records(me, paths)
    }

    /// Forget what this node cached of `path` and of the directory it is in, in memory and in the
    /// kernel: another node changed it (its held record was written or removed).
    pub fn invalidate_path(&self, path: &[u8]) {
        self.names.invalidate_path(path)
    }

    /// The unit a peer asks for: see the module doc.
    pub fn serve_unit(&self, ask: &UnitAsk) -> ServeResult<Arc<Vec<u8>>> {
        self.data.serve_unit(ask)
    }

    /// Bytes of a file this node holds changes of, for a peer (see [`HeldRead`]): only of the version of
    /// the held record the peer read; if this node published a newer one since, `OtherVersion`.
    pub fn serve_held(&self, ask: &HeldRead) -> ServeResult<Vec<u8>> {
        self.data.serve_held(ask)
    }

    /// Every unit this node holds whole of the files it knows clean and at home, with the version home
    /// has: the units a peer could be served. A walk over the namespace (taken shared, once) and the
    /// store's index: for the status and for leaving, not for the I/O path.
    pub fn held_units(&self) -> Vec<HeldUnit> {
        self.data.held_units()
    }

    /// Unit `index` of cache object `object` if the file `ino` has that object, clean and at home, and
    /// this node holds the unit whole: what migration may hand over instead of evicting.
    pub fn held_unit_of(&self, ino: u64, object: u64, index: u32) -> Option<HeldUnit> {
        self.data.held_unit_of(ino, object, index)
    }

    /// The inode of each file's cache object: a walk over the namespace, for a caller that keeps it.
    pub fn files_by_object(&self) -> HashMap<u64, u64> {
        self.data.files_by_object()
    }

    /// Open a file. Its attributes are revalidated first once the validity lag has passed (always, with a
    /// lag of 0), so a version changed at home is never served from the cache after the open.
    ///
    /// In a cluster, the changes other nodes published before the open are applied first: what another
    /// node closed is what this open sees.
    ///
    /// An open for reading counts as a read for the access time: the reads that follow may never reach
    /// larder (the kernel serves them from the cache file through passthrough, or from its page cache).
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<OpenReply> {
        let reply = self.data.open(ino, flags)?;
        if flags & libc::O_ACCMODE != libc::O_WRONLY && flags & libc::O_NOATIME == 0 && self.names.accessed(ino) {
            // The kernel's attributes may be fresh still: a read from its page cache would not refresh them.
            self.names.invalidate(crate::Invalidation::Attr(ino));
        }
        Ok(reply)
    }

    /// Whether passthrough was asked for in the configuration.
    pub fn passthrough_wanted(&self) -> bool {
        self.data.passthrough_wanted()
    }

    /// The object (content version) handle `fh` reads.
    pub fn handle_object(&self, fh: u64) -> Option<u64> {
        self.data.handle_object(fh)
    }

    /// End the hold [`Fs::passthrough`] took for `fh` when the kernel did not take the file after all.
    pub fn unhold(&self, fh: u64) {
        self.data.unhold(fh)
    }

    /// The cache file the kernel may read and write handle `fh`'s data in directly (FUSE passthrough), for
    /// a handle whose open said `passthrough`, or any open of an inode the kernel already serves from that
    /// file (`backed`: the kernel requires every open of it to be served so, and what its writers wrote
    /// is not taken in yet). From then until the handle is released, the store holds its object: no
    /// eviction, and no hole punched under the reader. `None` if the file is no longer whole.
    pub fn passthrough(&self, fh: u64, backed: bool) -> Option<Arc<std::fs::File>> {
        self.data.passthrough(fh, backed)
    }

    /// Create and open a regular file. An existing file is opened instead unless `O_EXCL` is given.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        uid: u32,
        gid: u32,
    ) -> FsResult<(Entry, OpenReply)> {
        self.data.create(parent, name, mode, flags, uid, gid)
    }

    /// Make and open a regular file with no name in `parent` (`open(2)`'s `O_TMPFILE`): it is gone at its
    /// last close unless [`Fs::link`] names it first (`linkat(2)`), and home hears of it only then.
    pub fn tmpfile(&self, parent: u64, mode: u32, flags: i32, uid: u32, gid: u32) -> FsResult<(Entry, OpenReply)> {
        self.data.tmpfile(parent, mode, flags, uid, gid)
    }

    /// Read up to `size` bytes at `offset`.
    /// A read through the mount moves the file's access time as the mount's atime option says.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let data = self.data.read(fh, offset, size)?;
        if let Some(ino) = self.names.handles().ino(fh) {
            self.names.accessed(ino);
        }
        Ok(data)
    }

    /// Write `data` at `offset` into the cached copy; it reaches home on flush, fsync or close.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.data.write(fh, offset, data)
    }

    /// Make pending writes of the file behind `fh` safe (close and fsync): pushed to home (write-through)
    /// or durable in the cache and queued (write-back).
    pub fn flush(&self, fh: u64) -> FsResult<()> {
        self.data.flush(fh)
    }

    /// Make the file behind `fh` durable against power loss: its data and every change made so far
    /// (write-back: in the cache; write-through: at home).
    pub fn fsync(&self, fh: u64) -> FsResult<()> {
        self.data.fsync(fh)
    }

    /// Make every change made so far durable against power loss (`fsync` of a directory, `syncfs`).
    pub fn sync_changes(&self) -> FsResult<()> {
        self.data.sync_changes()
    }

    /// Close a handle: push what is pending, and drop an unlinked file's data once nothing uses it.
    pub fn release(&self, fh: u64) -> FsResult<()> {
        self.data.release(fh)
    }

    /// `fallocate(2)` of `length` bytes from `offset` on the file open as `fh` (open for writing: the
    /// kernel checks), with Linux's `mode` flags. See the module's documentation for what each mode does.
    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        self.data.fallocate(fh, offset, length, mode)
    }

    /// The files whose unpushed data is damaged in the cache now (see [`DataPath::damaged_found`]).
    pub fn damaged_files(&self) -> Vec<DamagedFile> {
        self.data.damaged_files()
    }

    /// Bring `inos` into the cache now, their blocks fetched over the ingest streams in parallel. Each file
    /// is revalidated first once the validity lag has passed. Directories and other non-files are left as
    /// they are (their metadata is cached by the lookup that named them).
    pub fn prefetch(&self, inos: &[u64]) -> Vec<FsResult<Residency>> {
        self.data.prefetch(inos)
    }

    /// Pin `inos` (bring them in and never evict them) or unpin them. Pins stay with the file across
    /// restarts and across new versions from home (a new version of a pinned file is fetched when larder
    /// learns of it). A pin that would take pinned files past [`PIN_SHARE`] of the cache is refused with
    /// `ENOSPC`.
    pub fn pin(&self, inos: &[u64], pin: bool) -> Vec<FsResult<Residency>> {
        self.data.pin(inos, pin)
    }

    /// Drop the cached data of `inos` now. Changes not yet at home stay (home does not have them), and
    /// pinned files are kept (unpin them first), as are files the kernel is reading directly.
    pub fn evict(&self, inos: &[u64]) -> Vec<FsResult<Residency>> {
        self.data.evict(inos)
    }

    /// Create a directory.
    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, uid: u32, gid: u32) -> FsResult<Entry> {
        self.changes.mkdir(parent, name, mode, uid, gid)
    }

    /// Create a special or regular file.
    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u64, uid: u32, gid: u32) -> FsResult<Entry> {
        self.changes.mknod(parent, name, mode, rdev, uid, gid)
    }

    /// Create a symlink.
    pub fn symlink(&self, parent: u64, name: &OsStr, target: &[u8], uid: u32, gid: u32) -> FsResult<Entry> {
        self.changes.symlink(parent, name, target, uid, gid)
    }

    /// Remove a file.
    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.changes.unlink(parent, name)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.changes.rmdir(parent, name)
    }

    /// Hard-link `ino` as `name` in `parent`.
    pub fn link(&self, ino: u64, parent: u64, name: &OsStr) -> FsResult<Entry> {
        self.changes.link(ino, parent, name)
    }

    /// Change attributes (a size change is queued as data).
    pub fn setattr(&self, ino: u64, changes: &SetAttr) -> FsResult<Entry> {
        self.changes.setattr(ino, changes)
    }

    /// A write by a caller without `CAP_FSETID` (the kernel says so, and leaves the rest to the file
    /// system): a file's set-ID bits go as [`Fs::setattr_dropping`] says.
    pub fn drop_set_id(&self, ino: u64, in_group: InGroup) -> FsResult<()> {
        self.changes.drop_set_id(ino, in_group)
    }

    /// [`Fs::setattr`], and with `drop_set_id`, what the kernel leaves to the file system when it lets it
    /// clear set-ID bits itself (`FUSE_HANDLE_KILLPRIV_V2`, which spares a refresh of the attributes
    /// before every `chown`), as Linux's own file systems do: a non-directory's set-user-ID bit goes, and
    /// its set-group-ID bit when group execute is set or the caller is not in the file's group (without
    /// group execute the bit marks mandatory locking, kept for the group's members), unless the change
    /// sets the mode itself. The caller says when, and who asks (`in_group`): always at an owner change,
    /// and at a truncation or write by a caller without `CAP_FSETID`.
    pub fn setattr_dropping(&self, ino: u64, changes: &SetAttr, drop_set_id: Option<InGroup>) -> FsResult<Entry> {
        self.changes.setattr_dropping(ino, changes, drop_set_id)
    }

    /// Rename `name` in `parent` to `new_name` in `new_parent`.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> FsResult<()> {
        self.changes.rename(parent, name, new_parent, new_name, flags)
    }

    /// Stop the flusher threads (what is queued stays queued).
    pub fn stop_flushers(&self) {
        self.changes.stop_flushers()
    }

    /// Push everything queued now, regardless of the sync lag (ops home refused are tried again at once);
    /// wait up to `timeout`, or until only refused ops (and those queued behind them) are left.
    pub fn drain(&self, timeout: Duration) -> Drained {
        self.changes.drain(timeout)
    }

    /// The journal's figures.
    pub fn journal_stats(&self) -> JournalStats {
        self.changes.journal_stats()
    }

    /// Every conflict recorded in this cache directory.
    pub fn conflicts(&self) -> Vec<Conflict> {
        self.changes.conflicts()
    }

    /// Ops that home refused and that wait to be retried, in queue order.
    pub fn failed_ops(&self) -> Vec<RefusedChange> {
        self.changes.failed_ops()
    }
}
