//! Changes of extended attributes: made in the cache and queued like any other change.

use super::*;
use crate::namespace::{XattrFlags, check_xattr_name, xattr_kept};

impl Changes {
    /// Give `ino` the extended attribute `name` with `value`.
    pub(crate) fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> FsResult<()> {
        check_xattr_name(name)?;
        self.change_xattr(ino, name, Some(value), flags)
    }

    /// Take `ino`'s extended attribute `name` away (`ENODATA` if it has none).
    pub(crate) fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        if !xattr_kept(name) {
            return Err(FsError::NoXattr);
        }
        self.change_xattr(
            ino,
            name,
            None,
            XattrFlags {
                create: false,
                replace: true,
            },
        )
    }

    fn change_xattr(&self, ino: u64, name: &[u8], value: Option<&[u8]>, flags: XattrFlags) -> FsResult<()> {
        self.names.writable()?;
        if !self.core.home.limits().xattrs {
            return Err(FsError::XattrUnsupported);
        }
        self.names.take_token_of(ino)?;
        self.names.load_xattrs(ino)?;
        let mut ns = self.names.write();
        let path = crate::changes::path_bytes(&ns.path_of(ino)?);
        let node = ns.inode_mut(ino)?;
        let mut xattrs = node.xattrs.as_deref().cloned().unwrap_or_default();
        let had = xattrs.contains_key(name);
        if flags.create && had {
            return Err(FsError::Exists);
        }
        if flags.replace && !had {
            return Err(FsError::NoXattr);
        }
        match value {
            Some(v) => {
                xattrs.insert(name.to_vec(), v.to_vec());
                // What home could not hold fails here, before anything is queued.
                let all: Vec<(Vec<u8>, Vec<u8>)> = xattrs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                self.core.home.check_xattrs(&all)?;
            }
            None => {
                xattrs.remove(name);
            }
        }
        if let Some(a) = node.attr.as_mut() {
            a.ctime = std::time::SystemTime::now();
        }
        node.xattrs = Some(Box::new(xattrs));
        let ops = vec![Op::new(
            ino,
            path,
            Vec::new(),
            OpKind::SetXattr {
                name: name.to_vec(),
                value: value.map(<[u8]>::to_vec),
            },
        )];
        let muts = Self::record_of(&ns, ino).into_iter().collect();
        self.commit(None, ns, ops, &[], muts)
    }
}
