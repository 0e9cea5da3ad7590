//! Opening the core over a cache directory (recovery after an unclean stop included) and closing it.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_cache::{Mutation, Store};
use larder_home::{FileKind, Health, Home, unreachable};

use super::Fs;
use crate::changes::Changes;
use crate::data::{Core, DataPath};
use crate::journal::{Journal, Op, OpKind};
use crate::key::HomeId;
use crate::namespace::{Inode, Names, Namespace, ROOT, RUNNING, Unsettled, claim_ranges};
use crate::pipeline::Pipeline;
use crate::readahead::Readahead;
use crate::record::InodeRecord;
use crate::tier::{HomeTier, StoreTier, Tier, Tiers};
use crate::{FsConfig, FsError, FsResult};

impl Fs {
    /// A file system over `home`, caching in `store`. Loads the persisted namespace, drops cache objects
    /// nothing refers to, and checks that home's root is reachable.
    pub fn new(home: Arc<dyn Home>, store: Arc<Store>, cfg: FsConfig) -> FsResult<Fs> {
        Fs::with_health(home, store, cfg, Health::new())
    }

    /// As [`Fs::new`], sharing `health` with the home's health layer: while it says home is offline, the
    /// cached namespace is served and changes wait in the journal.
    pub fn with_health(home: Arc<dyn Home>, store: Arc<Store>, cfg: FsConfig, health: Arc<Health>) -> FsResult<Fs> {
        Fs::with_tiers(home, store, cfg, health, Vec::new())
    }

