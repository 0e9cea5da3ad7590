//! Unit tests of the directory home on a temporary directory.

use std::ffi::{CString, OsString};
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

/// The `user.` attributes among `xattrs`, sorted by name.
fn user(mut xattrs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    xattrs.retain(|(n, _)| n.starts_with(b"user."));
    xattrs.sort();
    xattrs
}

fn pair(name: &str, value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (name.as_bytes().to_vec(), value.to_vec())
}

/// The value of `name` on the file at `path` as the OS reads it, without the home; `None` when it has none.
fn os_getxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: both strings are NUL-terminated and `buf` writable for its length during the call.
    let got = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODATA));
        return None;
    }
    buf.truncate(got as usize);
    Some(buf)
}

#[test]
fn xattrs_of_files_and_directories_are_set_listed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let home = PosixHome::new(dir.path(), Some(Duration::from_secs(5))).unwrap();
    home.create(Path::new("f"), 0o644, Owner::default()).unwrap();
    home.mkdir(Path::new("d"), 0o755, Owner::default()).unwrap();
    let binary = [0u8, 1, 2, 0xff, 0, b'x'];
    for path in ["f", "d", ""] {
        let p = Path::new(path);
        assert_eq!(user(home.xattrs(p).unwrap()), vec![], "{path:?} starts with none");
        match home.set_xattr(p, b"user.a", Some(b"one")) {
            Ok(()) => {}
            Err(HomeError::Unsupported(why)) => panic!("the temp dir's file system keeps no user xattrs: {why}"),
            Err(e) => panic!("{path:?}: {e}"),
        }
        home.set_xattr(p, b"user.bin", Some(&binary)).unwrap();
        home.set_xattr(p, b"user.empty", Some(b"")).unwrap();
        assert_eq!(
            user(home.xattrs(p).unwrap()),
            vec![
                pair("user.a", b"one"),
                pair("user.bin", &binary),
                pair("user.empty", b"")
            ],
            "{path:?}"
        );
        // A value replaced, and the object at home has it.
        home.set_xattr(p, b"user.a", Some(b"two")).unwrap();
        assert_eq!(os_getxattr(&dir.path().join(path), "user.a"), Some(b"two".to_vec()));
        home.set_xattr(p, b"user.a", None).unwrap();
        assert_eq!(os_getxattr(&dir.path().join(path), "user.a"), None);
        // Taking away one it has not is no error.
        home.set_xattr(p, b"user.a", None).unwrap();
        home.set_xattr(p, b"user.never", None).unwrap();
        assert_eq!(
            user(home.xattrs(p).unwrap()),
            vec![pair("user.bin", &binary), pair("user.empty", b"")],
            "{path:?}"
        );
    }
    assert!(matches!(home.xattrs(Path::new("missing")), Err(HomeError::NotFound)));
    assert!(matches!(
        home.set_xattr(Path::new("missing"), b"user.a", Some(b"1")),
        Err(HomeError::NotFound)
    ));
}

#[test]
fn a_symlinks_xattrs_are_its_own_not_its_targets() {
    let dir = tempfile::tempdir().unwrap();
    let home = PosixHome::new(dir.path(), None).unwrap();
    home.create(Path::new("t"), 0o644, Owner::default()).unwrap();
    home.set_xattr(Path::new("t"), b"user.t", Some(b"target")).unwrap();
    home.symlink(b"t", Path::new("l"), Owner::default()).unwrap();
    home.symlink(b"nowhere", Path::new("dangling"), Owner::default())
        .unwrap();
    // The link's list is not the target's, and a dangling link has a list too.
    assert_eq!(user(home.xattrs(Path::new("l")).unwrap()), vec![]);
    assert_eq!(user(home.xattrs(Path::new("dangling")).unwrap()), vec![]);
    // Linux keeps no user attributes on symlinks: the refusal reaches the caller, and the target is left alone.
    let refused = home.set_xattr(Path::new("l"), b"user.x", Some(b"link"));
    assert!(matches!(refused, Err(HomeError::Os(libc::EPERM))), "{refused:?}");
    assert!(matches!(
        home.set_xattr(Path::new("l"), b"user.t", None),
        Err(HomeError::Os(libc::EPERM))
    ));
    assert_eq!(
        user(home.xattrs(Path::new("t")).unwrap()),
        vec![pair("user.t", b"target")]
    );
    assert_eq!(os_getxattr(&dir.path().join("t"), "user.x"), None);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // trusted.* may sit on a symlink: it lands on the link itself.
        home.set_xattr(Path::new("l"), b"trusted.x", Some(b"on the link"))
            .unwrap();
        let on_link = home.xattrs(Path::new("l")).unwrap();
        assert!(on_link.contains(&pair("trusted.x", b"on the link")), "{on_link:?}");
        let on_target = home.xattrs(Path::new("t")).unwrap();
        assert!(!on_target.iter().any(|(n, _)| n == b"trusted.x"), "{on_target:?}");
    }
}

