//! A home that is a directory: local, or an NFS/GlusterFS/Lustre mount that may be slow or hang.
//!
//! Each call runs on a small worker pool and is awaited with a deadline (`op_timeout`), so a home whose
//! server has gone away gives [`HomeError::TimedOut`] (EIO at the mount) instead of a hung caller. A
//! worker stuck in the kernel stays stuck; the pool grows up to `MAX_WORKERS` and then calls time out
//! while queued.
//!
//! The user's home is the path, not the directory first found there: [`Home::reconnect`] compares what the
//! path names now with the descriptor held and reopens the path when they differ (home was remounted, or
//! something was mounted over it) or when the held descriptor no longer answers (a dead FUSE or NFS mount).
//! Calls under way keep the descriptor they started with; the old one closes when the last of them ends.

use std::ffi::{CStr, CString, OsString};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::from_errno;
use crate::extents::data_extents;
use crate::{
    ContentId, DirEntry, FileKind, Home, HomeAttr, HomeError, HomeLimits, HomeResult, Owner, RenameFlags, SetAttr,
    StatFs, TimeSet, Version,
};

const MAX_WORKERS: usize = 64;
const COPY_CHUNK: usize = 1 << 20;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A POSIX directory as home.
pub struct PosixHome {
    root: PathBuf,
    /// The root directory as last opened; replaced by [`Home::reconnect`].
    root_fd: RwLock<Arc<OwnedFd>>,
    op_timeout: Option<Duration>,
    pool: Option<Pool>,
    /// Read once at start: the root's file system does not change under a home.
    limits: HomeLimits,
    /// The home was a mount point when opened (an NFS, FUSE or bind mount of its own). While its mount is
    /// away (a dead mount cleared, not yet mounted again), the path names the empty directory beneath:
    /// that is not the home, and reconnecting to it would push changes where nobody sees them.
    mount_point: bool,
}

struct Pool {
    sender: Mutex<Sender<Job>>,
    receiver: Arc<Mutex<Receiver<Job>>>,
    workers: AtomicUsize,
    idle: Arc<AtomicUsize>,
}

