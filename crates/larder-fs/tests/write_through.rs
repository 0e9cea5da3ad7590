//! Write-through, in the core without a mount (a real POSIX home in a temporary directory, counted by the
//! metrics layer): a change is at home when its call returns, and one home refuses fails at the call and
//! leaves nothing behind; writes, names and hard links.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use larder_fs::{FsConfig, FsError};
use larder_home::{Fault, FaultLayer, FileKind, HomeError, OpKind, SetAttr};

mod common;
use common::*;

#[test]
fn writes_reach_home_on_flush_and_partial_blocks_keep_home_data() {
    let s = Setup::new();
    let data = pattern(3 * BS as usize, 1);
    std::fs::write(s.home("f"), &data).unwrap();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    let ino = resolve(&fs, "f").unwrap();
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    // Uncached block 1, written in the middle: the rest of the block must survive.
    fs.write(r.fh, BS + 100, b"HELLO").unwrap();
    assert_eq!(std::fs::read(s.home("f")).unwrap(), data, "not at home before flush");
    fs.flush(r.fh).unwrap();
    let mut expect = data.clone();
    expect[BS as usize + 100..BS as usize + 105].copy_from_slice(b"HELLO");
    assert_eq!(std::fs::read(s.home("f")).unwrap(), expect);
    // Extend past the end with a hole.
    fs.write(r.fh, 5 * BS, b"tail").unwrap();
    fs.release(r.fh).unwrap();
    expect.resize(5 * BS as usize, 0);
    expect.extend_from_slice(b"tail");
    assert_eq!(std::fs::read(s.home("f")).unwrap(), expect);
    assert_eq!(read_file(&fs, ino), expect);
    // Truncate through setattr.
    fs.setattr(
        ino,
        &SetAttr {
            size: Some(10),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert_eq!(std::fs::read(s.home("f")).unwrap(), expect[..10]);
    assert_eq!(read_file(&fs, ino), expect[..10]);
}

#[test]
fn namespace_changes_go_to_home() {
    let s = Setup::new();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    let d = fs.mkdir(1, OsStr::new("d"), 0o755, 0, 0).unwrap().attr.ino;
    let (e, r) = fs.create(d, OsStr::new("f"), 0o640, libc::O_WRONLY, 0, 0).unwrap();
    fs.write(r.fh, 0, b"abc").unwrap();
    fs.release(r.fh).unwrap();
    assert_eq!(std::fs::read(s.home("d/f")).unwrap(), b"abc");
    assert!(matches!(
        fs.create(d, OsStr::new("f"), 0o640, libc::O_EXCL, 0, 0),
        Err(FsError::Exists)
    ));
    fs.rename(1, OsStr::new("d"), 1, OsStr::new("e"), Default::default())
        .unwrap();
    assert_eq!(std::fs::read(s.home("e/f")).unwrap(), b"abc");
    assert_eq!(read_file(&fs, e.attr.ino), b"abc", "the renamed file keeps its inode");
    fs.symlink(d, OsStr::new("l"), b"f", 0, 0).unwrap();
    assert_eq!(std::fs::read_link(s.home("e/l")).unwrap(), Path::new("f"));
    assert!(matches!(fs.rmdir(1, OsStr::new("e")), Err(FsError::NotEmpty)));
    fs.unlink(d, OsStr::new("f")).unwrap();
    fs.unlink(d, OsStr::new("l")).unwrap();
    fs.rmdir(1, OsStr::new("e")).unwrap();
    assert!(!s.home("e").exists());
    assert!(matches!(fs.lookup(1, OsStr::new("e")), Err(FsError::NotFound)));
}

#[test]
fn a_failed_push_keeps_the_data_and_the_next_flush_delivers_it() {
    let s = Setup::new();
    std::fs::write(s.home("f"), b"0123456789").unwrap();
    let faults = Arc::new(FaultLayer::default());
    let (fs, _) = s.fs_with_faults(Duration::from_secs(3600), faults.clone());
    let ino = resolve(&fs, "f").unwrap();
    let r = fs.open(ino, libc::O_RDWR).unwrap();
    fs.write(r.fh, 2, b"ab").unwrap();
    faults.inject(Fault {
        op: OpKind::Write,
        error: HomeError::NoSpace,
        count: 1,
        landed: false,
    });
    assert!(
        matches!(fs.flush(r.fh), Err(FsError::Home(HomeError::NoSpace))),
        "the error reaches close/fsync"
    );
    assert_eq!(std::fs::read(s.home("f")).unwrap(), b"0123456789");
    assert_eq!(
        fs.read(r.fh, 0, 100).unwrap(),
        b"01ab456789",
        "read-your-writes while home refuses"
    );
    fs.flush(r.fh).unwrap();
    assert_eq!(std::fs::read(s.home("f")).unwrap(), b"01ab456789");
    fs.release(r.fh).unwrap();
}

/// Write-through: a removal's op, and a rename's, are on record (as repeats) before home is asked, so that a
/// kill during the call finds them and pushes them again.
#[test]
fn write_through_removals_and_renames_are_on_record_before_home_is_asked() {
    for (op, kind) in [("unlink", OpKind::Unlink), ("rename", OpKind::Rename)] {
        let s = Setup::new();
        std::fs::write(s.home("f"), b"x").unwrap();
        let hold = Arc::new(HoldAsking(HoldAnswer::new(kind)));
        let fs = Arc::new(s.fs_layered(
            hold.clone(),
            Arc::new(FaultLayer::default()),
            FsConfig {
                write_mode: larder_fs::WriteMode::WriteThrough,
                ..FsConfig::default()
            },
        ));
        resolve(&fs, "f").unwrap();
        hold.0.arm();
        let changing = {
            let fs = fs.clone();
            std::thread::spawn(move || match kind {
                OpKind::Unlink => fs.unlink(1, OsStr::new("f")),
                _ => fs.rename(1, OsStr::new("f"), 1, OsStr::new("g"), Default::default()),
            })
        };
        hold.0.wait_held();
        let mut recorded = 0;
        fs.store().db().for_each_op(|_, _| recorded += 1).unwrap();
        hold.0.release();
        changing.join().unwrap().unwrap();
        assert_eq!(recorded, 1, "the {op} on record while home was asked");
    }
}

#[test]
fn hard_links_are_one_inode_with_several_names() {
    let s = Setup::new();
    std::fs::write(s.home("a"), b"shared").unwrap();
    std::fs::hard_link(s.home("a"), s.home("b")).unwrap();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    // Listed first: both names are placeholders until looked up.
    let fh = fs.opendir(1).unwrap();
    assert_eq!(fs.readdir(fh, 2).unwrap().len(), 2);
    let a = resolve(&fs, "a").unwrap();
    assert_eq!(resolve(&fs, "b").unwrap(), a, "a link made at home is the same inode");
    let c = fs.link(a, 1, OsStr::new("c")).unwrap();
    assert_eq!(c.attr.ino, a);
    assert_eq!(c.attr.nlink, 3);
    fs.unlink(1, OsStr::new("a")).unwrap();
    assert_eq!(
        fs.getattr(a).unwrap().attr.nlink,
        2,
        "the remaining names see the new link count"
    );
    assert_eq!(read_file(&fs, a), b"shared");
    fs.rename(1, OsStr::new("b"), 1, OsStr::new("d"), Default::default())
        .unwrap();
    assert_eq!(resolve(&fs, "d").unwrap(), a);
    assert_eq!(resolve(&fs, "c").unwrap(), a);
    fs.shutdown().unwrap();
    drop(fs);
    let (fs, _) = s.fs(Duration::from_secs(3600));
    let c = resolve(&fs, "c").unwrap();
    assert_eq!(resolve(&fs, "d").unwrap(), c, "still one inode after a restart");
}

/// The same of home's directory `rel`.
fn at_home(s: &Setup, rel: &str) -> Vec<(String, FileKind, u32, u64, u32)> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut out: Vec<_> = std::fs::read_dir(s.home(rel))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let kind = if m.is_dir() {
                FileKind::Dir
            } else if m.file_type().is_symlink() {
                FileKind::Symlink
            } else {
                FileKind::File
            };
            let size = if m.is_dir() { 0 } else { m.len() };
            (
                e.file_name().to_string_lossy().into_owned(),
                kind,
                m.permissions().mode() & 0o7777,
                size,
                m.nlink() as u32,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn write_through_changes_home_refuses_fail_at_the_call_and_leave_nothing_behind() {
    let s = Setup::new();
    std::fs::create_dir(s.home("d")).unwrap();
    std::fs::create_dir(s.home("d/empty")).unwrap();
    std::fs::write(s.home("d/a"), b"aaa").unwrap();
    std::fs::write(s.home("d/c"), b"ccccc").unwrap();
    let faults = Arc::new(FaultLayer::default());
    let (fs, _) = s.fs_with_faults(Duration::from_secs(3600), faults.clone());
    let d = resolve(&fs, "d").unwrap();
    let a = resolve(&fs, "d/a").unwrap();
    let before = at_home(&s, "d");
    // Directory sizes differ between the two views; compare everything else.
    let strip = |v: Vec<(String, FileKind, u32, u64, u32)>| -> Vec<_> {
        v.into_iter()
            .map(|(n, k, p, size, l)| (n, k, p, if k == FileKind::Dir { 0 } else { size }, l))
            .collect()
    };
    assert_eq!(strip(shown(&fs, d)), before);
    let refuse = |op: OpKind| {
        faults.inject(Fault {
            op,
            error: HomeError::PermissionDenied,
            count: 1,
            landed: false,
        })
    };
    let denied = |r: Result<(), FsError>, what: &str| {
        assert!(
            matches!(r, Err(FsError::Home(HomeError::PermissionDenied))),
            "{what}: {r:?}"
        );
    };
    let n = OsStr::new;
    refuse(OpKind::Create);
    denied(
        fs.create(d, n("new"), 0o644, libc::O_WRONLY, 0, 0).map(|_| ()),
        "create",
    );
    refuse(OpKind::Mkdir);
    denied(fs.mkdir(d, n("sub"), 0o755, 0, 0).map(|_| ()), "mkdir");
    refuse(OpKind::Symlink);
    denied(fs.symlink(d, n("l"), b"a", 0, 0).map(|_| ()), "symlink");
    refuse(OpKind::Link);
    denied(fs.link(a, d, n("hard")).map(|_| ()), "link");
    refuse(OpKind::Unlink);
    denied(fs.unlink(d, n("a")), "unlink");
    refuse(OpKind::Rmdir);
    denied(fs.rmdir(d, n("empty")), "rmdir");
    refuse(OpKind::Rename);
    denied(fs.rename(d, n("a"), d, n("b"), Default::default()), "rename");
    refuse(OpKind::Rename);
    denied(
        fs.rename(d, n("a"), d, n("c"), Default::default()),
        "rename onto a file",
    );
    refuse(OpKind::SetAttr);
    let chmod = SetAttr {
        perm: Some(0o600),
        ..SetAttr::default()
    };
    denied(fs.setattr(a, &chmod).map(|_| ()), "chmod");
    assert_eq!(at_home(&s, "d"), before, "home refused every change");
    assert_eq!(strip(shown(&fs, d)), before, "the cache shows home's directory again");
    assert_eq!(
        resolve(&fs, "d/a").unwrap(),
        a,
        "a name whose removal was refused keeps its inode"
    );
    assert_eq!(read_file(&fs, a), b"aaa");
    assert_eq!(read_file(&fs, resolve(&fs, "d/c").unwrap()), b"ccccc");
    // And what home accepts afterwards lands as usual.
    fs.rename(d, n("a"), d, n("b"), Default::default()).unwrap();
    assert_eq!(std::fs::read(s.home("d/b")).unwrap(), b"aaa");
    assert!(!s.home("d/a").exists());
}

#[test]
fn write_through_create_of_a_name_home_gained_meanwhile_is_eexist_and_shows_home_s_file() {
    let s = Setup::new();
    let (fs, _) = s.fs(Duration::from_secs(3600));
    // The cache lists the directory, and takes a name not in the listing as absent for the validity lag.
    assert!(shown(&fs, 1).is_empty());
    std::fs::write(s.home("x"), b"theirs").unwrap();
    let r = fs.create(1, OsStr::new("x"), 0o644, libc::O_WRONLY | libc::O_EXCL, 0, 0);
    assert!(
        matches!(r, Err(FsError::Exists)),
        "home has the name: {:?}",
        r.map(|_| ())
    );
    assert_eq!(
        std::fs::read(s.home("x")).unwrap(),
        b"theirs",
        "home's file is untouched"
    );
    let x = resolve(&fs, "x").unwrap();
    assert_eq!(
        read_file(&fs, x),
        b"theirs",
        "the cache shows home's file, not an empty one of its own"
    );
}
