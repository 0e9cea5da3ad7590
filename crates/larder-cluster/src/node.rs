//! A node's file system as the cluster sees it: its read path as the source of what the peer server
//! serves ([`FsUnitSource`]), and migration instead of eviction ([`Migrator`]). The core serves; which
//! member asks for what, and how the bytes travel, is this crate's.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use larder_fs::Fs;
use larder_fs::serve::{HeldRead, HeldUnit, UnitAsk};

use crate::coherence::EtcdCoherence;
use crate::peer::{Ask, Bytes, HeldAsk, PeerClient, PeerStats, Release, ServeError, UnitSource};
use crate::tier::Whereabouts;
use crate::{MemberId, Membership};

/// The ask that names `unit` to a peer: as its owner (it may fetch the unit), for a take.
pub fn take_ask(unit: &HeldUnit) -> Ask<'_> {
    Ask {
        key: &unit.key,
        digest: &unit.digest,
        path: unit.path.as_os_str().as_bytes(),
        index: unit.index,
        forward: true,
        from: None,
        asker: 0,
    }
}

/// Migration instead of eviction (Cluster-Aware Cache): when the harvester is about to evict a unit this
/// node owns, the cluster's copy of it, the unit is offered to the member with the most free space (that
/// has room for twice the unit): it takes the unit over from this node (a `Take`), and this node notes
/// where it went, so that its walk asks there before home. At most `rate` bytes a second are offered:
/// migration takes a bounded share of the peer links; past it, units are evicted as on a lone node.
pub struct Migrator {
    membership: Arc<Membership>,
    client: Arc<PeerClient>,
    whereabouts: Arc<Whereabouts>,
    stats: Arc<PeerStats>,
    rate: u64,
    /// Bytes that may be offered now, and when the bucket was last filled.
    bucket: Mutex<(f64, Instant)>,
    /// Cache objects' inodes, rebuilt at most once a second when an object is not found.
    files: Mutex<(Option<Instant>, HashMap<u64, u64>)>,
}

impl Migrator {
    pub fn new(
        membership: Arc<Membership>,
        client: Arc<PeerClient>,
        whereabouts: Arc<Whereabouts>,
        stats: Arc<PeerStats>,
        rate: u64,
    ) -> Migrator {
        Migrator {
            membership,
            client,
            whereabouts,
            stats,
            rate,
            bucket: Mutex::new((rate as f64, Instant::now())),
            files: Mutex::new((None, HashMap::new())),
        }
    }

    /// The harvester is about to evict blocks `indexes` of `object` (one unit): offer it if this node owns
    /// it. Returns once the unit is taken over, or not offered.
    pub fn depart(&self, fs: &Fs, object: u64, indexes: &[u32]) {
        let Some(&index) = indexes.iter().min() else { return };
        if self.rate == 0 {
            return;
        }
        let Some(ino) = self.ino_of(fs, object) else { return };
        let Some(unit) = fs.held_unit_of(ino, object, index) else {
            return;
        };
        let view = self.membership.view();
        let me = self.membership.me().id;
        if view.placement().owner(&unit.digest) != Some(me) {
            // Not the cluster's copy: the unit's owner has it, or fetches it.
            return;
        }
        let room = |id: &MemberId| view.liveness.get(id).map_or(0, |l| l.free);
        let Some(to) = view
            .serving()
            .filter(|r| r.id != me && room(&r.id) >= 2 * unit.len)
            .max_by_key(|r| room(&r.id))
        else {
            self.stats.migrate_no_room.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !self.spend(unit.len) {
            self.stats.migrate_over_rate.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.client.take(to, &take_ask(&unit)) {
            Ok(len) => {
                self.whereabouts.note(unit.digest, to.id);
                self.stats.migrated.fetch_add(1, Ordering::Relaxed);
                self.stats.migrated_bytes.fetch_add(len, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!(peer = %to.name, path = %unit.path.display(), error = %e, "a unit was not migrated")
            }
        }
    }

    /// The inode of cache object `object`, if a file of this node has it.
    fn ino_of(&self, fs: &Fs, object: u64) -> Option<u64> {
        let mut files = larder_util::contention::lock(&self.files);
        if let Some(&ino) = files.1.get(&object) {
            return Some(ino);
        }
        if files.0.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        *files = (Some(Instant::now()), fs.files_by_object());
        files.1.get(&object).copied()
    }

    /// Take `len` bytes from the bucket (filled at `rate` a second, holding a second's worth at most).
    fn spend(&self, len: u64) -> bool {
        let mut b = larder_util::contention::lock(&self.bucket);
        let now = Instant::now();
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * self.rate as f64).min(self.rate as f64);
        b.1 = now;
        if b.0 >= len as f64 {
            b.0 -= len as f64;
            true
        } else {
            false
        }
    }
}

/// A node's read path as the source of what its peer server serves; with `coherence`, also the bytes of
/// the changes it holds, and its write tokens.
pub struct FsUnitSource {
    pub fs: Weak<Fs>,
    pub coherence: Option<Arc<EtcdCoherence>>,
}

/// Bytes of a unit, shared with the read path without a copy.
struct Shared(Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl FsUnitSource {
    fn fs(&self) -> Result<Arc<Fs>, ServeError> {
        self.fs
            .upgrade()
            .ok_or_else(|| ServeError::Failed("shutting down".into()))
    }
}

impl UnitSource for FsUnitSource {
    fn unit(&self, ask: &Ask) -> Result<Bytes, ServeError> {
        let data = self.fs()?.serve_unit(&UnitAsk {
            key: ask.key,
            path: ask.path,
            index: ask.index,
            forward: ask.forward,
            from: ask.from,
            asker: ask.asker,
        })?;
        Ok(Bytes::from_owner(Shared(data)))
    }

    fn read_held(&self, held: &HeldAsk) -> Result<Bytes, ServeError> {
        let data = self.fs()?.serve_held(&HeldRead {
            path: held.path,
            revision: held.revision,
            offset: held.offset,
            len: held.len,
            link: held.link,
        })?;
        Ok(Bytes::from(data))
    }

    fn release(&self, path: &[u8], requester: MemberId) -> Result<Release, ServeError> {
        self.coherence
            .as_ref()
            .ok_or(ServeError::NotHeld)?
            .give_up(path, requester)
    }

    fn handed_over(&self, path: &[u8], requester: MemberId, revision: i64, taken: bool) -> Result<i64, ServeError> {
        self.coherence
            .as_ref()
            .ok_or(ServeError::NotHeld)?
            .handed_over(path, requester, revision, taken)
    }
}