impl Pool {
    fn new() -> Pool {
        let (sender, receiver) = mpsc::channel();
        Pool {
            sender: Mutex::new(sender),
            receiver: Arc::new(Mutex::new(receiver)),
            workers: AtomicUsize::new(0),
            idle: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn submit(&self, job: Job) {
        if self.idle.load(Ordering::Acquire) == 0 && self.workers.load(Ordering::Acquire) < MAX_WORKERS {
            self.workers.fetch_add(1, Ordering::AcqRel);
            let receiver = self.receiver.clone();
            let idle = self.idle.clone();
            let spawned = std::thread::Builder::new().name("larder-home".into()).spawn(move || {
                loop {
                    idle.fetch_add(1, Ordering::AcqRel);
                    let job = receiver.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    idle.fetch_sub(1, Ordering::AcqRel);
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            });
            if spawned.is_err() {
                self.workers.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // The receiver lives as long as the pool, so a send cannot fail while `self` exists.
        let _ = self.sender.lock().unwrap_or_else(|p| p.into_inner()).send(job);
    }
}

impl PosixHome {
    /// A home rooted at `root`, each call bounded by `op_timeout` (`None`: calls run inline, unbounded).
    /// Every call works relative to a descriptor of `root`, so paths inside home may be as long as the
    /// kernel allows whatever the root's own path.
    pub fn new(root: impl Into<PathBuf>, op_timeout: Option<Duration>) -> HomeResult<PosixHome> {
        let root = root.into();
        let fd = open_root(&cpath(&root)?)?;
        // SAFETY: statvfs is plain data; zeroed is a valid initial value.
        let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is an open descriptor and `vfs` a valid out-pointer for the duration of the call.
        let name_max = match unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut vfs) } {
            0 if vfs.f_namemax > 0 => vfs.f_namemax as usize,
            _ => 255,
        };
        let mount_point = is_mount_root(fd.as_raw_fd()).unwrap_or(false);
        let root_fd = RwLock::new(Arc::new(fd));
        Ok(PosixHome {
            root,
            root_fd,
            op_timeout,
            pool: op_timeout.map(|_| Pool::new()),
            limits: HomeLimits::posix(name_max),
            mount_point,
        })
    }

    /// The root descriptor in use now.
    fn root(&self) -> Arc<OwnedFd> {
        self.root_fd.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The root descriptor and the path relative to it (`.` for the root itself).
    fn at(&self, path: &Path) -> HomeResult<(Arc<OwnedFd>, CString)> {
        let rel = if path.as_os_str().is_empty() {
            CString::new(".").unwrap_or_default()
        } else {
            cpath(path)?
        };
        Ok((self.root(), rel))
    }

    /// Run `f` on the pool with the deadline, or inline when there is none.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> HomeResult<T> + Send + 'static) -> HomeResult<T> {
        let (Some(pool), Some(timeout)) = (&self.pool, self.op_timeout) else {
            return f();
        };
        let (tx, rx) = mpsc::sync_channel(1);
        pool.submit(Box::new(move || {
            let _ = tx.send(f());
        }));
        match rx.recv_timeout(timeout) {
            Ok(result) => result,
            Err(_) => Err(HomeError::TimedOut(timeout)),
        }
    }
}

/// Open the directory at `path` as a root descriptor (`O_PATH`: no read permission needed, nothing read).
fn open_root(path: &CStr) -> HomeResult<OwnedFd> {
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
fn is_mount_root(dir: RawFd) -> HomeResult<bool> {
    Ok(mount_id(dir, c"")? != mount_id(dir, c"..")?)
}

/// The (device, inode) of an open descriptor: which directory it is, across mounts.
fn identity(fd: RawFd) -> HomeResult<(u64, u64)> {
    // SAFETY: stat is plain data; zeroed is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the duration of the call; a bad `fd` is an error, not UB.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok((st.st_dev, st.st_ino))
}

fn cpath(path: &Path) -> HomeResult<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| HomeError::InvalidName("name contains NUL".into()))
}

fn last_error() -> HomeError {
    from_errno(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

fn check(ret: libc::c_int) -> HomeResult<()> {
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
fn posix_content_id(version: &Version) -> Option<ContentId> {
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

fn stat_at(dir: RawFd, path: &CStr) -> HomeResult<HomeAttr> {
    // SAFETY: stat is plain data; zeroed is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid out-pointer for the duration of the call.
    check(unsafe { libc::fstatat(dir, path.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(attr_of(&st))
}

fn stat_fd(file: &File) -> HomeResult<HomeAttr> {
    // SAFETY: stat is plain data; zeroed is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `file` is an open descriptor and `st` a valid out-pointer for the duration of the call.
    check(unsafe { libc::fstat(file.as_raw_fd(), &mut st) })?;
    Ok(attr_of(&st))
}

fn open_at(dir: RawFd, path: &CStr, flags: libc::c_int, mode: u32) -> HomeResult<File> {
    // SAFETY: `path` is NUL-terminated for the duration of the call.
    let fd = unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn chown_at(dir: RawFd, path: &CStr, owner: Owner) -> HomeResult<()> {
    if owner.uid.is_none() && owner.gid.is_none() {
        return Ok(());
    }
    let uid = owner.uid.unwrap_or(u32::MAX);
    let gid = owner.gid.unwrap_or(u32::MAX);
    // SAFETY: `path` is NUL-terminated for the duration of the call.
    check(unsafe { libc::fchownat(dir, path.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
}

fn timespec(t: Option<TimeSet>) -> libc::timespec {
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

fn kind_of_dtype(d_type: u8) -> Option<FileKind> {
    Some(match d_type {
        libc::DT_DIR => FileKind::Dir,
        libc::DT_LNK => FileKind::Symlink,
        libc::DT_FIFO => FileKind::Fifo,
        libc::DT_SOCK => FileKind::Socket,
        libc::DT_CHR => FileKind::CharDevice,
        libc::DT_BLK => FileKind::BlockDevice,
        libc::DT_REG => FileKind::File,
        _ => return None,
    })
}

/// Make `range` of `file` read as zeros: a punched hole where the file system can, written zeros where it
/// cannot.
fn zero_range(file: &File, range: Range<u64>, buf: &mut [u8]) -> HomeResult<()> {
    if range.is_empty() {
        return Ok(());
    }
    // SAFETY: fallocate on a valid open descriptor with plain integer arguments.
    let punched = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            range.start as libc::off_t,
            (range.end - range.start) as libc::off_t,
        )
    };
    if punched == 0 {
        return Ok(());
    }
    buf.fill(0);
    let mut pos = range.start;
    while pos < range.end {
        let n = ((range.end - pos) as usize).min(buf.len());
        file.write_all_at(&buf[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

fn list_at(dir: RawFd, path: &CStr) -> HomeResult<Vec<DirEntry>> {
    let file = open_at(dir, path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
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
        let (name, d_type) = unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()).to_owned(), (*ent).d_type) };
        let bytes = name.as_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let kind = match kind_of_dtype(d_type) {
            Some(k) => k,
            // SAFETY: `stream` is valid; dirfd gives its descriptor without transferring ownership.
            None => match stat_at(unsafe { libc::dirfd(stream) }, &name) {
                Ok(a) => a.kind,
                // Gone between readdir and the type lookup: skip it.
                Err(_) => continue,
            },
        };
        out.push(DirEntry {
            name: OsString::from_vec(bytes.to_vec()),
            kind,
            attr: None,
        });
    };
    // SAFETY: `stream` is valid and closed exactly once.
    unsafe { libc::closedir(stream) };
    result.map(|()| out)
}

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
        self.run(move || {
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
            let file = open_at(root.as_raw_fd(), &p, flags, mode & 0o7777)?;
            if owner.uid.is_some() || owner.gid.is_some() {
                let (uid, gid) = (owner.uid.unwrap_or(u32::MAX), owner.gid.unwrap_or(u32::MAX));
                // SAFETY: `file` is an open descriptor.
                check(unsafe { libc::fchown(file.as_raw_fd(), uid, gid) })?;
                // An owner change clears setuid/setgid; put the requested bits back.
                // SAFETY: `file` is an open descriptor.
                check(unsafe { libc::fchmod(file.as_raw_fd(), mode & 0o7777) })?;
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
        self.run(move || {
            let file = open_at(root.as_raw_fd(), &p, libc::O_WRONLY | libc::O_NOFOLLOW, 0)?;
            let current = stat_fd(&file)?;
            if let Some(base) = base
                && current.version != base
            {
                return Err(HomeError::Conflict);
            }
            // Cut first: nothing past the new end is copied or zeroed.
            let mut home_end = current.size;
            if size < home_end {
                file.set_len(size)?;
                home_end = size;
            }
            let mut buf = vec![0u8; COPY_CHUNK];
            for range in ranges {
                let range = range.start..range.end.min(size);
                // Holes in the cache copy stay holes at home: only its data is sent, and where home had
                // bytes under a hole they are zeroed.
                let mut pos = range.start;
                for extent in data_extents(&source, range.clone())? {
                    zero_range(&file, pos..extent.start.min(home_end), &mut buf)?;
                    pos = extent.start;
                    while pos < extent.end {
                        let want = ((extent.end - pos) as usize).min(COPY_CHUNK);
                        let got = source.read_at(&mut buf[..want], pos)?;
                        if got == 0 {
                            // The cache copy is shorter than it was: the rest is a hole.
                            break;
                        }
                        file.write_all_at(&buf[..got], pos)?;
                        pos += got as u64;
                    }
                }
                zero_range(&file, pos..range.end.min(home_end), &mut buf)?;
            }
            if stat_fd(&file)?.size != size {
                file.set_len(size)?;
            }
            if let Some(t) = mtime {
                // The time the mount shows is the time home ends with, not the time of the push.
                let times = [timespec(None), timespec(Some(TimeSet::At(t)))];
                // SAFETY: a valid open descriptor and two timespecs, as futimens requires.
                check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) })?;
            }
            file.sync_all()?;
            stat_fd(&file)
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_id_is_inode_size_and_mtime() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello").unwrap();
        let home = PosixHome::new(dir.path(), None).unwrap();
        let attr = home.stat(Path::new("f")).unwrap();
        let meta = std::fs::metadata(dir.path().join("f")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            home.content_id(Path::new("f"), &attr.version),
            ContentId::Inode {
                ino: meta.ino(),
                size: 5,
                mtime_s: meta.mtime(),
                mtime_ns: meta.mtime_nsec() as u32,
            }
        );
        // Through a layer, and under another name (a rename keeps the content's identity).
        let layered = crate::Layered::new(Arc::new(home), crate::MetricsLayer(Default::default()));
        assert_eq!(
            layered.content_id(Path::new("g"), &attr.version),
            layered.content_id(Path::new("f"), &attr.version)
        );
        // A version of another form is named by path and version.
        let odd = Version("\"etag\"".into());
        assert_eq!(
            layered.content_id(Path::new("f"), &odd),
            ContentId::named(Path::new("f"), &odd)
        );
    }

    #[test]
    fn read_detects_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello world").unwrap();
        let home = PosixHome::new(dir.path(), Some(Duration::from_secs(5))).unwrap();
        let attr = home.stat(Path::new("f")).unwrap();
        assert_eq!(attr.kind, FileKind::File);
        assert_eq!(home.read(Path::new("f"), &attr.version, 6, 100).unwrap(), b"world");
        std::fs::write(dir.path().join("g"), b"HELLO WORLD!").unwrap();
        std::fs::rename(dir.path().join("g"), dir.path().join("f")).unwrap();
        assert!(matches!(
            home.read(Path::new("f"), &attr.version, 0, 5),
            Err(HomeError::Stale)
        ));
    }

    #[test]
    fn write_pushes_ranges_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let home = PosixHome::new(dir.path(), None).unwrap();
        let attr = home.create(Path::new("f"), 0o644, Owner::default()).unwrap();
        assert_eq!(attr.size, 0);
        let src_path = dir.path().join("src");
        std::fs::write(&src_path, b"0123456789").unwrap();
        let src = File::open(&src_path).unwrap();
        let after = home
            .write(Path::new("f"), &src, &[2..5, 8..10], 12, Some(&attr.version), None)
            .unwrap();
        assert_eq!(after.size, 12);
        assert_eq!(
            std::fs::read(dir.path().join("f")).unwrap(),
            b"\x00\x00234\x00\x00\x0089\x00\x00"
        );
        // A write based on the old version is a conflict now.
        assert!(matches!(
            home.write(
                Path::new("f"),
                &src,
                std::slice::from_ref(&(0..1)),
                12,
                Some(&attr.version),
                None
            ),
            Err(HomeError::Conflict)
        ));
    }

    #[test]
    fn reconnect_follows_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("f"), b"old").unwrap();
        let home = PosixHome::new(&root, Some(Duration::from_secs(5))).unwrap();
        assert!(!home.reconnect().unwrap(), "nothing changed");
        std::fs::rename(&root, dir.path().join("was")).unwrap();
        // The path names nothing: home is unreachable.
        assert!(matches!(home.reconnect(), Err(HomeError::Unavailable(_))));
        // Another directory at the path: home is that one from now on.
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("g"), b"new!").unwrap();
        assert!(home.reconnect().unwrap(), "a new directory at the path is reopened");
        assert!(matches!(home.stat(Path::new("f")), Err(HomeError::NotFound)));
        assert_eq!(home.stat(Path::new("g")).unwrap().size, 4);
        assert!(!home.reconnect().unwrap());
    }

    #[test]
    fn errors_are_classified() {
        let dir = tempfile::tempdir().unwrap();
        let home = PosixHome::new(dir.path(), None).unwrap();
        assert!(matches!(home.stat(Path::new("missing")), Err(HomeError::NotFound)));
        home.mkdir(Path::new("d"), 0o755, Owner::default()).unwrap();
        home.create(Path::new("d/f"), 0o644, Owner::default()).unwrap();
        assert!(matches!(home.rmdir(Path::new("d")), Err(HomeError::NotEmpty)));
        assert!(matches!(
            home.mkdir(Path::new("d"), 0o755, Owner::default()),
            Err(HomeError::Exists)
        ));
        let names: Vec<_> = home.list(Path::new("d")).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, vec![OsString::from("f")]);
    }
}
