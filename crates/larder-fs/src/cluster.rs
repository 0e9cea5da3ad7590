//! Serving units to the cluster's other nodes (design note 013): a peer names a unit by its portable key
//! and says where home has the file; this node resolves the path in its own namespace, checks that the
//! version it knows is the one the key names, and answers from its read path: its store, and home too
//! when the asker says this node owns the unit (one home read for every node that wants it, however
//! many ask at once: the read path's single flight).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::{Arc, Weak};

use larder_cluster::peer::{Ask, Bytes, SourceError, UnitSource};
use larder_home::FileKind;

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
            if !ask.forward && !self.holds(object, &key.part) {
                return Err(SourceError::NotHeld);
            }
            let local = Local {
                object,
                epoch,
                path,
                version: &version,
            };
            let mut want = Want::new(&key, range, local);
            want.from_peer = true;
            return self
                .core
                .tiers
                .fetch(&want)
                .map_err(|e| SourceError::Failed(e.to_string()));
        }
        Err(SourceError::OtherVersion)
    }

    /// Whether the store holds all of unit `part` of `object`.
    fn holds(&self, object: u64, part: &Part) -> bool {
        match *part {
            Part::Whole { len } => self.core.store.present(object, len),
            Part::Block { index, .. } => self.core.store.contains((object, index)),
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
}
