//! A home that is a directory: local, or an NFS/GlusterFS/Lustre mount that may be slow or hang.
//!
//! Each call runs on a small worker pool and is awaited with a deadline (`op_timeout`), so a home whose
//! server has gone away gives [`HomeError::TimedOut`] (EIO at the mount) instead of a hung caller. A
//! worker stuck in the kernel stays stuck; the pool grows up to `MAX_WORKERS` and then calls time out
//! while queued.

use std::ffi::{CString, OsString};
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::from_errno;
use crate::{
    DirEntry, FileKind, Home, HomeAttr, HomeError, HomeResult, Owner, RenameFlags, SetAttr, StatFs, TimeSet, Version,
};

const MAX_WORKERS: usize = 64;
const COPY_CHUNK: usize = 1 << 20;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A POSIX directory as home.
pub struct PosixHome {
    root: PathBuf,
    op_timeout: Option<Duration>,
    pool: Option<Pool>,
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
    pub fn new(root: impl Into<PathBuf>, op_timeout: Option<Duration>) -> PosixHome {
        PosixHome {
            root: root.into(),
            op_timeout,
            pool: op_timeout.map(|_| Pool::new()),
        }
    }

    fn full(&self, path: &Path) -> PathBuf {
        if path.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(path)
        }
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

fn cpath(path: &Path) -> HomeResult<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| HomeError::InvalidName("name contains NUL".into()))
}

fn check(ret: libc::c_int) -> HomeResult<()> {
    if ret < 0 {
        Err(from_errno(
            io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO),
        ))
    } else {
        Ok(())
    }
}

