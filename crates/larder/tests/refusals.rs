//! What larder refuses up front rather than accept and fail later: a home that cannot be used refuses the
//! mount with one line naming the problem, and a change home could never store fails at the call, in every
//! write mode, with nothing queued. Changes home does refuse are named by `larder drain` (at once, not at
//! its timeout) and by `larder status`.
//!
//! Runs as root with /dev/fuse; the S3 cases use a local moto server (`scripts/s3-server.sh`), one per test.

mod common;
mod moto;

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use moto::*;

// Helpers ------------------------------------------------------------------------------------------------

/// The errno of `r`, failing the test if it succeeded.
#[track_caller]
fn refused<T>(what: &str, r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => panic!("{what} succeeded; home cannot store it"),
        Err(e) => errno(&e),
    }
}

#[track_caller]
fn assert_errno_in<T>(what: &str, r: std::io::Result<T>, want: &[i32]) {
    let got = refused(what, r);
    assert!(
        want.contains(&got),
        "{what}: errno {got} ({}), want one of {want:?}",
        std::io::Error::from_raw_os_error(got)
    );
}

/// `mkdirat(dir, name)`: a name relative to an open directory, so the whole path may exceed PATH_MAX.
fn mkdir_at(dir: &std::fs::File, name: &OsStr) -> std::io::Result<()> {
    let c = CString::new(name.as_bytes()).expect("no NUL in the name");
    // SAFETY: a valid descriptor and NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn open_dir_at(dir: &std::fs::File, name: &OsStr) -> std::io::Result<std::fs::File> {
    let c = CString::new(name.as_bytes()).expect("no NUL in the name");
    // SAFETY: a valid descriptor and NUL-terminated name; the new descriptor is owned by the File.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { <std::fs::File as std::os::unix::io::FromRawFd>::from_raw_fd(fd) })
}

fn pending(m: &Mount) -> u64 {
    num(&m.status(), "/journal/pending_ops")
}

/// A TCP port on loopback where nothing listens (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = l.local_addr().expect("local addr").port();
    drop(l);
    port
}

/// POST `body` to moto's `/moto-api/reset-auth`: after `body` more requests, moto checks credentials
/// (and refuses the harness's made-up ones with 403); "inf" turns the checks off again.
fn moto_auth_after(st: &S3Test, body: &str) {
    let url = format!("{}/moto-api/reset-auth", st.srv.endpoint);
    let out = run_cmd(
        "curl",
        &[
            "-s",
            "-f",
            "--max-time",
            "10",
            "-X",
            "POST",
            "-H",
            "Content-Type: text/plain",
            "--data",
            body,
            &url,
        ],
        Duration::from_secs(20),
    );
    assert!(out.success(), "POST {url} failed:\n{out}");
}

// Mount-time refusals ------------------------------------------------------------------------------------

