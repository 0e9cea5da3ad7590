//! Serving units to the cluster's other nodes (design note 013): a peer names a unit by its portable key
//! and says where home has the file; this node resolves the path in its own namespace, checks that the
//! version it knows is the one the key names, and answers from its read path: its store, and home too
//! when the asker says this node owns the unit (one home read for every node that wants it, however
//! many ask at once: the read path's single flight).
//!
//! Also here: the units this node holds ([`Fs::held_units`], for the status and for leaving), and
//! migration instead of eviction ([`Migrator`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use larder_cluster::peer::{Ask, Bytes, PeerClient, PeerStats, SourceError, UnitSource};
use larder_cluster::{MemberId, Membership};
use larder_home::{FileKind, Version};

use crate::key::Part;
use crate::namespace::{Fs, Namespace, ROOT, read};
use crate::tier::{Local, Want, Whereabouts};

type SourceResult<T> = Result<T, SourceError>;

impl Fs {
    /// The inode of `path` (relative to home's root), looked up as the kernel would, without counting a
    /// reference.
    fn resolve(&self, path: &Path) -> SourceResult<u64> {
        let mut ino = ROOT;
        for part in path.components() {
            let Component::Normal(name) = part else {
                return Err(SourceError::BadKey(format!("path {path:?} is not plain")));
            };
            ino = self.find(ino, name).map_err(|_| SourceError::NotHeld)?;
        }
        Ok(ino)
    }

    /// The unit a peer asks for: see the module doc.
    pub fn serve_unit(&self, ask: &Ask) -> SourceResult<Arc<Vec<u8>>> {
        let path = Path::new(OsStr::from_bytes(ask.path));
        let ino = self.resolve(path)?;
        for attempt in 0..2 {
            let (object, version, home_end, epoch, fresh) = {
                let ns = read(&self.ns);
                let node = ns.inode(ino).map_err(|_| SourceError::NotHeld)?;
                if node.kind != FileKind::File {
                    return Err(SourceError::NotHeld);
                }
                // Content changed here and not at home is not the version any key of home names.
                if !node.dirty.is_empty() || node.home_size.is_some() || node.removed {
                    return Err(SourceError::OtherVersion);
                }
                let Some(attr) = node.attr.as_ref() else {
                    return Err(SourceError::NotHeld);
                };
                let fresh = self.fresh(node.checked);
                (
                    node.object,
                    attr.version.clone(),
                    node.home_end(),
                    self.core.store.epoch(node.object),
                    fresh,
                )
            };
            let (key, range) = self.core.unit_of(ask.index, path, &version, home_end);
            if key.encode() != ask.key {
                // Ours may be the stale one: ask home once (unless it was just asked), then decide.
                if attempt == 0 && (!fresh || ask.forward) && self.revalidate(ino, path).is_ok() {
                    continue;
                }
                return Err(SourceError::OtherVersion);
            }
            let local = Local {
                object,
                epoch,
                path,
                version: &version,
            };
            let mut want = Want::new(&key, range, local);
            if !ask.forward {
                return self.core.tiers.held(&want).ok_or(SourceError::NotHeld);
            }
            want.take_from = ask.from;
            want.asker = Some(ask.asker);
            return self
                .core
                .tiers
                .fetch(&want)
                .map_err(|e| SourceError::Failed(e.to_string()));
        }
        Err(SourceError::OtherVersion)
    }
}

/// A unit of home's content this node holds whole: what it can serve, and hands over when it leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldUnit {
    /// The unit's portable key (encoded) and its digest.
    pub key: Vec<u8>,
    pub digest: [u8; 16],
    /// Where home has the file, and the block the unit starts at: what a peer asked for it resolves.
    pub path: PathBuf,
    pub index: u32,
    pub len: u64,
}

impl HeldUnit {
    /// The ask that names this unit to a peer: as its owner (it may fetch the unit), for a take.
    pub fn ask(&self) -> Ask<'_> {
        Ask {
            key: &self.key,
            digest: &self.digest,
            path: self.path.as_os_str().as_bytes(),
            index: self.index,
            forward: true,
            from: None,
            asker: 0,
        }
    }
}

/// A file as home has it, clean here: its cache object, the version home has, where home's content ends,
/// and its path at home.
struct HomeFile {
    object: u64,
    version: Version,
    home_end: u64,
    path: PathBuf,
}

