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
//!
//! [`Home::reconnect`]: crate::Home::reconnect
//! [`HomeError::TimedOut`]: crate::HomeError::TimedOut

mod home;
mod pool;
mod sys;
#[cfg(test)]
mod tests;
mod write;
mod xattr;

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use self::pool::Pool;
use self::sys::{cpath, is_mount_root, open_root};
use crate::{HomeLimits, HomeResult};

/// A POSIX directory as home.
pub struct PosixHome {
    root: PathBuf,
    /// The root directory as last opened; replaced by [`Home::reconnect`](crate::Home::reconnect).
    root_fd: RwLock<Arc<OwnedFd>>,
    op_timeout: Option<Duration>,
    pool: Option<Pool>,
    /// Read once at start: the root's file system does not change under a home.
    limits: HomeLimits,
    /// The home was a mount point when opened (an NFS, FUSE or bind mount of its own). While its mount is
    /// away (a dead mount cleared, not yet mounted again), the path names the empty directory beneath:
    /// that is not the home, and reconnecting to it would push changes where nobody sees them.
    mount_point: bool,
    /// The room one object has for extended attributes, measured at the first check (`xattr.rs`).
    xattr_room: std::sync::OnceLock<Option<usize>>,
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
            xattr_room: std::sync::OnceLock::new(),
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
}