/// Each home that cannot be used refuses the mount with one line naming the problem, and leaves nothing
/// mounted: a missing bucket, a name S3 rejects, refused credentials, an endpoint that does not answer
/// (within a few seconds, at the default home timeout), an unknown URL scheme. A prefix with nothing
/// under it yet is a new, empty home and mounts.
#[test]
fn s3_mount_refuses_unusable_homes() {
    let st = S3Test::new("refuse-mount", "home");
    let cache = st.t.root().join("cache-refused");
    let mnt = s(&st.t.mnt);
    let try_mount = |url: &str, extra: &[&str]| -> (Output, Duration) {
        let mut args = vec!["mount", url, mnt, "--cache-dir", s(&cache)];
        args.extend_from_slice(&st.mount_args(extra));
        let t0 = Instant::now();
        let out = run_cmd_env(LARDER, &args, &st.srv.env(), COMMAND_DEADLINE);
        let took = t0.elapsed();
        if is_mounted(&st.t.mnt) {
            // Take it down before failing, so that no mount outlives the test.
            larder(&["unmount", mnt, "--leave-pending", "--timeout", "10s"]);
            panic!("a refused mount of {url} left something mounted:\n{out}");
        }
        (out, took)
    };

    let (out, _) = try_mount("s3://nosuchbucket/p", &[]);
    assert_cli_error(&out, &["s3://nosuchbucket/p", "bucket 'nosuchbucket' does not exist"]);

    let (out, _) = try_mount("s3://Bad_Name!/p", &[]);
    assert_cli_error(&out, &["'Bad_Name!' is not a valid S3 bucket name"]);
    let (out, _) = try_mount("s3://ab/p", &[]);
    assert_cli_error(&out, &["'ab' is not a valid S3 bucket name"]);

    let (out, _) = try_mount("foo://x", &[]);
    assert_cli_error(&out, &["home URL scheme 'foo://' is not supported"]);

    // Nothing listens: refused within a few seconds although the home timeout is 30 s.
    let port = closed_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut args = vec![
        "mount".to_string(),
        st.url(),
        mnt.to_string(),
        "--cache-dir".into(),
        s(&cache).into(),
        "--s3-endpoint".into(),
        endpoint.clone(),
    ];
    args.extend(["--write-mode".into(), "write-back".into()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    let out = run_cmd_env(LARDER, &argv, &st.srv.env(), COMMAND_DEADLINE);
    let took = t0.elapsed();
    if is_mounted(&st.t.mnt) {
        larder(&["unmount", mnt, "--leave-pending", "--timeout", "10s"]);
        panic!("a refused mount left something mounted:\n{out}");
    }
    assert_cli_error(&out, &[&format!("endpoint {endpoint} does not answer")]);
    assert!(took < Duration::from_secs(5), "the refusal took {took:?}");
    eprintln!("a closed endpoint was refused in {took:?}");

    // A prefix with nothing under it is a new home: it mounts, empty.
    let m = st.mount_url_at(&format!("s3://{}/fresh", st.bucket), &st.t.mnt, &st.t.cache, &[]);
    assert!(names(&m.mnt).is_empty(), "a fresh prefix shows entries");
    m.unmount();

    // Last, as moto then checks every request's credentials: the harness's are made up.
    moto_auth_after(&st, "0");
    let (out, _) = try_mount(&st.url(), &[]);
    moto_auth_after(&st, "inf");
    assert_cli_error(&out, &[&st.url(), "credentials", "refused"]);
}

// Names and kinds home cannot store ----------------------------------------------------------------------

/// On an S3 home, in every write mode, a change home could never store fails at the call and queues
/// nothing: keys past 1,024 bytes (prefix included; a directory's marker counts its '/'), names that are
/// not UTF-8, a rename that would push a file's key past the limit, and symlinks, hard links and special
/// files (EPERM). A key of exactly 1,024 bytes is allowed.
#[test]
fn s3_changes_home_cannot_store_fail_at_the_call() {
    let st = S3Test::new("refuse-names", "home");
    for (i, mode) in ["write-back", "write-through", "local"].iter().enumerate() {
        let prefix = format!("m{i}");
        let url = format!("s3://{}/{prefix}", st.bucket);
        let mnt = st.t.root().join(format!("mnt-{i}"));
        let cache = st.t.root().join(format!("cache-{i}"));
        std::fs::create_dir(&mnt).unwrap();
        // Without metadata an S3 home holds no symlinks either (with it, s3fs's symlink objects).
        let m = st.mount_url_at(
            &url,
            &mnt,
            &cache,
            &["--write-mode", mode, "--sync-lag", "1h", "--s3-metadata", "off"],
        );
        let what = |w: &str| format!("{w} ({mode})");

        // `mkdir -p` of a path whose keys reach 1,200 bytes: the levels that fit are made, the first
        // that does not is refused.
        let level = "d".repeat(199);
        let mut rel = String::new();
        let mut made = 0;
        let mut first_refusal = None;
        for _ in 0..6 {
            let next = if rel.is_empty() {
                level.clone()
            } else {
                format!("{rel}/{level}")
            };
            match std::fs::create_dir(m.path(&next)) {
                Ok(()) => {
                    made += 1;
                    rel = next;
                }
                Err(e) => {
                    first_refusal = Some((prefix.len() + 1 + next.len() + 1, errno(&e)));
                    break;
                }
            }
        }
        let (key_len, e) = first_refusal.unwrap_or_else(|| panic!("{}", what("mkdir -p to 1,200 bytes succeeded")));
        assert!(key_len > 1024, "{}: refused a {key_len}-byte marker", what("mkdir -p"));
        assert_eq!(
            e,
            libc::ENAMETOOLONG,
            "{}",
            what("mkdir of a marker key past 1,024 bytes")
        );
        assert_eq!(made, 5, "{}", what("levels made"));
        let room = 1024 - (prefix.len() + 1 + rel.len() + 1);
        assert_errno_in(
            &what("a file with a 1,025-byte key"),
            std::fs::File::create(m.path(&format!("{rel}/{}", "f".repeat(room + 1)))),
            &[libc::ENAMETOOLONG],
        );
        assert_errno_in(
            &what("a directory whose marker is 1,025 bytes"),
            std::fs::create_dir(m.path(&format!("{rel}/{}", "g".repeat(room)))),
            &[libc::ENAMETOOLONG],
        );
        let fits = format!("{rel}/{}", "f".repeat(room));
        create_with(&m.path(&fits), b"fits");

        // Not UTF-8.
        assert_errno_in(
            &what("a name that is not UTF-8"),
            std::fs::File::create(m.path("").join(OsStr::from_bytes(b"bad-\xff-name"))),
            &[libc::EINVAL],
        );
        // A rename that would make a file's key too long.
        std::fs::create_dir(m.path("short")).unwrap();
        create_with(&m.path("short/x"), b"x");
        assert_errno_in(
            &what("renaming a directory so that its file's key is too long"),
            std::fs::rename(m.path("short"), m.path(&format!("{rel}/{}", "r".repeat(room - 1)))),
            &[libc::ENAMETOOLONG],
        );
        // What S3 cannot hold at all.
        assert_errno_in(
            &what("symlink"),
            std::os::unix::fs::symlink("short/x", m.path("link")),
            &[libc::EPERM],
        );
        assert_errno_in(
            &what("hard link"),
            std::fs::hard_link(m.path("short/x"), m.path("hard")),
            &[libc::EPERM],
        );
        let fifo = CString::new(m.path("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        let r = unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) };
        assert_eq!(r, -1, "{}", what("mkfifo succeeded"));
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EPERM),
            "{}",
            what("mkfifo")
        );
        for n in ["link", "hard", "fifo"] {
            assert!(
                std::fs::symlink_metadata(m.path(n)).is_err(),
                "{}",
                what(&format!("{n} exists after its refusal"))
            );
        }

        // Nothing refused was queued: only the changes that were allowed wait (write-back, local), and
        // nothing waits in write-through.
        let st_json = m.status();
        let queued = num(&st_json, "/journal/pending_ops");
        // The directories, then a create and a data op for each of the two files, and the mkdir of short.
        let want = if *mode == "write-through" { 0 } else { made + 5 };
        assert!(
            queued <= want,
            "{}: {queued} changes queued, at most {want} allowed ones\n{st_json}",
            what("queue")
        );
        assert_eq!(num(&st_json, "/journal/failed_ops"), 0, "{}", what("refused changes"));
        if *mode == "write-back" {
            drain_ok(&m, 60);
            assert_eq!(
                st.get(&format!("{prefix}/{fits}")),
                b"fits",
                "{}",
                what("the 1,024-byte key")
            );
        }
        if *mode == "local" {
            // Local changes never reach home: leave them.
            let out = larder(&["unmount", s(&m.mnt), "--leave-pending", "--timeout", "20s"]);
            assert!(out.success(), "unmount --leave-pending failed:\n{out}");
            m.disarm();
        } else {
            m.unmount();
        }
    }
}

/// On a POSIX home, in write-back, a path longer than home's PATH_MAX fails at the call with
/// ENAMETOOLONG and queues nothing (the kernel only sees names relative to a directory, so the mount
/// itself would take it).
#[test]
fn posix_paths_past_path_max_fail_at_the_call() {
    let t = TestDir::new("refuse-pathmax");
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1h"]);
    let name = std::ffi::OsString::from("p".repeat(250));
    let mut dir = std::fs::File::open(&m.mnt).expect("open the mount's root");
    let mut depth = 0usize;
    let refusal = loop {
        assert!(depth < 20, "20 levels of 251 bytes were accepted");
        match mkdir_at(&dir, &name) {
            Ok(()) => {
                depth += 1;
                dir = open_dir_at(&dir, &name).expect("open the new level");
            }
            Err(e) => break e,
        }
    };
    // Level n's path is n * 251 - 1 bytes: 16 levels are 4,015 bytes, 17 would be 4,266.
    assert_eq!(depth, 16, "levels made before the refusal ({refusal})");
    assert_eq!(errno(&refusal), libc::ENAMETOOLONG, "the refusal: {refusal}");
    assert_eq!(pending(&m), 16, "changes queued");
    drop(dir);
    drain_ok(&m, 60);
    m.unmount();
}

// Refused changes, named ---------------------------------------------------------------------------------

/// Changes home refuses (here a read-only home) are named with the operation and home's reason by
/// `larder status` and `status --json`; `larder drain` returns at once, non-zero, naming them, instead of
/// waiting for its timeout. Once home takes changes again, a drain pushes them.
#[test]
fn drain_and_status_name_refused_changes() {
    let t = TestDir::new("refuse-drain");
    let home = s(&t.home).to_string();
    // The home is a bind mount of itself, made read-only and writable again while larder runs (every
    // change there then fails with EROFS). Dropped after the larder mount.
    let out = run_cmd("mount", &["--bind", &home, &home], Duration::from_secs(10));
    assert!(out.success(), "mount --bind failed:\n{out}");
    struct Unbind(String);
    impl Drop for Unbind {
        fn drop(&mut self) {
            let _ = run_cmd("umount", &["-l", &self.0], Duration::from_secs(10));
        }
    }
    let _unbind = Unbind(home.clone());
    let remount = |how: &str| {
        let out = run_cmd(
            "mount",
            &["-o", &format!("remount,bind,{how}"), &home, &home],
            Duration::from_secs(10),
        );
        assert!(out.success(), "remount {how} failed:\n{out}");
    };
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    remount("ro");

    create_with(&m.path("a.txt"), b"a");
    std::fs::create_dir(m.path("d")).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || num(&m.status(), "/journal/failed_ops") >= 1),
        "home refused nothing: {}",
        m.status()
    );

    let t0 = Instant::now();
    let out = larder(&["drain", s(&m.mnt), "--timeout", "30s"]);
    let took = t0.elapsed();
    assert!(!out.success(), "drain succeeded with refused changes:\n{out}");
    assert!(
        took < Duration::from_secs(10),
        "drain took {took:?} to report refused changes:\n{out}"
    );
    eprintln!("drain reported the refusals in {took:?}: {}", out.stderr.trim_end());
    for n in ["a.txt", "create", "Read-only file system"] {
        assert!(out.stderr.contains(n), "drain's message does not name '{n}':\n{out}");
    }

    let v = m.status();
    let list = v["journal"]["refused"].as_array().cloned().unwrap_or_default();
    assert!(
        list.iter().any(|r| r["path"] == "a.txt"
            && r["op"] == "create"
            && r["error"].as_str().is_some_and(|e| e.contains("Read-only"))),
        "status --json does not list the refused create of a.txt: {v}"
    );
    let text = larder(&["status", s(&m.mnt)]);
    assert!(text.success(), "larder status failed:\n{text}");
    assert!(
        text.stdout.contains("a.txt") && text.stdout.contains("Read-only file system"),
        "larder status does not name the refused change:\n{text}"
    );

    // `larder unmount --drain` says the same at once, and leaves the mount up.
    let t0 = Instant::now();
    let out = larder(&["unmount", s(&m.mnt), "--drain", "--timeout", "30s"]);
    let took = t0.elapsed();
    assert!(!out.success(), "unmount --drain succeeded with refused changes:\n{out}");
    assert!(took < Duration::from_secs(10), "unmount --drain took {took:?}:\n{out}");
    assert!(
        out.stderr.contains("a.txt"),
        "unmount --drain does not name a.txt:\n{out}"
    );
    assert!(is_mounted(&m.mnt), "unmount --drain unmounted with refused changes");

    // Home takes changes again: the next drain pushes them.
    remount("rw");
    drain_ok(&m, 30);
    assert_eq!(read(&t.home.join("a.txt")), b"a", "a.txt at home");
    assert!(Path::new(&t.home.join("d")).is_dir(), "d at home");
    m.unmount();
}
