//! Finding larder mounts, their control sockets, and unmounting them.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cli::UnmountArgs;
use crate::control;

/// The source (fsname) of every larder mount begins with this, followed by the home's URL.
pub const SOURCE_PREFIX: &str = "larder:";

/// What is mounted at a path.
#[derive(Debug, PartialEq, Eq)]
pub enum Mounted {
    Nothing,
    Larder,
    Other(String),
}

/// `path` made absolute and cleaned of `.` and `..` without touching the file system (a dead FUSE mount
/// cannot be stat'ed).
pub fn absolute(path: &Path) -> Result<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is mounted at `mountpoint` (the topmost mount, if several).
pub fn mounted_at(mountpoint: &Path) -> Mounted {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Mounted::Nothing;
    };
    let want = mountpoint.to_string_lossy();
    let mut found = Mounted::Nothing;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() > 4 && sep + 2 < fields.len() && unescape(fields[4]) == want {
            let (fstype, source) = (fields[sep + 1], unescape(fields[sep + 2]));
            found = if fstype.starts_with("fuse") && source.starts_with(SOURCE_PREFIX) {
                Mounted::Larder
            } else {
                Mounted::Other(fstype.to_string())
            };
        }
    }
    found
}

/// Where the daemon for `mountpoint` listens.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let dir = runtime_dir();
    dir.join(format!("{:016x}.sock", fnv64(mountpoint.as_os_str().as_bytes())))
}

/// The directory of control sockets: owner-only.
pub fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/run/larder")
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(d).join("larder")
    } else {
        // SAFETY: geteuid has no preconditions.
        std::env::temp_dir().join(format!("larder-{}", unsafe { libc::geteuid() }))
    }
}

/// FNV-1a, for short stable names.
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Unmount `mountpoint` at the kernel; `lazy` detaches even while busy.
pub fn kernel_unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    let c = CString::new(mountpoint.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let mut cmd = std::process::Command::new("fusermount3");
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        let out = cmd.arg(mountpoint).output()?;
        if !out.status.success() {
            let msg = String::from_utf8_lossy(&out.stderr);
            let code = if msg.contains("busy") { libc::EBUSY } else { libc::EPERM };
            return Err(std::io::Error::from_raw_os_error(code));
        }
        return Ok(());
    }
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// `larder unmount`.
pub fn unmount(args: UnmountArgs) -> Result<()> {
    let mnt = absolute(&args.mountpoint)?;
    match mounted_at(&mnt) {
        Mounted::Larder => {}
        Mounted::Other(t) => bail!("{} is a {t} mount, not a larder mount", mnt.display()),
        Mounted::Nothing => bail!("{} is not mounted", mnt.display()),
    }
    let status = control::status(&socket_path(&mnt)).ok();
    let pending = status.as_ref().map_or(0, |v| v.journal.pending_ops);
    let local = status.as_ref().is_some_and(|v| v.write_mode == "local");
    if pending > 0 && !local {
        if args.drain {
            crate::journal::drain_mount(&mnt, args.timeout)
                .context("not unmounted (--leave-pending unmounts and keeps them for the next mount)")?;
        } else if !args.leave_pending {
            bail!(
                "{pending} changes at {} have not reached home yet: run `larder drain {}`, or unmount with --drain \
                 (push them first) or --leave-pending (the next mount of this cache pushes them)",
                mnt.display(),
                mnt.display()
            );
        }
    }
    let pid = status.map(|v| v.pid as i32);
    match kernel_unmount(&mnt, false) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => bail!(
            "cannot unmount {}: it is busy (a file is open or a process has its working directory there)",
            mnt.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot unmount {}", mnt.display())),
    }
    if let Some(pid) = pid {
        let deadline = Instant::now() + args.timeout;
        while alive(pid) {
            if Instant::now() > deadline {
                bail!(
                    "unmounted {}, but its daemon (pid {pid}) did not exit within {:?}",
                    mnt.display(),
                    args.timeout
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!("unmounted {}", mnt.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned() {
        assert_eq!(absolute(Path::new("/a/./b/../c")).unwrap(), PathBuf::from("/a/c"));
        assert_eq!(unescape("/mnt/my\\040dir"), "/mnt/my dir");
    }
}
