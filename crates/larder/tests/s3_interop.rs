//! larder and s3fs-fuse on one bucket (a local moto server): modes, owners, times and symlinks set through
//! one are what the other shows, both ways, with larder's cache empty each time (s3fs's convention of
//! object metadata, `crates/larder-home/src/s3/meta.rs`). And what `rclone copy --metadata` uploads
//! (modes in octal, times with a fraction) is what larder shows.

mod common;
mod moto;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use moto::*;

/// An s3fs mount of `bucket:/prefix`, unmounted when dropped.
struct S3fs {
    mnt: PathBuf,
}

impl S3fs {
    fn mount(st: &S3Test, mnt: &Path) -> S3fs {
        let passwd = st.t.root().join("s3fs.passwd");
        std::fs::write(&passwd, "test:test\n").unwrap();
        std::fs::set_permissions(&passwd, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::create_dir_all(mnt).unwrap();
        let opts = format!(
            "passwd_file={},url={},use_path_request_style,use_xattr,dbglevel=warn,stat_cache_expire=1",
            s(&passwd),
            st.srv.endpoint
        );
        let source = format!("{}:/{}", st.bucket, st.prefix);
        let out = run_cmd("s3fs", &[&source, s(mnt), "-o", &opts], COMMAND_DEADLINE);
        assert!(
            out.success(),
            "s3fs {source} failed (is s3fs installed? scripts/setup.sh --tests): {out}"
        );
        assert!(
            wait_until(Duration::from_secs(20), || is_mounted(mnt)),
            "s3fs did not mount {}",
            mnt.display()
        );
        S3fs { mnt: mnt.to_path_buf() }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
}

impl Drop for S3fs {
    fn drop(&mut self) {
        let _ = run_cmd("umount", &[s(&self.mnt)], COMMAND_DEADLINE);
        if is_mounted(&self.mnt) {
            let _ = run_cmd("umount", &["-l", s(&self.mnt)], COMMAND_DEADLINE);
        }
    }
}

/// What both must agree on: mode (with type bits), owner, group, and mtime.
fn attrs(p: &Path) -> (u32, u32, u32, SystemTime) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    (m.mode(), m.uid(), m.gid(), m.modified().unwrap())
}

fn sh(args: &[&str]) {
    let out = run_cmd(args[0], &args[1..], COMMAND_DEADLINE);
    assert!(out.success(), "{args:?}: {out}");
}

fn at(secs: u64, nanos: u32) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs, nanos)
}

#[test]
fn what_larder_sets_s3fs_sees() {
    let st = S3Test::new("to-s3fs", "p");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "100ms"]);
    std::fs::write(m.path("f"), b"from larder").unwrap();
    sh(&["chmod", "640", s(&m.path("f"))]);
    sh(&["chown", "1234:5678", s(&m.path("f"))]);
    // 2001-02-03 04:05:06.5 UTC
    sh(&["touch", "-d", "@981173106.5", s(&m.path("f"))]);
    std::os::unix::fs::symlink("f", m.path("link")).unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    sh(&["chmod", "710", s(&m.path("d"))]);
    sh(&["chown", "42:43", s(&m.path("d"))]);
    m.unmount();

    let fs = S3fs::mount(&st, &st.t.root().join("s3fs"));
    assert_eq!(
        attrs(&fs.path("f")),
        (libc::S_IFREG | 0o640, 1234, 5678, at(981_173_106, 500_000_000)),
        "f as s3fs sees it"
    );
    assert_eq!(std::fs::read(fs.path("f")).unwrap(), b"from larder");
    assert_eq!(std::fs::read_link(fs.path("link")).unwrap(), Path::new("f"));
    assert_eq!(std::fs::read(fs.path("link")).unwrap(), b"from larder");
    let (mode, uid, gid, _) = attrs(&fs.path("d"));
    assert_eq!((mode, uid, gid), (libc::S_IFDIR | 0o710, 42, 43), "d as s3fs sees it");
}

#[test]
fn what_s3fs_sets_larder_sees_from_an_empty_cache() {
    let st = S3Test::new("from-s3fs", "p");
    {
        let fs = S3fs::mount(&st, &st.t.root().join("s3fs"));
        std::fs::write(fs.path("g"), b"from s3fs").unwrap();
        sh(&["chmod", "600", s(&fs.path("g"))]);
        sh(&["chown", "42:43", s(&fs.path("g"))]);
        // 2002-03-04 05:06:07.25 UTC
        sh(&["touch", "-d", "@1015218367.25", s(&fs.path("g"))]);
        std::os::unix::fs::symlink("g", fs.path("glink")).unwrap();
        std::fs::create_dir(fs.path("e")).unwrap();
        sh(&["chmod", "711", s(&fs.path("e"))]);
        // s3fs may update an object's metadata after the call returns: wait until the bucket has it.
        let key = st.key("g");
        assert!(
            wait_until(Duration::from_secs(20), || {
                let out = st.tool(&["meta", &st.bucket, &key]);
                out.success() && out.stdout.lines().any(|l| l == "mtime=1015218367.250000000")
            }),
            "s3fs never stored g's time: {}",
            st.tool(&["meta", &st.bucket, &key])
        );
    }
    let m = st.mount(&[]);
    assert_eq!(
        attrs(&m.path("g")),
        (libc::S_IFREG | 0o600, 42, 43, at(1_015_218_367, 250_000_000)),
        "g as larder sees it"
    );
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"from s3fs");
    assert_eq!(std::fs::read_link(m.path("glink")).unwrap(), Path::new("g"));
    assert_eq!(attrs(&m.path("e")).0, libc::S_IFDIR | 0o711, "e as larder sees it");
    // And larder's change of what s3fs made reaches s3fs again.
    sh(&["chmod", "604", s(&m.path("g"))]);
    m.unmount();
    let fs = S3fs::mount(&st, &st.t.root().join("s3fs2"));
    assert_eq!(attrs(&fs.path("g")).0, libc::S_IFREG | 0o604);
}