fn time_of(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

/// Attributes from `lstat`/`fstat` metadata. The content version is (inode, size, mtime): a chmod or chown
/// keeps cached data, any content change or replacement does not.
pub(crate) fn attr_of(m: &std::fs::Metadata) -> HomeAttr {
    let kind = FileKind::from_mode(m.mode());
    HomeAttr {
        kind,
        size: m.size(),
        perm: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        nlink: m.nlink() as u32,
        rdev: m.rdev(),
        blocks: m.blocks(),
        atime: time_of(m.atime(), m.atime_nsec()),
        mtime: time_of(m.mtime(), m.mtime_nsec()),
        ctime: time_of(m.ctime(), m.ctime_nsec()),
        version: Version(format!("{}:{}:{}.{:09}", m.ino(), m.size(), m.mtime(), m.mtime_nsec())),
    }
}

fn lstat(path: &Path) -> HomeResult<HomeAttr> {
    Ok(attr_of(&std::fs::symlink_metadata(path)?))
}

fn apply_owner(path: &Path, owner: Owner) -> HomeResult<()> {
    if owner.uid.is_none() && owner.gid.is_none() {
        return Ok(());
    }
    let c = cpath(path)?;
    let uid = owner.uid.unwrap_or(u32::MAX);
    let gid = owner.gid.unwrap_or(u32::MAX);
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    check(unsafe { libc::lchown(c.as_ptr(), uid, gid) })
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

impl Home for PosixHome {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn stat(&self, path: &Path) -> HomeResult<HomeAttr> {
        let p = self.full(path);
        self.run(move || lstat(&p))
    }

    fn list(&self, path: &Path) -> HomeResult<Vec<DirEntry>> {
        let p = self.full(path);
        self.run(move || {
            let mut out = Vec::new();
            for entry in std::fs::read_dir(&p)? {
                let entry = entry?;
                let kind = match entry.file_type() {
                    Ok(t) => {
                        use std::os::unix::fs::FileTypeExt;
                        if t.is_dir() {
                            FileKind::Dir
                        } else if t.is_symlink() {
                            FileKind::Symlink
                        } else if t.is_fifo() {
                            FileKind::Fifo
                        } else if t.is_socket() {
                            FileKind::Socket
                        } else if t.is_char_device() {
                            FileKind::CharDevice
                        } else if t.is_block_device() {
                            FileKind::BlockDevice
                        } else {
                            FileKind::File
                        }
                    }
                    // Gone between readdir and the type lookup: skip it.
                    Err(_) => continue,
                };
                out.push(DirEntry {
                    name: entry.file_name(),
                    kind,
                    attr: None,
                });
            }
            Ok(out)
        })
    }

    fn read(&self, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>> {
        let p = self.full(path);
        let version = version.clone();
        self.run(move || {
            let file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&p)?;
            if attr_of(&file.metadata()?).version != version {
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
            if attr_of(&file.metadata()?).version != version {
                return Err(HomeError::Stale);
            }
            Ok(buf)
        })
    }

    fn readlink(&self, path: &Path) -> HomeResult<Vec<u8>> {
        let p = self.full(path);
        self.run(move || Ok(std::fs::read_link(&p)?.into_os_string().into_vec()))
    }

    fn create(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        let p = self.full(path);
        self.run(move || {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode & 0o7777)
                .open(&p)?;
            apply_owner(&p, owner)?;
            // Owner changes clear setuid/setgid; put the requested bits back.
            if owner.uid.is_some() || owner.gid.is_some() {
                std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))?;
            }
            Ok(attr_of(&file.metadata()?))
        })
    }

    fn mkdir(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        let p = self.full(path);
        self.run(move || {
            let c = cpath(&p)?;
            // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
            check(unsafe { libc::mkdir(c.as_ptr(), (mode & 0o7777) as libc::mode_t) })?;
            apply_owner(&p, owner)?;
            lstat(&p)
        })
    }

    fn mknod(&self, path: &Path, mode: u32, rdev: u64, owner: Owner) -> HomeResult<HomeAttr> {
        let p = self.full(path);
        self.run(move || {
            let c = cpath(&p)?;
            // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
            check(unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })?;
            apply_owner(&p, owner)?;
            lstat(&p)
        })
    }

    fn symlink(&self, target: &[u8], path: &Path, owner: Owner) -> HomeResult<HomeAttr> {
        let p = self.full(path);
        let target = OsString::from_vec(target.to_vec());
        self.run(move || {
            std::os::unix::fs::symlink(&target, &p)?;
            apply_owner(&p, owner)?;
            lstat(&p)
        })
    }

    fn link(&self, existing: &Path, new: &Path) -> HomeResult<HomeAttr> {
        let (from, to) = (self.full(existing), self.full(new));
        self.run(move || {
            std::fs::hard_link(&from, &to)?;
            lstat(&to)
        })
    }

    fn unlink(&self, path: &Path) -> HomeResult<()> {
        let p = self.full(path);
        self.run(move || Ok(std::fs::remove_file(&p)?))
    }

    fn rmdir(&self, path: &Path) -> HomeResult<()> {
        let p = self.full(path);
        self.run(move || Ok(std::fs::remove_dir(&p)?))
    }

    fn rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()> {
        let (from, to) = (self.full(from), self.full(to));
        self.run(move || {
            let (cf, ct) = (cpath(&from)?, cpath(&to)?);
            let mut raw = 0;
            if flags.no_replace {
                raw |= libc::RENAME_NOREPLACE;
            }
            if flags.exchange {
                raw |= libc::RENAME_EXCHANGE;
            }
            // SAFETY: both paths are valid NUL-terminated strings for the duration of the call.
            check(unsafe { libc::renameat2(libc::AT_FDCWD, cf.as_ptr(), libc::AT_FDCWD, ct.as_ptr(), raw) })
        })
    }

    fn setattr(&self, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr> {
        let p = self.full(path);
        let changes = changes.clone();
        self.run(move || {
            let c = cpath(&p)?;
            if changes.uid.is_some() || changes.gid.is_some() {
                apply_owner(
                    &p,
                    Owner {
                        uid: changes.uid,
                        gid: changes.gid,
                    },
                )?;
            }
            if let Some(perm) = changes.perm {
                // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
                check(unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), perm & 0o7777, 0) })?;
            }
            if let Some(size) = changes.size {
                // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
                check(unsafe { libc::truncate(c.as_ptr(), size as libc::off_t) })?;
            }
            if changes.atime.is_some() || changes.mtime.is_some() {
                let times = [timespec(changes.atime), timespec(changes.mtime)];
                // SAFETY: `c` is a valid path and `times` an array of two timespecs, as utimensat requires.
                check(unsafe {
                    libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW)
                })?;
            }
            lstat(&p)
        })
    }

    fn write(
        &self,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
    ) -> HomeResult<HomeAttr> {
        let p = self.full(path);
        let source = source.try_clone()?;
        let ranges = ranges.to_vec();
        let base = base.cloned();
        self.run(move || {
            let file = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(&p)?;
            if let Some(base) = base
                && attr_of(&file.metadata()?).version != base
            {
                return Err(HomeError::Conflict);
            }
            let mut buf = vec![0u8; COPY_CHUNK];
            for range in ranges {
                let mut pos = range.start;
                let end = range.end.min(size);
                while pos < end {
                    let want = ((end - pos) as usize).min(COPY_CHUNK);
                    let got = source.read_at(&mut buf[..want], pos)?;
                    if got == 0 {
                        // The cache copy is shorter than the range: the rest is a hole.
                        break;
                    }
                    file.write_all_at(&buf[..got], pos)?;
                    pos += got as u64;
                }
            }
            if file.metadata()?.size() != size {
                file.set_len(size)?;
            }
            file.sync_all()?;
            Ok(attr_of(&file.metadata()?))
        })
    }

    fn statfs(&self) -> HomeResult<StatFs> {
        let p = self.root.clone();
        self.run(move || {
            let c = cpath(&p)?;
            // SAFETY: statvfs is plain data; zeroed is a valid initial value.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: `c` is a valid path and `s` a valid out-pointer for the duration of the call.
            check(unsafe { libc::statvfs(c.as_ptr(), &mut s) })?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_detects_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello world").unwrap();
        let home = PosixHome::new(dir.path(), Some(Duration::from_secs(5)));
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
        let home = PosixHome::new(dir.path(), None);
        let attr = home.create(Path::new("f"), 0o644, Owner::default()).unwrap();
        assert_eq!(attr.size, 0);
        let src_path = dir.path().join("src");
        std::fs::write(&src_path, b"0123456789").unwrap();
        let src = File::open(&src_path).unwrap();
        let after = home
            .write(Path::new("f"), &src, &[2..5, 8..10], 12, Some(&attr.version))
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
                Some(&attr.version)
            ),
            Err(HomeError::Conflict)
        ));
    }

    #[test]
    fn errors_are_classified() {
        let dir = tempfile::tempdir().unwrap();
        let home = PosixHome::new(dir.path(), None);
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
