//! POSIX behaviour the Linux file-system tests (xfstests) look at, on a real mount: each test does what a
//! program would through the kernel, and compares with what a local file system gives.

mod common;

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::{COMMAND_DEADLINE, LARDER, Mount, TestDir, drain_ok, require_fuse, run_cmd, s};

/// The names `readdir` gives from the directory stream's position on, without `.` and `..`.
///
/// # Safety
/// `d` is an open directory stream.
unsafe fn names_from(d: *mut libc::DIR) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        if name != "." && name != ".." {
            out.push(name);
        }
    }
    out.sort();
    out
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn rewinddir_sees_names_made_and_removed_since_the_opendir() {
    require_fuse();
    let t = TestDir::new("rewinddir");
    std::fs::create_dir(t.home.join("d")).unwrap();
    std::fs::write(t.home.join("d/old"), b"x").unwrap();
    let m = t.mount(&[]);
    let dir = cstr(&m.path("d"));
    let d = unsafe { libc::opendir(dir.as_ptr()) };
    assert!(!d.is_null(), "opendir: {}", std::io::Error::last_os_error());
    let before = unsafe { names_from(d) };
    assert_eq!(before, vec!["old".to_string()]);
    let made: Vec<String> = (0..1000).map(|i| format!("new{i:04}")).collect();
    for n in &made {
        std::fs::write(m.path(&format!("d/{n}")), b"").unwrap();
    }
    std::fs::remove_file(m.path("d/old")).unwrap();
    unsafe { libc::rewinddir(d) };
    let after = unsafe { names_from(d) };
    unsafe { libc::closedir(d) };
    assert_eq!(
        after.len(),
        made.len(),
        "after the rewind: {:?}...",
        &after[..after.len().min(5)]
    );
    assert_eq!(after, made);

    // As xfstests' rewinddir-test (generic/471): nothing read before the rewind.
    std::fs::create_dir(m.path("e")).unwrap();
    let dir = cstr(&m.path("e"));
    let d = unsafe { libc::opendir(dir.as_ptr()) };
    assert!(!d.is_null(), "opendir: {}", std::io::Error::last_os_error());
    for n in &made {
        std::fs::write(m.path(&format!("e/{n}")), b"").unwrap();
    }
    unsafe { libc::rewinddir(d) };
    let after = unsafe { names_from(d) };
    unsafe { libc::closedir(d) };
    assert_eq!(
        after.len(),
        made.len(),
        "read first after the rewind: {:?}...",
        &after[..after.len().min(5)]
    );
    m.unmount();
}

/// The type and source `/proc/self/mountinfo` shows for the mount at `mnt`.
fn type_and_source(mnt: &Path) -> (String, String) {
    let f = common::mountinfo(mnt).unwrap_or_else(|| panic!("{} is not in mountinfo", mnt.display()));
    let sep = f.iter().position(|x| x == "-").expect("mountinfo's separator");
    (f[sep + 1].clone(), f[sep + 2].clone())
}

#[test]
fn a_mount_is_of_type_fuse_larder_and_its_source_is_the_home_as_given() {
    require_fuse();
    let t = TestDir::new("mount-type");
    let m = t.mount(&[]);
    let (fstype, source) = type_and_source(&m.mnt);
    assert_eq!(fstype, "fuse.larder", "as mount -t and fstab name it");
    assert_eq!(
        source,
        t.home.to_str().unwrap(),
        "the home as larder mount was given it"
    );
    // larder's own commands still know it for theirs.
    assert_eq!(
        m.status()["home"]["url"].as_str().map(|u| u.starts_with("file://")),
        Some(true),
        "{}",
        m.status()["home"]
    );
    m.unmount();
}

#[test]
fn larder_mount_is_silent_on_success_unless_a_terminal_watches() {
    require_fuse();
    let t = TestDir::new("silent");
    let args = ["mount", s(&t.home), s(&t.mnt), "--cache-dir", s(&t.cache)];
    let out = common::larder(&args);
    assert!(out.success(), "{out}");
    let m = Mount::adopt(&t.mnt, &t.cache, None);
    assert_eq!(
        out.stdout, "",
        "a mount whose output goes to a pipe says nothing on success"
    );
    m.unmount();
    // On a terminal (script(1) gives it one) it says what it serves, and its daemon's pid.
    let line = format!("{LARDER} {}", args.join(" "));
    let out = run_cmd("script", &["-qec", &line, "/dev/null"], COMMAND_DEADLINE);
    assert!(out.success(), "{out}");
    let m = Mount::adopt(&t.mnt, &t.cache, None);
    assert!(
        out.stdout.contains("serving") && out.stdout.contains(&format!("(pid {})", m.pid)),
        "{out}"
    );
    m.unmount();
}

