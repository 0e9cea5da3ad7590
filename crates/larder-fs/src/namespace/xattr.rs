//! Extended attributes: known per inode once asked for (`Inode::xattrs`, persisted with its record), asked
//! of home again when home's object changed, and changed here like any other attribute: in the cache at
//! once, then pushed to home through the journal (`OpKind::SetXattr`), in order with the object's other
//! changes.
//!
//! Namespaces: `user.` and `trusted.` are kept (the kernel checks who may touch each: the owner's mode for
//! `user.`, `CAP_SYS_ADMIN` for `trusted.`). `security.` and `system.` (SELinux labels, file capabilities,
//! POSIX ACLs) are refused with `EOPNOTSUPP`, as on a file system without them: larder would have to
//! enforce what they say, not just keep it. What home cannot hold (too large for an S3 object's metadata, a
//! home without extended attributes) fails at the call, before anything is queued.

use std::collections::BTreeMap;

use larder_home::HomeError;

use crate::namespace::Names;
use crate::namespace::{read, write};
use crate::{FsError, FsResult};

/// One object's extended attributes: name to value.
pub(crate) type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// `XATTR_CREATE` and `XATTR_REPLACE` of setxattr(2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XattrFlags {
    /// Fail with `EEXIST` if the attribute exists.
    pub create: bool,
    /// Fail with `ENODATA` if it does not.
    pub replace: bool,
}

/// Whether larder keeps attributes of this name.
pub(crate) fn kept(name: &[u8]) -> bool {
    name.starts_with(b"user.") || name.starts_with(b"trusted.")
}

/// An attribute name larder can keep, or why not.
pub(crate) fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(FsError::Invalid);
    }
    if name.len() > 255 {
        return Err(FsError::Home(HomeError::Os(libc::ERANGE)));
    }
    if !kept(name) {
        return Err(FsError::XattrUnsupported);
    }
    Ok(())
}

impl Names {
    /// Make `ino`'s extended attributes known: home's, for an object home has (none where home keeps
    /// none); none for one made here and not at home yet.
    pub(crate) fn load_xattrs(&self, ino: u64) -> FsResult<()> {
        // Known already (every call after the first): the namespace shared, as for a stat.
        let path = {
            let ns = read(&self.ns);
            let node = ns.inode(ino)?;
            if node.xattrs.is_some() {
                return Ok(());
            }
            match ns.home_path(ino)? {
                Some(p) if node.home_loc.is_some() => Some(p),
                _ => None,
            }
        };
        let Some(path) = path else {
            // Made here and not at home yet: none but what is set here.
            let mut ns = write(&self.ns);
            let node = ns.inode_mut(ino)?;
            if node.xattrs.is_none() {
                node.xattrs = Some(Box::default());
            }
            return Ok(());
        };
        let got: Xattrs = match self.core.home.xattrs(&path) {
            Ok(list) => list.into_iter().filter(|(n, _)| kept(n)).collect(),
            Err(HomeError::Unsupported(_)) => Xattrs::new(),
            Err(e) => return Err(e.into()),
        };
        let mut ns = write(&self.ns);
        let node = ns.inode_mut(ino)?;
        // A change made meanwhile knew them first.
        if node.xattrs.is_none() {
            node.xattrs = Some(Box::new(got));
            self.persist(&ns, ino);
        }
        Ok(())
    }

