//! Serving units to the cluster's other nodes (design note 013): a peer names a unit by its portable key
//! and says where home has the file; this node resolves the path in its own namespace, checks that the
//! version it knows is the one the key names, and answers from its read path: its store, and home too
//! when the asker says this node owns the unit (one home read for every node that wants it, however
//! many ask at once: the read path's single flight).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Weak};

use larder_cluster::peer::{Ask, Bytes, SourceError, UnitSource};
use larder_home::{FileKind, Version};

use crate::key::Part;

use crate::namespace::{Fs, ROOT, read};
use crate::tier::{Local, Want};

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
            want.from_peer = true;
            want.take_from = ask.from;
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

impl Fs {
    /// Every unit this node holds whole of the files it knows clean and at home, with the version home
    /// has: the units a peer could be served. A walk over the namespace (taken shared, once) and the
    /// store's index: for the status and for leaving, not for the I/O path.
    pub fn held_units(&self) -> Vec<HeldUnit> {
        let files: Vec<(u64, Version, u64, PathBuf)> = {
            let ns = read(&self.ns);
            ns.inodes
                .iter()
                .filter(|(_, n)| n.kind == FileKind::File && n.dirty.is_empty() && n.home_size.is_none() && !n.removed)
                .filter_map(|(&ino, n)| {
                    let version = n.attr.as_ref()?.version.clone();
                    let path = ns.home_path(ino).ok()??;
                    Some((n.object, version, n.home_end(), path))
                })
                .collect()
        };
        let bs = self.core.store.block_size();
        let mut out = Vec::new();
        for (object, version, home_end, path) in files {
            let blocks = home_end.div_ceil(bs) as u32;
            for index in 0..blocks.max(1) {
                let (key, range) = self.core.unit_of(index, &path, &version, home_end);
                let held = match key.part {
                    Part::Whole { len } => self.core.store.present(object, len),
                    Part::Block { .. } => range.end > range.start && self.core.store.contains((object, index)),
                };
                if held {
                    out.push(HeldUnit {
                        digest: key.digest().0,
                        key: key.encode(),
                        path: path.clone(),
                        index,
                        len: range.end - range.start,
                    });
                }
                if matches!(key.part, Part::Whole { .. }) {
                    break;
                }
            }
        }
        out
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
}

#[cfg(test)]
mod tests {
    use larder_home::Version;

    use super::*;
    use crate::namespace::hit_tests::core;

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
        }
    }

    #[test]
    fn a_unit_is_served_by_path_and_key_for_the_version_asked_only() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = core(&tmp.path().join("home"), &tmp.path().join("cache"));
        let path = Path::new("dir/f");
        let dir = fs.lookup(ROOT, OsStr::new("dir")).unwrap().attr.ino;
        let ino = fs.lookup(dir, OsStr::new("f")).unwrap().attr.ino;
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
        let tmp = tempfile::tempdir().unwrap();
        let fs = core(&tmp.path().join("home"), &tmp.path().join("cache"));
        let dir = fs.lookup(ROOT, OsStr::new("dir")).unwrap().attr.ino;
        let ino = fs.lookup(dir, OsStr::new("f")).unwrap().attr.ino;
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
        let tmp = tempfile::tempdir().unwrap();
        let fs = core(&tmp.path().join("home"), &tmp.path().join("cache"));
        let dir = fs.lookup(ROOT, OsStr::new("dir")).unwrap().attr.ino;
        let ino = fs.lookup(dir, OsStr::new("f")).unwrap().attr.ino;
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
