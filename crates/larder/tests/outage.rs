//! Integration tests of home going away and coming back: run as root with /dev/fuse.
//!
//! A home that is itself a mount can die and be mounted again, or have something mounted over it; larder
//! follows the home's path. While home is away, new names can be made anywhere the cache knows the
//! directory, and are checked against home when it is back.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// A write-back mount of `home` at `mnt` with its cache in `cache`.
fn wb_mount(home: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
    let mut args = vec!["--write-mode", "write-back"];
    args.extend_from_slice(extra);
    Mount::new(home, mnt, cache, &args)
}

/// Create the directories `dirs` under `root`; returns their paths.
fn make_dirs<const N: usize>(root: &Path, dirs: [&str; N]) -> [PathBuf; N] {
    dirs.map(|d| {
        let p = root.join(d);
        std::fs::create_dir_all(&p).expect("create test dir");
        p
    })
}

/// A bind mount of one directory over another, undone when dropped.
struct Bind(PathBuf);

impl Bind {
    fn new(source: &Path, target: &Path) -> Bind {
        let (src, dst) = (cstr(source), cstr(target));
        // SAFETY: valid NUL-terminated paths; a bind mount takes no file system type or data.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "mount --bind: {}", std::io::Error::last_os_error());
        Bind(target.to_path_buf())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let c = cstr(&self.0);
        // SAFETY: a valid NUL-terminated path.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path")
}

/// The errno of `f`'s error, failing the test if it succeeds or hangs.
fn errno_of<T: Send + 'static>(what: &str, f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> i32 {
    match with_deadline(Duration::from_secs(10), what, f) {
        Ok(_) => panic!("{what} succeeded"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: {e} carries no errno")),
    }
}

fn wait_offline(m: &Mount, secs: u64, what: &str) {
    assert!(
        wait_until(Duration::from_secs(secs), || m.status()["home"]["state"] == "offline"),
        "home did not go offline {what}: {}",
        m.status()["home"]
    );
}

/// Home is a larder mount (write-through, of a plain directory) whose daemon is killed and which is then
/// mounted again at the same path: the larder in front of it reopens its home, goes online and pushes what
/// was queued meanwhile, without being remounted itself.
#[test]
fn home_mount_killed_and_mounted_again_is_reconnected() {
    let t = TestDir::new("outage-remount");
    // t.home: the plain directory; t.mnt: the home mount of it; under-test mount and cache beside.
    let [mnt, cache] = make_dirs(t.root(), ["under-test", "under-test-cache"]);
    std::fs::write(t.home.join("a.txt"), b"alpha").unwrap();
    std::fs::create_dir(t.home.join("old")).unwrap();
    let home_mount = t.mount(&["--write-mode", "write-through"]);
    let m = wb_mount(&t.mnt, &mnt, &cache, &["--sync-lag", "1s", "--validity-lag", "1s"]);
    assert_eq!(names(&m.path("")), ["a.txt", "old"]);
    assert_eq!(read(&m.path("a.txt")), b"alpha");

    // The home mount dies: its root answers ENOTCONN from now on.
    signal(home_mount.pid, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(home_mount.pid)),
        "the home mount's daemon survived SIGKILL"
    );
    let home_pid = home_mount.pid;
    home_mount.disarm();
    let dead = t.mnt.clone();
    assert_eq!(
        errno_of("stat of the dead home mount", move || std::fs::metadata(&dead)),
        libc::ENOTCONN
    );

    // Changes queue on the mount in front of it; the first push finds home unreachable.
    std::fs::write(m.path("new.txt"), b"written while home was dead").unwrap();
    std::fs::create_dir(m.path("made")).unwrap();
    std::fs::write(m.path("made/inner.txt"), b"inner").unwrap();
    std::fs::rename(m.path("a.txt"), m.path("b.txt")).unwrap();
    wait_offline(&m, 15, "after its home mount died");
    // A few failed probes against the dead mount.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(m.status()["home"]["state"], "offline");

    // The dead mount is cleared before the home is mounted again: for a while the path names the empty
    // directory beneath. That is not the home: larder stays offline and puts nothing there.
    let out = run_cmd("umount", &["-l", s(&t.mnt)], Duration::from_secs(30));
    assert!(out.success(), "umount -l of the dead home mount: {out}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        m.status()["home"]["state"],
        "offline",
        "the directory beneath the home's mount was taken for the home"
    );
    assert_eq!(
        names(&t.mnt),
        Vec::<String>::new(),
        "changes landed beneath the home's mount"
    );

    // The home is mounted again at the same path (larder mount clears the dead one).
    let home_again = Mount::new(&t.home, &t.mnt, &t.cache, &["--write-mode", "write-through"]);
    assert_ne!(home_again.pid, home_pid);
    let remounted = Instant::now();
    wait_online(&m, 10, "after its home was mounted again");
    eprintln!("home online again {:?} after the remount", remounted.elapsed());
    drain_ok(&m, 20);
    eprintln!("drained {:?} after the remount", remounted.elapsed());