    /// As [`Fs::with_health`], reading through `between` (nearest first) after the store and before home.
    pub fn with_tiers(
        home: Arc<dyn Home>,
        store: Arc<Store>,
        cfg: FsConfig,
        health: Arc<Health>,
        between: Vec<Arc<dyn Tier>>,
    ) -> FsResult<Fs> {
        let db = store.db().clone();
        let generation = match db.meta("generation")? {
            Some(g) => g as u32,
            None => {
                let mut bytes = [0u8; 4];
                getrandom::fill(&mut bytes)
                    .map_err(|e| FsError::Cache(larder_cache::CacheError::Index(e.to_string())))?;
                // Not 0: the generation of a handle no cache made.
                let g = u32::from_ne_bytes(bytes).max(1);
                db.submit(vec![larder_cache::Mutation::PutMeta("generation", g as u64)]);
                g
            }
        };
        let mut ns = Namespace {
            next_ino: db.meta("next_ino")?.unwrap_or(ROOT + 1),
            next_object: db.meta("next_object")?.unwrap_or(1),
            ..Namespace::default()
        };
        // Set while a daemon has the cache open, cleared by `shutdown`: found set, the last one did not
        // stop cleanly (killed, or the machine went down).
        let unclean = db.meta(RUNNING)? == Some(1);
        if !unclean {
            ns.restored = restored_listings(&db.listings()?, cfg.validity_lag);
        }
        let (owners, dirty, dropped_records) = collect_live(&db, unclean)?;
        let live: HashSet<u64> = owners.keys().copied().collect();
        // A cache file holding changes not yet at home is never deleted as an orphan: moved aside, and listed
        // as a conflict below.
        let retained = store.retain_objects(&live, &cfg.conflicts_dir.join("lost+found"));
        let (orphan_objects, orphan_files) = (retained.objects, retained.files);
        // Blocks written here and not at home yet are the only copy of those bytes: the store learns they
        // are dirty now, before anything fills it (a fill over its limit evicts), not when their inode is
        // first looked up.
        for (object, ranges) in dirty {
            claim_ranges(&store, object, ranges.into_iter().map(|(start, end)| start..end));
        }
        let mut ops = Vec::new();
        db.for_each_op(|seq, bytes| match Op::decode(bytes) {
            Some(op) => ops.push((seq, op)),
            None => tracing::error!(seq, "a journal record cannot be read; it is kept and skipped"),
        })?;
        let data_ops = ops.iter().filter(|(_, op)| op.kind == OpKind::Data).count();
        let interrupted = ops.iter().filter(|(_, op)| op.attempted).count();
        for (_, op) in &ops {
            if op.attempted && matches!(op.kind, OpKind::Rename { .. }) {
                // Cut short by the stop: home may have made it or not.
                ns.renames.insert(op.ino, Unsettled::of(op, false));
            }
        }
        let journal = Journal::load(ops);
        let mut root = Inode::new(ROOT, OsString::new(), FileKind::Dir, 0);
        if let Some(rec) = db.inode(ROOT)?.and_then(|b| InodeRecord::decode(&b)) {
            root.attr = rec.attr.map(|a| a.to_attr());
        }
        match home.stat(std::path::Path::new("")) {
            Ok(a) if a.kind != FileKind::Dir => return Err(FsError::NotDir),
            Ok(a) => {
                root.attr = Some(a);
                root.checked = Some(Instant::now());
            }
            // Changes are waiting and the cache knows the root: start offline and serve the cache.
            Err(e) if unreachable(&e) && !journal.is_empty() && root.attr.is_some() => {
                health.set_offline(&e);
            }
            Err(e) => return Err(e.into()),
        }
        let pending = journal.len();
        if unclean {
            tracing::warn!(
                pending_changes = pending,
                files_with_unpushed_data = data_ops,
                pushes_interrupted = interrupted,
                orphan_objects_removed = orphan_objects,
                orphan_files_removed = orphan_files,
                unreachable_records_removed = dropped_records,
                "recovered after an unclean stop (the daemon was killed or the machine went down): {pending} \
                 queued changes kept, to be pushed in order ({data_ops} files with unpushed data; {interrupted} \
                 changes interrupted mid-push are repeated, their 'already done' answers accepted); removed \
                 {orphan_objects} cache objects and {orphan_files} cache files nothing refers to, and \
                 {dropped_records} index records cut off from the root"
            );
        } else if pending > 0 {
            tracing::info!(
                pending_changes = pending,
                "{pending} changes left queued by the last run are kept, to be pushed in order"
            );
        }
        *root.lookups.get_mut() = 1;
        db.submit(vec![
            Mutation::PutInode(ROOT, root.record().encode()),
            Mutation::PutMeta(RUNNING, 1),
            // Taken in: a stop without a clean shutdown must find none (what it cached meanwhile is not
            // known to be whole).
            Mutation::ClearListings,
        ]);
        ns.inodes.insert(ROOT, Box::new(root));
        let store_limit = store.stats().bytes_limit;
        let mut tiers: Vec<Arc<dyn Tier>> = vec![Arc::new(StoreTier::new(store.clone()))];
        tiers.extend(between);
        tiers.push(Arc::new(HomeTier::new(home.clone())));
        let core = Arc::new(Core {
            home_id: HomeId::new(cfg.home_id.clone().unwrap_or_else(|| home.describe())),
            home,
            store,
            tiers: Tiers::new(tiers),
            // In a cache too small for it, fetching a whole file to use one block of it only churns.
            small_file_threshold: cfg.small_file_threshold.min(store_limit / 8),
        });
        // A reader's window is at most an eighth of the cache, or what it brings in evicts what it has not
        // read yet.
        let mut cfg = cfg;
        cfg.readahead_max = cfg.readahead_max.min(store_limit / 8).max(core.store.block_size());
        let readahead = Arc::new(Readahead::new(core.clone(), cfg.ingest_streams));
        let conflicts = crate::changes::load_conflicts(&cfg.conflicts_dir);
        let pipeline = Arc::new(Pipeline::new(journal, conflicts, cfg.flush_threads));
        let names = Arc::new(Names::new(
            cfg.clone(),
            core.clone(),
            health.clone(),
            pipeline.clone(),
            readahead.clone(),
            ns,
        ));
        let data = Arc::new(DataPath::new(cfg.clone(), core.clone(), names.clone(), readahead));
        let changes = Arc::new(Changes::new(
            cfg.clone(),
            core.clone(),
            health.clone(),
            names.clone(),
            data.clone(),
            pipeline.clone(),
        ));
        let intake: Arc<dyn crate::data::Intake> = changes.clone();
        data.wire(Arc::downgrade(&intake));
        let fs = Fs {
            cfg,
            core,
            health,
            pipeline,
            names,
            data,
            changes,
            generation,
        };
        for (kept, label) in retained.kept {
            fs.changes.record_conflict(
                &label.path,
                "lost+found",
                kept.display().to_string(),
                true,
                "the cache held changes of this file not yet at home that nothing in the index referred to \
                 any more (a damaged index, or a crash at the wrong moment); kept here rather than deleted"
                    .into(),
            );
        }
        let taken = fs.data.take_in_unseen_writes(&owners);
        if taken > 0 {
            tracing::warn!(
                files = taken,
                "took in what writers the kernel served wrote to {taken} cached files before the stop; queued for home"
            );
        }
        Ok(fs)
    }

    /// Make everything durable before the process exits.
    pub fn shutdown(&self) -> FsResult<()> {
        self.changes.stop_flushers();
        let handles = self.names.handles().numbers();
        for fh in handles {
            let _ = self.data.release(fh);
        }
        let db = self.core.store.db();
        db.submit(self.names.listings_to_keep());
        db.submit(vec![Mutation::PutMeta(RUNNING, 0)]);
        db.close()?;
        Ok(())
    }
}