#[test]
fn a_write_past_the_largest_file_the_cache_disk_holds_is_efbig_and_changes_nothing() {
    require_fuse();
    let t = TestDir::new("efbig");
    std::fs::write(t.home.join("f"), b"home's bytes").unwrap();
    let m = t.mount(&[]);
    let f = std::fs::OpenOptions::new().write(true).open(m.path("f")).unwrap();
    // Past ext4's 16 TiB (and xfs's 8 EiB is beyond what FUSE's offsets reach): the cache file refuses it.
    let at = (1u64 << 44) + 4096;
    let probe = t.root().join("probe");
    let local = std::fs::File::create(&probe).unwrap();
    let cache_disk_refuses = std::os::unix::fs::FileExt::write_at(&local, b"x", at).is_err();
    drop(local);
    if !cache_disk_refuses {
        eprintln!("skipped: this disk's file system holds files past {at} bytes");
        return;
    }
    let e = std::os::unix::fs::FileExt::write_at(&f, b"x", at).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    drop(f);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"home's bytes");
    assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 12);
    m.unmount();
}

#[test]
fn a_device_node_can_be_made_but_not_opened() {
    require_fuse();
    let t = TestDir::new("nodev");
    let m = t.mount(&[]);
    let dev = cstr(&m.path("null"));
    // /dev/null's numbers: 1, 3.
    let made = unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(made, 0, "mknod: {}", std::io::Error::last_os_error());
    let meta = std::fs::metadata(m.path("null")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type()));
    let e = std::fs::File::open(m.path("null")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "the mount is nodev: {e}");
    m.unmount();
}

#[test]
fn a_mount_right_after_an_unmount_waits_for_the_old_daemon_to_close_the_cache() {
    require_fuse();
    let t = TestDir::new("remount-at-once");
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1h"]);
    std::fs::write(m.path("kept"), b"written before the unmount").unwrap();
    let old = m.pid;
    // The old daemon is held (stopped) through the kernel's unmount, as a busy one closing its cache is.
    // (umount(8) would stat the mount point first, which a stopped daemon never answers: the system call.)
    std::process::Command::new("sync").status().unwrap();
    common::signal(old, libc::SIGSTOP);
    let gone = unsafe { libc::umount2(cstr(&m.mnt).as_ptr(), 0) };
    if gone != 0 {
        let e = std::io::Error::last_os_error();
        common::signal(old, libc::SIGCONT);
        panic!("umount2: {e}");
    }
    m.disarm();
    let resume = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        common::signal(old, libc::SIGCONT);
    });
    let began = std::time::Instant::now();
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1h"]);
    resume.join().unwrap();
    assert!(
        began.elapsed() >= std::time::Duration::from_millis(1000),
        "mounted while the old daemon still held the cache"
    );
    assert!(
        common::wait_until(std::time::Duration::from_secs(10), || !common::alive(old)),
        "the old daemon is gone"
    );
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), b"written before the unmount");
    m.unmount();
}

#[test]
fn a_daemon_closing_after_its_unmount_leaves_the_next_mount_at_the_same_place_alone() {
    require_fuse();
    let t = TestDir::new("socket-kept");
    let m = t.mount(&[]);
    let old = m.pid;
    // The old daemon is held (stopped) through the unmount; a mount of another cache directory takes the
    // mount point meanwhile, and the old daemon then finishes closing.
    common::signal(old, libc::SIGSTOP);
    let gone = unsafe { libc::umount2(cstr(&m.mnt).as_ptr(), 0) };
    if gone != 0 {
        let e = std::io::Error::last_os_error();
        common::signal(old, libc::SIGCONT);
        panic!("umount2: {e}");
    }
    m.disarm();
    let other_cache = t.root().join("other-cache");
    let m = common::Mount::new(&t.home, &t.mnt, &other_cache, &[]);
    common::signal(old, libc::SIGCONT);
    assert!(
        common::wait_until(std::time::Duration::from_secs(10), || !common::alive(old)),
        "the old daemon is gone"
    );
    // Its going took nothing of the new daemon's: the control socket at the same place answers.
    assert_eq!(
        m.status()["pid"].as_i64(),
        Some(m.pid as i64),
        "the new daemon's status"
    );
    m.unmount();
}

