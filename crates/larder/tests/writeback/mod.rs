//! What the write-back mount tests (`writeback_*.rs`) share: a snapshot of a tree (content, permission
//! bits, symlink targets) and how it differs from another, close(2) with its result, write-back mounts and
//! their queue, a daemon killed and mounted again, and a watchdog that kills a hung daemon.

// Each test binary that includes this module uses a subset of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::IntoRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::*;

/// One object of a tree: what a snapshot of a directory or a model of the changes holds per path.
#[derive(Clone, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: PathBuf },
}

/// Relative path ('/'-separated, no leading slash) -> object; the root itself is not in it.
pub type Tree = BTreeMap<String, Node>;

pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

pub fn describe(n: &Node) -> String {
    match n {
        Node::Dir { mode } => format!("dir mode {mode:o}"),
        Node::File { data, mode } => format!("file of {} bytes (fnv {:016x}) mode {mode:o}", data.len(), fnv(data)),
        Node::Symlink { target } => format!("symlink -> {}", target.display()),
    }
}

/// Every object under `root` with its content, permission bits and symlink target.
pub fn snapshot(root: &Path) -> Tree {
    walk(root)
        .into_iter()
        .map(|(rel, m)| {
            let p = root.join(&rel);
            let mode = m.mode() & 0o7777;
            let node = if m.is_dir() {
                Node::Dir { mode }
            } else if m.file_type().is_symlink() {
                Node::Symlink {
                    target: std::fs::read_link(&p).unwrap_or_else(|e| panic!("readlink {}: {e}", p.display())),
                }
            } else {
                Node::File { data: read(&p), mode }
            };
            (rel.to_string_lossy().into_owned(), node)
        })
        .collect()
}

/// The differences between `got` and `want`, one line each.
pub fn diff_trees(got: &Tree, want: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = got.keys().chain(want.keys()).collect();
    for k in keys {
        match (got.get(k), want.get(k)) {
            (None, Some(w)) => out.push(format!("missing   {k}: want {}", describe(w))),
            (Some(g), None) => out.push(format!("unexpected {k}: {}", describe(g))),
            (Some(g), Some(w)) if g != w => {
                let mut line = format!("differs   {k}: got {}, want {}", describe(g), describe(w));
                if let (Node::File { data: gd, .. }, Node::File { data: wd, .. }) = (g, w)
                    && gd != wd
                {
                    let first = gd.iter().zip(wd).position(|(a, b)| a != b);
                    line += &format!(" (first differing offset {})", first.unwrap_or(gd.len().min(wd.len())));
                }
                out.push(line);
            }
            _ => {}
        }
    }
    out
}

/// This process's umask (from /proc, without changing it).
pub fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// close(2) with its result (dropping a `File` ignores what close returns, and close sends FLUSH).
pub fn close(f: File) -> std::io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was owned by `f` and is closed exactly once.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Create or truncate `path`, write `data` and close, failing the test on any error (close included).
#[track_caller]
pub fn put(path: &Path, data: &[u8]) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    close(f).unwrap_or_else(|e| panic!("close {}: {e}", path.display()));
}

/// Mount `t` in write-back mode with `extra` options.
pub fn wb_mount(t: &TestDir, extra: &[&str]) -> Mount {
    let mut args = vec!["--write-mode", "write-back"];
    args.extend_from_slice(extra);
    t.mount(&args)
}

/// The number of changes queued for home.
pub fn pending(m: &Mount) -> u64 {
    num(&m.status(), "/journal/pending_ops")
}

/// Lazily unmount whatever is at `mnt`.
pub fn lazy_umount(mnt: &Path) {
    let c = std::ffi::CString::new(s(mnt)).expect("path");
    // SAFETY: a valid NUL-terminated path.
    unsafe {
        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
    }
}

/// SIGKILL the daemon of `old`, then mount the same home, mount point and cache dir again with `extra`.
pub fn kill_and_remount(t: &TestDir, old: Mount, extra: &[&str]) -> Mount {
    signal(old.pid, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(old.pid)),
        "daemon {} survived SIGKILL",
        old.pid
    );
    let mut args = vec!["--write-mode", "write-back"];
    args.extend_from_slice(extra);
    let m = match Mount::try_new(&t.home, &t.mnt, &t.cache, &args) {
        Ok(m) => m,
        Err(out) => {
            eprintln!("mounting over the dead mount failed ({out}); lazily unmounting it and retrying");
            lazy_umount(&t.mnt);
            Mount::new(&t.home, &t.mnt, &t.cache, &args)
        }
    };
    old.disarm();
    m
}

/// Kills the daemon whose pid it was last given (every 2 s) once a test runs longer than its budget, so a
/// hung FUSE call fails (ENOTCONN) instead of hanging the suite.
pub struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    pid: Arc<AtomicI32>,
}

impl Watchdog {
    pub fn new(limit: Duration, what: &'static str) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let pid = Arc::new(AtomicI32::new(0));
        let p = pid.clone();
        std::thread::spawn(move || {
            if rx.recv_timeout(limit) != Err(mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            eprintln!("watchdog: {what} ran longer than {limit:?}; killing its daemon");
            loop {
                let pid = p.load(Ordering::SeqCst);
                if pid > 0 && is_larder_daemon(pid) {
                    // SAFETY: kill has no memory preconditions; the pid is a larder daemon of this test.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
                if rx.recv_timeout(Duration::from_secs(2)) != Err(mpsc::RecvTimeoutError::Timeout) {
                    return;
                }
            }
        });
        Watchdog { stop: Some(tx), pid }
    }

    pub fn watch(&self, m: &Mount) {
        self.pid.store(m.pid, Ordering::SeqCst);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Move `from` and everything under it to `to` in `tree` (a rename).
pub fn move_subtree(tree: &mut Tree, from: &str, to: &str) {
    let prefix = format!("{from}/");
    let keys: Vec<String> = tree
        .keys()
        .filter(|k| *k == from || k.starts_with(&prefix))
        .cloned()
        .collect();
    for k in keys {
        let node = tree.remove(&k).expect("key just listed");
        tree.insert(format!("{to}{}", &k[from.len()..]), node);
    }
}