/// Listing times kept at the last clean stop (ms since the epoch) that are still within `lag`, as
/// instants of this run.
fn restored_listings(kept: &[(u64, u64)], lag: Duration) -> HashMap<u64, Instant> {
    let now = std::time::SystemTime::now();
    let since_epoch = now.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut out = HashMap::new();
    if lag.is_zero() {
        return out;
    }
    for &(dir, ms) in kept {
        // A time in the future (the clock went back) is not trusted.
        let Some(age) = since_epoch.checked_sub(Duration::from_millis(ms)) else {
            continue;
        };
        if age >= lag {
            continue;
        }
        if let Some(at) = Instant::now().checked_sub(age) {
            out.insert(dir, at);
        }
    }
    out
}

/// Byte ranges of cache objects written here and not confirmed at home yet.
type DirtyRanges = Vec<(u64, Vec<(u64, u64)>)>;

/// The cache objects referred to by persisted inodes reachable from the root, each with its inode, and
/// the ranges of them not at home yet; records not reachable (a crash between removing a directory and its
/// children) are dropped. After an unclean stop (`unclean`), so are the records of files no entry names:
/// files removed while open keep their record until their last close, and a stop before it leaves them
/// (removed files are gone after a crash, as on a local file system). (A directory removed here keeps its
/// record without an entry until its removal reaches home: the home paths of queued changes go through
/// it.)
fn collect_live(db: &larder_cache::Db, unclean: bool) -> FsResult<(HashMap<u64, u64>, DirtyRanges, usize)> {
    let mut parents = HashMap::new();
    let mut objects = HashMap::new();
    let mut names = HashMap::new();
    let mut dirty = HashMap::new();
    let mut named = HashSet::new();
    if unclean {
        db.for_each_dentry(|ino| {
            named.insert(ino);
        })?;
    }
    let mut unnamed = Vec::new();
    db.for_each_inode(|ino, bytes| {
        if let Some(rec) = InodeRecord::decode(bytes) {
            if unclean && ino != ROOT && rec.kind != FileKind::Dir && !named.contains(&ino) {
                unnamed.push(ino);
                return;
            }
            parents.insert(ino, rec.parent);
            names.insert(ino, rec.name);
            if rec.object != 0 {
                objects.insert(ino, rec.object);
                // A push under way when the daemon stopped holds what it sent in its attempt, out of the
                // dirty ranges: not confirmed at home, those bytes are as much the only copy.
                let mut ranges = rec.dirty;
                if let Some((sent, _)) = rec.attempt {
                    ranges.extend(sent);
                }
                if !ranges.is_empty() {
                    dirty.insert(ino, (rec.object, ranges));
                }
            }
        }
    })?;
    let mut reachable: HashMap<u64, bool> = HashMap::new();
    reachable.insert(ROOT, true);
    let inos: Vec<u64> = parents.keys().copied().collect();
    for ino in inos {
        let mut chain = Vec::new();
        let mut cur = ino;
        let ok = loop {
            if let Some(&r) = reachable.get(&cur) {
                break r;
            }
            if chain.len() > 4096 || chain.contains(&cur) {
                break false;
            }
            chain.push(cur);
            match parents.get(&cur) {
                Some(&p) => cur = p,
                None => break false,
            }
        };
        for c in chain {
            reachable.insert(c, ok);
        }
    }
    let mut dead = Vec::new();
    for (ino, ok) in &reachable {
        if !ok {
            tracing::warn!(
                ino,
                parent = parents.get(ino).copied().unwrap_or(0),
                name = %String::from_utf8_lossy(names.get(ino).map_or(&[][..], |n| &n[..])),
                "an index record cut off from the root is dropped"
            );
            dead.push(Mutation::DelInode(*ino));
            if let (Some(p), Some(n)) = (parents.get(ino), names.get(ino)) {
                dead.push(Mutation::DelDentry(*p, n.clone()));
            }
        }
    }
    let dropped = reachable.values().filter(|ok| !**ok).count() + unnamed.len();
    for ino in unnamed {
        tracing::info!(
            ino,
            "the record of a file removed while open before the stop is dropped"
        );
        dead.push(Mutation::DelInode(ino));
    }
    db.submit(dead);
    let live = objects
        .iter()
        .filter(|(ino, _)| reachable.get(ino) == Some(&true))
        .map(|(ino, o)| (*o, *ino))
        .collect();
    let dirty = dirty
        .into_iter()
        .filter(|(ino, _)| reachable.get(ino) == Some(&true))
        .map(|(_, d)| d)
        .collect();
    Ok((live, dirty, dropped))
}
