//! The change pipeline in a cluster: letting a file's changes go before this node gives its write token
//! up (pushed to home, or handed over to the asker when home cannot take them), and taking over the
//! changes another node hands over.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use larder_home::{HomeError, Version};

use super::*;
use crate::coherence::{GiveUp, Handover, held_version, parse_held};

/// How long a node whose changes of a file could be handed over tries to push them to home first: a home
/// that is there takes a small change well within it.
const HANDOVER_AFTER: Duration = Duration::from_secs(2);
/// How often a node that could hand a file over looks whether home was found away while it drains.
const HOME_LOOK_EVERY: Duration = Duration::from_millis(100);
/// Longest a node handing a file over waits for a push of it under way to end (against a home that is
/// away, it fails at once).
const PUSH_END_WAIT: Duration = Duration::from_secs(5);

/// One of a file's locks (`Inode::flush_lock`, `Inode::write_lock`).
type FileLock = Arc<std::sync::Mutex<()>>;

/// What of a file's state in the journal and namespace goes with a hand-over ([`Handover::state`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct HandedState {
    /// Queued changes of its attributes.
    ops: Vec<OpKind>,
    /// What a push of it that failed or was cut short sent: its ranges, the size, and whether it was the
    /// whole content (see `Attempt`).
    unconfirmed: Option<(Vec<std::ops::Range<u64>>, u64, bool)>,
}

/// What a node handing a file over keeps until the taker answers: the file, and its ops the flushers
/// are kept off.
pub(crate) struct Handing {
    ino: u64,
    seqs: Vec<u64>,
}

impl Changes {
    /// The inode of `path` (below home's root) if this node knows it.
    fn known(&self, path: &[u8]) -> Option<u64> {
        self.names.read().resolve_known(Path::new(OsStr::from_bytes(path))).0
    }

    /// Let this node's changes of `path` go before it gives the file's write token up to a peer: see
    /// [`GiveUp`]. Home is tried first (the whole journal is drained, in order, within `drain_within`);
    /// a file whose changes can be handed over is tried only briefly, and not at all while home is away.
    pub(crate) fn give_up(&self, path: &[u8], drain_within: Duration) -> Result<GiveUp, String> {
        let ino = self.known(path);
        if let Some(ino) = ino {
            let dirty = self.names.read().inodes.get(&ino).is_some_and(|n| !n.dirty.is_empty());
            if dirty {
                self.commit_data(ino, false).map_err(|e| e.to_string())?;
            }
        }
        if self.nothing_queued_of(ino, path) {
            return Ok(GiveUp::NothingHere);
        }
        let can_hand = ino.is_some_and(|ino| self.handover_check(ino, path).is_ok());
        let within = match can_hand {
            true if !self.health.online() => Duration::ZERO,
            true => drain_within.min(HANDOVER_AFTER),
            false => drain_within,
        };
        // A file that can be handed over is handed over as soon as home is found away: its drain is
        // asked in short slices, each a look at whether the pushes found home there.
        let deadline = Instant::now() + within;
        let drained = loop {
            let slice = match can_hand {
                true => deadline.saturating_duration_since(Instant::now()).min(HOME_LOOK_EVERY),
                false => within,
            };
            let drained = self.drain(slice);
            if drained == crate::Drained::Empty || !can_hand || !self.health.online() || Instant::now() >= deadline {
                break drained;
            }
        };
        if drained == crate::Drained::Empty {
            return Ok(GiveUp::Drained);
        }
        let not_pushed = format!("this node's changes did not reach home ({drained:?})");
        let Some(ino) = ino else {
            return Err(not_pushed);
        };
        self.hand_over(ino, path)
            .map(GiveUp::HandOver)
            .map_err(|why| format!("{not_pushed}, and cannot be handed over: {why}"))
    }

    /// Whether nothing of `path` waits for home here: no queued op names it or a directory above it, and
    /// this node publishes no record of it.
    fn nothing_queued_of(&self, ino: Option<u64>, path: &[u8]) -> bool {
        let own_record = self
            .names
            .coherence()
            .is_some_and(|c| c.record(path).is_some_and(|(r, _)| r.holder == c.me()));
        if own_record {
            return false;
        }
        let dirty = ino.is_some_and(|ino| self.names.read().inodes.get(&ino).is_some_and(|n| !n.dirty.is_empty()));
        !dirty && !self.pipeline.journal().touches_path(path)
    }

