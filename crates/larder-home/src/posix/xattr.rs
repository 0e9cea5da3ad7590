//! Extended attributes of the directory home. There is no `*at` form of the xattr calls in the C library,
//! so the object is opened relative to the root (`O_PATH | O_NOFOLLOW`: a final symlink is the object) and
//! the calls go through `/proc/self/fd/N`, a link that resolves to exactly the object opened, a symlink
//! included, whatever happens to its path meanwhile.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::sys::last_error;
use crate::error::from_errno;
use crate::{HomeError, HomeResult};

/// Longest name Linux takes (`XATTR_NAME_MAX`).
const NAME_MAX: usize = 255;
/// Largest value Linux takes (`XATTR_SIZE_MAX`), and the most a name list may take (`XATTR_LIST_MAX`).
const SIZE_MAX: usize = 65536;
/// Asking for a size and then for the bytes races with changes in between (`ERANGE`); retries, then give up.
const SIZE_TRIES: usize = 8;

/// Whether one object of a POSIX file system may hold all of `xattrs`: names of 1 to 255 bytes (else
/// `ERANGE`), values of at most 64 KiB each and a list of names of at most 64 KiB, as Linux takes (else
/// `E2BIG`); and, where the home's room for them was measured (`room`, see [`measure_room`]), their cost
/// ([`cost`]) within it (else `ENOSPC`, what ext4 answers when an inode's attributes fill its block). A
/// change refused here fails at the call rather than at every push to home later.
pub(super) fn check_xattrs(xattrs: &[(Vec<u8>, Vec<u8>)], room: Option<usize>) -> HomeResult<()> {
    let (mut names, mut spent) = (0, 0);
    for (name, value) in xattrs {
        if name.contains(&0) {
            return Err(HomeError::InvalidName("attribute name contains NUL".into()));
        }
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(HomeError::Os(libc::ERANGE));
        }
        if value.len() > SIZE_MAX {
            return Err(HomeError::Os(libc::E2BIG));
        }
        names += name.len() + 1;
        spent += cost(name.len(), value.len());
    }
    if names > SIZE_MAX {
        return Err(HomeError::Os(libc::E2BIG));
    }
    if room.is_some_and(|room| spent > room) {
        return Err(HomeError::Os(libc::ENOSPC));
    }
    Ok(())
}

/// What an attribute takes of an object's room, as ext4 counts it (a 16-byte entry, the name and the value
/// each rounded up to 4 bytes; the name counted whole, its namespace prefix too, which errs on the safe
/// side). btrfs counts differently but takes any set whose cost is within that of the largest single
/// value it takes; a file system taking a 64 KiB value is not bounded this way at all ([`measure_room`]).
pub(super) fn cost(name: usize, value: usize) -> usize {
    16 + name.next_multiple_of(4) + value.next_multiple_of(4)
}

/// The name the room is measured with.
const PROBE: &CStr = c"user.larder.room";

