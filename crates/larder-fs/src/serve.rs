//! Serving this node's content to the cluster's other nodes (design note 013), as the core sees it: a
//! peer names a unit by its portable key and says where home has the file; this node resolves the path in
//! its own namespace, checks that the version it knows is the one the key names, and answers from its read
//! path: its store, and home too when the asker says this node owns the unit (one home read for every node
//! that wants it, however many ask at once: the read path's single flight).
//!
//! Also here: the units this node holds ([`Fs::held_units`], for the status, for leaving and for
//! migration), and bytes of files whose changes this node holds ([`Fs::serve_held`], design note 016).
//! The transport, and what the cluster does with these, are `larder-cluster`'s.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use larder_home::FileKind;

use crate::FileVersion;
use crate::coherence::resolve_known;
use crate::key::Part;
use crate::namespace::{Fs, Namespace, ROOT, read};
use crate::tier::Want;

/// What a peer asks this node for: a unit of home's content.
#[derive(Clone, Copy, Debug)]
pub struct UnitAsk<'a> {
    /// The unit's portable key, encoded.
    pub key: &'a [u8],
    /// Where home has the file, and the block the unit starts at.
    pub path: &'a [u8],
    pub index: u32,
    /// Whether this node may fetch the unit from home to answer (the asker says it is the unit's owner).
    pub forward: bool,
    /// A member to ask first for what it holds: the leaving member that hands the unit over.
    pub from: Option<u64>,
    /// The member asking: the one a walk answering the ask does not ask back.
    pub asker: u64,
}

/// A read of bytes of a file whose changes this node holds and home has not got yet (design note 016).
#[derive(Clone, Copy, Debug)]
pub struct HeldRead<'a> {
    /// The file's path below home's root.
    pub path: &'a [u8],
    /// The revision of the held record the asker read: another version is not served.
    pub revision: i64,
    pub offset: u64,
    pub len: u64,
    /// The symlink's target rather than bytes.
    pub link: bool,
}

/// Why this node does not serve what a peer asked for.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// This node does not hold it (and was not asked to, or could not, fetch it).
    #[error("not held here")]
    NotHeld,
    /// This node knows another version of the file than the ask names.
    #[error("another version is cached here")]
    OtherVersion,
    /// The ask names nothing this node can resolve.
    #[error("unreadable key: {0}")]
    BadKey(String),
    #[error("{0}")]
    Failed(String),
}

type ServeResult<T> = Result<T, ServeError>;

impl Fs {
    /// The inode of `path` (relative to home's root), looked up as the kernel would, without counting a
    /// reference.
    fn resolve(&self, path: &Path) -> ServeResult<u64> {
        let mut ino = ROOT;
        for part in path.components() {
            let Component::Normal(name) = part else {
                return Err(ServeError::BadKey(format!("path {path:?} is not plain")));
            };
            ino = self.find(ino, name).map_err(|_| ServeError::NotHeld)?;
        }
        Ok(ino)
    }

    /// The unit a peer asks for: see the module doc.
    pub fn serve_unit(&self, ask: &UnitAsk) -> ServeResult<Arc<Vec<u8>>> {
        let path = Path::new(OsStr::from_bytes(ask.path));
        let ino = self.resolve(path)?;
        for attempt in 0..2 {
            let (file, fresh) = {
                let ns = read(&self.ns);
                let node = ns.inode(ino).map_err(|_| ServeError::NotHeld)?;
                if node.kind != FileKind::File {
                    return Err(ServeError::NotHeld);
                }
                // Content changed here and not at home is not the version any key of home names.
                if !node.dirty.is_empty() || node.home_size.is_some() || node.removed {
                    return Err(ServeError::OtherVersion);
                }
                let Some(attr) = node.attr.as_ref() else {
                    return Err(ServeError::NotHeld);
                };
                let file = FileVersion {
                    object: node.object,
                    epoch: self.core.store.epoch(node.object),
                    path: path.to_path_buf(),
                    version: attr.version.clone(),
                    home_end: node.home_end(),
                };
                (file, self.fresh(node.checked))
            };
            let (key, range) = self.core.unit_of(&file, ask.index);
            if key.encode() != ask.key {
                // Ours may be the stale one: ask home once (unless it was just asked), then decide.
                if attempt == 0 && (!fresh || ask.forward) && self.revalidate(ino, path).is_ok() {
                    continue;
                }
                return Err(ServeError::OtherVersion);
            }
            let mut want = Want::new(&key, range, &file);
            if !ask.forward {
                return self.core.tiers.held(&want).ok_or(ServeError::NotHeld);
            }
            want.take_from = ask.from;
            want.asker = Some(ask.asker);
            return self
                .core
                .tiers
                .fetch(&want)
                .map_err(|e| ServeError::Failed(e.to_string()));
        }
        Err(ServeError::OtherVersion)
    }
}