    assert_eq!(names(&t.home), ["b.txt", "made", "new.txt", "old"]);
    assert_eq!(read(&t.home.join("new.txt")), b"written while home was dead");
    assert_eq!(read(&t.home.join("made/inner.txt")), b"inner");
    assert_eq!(read(&t.home.join("b.txt")), b"alpha");
    assert_eq!(m.status()["journal"]["conflicts"], 0, "{}", m.status());
    m.unmount();
    home_again.unmount();
}

/// A directory mounted over the home (`mount --bind OTHER HOME`) is followed: after the validity lag, the
/// mount shows OTHER and changes go to it; when the bind mount goes, larder follows the path back.
#[test]
fn mount_over_home_is_followed() {
    let t = TestDir::new("outage-bind");
    let [other] = make_dirs(t.root(), ["other"]);
    std::fs::write(t.home.join("a.txt"), b"the home's a").unwrap();
    std::fs::write(other.join("a.txt"), b"OTHER's a, longer").unwrap();
    std::fs::write(other.join("only-other.txt"), b"o").unwrap();
    let m = t.mount(&["--write-mode", "write-back", "--validity-lag", "1s", "--sync-lag", "1s"]);
    assert_eq!(read(&m.path("a.txt")), b"the home's a");
    assert_eq!(names(&m.path("")), ["a.txt"]);

    let bind = Bind::new(&other, &t.home);
    let started = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::read(m.path("a.txt"))
            .is_ok_and(|d| d == b"OTHER's a, longer")),
        "the mount still shows the home under the bind mount: {:?}",
        std::fs::read(m.path("a.txt"))
    );
    eprintln!("the mount showed the bind mount after {:?}", started.elapsed());
    // The listing was cached a moment after the file: it may stay fresh that much longer.
    assert!(
        wait_until(Duration::from_secs(3), || names(&m.path(""))
            == ["a.txt", "only-other.txt"]),
        "the listing still shows the home under the bind mount: {:?}",
        names(&m.path(""))
    );
    std::fs::write(m.path("new.txt"), b"to other").unwrap();
    drain_ok(&m, 20);
    assert_eq!(read(&other.join("new.txt")), b"to other");
    assert_eq!(m.status()["home"]["state"], "online");

    drop(bind);
    assert!(
        !t.home.join("new.txt").exists(),
        "new.txt went to the directory under the bind mount"
    );
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::read(m.path("a.txt"))
            .is_ok_and(|d| d == b"the home's a")),
        "the mount did not follow the path back once the bind mount went"
    );
    assert!(
        wait_until(Duration::from_secs(3), || names(&m.path("")) == ["a.txt"]),
        "the listing did not follow the path back: {:?}",
        names(&m.path(""))
    );
    m.unmount();
}

/// With home away, names the cache does not know can be made in any directory the cache knows, listed or
/// not: a file, a directory, a rename's target. They land at home when it is back. Unknown names look
/// absent (ENOENT) and that answer is not kept: once home is back they are asked again.
#[test]
fn offline_new_names_in_an_unlisted_directory_are_queued() {
    let t = TestDir::new("outage-newnames");
    std::fs::write(t.home.join("a.txt"), b"alpha").unwrap();
    std::fs::create_dir(t.home.join("seen")).unwrap();
    std::fs::write(t.home.join("seen/uncached.txt"), b"looked up, never read").unwrap();
    std::fs::create_dir(t.home.join("never")).unwrap();
    std::fs::write(t.home.join("never/unknown.txt"), b"never looked up").unwrap();
    let fault = t.root().join("home-is-down");
    let m = t.mount_with_fault(&fault, &["--validity-lag", "60s"]);
    // Known before the outage: a.txt (read), seen/uncached.txt (looked up), and every name of the root
    // and of `seen` (a lookup lists its directory); nothing in `never` was looked up: it is not listed.
    assert_eq!(read(&m.path("a.txt")), b"alpha");
    assert!(m.path("seen/uncached.txt").exists());

    std::fs::write(&fault, b"").unwrap();
    // An unknown name looks absent while home is away: that is what lets it be created.
    let p = m.path("never/unknown.txt");
    assert_eq!(
        errno_of("stat of an unknown name offline", move || std::fs::metadata(&p)),
        libc::ENOENT
    );
    wait_offline(&m, 5, "after the fault file appeared");
    // What needs home and is not cached fails with EIO: data never read, a listing never taken.
    let p = m.path("seen/uncached.txt");
    assert_eq!(
        errno_of("reading uncached data offline", move || std::fs::read(&p)),
        libc::EIO
    );
    let p = m.path("never");
    assert_eq!(
        errno_of("listing a directory never listed, offline", move || std::fs::read_dir(
            &p
        )),
        libc::EIO
    );

    // Every change to names is accepted and queued.
    std::fs::write(m.path("new.txt"), b"x").unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/inside.txt"), b"inside").unwrap();
    std::fs::write(m.path("never/new.txt"), b"made in a directory never listed").unwrap();
    std::fs::rename(m.path("a.txt"), m.path("b.txt")).unwrap();
    std::os::unix::fs::symlink("new.txt", m.path("link")).unwrap();
    assert_eq!(read(&m.path("new.txt")), b"x");
    assert_eq!(read(&m.path("link")), b"x");
    assert_eq!(read(&m.path("b.txt")), b"alpha");
    assert_eq!(names(&m.path("d")), ["inside.txt"]);
    let p = m.path("a.txt");
    assert_eq!(
        errno_of("stat of the rename's source", move || std::fs::metadata(&p)),
        libc::ENOENT
    );
    // An object the cache does not know cannot be changed: it looks absent.
    let p = m.path("never/unknown.txt");
    assert_eq!(
        errno_of("removing an unknown name offline", move || std::fs::remove_file(&p)),
        libc::ENOENT
    );
    assert_eq!(m.status()["home"]["state"], "offline");

    std::fs::remove_file(&fault).unwrap();
    wait_online(&m, 10, "after the fault file went");
    // The ENOENT given offline was not kept by the kernel nor by larder.
    assert_eq!(read(&m.path("never/unknown.txt")), b"never looked up");
    drain_ok(&m, 20);
    assert_eq!(names(&t.home), ["b.txt", "d", "link", "never", "new.txt", "seen"]);
    assert_eq!(names(&t.home.join("never")), ["new.txt", "unknown.txt"]);
    assert_eq!(std::fs::read_link(t.home.join("link")).unwrap(), Path::new("new.txt"));
    assert_eq!(read(&t.home.join("new.txt")), b"x");
    assert_eq!(read(&t.home.join("d/inside.txt")), b"inside");
    assert_eq!(read(&t.home.join("b.txt")), b"alpha");
    assert_eq!(names(&m.path("")), names(&t.home));
    assert_eq!(m.status()["journal"]["conflicts"], 0, "{}", m.status());
    m.unmount();
}

