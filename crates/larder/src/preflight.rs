//! Checks before mounting, each failing with one line that names what is wrong.

use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use larder_home::{Home, HomeCounters, HomeSpec, open_home};

use crate::cli::MountArgs;
use crate::{control, mounts};

/// What the checks produced.
pub struct Prepared {
    pub home: Arc<dyn Home>,
    pub counters: Arc<HomeCounters>,
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    /// Something to tell the user that does not stop the mount.
    pub note: Option<String>,
}

/// The cache directory used when none is given.
pub fn default_cache_dir(home: &str, mountpoint: &Path) -> PathBuf {
    let mut key = home.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(mountpoint.as_os_str().as_bytes());
    let name = format!("{:016x}", mounts::fnv64(&key));
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(x).join("larder").join(name);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/cache/larder").join(name);
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/larder").join(name),
        None => PathBuf::from("/var/tmp/larder").join(name),
    }
}

/// Check the home, the mount point, the cache directory and FUSE; create the cache directory.
pub fn check(args: &MountArgs) -> Result<Prepared> {
    let spec = HomeSpec {
        url: args.home.clone(),
        op_timeout: Some(args.home_timeout),
        wan: args.emulate_wan,
        s3_endpoint: args.s3_endpoint.clone(),
        s3_region: args.s3_region.clone(),
        s3_credentials: args
            .s3_credentials
            .as_deref()
            .map(crate::secrets::s3_credentials)
            .transpose()?,
        s3_metadata: args.s3_metadata == crate::cli::OnOff::On,
        fault_file: args.fault_file.clone(),
    };
    let opened = open_home(&spec).map_err(anyhow::Error::msg)?;
    let (home, counters) = (opened.home, opened.counters);
    let mnt = mounts::absolute(&args.mountpoint)?;
    if args.cache_size < 4 * args.block_size {
        bail!(
            "--cache-size {} is too small: it must hold at least 4 blocks of --block-size {}",
            args.cache_size,
            args.block_size
        );
    }

    if mounts::mounted_at(&mnt) == mounts::Mounted::Larder {
        // Another user's mount is asked through its owner's socket: root finding its own socket silent
        // there must not take that live mount for a dead one and clear it.
        if let Ok(v) = control::status(&mounts::daemon_socket(&mnt)?) {
            bail!("another larder (pid {}) already serves {}", v.pid, mnt.display());
        }
        // A daemon that died without unmounting leaves a dead mount: clear it.
        mounts::kernel_unmount(&mnt, true).map_err(|e| {
            anyhow::anyhow!(
                "{} holds a dead larder mount that cannot be cleared: {e}",
                mnt.display()
            )
        })?;
        tracing::warn!(mountpoint = %mnt.display(), "cleared a dead larder mount left by a previous daemon");
    }
    match std::fs::metadata(&mnt) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("mount point {} is not a directory", mnt.display()),
        Err(e) => bail!("mount point {} is not usable: {e}", mnt.display()),
    }
    let mnt = std::fs::canonicalize(&mnt)?;
    if std::fs::read_dir(&mnt)?.next().is_some() {
        bail!("mount point {} is not empty", mnt.display());
    }
    let home_root = home.describe();
    let home_path = Path::new(home_root.strip_prefix("file://").unwrap_or(&home_root));
    if home_root.starts_with("file://") && mnt.starts_with(home_path) {
        bail!(
            "mount point {} is inside the home {}: larder would read itself",
            mnt.display(),
            home_path.display()
        );
    }

    let cache_dir = match &args.cache_dir {
        Some(d) => mounts::absolute(d)?,
        None => default_cache_dir(&home_root, &mnt),
    };
    if cache_dir.starts_with(&mnt) {
        bail!(
            "cache dir {} is inside the mount point {}",
            cache_dir.display(),
            mnt.display()
        );
    }
    // Owner-only from the start; one found wider is narrowed by the daemon once it holds the lock.
    if let Err(e) = larder_util::private::create_dir_all(&cache_dir) {
        bail!("cache dir {} cannot be created: {e}", cache_dir.display());
    }
    let cache_dir = std::fs::canonicalize(&cache_dir)?;
    if cache_dir.starts_with(&mnt) {
        bail!(
            "cache dir {} is inside the mount point {}",
            cache_dir.display(),
            mnt.display()
        );
    }
    let probe = cache_dir.join(".larder-probe");
    if let Err(e) = larder_util::private::write(&probe, b"ok") {
        bail!("cache dir {} is not writable: {e}", cache_dir.display());
    }
    let _ = std::fs::remove_file(&probe);

    warn_if_small_disk(&cache_dir, args.cache_size);
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        bail!("FUSE is not available (/dev/fuse: {e}); install fuse3 and load the fuse module");
    }
    Ok(Prepared {
        home,
        counters,
        mountpoint: mnt,
        cache_dir,
        note: opened.note,
    })
}

/// statvfs(3) of the file system holding `path`.
pub(crate) fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: statvfs is plain data; zeroed is a valid initial value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `s` a valid out-pointer for the duration of the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s)
}

fn warn_if_small_disk(dir: &Path, cache_size: u64) {
    let Ok(s) = statvfs(dir) else {
        return;
    };
    let free = s.f_bavail.saturating_mul(s.f_frsize);
    if free < cache_size {
        tracing::warn!(
            cache_dir = %dir.display(),
            free_bytes = free,
            cache_size,
            "the cache disk has less free space than --cache-size; a full disk stops caching (reads still work) and fails writes with ENOSPC"
        );
    }
}
