//! Integration tests of what other users can reach and of what larder tells the people running it, through
//! real FUSE mounts (root with /dev/fuse):
//!
//! * the cache dir and everything in it are the owner's alone: an unprivileged user (`nobody`) can open
//!   nothing there, so a file the mount denies them cannot be read from its cache copies either; a cache
//!   dir found open to others is made private when mounted, with one warning;
//! * `larder status` counts home failures, not home's "no" answers;
//! * `listxattr` gives an empty list;
//! * `larder.log` tells of an outage and the return, a refused change and its setting aside, and a
//!   recovery after `kill -9`, once each, with what was done;
//! * metrics served at an address others can reach come with a warning, on the terminal and in the log;
//! * a user asking about another user's mount is told whose it is; root asks that user's daemon.

mod common;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::FromRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// The unprivileged user the tests act as.
const NOBODY: u32 = 65534;

const SECRET_WRITTEN: &[u8] = b"secret-written-through-the-mount-5b0c1e7a";
const SECRET_AT_HOME: &[u8] = b"secret-kept-at-home-and-read-through-the-mount-93d4aa60";
const SECRET_CONFLICT: &[u8] = b"secret-set-aside-by-a-conflict-2f8e61c9";
const PUBLIC: &[u8] = b"anyone may read this";

/// The test's temporary root, home and mount point opened to every user (the temporary root is 0700),
/// so that another user reaches the cache dir's path and only the cache dir's own modes keep them out.
fn open_to_all(t: &TestDir) {
    for d in [t.root(), &t.home, &t.mnt] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Write `data` to `path` with permission bits `mode` (directly at home, as root).
fn write_with_mode(path: &Path, data: &[u8], mode: u32) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Mount `t` with `extra`, the `larder mount` command started under umask 0, as from a shell whose
/// umask lets everything through.
fn mount_umask0(t: &TestDir, extra: &[&str]) -> Mount {
    match Mount::try_new_with(s(&t.home), &t.mnt, &t.cache, extra, &[], Some(0)) {
        Ok(m) => m,
        Err(out) => panic!(
            "larder mount (umask 0) failed:\n{out}\n--- daemon log ---\n{}",
            log_tail(&t.cache, 60)
        ),
    }
}

/// Every entry under `root`, `root` included, with its metadata (symlinks not followed).
fn entries(root: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = vec![(
        root.to_path_buf(),
        std::fs::symlink_metadata(root).expect("lstat the root"),
    )];
    out.extend(walk(root).into_iter().map(|(rel, m)| (root.join(rel), m)));
    out
}

/// The entries under `root` (included) that are not the owner-only kind larder makes: a directory 0700,
/// anything else 0600, owned by root.
fn not_private(root: &Path) -> Vec<String> {
    entries(root)
        .into_iter()
        .filter(|(_, m)| !m.file_type().is_symlink())
        .filter_map(|(p, m)| {
            let want = if m.is_dir() { 0o700 } else { 0o600 };
            let mode = m.mode() & 0o7777;
            (mode != want || m.uid() != 0).then(|| format!("{} mode {mode:04o} uid {}", p.display(), m.uid()))
        })
        .collect()
}

/// The regular files under `root` whose bytes contain `needle` (read as root).
fn files_holding(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    entries(root)
        .into_iter()
        .filter(|(_, m)| m.is_file())
        .filter(|(p, _)| std::fs::read(p).is_ok_and(|d| contains(&d, needle)))
        .map(|(p, _)| p)
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// What a probe does to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Try {
    /// open(O_RDONLY) and read what it can.
    Read,
    /// open(O_WRONLY) (nothing is written).
    Write,
    /// stat(2).
    Stat,
    /// connect(2) to a unix socket.
    Connect,
}

/// What the unprivileged user got: the errno (0: it worked) and the first bytes read.
#[derive(Debug)]
struct Got {
    errno: i32,
    bytes: Vec<u8>,
}

/// Do each of `targets` as the unprivileged user `nobody` (uid and gid 65534, no supplementary groups),
/// in a forked child that makes raw system calls only.
fn as_nobody(targets: &[(PathBuf, Try)]) -> Vec<Got> {
    let targets = targets.to_vec();
    with_deadline(Duration::from_secs(60), "probing as nobody", move || probe(&targets))
}

fn probe(targets: &[(PathBuf, Try)]) -> Vec<Got> {
    // Everything the child uses is made before the fork: it allocates nothing.
    let paths: Vec<CString> = targets
        .iter()
        .map(|(p, _)| CString::new(p.as_os_str().as_bytes()).expect("path without NUL"))
        .collect();
    let addrs: Vec<libc::sockaddr_un> = targets
        .iter()
        .map(|(p, _)| {
            // SAFETY: sockaddr_un is plain data; zeroed is valid.
            let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            a.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, b) in a.sun_path.iter_mut().zip(p.as_os_str().as_bytes()) {
                *d = *b as libc::c_char;
            }
            a
        })
        .collect();
    let mut buf = vec![0u8; 4096];
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: the child makes only async-signal-safe system calls on memory prepared before the fork,
    // then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above; every pointer passed is to memory valid for the stated length.
        unsafe {
            libc::close(fds[0]);
            let w = fds[1];
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(NOBODY, NOBODY, NOBODY) != 0
                || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0
            {
                libc::_exit(3);
            }
            for (i, (_, how)) in targets.iter().enumerate() {
                let p = paths[i].as_ptr();
                let mut n: usize = 0;
                let errno = match how {
                    Try::Read => {
                        let fd = libc::open(p, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC);
                        if fd < 0 {
                            *libc::__errno_location()
                        } else {
                            let r = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                            if r > 0 {
                                n = r as usize;
                            }
                            libc::close(fd);
                            0
                        }
                    }
                    Try::Write => {
                        let fd = libc::open(p, libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC);
                        if fd < 0 {
                            *libc::__errno_location()
                        } else {
                            libc::close(fd);
                            0
                        }
                    }
                    Try::Stat => {
                        let mut st: libc::stat = std::mem::zeroed();
                        if libc::stat(p, &mut st) < 0 {
                            *libc::__errno_location()
                        } else {
                            0
                        }
                    }
                    Try::Connect => {
                        let sock = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                        let r = libc::connect(
                            sock,
                            (&addrs[i] as *const libc::sockaddr_un).cast(),
                            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                        );
                        let e = if r < 0 { *libc::__errno_location() } else { 0 };
                        libc::close(sock);
                        e
                    }
                };
                let head = [errno as u32, n as u32];
                if !write_all(w, head.as_ptr().cast(), 8) || !write_all(w, buf.as_ptr(), n) {
                    libc::_exit(4);
                }
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end; the read end becomes a File owned here.
    let mut r = unsafe {
        libc::close(fds[1]);
        std::fs::File::from_raw_fd(fds[0])
    };
    let mut out = Vec::new();
    r.read_to_end(&mut out).expect("read the probe's answers");
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the probe as nobody failed (wait status {status:#x}; 3: could not become nobody)"
    );
    let mut got = Vec::new();
    let mut at = 0;
    while at < out.len() {
        let word = |i: usize| u32::from_ne_bytes(out[i..i + 4].try_into().unwrap());
        let (errno, n) = (word(at) as i32, word(at + 4) as usize);
        got.push(Got {
            errno,
            bytes: out[at + 8..at + 8 + n].to_vec(),
        });
        at += 8 + n;
    }
    assert_eq!(got.len(), targets.len(), "the probe answered for some targets only");
    got
}

/// write(2) all of `len` bytes at `p` to `fd`; async-signal-safe.
unsafe fn write_all(fd: i32, mut p: *const u8, mut len: usize) -> bool {
    while len > 0 {
        // SAFETY: the caller passes memory valid for `len` bytes.
        let r = unsafe { libc::write(fd, p.cast(), len) };
        if r <= 0 {
            return false;
        }
        len -= r as usize;
        // SAFETY: within the same buffer.
        p = unsafe { p.add(r as usize) };
    }
    true
}

fn errno_name(e: i32) -> String {
    if e == 0 {
        "success".into()
    } else {
        std::io::Error::from_raw_os_error(e).to_string()
    }
}

/// As nobody: every entry of the cache dir (the dir itself included) refuses to open, for reading and,
/// files, for writing, with EACCES; the control socket refuses a connection; and no secret comes back.
/// Returns the failures, one line each.
fn nobody_is_kept_out(cache: &Path, socket: &Path, secrets: &[&[u8]]) -> Vec<String> {
    let mut targets = Vec::new();
    for (p, m) in entries(cache) {
        targets.push((p.clone(), Try::Read));
        if !m.is_dir() {
            targets.push((p, Try::Write));
        }
    }
    targets.push((socket.to_path_buf(), Try::Connect));
    let got = as_nobody(&targets);
    let mut bad = Vec::new();
    for ((p, how), g) in targets.iter().zip(&got) {
        if g.errno != libc::EACCES {
            bad.push(format!(
                "{how:?} {}: {} (want EACCES)",
                p.display(),
                errno_name(g.errno)
            ));
        }
        if secrets.iter().any(|s| contains(&g.bytes, s)) {
            bad.push(format!("{how:?} {}: nobody read a secret", p.display()));
        }
    }
    bad
}

/// Lines of the daemon log in `cache` that contain `what`.
fn log_lines(cache: &Path, what: &str) -> Vec<String> {
    std::fs::read_to_string(cache.join("larder.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_string)
        .collect()
}

#[test]
fn an_unprivileged_user_reads_nothing_through_the_cache_dir() {
    let t = TestDir::new("privacy-nobody");
    open_to_all(&t);
    write_with_mode(&t.home.join("public.txt"), PUBLIC, 0o644);
    write_with_mode(&t.home.join("at-home-private"), SECRET_AT_HOME, 0o600);
    write_with_mode(&t.home.join("contested"), b"v0", 0o600);
    let m = mount_umask0(
        &t,
        &[
            "--write-mode",
            "write-back",
            "--sync-lag",
            "30s",
            "--validity-lag",
            "60s",
            "--conflict-policy",
            "home-wins",
        ],
    );

    // A private file written through the mount and read back: its bytes are in the cache.
    let private = m.path("private");
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&private)
        .unwrap();
    f.write_all(SECRET_WRITTEN).unwrap();
    drop(f);
    assert_eq!(read(&private), SECRET_WRITTEN);
    assert_eq!(std::fs::metadata(&private).unwrap().mode() & 0o777, 0o600);
    // A private file home has, read through the mount (a small file: kept in the content store).
    assert_eq!(read(&m.path("at-home-private")), SECRET_AT_HOME);
    assert_eq!(read(&m.path("public.txt")), PUBLIC);
    // A private file changed here while home changed it too: home wins, and the cache's version is kept
    // in the cache dir's conflicts area.
    assert_eq!(read(&m.path("contested")), b"v0");
    std::fs::write(m.path("contested"), SECRET_CONFLICT).unwrap();
    let hf = t.home.join("contested");
    let mt = mtime_secs(&hf);
    std::fs::write(&hf, b"home-change").unwrap();
    set_mtime(&hf, mt + 100);
    drain_ok(&m, 30);
    assert_eq!(
        num(&m.status(), "/journal/conflicts"),
        1,
        "the conflict was not recorded"
    );

    // The secrets are in the cache dir (else the rest proves nothing).
    let secrets = [SECRET_WRITTEN, SECRET_AT_HOME, SECRET_CONFLICT];
    for s in secrets {
        assert!(
            !files_holding(&m.cache, s).is_empty(),
            "{} is nowhere in the cache dir: this test would prove nothing",
            String::from_utf8_lossy(s)
        );
    }
    assert!(
        m.cache.join("conflicts/conflicts.jsonl").exists(),
        "no conflicts.jsonl in the cache dir"
    );

    // Owner-only, however wide the umask of whoever mounted it.
    let wide = not_private(&m.cache);
    assert!(
        wide.is_empty(),
        "entries of the cache dir open to others:\n{}",
        wide.join("\n")
    );
    let socket = socket_path(&m.mnt);
    let sock_dir = socket.parent().unwrap();
    for (p, want) in [(sock_dir, 0o700), (socket.as_path(), 0o600)] {
        let meta = std::fs::metadata(p).unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.uid()),
            (want, 0),
            "{} is not owner-only",
            p.display()
        );
    }

    // What the mount lets nobody do, and what it denies them: the probe really is another user, and the
    // cache dir's path is within their reach.
    let controls = [
        (m.path("public.txt"), Try::Read),
        (m.path("private"), Try::Read),
        (m.path("at-home-private"), Try::Read),
        (m.cache.clone(), Try::Stat),
    ];
    let got = as_nobody(&controls);
    assert_eq!(
        got[0].errno,
        0,
        "nobody cannot read public.txt: {}",
        errno_name(got[0].errno)
    );
    assert_eq!(got[0].bytes, PUBLIC);
    for g in &got[1..3] {
        assert_eq!(g.errno, libc::EACCES, "the mount let nobody open a 0600 file of root");
    }
    assert_eq!(
        got[3].errno, 0,
        "nobody cannot even reach the cache dir: the test would prove nothing"
    );

    let bad = nobody_is_kept_out(&m.cache, &socket, &secrets);
    assert!(bad.is_empty(), "nobody got into the cache dir:\n{}", bad.join("\n"));
    m.unmount();
}

#[test]
fn a_cache_dir_found_open_to_others_is_made_private_when_mounted() {
    let t = TestDir::new("privacy-fix");
    open_to_all(&t);
    write_with_mode(&t.home.join("at-home-private"), SECRET_AT_HOME, 0o600);
    let m = t.mount(&[]);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(m.path("private"))
        .unwrap();
    f.write_all(SECRET_WRITTEN).unwrap();
    drop(f);
    assert_eq!(read(&m.path("private")), SECRET_WRITTEN);
    assert_eq!(read(&m.path("at-home-private")), SECRET_AT_HOME);
    m.unmount();
    assert!(
        log_lines(&t.cache, "made it owner-only").is_empty(),
        "a cache dir larder made itself needed fixing"
    );

    // As an older larder (or a hand) left it: a conflicts area, and everything open to everyone.
    std::fs::create_dir(t.cache.join("conflicts")).unwrap();
    std::fs::write(t.cache.join("conflicts/20250101T000000Z-7-private"), SECRET_WRITTEN).unwrap();
    std::fs::write(t.cache.join("conflicts/conflicts.jsonl"), b"").unwrap();
    let mut widened = 0;
    for (p, m) in entries(&t.cache) {
        let mode = if m.is_dir() { 0o777 } else { 0o666 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        widened += 1;
    }
    assert!(widened >= 8, "the cache dir holds only {widened} entries");
    assert_eq!(not_private(&t.cache).len(), widened);

    let m = mount_umask0(&t, &[]);
    let wide = not_private(&m.cache);
    assert!(
        wide.is_empty(),
        "still open to others after the mount:\n{}",
        wide.join("\n")
    );
    let warned = log_lines(&t.cache, "made it owner-only");
    assert_eq!(warned.len(), 1, "want one warning line, got: {warned:#?}");
    for name in [
        "objects",
        "index.redb",
        "lock",
        "larder.log",
        "conflicts",
        "mode 0777",
        "mode 0666",
    ] {
        assert!(
            warned[0].contains(name),
            "the warning does not name {name}: {}",
            warned[0]
        );
    }
    let bad = nobody_is_kept_out(&m.cache, &socket_path(&m.mnt), &[SECRET_WRITTEN, SECRET_AT_HOME]);
    assert!(bad.is_empty(), "nobody got into the cache dir:\n{}", bad.join("\n"));
    assert_eq!(
        read(&m.path("private")),
        SECRET_WRITTEN,
        "the cache no longer serves its data"
    );
    m.unmount();

    // Nothing more to fix next time.
    let m = t.mount(&[]);
    m.unmount();
    assert_eq!(log_lines(&t.cache, "made it owner-only").len(), 1);
}

#[test]
fn home_answers_are_not_home_failures() {
    let t = TestDir::new("privacy-answers");
    std::fs::create_dir(t.home.join("full")).unwrap();
    std::fs::write(t.home.join("full/f"), b"x").unwrap();
    let fault = t.root().join("home-is-down");
    let m = t.mount(&["--fault-file", s(&fault), "--validity-lag", "0"]);
    let before = m.status();

    // Lookups home answers "not found", an rmdir it answers "not empty".
    for i in 0..20 {
        let e = std::fs::metadata(m.path(&format!("missing-{i}"))).expect_err("a missing name");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }
    let e = std::fs::remove_dir(m.path("full")).expect_err("rmdir of a full directory");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    let after = m.status();
    assert!(
        num(&after, "/home/ops") >= num(&before, "/home/ops") + 20,
        "the lookups did not reach home: {} then {}",
        before["home"],
        after["home"]
    );
    assert_eq!(
        num(&after, "/home/errors"),
        num(&before, "/home/errors"),
        "home's answers were counted as failures: {} then {}",
        before["home"],
        after["home"]
    );
    let table = larder(&["status", s(&m.mnt)]);
    let line = table
        .stdout
        .lines()
        .find(|l| l.starts_with("home ops"))
        .unwrap_or_default();
    assert!(
        line.ends_with(&format!("({} failed)", num(&after, "/home/errors"))),
        "{line}"
    );

    // A real failure still counts.
    std::fs::write(&fault, b"").unwrap();
    let e = std::fs::metadata(m.path("missing-while-down")).expect_err("home is down");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let down = m.status();
    assert!(
        num(&down, "/home/errors") > num(&after, "/home/errors"),
        "a failed home call was not counted: {} then {}",
        after["home"],
        down["home"]
    );
    std::fs::remove_file(&fault).unwrap();
    wait_online(&m, 10, "after the fault file went");
    m.unmount();
}

#[test]
fn extended_attributes_of_objects_without_any_list_empty() {
    let t = TestDir::new("privacy-xattr");
    std::fs::write(t.home.join("f"), b"data").unwrap();
    let m = t.mount(&[]);
    for p in [m.path("f"), m.path("")] {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        let mut buf = [0u8; 256];
        // SAFETY: valid path; a null buffer with size 0 asks for the size.
        let size = unsafe { libc::listxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
        assert_eq!(
            size,
            0,
            "listxattr size of {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        // SAFETY: valid path and buffer of the given length.
        let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(
            n,
            0,
            "listxattr of {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        // Namespaces larder would have to enforce (labels, capabilities, ACLs) are refused, as by a file
        // system without them.
        let name = CString::new("security.larder-test").unwrap();
        // SAFETY: valid path, name and value.
        let r = unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
        let e = std::io::Error::last_os_error();
        assert_eq!((r, e.raw_os_error()), (-1, Some(libc::EOPNOTSUPP)), "setxattr: {e}");
    }
    // The way tools see it: Python's os.listxattr, where Python is installed.
    if let Ok(out) = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys; print(os.listxattr(sys.argv[1]))",
            s(&m.path("f")),
        ])
        .output()
    {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    }
    // Writes still work.
    std::fs::write(m.path("f"), b"new data").unwrap();
    assert_eq!(read(&m.path("f")), b"new data");
    m.unmount();
}

#[test]
fn the_log_tells_of_an_outage_once_each_way() {
    let t = TestDir::new("privacy-outage");
    std::fs::write(t.home.join("cached.txt"), b"cached").unwrap();
    std::fs::write(t.home.join("uncached.txt"), b"uncached").unwrap();
    let fault = t.root().join("home-is-down");
    let m = t.mount_with_fault(&fault, &["--validity-lag", "60s"]);
    assert_eq!(read(&m.path("cached.txt")), b"cached");
    assert_eq!(names(&m.path("")), ["cached.txt", "uncached.txt"]);
    std::fs::write(&fault, b"").unwrap();
    let e = std::fs::read(m.path("uncached.txt")).expect_err("home is down");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        wait_until(Duration::from_secs(5), || m.status()["home"]["state"] == "offline"),
        "home did not go offline"
    );
    // Work goes on: a read from the cache, a change queued; more calls home would fail.
    assert_eq!(read(&m.path("cached.txt")), b"cached");
    std::fs::write(m.path("written-offline.txt"), b"queued").unwrap();
    for i in 0..3 {
        let _ = std::fs::metadata(m.path(&format!("unknown-{i}")));
    }
    std::thread::sleep(Duration::from_secs(3));
    std::fs::remove_file(&fault).unwrap();
    wait_online(&m, 10, "after the fault file went");
    drain_ok(&m, 30);
    assert_eq!(read(&t.home.join("written-offline.txt")), b"queued");

    let away = log_lines(&t.cache, "home is unreachable");
    assert_eq!(away.len(), 1, "want one line for the outage: {away:#?}\n{}", m.log());
    for what in ["working offline", "cached data", "changes are kept", "queued"] {
        assert!(
            away[0].contains(what),
            "the outage line does not say '{what}': {}",
            away[0]
        );
    }
    let back = log_lines(&t.cache, "home is reachable again");
    assert_eq!(back.len(), 1, "want one line for the return: {back:#?}\n{}", m.log());
    for what in ["s offline", "pushing the", "queued changes"] {
        assert!(
            back[0].contains(what),
            "the return line does not say '{what}': {}",
            back[0]
        );
    }
    m.unmount();
}

#[test]
fn the_log_tells_of_a_refused_change_once_then_of_setting_it_aside() {
    let t = TestDir::new("privacy-refused");
    std::fs::create_dir(t.home.join("d")).unwrap();
    let m = t.mount(&[
        "--write-mode",
        "write-back",
        "--sync-lag",
        "0s",
        "--validity-lag",
        "600s",
    ]);
    assert!(names(&m.path("d")).is_empty());
    // Home fills the directory behind the cached (empty) listing; the rmdir made here is refused there.
    std::fs::write(t.home.join("d/arrived-at-home"), b"x").unwrap();
    std::fs::remove_dir(m.path("d")).unwrap();
    let attempts = || {
        let out = larder(&["conflicts", s(&m.mnt), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
        v["failed_ops"]
            .as_array()
            .and_then(|a| a.first().cloned())
            .and_then(|f| f[3].as_u64().or_else(|| f["attempts"].as_u64()))
            .unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(20), || attempts() >= 3),
        "home did not refuse the rmdir three times: {}",
        larder(&["conflicts", s(&m.mnt), "--json"]).stdout
    );
    let refused = log_lines(&t.cache, "home refused a change");
    assert_eq!(refused.len(), 1, "want one line for the refusals: {refused:#?}");
    for what in ["rmdir", "d", "not empty", "retried", "set aside"] {
        assert!(
            refused[0].contains(what),
            "the refusal line does not say '{what}': {}",
            refused[0]
        );
    }
    // After six refusals (1 + 2 + 4 + 8 + 16 s of backoff) it is set aside and the queue moves on.
    assert!(
        wait_until(Duration::from_secs(60), || num(&m.status(), "/journal/conflicts") == 1),
        "the refused rmdir was not set aside: {}",
        m.status()["journal"]
    );
    assert_eq!(num(&m.status(), "/journal/pending_ops"), 0);
    let aside = log_lines(&t.cache, "set aside so the queue moves on");
    assert_eq!(aside.len(), 1, "want one line for setting it aside: {aside:#?}");
    assert!(aside[0].contains("6 times"), "{}", aside[0]);
    assert_eq!(log_lines(&t.cache, "home refused a change").len(), 1);
    m.unmount();
}

#[test]
fn the_log_tells_of_recovery_after_kill_9() {
    let t = TestDir::new("privacy-recovery");
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "600s"]);
    for i in 0..3 {
        std::fs::write(m.path(&format!("f{i}")), format!("pending {i}")).unwrap();
    }
    assert!(num(&m.status(), "/journal/pending_ops") >= 3);
    assert!(log_lines(&t.cache, "unclean stop").is_empty());
    signal(m.pid, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(m.pid)),
        "the daemon survived SIGKILL"
    );
    m.disarm();

    let args = ["--write-mode", "write-back", "--sync-lag", "600s"];
    let m = Mount::try_new(&t.home, &t.mnt, &t.cache, &args).unwrap_or_else(|out| {
        eprintln!("mounting over the dead mount failed ({out}); lazily unmounting it and retrying");
        let c = CString::new(t.mnt.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        t.mount(&args)
    });
    let found = log_lines(&t.cache, "unclean stop");
    assert_eq!(found.len(), 1, "want one recovery line: {found:#?}\n{}", m.log());
    for what in ["queued changes kept", "files with unpushed data", "nothing refers to"] {
        assert!(
            found[0].contains(what),
            "the recovery line does not say '{what}': {}",
            found[0]
        );
    }
    let pending: u64 = found[0]
        .split_once("pending_changes=")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        pending >= 3,
        "the recovery line counts {pending} pending changes: {}",
        found[0]
    );
    drain_ok(&m, 30);
    for i in 0..3 {
        assert_eq!(read(&t.home.join(format!("f{i}"))), format!("pending {i}").as_bytes());
    }
    m.unmount();

    // A clean stop is no crash.
    let m = t.mount(&["--write-mode", "write-back"]);
    m.unmount();
    assert_eq!(log_lines(&t.cache, "unclean stop").len(), 1);
}

/// A TCP port where nothing listens now (bound on every address, then released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("0.0.0.0:0").expect("bind a port");
    l.local_addr().expect("local addr").port()
}