#[test]
fn a_rename_asking_for_a_whiteout_is_refused_and_renames_nothing() {
    require_fuse();
    let t = TestDir::new("whiteout");
    let m = t.mount(&[]);
    std::fs::write(m.path("a"), b"a").unwrap();
    let (from, to) = (cstr(&m.path("a")), cstr(&m.path("b")));
    let rename = |flags| {
        let r = unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let e = rename(libc::RENAME_WHITEOUT).expect_err("a whiteout rename succeeded");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"a");
    assert!(!m.path("b").exists());
    // The flags larder gives still work.
    rename(libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(std::fs::read(m.path("b")).unwrap(), b"a");
    m.unmount();
}

#[test]
fn a_directory_removed_or_replaced_by_a_rename_has_no_links_left() {
    require_fuse();
    let t = TestDir::new("dir-nlink");
    let m = t.mount(&[]);
    let nlink = |f: &std::fs::File| std::os::unix::fs::MetadataExt::nlink(&f.metadata().unwrap());
    for d in ["a", "b", "c"] {
        std::fs::create_dir(m.path(d)).unwrap();
    }
    let replaced = std::fs::File::open(m.path("b")).unwrap();
    let removed = std::fs::File::open(m.path("c")).unwrap();
    assert_eq!(nlink(&replaced), 2);
    std::fs::rename(m.path("a"), m.path("b")).unwrap();
    std::fs::remove_dir(m.path("c")).unwrap();
    // As on a local file system: the directory replaced, and the one removed, have no name left.
    assert_eq!(nlink(&replaced), 0, "the directory the rename replaced");
    assert_eq!(nlink(&removed), 0, "the directory removed");
    assert_eq!(
        std::os::unix::fs::MetadataExt::nlink(&std::fs::metadata(m.path("b")).unwrap()),
        2
    );
    drop((replaced, removed));
    m.unmount();
}

#[test]
fn a_files_times_stay_as_the_mount_made_them_once_pushed_and_asked_of_home_again() {
    require_fuse();
    let t = TestDir::new("times");
    std::fs::write(t.home.join("old"), b"from home").unwrap();
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1s", "--validity-lag", "1s"]);
    let times = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let s = std::fs::metadata(p).unwrap();
        (
            s.mtime(),
            s.mtime_nsec(),
            s.ctime(),
            s.ctime_nsec(),
            s.atime(),
            s.atime_nsec(),
        )
    };
    std::fs::write(m.path("new"), b"written through the mount").unwrap();
    std::fs::set_permissions(m.path("old"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let before = (times(&m.path("new")), times(&m.path("old")));
    // Home's clock moves on before the pushes land, so its times would differ.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    common::drain_ok(&m, 60);
    // Past the validity lag: asked of home again.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let after = (times(&m.path("new")), times(&m.path("old")));
    assert_eq!(after, before, "(mtime, ctime, atime) of new and old");
    m.unmount();
}

#[test]
fn a_truncated_file_counts_no_more_blocks_than_its_new_size_holds() {
    require_fuse();
    let t = TestDir::new("blocks");
    std::fs::write(t.home.join("f"), vec![7u8; 5 << 20]).unwrap();
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1h"]);
    let blocks = |p: &Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap());
    assert!(blocks(&m.path("f")) >= (5 << 20) / 512, "home's figure before");
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let after = blocks(&m.path("f"));
    assert!(
        after <= (4 << 20) / 512,
        "{after} blocks of 512 bytes for a file of 4 MiB"
    );
    m.unmount();
}

/// A file handle of `path` (`name_to_handle_at`): its bytes, type and length as the kernel gave them.
fn handle_of(path: &Path) -> Vec<u8> {
    // `struct file_handle` (two 32-bit fields) and up to 128 bytes of handle: room for any FUSE handle.
    let mut buf = vec![0u32; 2 + 32];
    buf[0] = 128;
    let mut mount_id = 0;
    let p = cstr(path);
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            p.as_ptr(),
            buf.as_mut_ptr() as *mut libc::file_handle,
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let len = 8 + buf[0] as usize;
    buf.iter().flat_map(|w| w.to_ne_bytes()).take(len).collect()
}

/// Open the file `handle` names on the mount at `mnt` (`open_by_handle_at`, read-only).
fn open_handle(mnt: &Path, handle: &[u8]) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let root = std::fs::File::open(mnt)?;
    let mut buf = vec![0u32; handle.len().div_ceil(4)];
    for (i, chunk) in handle.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        buf[i] = u32::from_ne_bytes(w);
    }
    let fd = unsafe {
        libc::open_by_handle_at(
            root.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::file_handle,
            libc::O_RDONLY,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Drop the kernel's cached dentries and inodes (and pages): its next use of a file handle must ask larder.
fn drop_kernel_caches() {
    std::process::Command::new("sync").status().unwrap();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

#[test]
fn file_handles_stay_good_after_the_kernel_drops_its_caches_and_across_a_remount() {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    require_fuse();
    let t = TestDir::new("handles");
    std::fs::create_dir_all(t.home.join("d/sub")).unwrap();
    std::fs::write(t.home.join("d/sub/f"), b"from home").unwrap();
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1h"]);
    std::fs::write(m.path("d/made"), b"made here").unwrap();
    std::fs::write(m.path("d/gone"), b"removed later").unwrap();
    let names = ["d/sub/f", "d/made", "d/sub", "d"];
    let handles: Vec<(Vec<u8>, u64)> = names
        .iter()
        .map(|n| (handle_of(&m.path(n)), std::fs::metadata(m.path(n)).unwrap().ino()))
        .collect();
    let gone = handle_of(&m.path("d/gone"));
    std::fs::remove_file(m.path("d/gone")).unwrap();

    let check = |mnt: &Path, when: &str| {
        for (name, (h, ino)) in names.iter().zip(&handles) {
            let mut f = open_handle(mnt, h).unwrap_or_else(|e| panic!("{when}: open_by_handle_at {name}: {e}"));
            assert_eq!(f.metadata().unwrap().ino(), *ino, "{when}: {name} is another file");
            if !f.metadata().unwrap().is_dir() {
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                let want = if *name == "d/made" { "made here" } else { "from home" };
                assert_eq!(s, want, "{when}: {name}");
            }
        }
        let e = open_handle(mnt, &gone).map(|_| ()).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::ESTALE),
            "{when}: the removed file's handle"
        );
    };
    check(&m.mnt, "with the kernel's caches");
    drop_kernel_caches();
    check(&m.mnt, "after the kernel dropped its caches");
    m.unmount();
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1h"]);
    check(&m.mnt, "after a remount");
    m.unmount();

    // A cache made anew in the same place gives its numbers out again: the old handles are stale, not
    // another file's.
    std::fs::remove_dir_all(&t.cache).unwrap();
    let m = t.mount(&[]);
    for _ in names {
        let _ = std::fs::metadata(m.path("d/sub/f")).unwrap();
    }
    for (name, (h, _)) in names.iter().zip(&handles) {
        match open_handle(&m.mnt, h) {
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{name} on a new cache: {e}"),
            Ok(f) => panic!(
                "{name}'s handle opened inode {} of a new cache",
                f.metadata().unwrap().ino()
            ),
        }
    }
    m.unmount();
}

/// The value of the Prometheus metric `name` the daemon serves at `addr`.
fn metric(addr: &str, name: &str) -> f64 {
    let text = common::metrics_text(addr);
    common::metric_value(&text, name).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[test]
fn a_file_written_in_small_pieces_with_gaps_is_checksummed_once_not_once_a_piece() {
    use std::io::Read;
    use std::os::unix::fs::FileExt;
    require_fuse();
    let t = TestDir::new("pieces");
    let (m, addr) = t.mount_with_metrics("1h");
    // As xfstests' fstest writes: 512 bytes in every 1,024, so that no two pieces touch (8,192 ranges).
    const SIZE: u64 = 8 << 20;
    let f = std::fs::File::create(m.path("pieces")).unwrap();
    for offset in (0..SIZE).step_by(1024) {
        f.write_all_at(&[7; 512], offset).unwrap();
    }
    drop(f);
    // Closes of readers: each reads the dirty blocks back once at most.
    for _ in 0..3 {
        let mut b = [0u8; 1];
        std::fs::File::open(m.path("pieces"))
            .unwrap()
            .read_exact(&mut b)
            .unwrap();
    }
    let checksummed = metric(&addr, "larder_cache_checksummed_bytes_total");
    assert!(
        checksummed <= 8.0 * SIZE as f64,
        "{checksummed} bytes read back to checksum a file of {SIZE} written once and closed four times"
    );
    let mut content = Vec::new();
    std::fs::File::open(m.path("pieces"))
        .unwrap()
        .read_to_end(&mut content)
        .unwrap();
    assert_eq!(content.len() as u64, SIZE - 512);
    assert!(
        content
            .chunks(1024)
            .all(|c| c[..512] == [7; 512] && c[512..].iter().all(|&b| b == 0))
    );
    m.unmount();
}

/// The access time of `path`, in nanoseconds.
fn atime_ns(path: &Path) -> i128 {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    m.atime() as i128 * 1_000_000_000 + m.atime_nsec() as i128
}

/// Read all of `path` (a file) or list it (a directory).
fn read_it(path: &Path) {
    if path.is_dir() {
        let _ = std::fs::read_dir(path).unwrap().count();
    } else {
        let _ = std::fs::read(path).unwrap();
    }
}

#[test]
fn reads_move_access_times_as_the_mounts_atime_option_says() {
    require_fuse();
    let nap = || std::thread::sleep(std::time::Duration::from_millis(30));
    // For each option: whether a first read after a write moves atime, and whether a second read does.
    for (opts, first, second, dirs) in [
        (vec![], true, false, true),
        (vec!["--atime", "strictatime"], true, true, true),
        (vec!["--atime", "noatime"], false, false, false),
        (vec!["--nodiratime"], true, false, false),
    ] {
        let t = TestDir::new("atime");
        std::fs::write(t.home.join("cold"), vec![3u8; 100_000]).unwrap();
        let m = t.mount(&opts);
        std::fs::create_dir(m.path("d")).unwrap();
        std::fs::write(m.path("d/f"), b"written here").unwrap();
        // Written here (read again through its cache file: passthrough), never read yet (its first read is
        // the daemon's, from home; the second is the kernel's from the cache file), and a directory.
        for name in ["d/f", "cold", "d"] {
            let p = m.path(name);
            let want_first = if name == "d" { first && dirs } else { first };
            let want_second = if name == "d" { second && dirs } else { second };
            // A move may reach the kernel's cached attributes a moment after the read (an invalidation
            // larder sends): waited for, within a bound. No move is checked at once and again after it.
            let after = |before: i128, want: bool| {
                let bound = std::time::Duration::from_millis(if want { 2000 } else { 300 });
                let moved = common::wait_until(bound, || atime_ns(&p) > before);
                if !want {
                    assert!(!moved, "{opts:?} {name}: a read moved atime");
                }
                (moved, atime_ns(&p))
            };
            let a0 = atime_ns(&p);
            nap();
            read_it(&p);
            let (moved, a1) = after(a0, want_first);
            assert_eq!(moved, want_first, "{opts:?} {name}: first read: {a0} -> {a1}");
            nap();
            read_it(&p);
            let (moved, a2) = after(a1, want_second);
            assert_eq!(moved, want_second, "{opts:?} {name}: second read: {a1} -> {a2}");
        }
        let kept = atime_ns(&m.path("d/f"));
        m.unmount();
        let m = t.mount(&opts);
        assert_eq!(atime_ns(&m.path("d/f")), kept, "{opts:?}: after a remount");
        m.unmount();
    }
}

#[test]
fn a_write_through_mmap_moves_mtime_and_ctime_at_once_to_the_time_of_the_write() {
    use std::os::unix::fs::MetadataExt;
    require_fuse();
    let t = TestDir::new("mmap-times");
    let m = t.mount(&[]);
    let p = m.path("mapped");
    std::fs::write(&p, vec![1u8; 4096]).unwrap();
    let ns = |m: &std::fs::Metadata| {
        (
            m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        )
    };
    let (mtime0, ctime0) = ns(&std::fs::metadata(&p).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(50));
    // As xfs_io's `mmap` and `mwrite` do (xfstests generic/080 and 215): another process opens the file
    // (whole in the cache: the kernel maps the cache file itself), writes through a shared mapping, says
    // when, and exits 200 ms later without unmapping or closing.
    let script = format!(
        "import mmap, os, sys, time\n\
         fd = os.open({:?}, os.O_RDWR)\n\
         m = mmap.mmap(fd, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n\
         m[0:4096] = bytes([9]) * 4096\n\
         print(time.time_ns(), flush=True)\n\
         time.sleep(0.2)\n\
         os._exit(0)\n",
        p.to_str().unwrap()
    );
    let out = run_cmd("python3", &["-c", &script], COMMAND_DEADLINE);
    assert!(out.success(), "{out}");
    let written: i128 = out.stdout.trim().parse().unwrap();
    let (mtime1, ctime1) = ns(&std::fs::metadata(&p).unwrap());
    assert!(
        mtime1 > mtime0 && ctime1 > ctime0,
        "after the writer exited: mtime {mtime0} -> {mtime1}, ctime {ctime0} -> {ctime1}"
    );
    assert!(
        mtime1 <= written,
        "mtime is {} ms after the write: the time the write was taken in, not its own",
        (mtime1 - written) / 1_000_000
    );
    assert_eq!(std::fs::read(&p).unwrap(), vec![9u8; 4096]);
    m.unmount();
}

/// `setxattr(2)` of `name` with `value` on `path`: its errno on failure.
fn set_xattr(path: &Path, name: &str, value: &[u8]) -> Result<(), i32> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    match unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
    }
}

