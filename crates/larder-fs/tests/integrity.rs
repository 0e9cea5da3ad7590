//! The core's own integrity without a mount: what a write cut short by the cache disk leaves.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use larder_fs::{Fs, FsConfig, FsError};
use larder_home::{Home, PosixHome};

mod common;

/// A tmpfs of `mib` MiB at `dir`, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn new(dir: &Path, mib: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs (the core's tests run as root)");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A write through the core that the cache disk cuts short (the disk filled by something else between
/// the core's look at its room and the write: the room check cannot see that coming) fails with `ENOSPC`,
/// leaves the file the size it had, and leaves no bytes in the cache file past that size: a reader of
/// the cache file (the kernel, through passthrough) reads exactly the file.
#[test]
fn a_write_the_cache_disk_cuts_short_leaves_the_file_and_its_cache_file_as_they_were() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let (dir, home_dir, cache_dir) = common::dirs();
    let _fs = Tmpfs::new(&cache_dir, 16);
    let store = common::open_store_of(&cache_dir, 1 << 30).unwrap();
    let home: Arc<dyn Home> = Arc::new(PosixHome::new(&home_dir, Some(Duration::from_secs(10))).unwrap());
    let cfg = FsConfig {
        sync_lag: Duration::from_secs(3600),
        conflicts_dir: dir.path().join("conflicts"),
        ..FsConfig::default()
    };
    let fs = Fs::new(home, store, cfg).unwrap();
    let (entry, open) = fs.create(1, OsStr::new("f"), 0o644, libc::O_RDWR, 0, 0).unwrap();
    let ino = entry.attr.ino;
    let head = vec![7u8; 100_000];
    assert_eq!(fs.write(open.fh, 0, &head).unwrap(), head.len() as u32);
    // The core looked at the disk's room just now (plenty): fill it, all but a little, behind its back.
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(cache_dir.join("filler")).unwrap();
        let free = nix_free(&cache_dir);
        let chunk = vec![1u8; 64 << 10];
        let mut left = free.saturating_sub(200 << 10);
        while left > 0 && filler.write_all(&chunk[..chunk.len().min(left as usize)]).is_ok() {
            left = left.saturating_sub(chunk.len() as u64);
        }
    }
    let tail = vec![9u8; 2 << 20];
    match fs.write(open.fh, head.len() as u64, &tail) {
        Err(FsError::Cache(larder_cache::CacheError::NoSpace)) | Err(FsError::NoSpace) => {}
        other => panic!("a write past the disk's room gave {other:?}"),
    }
    assert_eq!(
        fs.getattr(ino).unwrap().attr.size,
        head.len() as u64,
        "the file's size moved"
    );
    let cache_file = std::fs::read_dir(cache_dir.join("objects"))
        .unwrap()
        .flatten()
        .filter(|d| d.path().is_dir() && d.file_name() != "spare")
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .map(|f| f.metadata().unwrap().len())
        .max()
        .unwrap();
    assert_eq!(
        cache_file,
        head.len() as u64,
        "the cache file holds bytes past the file's end"
    );
    assert_eq!(fs.read(open.fh, 0, 4 << 20).unwrap(), head, "what a reader reads");
    fs.release(open.fh).unwrap();
    fs.shutdown().unwrap();
}

/// Free bytes of the file system at `dir`.
fn nix_free(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str())).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid path and a buffer for statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) }, 0);
    // SAFETY: statvfs returned 0.
    let st = unsafe { st.assume_init() };
    st.f_bavail * st.f_frsize
}