/// `ino` if it is a file this node knows clean and at home, with the version home has: the files whose
/// units a peer may be served (nothing changed here, not removed).
fn home_file(ns: &Namespace, ino: u64) -> Option<HomeFile> {
    let n = ns.inode(ino).ok()?;
    if n.kind != FileKind::File || !n.dirty.is_empty() || n.home_size.is_some() || n.removed {
        return None;
    }
    Some(HomeFile {
        object: n.object,
        version: n.attr.as_ref()?.version.clone(),
        home_end: n.home_end(),
        path: ns.home_path(ino).ok()??,
    })
}

impl Fs {
    /// Every unit this node holds whole of the files it knows clean and at home, with the version home
    /// has: the units a peer could be served. A walk over the namespace (taken shared, once) and the
    /// store's index: for the status and for leaving, not for the I/O path.
    pub fn held_units(&self) -> Vec<HeldUnit> {
        let files: Vec<HomeFile> = {
            let ns = read(&self.ns);
            ns.inodes.keys().filter_map(|&ino| home_file(&ns, ino)).collect()
        };
        let bs = self.core.store.block_size();
        let mut out = Vec::new();
        for f in files {
            let blocks = f.home_end.div_ceil(bs) as u32;
            for index in 0..blocks.max(1) {
                let (unit, whole) = self.unit_held(&f, index);
                out.extend(unit);
                if whole {
                    break;
                }
            }
        }
        out
    }

    /// Unit `index` of `f` if the store holds it whole, and whether it is the file's whole unit.
    fn unit_held(&self, f: &HomeFile, index: u32) -> (Option<HeldUnit>, bool) {
        let (key, range) = self.core.unit_of(index, &f.path, &f.version, f.home_end);
        let (held, whole) = match key.part {
            Part::Whole { len } => (self.core.store.present(f.object, len), true),
            Part::Block { .. } => (
                range.end > range.start && self.core.store.contains((f.object, index)),
                false,
            ),
        };
        let unit = held.then(|| HeldUnit {
            digest: key.digest().0,
            key: key.encode(),
            path: f.path.clone(),
            index,
            len: range.end - range.start,
        });
        (unit, whole)
    }