#[test]
fn metrics_served_beyond_loopback_come_with_a_warning_on_the_terminal_and_in_the_log() {
    let t = TestDir::new("privacy-metrics");
    let warning = "can be read by anyone who can reach that address";
    // `larder mount` itself, to see what it prints before the daemon detaches.
    let mount = |addr: &str| -> (Output, Mount) {
        let out = larder(&[
            "mount",
            s(&t.home),
            s(&t.mnt),
            "--cache-dir",
            s(&t.cache),
            "--metrics-addr",
            addr,
        ]);
        assert!(
            out.success(),
            "larder mount --metrics-addr {addr} failed:\n{out}\n--- daemon log ---\n{}",
            log_tail(&t.cache, 40)
        );
        (out, Mount::adopt(&t.mnt, &t.cache, None))
    };
    let public = format!("0.0.0.0:{}", free_port());
    let (out, m) = mount(&public);
    let said: Vec<&str> = out.stderr.lines().filter(|l| l.contains(warning)).collect();
    assert_eq!(said.len(), 1, "want one warning on the terminal:\n{out}");
    assert!(
        said[0].starts_with("larder: warning: ") && said[0].contains(&public) && said[0].contains("127.0.0.1:"),
        "the warning names neither the address nor a loopback one: {}",
        said[0]
    );
    let logged = log_lines(&t.cache, warning);
    assert_eq!(logged.len(), 1, "want one warning in the log:\n{}", m.log());
    assert!(
        logged[0].contains("WARN") && logged[0].contains(&public),
        "{}",
        logged[0]
    );
    m.unmount();

    let (out, m) = mount(&format!("127.0.0.1:{}", free_port()));
    assert!(
        !out.stderr.contains(warning),
        "a loopback address was warned of:\n{out}"
    );
    assert_eq!(
        log_lines(&t.cache, warning).len(),
        1,
        "a loopback address was warned of in the log"
    );
    m.unmount();
}