    /// The value of `ino`'s extended attribute `name` (`ENODATA` if it has none of that name).
    pub(crate) fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        if !kept(name) {
            return Err(FsError::NoXattr);
        }
        self.load_xattrs(ino)?;
        let ns = read(&self.ns);
        let node = ns.inode(ino)?;
        node.xattrs
            .as_ref()
            .and_then(|x| x.get(name).cloned())
            .ok_or(FsError::NoXattr)
    }

    /// The names of `ino`'s extended attributes.
    pub(crate) fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        self.load_xattrs(ino)?;
        let ns = read(&self.ns);
        Ok(ns
            .inode(ino)?
            .xattrs
            .as_ref()
            .map(|x| x.keys().cloned().collect())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::Drained;
    use crate::namespace::hit_tests::{core, dir_f};

    /// Home's value of `name` on `path`, read by the operating system.
    fn at_home(path: &Path, name: &str) -> Option<Vec<u8>> {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = CString::new(name).unwrap();
        let mut buf = vec![0u8; 4096];
        // SAFETY: valid NUL-terminated strings and a buffer of the length given.
        let got = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        (got >= 0).then(|| {
            buf.truncate(got as usize);
            buf
        })
    }

    fn set_at_home(path: &Path, name: &str, value: &[u8]) {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = CString::new(name).unwrap();
        // SAFETY: valid NUL-terminated strings and a value of the length given.
        let r = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        assert_eq!(r, 0, "setxattr at home: {}", std::io::Error::last_os_error());
    }

    #[test]
    fn an_attribute_set_here_is_seen_at_once_and_reaches_home_through_the_journal() {
        let (tmp, fs, _dir, f) = dir_f();
        fs.start();
        let home_f = tmp.path().join("home/dir/f");
        fs.setxattr(f, b"user.colour", b"blue\0binary", XattrFlags::default())
            .unwrap();
        assert_eq!(fs.getxattr(f, b"user.colour").unwrap(), b"blue\0binary");
        assert_eq!(fs.listxattr(f).unwrap(), vec![b"user.colour".to_vec()]);
        // Queued, not at home yet (the sync lag is 5 s).
        assert_eq!(at_home(&home_f, "user.colour"), None);
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty);
        assert_eq!(at_home(&home_f, "user.colour").as_deref(), Some(&b"blue\0binary"[..]));
        fs.removexattr(f, b"user.colour").unwrap();
        assert!(matches!(fs.getxattr(f, b"user.colour"), Err(FsError::NoXattr)));
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty);
        assert_eq!(at_home(&home_f, "user.colour"), None);
    }

    #[test]
    fn a_file_made_here_is_not_asked_of_home_for_its_attributes_once_it_is_there() {
        let (tmp, fs, dir, _f) = dir_f();
        fs.start();
        let (entry, open) = fs
            .create(dir, std::ffi::OsStr::new("made"), 0o644, libc::O_WRONLY, 0, 0)
            .unwrap();
        fs.release(open.fh).unwrap();
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty);
        let home_made = tmp.path().join("home/dir/made");
        assert!(home_made.exists(), "the file never reached home");
        // What home holds now but the mount never set would show only if home were asked: the list is
        // known since the file's making (home is asked again when its object changes, as for any file).
        set_at_home(&home_made, "user.probe", b"asked");
        assert_eq!(fs.listxattr(entry.attr.ino).unwrap(), Vec::<Vec<u8>>::new());
        fs.setxattr(entry.attr.ino, b"user.here", b"1", XattrFlags::default())
            .unwrap();
        assert_eq!(fs.listxattr(entry.attr.ino).unwrap(), vec![b"user.here".to_vec()]);
    }

    #[test]
    fn flags_and_namespaces_answer_as_setxattr_does() {
        let (_tmp, fs, dir, f) = dir_f();
        let create = XattrFlags {
            create: true,
            replace: false,
        };
        let replace = XattrFlags {
            create: false,
            replace: true,
        };
        assert!(matches!(
            fs.setxattr(f, b"user.a", b"1", replace),
            Err(FsError::NoXattr)
        ));
        fs.setxattr(f, b"user.a", b"1", create).unwrap();
        assert!(matches!(fs.setxattr(f, b"user.a", b"2", create), Err(FsError::Exists)));
        fs.setxattr(f, b"user.a", b"2", replace).unwrap();
        assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"2");
        assert!(matches!(fs.removexattr(f, b"user.missing"), Err(FsError::NoXattr)));
        // Namespaces larder would have to enforce are not kept.
        for name in [&b"security.selinux"[..], b"system.posix_acl_access", b"other"] {
            assert!(
                matches!(
                    fs.setxattr(f, name, b"x", XattrFlags::default()),
                    Err(FsError::XattrUnsupported)
                ),
                "{}",
                String::from_utf8_lossy(name)
            );
            assert!(matches!(fs.getxattr(f, name), Err(FsError::NoXattr)));
        }
        // A directory has them too.
        fs.setxattr(dir, b"trusted.t", b"d", XattrFlags::default()).unwrap();
        assert_eq!(fs.listxattr(dir).unwrap(), vec![b"trusted.t".to_vec()]);
    }

    #[test]
    fn home_attributes_are_read_and_a_change_queued_here_survives_a_restart() {
        let (tmp, fs, _dir, f) = dir_f();
        let (home, cache) = (tmp.path().join("home"), tmp.path().join("cache"));
        // Set at home before anything asked for the file's attributes.
        set_at_home(&home.join("dir/f"), "user.from-home", b"h");
        assert_eq!(fs.getxattr(f, b"user.from-home").unwrap(), b"h");
        fs.setxattr(f, b"user.here", b"queued", XattrFlags::default()).unwrap();
        fs.shutdown().unwrap();
        drop(fs);
        assert_eq!(
            at_home(&home.join("dir/f"), "user.here"),
            None,
            "pushed before the sync lag"
        );
        let fs = core(&home, &cache);
        fs.start();
        let mut ns = fs.names.write();
        fs.names.load_inode(&mut ns, f).unwrap();
        drop(ns);
        let mut names = fs.listxattr(f).unwrap();
        names.sort();
        assert_eq!(names, vec![b"user.from-home".to_vec(), b"user.here".to_vec()]);
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty);
        assert_eq!(
            at_home(&home.join("dir/f"), "user.here").as_deref(),
            Some(&b"queued"[..])
        );
    }
}