impl Fs {
    /// Bytes of a file this node holds changes of, for a peer (see [`HeldRead`]): only of the version of
    /// the held record the peer read; if this node published a newer one since, `OtherVersion`.
    pub fn serve_held(&self, ask: &HeldRead) -> ServeResult<Vec<u8>> {
        let own = self.coherence.get().and_then(|c| {
            c.record(ask.path)
                .filter(|(r, _)| r.holder == c.me())
                .map(|(_, revision)| revision)
        });
        if own.is_some_and(|r| r != ask.revision) {
            tracing::debug!(asked = ask.revision, own = ?own, "a peer asked for held bytes of another version");
            return Err(ServeError::OtherVersion);
        }
        let path = Path::new(OsStr::from_bytes(ask.path));
        let ino = {
            let ns = read(&self.ns);
            match resolve_known(&ns, path) {
                (Some(ino), _) if !ns.inode(ino).map_or(true, |n| n.removed) => ino,
                _ => return Err(ServeError::NotHeld),
            }
        };
        let failed = |e: crate::FsError| ServeError::Failed(e.to_string());
        if ask.link {
            return self.readlink(ino).map_err(failed);
        }
        let fh = self.open_here(ino).map_err(failed)?;
        let data = self.read(fh, ask.offset, ask.len.min(u32::MAX as u64) as u32);
        let _ = self.release(fh);
        data.map_err(failed)
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

/// `ino` if it is a file this node knows clean and at home, with the version home has: the files whose
/// units a peer may be served (nothing changed here, not removed).
fn home_file(fs: &Fs, ns: &Namespace, ino: u64) -> Option<FileVersion> {
    let n = ns.inode(ino).ok()?;
    if n.kind != FileKind::File || !n.dirty.is_empty() || n.home_size.is_some() || n.removed {
        return None;
    }
    Some(FileVersion {
        object: n.object,
        epoch: fs.core.store.epoch(n.object),
        path: ns.home_path(ino).ok()??,
        version: n.attr.as_ref()?.version.clone(),
        home_end: n.home_end(),
    })
}

impl Fs {
    /// Every unit this node holds whole of the files it knows clean and at home, with the version home
    /// has: the units a peer could be served. A walk over the namespace (taken shared, once) and the
    /// store's index: for the status and for leaving, not for the I/O path.
    pub fn held_units(&self) -> Vec<HeldUnit> {
        let files: Vec<FileVersion> = {
            let ns = read(&self.ns);
            ns.inodes.keys().filter_map(|&ino| home_file(self, &ns, ino)).collect()
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
    fn unit_held(&self, f: &FileVersion, index: u32) -> (Option<HeldUnit>, bool) {
        let (key, range) = self.core.unit_of(f, index);
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

    /// Unit `index` of cache object `object` if the file `ino` has that object, clean and at home, and
    /// this node holds the unit whole: what migration may hand over instead of evicting.
    pub fn held_unit_of(&self, ino: u64, object: u64, index: u32) -> Option<HeldUnit> {
        let file = home_file(self, &read(&self.ns), ino).filter(|f| f.object == object)?;
        self.unit_held(&file, index).0
    }

    /// The inode of each file's cache object: a walk over the namespace, for a caller that keeps it.
    pub fn files_by_object(&self) -> HashMap<u64, u64> {
        let ns = read(&self.ns);
        ns.inodes
            .iter()
            .filter(|(_, n)| n.kind == FileKind::File)
            .map(|(&ino, n)| (n.object, ino))
            .collect()
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
        let file = FileVersion {
            object: node.object,
            epoch: 0,
            path: path.to_path_buf(),
            version: node.attr.as_ref().unwrap().version.clone(),
            home_end: node.home_end(),
        };
        fs.core.unit_of(&file, index).0.encode()
    }

    fn ask<'a>(key: &'a [u8], path: &'a [u8], forward: bool) -> UnitAsk<'a> {
        UnitAsk {
            key,
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
        // Not read yet: held only if the asker lets this node fetch it (it is the owner).
        assert!(matches!(
            fs.serve_unit(&ask(&key, b"dir/f", false)),
            Err(ServeError::NotHeld)
        ));
        assert_eq!(*fs.serve_unit(&ask(&key, b"dir/f", true)).unwrap(), vec![7u8; 10 << 10]);
        // Now held: served without forwarding.
        assert_eq!(
            *fs.serve_unit(&ask(&key, b"dir/f", false)).unwrap(),
            vec![7u8; 10 << 10]
        );
        // A key of another version of the file is not this one.
        let other = fs
            .core
            .unit_of(
                &FileVersion {
                    object: 0,
                    epoch: 0,
                    path: path.to_path_buf(),
                    version: Version("another".into()),
                    home_end: 10 << 10,
                },
                0,
            )
            .0
            .encode();
        assert!(matches!(
            fs.serve_unit(&ask(&other, b"dir/f", true)),
            Err(ServeError::OtherVersion)
        ));
        // Nor is a path that does not exist, or one that is not plain.
        assert!(fs.serve_unit(&ask(&key, b"dir/nothing", true)).is_err());
        assert!(matches!(
            fs.serve_unit(&ask(&key, b"../etc/passwd", true)),
            Err(ServeError::BadKey(_))
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
        // The digest every node computes of the key's encoding.
        use sha2::Digest;
        assert_eq!(held[0].digest[..], sha2::Sha256::digest(&key)[..16]);
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
        assert!(fs.serve_unit(&ask(&key, b"dir/f", true)).is_ok());
        let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
        fs.write(fh, 0, b"changed here").unwrap();
        let got = fs.serve_unit(&ask(&key, b"dir/f", true));
        assert!(
            matches!(got, Err(ServeError::OtherVersion)),
            "{:?}",
            got.map(|d| d.len())
        );
        fs.release(fh).unwrap();
    }
}
