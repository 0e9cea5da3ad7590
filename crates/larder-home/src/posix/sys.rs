//! The system calls beneath the home, each relative to a directory descriptor: opening, `stat` and the
//! attributes and versions made of it, ownership, times, and reading a directory.

use std::ffi::{CStr, CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::from_errno;
use crate::{ContentId, DirEntry, FileKind, HomeAttr, HomeError, HomeResult, Owner, TimeSet, Version};

/// Open the directory at `path` as a root descriptor (`O_PATH`: no read permission needed, nothing read).
pub(super) fn open_root(path: &CStr) -> HomeResult<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated path for the duration of the call.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The mount id of what `path` names relative to the directory `dir` (`path` empty: `dir` itself).
fn mount_id(dir: RawFd, path: &CStr) -> HomeResult<u64> {
    // SAFETY: statx is plain data; zeroed is a valid initial value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = if path.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    // SAFETY: `path` is NUL-terminated and `stx` a valid out-pointer for the duration of the call.
    check(unsafe { libc::statx(dir, path.as_ptr(), flags, libc::STATX_MNT_ID, &mut stx) })?;
    Ok(stx.stx_mnt_id)
}

/// Whether the directory `dir` is the root of a mount of its own (its parent is in another mount).
pub(super) fn is_mount_root(dir: RawFd) -> HomeResult<bool> {
    Ok(mount_id(dir, c"")? != mount_id(dir, c"..")?)
}

/// The (device, inode) of an open descriptor: which directory it is, across mounts.
pub(super) fn identity(fd: RawFd) -> HomeResult<(u64, u64)> {
    // SAFETY: stat is plain data; zeroed is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the duration of the call; a bad `fd` is an error, not UB.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok((st.st_dev, st.st_ino))
}

pub(super) fn cpath(path: &Path) -> HomeResult<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| HomeError::InvalidName("name contains NUL".into()))
}

pub(super) fn last_error() -> HomeError {
    from_errno(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

pub(super) fn check(ret: libc::c_int) -> HomeResult<()> {
    if ret < 0 { Err(last_error()) } else { Ok(()) }
}

fn time_of(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

/// Attributes from a `stat`. The content version is (inode, size, mtime): a chmod or chown keeps cached
/// data, any content change or replacement does not.
pub(crate) fn attr_of(st: &libc::stat) -> HomeAttr {
    let mode = st.st_mode;
    HomeAttr {
        kind: FileKind::from_mode(mode),
        // Unique across the file systems a home directory may span.
        id: st.st_ino ^ st.st_dev.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        size: st.st_size as u64,
        perm: mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        nlink: st.st_nlink as u32,
        rdev: st.st_rdev,
        blocks: st.st_blocks as u64,
        atime: time_of(st.st_atime, st.st_atime_nsec),
        mtime: time_of(st.st_mtime, st.st_mtime_nsec),
        ctime: time_of(st.st_ctime, st.st_ctime_nsec),
        version: Version(format!(
            "{}:{}:{}.{:09}",
            st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec
        )),
    }
}

/// The parts of a version made by [`attr_of`]: "ino:size:mtime_s.mtime_ns".
pub(super) fn posix_content_id(version: &Version) -> Option<ContentId> {
    let mut parts = version.0.splitn(3, ':');
    let ino = parts.next()?.parse().ok()?;
    let size = parts.next()?.parse().ok()?;
    let (s, ns) = parts.next()?.split_once('.')?;
    Some(ContentId::Inode {
        ino,
        size,
        mtime_s: s.parse().ok()?,
        mtime_ns: ns.parse().ok()?,
    })
}

pub(super) fn stat_at(dir: RawFd, path: &CStr) -> HomeResult<HomeAttr> {
    // SAFETY: stat is plain data; zeroed is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid out-pointer for the duration of the call.
    check(unsafe { libc::fstatat(dir, path.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(attr_of(&st))
}

pub(super) fn stat_fd(file: &File) -> HomeResult<HomeAttr> {
    // SAFETY: stat is plain data; zeroed is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `file` is an open descriptor and `st` a valid out-pointer for the duration of the call.
    check(unsafe { libc::fstat(file.as_raw_fd(), &mut st) })?;
    Ok(attr_of(&st))
}

pub(super) fn open_at(dir: RawFd, path: &CStr, flags: libc::c_int, mode: u32) -> HomeResult<File> {
    // SAFETY: `path` is NUL-terminated for the duration of the call.
    let fd = unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub(super) fn chown_at(dir: RawFd, path: &CStr, owner: Owner) -> HomeResult<()> {
    if owner.uid.is_none() && owner.gid.is_none() {
        return Ok(());
    }
    let uid = owner.uid.unwrap_or(u32::MAX);
    let gid = owner.gid.unwrap_or(u32::MAX);
    // SAFETY: `path` is NUL-terminated for the duration of the call.
    check(unsafe { libc::fchownat(dir, path.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
}

pub(super) fn timespec(t: Option<TimeSet>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeSet::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as i64,
            },
            Err(e) => {
                let d = e.duration();
                let (mut s, mut ns) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if ns < 0 {
                    s -= 1;
                    ns += 1_000_000_000;
                }
                libc::timespec { tv_sec: s, tv_nsec: ns }
            }
        },
    }
}

pub(super) fn list_at(dir: RawFd, path: &CStr) -> HomeResult<Vec<DirEntry>> {
    list_with_own_at(dir, path).map(|(_, entries)| entries)
}

/// [`list_at`], with the attributes of the directory itself (read from the descriptor it is listed by,
/// before its entries).
pub(super) fn list_with_own_at(dir: RawFd, path: &CStr) -> HomeResult<(HomeAttr, Vec<DirEntry>)> {
    let file = open_at(dir, path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let own = stat_fd(&file)?;
    let fd = file.into_raw_fd();
    // SAFETY: `fd` is an open directory descriptor; on success the DIR stream owns it.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let e = last_error();
        // SAFETY: fdopendir failed, so `fd` is still ours to close.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let mut out = Vec::new();
    let result = loop {
        // SAFETY: resetting errno of this thread, to tell the end of the stream from an error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `stream` is a valid, open DIR stream.
        let ent = unsafe { libc::readdir64(stream) };
        if ent.is_null() {
            // SAFETY: reading errno of this thread.
            let errno = unsafe { *libc::__errno_location() };
            break if errno == 0 { Ok(()) } else { Err(from_errno(errno)) };
        }
        // SAFETY: `ent` points to a valid dirent until the next readdir on this stream.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()).to_owned() };
        let bytes = name.as_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        // Each entry's attributes are read here, at the home's side, in the same call: one listing
        // answers every stat and lookup of the directory.
        // SAFETY: `stream` is valid; dirfd gives its descriptor without transferring ownership.
        let attr = match stat_at(unsafe { libc::dirfd(stream) }, &name) {
            Ok(a) => a,
            // Gone between readdir and the stat: skip it.
            Err(HomeError::NotFound) => continue,
            Err(e) => break Err(e),
        };
        out.push(DirEntry {
            name: OsString::from_vec(bytes.to_vec()),
            kind: attr.kind,
            attr: Some(attr),
        });
    };
    // SAFETY: `stream` is valid and closed exactly once.
    unsafe { libc::closedir(stream) };
    result.map(|()| (own, out))
}
