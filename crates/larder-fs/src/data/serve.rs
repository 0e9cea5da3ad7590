//! Serving this node's content to its peers (see [`crate::serve`]): units of home's versions by key, and
//! bytes of the changes it holds.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::Arc;

use larder_home::FileKind;

use super::DataPath;
use crate::FileVersion;
use crate::key::Part;
use crate::namespace::{Namespace, ROOT};
use crate::serve::{HeldRead, HeldUnit, ServeError, ServeResult, UnitAsk};
use crate::tier::Want;

impl DataPath {
    /// The inode of `path` (relative to home's root), looked up as the kernel would, without counting a
    /// reference.
    fn resolve(&self, path: &Path) -> ServeResult<u64> {
        let mut ino = ROOT;
        for part in path.components() {
            let Component::Normal(name) = part else {
                return Err(ServeError::BadKey(format!("path {path:?} is not plain")));
            };
            ino = self.names.find(ino, name).map_err(|_| ServeError::NotHeld)?;
        }
        Ok(ino)
    }

    /// The unit a peer asks for: see the module doc.
    pub(crate) fn serve_unit(&self, ask: &UnitAsk) -> ServeResult<Arc<Vec<u8>>> {
        let path = Path::new(OsStr::from_bytes(ask.path));
        let ino = self.resolve(path)?;
        for attempt in 0..2 {
            let (file, fresh) = {
                let ns = self.names.read();
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
                (file, self.names.fresh(node.checked))
            };
            let (key, range) = self.core.unit_of(&file, ask.index);
            if key.encode() != ask.key {
                // Ours may be the stale one: ask home once (unless it was just asked), then decide.
                if attempt == 0 && (!fresh || ask.forward) && self.names.revalidate(ino, path).is_ok() {
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

    /// Bytes of a file this node holds changes of, for a peer (see [`HeldRead`]): only of the version of
    /// the held record the peer read; if this node published a newer one since, `OtherVersion`.
    pub(crate) fn serve_held(&self, ask: &HeldRead) -> ServeResult<Vec<u8>> {
        let own = self.names.coherence().and_then(|c| {
            c.record(ask.path)
                .filter(|(r, _)| r.holder == c.me())
                .map(|(_, revision)| revision)
        });
        if own.is_some_and(|r| r != ask.revision) {
            tracing::debug!(asked = ask.revision, own = ?own, "a peer asked for held bytes of another version");
            return Err(ServeError::OtherVersion);
        }
        let path = Path::new(OsStr::from_bytes(ask.path));
        let known = {
            let ns = self.names.read();
            match ns.resolve_known(path) {
                (Some(ino), _) if !ns.inode(ino).map_or(true, |n| n.removed) => Some(ino),
                _ => None,
            }
        };
        let failed = |e: crate::FsError| ServeError::Failed(e.to_string());
        // A file whose record is still this node's may have left memory once home had its changes (the
        // record goes a moment later): looked up again, its bytes are the same.
        let (ino, looked_up) = match known {
            Some(ino) => (ino, Vec::new()),
            None if own.is_some() => {
                let looked_up = self.look_up_path(path).map_err(|_| ServeError::NotHeld)?;
                (*looked_up.last().ok_or(ServeError::NotHeld)?, looked_up)
            }
            None => return Err(ServeError::NotHeld),
        };
        let result = if ask.link {
            self.names.readlink(ino).map_err(failed)
        } else {
            self.open_here(ino).map_err(failed).and_then(|fh| {
                let data = self.read(fh, ask.offset, ask.len.min(u32::MAX as u64) as u32);
                let _ = self.release(fh);
                data.map_err(failed)
            })
        };
        for ino in looked_up.into_iter().rev() {
            self.names.forget(ino, 1);
        }
        result
    }

    /// Look up each name of `path` from the root, as the kernel would; the inodes, each looked up once
    /// (the caller forgets them).
    fn look_up_path(&self, path: &Path) -> crate::FsResult<Vec<u64>> {
        let mut inos = Vec::new();
        let mut at = ROOT;
        for c in path.components() {
            let Component::Normal(name) = c else { continue };
            match self.names.lookup(at, name) {
                Ok(e) => {
                    at = e.attr.ino;
                    inos.push(at);
                }
                Err(e) => {
                    for ino in inos.into_iter().rev() {
                        self.names.forget(ino, 1);
                    }
                    return Err(e);
                }
            }
        }
        Ok(inos)
    }

    /// Every unit this node holds whole of the files it knows clean and at home, with the version home
    /// has: the units a peer could be served. A walk over the namespace (taken shared, once) and the
    /// store's index: for the status and for leaving, not for the I/O path.
    pub(crate) fn held_units(&self) -> Vec<HeldUnit> {
        let files: Vec<FileVersion> = {
            let ns = self.names.read();
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
    pub(crate) fn held_unit_of(&self, ino: u64, object: u64, index: u32) -> Option<HeldUnit> {
        let file = home_file(self, &self.names.read(), ino).filter(|f| f.object == object)?;
        self.unit_held(&file, index).0
    }

    /// The inode of each file's cache object: a walk over the namespace, for a caller that keeps it.
    pub(crate) fn files_by_object(&self) -> HashMap<u64, u64> {
        let ns = self.names.read();
        ns.inodes
            .iter()
            .filter(|(_, n)| n.kind == FileKind::File)
            .map(|(&ino, n)| (n.object, ino))
            .collect()
    }
}

/// `ino` if it is a file this node knows clean and at home, with the version home has: the files whose
/// units a peer may be served (nothing changed here, not removed).
fn home_file(fs: &DataPath, ns: &Namespace, ino: u64) -> Option<FileVersion> {
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