#[test]
fn an_xattr_home_has_no_room_for_is_refused_at_the_call_and_what_is_taken_reaches_home() {
    require_fuse();
    let t = TestDir::new("xattr-room");
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "1h"]);
    // The file system home is on, asked directly beside it, is the oracle.
    let oracle = t.home.parent().unwrap().join("oracle");
    let mut taken = Vec::new();
    for (i, len) in [10usize, 1000, 3000, 8000, 32000, 65536].into_iter().enumerate() {
        std::fs::write(&oracle, b"").unwrap();
        let name = format!("user.v{i}");
        let value = vec![b'a' + i as u8; len];
        let want = set_xattr(&oracle, &name, &value);
        let f = m.path(&format!("f{i}"));
        std::fs::write(&f, b"x").unwrap();
        let got = set_xattr(&f, &name, &value);
        assert_eq!(
            got.is_ok(),
            want.is_ok(),
            "a value of {len} bytes: mount {got:?}, home's file system {want:?}"
        );
        if let Err(e) = got {
            assert!(
                e == libc::ENOSPC || e == libc::E2BIG,
                "a value of {len} bytes: errno {e}"
            );
        } else {
            taken.push((format!("f{i}"), name, value));
        }
    }
    assert!(!taken.is_empty());
    let out = run_cmd(LARDER, &["drain", s(&m.mnt), "--timeout", "60s"], COMMAND_DEADLINE);
    assert!(out.success(), "drain: {out}");
    for (file, name, value) in &taken {
        let p = cstr(&t.home.join(file));
        let n = CString::new(name.as_str()).unwrap();
        let mut buf = vec![0u8; 70000];
        let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(r, value.len() as isize, "{file} {name} at home");
        assert_eq!(&buf[..value.len()], &value[..]);
    }
    m.unmount();
}