    /// Why the file `ino` at `path` cannot be handed over now, if it cannot: see [`Changes::hand_over`].
    /// Its handover otherwise: the journal's part of it, and the base and record.
    fn handover_check(&self, ino: u64, path: &[u8]) -> Result<Handover, String> {
        if self.cfg.write_mode.acknowledges_from_home() {
            return Err("this node writes through to home".into());
        }
        let c = self.names.coherence().ok_or("not in a cluster")?;
        let kinds = self.pipeline.journal().handover_of(ino, path)?;
        let ns = self.names.read();
        let node = ns.inode(ino).map_err(|e| e.to_string())?;
        let attr = node.attr.as_ref().ok_or("its attributes are not known")?;
        if node.kind != FileKind::File || node.removed {
            return Err("not a file here".into());
        }
        if node.conflict || attr.nlink > 1 {
            return Err("it is in conflict, or has other names".into());
        }
        if ns.home_path(ino).ok().flatten().as_deref() != Some(Path::new(OsStr::from_bytes(path))) {
            return Err("home has it under another name".into());
        }
        if !homes(&attr.version) {
            return Err("the version its changes were made on is not home's".into());
        }
        let base = attr.version.0.clone();
        let (record, revision) = c
            .record(path)
            .filter(|(r, _)| r.holder == c.me())
            .ok_or("this node's record of it is not published")?;
        if record.attr.as_ref().map(|a| (a.size, a.mtime)) != Some((attr.size, attr.mtime)) {
            return Err("this node's record of it is behind".into());
        }
        let state = HandedState {
            ops: kinds
                .into_iter()
                .filter(|k| matches!(k, OpKind::SetAttr { .. }))
                .collect(),
            unconfirmed: node.unconfirmed.as_ref().map(|a| (a.ranges.clone(), a.size, a.whole)),
        };
        Ok(Handover {
            holder: c.me(),
            revision,
            base,
            state: postcard::to_allocvec(&state).map_err(|e| e.to_string())?,
        })
    }

