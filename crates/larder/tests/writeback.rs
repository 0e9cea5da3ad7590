//! Integration tests of the write-back journal through real FUSE mounts: run as root with /dev/fuse.
//!
//! Every mount here passes `--write-mode write-back` (the harness defaults to write-through). Changes
//! return once they are durable in the cache dir and reach home after `--sync-lag` or `larder drain`; the
//! tests compare the plain home directory with what the mount showed or with a model of the changes.

mod common;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::IntoRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// One object of a tree: what a snapshot of a directory or a model of the changes holds per path.
#[derive(Clone, PartialEq, Eq)]
enum Node {
    Dir { mode: u32 },
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: PathBuf },
}

/// Relative path ('/'-separated, no leading slash) -> object; the root itself is not in it.
type Tree = BTreeMap<String, Node>;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

fn describe(n: &Node) -> String {
    match n {
        Node::Dir { mode } => format!("dir mode {mode:o}"),
        Node::File { data, mode } => format!("file of {} bytes (fnv {:016x}) mode {mode:o}", data.len(), fnv(data)),
        Node::Symlink { target } => format!("symlink -> {}", target.display()),
    }
}

/// Every object under `root` with its content, permission bits and symlink target.
fn snapshot(root: &Path) -> Tree {
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
fn diff_trees(got: &Tree, want: &Tree) -> Vec<String> {
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

/// Fail with the list of differences when the tree at `root` is not `want`.
#[track_caller]
fn assert_tree(root: &Path, want: &Tree, what: &str) {
    let got = snapshot(root);
    let diffs = diff_trees(&got, want);
    if !diffs.is_empty() {
        let shown: Vec<&String> = diffs.iter().take(60).collect();
        panic!(
            "{what}: {} differences between {} and the expected tree:\n{}",
            diffs.len(),
            root.display(),
            shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        );
    }
}

/// This process's umask (from /proc, without changing it).
fn umask() -> u32 {
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
fn close(f: File) -> std::io::Result<()> {
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
fn put(path: &Path, data: &[u8]) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    close(f).unwrap_or_else(|e| panic!("close {}: {e}", path.display()));
}

/// Mount `t` in write-back mode with `extra` options.
fn wb_mount(t: &TestDir, extra: &[&str]) -> Mount {
    let mut args = vec!["--write-mode", "write-back"];
    args.extend_from_slice(extra);
    t.mount(&args)
}

/// The number of changes queued for home.
fn pending(m: &Mount) -> u64 {
    num(&m.status(), "/journal/pending_ops")
}

/// Lazily unmount whatever is at `mnt`.
fn lazy_umount(mnt: &Path) {
    let c = std::ffi::CString::new(s(mnt)).expect("path");
    // SAFETY: a valid NUL-terminated path.
    unsafe {
        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
    }
}

/// With `LARDER_TEST_KEEP=DIR` set, copy the home and cache dir of `t` under DIR (for a failure that is hard
/// to reproduce); returns where, for the failure message.
fn keep_evidence(t: &TestDir, live: Option<&Mount>) -> String {
    let Some(dir) = std::env::var_os("LARDER_TEST_KEEP") else {
        return "(set LARDER_TEST_KEEP=DIR to keep the home and cache dir of a failure)".into();
    };
    // A daemon still running would go on changing both while they are copied: what is kept is the state
    // it crashed in.
    if let Some(m) = live
        && is_larder_daemon(m.pid)
    {
        signal(m.pid, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(300));
    }
    let dest = PathBuf::from(dir).join(t.root().file_name().expect("temp dir name"));
    let _ = std::fs::create_dir_all(&dest);
    for src in [&t.home, &t.cache] {
        let _ = std::process::Command::new("cp").arg("-a").arg(src).arg(&dest).status();
    }
    format!("home and cache dir kept in {}", dest.display())
}

/// SIGKILL the daemon of `old`, then mount the same home, mount point and cache dir again with `extra`.
fn kill_and_remount(t: &TestDir, old: Mount, extra: &[&str]) -> Mount {
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
struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    pid: Arc<AtomicI32>,
}

impl Watchdog {
    fn new(limit: Duration, what: &'static str) -> Watchdog {
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

    fn watch(&self, m: &Mount) {
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

/// `parent/name`, or `name` at the root.
fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// Move `from` and everything under it to `to` in `tree` (a rename).
fn move_subtree(tree: &mut Tree, from: &str, to: &str) {
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

/// The home operations that change something, by kind.
const MUTATING: [&str; 10] = [
    "create", "mkdir", "mknod", "symlink", "link", "unlink", "rmdir", "rename", "setattr", "write",
];

fn mutating_ops(v: &serde_json::Value) -> BTreeMap<&'static str, u64> {
    MUTATING
        .iter()
        .map(|k| (*k, num(v, &format!("/home/ops_by_kind/{k}"))))
        .collect()
}

/// The permission bits of `rel` in `tree`.
fn home_mode(tree: &Tree, rel: &str) -> u32 {
    match &tree[rel] {
        Node::File { mode, .. } | Node::Dir { mode } => *mode,
        Node::Symlink { .. } => 0o777,
    }
}

// 1 ------------------------------------------------------------------------------------------------------

#[test]
fn write_back_returns_before_home_and_drain_pushes() {
    let t = TestDir::new("wb-drain");
    let dog = Watchdog::new(
        Duration::from_secs(120),
        "write_back_returns_before_home_and_drain_pushes",
    );
    let mut rng = Rng::new(101);
    let existing = write_random(&t.home.join("existing.bin"), 50_000, &mut rng);
    let inner = write_random(&t.home.join("olddir/inner.txt"), 700, &mut rng);
    let home_before = snapshot(&t.home);

    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    let st = m.status();
    assert_eq!(st["write_mode"], "write-back", "status: {st}");

    let started = Instant::now();
    std::fs::create_dir_all(m.path("d1/d2")).unwrap();
    std::fs::create_dir(m.path("empty-dir")).unwrap();
    let a = rng.bytes(100_000);
    put(&m.path("d1/a.bin"), &a);
    put(&m.path("d1/d2/b.bin"), b"bbb");
    put(&m.path("top.txt"), b"top of the tree\n");
    {
        let f = OpenOptions::new().write(true).open(m.path("existing.bin")).unwrap();
        f.write_all_at(b"PATCHED", 1000).unwrap();
        f.write_all_at(b"appended at the end", existing.len() as u64).unwrap();
        f.sync_all().unwrap();
        close(f).unwrap();
    }
    std::fs::rename(m.path("d1/a.bin"), m.path("d1/d2/a-renamed.bin")).unwrap();
    std::fs::rename(m.path("olddir"), m.path("newdir")).unwrap();
    std::fs::set_permissions(m.path("top.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(m.path("d1/d2/b.bin"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(m.path("d1/d2"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink("d2/b.bin", m.path("d1/link-to-b")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", m.path("dangling")).unwrap();
    std::fs::hard_link(m.path("top.txt"), m.path("d1/top-hard.txt")).unwrap();
    eprintln!("changes made in {:?}", started.elapsed());

    // Every call returned, none of it is at home yet.
    let home_now = snapshot(&t.home);
    let early = diff_trees(&home_now, &home_before);
    assert!(
        early.is_empty(),
        "home changed before the 60 s sync lag and before any drain:\n{}",
        early.join("\n")
    );
    let st = m.status();
    let queued = num(&st, "/journal/pending_ops");
    assert!(
        queued > 0,
        "no pending ops after changes in write-back: {}",
        st["journal"]
    );
    eprintln!("journal after the changes: {}", st["journal"]);

    // A plain unmount is refused while changes wait, and says how to go on.
    let out = larder(&["unmount", s(&m.mnt)]);
    assert!(!out.success(), "larder unmount with pending changes succeeded:\n{out}");
    assert!(
        format!("{}{}", out.stdout, out.stderr).contains("--drain"),
        "the refusal does not mention --drain:\n{out}"
    );
    assert!(is_mounted(&m.mnt), "the refused unmount unmounted anyway");
    assert!(alive(m.pid), "the daemon exited after a refused unmount");

    drain_ok(&m, 60);
    let st = m.status();
    assert_eq!(
        num(&st, "/journal/pending_ops"),
        0,
        "pending ops after drain: {}",
        st["journal"]
    );
    assert_eq!(
        num(&st, "/journal/failed_ops"),
        0,
        "failed ops after drain: {}",
        st["journal"]
    );

    // Home is what the mount shows; and what the mount shows is what was done.
    let mount_tree = snapshot(&m.mnt);
    assert_tree(&t.home, &mount_tree, "home after drain vs the mount");
    let mut want_existing = existing.clone();
    want_existing[1000..1007].copy_from_slice(b"PATCHED");
    want_existing.extend_from_slice(b"appended at the end");
    let file_mode = 0o666 & !umask();
    let dir_mode = 0o777 & !umask();
    let expect: Tree = [
        ("d1", Node::Dir { mode: dir_mode }),
        ("d1/d2", Node::Dir { mode: 0o700 }),
        (
            "d1/d2/a-renamed.bin",
            Node::File {
                data: a.clone(),
                mode: file_mode,
            },
        ),
        (
            "d1/d2/b.bin",
            Node::File {
                data: b"bbb".to_vec(),
                mode: 0o755,
            },
        ),
        (
            "d1/link-to-b",
            Node::Symlink {
                target: PathBuf::from("d2/b.bin"),
            },
        ),
        (
            "d1/top-hard.txt",
            Node::File {
                data: b"top of the tree\n".to_vec(),
                mode: 0o600,
            },
        ),
        (
            "dangling",
            Node::Symlink {
                target: PathBuf::from("/nonexistent/target"),
            },
        ),
        ("empty-dir", Node::Dir { mode: dir_mode }),
        (
            "existing.bin",
            Node::File {
                data: want_existing,
                mode: home_mode(&home_before, "existing.bin"),
            },
        ),
        ("newdir", home_before["olddir"].clone()),
        (
            "newdir/inner.txt",
            Node::File {
                data: inner,
                mode: home_mode(&home_before, "olddir/inner.txt"),
            },
        ),
        (
            "top.txt",
            Node::File {
                data: b"top of the tree\n".to_vec(),
                mode: 0o600,
            },
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_tree(&t.home, &expect, "home after drain vs the changes made");
    let (h1, h2) = (
        std::fs::metadata(t.home.join("top.txt")).unwrap(),
        std::fs::metadata(t.home.join("d1/top-hard.txt")).unwrap(),
    );
    assert_eq!(
        (h1.ino(), h1.nlink()),
        (h2.ino(), 2),
        "the hard link reached home as a copy, not a link"
    );
    m.unmount();
}

// 2 ------------------------------------------------------------------------------------------------------

#[test]
fn ordering_deep_tree_renamed_and_partly_removed() {
    let t = TestDir::new("wb-order");
    let dog = Watchdog::new(
        Duration::from_secs(120),
        "ordering_deep_tree_renamed_and_partly_removed",
    );
    let file_mode = 0o666 & !umask();
    let dir_mode = 0o777 & !umask();

    // Phase 1: a deep tree made, renamed and partly removed within the 3 s lag.
    let m = wb_mount(&t, &["--sync-lag", "3s"]);
    dog.watch(&m);
    let started = Instant::now();
    std::fs::create_dir_all(m.path("a/b/c/d")).unwrap();
    put(&m.path("keep.txt"), b"keep");
    put(&m.path("a/f1"), b"f1");
    put(&m.path("a/b/f2"), b"f2");
    put(&m.path("a/b/c/f3"), b"f3");
    put(&m.path("a/b/c/d/f4"), b"f4");
    put(&m.path("a/b/c/d/f5"), b"f5");
    put(&m.path("tmpfile"), b"transient");
    std::fs::remove_file(m.path("tmpfile")).unwrap();
    std::fs::create_dir(m.path("tmpdir")).unwrap();
    std::fs::remove_dir(m.path("tmpdir")).unwrap();
    std::fs::rename(m.path("a"), m.path("z")).unwrap();
    std::fs::rename(m.path("z/b/c"), m.path("z/c2")).unwrap();
    std::fs::remove_file(m.path("z/f1")).unwrap();
    std::fs::remove_file(m.path("z/c2/d/f4")).unwrap();
    std::fs::rename(m.path("z/c2/d/f5"), m.path("z/b/f5")).unwrap();
    std::fs::remove_dir(m.path("z/c2/d")).unwrap();
    put(&m.path("z/c2/f3"), b"f3 rewritten after the renames");
    std::fs::create_dir(m.path("z/c2/new")).unwrap();
    put(&m.path("z/c2/new/n.txt"), b"n");
    let took = started.elapsed();
    eprintln!("phase 1 changes made in {took:?}");
    if took < Duration::from_secs(3) {
        assert!(
            !t.home.join("a").exists() && !t.home.join("z").exists(),
            "home has a/ or z/ before the sync lag passed"
        );
    }
    drain_ok(&m, 60);
    let f = |data: &[u8]| Node::File {
        data: data.to_vec(),
        mode: file_mode,
    };
    let expect: Tree = [
        ("keep.txt", f(b"keep")),
        ("z", Node::Dir { mode: dir_mode }),
        ("z/b", Node::Dir { mode: dir_mode }),
        ("z/b/f2", f(b"f2")),
        ("z/b/f5", f(b"f5")),
        ("z/c2", Node::Dir { mode: dir_mode }),
        ("z/c2/f3", f(b"f3 rewritten after the renames")),
        ("z/c2/new", Node::Dir { mode: dir_mode }),
        ("z/c2/new/n.txt", f(b"n")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_tree(&t.home, &expect, "home after the deep tree was drained");
    assert_tree(&m.mnt, &expect, "the mount after the deep tree was drained");
    m.unmount();

    // Phase 2: only objects created and removed within the lag: no home operation at all.
    let home_before = snapshot(&t.home);
    let m = wb_mount(&t, &["--sync-lag", "10s"]);
    dog.watch(&m);
    let before = m.status();
    let started = Instant::now();
    let mut rng = Rng::new(202);
    for i in 0..20 {
        let p = m.path(&format!("transient-{i:02}.bin"));
        let data = rng.bytes_between(0, 64 * 1024);
        let mut fh = File::create(&p).unwrap();
        fh.write_all(&data).unwrap();
        if i % 3 == 0 {
            fh.sync_all().unwrap();
        }
        close(fh).unwrap();
        if i % 4 == 1 {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        std::fs::remove_file(&p).unwrap();
    }
    for i in 0..5 {
        let d = m.path(&format!("z/transient-dir-{i}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::remove_dir(&d).unwrap();
    }
    // Nested: a dir with a file inside, then both removed; a file renamed before it is removed.
    std::fs::create_dir(m.path("nest")).unwrap();
    put(&m.path("nest/inner.txt"), b"inner");
    std::fs::remove_file(m.path("nest/inner.txt")).unwrap();
    std::fs::remove_dir(m.path("nest")).unwrap();
    put(&m.path("z/moved-before-removal"), b"moved");
    std::fs::rename(m.path("z/moved-before-removal"), m.path("z/b/moved")).unwrap();
    std::fs::remove_file(m.path("z/b/moved")).unwrap();
    let took = started.elapsed();
    eprintln!("phase 2 transient changes made in {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "the transient changes took {took:?}, longer than the 10 s lag: the check below means nothing"
    );
    drain_ok(&m, 60);
    let after = m.status();
    let (b, a) = (mutating_ops(&before), mutating_ops(&after));
    let deltas: BTreeMap<&str, u64> = a.iter().map(|(k, v)| (*k, v - b[k])).filter(|(_, d)| *d > 0).collect();
    assert!(
        deltas.is_empty(),
        "objects created and removed within the sync lag cost home operations: {deltas:?}\n{}",
        after["home"]
    );
    assert_eq!(num(&after, "/journal/pending_ops"), 0);
    assert_tree(&t.home, &home_before, "home after transient changes only");
    m.unmount();
}

// 3 ------------------------------------------------------------------------------------------------------

/// A random workload of file-system calls on a mount, with a model of what every call that returned did.
struct Workload {
    rng: Rng,
    model: Tree,
    seq: u64,
    umask: u32,
    ops: u64,
    mix: Mix,
    /// Every call made (and every kill), in order.
    history: Vec<String>,
}

/// Which calls a [`Workload`] makes.
#[derive(Clone, Copy, Debug)]
struct Mix {
    /// Renames of files, symlinks and directories.
    renames: bool,
    symlinks: bool,
    /// ftruncate to a size inside the file's last block (O_TRUNC to zero stays in).
    truncates: bool,
    /// List a directory just before removing it (its listing is then fresh in the cache).
    list_before_rmdir: bool,
}

const CHMOD_FILE: [u32; 6] = [0o600, 0o640, 0o644, 0o660, 0o700, 0o755];
const CHMOD_DIR: [u32; 3] = [0o700, 0o750, 0o755];

impl Workload {
    fn dirs(&self) -> Vec<String> {
        std::iter::once(String::new())
            .chain(
                self.model
                    .iter()
                    .filter(|(_, n)| matches!(n, Node::Dir { .. }))
                    .map(|(k, _)| k.clone()),
            )
            .collect()
    }

    fn files(&self) -> Vec<String> {
        self.model
            .iter()
            .filter(|(_, n)| matches!(n, Node::File { .. }))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Regular files and symlinks.
    fn leaves(&self) -> Vec<String> {
        self.model
            .iter()
            .filter(|(_, n)| !matches!(n, Node::Dir { .. }))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn pick(&mut self, v: &[String]) -> Option<String> {
        if v.is_empty() {
            None
        } else {
            Some(v[self.rng.below(v.len() as u64) as usize].clone())
        }
    }

    fn fresh(&mut self, parent: &str, prefix: &str) -> String {
        self.seq += 1;
        join(parent, &format!("{prefix}{}", self.seq))
    }

    fn data_mut(&mut self, rel: &str) -> &mut Vec<u8> {
        match self.model.get_mut(rel) {
            Some(Node::File { data, .. }) => data,
            _ => panic!("{rel} is not a file in the model"),
        }
    }

    /// Run one random call (or a few making up one step, e.g. write then fsync); the model changes only
    /// once they all returned. Returns what was done, or the error.
    fn step(&mut self, mnt: &Path) -> Result<String, String> {
        let r = self.step_inner(mnt);
        self.history.push(match &r {
            Ok(what) => what.clone(),
            Err(e) => format!("FAILED: {e}"),
        });
        r
    }

    /// Note something that is not a call (a kill) in the history.
    fn note(&mut self, what: String) {
        self.history.push(what);
    }

    /// The calls that named `rel` (as a whole path component sequence), with the kills between them.
    fn history_of(&self, rel: &str) -> String {
        let mentions = |line: &str| {
            line.match_indices(rel).any(|(i, _)| {
                let before = line[..i].chars().last();
                let after = line[i + rel.len()..].chars().next();
                before.is_none_or(|c| c == ' ' || c == '/') && after.is_none_or(|c| c == ' ' || c == ':')
            })
        };
        self.history
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("--") || mentions(l))
            .map(|(i, l)| format!("#{i} {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The differences (lines of [`diff_trees`]), each followed by the history of its path.
    fn explain(&self, diffs: &[String]) -> String {
        diffs
            .iter()
            .take(20)
            .map(|d| {
                let rel = d.split_whitespace().nth(1).unwrap_or("").trim_end_matches(':');
                format!("{d}\nits history:\n{}", self.history_of(rel))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn step_inner(&mut self, mnt: &Path) -> Result<String, String> {
        self.ops += 1;
        let files = self.files();
        let dirs = self.dirs();
        let mut roll = self.rng.below(100);
        if !self.mix.renames && (56..=69).contains(&roll) {
            roll = 10; // a create instead
        }
        if !self.mix.truncates && (35..=41).contains(&roll) {
            roll = 20; // an overwrite instead
        }
        if !self.mix.symlinks && roll >= 94 {
            roll = 47; // a mkdir instead
        }
        if files.len() > 60 && roll < 20 {
            roll = 70; // unlink instead of create
        }
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        match roll {
            // Create and write a file; fsync half of the time; close.
            0..=19 => {
                let parent = self.pick(&dirs).expect("the root is always there");
                let rel = self.fresh(&parent, "f");
                let size = if self.rng.below(5) == 0 {
                    16 * 1024 + self.rng.below(400 * 1024) as usize
                } else {
                    self.rng.below(16 * 1024) as usize
                };
                let data = self.rng.bytes(size);
                let fsync = self.rng.below(2) == 0;
                let what = format!("create {rel} ({size} bytes, fsync {fsync})");
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&format!("{what}: open"), e))?;
                f.write_all(&data).map_err(|e| io(&format!("{what}: write"), e))?;
                if fsync {
                    f.sync_all().map_err(|e| io(&format!("{what}: fsync"), e))?;
                }
                close(f).map_err(|e| io(&format!("{what}: close"), e))?;
                self.model.insert(
                    rel,
                    Node::File {
                        data,
                        mode: 0o644 & !self.umask,
                    },
                );
                Ok(what)
            }
            // Overwrite parts of a file (maybe past its end), fsync, close.
            20..=34 => {
                let Some(rel) = self.pick(&files) else {
                    return Ok("no file to overwrite".into());
                };
                let mut model = match &self.model[&rel] {
                    Node::File { data, .. } => data.clone(),
                    _ => unreachable!(),
                };
                let what = format!("overwrite parts of {rel}");
                let f = OpenOptions::new()
                    .write(true)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                for _ in 0..1 + self.rng.below(4) {
                    let off = self.rng.below(model.len() as u64 + 2000) as usize;
                    let chunk = self.rng.bytes_between(1, 32 * 1024);
                    f.write_all_at(&chunk, off as u64).map_err(|e| io(&what, e))?;
                    if model.len() < off + chunk.len() {
                        model.resize(off + chunk.len(), 0);
                    }
                    model[off..off + chunk.len()].copy_from_slice(&chunk);
                }
                f.sync_all().map_err(|e| io(&what, e))?;
                close(f).map_err(|e| io(&what, e))?;
                *self.data_mut(&rel) = model;
                Ok(what)
            }
            // Truncate (shrink or grow).
            35..=41 => {
                let Some(rel) = self.pick(&files) else {
                    return Ok("no file to truncate".into());
                };
                let len = self.data_mut(&rel).len();
                let new_len = self.rng.below(len as u64 + 5000) as usize;
                let what = format!("truncate {rel} from {len} to {new_len}");
                let f = OpenOptions::new()
                    .write(true)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                f.set_len(new_len as u64).map_err(|e| io(&what, e))?;
                close(f).map_err(|e| io(&what, e))?;
                self.data_mut(&rel).resize(new_len, 0);
                Ok(what)
            }
            // Replace a file's whole content (O_TRUNC).
            42..=46 => {
                let Some(rel) = self.pick(&files) else {
                    return Ok("no file to replace".into());
                };
                let data = self.rng.bytes_between(0, 48 * 1024);
                let what = format!("replace {rel} with {} bytes", data.len());
                let mut f = OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                f.write_all(&data).map_err(|e| io(&what, e))?;
                close(f).map_err(|e| io(&what, e))?;
                *self.data_mut(&rel) = data;
                Ok(what)
            }
            // mkdir.
            47..=55 => {
                let parents: Vec<String> = dirs.iter().filter(|d| d.matches('/').count() < 3).cloned().collect();
                if dirs.len() > 20 {
                    return Ok("enough dirs".into());
                }
                let parent = self.pick(&parents).expect("the root is always there");
                let rel = self.fresh(&parent, "d");
                let what = format!("mkdir {rel}");
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                self.model.insert(
                    rel,
                    Node::Dir {
                        mode: 0o755 & !self.umask,
                    },
                );
                Ok(what)
            }
            // Rename a file or symlink: to a new name, or over another file.
            56..=64 => {
                let leaves = self.leaves();
                let Some(from) = self.pick(&leaves) else {
                    return Ok("nothing to rename".into());
                };
                let to = if self.rng.below(3) == 0 && files.len() > 1 {
                    let to = self.pick(&files).expect("files");
                    if to == from {
                        return Ok("rename onto itself skipped".into());
                    }
                    to
                } else {
                    let parent = self.pick(&dirs).expect("the root is always there");
                    self.fresh(&parent, "r")
                };
                let what = format!("rename {from} -> {to}");
                std::fs::rename(mnt.join(&from), mnt.join(&to)).map_err(|e| io(&what, e))?;
                let node = self.model.remove(&from).expect("from is in the model");
                self.model.insert(to, node);
                Ok(what)
            }
            // Rename a directory (with what is under it) somewhere outside itself.
            65..=69 => {
                let movable: Vec<String> = dirs.iter().filter(|d| !d.is_empty()).cloned().collect();
                let Some(from) = self.pick(&movable) else {
                    return Ok("no dir to rename".into());
                };
                let inside = format!("{from}/");
                let parents: Vec<String> = dirs
                    .iter()
                    .filter(|p| **p != from && !p.starts_with(&inside) && p.matches('/').count() < 3)
                    .cloned()
                    .collect();
                let parent = self.pick(&parents).expect("the root is always a candidate");
                let to = self.fresh(&parent, "m");
                let what = format!("rename dir {from} -> {to}");
                std::fs::rename(mnt.join(&from), mnt.join(&to)).map_err(|e| io(&what, e))?;
                move_subtree(&mut self.model, &from, &to);
                Ok(what)
            }
            // unlink a file or symlink.
            70..=79 => {
                let leaves = self.leaves();
                let Some(rel) = self.pick(&leaves) else {
                    return Ok("nothing to unlink".into());
                };
                let what = format!("unlink {rel}");
                std::fs::remove_file(mnt.join(&rel)).map_err(|e| io(&what, e))?;
                self.model.remove(&rel);
                Ok(what)
            }
            // rmdir an empty dir.
            80..=85 => {
                let empty: Vec<String> = dirs
                    .iter()
                    .filter(|d| !d.is_empty())
                    .filter(|d| {
                        let inside = format!("{d}/");
                        !self.model.keys().any(|k| k.starts_with(&inside))
                    })
                    .cloned()
                    .collect();
                let Some(rel) = self.pick(&empty) else {
                    return Ok("no empty dir".into());
                };
                let what = format!("rmdir {rel}");
                if self.mix.list_before_rmdir {
                    std::fs::read_dir(mnt.join(&rel))
                        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
                        .map_err(|e| io(&format!("{what}: listing it first"), e))?;
                }
                std::fs::remove_dir(mnt.join(&rel)).map_err(|e| io(&what, e))?;
                self.model.remove(&rel);
                Ok(what)
            }
            // chmod a file or a dir.
            86..=93 => {
                if self.rng.below(4) == 0 {
                    let movable: Vec<String> = dirs.iter().filter(|d| !d.is_empty()).cloned().collect();
                    let Some(rel) = self.pick(&movable) else {
                        return Ok("no dir to chmod".into());
                    };
                    let mode = CHMOD_DIR[self.rng.below(CHMOD_DIR.len() as u64) as usize];
                    let what = format!("chmod {mode:o} dir {rel}");
                    std::fs::set_permissions(mnt.join(&rel), std::fs::Permissions::from_mode(mode))
                        .map_err(|e| io(&what, e))?;
                    self.model.insert(rel, Node::Dir { mode });
                    Ok(what)
                } else {
                    let Some(rel) = self.pick(&files) else {
                        return Ok("no file to chmod".into());
                    };
                    let mode = CHMOD_FILE[self.rng.below(CHMOD_FILE.len() as u64) as usize];
                    let what = format!("chmod {mode:o} {rel}");
                    std::fs::set_permissions(mnt.join(&rel), std::fs::Permissions::from_mode(mode))
                        .map_err(|e| io(&what, e))?;
                    if let Some(Node::File { mode: m, .. }) = self.model.get_mut(&rel) {
                        *m = mode;
                    }
                    Ok(what)
                }
            }
            // symlink.
            _ => {
                let parent = self.pick(&dirs).expect("the root is always there");
                let rel = self.fresh(&parent, "l");
                let target = PathBuf::from(format!("../target-{}", self.seq));
                let what = format!("symlink {rel} -> {}", target.display());
                std::os::unix::fs::symlink(&target, mnt.join(&rel)).map_err(|e| io(&what, e))?;
                self.model.insert(rel, Node::Symlink { target });
                Ok(what)
            }
        }
    }

    /// Read a few model files (and one directory listing) back through the mount.
    fn spot_check(&mut self, mnt: &Path, home: &Path, count: usize) -> Result<(), String> {
        let files = self.files();
        for _ in 0..count.min(files.len()) {
            let rel = self.pick(&files).expect("files");
            let got = std::fs::read(mnt.join(&rel))
                .map_err(|e| format!("read {rel}: {e}\nits history:\n{}", self.history_of(&rel)))?;
            let Node::File { data, .. } = &self.model[&rel] else {
                unreachable!()
            };
            if got != *data {
                let at_home = match std::fs::read(home.join(&rel)) {
                    Ok(h) if h == got => "the same as home has now".to_string(),
                    Ok(h) if h == *data => "while home has the model's".to_string(),
                    Ok(h) => format!("home has {} bytes (fnv {:016x})", h.len(), fnv(&h)),
                    Err(e) => format!("home: {e}"),
                };
                let first = got.iter().zip(data).position(|(a, b)| a != b);
                let zeros = if got.iter().all(|b| *b == 0) {
                    " (all zeros)"
                } else {
                    ""
                };
                return Err(format!(
                    "{rel} reads {} bytes{zeros} (fnv {:016x}) through the mount, the model has {} (fnv {:016x}); \
                     first difference at {first:?}; {at_home}\nits history:\n{}",
                    got.len(),
                    fnv(&got),
                    data.len(),
                    fnv(data),
                    self.history_of(&rel)
                ));
            }
        }
        let dirs = self.dirs();
        let dir = self.pick(&dirs).expect("root");
        let mut got: Vec<String> = match std::fs::read_dir(mnt.join(&dir)) {
            Ok(entries) => entries
                .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) => return Err(format!("list {dir}: {e}\nits history:\n{}", self.history_of(&dir))),
        };
        got.sort();
        let mut want: Vec<String> = self
            .model
            .keys()
            .filter(|k| {
                let parent = k.rsplit_once('/').map_or("", |(p, _)| p);
                parent == dir
            })
            .map(|k| k.rsplit('/').next().expect("name").to_string())
            .collect();
        want.sort();
        if got != want {
            return Err(format!("listing of '{dir}' through the mount: {got:?}, model {want:?}"));
        }
        Ok(())
    }
}

/// Run `mix` on a write-back mount with `durability`, SIGKILL the daemon between calls at random points
/// (20-25 times) and mount again; then drain and compare home with the model of every call that returned.
fn kill_9_workload(name: &'static str, seed: u64, mix: Mix, durability: &'static str) {
    let t = TestDir::new(name);
    let dog = Watchdog::new(Duration::from_secs(240), name);
    let mut rng = Rng::new(seed);
    // A starting home the workload changes too.
    let mut w = Workload {
        rng: Rng::new(seed * 10),
        model: Tree::new(),
        seq: 0,
        umask: umask(),
        ops: 0,
        mix,
        history: Vec::new(),
    };
    for i in 0..6 {
        let rel = format!("h{i}.bin");
        let data = write_random(&t.home.join(&rel), 1 + rng.below(100_000) as usize, &mut rng);
        std::fs::set_permissions(t.home.join(&rel), std::fs::Permissions::from_mode(0o644)).unwrap();
        w.model.insert(rel, Node::File { data, mode: 0o644 });
    }
    std::fs::create_dir(t.home.join("hd")).unwrap();
    std::fs::set_permissions(t.home.join("hd"), std::fs::Permissions::from_mode(0o755)).unwrap();
    w.model.insert("hd".into(), Node::Dir { mode: 0o755 });
    let data = write_random(&t.home.join("hd/inner.bin"), 30_000, &mut rng);
    std::fs::set_permissions(t.home.join("hd/inner.bin"), std::fs::Permissions::from_mode(0o644)).unwrap();
    w.model.insert("hd/inner.bin".into(), Node::File { data, mode: 0o644 });

    let lag_of = |kill: u32| if kill.is_multiple_of(2) { "0s" } else { "1s" };
    let args = |kill: u32| {
        [
            "--sync-lag",
            lag_of(kill),
            "--flush-threads",
            "4",
            "--validity-lag",
            "15s",
            "--durability",
            durability,
        ]
    };
    let mut m = wb_mount(&t, &args(0));
    dog.watch(&m);
    let started = Instant::now();
    let mut kills = 0u32;
    let mut last_ops: Vec<String> = Vec::new();
    let mut pending_at_kill = Vec::new();
    while kills < 25 && started.elapsed() < Duration::from_secs(120) {
        let run_for = Duration::from_millis(50 + rng.below(351));
        let until = Instant::now() + run_for;
        let mut n = 0;
        while n == 0 || Instant::now() < until {
            match w.step(&m.mnt) {
                Ok(what) => {
                    last_ops.push(what);
                    if last_ops.len() > 30 {
                        last_ops.remove(0);
                    }
                }
                Err(e) => panic!(
                    "after {kills} kills, op #{} failed: {e}\nlast ops:\n{}\n{}\n--- daemon log ---\n{}",
                    w.ops,
                    last_ops.join("\n"),
                    keep_evidence(&t, Some(&m)),
                    m.log()
                ),
            }
            n += 1;
        }
        // Between calls, never during one: every call in the model returned.
        pending_at_kill.push(pending(&m));
        kills += 1;
        last_ops.push(format!("-- kill #{kills} and remount (sync lag {}) --", lag_of(kills)));
        w.note(last_ops.last().expect("just pushed").clone());
        m = kill_and_remount(&t, m, &args(kills));
        dog.watch(&m);
        if let Err(e) = w.spot_check(&m.mnt, &t.home, 4) {
            panic!(
                "after kill #{kills} and remount: {e}\nlast ops before the kill:\n{}\n{}\n--- daemon log ---\n{}",
                last_ops.join("\n"),
                keep_evidence(&t, Some(&m)),
                m.log()
            );
        }
    }
    eprintln!(
        "{kills} kills in {:?}, {} ops; pending ops at each kill: {pending_at_kill:?}",
        started.elapsed(),
        w.ops
    );
    assert!(kills >= 20, "only {kills} kills in the time budget");
    assert!(
        pending_at_kill.iter().filter(|p| **p > 0).count() >= 5,
        "too few kills landed with changes pending ({pending_at_kill:?}): the test is not testing anything"
    );

    drain_ok(&m, 120);
    let st = m.status();
    assert_eq!(num(&st, "/journal/pending_ops"), 0, "{}", st["journal"]);
    let diffs = diff_trees(&snapshot(&m.mnt), &w.model);
    if !diffs.is_empty() {
        panic!(
            "the mount after the last remount and drain differs from the model:\n{}\n{}\n--- daemon log ---\n{}",
            w.explain(&diffs),
            keep_evidence(&t, None),
            m.log()
        );
    }
    assert_eq!(
        (num(&st, "/journal/conflicts"), num(&st, "/journal/failed_ops")),
        (0, 0),
        "the kills caused conflicts or failed ops: {}\n{}",
        st["journal"],
        larder(&["conflicts", s(&m.mnt), "--json"]).stdout
    );
    m.unmount();
    let diffs = diff_trees(&snapshot(&t.home), &w.model);
    if !diffs.is_empty() {
        panic!(
            "home after {kills} kill -9s and a drain differs from the model:\n{}\n{}",
            w.explain(&diffs),
            keep_evidence(&t, None)
        );
    }
}

#[test]
fn kill_9_at_random_points_loses_nothing_acknowledged() {
    let mix = Mix {
        renames: true,
        symlinks: true,
        truncates: true,
        list_before_rmdir: false,
    };
    kill_9_workload("wb-kill9", 303, mix, "process");
}

/// The same workload with every change fsynced before it returns.
#[test]
fn kill_9_at_random_points_at_power_durability_loses_nothing_acknowledged() {
    let mix = Mix {
        renames: true,
        symlinks: true,
        truncates: true,
        list_before_rmdir: false,
    };
    kill_9_workload("wb-kill9-power", 323, mix, "power");
}

/// The same without the calls that hit the bugs above: no renames, no symlinks, no truncation inside a
/// block (O_TRUNC stays), and a directory is listed before it is removed. What remains (creates, writes,
/// overwrites, fsyncs, chmods, mkdirs, unlinks, rmdirs) must survive the kills.
#[test]
fn kill_9_at_random_points_without_renames_loses_nothing_acknowledged() {
    let mix = Mix {
        renames: false,
        symlinks: false,
        truncates: false,
        list_before_rmdir: true,
    };
    kill_9_workload("wb-kill9-norename", 313, mix, "process");
}

// 4 ------------------------------------------------------------------------------------------------------

/// A writer the kernel serves from the cache file (passthrough) writes there without a call to the daemon:
/// a SIGKILL of the daemon before the writer's close must not lose what the kernel acknowledged, nor leave
/// the cache showing bytes home never gets. The next start takes those writes in and pushes them.
#[test]
fn writes_the_kernel_made_to_a_cache_file_survive_a_kill_before_the_close() {
    if !kernel_has_passthrough() {
        eprintln!("skipped: this kernel has no FUSE passthrough");
        return;
    }
    use std::os::unix::fs::FileExt;
    let t = TestDir::new("wb-kill-pt");
    let mut rng = Rng::new(91);
    let mut want = write_random(&t.home.join("f.bin"), 2 << 20, &mut rng);
    let m = wb_mount(&t, &["--sync-lag", "60s", "--validity-lag", "60s"]);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "cold read");
    // The kernel releases the reader's handle after its close returns; passthrough waits for that.
    m.wait_released();
    let reads = num(&m.status(), "/efficiency/reads");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f.bin"))
        .unwrap();
    let write = |want: &mut Vec<u8>, off: usize, chunk: &[u8]| {
        f.write_all_at(chunk, off as u64).unwrap();
        if want.len() < off + chunk.len() {
            want.resize(off + chunk.len(), 0);
        }
        want[off..off + chunk.len()].copy_from_slice(chunk);
    };
    write(&mut want, 100, &rng.bytes(1000));
    let mut back = vec![0u8; 1100];
    f.read_exact_at(&mut back, 0).unwrap();
    assert_same_bytes(&back, &want[..1100], "read back through the writer");
    // (Starting a process flushes the writer: its copy of the descriptor closes at exec.)
    assert_eq!(
        num(&m.status(), "/efficiency/reads"),
        reads,
        "the daemon served a read of a file whole in the cache: no passthrough"
    );
    // Written after that flush: the daemon never sees these before it dies.
    for (off, len) in [(4096usize, 5000usize), ((1 << 20) + 3, 70_000), ((2 << 20) - 10, 100)] {
        write(&mut want, off, &rng.bytes(len));
    }
    // Killed with the writer still open: its close never reaches the daemon.
    let m = kill_and_remount(&t, m, &["--sync-lag", "0s", "--validity-lag", "60s"]);
    drop(f);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "the mount after the restart");
    drain_ok(&m, 30);
    assert_same_bytes(
        &std::fs::read(t.home.join("f.bin")).unwrap(),
        &want,
        "home after the drain",
    );
    m.unmount();
}

/// A file the kernel serves from its cache file, written there and removed while still open (SQLite's
/// `-wal` file at the end of a session), then the daemon killed before the close: after the remount the
/// file is gone, as it would be on a local file system after a crash. Its writes the daemon never saw
/// must not be taken in and pushed after its removal (to a name home no longer has: a conflict copy).
#[test]
fn a_file_removed_while_written_by_the_kernel_is_gone_after_a_kill() {
    if !kernel_has_passthrough() {
        eprintln!("skipped: this kernel has no FUSE passthrough");
        return;
    }
    use std::os::unix::fs::FileExt;
    let t = TestDir::new("wb-kill-unlinked");
    let mut rng = Rng::new(92);
    write_random(&t.home.join("f.bin"), 300_000, &mut rng);
    write_random(&t.home.join("keep.bin"), 1000, &mut rng);
    let m = wb_mount(&t, &["--sync-lag", "0s", "--validity-lag", "60s"]);
    let _ = read(&m.path("f.bin"));
    m.wait_released();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f.bin"))
        .unwrap();
    f.write_all_at(&rng.bytes(5000), 100).unwrap();
    std::fs::remove_file(m.path("f.bin")).unwrap();
    drain_ok(&m, 30);
    assert!(!t.home.join("f.bin").exists(), "the removal reached home");
    // Written again after the removal, through the kernel alone; then the daemon dies, the file open.
    f.write_all_at(&rng.bytes(7000), 9000).unwrap();
    let m = kill_and_remount(&t, m, &["--sync-lag", "0s", "--validity-lag", "60s"]);
    drop(f);
    drain_ok(&m, 30);
    let st = m.status();
    assert_eq!(num(&st, "/journal/conflicts"), 0, "{}", st["journal"]);
    assert_eq!(names(&m.mnt), ["keep.bin"], "the mount after the restart");
    assert_eq!(names(&t.home), ["keep.bin"], "home after the drain");
    m.unmount();
}

#[test]
fn home_offline_workload_continues_and_drains() {
    let t = TestDir::new("wb-offline");
    let dog = Watchdog::new(Duration::from_secs(120), "home_offline_workload_continues_and_drains");
    let mut rng = Rng::new(404);
    for i in 0..5 {
        write_random(
            &t.home.join(format!("cached/c{i}.bin")),
            1 + rng.below(200_000) as usize,
            &mut rng,
        );
    }
    write_random(&t.home.join("cached/sub/deep.txt"), 999, &mut rng);
    write_random(&t.home.join("other.txt"), 123, &mut rng);
    write_random(&t.home.join("uncached/u.bin"), 100_000, &mut rng);
    let home_start = snapshot(&t.home);
    let mut model = home_start.clone();
    let fault = t.root().join("home-is-down");
    let file_mode = 0o666 & !umask();
    let dir_mode = 0o777 & !umask();

    let m = wb_mount(
        &t,
        &["--fault-file", s(&fault), "--sync-lag", "1s", "--validity-lag", "60s"],
    );
    dog.watch(&m);
    // Warm the cache: every listing, every file but uncached/u.bin.
    for d in ["", "cached", "cached/sub", "uncached"] {
        names(&m.path(d));
    }
    for (rel, n) in &home_start {
        if let Node::File { data, .. } = n
            && !rel.starts_with("uncached/")
        {
            assert_same_bytes(&read(&m.path(rel)), data, &format!("warming {rel}"));
        }
    }
    assert_eq!(m.status()["home"]["state"], "online");

    // Home goes away; the first call that needs it fails with EIO, quickly, and home is offline.
    std::fs::write(&fault, b"").unwrap();
    let up = m.path("uncached/u.bin");
    let started = Instant::now();
    let r = with_deadline(
        Duration::from_secs(10),
        "reading an uncached file while home is down",
        move || std::fs::read(&up),
    );
    match r {
        Ok(v) => panic!("reading uncached/u.bin while home is down returned {} bytes", v.len()),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "want EIO, got {e}"),
    }
    eprintln!("uncached read failed after {:?}", started.elapsed());
    assert!(
        wait_until(Duration::from_secs(5), || m.status()["home"]["state"] == "offline"),
        "home did not go offline: {}",
        m.status()["home"]
    );

    // The workload goes on against the cache.
    for (rel, n) in &home_start {
        if let Node::File { data, .. } = n
            && !rel.starts_with("uncached/")
        {
            assert_same_bytes(&read(&m.path(rel)), data, &format!("cached {rel} while offline"));
        }
    }
    assert_eq!(
        names(&m.path("cached")),
        ["c0.bin", "c1.bin", "c2.bin", "c3.bin", "c4.bin", "sub"]
    );
    assert_eq!(names(&m.path("cached/sub")), ["deep.txt"]);
    assert_eq!(names(&m.path("")), ["cached", "other.txt", "uncached"]);

    std::fs::create_dir(m.path("offline")).unwrap();
    model.insert("offline".into(), Node::Dir { mode: dir_mode });
    std::fs::create_dir_all(m.path("offline/a/b")).unwrap();
    for d in ["offline/a", "offline/a/b"] {
        model.insert(d.into(), Node::Dir { mode: dir_mode });
    }
    for i in 0..10 {
        let rel = format!("offline/a/b/n{i}.bin");
        let data = rng.bytes_between(0, 100_000);
        put(&m.path(&rel), &data);
        model.insert(rel, Node::File { data, mode: file_mode });
    }
    let root_new = rng.bytes(5000);
    put(&m.path("new-root.txt"), &root_new);
    std::fs::set_permissions(m.path("new-root.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    model.insert(
        "new-root.txt".into(),
        Node::File {
            data: root_new,
            mode: 0o600,
        },
    );
    // Change cached files: overwrite part of one, move one, remove one.
    {
        let f = OpenOptions::new().write(true).open(m.path("cached/c1.bin")).unwrap();
        f.write_all_at(b"written while home was down", 10).unwrap();
        f.sync_all().unwrap();
        close(f).unwrap();
        if let Some(Node::File { data, .. }) = model.get_mut("cached/c1.bin") {
            if data.len() < 37 {
                data.resize(37, 0);
            }
            data[10..37].copy_from_slice(b"written while home was down");
        }
    }
    std::fs::rename(m.path("cached/c2.bin"), m.path("offline/c2-moved.bin")).unwrap();
    move_subtree(&mut model, "cached/c2.bin", "offline/c2-moved.bin");
    std::fs::remove_file(m.path("cached/c3.bin")).unwrap();
    model.remove("cached/c3.bin");
    // New objects renamed and removed.
    std::fs::rename(m.path("offline/a"), m.path("offline/a2")).unwrap();
    move_subtree(&mut model, "offline/a", "offline/a2");
    std::fs::rename(m.path("offline/a2/b/n0.bin"), m.path("offline/n0-moved.bin")).unwrap();
    move_subtree(&mut model, "offline/a2/b/n0.bin", "offline/n0-moved.bin");
    for i in [1, 2, 3] {
        let rel = format!("offline/a2/b/n{i}.bin");
        std::fs::remove_file(m.path(&rel)).unwrap();
        model.remove(&rel);
    }
    std::fs::create_dir(m.path("offline/gone")).unwrap();
    std::fs::remove_dir(m.path("offline/gone")).unwrap();

    // Everything reads back through the mount while home is still down.
    for (rel, n) in &model {
        if let Node::File { data, .. } = n
            && !rel.starts_with("uncached/")
        {
            assert_same_bytes(&read(&m.path(rel)), data, &format!("{rel} while offline"));
        }
    }
    let st = m.status();
    assert!(
        num(&st, "/journal/pending_ops") > 0,
        "nothing pending: {}",
        st["journal"]
    );
    std::thread::sleep(Duration::from_secs(3));
    let st = m.status();
    assert_eq!(st["home"]["state"], "offline", "{}", st["home"]);
    assert!(
        num(&st, "/journal/pending_ops") > 0,
        "pending ops vanished while home was down: {}",
        st["journal"]
    );
    assert_eq!(
        num(&st, "/journal/failed_ops"),
        0,
        "an unreachable home made ops fail for good: {}",
        st["journal"]
    );
    assert_tree(&t.home, &home_start, "home while it was down");

    // Home comes back: the prober notices, the journal drains.
    std::fs::remove_file(&fault).unwrap();
    wait_online(&m, 10, "of the fault file's removal");
    drain_ok(&m, 60);
    let st = m.status();
    assert_eq!(
        (num(&st, "/journal/conflicts"), num(&st, "/journal/failed_ops")),
        (0, 0),
        "{}",
        st["journal"]
    );
    assert_same_bytes(
        &read(&m.path("uncached/u.bin")),
        match &home_start["uncached/u.bin"] {
            Node::File { data, .. } => data,
            _ => unreachable!(),
        },
        "uncached/u.bin once home is back",
    );
    m.unmount();
    assert_tree(&t.home, &model, "home after the outage was drained");
}

// 5 ------------------------------------------------------------------------------------------------------

#[test]
fn conflicts_under_each_policy() {
    let dog = Watchdog::new(Duration::from_secs(150), "conflicts_under_each_policy");
    for policy in ["keep-both", "cache-wins", "home-wins"] {
        let t = TestDir::new(&format!("wb-conflict-{policy}"));
        let hf = t.home.join("f.txt");
        std::fs::write(&hf, b"v0").unwrap();
        let m = wb_mount(
            &t,
            &[
                "--sync-lag",
                "30s",
                "--validity-lag",
                "60s",
                "--conflict-policy",
                policy,
            ],
        );
        dog.watch(&m);
        assert_eq!(read(&m.path("f.txt")), b"v0", "{policy}: first read");
        put(&m.path("f.txt"), b"local");
        assert_eq!(
            read(&m.path("f.txt")),
            b"local",
            "{policy}: the mount after the local write"
        );
        assert_eq!(read(&hf), b"v0", "{policy}: home changed before the sync lag");
        // Home changes under the unpushed local write.
        let mt = mtime_secs(&hf);
        std::fs::write(&hf, b"home-change").unwrap();
        set_mtime(&hf, mt + 100);

        drain_ok(&m, 30);
        let st = m.status();
        let what = format!("{policy}: journal {}", st["journal"]);
        assert_eq!(num(&st, "/journal/pending_ops"), 0, "{what}");
        assert_eq!(num(&st, "/journal/conflicts"), 1, "{what}");
        assert_eq!(num(&st, "/journal/failed_ops"), 0, "{what}");
        let out = larder(&["conflicts", s(&m.mnt), "--json"]);
        assert!(out.success(), "{policy}: larder conflicts --json failed:\n{out}");
        let v: serde_json::Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", out.stdout));
        let list = v["conflicts"].as_array().cloned().unwrap_or_default();
        assert_eq!(list.len(), 1, "{policy}: want one conflict: {v}");
        let c = &list[0];
        assert_eq!(c["path"], "f.txt", "{policy}: {c}");
        assert_eq!(c["policy"], policy, "{policy}: {c}");
        assert_eq!(c["complete"], true, "{policy}: {c}");
        let kept_at = c["kept_at"].as_str().unwrap_or_default().to_string();

        let home_names = names(&t.home);
        match policy {
            "keep-both" => {
                assert_eq!(read(&hf), b"home-change", "keep-both: home's f.txt");
                let aside: Vec<&String> = home_names.iter().filter(|n| n.starts_with("f.txt.conflict-")).collect();
                assert_eq!(
                    aside.len(),
                    1,
                    "keep-both: want one conflict copy at home: {home_names:?}"
                );
                assert!(
                    is_conflict_name(aside[0], "f.txt"),
                    "keep-both: badly named conflict copy {}",
                    aside[0]
                );
                assert_eq!(home_names.len(), 2, "keep-both: home holds {home_names:?}");
                assert_eq!(read(&t.home.join(aside[0])), b"local", "keep-both: the conflict copy");
                assert!(
                    kept_at.ends_with(aside[0].as_str()),
                    "keep-both: kept_at '{kept_at}' does not name {}",
                    aside[0]
                );
                assert_eq!(read(&m.path("f.txt")), b"home-change", "keep-both: the mount's f.txt");
            }
            "cache-wins" => {
                assert_eq!(read(&hf), b"local", "cache-wins: home's f.txt");
                assert_eq!(home_names, ["f.txt"], "cache-wins: home holds more");
                assert_eq!(read(&m.path("f.txt")), b"local", "cache-wins: the mount's f.txt");
            }
            _ => {
                assert_eq!(read(&hf), b"home-change", "home-wins: home's f.txt");
                assert_eq!(home_names, ["f.txt"], "home-wins: home holds more");
                let kept: Vec<String> = names(&t.cache.join("conflicts"))
                    .into_iter()
                    .filter(|n| n.ends_with("-f.txt"))
                    .collect();
                assert_eq!(kept.len(), 1, "home-wins: want one kept copy in <cache>/conflicts");
                let kept_path = t.cache.join("conflicts").join(&kept[0]);
                assert_eq!(read(&kept_path), b"local", "home-wins: the kept copy");
                assert_eq!(
                    std::fs::canonicalize(&kept_at).ok(),
                    std::fs::canonicalize(&kept_path).ok(),
                    "home-wins: kept_at '{kept_at}' is not {}",
                    kept_path.display()
                );
                assert_eq!(read(&m.path("f.txt")), b"home-change", "home-wins: the mount's f.txt");
            }
        }
        m.unmount();
    }
}

// 6 ------------------------------------------------------------------------------------------------------

#[test]
fn unmount_leave_pending_then_remount_pushes() {
    let t = TestDir::new("wb-leave");
    let dog = Watchdog::new(Duration::from_secs(120), "unmount_leave_pending_then_remount_pushes");
    let mut rng = Rng::new(606);
    let file_mode = 0o666 & !umask();
    let dir_mode = 0o777 & !umask();
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    let mut want = Tree::new();
    std::fs::create_dir_all(m.path("keep/empty")).unwrap();
    want.insert("keep".into(), Node::Dir { mode: dir_mode });
    want.insert("keep/empty".into(), Node::Dir { mode: dir_mode });
    for (rel, size) in [
        ("keep/a.bin", 300_000),
        ("keep/b.txt", 10),
        ("top.bin", 2_500_000),
        ("zero", 0),
    ] {
        let data = rng.bytes(size);
        put(&m.path(rel), &data);
        want.insert(rel.into(), Node::File { data, mode: file_mode });
    }
    assert!(pending(&m) > 0, "nothing pending with a 60 s lag");

    let pid = m.pid;
    let out = larder(&["unmount", s(&m.mnt), "--leave-pending"]);
    assert!(
        out.success(),
        "larder unmount --leave-pending failed:\n{out}\n--- daemon log ---\n{}",
        m.log()
    );
    assert!(
        wait_until(Duration::from_secs(10), || !alive(pid)),
        "the daemon is alive after unmount"
    );
    assert!(!is_mounted(&t.mnt), "still mounted after unmount --leave-pending");
    m.disarm();
    assert_tree(&t.home, &Tree::new(), "home after unmount --leave-pending");

    // The remount pushes what was left (1 s lag: at once). The objects are visible right away; they are
    // checked by name, not by listing the root: a listing taken while pushes land can miss entries (see
    // `listing_while_pushes_land_shows_every_entry`).
    let m = wb_mount(&t, &["--sync-lag", "1s"]);
    dog.watch(&m);
    for (rel, node) in &want {
        let p = m.path(rel);
        match node {
            Node::Dir { .. } => assert!(
                p.is_dir(),
                "{rel} is not a directory in the mount right after the remount"
            ),
            Node::File { data, .. } => assert_same_bytes(&read(&p), data, &format!("{rel} right after the remount")),
            Node::Symlink { .. } => unreachable!(),
        }
    }
    drain_ok(&m, 60);
    assert_eq!(pending(&m), 0);
    assert_tree(&t.home, &want, "home after the remount drained");
    assert_tree(&m.mnt, &want, "the mount after the drain");
    m.unmount();
    assert_tree(&t.home, &want, "home after the final unmount");
}
// 7 ------------------------------------------------------------------------------------------------------
// Minimal reproductions of the larder bugs the tests above found.

/// Run `f` on a thread; if it does not return within `secs`, SIGKILL the daemon of `m` (so the stuck call
/// fails and the mount can be cleaned up) and fail the test.
fn within<T: Send + 'static>(m: &Mount, secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(_) => {
            let log = m.log();
            if is_larder_daemon(m.pid) {
                signal(m.pid, libc::SIGKILL);
            }
            panic!("{what} did not return within {secs} s (the daemon was killed)\n--- daemon log ---\n{log}");
        }
    }
}

/// Renames and creates queued when the daemon died are pushed by the next daemon before anything looked the
/// objects up; the mount must still find them where home now has them.
#[test]
fn ops_pushed_after_a_restart_leave_the_objects_reachable() {
    let t = TestDir::new("wb-restart-push");
    let dog = Watchdog::new(
        Duration::from_secs(90),
        "ops_pushed_after_a_restart_leave_the_objects_reachable",
    );
    std::fs::create_dir_all(t.home.join("dir/sub")).unwrap();
    std::fs::write(t.home.join("dir/sub/file"), b"hello").unwrap();
    std::fs::write(t.home.join("f1"), b"data").unwrap();
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    snapshot(&m.mnt); // everything looked up and cached
    std::fs::rename(m.path("dir"), m.path("renamed")).unwrap();
    std::fs::rename(m.path("f1"), m.path("f2")).unwrap();
    std::os::unix::fs::symlink("../target-1", m.path("link")).unwrap();
    put(&m.path("new.txt"), b"new");
    assert!(pending(&m) >= 4, "{}", m.status()["journal"]);

    // Killed with all four queued; the next daemon pushes them at once (lag 0) and nothing is looked up
    // before the drain ends.
    let m = kill_and_remount(&t, m, &["--sync-lag", "0s"]);
    dog.watch(&m);
    drain_ok(&m, 30);
    let home = names(&t.home);
    assert_eq!(home, ["f2", "link", "new.txt", "renamed"], "home after the drain");

    let mut problems = Vec::new();
    match std::fs::read_dir(m.path("renamed"))
        .and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>())
    {
        Ok(v) if v == ["sub"] => {}
        other => problems.push(format!("listing renamed/: {other:?}, want [\"sub\"]")),
    }
    match std::fs::read(m.path("renamed/sub/file")) {
        Ok(v) if v == b"hello" => {}
        other => problems.push(format!("reading renamed/sub/file: {other:?}")),
    }
    match std::fs::read(m.path("f2")) {
        Ok(v) if v == b"data" => {}
        other => problems.push(format!("reading f2: {other:?}")),
    }
    match std::fs::read_link(m.path("link")) {
        Ok(v) if v == Path::new("../target-1") => {}
        other => problems.push(format!("readlink link: {other:?}")),
    }
    match std::fs::read(m.path("new.txt")) {
        Ok(v) if v == b"new" => {}
        other => problems.push(format!("reading new.txt: {other:?}")),
    }
    assert!(
        problems.is_empty(),
        "home has every object, the mount cannot reach some:\n{}",
        problems.join("\n")
    );
    m.unmount();
}

/// A directory moved out of a parent that is then removed: until the rename reaches home, home still has the
/// directory under the removed parent. Neither the kernel forgetting the removed parent nor a restart may
/// cut the way there.
#[test]
fn a_dir_moved_out_of_a_removed_parent_stays_reachable() {
    let t = TestDir::new("wb-moved-out");
    let dog = Watchdog::new(
        Duration::from_secs(90),
        "a_dir_moved_out_of_a_removed_parent_stays_reachable",
    );
    std::fs::create_dir_all(t.home.join("a/b/c")).unwrap();
    std::fs::write(t.home.join("a/b/c/f"), b"deep").unwrap();
    std::fs::write(t.home.join("a/b/g"), b"near").unwrap();
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    // Only b is looked up (not c or the files), so reaching them later needs b's home path.
    assert!(m.path("a/b").is_dir());
    std::fs::rename(m.path("a/b"), m.path("b")).unwrap();
    std::fs::remove_dir(m.path("a")).unwrap();
    // The kernel forgets the removed directory.
    std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    assert_eq!(read(&m.path("b/g")), b"near", "before a restart");
    let m = kill_and_remount(&t, m, &["--sync-lag", "60s"]);
    dog.watch(&m);
    assert_eq!(read(&m.path("b/c/f")), b"deep", "after a restart");
    drain_ok(&m, 30);
    assert_eq!(names(&t.home), ["b"], "home after the drain");
    assert_eq!(std::fs::read(t.home.join("b/c/f")).unwrap(), b"deep");
    m.unmount();
}

/// rmdir of a directory that is at home and whose listing the cache does not hold (never listed, or listed
/// longer than the validity lag ago) must answer, not hang.
#[test]
fn rmdir_of_an_unlisted_home_dir_does_not_hang() {
    let t = TestDir::new("wb-rmdir");
    std::fs::create_dir_all(t.home.join("empty")).unwrap();
    std::fs::create_dir_all(t.home.join("full")).unwrap();
    std::fs::write(t.home.join("full/x"), b"x").unwrap();
    let m = wb_mount(&t, &["--sync-lag", "5s"]);
    let p = m.path("full");
    let r = within(&m, 10, "rmdir of a non-empty home dir", move || std::fs::remove_dir(&p));
    assert_eq!(
        r.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOTEMPTY)),
        "rmdir full: {r:?}"
    );
    let p = m.path("empty");
    within(&m, 10, "rmdir of an empty home dir", move || std::fs::remove_dir(&p)).expect("rmdir empty");
    drain_ok(&m, 30);
    assert_eq!(names(&t.home), ["full"]);
    m.unmount();
}

/// Truncating a file inside a cached block that holds unpushed writes must leave the cache index's entry
/// of that block right: the next mount must not find the block corrupt (dropped and fetched again, or
/// worse, see `kill_9_at_random_points_without_renames_loses_nothing_acknowledged`).
#[test]
fn truncating_a_written_block_keeps_its_cache_index_right() {
    let t = TestDir::new("wb-trunc");
    let mut rng = Rng::new(707);
    let mut want = write_random(&t.home.join("f.bin"), 178_229, &mut rng);
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "the first read");
    // A write past the later truncation point, made durable, then the truncation: no dirty range is left
    // below the new size, so the push after it marks no block clean again.
    let f = OpenOptions::new().write(true).open(m.path("f.bin")).unwrap();
    f.write_all_at(&[b'X'; 1000], 100_000).unwrap();
    f.sync_all().unwrap();
    f.set_len(21_570).unwrap();
    close(f).unwrap();
    want.truncate(21_570);
    drain_ok(&m, 30);
    assert_same_bytes(&read(&t.home.join("f.bin")), &want, "home after the drain");
    m.unmount();

    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    assert_same_bytes(
        &read(&m.path("f.bin")),
        &want,
        "the mount after a clean unmount and mount",
    );
    let st = m.status();
    assert_eq!(
        num(&st, "/cache/corrupt_blocks"),
        0,
        "the cache index disagrees with the cache file after the truncation: {}\n--- daemon log ---\n{}",
        st["cache"],
        m.log()
    );
    m.unmount();
}

/// A directory listed (from home) while the flusher pushes creates into it must still show every entry:
/// each is either at home already or still queued here.
#[test]
fn listing_while_pushes_land_shows_every_entry() {
    let t = TestDir::new("wb-listrace");
    let dog = Watchdog::new(Duration::from_secs(90), "listing_while_pushes_land_shows_every_entry");
    let m = wb_mount(&t, &["--sync-lag", "60s"]);
    dog.watch(&m);
    let n = 200;
    for i in 0..n {
        put(&m.path(&format!("f{i:03}")), b"");
    }
    let out = larder(&["unmount", s(&m.mnt), "--leave-pending"]);
    assert!(out.success(), "larder unmount --leave-pending failed:\n{out}");
    m.disarm();
    // Lag 0: the pushes start at once; validity lag 0: every listing asks home.
    let m = wb_mount(&t, &["--sync-lag", "0s", "--validity-lag", "0s"]);
    dog.watch(&m);
    let mut short = Vec::new();
    let mut listings = 0;
    let started = Instant::now();
    // List as fast as possible until home has them all.
    while started.elapsed() < Duration::from_secs(10) {
        let got = names(&m.mnt);
        listings += 1;
        if got.len() != n {
            short.push(got.len());
        }
        if names(&t.home).len() == n && listings > 5 {
            break;
        }
    }
    drain_ok(&m, 30);
    assert_eq!(names(&m.mnt).len(), n);
    assert!(
        short.is_empty(),
        "{} of {listings} listings taken while the {n} creates were pushed missed entries (they had {short:?})",
        short.len()
    );
    m.unmount();
}
