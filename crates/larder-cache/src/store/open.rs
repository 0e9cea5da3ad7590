//! Opening the store: the block index loaded from the persistent index, and after a crash, the objects
//! and files nothing refers to removed.

use super::*;

impl Store {
    /// Open the store in `cfg.dir`, loading the block index from `db`.
    pub fn open(cfg: StoreConfig, db: Arc<Db>) -> CacheResult<Store> {
        larder_util::private::create_dir_all(&cfg.dir).map_err(io_err)?;
        let mut shards: Vec<ShardState> = (0..SHARDS).map(|_| ShardState::new()).collect();
        let mut policy = Policy::new(cfg.eviction, (cfg.limit as f64 * cfg.low_watermark) as u64);
        let mut contents = Contents::default();
        let (mut used, mut logical, mut pinned, mut blocks) = (0u64, 0u64, 0u64, 0u64);
        db.for_each_object(|object, flags, len, crc| {
            // (A length past 32 bits is not one the store writes: such a record is read as not shared.)
            let content = (flags & SHARED != 0)
                .then(|| u32::try_from(len).ok().map(|len| (len, crc)))
                .flatten();
            if let Some(key) = content {
                let refs = contents.refs.entry(key).or_insert(0);
                if *refs == 0 {
                    used += key.0 as u64;
                }
                *refs += 1;
                contents.shares += 1;
            }
            let meta = ObjectMeta {
                whole: flags & WHOLE != 0,
                pinned: flags & PINNED != 0,
                content,
                written_unseen: flags & WRITTEN_UNSEEN != 0,
            };
            shards[shard_of(object)].objects.insert(object, meta);
        })?;
        // Gathered per shard in key order (the index's) and built in bulk: the map's nodes come out full,
        // where inserting in order leaves them about half full.
        let mut gathered: Vec<Vec<(BlockKey, BlockEntry)>> = (0..SHARDS).map(|_| Vec::new()).collect();
        db.for_each_block(|object, index, len, crc| {
            let shard = shard_of(object);
            let st = &mut shards[shard];
            st.tick = st.tick.wrapping_add(1);
            let tick = st.tick;
            gathered[shard].push((
                (object, index),
                BlockEntry {
                    len,
                    crc,
                    generation: tick,
                    stamp: tick,
                    verified: false,
                    dirty: false,
                    adopted: false,
                    shared: false,
                },
            ));
            let meta = st.meta(object);
            if meta.pinned {
                pinned += len as u64;
            } else {
                policy.insert((object, index), len as u64);
            }
            blocks += 1;
            logical += len as u64;
            if meta.content.is_none() {
                used += len as u64;
            }
        })?;
        for (st, blocks) in shards.iter_mut().zip(gathered) {
            st.blocks = blocks.into_iter().collect();
            st.blocks_built = st.blocks.len();
            let objects: Vec<u64> = st.objects.keys().copied().collect();
            for object in objects {
                st.compact_meta(object);
            }
            st.objects.shrink_to_fit();
        }
        let objects: u64 = shards.iter().map(|st| st.objects_with_blocks().count() as u64).sum();
        let space = space::Space::new(&cfg.dir);
        let store = Store {
            cfg,
            db,
            shards: shards.into_iter().map(Shard::new).collect(),
            policy: Mutex::new(policy),
            contents: Mutex::new(contents),
            fds: (0..SHARDS).map(|_| Mutex::new(FdCache::default())).collect(),
            used: AtomicU64::new(used),
            logical: AtomicU64::new(logical),
            dirty: AtomicU64::new(0),
            pinned: AtomicU64::new(pinned),
            block_count: AtomicU64::new(blocks),
            object_count: AtomicU64::new(objects),
            harvest: Mutex::new(false),
            harvest_cv: Condvar::new(),
            harvesting: AtomicBool::new(false),
            departing: std::sync::OnceLock::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            evictions_by_fills: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            damaged: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            checksummed: AtomicU64::new(0),
            abd: Mutex::new(None),
            spares: Mutex::new(spare::Spares::default()),
            space,
            #[cfg(test)]
            hook: Mutex::new(None),
        };
        store.load_spares();
        Ok(store)
    }