#[test]
fn what_rclone_uploads_with_its_metadata_larder_shows_with_the_same_modes_and_times() {
    let st = S3Test::new("from-rclone", "p");
    let src = st.t.root().join("rclone-src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("f"), b"from rclone").unwrap();
    std::fs::write(src.join("sub/run.sh"), b"#!/bin/sh\n").unwrap();
    sh(&["chmod", "640", s(&src.join("f"))]);
    sh(&["chmod", "755", s(&src.join("sub/run.sh"))]);
    // 2003-04-05 06:07:08.123456789 UTC
    sh(&["touch", "-d", "@1049522828.123456789", s(&src.join("f"))]);
    let want_f = std::fs::metadata(src.join("f")).unwrap().modified().unwrap();
    let endpoint = st.srv.endpoint.clone();
    let dest = format!("m:{}/{}", st.bucket, st.prefix);
    let env = [
        ("RCLONE_CONFIG_M_TYPE", "s3"),
        ("RCLONE_CONFIG_M_PROVIDER", "Other"),
        ("RCLONE_CONFIG_M_ENDPOINT", endpoint.as_str()),
        ("RCLONE_CONFIG_M_ACCESS_KEY_ID", "test"),
        ("RCLONE_CONFIG_M_SECRET_ACCESS_KEY", "test"),
        ("RCLONE_CONFIG", "/dev/null"),
    ];
    // rclone's S3 client refuses a CA bundle it cannot use for plain HTTP: it is not told of the machine's.
    let out = std::process::Command::new("timeout")
        .args(["60", "rclone", "copy", "--metadata", s(&src), &dest])
        .envs(env)
        .env_remove("AWS_CA_BUNDLE")
        .output()
        .expect("run rclone (is it installed? scripts/setup.sh --tests)");
    assert!(
        out.status.success(),
        "rclone copy: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = st.tool_ok(&["meta", &st.bucket, &st.key("f")]);
    assert!(
        meta.lines().any(|l| l == "mode=100640"),
        "rclone no longer writes the mode in octal, so this test tests nothing: {meta}"
    );

    let m = st.mount(&[]);
    let (mode, _, _, mtime) = attrs(&m.path("f"));
    assert_eq!(mode, libc::S_IFREG | 0o640, "f's mode as larder sees it: {mode:o}");
    assert_eq!(mtime, want_f, "f's time as larder sees it");
    assert_eq!(attrs(&m.path("sub/run.sh")).0, libc::S_IFREG | 0o755);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"from rclone");
}

fn py(code: &str) -> String {
    let out = run_cmd("python3", &["-c", code], COMMAND_DEADLINE);
    assert!(out.success(), "python3 -c {code}: {out}");
    out.stdout
}

#[test]
fn extended_attributes_cross_between_larder_and_s3fs() {
    let st = S3Test::new("xattr-s3fs", "p");
    let m = st.mount(&["--write-mode", "write-back", "--sync-lag", "100ms"]);
    std::fs::write(m.path("f"), b"x").unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    py(&format!(
        "import os; os.setxattr('{0}', 'user.colour', b'blue'); os.setxattr('{0}', 'user.bin', bytes(range(256))); \
         os.setxattr('{1}', 'user.dir', b'd')",
        s(&m.path("f")),
        s(&m.path("d"))
    ));
    // Too much for an object's 2 KiB of metadata: refused at the call.
    let out = run_cmd(
        "python3",
        &[
            "-c",
            &format!("import os; os.setxattr('{}', 'user.big', b'x' * 3000)", s(&m.path("f"))),
        ],
        COMMAND_DEADLINE,
    );
    assert!(!out.success() && out.stderr.contains("Argument list too long"), "{out}");
    m.unmount();

    let list = |p: &Path| {
        py(&format!(
            "import os; p='{}'; print(sorted((a, os.getxattr(p, a).hex()) for a in os.listxattr(p)))",
            s(p)
        ))
    };
    let bin: String = (0u8..=255).map(|b| format!("{b:02x}")).collect();
    let want_f = format!("[('user.bin', '{bin}'), ('user.colour', '{}')]\n", hex(b"blue"));
    let fs = S3fs::mount(&st, &st.t.root().join("s3fs"));
    assert_eq!(list(&fs.path("f")), want_f, "f's attributes as s3fs sees them");
    assert_eq!(list(&fs.path("d")), format!("[('user.dir', '{}')]\n", hex(b"d")));
    // s3fs changes them; a new larder cache reads what s3fs left.
    py(&format!(
        "import os; os.removexattr('{0}', 'user.bin'); os.setxattr('{0}', 'user.s3fs', b'from s3fs')",
        s(&fs.path("f"))
    ));
    let key = st.key("f");
    assert!(
        wait_until(Duration::from_secs(20), || !st
            .tool_ok(&["meta", &st.bucket, &key])
            .contains("user.bin")
            || !st.tool_ok(&["meta", &st.bucket, &key]).contains("xattr")),
        "s3fs never stored its change: {}",
        st.tool_ok(&["meta", &st.bucket, &key])
    );
    drop(fs);
    let m = st.mount_fresh(2, &[]);
    assert_eq!(
        list(&m.path("f")),
        format!(
            "[('user.colour', '{}'), ('user.s3fs', '{}')]\n",
            hex(b"blue"),
            hex(b"from s3fs")
        ),
        "f's attributes as larder reads them from a new cache"
    );
    m.unmount();
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