/// `larder ARGS` run as the user `uid` (its group too, no supplementary groups).
fn larder_as(uid: u32, args: &[&str]) -> Output {
    let (reuid, regid) = (format!("--reuid={uid}"), format!("--regid={uid}"));
    let mut argv = vec![reuid.as_str(), regid.as_str(), "--clear-groups", LARDER];
    argv.extend_from_slice(args);
    run_cmd("setpriv", &argv, COMMAND_DEADLINE)
}

#[test]
fn another_users_larder_commands_are_told_whose_mount_it_is() {
    let t = TestDir::new("privacy-owner");
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "600s"]);
    let whose = format!("{} is a larder mount of user root", m.mnt.display());
    let commands: [&[&str]; 7] = [
        &["status"],
        &["status", "--json"],
        &["drain"],
        &["conflicts"],
        &["evict", "-r"],
        &["prefetch"],
        &["pin"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push(s(&m.mnt));
        let out = larder_as(NOBODY, &args);
        assert_cli_error(
            &out,
            &[
                &whose,
                "only that user (or root) can ask its daemon",
                "run the command as that user",
            ],
        );
    }
    assert!(larder(&["status", s(&m.mnt)]).success(), "its owner can no longer ask");
    m.unmount();
}

/// What `root_asks_the_daemon_of_another_users_mount` runs in a mount namespace of its own: there
/// /dev/fuse is a node open to every user (on the host it may be root's alone), so `nobody` can mount.
/// Its daemon keeps its control socket under the test's own `run/` (its `XDG_RUNTIME_DIR`), where root
/// finds it among the sockets bound. `run NAME CMD...` prints `== NAME EXIT` and the command's output.
const USERS_MOUNT_SCRIPT: &str = r#"
set -u
L=$1 R=$2
run() { name=$1; shift; out=$("$@" 2>&1); echo "== $name $?"; echo "$out"; }
as() { uid=$1; shift; setpriv --reuid="$uid" --regid="$uid" --clear-groups "$@"; }
trap '"$L" unmount "$R/mnt" --leave-pending >/dev/null 2>&1 || umount -l "$R/mnt" 2>/dev/null' EXIT
mknod "$R/fuse" c 10 229 && chmod 666 "$R/fuse" && mount --bind "$R/fuse" /dev/fuse || exit 97
run mount as 65534 env XDG_RUNTIME_DIR="$R/run" "$L" mount "$R/home" "$R/mnt" --cache-dir "$R/cache" \
    --write-mode write-back --sync-lag 600s