/// The room one object of the file system of directory `dir` has for extended attributes, in [`cost`]: the
/// cost of the largest `user.` value it takes, found by trying sizes on a file of its own that has no
/// name (`O_TMPFILE`: nothing shows at home, and it is gone when closed). `None` where it cannot be
/// measured: no `O_TMPFILE` (NFS), a read-only home, no `user.` attributes.
pub(super) fn measure_room(dir: RawFd) -> Option<usize> {
    // SAFETY: `dir` is an open directory descriptor and the path a NUL-terminated string.
    let fd = unsafe {
        libc::openat(
            dir,
            c".".as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    let takes = |len: usize| -> Option<bool> {
        let value = vec![0u8; len];
        // SAFETY: the name is NUL-terminated and `value` readable for its length during the call.
        let r = unsafe { libc::fsetxattr(file.as_raw_fd(), PROBE.as_ptr(), value.as_ptr().cast(), len, 0) };
        match (r, errno()) {
            (0, _) => Some(true),
            (_, libc::ENOSPC | libc::E2BIG | libc::ERANGE) => Some(false),
            _ => None,
        }
    };
    if !takes(0)? {
        return None;
    }
    // The largest size taken: between `lo` (taken) and `hi` (not taken, or one past Linux's largest).
    let (mut lo, mut hi) = (0, SIZE_MAX + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if takes(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // A file system that takes a value as large as Linux allows keeps attributes apart from the inode
    // (XFS, tmpfs, ext4 with `ea_inode`): no bound of its own on one object's set worth checking.
    if lo >= SIZE_MAX {
        return None;
    }
    Some(cost(PROBE.to_bytes().len(), lo))
}

/// Every extended attribute of the object at `path` under `dir` (a final symlink not followed), in every
/// namespace the caller may read.
pub(super) fn xattrs_at(dir: RawFd, path: &CStr) -> HomeResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let (_object, at) = open_object(dir, path)?;
    // SAFETY: `at` is NUL-terminated and `buf` writable for `len` bytes (null with 0) during the call.
    let names = sized(|buf, len| unsafe { libc::listxattr(at.as_ptr(), buf.cast(), len) })?;
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).map_err(|_| HomeError::InvalidName("attribute name contains NUL".into()))?;
        // SAFETY: both strings are NUL-terminated and `buf` writable for `len` bytes during the call.
        match sized(|buf, len| unsafe { libc::getxattr(at.as_ptr(), cname.as_ptr(), buf.cast(), len) }) {
            Ok(value) => out.push((name.to_vec(), value)),
            // Removed between the listing and this.
            Err(HomeError::Os(libc::ENODATA)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Give the object at `path` under `dir` the attribute `name` with `value`, or take it away (`None`;
/// taking away one it has not is no error).
pub(super) fn set_xattr_at(dir: RawFd, path: &CStr, name: &CStr, value: Option<&[u8]>) -> HomeResult<()> {
    let (_object, at) = open_object(dir, path)?;
    let ret = match value {
        // SAFETY: both strings are NUL-terminated and `v` readable for its length during the call.
        Some(v) => unsafe { libc::setxattr(at.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0) },
        // SAFETY: both strings are NUL-terminated during the call.
        None => unsafe { libc::removexattr(at.as_ptr(), name.as_ptr()) },
    };
    if ret < 0 {
        return match errno() {
            libc::ENODATA if value.is_none() => Ok(()),
            e => Err(xattr_error(e)),
        };
    }
    Ok(())
}

/// The object at `path` under `dir` itself, held open, and the `/proc` path that names it.
fn open_object(dir: RawFd, path: &CStr) -> HomeResult<(OwnedFd, CString)> {
    // SAFETY: `path` is NUL-terminated for the duration of the call.
    let fd = unsafe { libc::openat(dir, path.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let at = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default();
    Ok((fd, at))
}

/// The bytes a list or get call gives, asked for in two steps (the size, then the bytes), again while the
/// attribute grows in between.
fn sized(mut call: impl FnMut(*mut u8, usize) -> isize) -> HomeResult<Vec<u8>> {
    for _ in 0..SIZE_TRIES {
        let len = call(std::ptr::null_mut(), 0);
        if len < 0 {
            return Err(xattr_error(errno()));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; len as usize];
        let got = call(buf.as_mut_ptr(), buf.len());
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        match errno() {
            libc::ERANGE => continue,
            e => return Err(xattr_error(e)),
        }
    }
    Err(HomeError::Os(libc::ERANGE))
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// An errno of an xattr call on the `/proc` path as a home error.
fn xattr_error(e: i32) -> HomeError {
    match e {
        // No extended attributes on this file system, or none in this namespace.
        libc::ENOTSUP => HomeError::Unsupported("extended attributes on this file system"),
        // The object is held open, so a missing path can only be `/proc` itself (not mounted): the calls
        // cannot be made here at all.
        libc::ENOENT => HomeError::Unsupported("extended attributes without /proc"),
        e => from_errno(e),
    }
}
