//! larder as a service: mounted by mount(8) through `mount.fuse.larder` (as `/etc/fstab` does), from a
//! config file, and in the foreground under a service manager that waits for its readiness and stops it.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// mount(8) looks for the helper of type `fuse.larder` here.
const HELPER: &str = "/sbin/mount.fuse.larder";

/// The helper, a link to the binary under test, for as long as it lives. Tests that use it run one at a
/// time (a lock), since they share the one path mount(8) searches.
struct Helper(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

static HELPER_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Helper {
    fn install() -> Helper {
        let guard = HELPER_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        // An installed larder's helper is put aside for the test and back after it.
        if Path::new(HELPER).symlink_metadata().is_ok() && !Path::new(SAVED).exists() {
            std::fs::rename(HELPER, SAVED).expect("put the installed helper aside");
        }
        let _ = std::fs::remove_file(HELPER);
        std::os::unix::fs::symlink(LARDER, HELPER).expect("link the mount helper");
        Helper(guard)
    }
}

const SAVED: &str = "/sbin/mount.fuse.larder.before-test";

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(HELPER);
        if Path::new(SAVED).symlink_metadata().is_ok() {
            let _ = std::fs::rename(SAVED, HELPER);
        }
    }
}

/// A mount made by someone else than `Mount::new` (mount(8), a foreground run): its daemon's pid from
/// its status, so that the guard unmounts it.
fn adopt(mnt: &Path, cache: &Path) -> Mount {
    Mount::adopt(mnt, cache, None)
}

#[test]
fn mount_t_fuse_larder_mounts_with_the_options_of_larder_mount() {
    let t = TestDir::new("helper");
    let _helper = Helper::install();
    std::fs::write(t.home.join("old"), b"from home").unwrap();
    let opts = format!(
        "rw,noauto,_netdev,x-systemd.automount,cache-dir={},validity_lag=30s,sync-lag=100ms",
        s(&t.cache)
    );
    let out = run_cmd(
        "mount",
        &["-t", "fuse.larder", s(&t.home), s(&t.mnt), "-o", &opts],
        COMMAND_DEADLINE,
    );
    assert!(
        out.success(),
        "mount -t fuse.larder failed:\n{out}\n{}",
        log_tail(&t.cache, 40)
    );
    assert_eq!(out.stdout, "", "a mount helper is silent on success");
    let m = adopt(&t.mnt, &t.cache);
    assert_eq!(std::fs::read(m.path("old")).unwrap(), b"from home");
    // The options reached the daemon: its lag and write-back mode.
    let st = m.status();
    assert_eq!(st["validity_lag_seconds"].as_f64(), Some(30.0), "{st}");
    std::fs::write(m.path("new"), b"written through mount(8)'s mount").unwrap();
    m.unmount();
    assert_eq!(
        std::fs::read(t.home.join("new")).unwrap(),
        b"written through mount(8)'s mount"
    );

    // ro: every change refused.
    let ro = format!("ro,cache-dir={}", s(&t.cache));
    let out = run_cmd(
        "mount",
        &["-t", "fuse.larder", s(&t.home), s(&t.mnt), "-o", &ro],
        COMMAND_DEADLINE,
    );
    assert!(out.success(), "mount -o ro failed:\n{out}");
    let m = adopt(&t.mnt, &t.cache);
    let e = std::fs::write(m.path("refused"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    m.unmount();

    // A line of fstab (another fstab file than /etc/fstab, which mount -T reads instead), mounted by its
    // mount point as at boot.
    let fstab = t.root().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# HOME MOUNTPOINT TYPE OPTIONS\n{} {} fuse.larder noauto,nofail,_netdev,cache-dir={},validity-lag=40s 0 0\n",
            s(&t.home),
            s(&t.mnt),
            s(&t.cache)
        ),
    )
    .unwrap();
    let out = run_cmd("mount", &["-T", s(&fstab), s(&t.mnt)], COMMAND_DEADLINE);
    assert!(
        out.success(),
        "mount of an fstab line failed:\n{out}\n{}",
        log_tail(&t.cache, 40)
    );
    let m = adopt(&t.mnt, &t.cache);
    assert_eq!(m.status()["validity_lag_seconds"].as_f64(), Some(40.0));
    assert_eq!(
        std::fs::read(m.path("new")).unwrap(),
        b"written through mount(8)'s mount"
    );
    m.unmount();
}