#[test]
fn check_xattrs_holds_to_what_linux_takes() {
    let dir = tempfile::tempdir().unwrap();
    let home = PosixHome::new(dir.path(), None).unwrap();
    assert!(home.limits().xattrs);
    let one = |name: &[u8], len: usize| vec![(name.to_vec(), vec![7u8; len])];
    home.check_xattrs(&[]).unwrap();
    // Past the largest value Linux takes, whatever the file system.
    assert!(matches!(
        home.check_xattrs(&one(b"user.a", 65537)),
        Err(HomeError::Os(libc::E2BIG))
    ));
    let long = [b"user.".as_slice(), &[b'n'; 250]].concat();
    home.check_xattrs(&one(&long, 1)).unwrap();
    let too_long = [long.as_slice(), b"n"].concat();
    assert!(matches!(
        home.check_xattrs(&one(&too_long, 1)),
        Err(HomeError::Os(libc::ERANGE))
    ));
    assert!(matches!(
        home.check_xattrs(&one(b"", 1)),
        Err(HomeError::Os(libc::ERANGE))
    ));
}

/// Sets of attributes the check takes, the file system the home is on takes too: tried on a real file
/// beside it, one value of each size up to Linux's 64 KiB, and sets of several. (A refusal at the check
/// of what the file system would take is allowed, within the rounding of the check's count; a set taken
/// at the check and refused at home would fail at every push.)
#[test]
fn every_set_of_xattrs_the_check_takes_the_home_file_system_takes() {
    let dir = tempfile::tempdir().unwrap();
    let home = PosixHome::new(dir.path(), None).unwrap();
    let file = dir.path().join("oracle");
    let real = |set: &[(Vec<u8>, Vec<u8>)]| -> bool {
        let _ = std::fs::remove_file(&file);
        std::fs::write(&file, b"").unwrap();
        let p = CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        set.iter().all(|(name, value)| {
            let n = CString::new(name.clone()).unwrap();
            unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) == 0 }
        })
    };
    let (mut taken, mut largest_taken) = (0, 0);
    for len in [
        0usize, 100, 1000, 2000, 3000, 3900, 4000, 4050, 4096, 8000, 16000, 32000, 65000, 65536,
    ] {
        let set = vec![(b"user.big".to_vec(), vec![5u8; len])];
        if home.check_xattrs(&set).is_ok() {
            assert!(
                real(&set),
                "the check takes a value of {len} bytes the file system refuses"
            );
            taken += 1;
            largest_taken = len;
        }
    }
    assert!(taken >= 4, "the check refuses even small values ({taken} taken)");
    for (n, len) in [
        (2, 1500),
        (2, 2000),
        (3, 1300),
        (4, 1000),
        (8, 450),
        (16, 200),
        (40, 60),
    ] {
        let set: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
            .map(|i| (format!("user.a{i}").into_bytes(), vec![1u8; len]))
            .collect();
        if home.check_xattrs(&set).is_ok() {
            assert!(
                real(&set),
                "the check takes {n} values of {len} bytes the file system refuses"
            );
        }
    }
    // The largest single value the file system takes is taken by the check (a 64 KiB one where the file
    // system takes that): sizes of the list above the file system takes, the check takes too.
    let real_largest = [
        0usize, 100, 1000, 2000, 3000, 3900, 4000, 4050, 4096, 8000, 16000, 32000, 65000, 65536,
    ]
    .into_iter()
    .filter(|&len| real(&[(b"user.big".to_vec(), vec![5u8; len])]))
    .max()
    .unwrap();
    assert_eq!(
        largest_taken, real_largest,
        "the check refuses a value the file system takes"
    );
}

#[test]
fn an_xattr_name_with_nul_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let home = PosixHome::new(dir.path(), None).unwrap();
    home.create(Path::new("f"), 0o644, Owner::default()).unwrap();
    assert!(matches!(
        home.set_xattr(Path::new("f"), b"user.a\0b", Some(b"1")),
        Err(HomeError::InvalidName(_))
    ));
    assert!(matches!(
        home.set_xattr(Path::new("f"), b"user.a\0b", None),
        Err(HomeError::InvalidName(_))
    ));
    assert!(matches!(
        home.check_xattrs(&[pair("user.a\0b", b"1")]),
        Err(HomeError::InvalidName(_))
    ));
    assert_eq!(user(home.xattrs(Path::new("f")).unwrap()), vec![]);
}
