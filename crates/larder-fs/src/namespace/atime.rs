//! Access times: a read through the mount moves a file's atime as the mount's atime option says, as on a
//! local file system. The kernel leaves a FUSE file's atime to the daemon (its inodes are `S_NOATIME`), so
//! larder moves it: at each read it serves, at each open for reading (the reads that follow may never
//! reach it: the kernel serves them from the cache file through passthrough, or from its page cache), and
//! at each listing of a directory from its start. So an open that reads nothing moves it too, where a
//! local file system would not.
//!
//! The new atime is the mount's alone: kept in memory and in the inode's record in the index, never sent
//! to home (a read is not a change to push, and home's own clock moves home's atime when larder reads it).
//! It is kept while home's version of the file is the one the cache knows, and replaced by home's when
//! another version comes (`binding.rs`, `keep_own_times`).

use std::time::{Duration, SystemTime};

use super::*;

/// When a read moves the access time (`mount -o relatime|strictatime|noatime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AtimePolicy {
    /// Linux's default: only when the access time is not after the last change or modification, or is a
    /// day old.
    #[default]
    Relative,
    /// At every read.
    Strict,
    /// Never.
    Never,
}

/// The mount's atime options: the policy, and whether directories follow it (`nodiratime`: never).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Atime {
    pub policy: AtimePolicy,
    pub no_dirs: bool,
}

impl Atime {
    /// The option names, as `/proc/mounts` and mount(8) spell them.
    pub fn describe(&self) -> String {
        let policy = match self.policy {
            AtimePolicy::Relative => "relatime",
            AtimePolicy::Strict => "strictatime",
            AtimePolicy::Never => "noatime",
        };
        if self.no_dirs && self.policy != AtimePolicy::Never {
            format!("{policy},nodiratime")
        } else {
            policy.to_string()
        }
    }

    /// Whether a read at `now` moves an access time of `attr` (a directory's, with `dir`).
    fn due(&self, attr: &HomeAttr, dir: bool, now: SystemTime) -> bool {
        if dir && self.no_dirs {
            return false;
        }
        match self.policy {
            AtimePolicy::Never => false,
            AtimePolicy::Strict => attr.atime != now,
            AtimePolicy::Relative => {
                attr.atime <= attr.mtime
                    || attr.atime <= attr.ctime
                    || now.duration_since(attr.atime).unwrap_or_default() >= Duration::from_secs(24 * 3600)
            }
        }
    }
}

impl Names {
    /// `ino` was read through the mount: its access time moves to now if the mount's atime option says so.
    /// The check shares the namespace; only a move takes it alone, and only if it is free at once. Whether
    /// it moved, or would have but the namespace was busy (the caller tells the kernel to ask again).
    pub(crate) fn accessed(&self, ino: u64) -> bool {
        let atime = self.cfg.atime;
        if atime.policy == AtimePolicy::Never || self.read_only() {
            return false;
        }
        let now = SystemTime::now();
        let due = |ns: &Namespace| {
            ns.inodes
                .get(&ino)
                .and_then(|n| n.attr.as_ref().map(|a| atime.due(a, n.kind == FileKind::Dir, now)))
                .unwrap_or(false)
        };
        if !due(&read(&self.ns)) {
            return false;
        }
        // Never waited for: hits share the namespace and wait for nothing (design note 011), and a read
        // must not wait behind them. Busy, the move is left to the next read (atime is a hint).
        let mut ns = match self.ns.try_write() {
            Ok(ns) => ns,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // Busy: not moved now; the kernel is still told to ask again (what it holds may be older
            // than what the daemon would answer, as after a move).
            Err(std::sync::TryLockError::WouldBlock) => return true,
        };
        if !due(&ns) {
            return false;
        }
        if let Some(a) = ns.inodes.get_mut(&ino).and_then(|n| n.attr.as_mut()) {
            a.atime = now;
        }
        self.persist(&ns, ino);
        true
    }
}