#[test]
fn mount_t_fuse_larder_refuses_an_option_it_does_not_have_by_name() {
    let t = TestDir::new("helper-bad");
    let _helper = Helper::install();
    let opts = format!("cache-dir={},colour=blue", s(&t.cache));
    let out = run_cmd(
        "mount",
        &["-t", "fuse.larder", s(&t.home), s(&t.mnt), "-o", &opts],
        COMMAND_DEADLINE,
    );
    assert!(!out.success(), "a mount with an unknown option succeeded:\n{out}");
    assert!(
        out.stderr.contains("'colour'"),
        "the error does not name the option:\n{out}"
    );
    assert!(!is_mounted(&t.mnt));
}

#[test]
fn a_config_file_holds_the_options_and_the_command_line_overrides_them() {
    let t = TestDir::new("config");
    let config = t.root().join("larder.toml");
    std::fs::write(
        &config,
        format!(
            "# larder's options, as on the command line without their dashes\n\
             home = \"{}\"\nmountpoint = \"{}\"\ncache-dir = \"{}\"\n\
             validity_lag = \"20s\"\nwrite-mode = \"read-only\"\nno-dedup = true\n",
            s(&t.home),
            s(&t.mnt),
            s(&t.cache)
        ),
    )
    .unwrap();
    let out = larder(&["mount", "--config", s(&config)]);
    assert!(out.success(), "larder mount --config failed:\n{out}");
    let m = adopt(&t.mnt, &t.cache);
    let st = m.status();
    assert_eq!(st["validity_lag_seconds"].as_f64(), Some(20.0), "{st}");
    assert!(
        std::fs::write(m.path("f"), b"x").is_err(),
        "the file's read-only mode was not taken"
    );
    m.unmount();

    // The command line wins over the file.
    let out = larder(&[
        "mount",
        "--config",
        s(&config),
        "--write-mode",
        "write-back",
        "--validity-lag",
        "3s",
    ]);
    assert!(out.success(), "larder mount --config with overrides failed:\n{out}");
    let m = adopt(&t.mnt, &t.cache);
    assert_eq!(m.status()["validity_lag_seconds"].as_f64(), Some(3.0));
    std::fs::write(m.path("f"), b"x").expect("the command line's write-back mode was not taken");
    m.unmount();
    assert_eq!(std::fs::read(t.home.join("f")).unwrap(), b"x");

    // A key that is no option: refused by name, nothing mounted.
    let bad = t.root().join("bad.toml");
    std::fs::write(&bad, "validity-lagg = \"1s\"\n").unwrap();
    let out = larder(&["mount", s(&t.home), s(&t.mnt), "--config", s(&bad)]);
    assert!(!out.success());
    assert!(
        out.stderr.contains("'validity-lagg'") && out.stderr.contains("bad.toml"),
        "{out}"
    );
    assert!(!is_mounted(&t.mnt));
}

/// The messages a service manager gets on `NOTIFY_SOCKET`, read until one holds `want` or `deadline`.
fn await_notice(sock: &UnixDatagram, want: &str, deadline: Duration) -> Vec<String> {
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut got = Vec::new();
    let ok = wait_until(deadline, || {
        let mut buf = [0u8; 4096];
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        got.iter().any(|g| g.lines().any(|l| l == want))
    });
    assert!(ok, "no {want} on the notify socket; got {got:?}");
    got
}