#[test]
fn direct_and_buffered_io_on_one_file_at_once_never_fail_an_open_or_fsync() {
    require_fuse();
    let t = TestDir::new("mixed-io");
    let m = t.mount(&["--write-mode", "write-back"]);
    // xfstests' generic/366: fio reads 512 bytes at a time with O_DIRECT, writes 8 KiB at a time with
    // O_DIRECT (libaio) and through the page cache (POSIX aio), all at random offsets of one file that the
    // first job lays out (written, then fsynced). A direct write that collides with a buffered one may
    // fail with EIO, as on a local disk (fio ignores those); nothing else may fail: not an open, not the
    // lay-out's fsync.
    let job = t.root().join("mixed.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\nbs=8k\niodepth=1\nrandrepeat=1\nsize=256k\ndirectory={}\nnumjobs=1\n\
             [job1]\nioengine=sync\nbs=512\ndirect=1\nrw=randread\nfilename=file1\n\
             [job2]\nioengine=libaio\nrw=randwrite\ndirect=1\nfilename=file1\n\
             [job3]\nioengine=posixaio\nrw=randwrite\nfilename=file1\n",
            s(&m.mnt)
        ),
    )
    .unwrap();
    for round in 0..32 {
        if round % 2 == 0 {
            // Made anew (as xfstests makes a new scratch file system every round) half the time.
            let _ = std::fs::remove_file(m.path("file1"));
        }
        let out = run_cmd("fio", &[s(&job), "--ignore_error=,EIO"], COMMAND_DEADLINE);
        assert!(out.success(), "round {round}: fio failed:\n{out}");
    }
    m.unmount();
}

