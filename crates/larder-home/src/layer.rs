//! Layers: cross-cutting behaviour around any home, forwarded in exactly one place.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use crate::{
    ContentId, DirEntry, Home, HomeAttr, HomeError, HomeLimits, HomeResult, NewFile, Owner, RenameFlags, SetAttr,
    StatFs, Version,
};

/// The kinds of home operation, for counters and emulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Stat,
    List,
    Read,
    Readlink,
    Create,
    Mkdir,
    Mknod,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    SetAttr,
    Write,
    StatFs,
}

impl OpKind {
    /// Every kind, in a stable order.
    pub const ALL: [OpKind; 15] = [
        OpKind::Stat,
        OpKind::List,
        OpKind::Read,
        OpKind::Readlink,
        OpKind::Create,
        OpKind::Mkdir,
        OpKind::Mknod,
        OpKind::Symlink,
        OpKind::Link,
        OpKind::Unlink,
        OpKind::Rmdir,
        OpKind::Rename,
        OpKind::SetAttr,
        OpKind::Write,
        OpKind::StatFs,
    ];

    /// A stable lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Stat => "stat",
            OpKind::List => "list",
            OpKind::Read => "read",
            OpKind::Readlink => "readlink",
            OpKind::Create => "create",
            OpKind::Mkdir => "mkdir",
            OpKind::Mknod => "mknod",
            OpKind::Symlink => "symlink",
            OpKind::Link => "link",
            OpKind::Unlink => "unlink",
            OpKind::Rmdir => "rmdir",
            OpKind::Rename => "rename",
            OpKind::SetAttr => "setattr",
            OpKind::Write => "write",
            OpKind::StatFs => "statfs",
        }
    }

    /// Position in [`OpKind::ALL`].
    pub fn index(self) -> usize {
        OpKind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

/// Behaviour added around every home operation.
///
/// Two kinds of behaviour, in one trait. The observers ([`Layer::before`], [`Layer::answer`],
/// [`Layer::after`]) see every operation as an [`OpKind`]: counters, link emulation, fault injection. The
/// hooks, one per [`Home`] call, may change the answer: each receives the next home (the layers below
/// this one and the backend) and forwards to it by default, so a layer writes only the calls it changes
/// and every call, `list_with_own` included, reaches the backend through every layer. [`Layered`] is the
/// only wrapper of a home: it calls a layer's observers around its hook.
pub trait Layer: Send + Sync + 'static {
    /// Called before the operation; `bytes_out` is what it sends to home. An error skips the operation.
    fn before(&self, _op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        Ok(())
    }
    /// Called after an operation home carried out: an error here replaces its answer (the answer was
    /// lost on the way back; the operation happened).
    fn answer(&self, _op: OpKind) -> HomeResult<()> {
        Ok(())
    }
    /// Called after the operation with the bytes it brought back and its error, if it failed.
    fn after(&self, _op: OpKind, _bytes_in: u64, _error: Option<&HomeError>) {}

    // The hooks: each is the call it names, made through this layer; `next` is the home below it.
    fn content_id(&self, next: &dyn Home, path: &Path, version: &Version) -> ContentId {
        next.content_id(path, version)
    }
    fn stat(&self, next: &dyn Home, path: &Path) -> HomeResult<HomeAttr> {
        next.stat(path)
    }
    fn list(&self, next: &dyn Home, path: &Path) -> HomeResult<Vec<DirEntry>> {
        next.list(path)
    }
    fn list_with_own(&self, next: &dyn Home, path: &Path) -> HomeResult<(Option<HomeAttr>, Vec<DirEntry>)> {
        next.list_with_own(path)
    }
    fn read(&self, next: &dyn Home, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>> {
        next.read(path, version, offset, len)
    }
    fn readlink(&self, next: &dyn Home, path: &Path) -> HomeResult<Vec<u8>> {
        next.readlink(path)
    }
    fn create(&self, next: &dyn Home, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        next.create(path, mode, owner)
    }
    fn create_file(&self, next: &dyn Home, path: &Path, new: &NewFile<'_>) -> HomeResult<HomeAttr> {
        next.create_file(path, new)
    }
    fn mkdir(&self, next: &dyn Home, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        next.mkdir(path, mode, owner)
    }
    fn mknod(&self, next: &dyn Home, path: &Path, mode: u32, rdev: u64, owner: Owner) -> HomeResult<HomeAttr> {
        next.mknod(path, mode, rdev, owner)
    }
    fn symlink(&self, next: &dyn Home, target: &[u8], path: &Path, owner: Owner) -> HomeResult<HomeAttr> {
        next.symlink(target, path, owner)
    }
    fn link(&self, next: &dyn Home, existing: &Path, new: &Path) -> HomeResult<HomeAttr> {
        next.link(existing, new)
    }
    fn unlink(&self, next: &dyn Home, path: &Path) -> HomeResult<()> {
        next.unlink(path)
    }
    fn rmdir(&self, next: &dyn Home, path: &Path) -> HomeResult<()> {
        next.rmdir(path)
    }
    fn rename(&self, next: &dyn Home, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()> {
        next.rename(from, to, flags)
    }
    fn setattr(&self, next: &dyn Home, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr> {
        next.setattr(path, changes)
    }
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        next: &dyn Home,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
        mtime: Option<std::time::SystemTime>,
    ) -> HomeResult<HomeAttr> {
        next.write(path, source, ranges, size, base, mtime)
    }
    fn xattrs(&self, next: &dyn Home, path: &Path) -> HomeResult<Vec<(Vec<u8>, Vec<u8>)>> {
        next.xattrs(path)
    }
    fn set_xattr(&self, next: &dyn Home, path: &Path, name: &[u8], value: Option<&[u8]>) -> HomeResult<()> {
        next.set_xattr(path, name, value)
    }
    fn statfs(&self, next: &dyn Home) -> HomeResult<StatFs> {
        next.statfs()
    }
}

/// A home wrapped in a layer.
pub struct Layered<L: Layer> {
    inner: Arc<dyn Home>,
    layer: L,
}

impl<L: Layer> Layered<L> {
    /// Wrap `inner` in `layer`.
    pub fn new(inner: Arc<dyn Home>, layer: L) -> Layered<L> {
        Layered { inner, layer }
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }

    fn call<T>(
        &self,
        op: OpKind,
        out: u64,
        f: impl FnOnce(&L, &dyn Home) -> HomeResult<T>,
        bytes_in: impl Fn(&T) -> u64,
    ) -> HomeResult<T> {
        self.layer.before(op, out)?;
        let result = f(&self.layer, self.inner.as_ref()).and_then(|v| self.layer.answer(op).map(|()| v));
        match &result {
            Ok(v) => self.layer.after(op, bytes_in(v), None),
            Err(e) => self.layer.after(op, 0, Some(e)),
        }
        result
    }
}

impl<L: Layer> Layered<L> {
    /// The bytes a write of `ranges` of `source` sends: holes are not sent to a home that keeps them.
    fn bytes_out(&self, source: &File, ranges: &[Range<u64>], size: u64) -> u64 {
        if self.inner.limits().holes {
            crate::extents::data_bytes(source, ranges, size)
        } else {
            ranges.iter().map(|r| r.end.min(size).saturating_sub(r.start)).sum()
        }
    }
}

fn none<T>(_: &T) -> u64 {
    0
}

impl<L: Layer> Home for Layered<L> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    // Not an operation on home's content: no layer sees it.
    fn reconnect(&self) -> HomeResult<bool> {
        self.inner.reconnect()
    }
    // Asks home nothing.
    fn content_id(&self, path: &Path, version: &Version) -> ContentId {
        self.layer.content_id(self.inner.as_ref(), path, version)
    }
    fn stat(&self, path: &Path) -> HomeResult<HomeAttr> {
        self.call(OpKind::Stat, 0, |l, h| l.stat(h, path), none)
    }
    fn list(&self, path: &Path) -> HomeResult<Vec<DirEntry>> {
        self.call(OpKind::List, 0, |l, h| l.list(h, path), none)
    }
    fn list_with_own(&self, path: &Path) -> HomeResult<(Option<HomeAttr>, Vec<DirEntry>)> {
        self.call(OpKind::List, 0, |l, h| l.list_with_own(h, path), none)
    }
    fn read(&self, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>> {
        self.call(
            OpKind::Read,
            0,
            |l, h| l.read(h, path, version, offset, len),
            |v| v.len() as u64,
        )
    }
    fn readlink(&self, path: &Path) -> HomeResult<Vec<u8>> {
        self.call(OpKind::Readlink, 0, |l, h| l.readlink(h, path), none)
    }
    fn create(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        self.call(OpKind::Create, 0, |l, h| l.create(h, path, mode, owner), none)
    }
    // One call, with what it sends.
    fn create_file(&self, path: &Path, new: &NewFile<'_>) -> HomeResult<HomeAttr> {
        let out = new.content.map_or(0, |c| self.bytes_out(c.source, c.ranges, c.size));
        self.call(OpKind::Create, out, |l, h| l.create_file(h, path, new), none)
    }
    fn mkdir(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        self.call(OpKind::Mkdir, 0, |l, h| l.mkdir(h, path, mode, owner), none)
    }
    fn mknod(&self, path: &Path, mode: u32, rdev: u64, owner: Owner) -> HomeResult<HomeAttr> {
        self.call(OpKind::Mknod, 0, |l, h| l.mknod(h, path, mode, rdev, owner), none)
    }
    fn symlink(&self, target: &[u8], path: &Path, owner: Owner) -> HomeResult<HomeAttr> {
        self.call(OpKind::Symlink, 0, |l, h| l.symlink(h, target, path, owner), none)
    }
    fn link(&self, existing: &Path, new: &Path) -> HomeResult<HomeAttr> {
        self.call(OpKind::Link, 0, |l, h| l.link(h, existing, new), none)
    }
    fn unlink(&self, path: &Path) -> HomeResult<()> {
        self.call(OpKind::Unlink, 0, |l, h| l.unlink(h, path), none)
    }
    fn rmdir(&self, path: &Path) -> HomeResult<()> {
        self.call(OpKind::Rmdir, 0, |l, h| l.rmdir(h, path), none)
    }
    fn rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()> {
        self.call(OpKind::Rename, 0, |l, h| l.rename(h, from, to, flags), none)
    }
    fn setattr(&self, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr> {
        self.call(OpKind::SetAttr, 0, |l, h| l.setattr(h, path, changes), none)
    }
    fn write(
        &self,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
        mtime: Option<std::time::SystemTime>,
    ) -> HomeResult<HomeAttr> {
        let out = self.bytes_out(source, ranges, size);
        self.call(
            OpKind::Write,
            out,
            |l, h| l.write(h, path, source, ranges, size, base, mtime),
            none,
        )
    }
    // Counted as the stat and setattr they are closest to.
    fn xattrs(&self, path: &Path) -> HomeResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.call(OpKind::Stat, 0, |l, h| l.xattrs(h, path), none)
    }
    fn set_xattr(&self, path: &Path, name: &[u8], value: Option<&[u8]>) -> HomeResult<()> {
        let bytes = value.map_or(0, |v| v.len() as u64);
        self.call(OpKind::SetAttr, bytes, |l, h| l.set_xattr(h, path, name, value), none)
    }
    // Asks home nothing.
    fn check_xattrs(&self, xattrs: &[(Vec<u8>, Vec<u8>)]) -> HomeResult<()> {
        self.inner.check_xattrs(xattrs)
    }
    fn statfs(&self) -> HomeResult<StatFs> {
        self.call(OpKind::StatFs, 0, |l, h| l.statfs(h), none)
    }
    fn limits(&self) -> HomeLimits {
        self.inner.limits()
    }
    // Asks home nothing.
    fn rewrite_bytes(&self) -> Option<crate::RewriteBytes> {
        self.inner.rewrite_bytes()
    }
}