/// A name created offline that home turns out to have is a conflict under the policy (keep-both: both
/// versions at home); a rename offline onto a name home has moves home's object aside; a directory made
/// offline where home has one merges with it.
#[test]
fn offline_names_that_exist_at_home_are_conflicts() {
    let t = TestDir::new("outage-clash");
    // `w` is never listed before the outage (nothing in it is looked up), so the cache does not know
    // its names; the rename's source, read before, lives elsewhere.
    std::fs::create_dir(t.home.join("w")).unwrap();
    std::fs::write(t.home.join("w/taken.txt"), b"home's version").unwrap();
    std::fs::write(t.home.join("w/target.txt"), b"home's target").unwrap();
    std::fs::create_dir(t.home.join("s")).unwrap();
    std::fs::write(t.home.join("s/src.txt"), b"source").unwrap();
    std::fs::create_dir(t.home.join("w/shared")).unwrap();
    std::fs::write(t.home.join("w/shared/x"), b"x").unwrap();
    let fault = t.root().join("home-is-down");
    let m = t.mount_with_fault(&fault, &["--conflict-policy", "keep-both"]);
    assert_eq!(read(&m.path("s/src.txt")), b"source");

    std::fs::write(&fault, b"").unwrap();
    std::fs::write(m.path("w/taken.txt"), b"the cache's version").unwrap();
    wait_offline(&m, 5, "after the fault file appeared");
    std::fs::rename(m.path("s/src.txt"), m.path("w/target.txt")).unwrap();
    std::fs::create_dir(m.path("w/shared")).unwrap();
    std::fs::write(m.path("w/shared/y"), b"y").unwrap();

    std::fs::remove_file(&fault).unwrap();
    wait_online(&m, 10, "after the fault file went");
    drain_ok(&m, 30);

    let home = names(&t.home.join("w"));
    let aside = |base: &str| {
        let found: Vec<&String> = home.iter().filter(|n| is_conflict_name(n, base)).collect();
        assert_eq!(found.len(), 1, "want one conflict copy of {base} at home: {home:?}");
        t.home.join("w").join(found[0])
    };
    assert_eq!(read(&t.home.join("w/taken.txt")), b"home's version");
    assert_eq!(read(&aside("taken.txt")), b"the cache's version");
    assert_eq!(read(&t.home.join("w/target.txt")), b"source");
    assert_eq!(read(&aside("target.txt")), b"home's target");
    assert!(!t.home.join("s/src.txt").exists());
    assert_eq!(names(&t.home.join("w/shared")), ["x", "y"]);
    assert_eq!(home.len(), 5, "home holds: {home:?}");
    let conflicts = larder(&["conflicts", s(&m.mnt), "--json"]);
    assert!(conflicts.success(), "{conflicts}");
    assert_eq!(num(&m.status(), "/journal/conflicts"), 2, "{}", conflicts.stdout);
    m.unmount();
}