    /// Drop every object not in `live` (left behind by a crash or an old version), files included, except
    /// files labelled as holding changes not yet at home (`unpushed.rs`): those are never deleted, but
    /// moved to `lost_found` and returned with their labels, for the caller to list. Returns how many
    /// indexed objects and how many files nothing referred to were removed, and the files kept.
    pub fn retain_objects(&self, live: &HashSet<u64>, lost_found: &Path) -> Retained {
        let mut stale: Vec<u64> = Vec::new();
        for shard in &self.shards {
            let st = lock(&shard.state);
            let known: HashSet<u64> = st.objects_with_blocks().chain(st.objects.keys().copied()).collect();
            stale.extend(known.into_iter().filter(|o| !live.contains(o)));
        }
        let mut kept = Vec::new();
        let mut keep = |path: &Path| -> bool {
            let Some(label) = crate::unpushed::get(path) else {
                return false;
            };
            let to = lost_found.join(path.file_name().unwrap_or_default());
            let moved = larder_util::private::create_dir_all(lost_found).and_then(|()| std::fs::rename(path, &to));
            match moved {
                Ok(()) => kept.push((to, label)),
                Err(e) => {
                    // Left where it is: still never deleted.
                    tracing::error!(file = %path.display(), error = %e, "cannot move a cache file holding changes not yet at home to lost+found");
                    kept.push((path.to_path_buf(), label));
                }
            }
            true
        };
        let objects = stale.len() as u64;
        for object in stale {
            if keep(&self.path_of(object)) {
                self.forget_object(object);
            } else {
                self.remove_object(object);
            }
        }
        let Ok(dirs) = std::fs::read_dir(&self.cfg.dir) else {
            return Retained {
                objects,
                files: 0,
                kept,
            };
        };
        // Under `contents`, so that no content is created or deleted meanwhile; object files are not
        // created for objects outside `live`.
        let contents = lock(&self.contents);
        let mut files = 0;
        for dir in dirs.flatten() {
            if dir.file_name() == "spare" {
                // Spare files, found at the open (`spare.rs`).
                continue;
            }
            if dir.file_name() == "cas" {
                // Contents no file shares any more (a crash between a fill and its commit).
                files += remove_unkept(
                    &dir.path(),
                    |name| parse_content_name(name).is_some_and(|k| contents.refs.contains_key(&k)),
                    &mut |_: &Path| false,
                );
            } else {
                files += remove_unkept(
                    &dir.path(),
                    |name| u64::from_str_radix(name, 16).is_ok_and(|o| live.contains(&o)),
                    &mut keep,
                );
            }
        }
        Retained { objects, files, kept }
    }

    /// Forget `object` (in memory and in the index) without touching its file, which was moved away.
    fn forget_object(&self, object: u64) {
        let mut st = self.state(object);
        let keys: Vec<BlockKey> = st.blocks_of(object).map(|(k, _)| *k).collect();
        for key in keys {
            self.forget_locked(&mut st, key);
        }
        st.objects.remove(&object);
        self.fds_of(object).files.remove(&object);
        self.db.submit(vec![Mutation::DelObject(object)]);
    }
}

/// What [`Store::retain_objects`] did.
#[derive(Debug, Default)]
pub struct Retained {
    /// Indexed objects nothing referred to, removed.
    pub objects: u64,
    /// Files nothing referred to, removed.
    pub files: u64,
    /// Files nothing referred to that hold changes not yet at home: moved to lost+found (where they are
    /// now), with their labels.
    pub kept: Vec<(PathBuf, crate::unpushed::Label)>,
}

/// Delete the files in `dir` whose names `keep` does not accept, unless `spare` spares them (it moves a
/// file holding unpushed data away); returns how many went.
fn remove_unkept(dir: &Path, keep: impl Fn(&str) -> bool, spare: &mut impl FnMut(&Path) -> bool) -> u64 {
    let Ok(files) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for f in files.flatten() {
        if f.file_name().to_str().is_some_and(&keep) || spare(&f.path()) {
            continue;
        }
        if std::fs::remove_file(f.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}
