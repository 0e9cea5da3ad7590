//! Unit tests of the directory home on a temporary directory.

use std::ffi::OsString;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::PosixHome;
use crate::{ContentId, FileKind, Home, HomeError, Owner, Version};

#[test]
fn content_id_is_inode_size_and_mtime() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"hello").unwrap();
    let home = PosixHome::new(dir.path(), None).unwrap();
    let attr = home.stat(Path::new("f")).unwrap();
    let meta = std::fs::metadata(dir.path().join("f")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        home.content_id(Path::new("f"), &attr.version),
        ContentId::Inode {
            ino: meta.ino(),
            size: 5,
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
        }
    );
    // Through a layer, and under another name (a rename keeps the content's identity).
    let layered = crate::Layered::new(Arc::new(home), crate::MetricsLayer(Default::default()));
    assert_eq!(
        layered.content_id(Path::new("g"), &attr.version),
        layered.content_id(Path::new("f"), &attr.version)
    );
    // A version of another form is named by path and version.
    let odd = Version("\"etag\"".into());
    assert_eq!(
        layered.content_id(Path::new("f"), &odd),
        ContentId::named(Path::new("f"), &odd)
    );
}

#[test]
fn read_detects_a_replaced_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"hello world").unwrap();
    let home = PosixHome::new(dir.path(), Some(Duration::from_secs(5))).unwrap();
    let attr = home.stat(Path::new("f")).unwrap();
    assert_eq!(attr.kind, FileKind::File);
    assert_eq!(home.read(Path::new("f"), &attr.version, 6, 100).unwrap(), b"world");
    std::fs::write(dir.path().join("g"), b"HELLO WORLD!").unwrap();
    std::fs::rename(dir.path().join("g"), dir.path().join("f")).unwrap();
    assert!(matches!(
        home.read(Path::new("f"), &attr.version, 0, 5),
        Err(HomeError::Stale)
    ));
}

#[test]
fn write_pushes_ranges_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let home = PosixHome::new(dir.path(), None).unwrap();
    let attr = home.create(Path::new("f"), 0o644, Owner::default()).unwrap();
    assert_eq!(attr.size, 0);
    let src_path = dir.path().join("src");
    std::fs::write(&src_path, b"0123456789").unwrap();
    let src = File::open(&src_path).unwrap();
    let after = home
        .write(Path::new("f"), &src, &[2..5, 8..10], 12, Some(&attr.version), None)
        .unwrap();
    assert_eq!(after.size, 12);
    assert_eq!(
        std::fs::read(dir.path().join("f")).unwrap(),
        b"\x00\x00234\x00\x00\x0089\x00\x00"
    );
    // A write based on the old version is a conflict now.
    assert!(matches!(
        home.write(
            Path::new("f"),
            &src,
            std::slice::from_ref(&(0..1)),
            12,
            Some(&attr.version),
            None
        ),
        Err(HomeError::Conflict)
    ));
}

#[test]
fn reconnect_follows_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f"), b"old").unwrap();
    let home = PosixHome::new(&root, Some(Duration::from_secs(5))).unwrap();
    assert!(!home.reconnect().unwrap(), "nothing changed");
    std::fs::rename(&root, dir.path().join("was")).unwrap();
    // The path names nothing: home is unreachable.
    assert!(matches!(home.reconnect(), Err(HomeError::Unavailable(_))));
    // Another directory at the path: home is that one from now on.
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("g"), b"new!").unwrap();
    assert!(home.reconnect().unwrap(), "a new directory at the path is reopened");
    assert!(matches!(home.stat(Path::new("f")), Err(HomeError::NotFound)));
    assert_eq!(home.stat(Path::new("g")).unwrap().size, 4);
    assert!(!home.reconnect().unwrap());
}

#[test]
fn errors_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    let home = PosixHome::new(dir.path(), None).unwrap();
    assert!(matches!(home.stat(Path::new("missing")), Err(HomeError::NotFound)));
    home.mkdir(Path::new("d"), 0o755, Owner::default()).unwrap();
    home.create(Path::new("d/f"), 0o644, Owner::default()).unwrap();
    assert!(matches!(home.rmdir(Path::new("d")), Err(HomeError::NotEmpty)));
    assert!(matches!(
        home.mkdir(Path::new("d"), 0o755, Owner::default()),
        Err(HomeError::Exists)
    ));
    let names: Vec<_> = home.list(Path::new("d")).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec![OsString::from("f")]);
}