#[test]
fn a_file_being_rewritten_and_pushed_never_shows_zero_blocks() {
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    require_fuse();
    let t = TestDir::new("blocks-rewrite");
    // Pushed as soon as each close queues it: a push is under way much of the time.
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    let p = m.path("foo");
    std::fs::write(&p, vec![1u8; 64 << 10]).unwrap();
    // As xfstests' generic/615: 64 KiB rewritten in place, with O_SYNC and then O_DIRECT, while another
    // thread stats the file.
    let done = std::sync::atomic::AtomicBool::new(false);
    let (stats, zeros) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let (mut stats, mut zeros) = (0u64, 0u64);
            while !done.load(std::sync::atomic::Ordering::Relaxed) && stats < 1_000_000 {
                zeros += (std::fs::metadata(&p).unwrap().blocks() == 0) as u64;
                stats += 1;
            }
            (stats, zeros)
        });
        let buf = Aligned::new(64 << 10, 7);
        for flags in [libc::O_SYNC, libc::O_DIRECT] {
            for _ in 0..400 {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(flags)
                    .open(&p)
                    .unwrap();
                f.write_all_at(unsafe { std::slice::from_raw_parts(buf.ptr, 64 << 10) }, 0)
                    .unwrap();
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        watcher.join().unwrap()
    });
    assert_eq!(zeros, 0, "{zeros} of {stats} stats showed 0 blocks for 64 KiB of data");
    m.unmount();
}

