//! The [`Home`] calls of [`PosixHome`]: each runs the system call on the pool, relative to the root
//! descriptor.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use super::PosixHome;
use super::sys::{
    check, chown_at, cpath, identity, is_mount_root, last_error, list_at, list_with_own_at, open_at, open_root,
    posix_content_id, stat_at, stat_fd, timespec,
};
use super::write::{write_at, write_to};
use super::xattr::{check_xattrs, measure_room, set_xattr_at, xattrs_at};
use crate::{
    ContentId, DirEntry, Home, HomeAttr, HomeError, HomeLimits, HomeResult, NewFile, Owner, RenameFlags, SetAttr,
    StatFs, TimeSet, Version,
};

impl Home for PosixHome {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn reconnect(&self) -> HomeResult<bool> {
        let held = self.root();
        let before = held.clone();
        let path = cpath(&self.root)?;
        let shown = self.root.display().to_string();
        let mount_point = self.mount_point;
        let fresh = self.run(move || {
            let fd = open_root(&path)
                .and_then(|fd| identity(fd.as_raw_fd()).map(|id| (fd, id)))
                .map_err(|e| HomeError::Unavailable(format!("the home directory {shown} cannot be opened: {e}")));
            let (fd, now) = fd?;
            if mount_point && !is_mount_root(fd.as_raw_fd()).unwrap_or(true) {
                // The directory beneath a mount that is not there (yet): not the home.
                return Err(HomeError::Unavailable(format!(
                    "the home {shown} was a mount point and nothing is mounted there now"
                )));
            }
            // A held descriptor that no longer answers (ENOTCONN of a dead mount, ESTALE, EIO) is replaced too.
            Ok((identity(held.as_raw_fd()).ok() != Some(now)).then_some(fd))
        })?;
        let Some(fd) = fresh else { return Ok(false) };
        let mut root = self.root_fd.write().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&root, &before) {
            // Another reconnect got there first.
            return Ok(true);
        }
        *root = Arc::new(fd);
        tracing::warn!(home = %self.root.display(), "the home directory was replaced (remounted or mounted over); reopened it");
        Ok(true)
    }

    /// The inode number, size and modification time that make up the version: the same on every node
    /// that sees this file system.
    fn content_id(&self, path: &Path, version: &Version) -> ContentId {
        posix_content_id(version).unwrap_or_else(|| ContentId::named(path, version))
    }

    fn stat(&self, path: &Path) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        self.run(move || stat_at(root.as_raw_fd(), &p))
    }

    fn list(&self, path: &Path) -> HomeResult<Vec<DirEntry>> {
        let (root, p) = self.at(path)?;
        self.run(move || list_at(root.as_raw_fd(), &p))
    }

    fn list_with_own(&self, path: &Path) -> HomeResult<(Option<HomeAttr>, Vec<DirEntry>)> {
        let (root, p) = self.at(path)?;
        self.run(move || list_with_own_at(root.as_raw_fd(), &p).map(|(own, entries)| (Some(own), entries)))
    }

    fn read(&self, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>> {
        let (root, p) = self.at(path)?;
        let version = version.clone();
        self.run(move || {
            let file = open_at(root.as_raw_fd(), &p, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
            if stat_fd(&file)?.version != version {
                return Err(HomeError::Stale);
            }
            let mut buf = vec![0u8; len];
            let mut done = 0;
            while done < len {
                match file.read_at(&mut buf[done..], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            buf.truncate(done);
            if stat_fd(&file)?.version != version {
                return Err(HomeError::Stale);
            }
            Ok(buf)
        })
    }

    fn readlink(&self, path: &Path) -> HomeResult<Vec<u8>> {
        let (root, p) = self.at(path)?;
        self.run(move || {
            let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
            // SAFETY: `p` is NUL-terminated and `buf` is writable for its whole length.
            let n = unsafe { libc::readlinkat(root.as_raw_fd(), p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                return Err(last_error());
            }
            buf.truncate(n as usize);
            Ok(buf)
        })
    }

    fn create(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        self.run(move || stat_fd(&create_at(root.as_raw_fd(), &p, mode, owner)?))
    }

    /// One open: the file is made, owned, written, timed and synced through the descriptor it was made
    /// with.
    fn create_file(&self, path: &Path, new: &NewFile<'_>) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        let (mode, owner, mtime) = (new.mode, new.owner, new.mtime);
        let content = match new.content {
            Some(c) => Some((c.source.try_clone()?, c.ranges.to_vec(), c.size)),
            None => None,
        };
        self.run(move || {
            let file = create_at(root.as_raw_fd(), &p, mode, owner)?;
            if let Some((source, ranges, size)) = content {
                return write_to(&file, 0, &source, ranges, size, mtime);
            }
            if let Some(t) = mtime {
                let times = [timespec(None), timespec(Some(TimeSet::At(t)))];
                // SAFETY: a valid open descriptor and two timespecs, as futimens requires.
                check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) })?;
            }
            stat_fd(&file)
        })
    }

    fn mkdir(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        self.run(move || {
            // SAFETY: `p` is NUL-terminated for the duration of the call.
            check(unsafe { libc::mkdirat(root.as_raw_fd(), p.as_ptr(), (mode & 0o7777) as libc::mode_t) })?;
            chown_at(root.as_raw_fd(), &p, owner)?;
            stat_at(root.as_raw_fd(), &p)
        })
    }

    fn mknod(&self, path: &Path, mode: u32, rdev: u64, owner: Owner) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        self.run(move || {
            // SAFETY: `p` is NUL-terminated for the duration of the call.
            check(unsafe { libc::mknodat(root.as_raw_fd(), p.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })?;
            chown_at(root.as_raw_fd(), &p, owner)?;
            stat_at(root.as_raw_fd(), &p)
        })
    }

    fn symlink(&self, target: &[u8], path: &Path, owner: Owner) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        let target = CString::new(target.to_vec()).map_err(|_| HomeError::InvalidName("target contains NUL".into()))?;
        self.run(move || {
            // SAFETY: both strings are NUL-terminated for the duration of the call.
            check(unsafe { libc::symlinkat(target.as_ptr(), root.as_raw_fd(), p.as_ptr()) })?;
            chown_at(root.as_raw_fd(), &p, owner)?;
            stat_at(root.as_raw_fd(), &p)
        })
    }

    fn link(&self, existing: &Path, new: &Path) -> HomeResult<HomeAttr> {
        let (root, from) = self.at(existing)?;
        let (_, to) = self.at(new)?;
        self.run(move || {
            let fd = root.as_raw_fd();
            // SAFETY: both paths are NUL-terminated for the duration of the call.
            check(unsafe { libc::linkat(fd, from.as_ptr(), fd, to.as_ptr(), 0) })?;
            stat_at(fd, &to)
        })
    }

    fn unlink(&self, path: &Path) -> HomeResult<()> {
        let (root, p) = self.at(path)?;
        // SAFETY: `p` is NUL-terminated for the duration of the call.
        self.run(move || check(unsafe { libc::unlinkat(root.as_raw_fd(), p.as_ptr(), 0) }))
    }

    fn rmdir(&self, path: &Path) -> HomeResult<()> {
        let (root, p) = self.at(path)?;
        // SAFETY: `p` is NUL-terminated for the duration of the call.
        self.run(move || check(unsafe { libc::unlinkat(root.as_raw_fd(), p.as_ptr(), libc::AT_REMOVEDIR) }))
    }

    fn rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()> {
        let (root, from) = self.at(from)?;
        let (_, to) = self.at(to)?;
        self.run(move || {
            let mut raw = 0;
            if flags.no_replace {
                raw |= libc::RENAME_NOREPLACE;
            }
            if flags.exchange {
                raw |= libc::RENAME_EXCHANGE;
            }
            let fd = root.as_raw_fd();
            // SAFETY: both paths are NUL-terminated for the duration of the call.
            check(unsafe { libc::renameat2(fd, from.as_ptr(), fd, to.as_ptr(), raw) })
        })
    }

    fn setattr(&self, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        let changes = changes.clone();
        self.run(move || {
            let fd = root.as_raw_fd();
            if changes.uid.is_some() || changes.gid.is_some() {
                chown_at(
                    fd,
                    &p,
                    Owner {
                        uid: changes.uid,
                        gid: changes.gid,
                    },
                )?;
            }
            if let Some(perm) = changes.perm {
                // SAFETY: `p` is NUL-terminated for the duration of the call.
                check(unsafe { libc::fchmodat(fd, p.as_ptr(), perm & 0o7777, 0) })?;
            }
            if let Some(size) = changes.size {
                let file = open_at(fd, &p, libc::O_WRONLY | libc::O_NOFOLLOW, 0)?;
                file.set_len(size)?;
            }
            if changes.atime.is_some() || changes.mtime.is_some() {
                let times = [timespec(changes.atime), timespec(changes.mtime)];
                // SAFETY: `p` is NUL-terminated and `times` two timespecs, as utimensat requires.
                check(unsafe { libc::utimensat(fd, p.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })?;
            }
            stat_at(fd, &p)
        })
    }

    fn write(
        &self,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
        mtime: Option<SystemTime>,
    ) -> HomeResult<HomeAttr> {
        let (root, p) = self.at(path)?;
        let source = source.try_clone()?;
        let ranges = ranges.to_vec();
        let base = base.cloned();
        self.run(move || write_at(root.as_raw_fd(), &p, &source, ranges, size, base, mtime))
    }

    fn xattrs(&self, path: &Path) -> HomeResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let (root, p) = self.at(path)?;
        self.run(move || xattrs_at(root.as_raw_fd(), &p))
    }

    fn set_xattr(&self, path: &Path, name: &[u8], value: Option<&[u8]>) -> HomeResult<()> {
        let (root, p) = self.at(path)?;
        let name = CString::new(name).map_err(|_| HomeError::InvalidName("attribute name contains NUL".into()))?;
        let value = value.map(<[u8]>::to_vec);
        self.run(move || set_xattr_at(root.as_raw_fd(), &p, &name, value.as_deref()))
    }

    fn check_xattrs(&self, xattrs: &[(Vec<u8>, Vec<u8>)]) -> HomeResult<()> {
        // Measured at the first check (a few calls on a file of its own at home, bounded as every call is),
        // then known: the root's file system does not change under a home.
        let room = *self.xattr_room.get_or_init(|| {
            let root = self.root();
            self.run(move || Ok(measure_room(root.as_raw_fd()))).unwrap_or(None)
        });
        check_xattrs(xattrs, room)
    }

    fn statfs(&self) -> HomeResult<StatFs> {
        let root = self.root();
        self.run(move || {
            // SAFETY: statvfs is plain data; zeroed is a valid initial value.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: `root` is an open descriptor and `s` a valid out-pointer for the duration of the call.
            check(unsafe { libc::fstatvfs(root.as_raw_fd(), &mut s) })?;
            Ok(StatFs {
                blocks: s.f_blocks,
                blocks_free: s.f_bfree,
                blocks_available: s.f_bavail,
                files: s.f_files,
                files_free: s.f_ffree,
                block_size: s.f_frsize as u32,
                name_max: s.f_namemax as u32,
            })
        })
    }

    fn limits(&self) -> HomeLimits {
        self.limits.clone()
    }
}

/// Make the regular file `path` under `dir`, which must not exist, with `mode` and `owner`: its descriptor,
/// open for writing.
fn create_at(dir: i32, path: &std::ffi::CStr, mode: u32, owner: Owner) -> HomeResult<File> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let file = open_at(dir, path, flags, mode & 0o7777)?;
    if owner.uid.is_some() || owner.gid.is_some() {
        let (uid, gid) = (owner.uid.unwrap_or(u32::MAX), owner.gid.unwrap_or(u32::MAX));
        // SAFETY: `file` is an open descriptor.
        check(unsafe { libc::fchown(file.as_raw_fd(), uid, gid) })?;
        // An owner change clears setuid/setgid; put the requested bits back.
        // SAFETY: `file` is an open descriptor.
        check(unsafe { libc::fchmod(file.as_raw_fd(), mode & 0o7777) })?;
    }
    Ok(file)
}