run write as 65534 sh -c "echo written-by-nobody > '$R/mnt/f'"
run root-status "$L" status "$R/mnt" --json
run root-mount-over "$L" mount "$R/home" "$R/mnt" --cache-dir "$R/cache2" --write-mode write-back
run root-status-after "$L" status "$R/mnt" --json
run daemon-status as 1 "$L" status "$R/mnt"
run root-drain "$L" drain "$R/mnt"
run root-unmount "$L" unmount "$R/mnt"
"#;

#[test]
fn root_asks_the_daemon_of_another_users_mount_and_a_third_user_is_told_whose_it_is() {
    let t = TestDir::new("privacy-users-mount");
    open_to_all(&t);
    let run = t.root().join("run");
    for d in [&t.cache, &run] {
        std::fs::create_dir(d).unwrap();
    }
    for d in [&t.home, &t.mnt, &t.cache, &run] {
        std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let out = run_cmd(
        "unshare",
        &[
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            USERS_MOUNT_SCRIPT,
            "sh",
            LARDER,
            s(t.root()),
        ],
        Duration::from_secs(120),
    );
    assert!(out.success(), "the script failed:\n{out}");
    // Each step's exit status and output, by name.
    let steps: std::collections::HashMap<&str, (i32, String)> = out
        .stdout
        .split("== ")
        .skip(1)
        .filter_map(|step| {
            let (head, output) = step.split_once('\n').unwrap_or((step, ""));
            let (name, code) = head.split_once(' ')?;
            Some((name, (code.trim().parse().ok()?, output.to_string())))
        })
        .collect();
    let step = |name: &str| {
        steps
            .get(name)
            .unwrap_or_else(|| panic!("the script ran no step {name}:\n{out}"))
    };
    for name in ["mount", "write"] {
        assert_eq!(step(name).0, 0, "{name} as nobody failed:\n{out}");
    }
    let (code, status) = step("root-status");
    assert_eq!(*code, 0, "root could not ask nobody's daemon:\n{out}");
    let status: serde_json::Value =
        serde_json::from_str(status).unwrap_or_else(|e| panic!("root's status is not JSON ({e}):\n{out}"));
    assert!(status["pid"].as_u64().is_some_and(|p| p > 0), "{status}");
    // Root mounting over it is refused: the live mount of another user is not taken for a dead one.
    let (code, said) = step("root-mount-over");
    assert_ne!(*code, 0, "root mounted over nobody's live mount:\n{out}");
    assert!(
        said.contains("already serves"),
        "root's mount over it was refused otherwise:\n{out}"
    );
    assert_eq!(
        step("root-status-after").0,
        0,
        "nobody's mount did not survive root's attempt:\n{out}"
    );
    let (code, said) = step("daemon-status");
    assert_ne!(*code, 0, "a third user was answered:\n{out}");
    let mnt = t.mnt.display().to_string();
    assert!(
        said.contains(&format!("{mnt} is a larder mount of user nobody")),
        "a third user was not told whose mount it is:\n{out}"
    );
    assert_eq!(step("root-drain").0, 0, "root could not drain nobody's mount:\n{out}");
    assert_eq!(read(&t.home.join("f")), b"written-by-nobody\n");
    assert_eq!(
        step("root-unmount").0,
        0,
        "root could not unmount nobody's mount:\n{out}"
    );
}
