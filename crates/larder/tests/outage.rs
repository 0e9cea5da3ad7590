//! Integration tests of home going away and coming back: run as root with /dev/fuse.
//!
//! A home that is itself a mount can die and be mounted again, or have something mounted over it; larder
//! follows the home's path.

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
    assert_eq!(names(&m.path("")), ["a.txt", "only-other.txt"]);
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
    assert_eq!(names(&m.path("")), ["a.txt"]);
    m.unmount();
}