#[test]
fn in_the_foreground_it_tells_the_service_manager_it_is_ready_and_stops_leaving_changes_queued() {
    let t = TestDir::new("foreground");
    let notify: PathBuf = t.root().join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    std::fs::set_permissions(&notify, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut child = Command::new(LARDER)
        .args([
            "mount",
            s(&t.home),
            s(&t.mnt),
            "--cache-dir",
            s(&t.cache),
            "--foreground",
        ])
        .args(["--write-mode", "write-back", "--sync-lag", "1h"])
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start larder in the foreground");
    let m = Mount::adopt(&t.mnt, &t.cache, Some(child.id() as i32));
    let got = await_notice(&sock, "READY=1", Duration::from_secs(30));
    // Ready means mounted.
    assert!(is_mounted(&t.mnt), "READY=1 before the mount was live: {got:?}");
    std::fs::write(m.path("queued"), b"pending at the stop").unwrap();
    assert!(num(&m.status(), "/journal/pending_ops") > 0, "{}", m.status());
    // What a service manager's stop sends.
    signal(child.id() as i32, libc::SIGTERM);
    await_notice(&sock, "STOPPING=1", Duration::from_secs(30));
    let status = child.wait().unwrap();
    assert!(status.success(), "the daemon's exit after SIGTERM: {status}");
    m.disarm();
    assert!(!is_mounted(&t.mnt));
    assert!(
        !t.home.join("queued").exists(),
        "a sync lag of an hour, yet the change reached home"
    );
    // The change stayed queued; the next mount of the cache pushes it.
    let m = t.mount(&["--write-mode", "write-back"]);
    m.unmount();
    assert_eq!(std::fs::read(t.home.join("queued")).unwrap(), b"pending at the stop");
}

#[test]
fn the_service_unit_is_one_systemd_accepts() {
    // The unit as installed, pointing at the binary under test (systemd-analyze checks that it exists).
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/systemd/larder@.service"
    ))
    .expect("the unit file");
    assert!(unit.contains("Type=notify") && unit.contains("--foreground"), "{unit}");
    let path = dir.path().join("larder@data.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/larder", LARDER)).unwrap();
    let out = run_cmd("systemd-analyze", &["verify", s(&path)], COMMAND_DEADLINE);
    assert!(
        out.success() && out.stderr.trim().is_empty(),
        "systemd-analyze verify: {out}"
    );
}

/// The options /proc/self/mountinfo shows for the mount at `mnt` (its per-mount flags).
fn mount_flags(mnt: &Path) -> String {
    common::mountinfo(mnt).unwrap_or_else(|| panic!("{} is not mounted", mnt.display()))[5].clone()
}

#[test]
fn mount_o_remount_turns_a_mount_read_only_and_back_in_place() {
    let t = TestDir::new("remount");
    let _helper = Helper::install();
    let m = t.mount(&[]);
    let pid = m.pid;
    std::fs::write(m.path("before"), b"written read-write").unwrap();
    let remount = |opts: &str| run_cmd("mount", &["-o", opts, s(&m.mnt)], COMMAND_DEADLINE);

    let out = remount("remount,ro");
    assert!(out.success(), "mount -o remount,ro failed:\n{out}");
    assert!(
        mount_flags(&m.mnt).split(',').any(|f| f == "ro"),
        "{}",
        mount_flags(&m.mnt)
    );
    let e = std::fs::write(m.path("refused"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(std::fs::read(m.path("before")).unwrap(), b"written read-write");

    let out = remount("remount,rw");
    assert!(out.success(), "mount -o remount,rw failed:\n{out}");
    std::fs::write(m.path("after"), b"written again").unwrap();
    assert_eq!(
        m.status()["pid"].as_i64(),
        Some(pid as i64),
        "the same daemon serves it"
    );
    let flags = mount_flags(&m.mnt);
    assert!(flags.contains("nosuid") && flags.contains("nodev"), "{flags}");

    // larder's own options need a new mount: refused by name, and nothing changes.
    let out = remount("remount,validity-lag=5s");
    assert!(!out.success(), "a remount changed larder's options:\n{out}");
    assert!(out.stderr.contains("'validity-lag'"), "{out}");
    // So is another atime option than the daemon follows; the one it follows is accepted.
    let out = remount("remount,noatime");
    assert!(!out.success(), "a remount changed the atime option:\n{out}");
    assert!(out.stderr.contains("'noatime'"), "{out}");
    let out = remount("remount,relatime");
    assert!(out.success(), "mount -o remount,relatime failed:\n{out}");
    // The options it was mounted with, given again (as fstab or a script repeats them), are no change; the
    // same option with another value is one.
    let out = remount(&format!("remount,rw,cache-dir={}", s(&t.cache)));
    assert!(
        out.success(),
        "a remount repeating the mount's cache-dir failed:\n{out}"
    );
    let out = remount("remount,rw,cache-dir=/elsewhere");
    assert!(!out.success() && out.stderr.contains("'cache-dir'"), "{out}");
    std::fs::write(m.path("still"), b"still read-write").unwrap();
    m.unmount();

    // A mount started read-only cannot be made read-write in place: its daemon cannot write.
    let t = TestDir::new("remount-ro");
    let m = t.mount(&["--read-only"]);
    let out = run_cmd("mount", &["-o", "remount,rw", s(&m.mnt)], COMMAND_DEADLINE);
    assert!(!out.success(), "a read-only daemon's mount was made read-write:\n{out}");
    assert!(out.stderr.contains("--read-only"), "{out}");
    m.unmount();
}
