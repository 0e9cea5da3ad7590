//! Write-back while home is away, in the core without a mount (a real POSIX home in a temporary directory,
//! counted by the metrics layer): what the cache lists and finds, and which names it lets be made.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use larder_fs::{Drained, FsConfig, FsError};
use larder_home::{Fault, FaultLayer, HomeError, OpKind};

mod common;
use common::*;

#[test]
fn a_start_while_home_is_away_lists_directories_from_the_cache() {
    let s = Setup::new();
    s.home_dir_of_files("d", 3, b"x");
    let write_back = |lag| FsConfig {
        validity_lag: lag,
        ..held_back()
    };
    {
        let (fs, _) = s.fs_configured(Arc::new(FaultLayer::default()), write_back(Duration::from_secs(3600)));
        let d = resolve(&fs, "d").unwrap();
        let fh = fs.opendir(d).unwrap();
        assert_eq!(fs.readdir(fh, 0).unwrap().len(), 5);
        fs.releasedir(fh);
        let (_, open) = fs.create(d, OsStr::new("new"), 0o644, libc::O_WRONLY, 0, 0).unwrap();
        fs.release(open.fh).unwrap();
        fs.shutdown().unwrap();
    }
    // Home away from the start; the listing the last run kept is past this run's lag.
    let faults = Arc::new(FaultLayer::default());
    for op in [OpKind::Stat, OpKind::List] {
        faults.inject(Fault {
            op,
            error: HomeError::Unavailable("home is away".into()),
            count: usize::MAX,
            landed: false,
        });
    }
    let (fs, _) = s.fs_configured(faults, write_back(Duration::from_millis(1)));
    std::thread::sleep(Duration::from_millis(5));
    let d = resolve(&fs, "d").unwrap();
    let fh = fs.opendir(d).expect("the cached listing, home being away");
    let mut names: Vec<String> = fs
        .readdir(fh, 0)
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.name.into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".", "..", "f0", "f1", "f2", "new"]);
}

#[test]
fn write_back_offline_names_not_known_look_absent_and_can_be_made() {
    let s = Setup::new();
    std::fs::write(s.home("there"), b"at home").unwrap();
    let faults = Arc::new(FaultLayer::default());
    let fs = s.write_back(faults.clone());
    // Home cannot be reached and the root was never listed: the cache cannot say what is in it.
    for op in [OpKind::Stat, OpKind::List] {
        faults.inject(Fault {
            op,
            error: HomeError::Unavailable("test".into()),
            count: 1000,
            landed: false,
        });
    }
    assert!(matches!(fs.lookup(1, OsStr::new("there")), Err(FsError::NotFound)));
    let (_, r) = fs.create(1, OsStr::new("new"), 0o640, libc::O_WRONLY, 0, 0).unwrap();
    fs.write(r.fh, 0, b"made offline").unwrap();
    fs.release(r.fh).unwrap();
    let d = fs.mkdir(1, OsStr::new("d"), 0o755, 0, 0).unwrap().attr.ino;
    fs.rename(1, OsStr::new("new"), d, OsStr::new("moved"), Default::default())
        .unwrap();
    faults.clear();
    // Home answers again: the name that looked absent is asked again, not remembered as absent.
    assert!(fs.lookup(1, OsStr::new("there")).is_ok());
    assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty, "the journal drains");
    assert_eq!(std::fs::read(s.home("d/moved")).unwrap(), b"made offline");
    assert!(!s.home("new").exists());
}

/// A name the cache knew before a restart is still known while home is away after it: made again, it is
/// refused as existing, not made over home's object (which would be a conflict at push).
#[test]
fn write_back_offline_after_a_restart_names_known_before_still_exist() {
    let s = Setup::new();
    std::fs::write(s.home("there"), b"at home").unwrap();
    let faults = Arc::new(FaultLayer::default());
    {
        let fs = s.write_back(faults.clone());
        assert!(fs.lookup(1, OsStr::new("there")).is_ok());
        // Home goes away with a change queued (a mount with nothing queued does not start offline).
        for op in [OpKind::Stat, OpKind::Create] {
            faults.inject(Fault {
                op,
                error: HomeError::Unavailable("test".into()),
                count: 1000,
                landed: false,
            });
        }
        let (_, r) = fs.create(1, OsStr::new("new"), 0o640, libc::O_WRONLY, 0, 0).unwrap();
        fs.release(r.fh).unwrap();
        fs.stop_flushers();
        fs.shutdown().unwrap();
    }
    let fs = s.write_back(faults.clone());
    assert!(
        matches!(
            fs.create(1, OsStr::new("there"), 0o640, libc::O_WRONLY | libc::O_EXCL, 0, 0),
            Err(FsError::Exists)
        ),
        "a known name made again while home is away"
    );
    let there = fs
        .lookup(1, OsStr::new("there"))
        .expect("known from before the restart");
    assert_eq!(there.attr.size, 7);
    assert_eq!(std::fs::read(s.home("there")).unwrap(), b"at home");
    fs.stop_flushers();
}