    /// Hand the changes of the file `ino` at `path` over (home cannot take them): a file home has, whose
    /// queued changes are its data and attributes only. A push of it under way ends first; from then on
    /// the flushers leave its ops alone, until [`Changes::handed_over`] says whether the taker has them.
    fn hand_over(&self, ino: u64, path: &[u8]) -> Result<Handover, String> {
        let deadline = Instant::now() + PUSH_END_WAIT;
        let seqs = loop {
            let mut j = self.pipeline.journal();
            if !j.under_way(ino) {
                break j.hold_ino(ino);
            }
            drop(j);
            if Instant::now() >= deadline {
                return Err("a push of it did not end".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        match self.handover_check(ino, path) {
            Ok(h) => {
                let replaced = lock(&self.handing).insert(path.to_vec(), Handing { ino, seqs });
                if let Some(old) = replaced {
                    self.pipeline.journal().unhold(&old.seqs);
                }
                tracing::info!(path = %String::from_utf8_lossy(path), "home cannot take this node's changes of a file another node asks for: handing them over");
                Ok(h)
            }
            Err(e) => {
                self.pipeline.journal().unhold(&seqs);
                Err(e)
            }
        }
    }

    /// The taker of `path`'s changes answered: with `taken`, it has them (durably, as its own), and they
    /// are dropped here, with what this node cached of the file; else they are this node's again.
    pub(crate) fn handed_over(&self, path: &[u8], taken: bool) -> FsResult<()> {
        let Some(Handing { ino, seqs }) = lock(&self.handing).remove(path) else {
            return Ok(());
        };
        if !taken {
            self.pipeline.journal().unhold(&seqs);
            return Ok(());
        }
        let (flush_lock, write_lock) = self.file_locks(ino)?;
        let _f = lock(&flush_lock);
        let _w = lock(&write_lock);
        self.drop_taken(ino)?;
        tracing::info!(path = %String::from_utf8_lossy(path), "another node took this node's changes of a file over");
        Ok(())
    }

    /// Make the changes `h` hands over this node's own, durably, before the giver lets them go: the
    /// version its record names is copied whole into this node's cache (read from the giver), and queued
    /// as this node's change of the file made on the giver's base, with the giver's changes of its
    /// attributes. The file must be one this node has nothing of its own queued of.
    pub(crate) fn take_handover(&self, path: &[u8], h: &Handover) -> FsResult<()> {
        let eio = || FsError::Home(HomeError::Os(libc::EIO));
        if self.cfg.write_mode.acknowledges_from_home() {
            return Err(eio());
        }
        let state: HandedState = postcard::from_bytes(&h.state).map_err(|_| eio())?;
        let at = Path::new(OsStr::from_bytes(path));
        let ino = self.known(path).ok_or(FsError::NotFound)?;
        // This node's view of the file taken to the version handed over (its record may reach this node a
        // moment after the answer that names it).
        let want = held_version(h.holder, h.revision);
        let mut version = None;
        for _ in 0..3 {
            self.names.sync_cluster();
            if self.names.read().home_path(ino)?.as_deref() != Some(at) {
                return Err(eio());
            }
            let _ = self.names.revalidate(ino, at);
            version = self.names.read().inode(ino)?.attr.as_ref().map(|a| a.version.clone());
            if version.as_ref() == Some(&want) {
                break;
            }
        }
        if version.as_ref() != Some(&want) {
            tracing::warn!(path = %at.display(), want = %want.0, have = ?version, "a file handed over is of another version here");
            return Err(eio());
        }
        let (flush_lock, write_lock) = self.file_locks(ino)?;
        let _f = lock(&flush_lock);
        let _w = lock(&write_lock);
        let copied = self.copy_held(ino, at, &want);
        let result = copied.and_then(|size| {
            let mut ns = self.names.write();
            let node = ns.inode_mut(ino)?;
            // All of it is this node's now: none of it is to be fetched from home, all of it is pushed.
            node.dirty.clear();
            add_range(&mut node.dirty, 0..size);
            node.home_size = Some(0);
            if let Some(a) = node.attr.as_mut() {
                a.version = Version(h.base.clone());
            }
            // A push of the giver's that failed may have reached home (whole, or a prefix of a whole
            // push): what it sent, against what home holds, tells at this node's push.
            let cut_short = state.unconfirmed.is_some();
            node.unconfirmed = state
                .unconfirmed
                .map(|(ranges, size, whole)| Box::new(crate::namespace::Attempt { ranges, size, whole }));
            let p = path.to_vec();
            let mut queued: Vec<Op> = state
                .ops
                .into_iter()
                .filter(|k| matches!(k, OpKind::SetAttr { .. }))
                .map(|k| Op::new(ino, p.clone(), Vec::new(), k))
                .collect();
            let mut data = Op::new(ino, p, Vec::new(), OpKind::Data);
            data.attempted = cut_short;
            queued.push(data);
            let muts: Vec<Mutation> = Self::record_of(&ns, ino).into_iter().collect();
            self.queue(None, ns, queued, &[], muts).map(|_| ())
        });
        if let Err(e) = &result {
            tracing::warn!(path = %at.display(), error = %e, "could not take over a file's changes another node handed over");
            if let Err(e) = self.drop_taken(ino) {
                tracing::warn!(error = %e, "could not record dropping a file's changes taken over");
            }
        } else {
            self.data.label_unpushed(ino);
            tracing::info!(path = %at.display(), "took over another node's changes of a file");
        }
        result
    }

    /// Copy the version `want` of `ino` whole into its cache object, each block claimed (kept from
    /// eviction) or fetched, then written as this node's: indexed and on disk, durably. Its size. The
    /// caller holds the file's flush and write locks.
    fn copy_held(&self, ino: u64, at: &Path, want: &Version) -> FsResult<u64> {
        let (object, size) = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            if !self.unchanged_here(node, ino) {
                // Changes of its own (made while etcd was away): not this node's to mix with the giver's.
                return Err(FsError::Home(HomeError::Conflict));
            }
            (node.object, node.attr.as_ref().map_or(0, |a| a.size))
        };
        self.make_room(size)?;
        let file = crate::FileVersion {
            object,
            epoch: self.core.store.epoch(object),
            path: at.to_path_buf(),
            version: want.clone(),
            home_end: size,
        };
        let bs = self.core.store.block_size();
        let blocks = size.div_ceil(bs) as u32;
        for index in 0..blocks {
            if self.core.store.claim((object, index))? {
                continue;
            }
            let block = self.data.fetch_block(ino, &file, index)?;
            self.core.store.write(object, index as u64 * bs, &block)?;
        }
        self.core.store.commit(object, 0..blocks, size)?;
        self.core
            .store
            .file(object)?
            .sync_data()
            .map_err(|e| FsError::Cache(larder_cache::CacheError::Io(e)))?;
        Ok(size)
    }

    /// The home version of the file at `path` as this node has it clean (none if it has changes of it
    /// or knows no home version of it): what a node that pushed it tells the node it gives the token up to.
    pub(crate) fn home_version(&self, path: &[u8]) -> Option<Version> {
        let ino = self.known(path)?;
        let ns = self.names.read();
        let node = ns.inode(ino).ok()?;
        let v = &node.attr.as_ref()?.version;
        (self.unchanged_here(node, ino) && !node.removed && homes(v)).then(|| v.clone())
    }

    /// The file at `path` is cached here as `from` (another node's held version), which home has as
    /// `to` now (that node pushed it, and gave the token up with nothing more of it): `to` is the version
    /// this node's changes are made on, home away or not. Nothing changes if this node has `path` at
    /// another version, or changes of it.
    pub(crate) fn rebase(&self, path: &[u8], from: &Version, to: Version) {
        let Some(ino) = self.known(path) else { return };
        let mut ns = self.names.write();
        if !ns.inode(ino).is_ok_and(|node| self.unchanged_here(node, ino)) {
            return;
        }
        let Ok(node) = ns.inode_mut(ino) else { return };
        if let Some(a) = node.attr.as_mut().filter(|a| &a.version == from) {
            tracing::debug!(path = %String::from_utf8_lossy(path), from = %from.0, to = %to.0, "a held version is home's now");
            a.version = to;
            self.names.persist(&ns, ino);
        }
    }

    /// Undo what [`Changes::take_handover`] made of `path`: the giver kept its changes after all.
    pub(crate) fn abandon_handover(&self, path: &[u8]) {
        if let Some(ino) = self.known(path)
            && let Err(e) = self.drop_taken(ino)
        {
            tracing::warn!(error = %e, "could not record dropping a file's changes taken over");
        }
    }

    /// Drop this node's queued changes of `ino` and what it cached of it, on record.
    fn drop_taken(&self, ino: u64) -> FsResult<()> {
        let muts = self.pipeline.journal().drop_content_ops(ino);
        self.core.store.db().submit(muts);
        self.discard_local(ino);
        self.core.store.db().settle()?;
        Ok(())
    }

    /// Whether `node` (inode `ino`) has no change of this node's: nothing written, cut or queued. The
    /// caller holds the namespace (taken before the journal, as everywhere).
    fn unchanged_here(&self, node: &crate::namespace::Inode, ino: u64) -> bool {
        node.dirty.is_empty() && node.home_size.is_none() && !self.pipeline.journal().has(ino)
    }

    /// The flush and write locks of `ino`.
    fn file_locks(&self, ino: u64) -> FsResult<(FileLock, FileLock)> {
        let ns = self.names.read();
        let node = ns.inode(ino)?;
        Ok((node.flush_lock.clone(), node.write_lock.clone()))
    }
}

/// Whether `v` is a version home gave: not another node's held version, nor none, nor one larder set
/// when it dropped a file's local changes.
fn homes(v: &Version) -> bool {
    !v.0.is_empty() && v.0 != super::flusher::DISCARDED && parse_held(v).is_none()
}