/// A buffer of `len` bytes aligned for direct I/O.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize, fill: u8) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null());
        unsafe { std::ptr::write_bytes(ptr, fill, len) };
        Aligned { ptr, layout }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[test]
fn punching_every_other_page_of_a_file_open_for_writing_reads_it_back_once_not_once_a_punch() {
    use std::os::fd::AsRawFd;
    require_fuse();
    let t = TestDir::new("punch-alternating");
    let (m, addr) = t.mount_with_metrics("1h");
    const SIZE: u64 = 4 << 20;
    let p = m.path("foobar");
    std::fs::write(&p, vec![0xab; SIZE as usize]).unwrap();
    let before = metric(&addr, "larder_cache_checksummed_bytes_total");
    // As xfstests' punch-alternating (generic/610): the file open for writing (the kernel writes its cache
    // file itself), every other page punched out, one call each.
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    for page in (0..SIZE / 4096).step_by(2) {
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (page * 4096) as i64,
                4096,
            )
        };
        assert_eq!(r, 0, "punch at page {page}: {}", std::io::Error::last_os_error());
    }
    let read_back = metric(&addr, "larder_cache_checksummed_bytes_total") - before;
    drop(f);
    assert!(
        read_back <= 2.0 * SIZE as f64,
        "{read_back} bytes read back to checksum {} punches in a file of {SIZE}",
        SIZE / 8192
    );
    let content = std::fs::read(&p).unwrap();
    assert_eq!(content.len() as u64, SIZE);
    for (page, bytes) in content.chunks(4096).enumerate() {
        let want = if page % 2 == 0 { 0 } else { 0xab };
        assert!(bytes.iter().all(|&b| b == want), "page {page}");
    }
    m.unmount();
}

/// `open(dir, O_TMPFILE)`: a descriptor on `dir`'s file system, or the error.
fn open_tmpfile(dir: &Path, extra: i32) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let c = cstr(dir);
    // SAFETY: a NUL-terminated path and plain flags; the descriptor is owned by the File made of it.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | extra, 0o640) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// `linkat` of the file open as `f` to `to`, through `/proc/self/fd` (what needs no capability).