    /// The inodes of cache objects, for the files [`home_file`] takes.
    fn files_by_object(&self) -> HashMap<u64, u64> {
        let ns = read(&self.ns);
        ns.inodes
            .iter()
            .filter(|(_, n)| n.kind == FileKind::File)
            .map(|(&ino, n)| (n.object, ino))
            .collect()
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
        let Some(file) = home_file(&read(&fs.ns), ino).filter(|f| f.object == object) else {
            return;
        };
        let (Some(unit), _) = fs.unit_held(&file, index) else {
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
        match self.client.take(to, &unit.ask()) {
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

/// A node's read path as the source of what its peer server serves.
pub struct FsUnitSource(pub Weak<Fs>);

/// Bytes of a unit, shared with the read path without a copy.
struct Shared(Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl UnitSource for FsUnitSource {
    fn unit(&self, ask: &Ask) -> SourceResult<Bytes> {
        let fs = self
            .0
            .upgrade()
            .ok_or_else(|| SourceError::Failed("shutting down".into()))?;
        let data = fs.serve_unit(ask)?;
        Ok(Bytes::from_owner(Shared(data)))
    }

    fn read_held(&self, held: &larder_cluster::peer::HeldAsk) -> SourceResult<Bytes> {
        let fs = self
            .0
            .upgrade()
            .ok_or_else(|| SourceError::Failed("shutting down".into()))?;
        let own = fs.coherence.get().and_then(|c| {
            c.record(held.path)
                .filter(|(r, _)| r.holder == c.me())
                .map(|(_, revision)| revision)
        });
        Ok(Bytes::from(fs.serve_held(held, own)?))
    }

    fn release(&self, path: &[u8]) -> SourceResult<i64> {
        let fs = self
            .0
            .upgrade()
            .ok_or_else(|| SourceError::Failed("shutting down".into()))?;
        let c = fs.coherence.get().ok_or(SourceError::NotHeld)?.clone();
        c.give_up(&fs, path).map_err(SourceError::Failed)
    }
}

#[cfg(test)]
mod tests {
    use larder_home::Version;

    use super::*;
    use crate::namespace::hit_tests::dir_f;

    /// The key of unit `index` of the file at `path` as this node knows it now.
    fn key_of(fs: &Fs, ino: u64, path: &Path, index: u32) -> Vec<u8> {
        let ns = read(&fs.ns);
        let node = ns.inode(ino).unwrap();
        let version = node.attr.as_ref().unwrap().version.clone();
        fs.core.unit_of(index, path, &version, node.home_end()).0.encode()
    }

    fn ask<'a>(key: &'a [u8], digest: &'a [u8; 16], path: &'a [u8], forward: bool) -> Ask<'a> {
        Ask {
            key,
            digest,
            path,
            index: 0,
            forward,
            from: None,
            asker: 0,
        }
    }

    #[test]
    fn a_unit_is_served_by_path_and_key_for_the_version_asked_only() {
        let (_tmp, fs, _, ino) = dir_f();
        let path = Path::new("dir/f");
        let key = key_of(&fs, ino, path, 0);
        let digest = larder_cluster::peer::digest(&key);
        // Not read yet: held only if the asker lets this node fetch it (it is the owner).
        assert!(matches!(
            fs.serve_unit(&ask(&key, &digest, b"dir/f", false)),
            Err(SourceError::NotHeld)
        ));
        assert_eq!(
            *fs.serve_unit(&ask(&key, &digest, b"dir/f", true)).unwrap(),
            vec![7u8; 10 << 10]
        );
        // Now held: served without forwarding.
        assert_eq!(
            *fs.serve_unit(&ask(&key, &digest, b"dir/f", false)).unwrap(),
            vec![7u8; 10 << 10]
        );
        // A key of another version of the file is not this one.
        let other = fs
            .core
            .unit_of(0, path, &Version("another".into()), 10 << 10)
            .0
            .encode();
        let other_digest = larder_cluster::peer::digest(&other);
        assert!(matches!(
            fs.serve_unit(&ask(&other, &other_digest, b"dir/f", true)),
            Err(SourceError::OtherVersion)
        ));
        // Nor is a path that does not exist, or one that is not plain.
        assert!(fs.serve_unit(&ask(&key, &digest, b"dir/nothing", true)).is_err());
        assert!(matches!(
            fs.serve_unit(&ask(&key, &digest, b"../etc/passwd", true)),
            Err(SourceError::BadKey(_))
        ));
    }

    #[test]
    fn the_units_held_are_those_read_by_the_keys_a_peer_asks_with_and_not_a_changed_files() {
        let (_tmp, fs, _, ino) = dir_f();
        assert!(fs.held_units().is_empty(), "nothing read yet");
        let fh = fs.open(ino, libc::O_RDONLY).unwrap().fh;
        assert_eq!(fs.read(fh, 0, 1 << 20).unwrap().len(), 10 << 10);
        let held = fs.held_units();
        let key = key_of(&fs, ino, Path::new("dir/f"), 0);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].key, key);
        assert_eq!(held[0].digest, larder_cluster::peer::digest(&key));
        assert_eq!(
            (held[0].path.as_path(), held[0].index, held[0].len),
            (Path::new("dir/f"), 0, 10 << 10)
        );
        fs.release(fh).unwrap();
        // Changed here: no longer home's version, so not held as a unit of it.
        let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
        fs.write(fh, 0, b"changed").unwrap();
        assert!(fs.held_units().is_empty());
        fs.release(fh).unwrap();
    }

    #[test]
    fn a_file_with_local_changes_is_never_served_as_homes_version() {
        let (_tmp, fs, _, ino) = dir_f();
        let key = key_of(&fs, ino, Path::new("dir/f"), 0);
        let digest = larder_cluster::peer::digest(&key);
        assert!(fs.serve_unit(&ask(&key, &digest, b"dir/f", true)).is_ok());
        let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
        fs.write(fh, 0, b"changed here").unwrap();
        let got = fs.serve_unit(&ask(&key, &digest, b"dir/f", true));
        assert!(
            matches!(got, Err(SourceError::OtherVersion)),
            "{:?}",
            got.map(|d| d.len())
        );
        fs.release(fh).unwrap();
    }
}