fn link_open_file(f: &std::fs::File, to: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let from = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    let to = cstr(to);
    // SAFETY: two NUL-terminated paths and a flag.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `O_TMPFILE`, as on a local disk: a file with no name, no link and no trace at home, gone at its last
/// close, unless `linkat` names it; then it is a file like any other, written before and after the link,
/// that home gets and a remount keeps. With `O_EXCL` it can never be named.
#[test]
fn an_o_tmpfile_file_has_no_name_until_linkat_gives_it_one() {
    use std::io::{Seek, Write};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_fuse();
    let t = TestDir::new("tmpfile");
    std::fs::create_dir(t.home.join("d")).unwrap();
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    let d = m.path("d");

    let mut f = open_tmpfile(&d, 0).expect("O_TMPFILE on the mount");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o640);
    f.write_all(b"written before the link\n").unwrap();
    f.sync_all().unwrap();
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "a nameless file is listed");
    link_open_file(&f, &d.join("named")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    assert_eq!(
        f.metadata().unwrap().ino(),
        std::fs::metadata(d.join("named")).unwrap().ino()
    );
    f.write_all(b"and after it\n").unwrap();
    f.rewind().unwrap();
    drop(f);
    let want = b"written before the link\nand after it\n";
    assert_eq!(std::fs::read(d.join("named")).unwrap(), want);

    // Never named: gone at its close, and home never hears of it.
    let mut g = open_tmpfile(&d, 0).unwrap();
    g.write_all(&vec![7u8; 300_000]).unwrap();
    drop(g);
    // With O_EXCL it cannot be named.
    let h = open_tmpfile(&d, libc::O_EXCL).unwrap();
    let e = link_open_file(&h, &d.join("excl")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    drop(h);

    drain_ok(&m, 60);
    let listed = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(listed(&d), ["named"]);
    assert_eq!(listed(&t.home.join("d")), ["named"], "home holds what the mount lists");
    assert_eq!(std::fs::read(t.home.join("d/named")).unwrap(), want);
    assert_eq!(
        std::fs::metadata(t.home.join("d/named")).unwrap().permissions().mode() & 0o777,
        0o640
    );
    m.unmount();
    let m = t.mount(&["--write-mode", "write-back", "--sync-lag", "0s"]);
    assert_eq!(std::fs::read(m.path("d/named")).unwrap(), want, "after a remount");
    m.unmount();
}

/// A direct write by a user without `CAP_FSETID` clears the file's set-ID bits, and `stat` shows it at
/// once (fstests' generic/355): the kernel takes the new mode from no answer of its own after a direct
/// write, so larder drops the attributes it holds. Each step runs on the local disk too.
#[test]
fn a_direct_write_clears_set_id_bits_and_stat_shows_it_at_once() {
    require_fuse();
    let t = TestDir::new("direct-setid");
    let m = t.mount(&[]);
    let local = t.root().join("local");
    std::fs::create_dir(&local).unwrap();
    for d in [t.root(), &m.mnt, &local] {
        let c = cstr(d);
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::chmod(c.as_ptr(), 0o755) }, 0);
    }
    let mut wrong = Vec::new();
    for (i, start) in ["6777", "6744", "2774"].iter().enumerate() {
        let mut modes = Vec::new();
        for root in [&local, &m.mnt] {
            let f = root.join(format!("f{i}"));
            let script = format!(
                "echo x > {f} && chown 65534:65534 {f} && chmod {start} {f} && stat -c %A {f} >/dev/null && \
                 setpriv --reuid=65534 --regid=65534 --clear-groups \
                 dd if=/dev/zero of={f} bs=4096 count=1 oflag=direct conv=notrunc status=none && stat -c %a {f}",
                f = s(&f)
            );
            let out = run_cmd("sh", &["-c", &script], COMMAND_DEADLINE);
            assert!(out.success(), "{script}: {out}");
            modes.push(out.stdout.trim().to_string());
        }
        if modes[0] != modes[1] {
            wrong.push(format!("{start}: local disk {}, mount {}", modes[0], modes[1]));
        }
    }
    assert!(wrong.is_empty(), "modes after a direct write differ: {wrong:?}");
    m.unmount();
}
