//! Finding larder mounts, their control sockets, and unmounting them.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::cli::{RemountArgs, UnmountArgs};
use crate::control;

/// The type of a larder mount: `fuse`, of subtype `larder`.
pub const FSTYPE: &str = "fuse.larder";
/// Mounts of earlier larder daemons were of type `fuse`, their source this followed by the home's URL.
const SOURCE_PREFIX: &str = "larder:";

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

/// One line of /proc/self/mountinfo, the parts larder reads.
struct MountEntry {
    fstype: String,
    source: String,
    /// The file system's own options (for FUSE: `rw,user_id=1000,group_id=1000,...`).
    options: String,
}

/// The topmost mount at `mountpoint`, if any.
fn topmost(mountpoint: &Path) -> Option<MountEntry> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() > 4 && sep + 2 < fields.len() && unescape(fields[4]) == want {
            found = Some(MountEntry {
                fstype: fields[sep + 1].to_string(),
                source: unescape(fields[sep + 2]),
                options: fields.get(sep + 3).map_or_else(String::new, |o| o.to_string()),
            });
        }
    }
    found
}

impl MountEntry {
    fn is_larder(&self) -> bool {
        self.fstype == FSTYPE || (self.fstype == "fuse" && self.source.starts_with(SOURCE_PREFIX))
    }
}

/// What is mounted at `mountpoint` (the topmost mount, if several).
pub fn mounted_at(mountpoint: &Path) -> Mounted {
    match topmost(mountpoint) {
        None => Mounted::Nothing,
        Some(m) if m.is_larder() => Mounted::Larder,
        Some(m) => Mounted::Other(m.fstype),
    }
}

/// The user who mounted the larder mount at `mountpoint`, whose daemon serves it: the FUSE mount's
/// `user_id`. `None` if no larder mount is there.
fn owner_of(mountpoint: &Path) -> Option<u32> {
    let m = topmost(mountpoint).filter(MountEntry::is_larder)?;
    m.options
        .split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|uid| uid.parse().ok())
}

/// Where the daemon for `mountpoint` listens, if this user started it.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(socket_name(mountpoint))
}

/// The name of the control socket of the daemon for `mountpoint`, in its owner's [`runtime_dir`].
fn socket_name(mountpoint: &Path) -> String {
    format!("{:016x}.sock", fnv64(mountpoint.as_os_str().as_bytes()))
}

/// Where to ask the daemon serving the larder mount at `mountpoint`. Its control socket is in the
/// directory of the user who mounted it, which only that user can enter: this user's own for a mount of
/// their own; for root, the owner's, found as [`owners_socket`] says. Anyone else is told whose mount it
/// is rather than that nothing answers.
pub fn daemon_socket(mountpoint: &Path) -> Result<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let Some(owner) = owner_of(mountpoint).filter(|owner| *owner != me) else {
        return Ok(socket_path(mountpoint));
    };
    if me != 0 {
        bail!(
            "{} is a larder mount of user {}: only that user (or root) can ask its daemon; run the command as \
             that user",
            mountpoint.display(),
            user_name(owner)
        );
    }
    let dirs = owners_dirs(owner);
    owners_socket(owner, &socket_name(mountpoint), &dirs).ok_or_else(|| {
        let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        anyhow!(
            "{} is a larder mount of user {}, and no control socket of its daemon was found (in {} or among \
             the sockets this host has bound); run the command as that user",
            mountpoint.display(),
            user_name(owner),
            looked.join(", ")
        )
    })
}

/// The directories user `uid`'s daemons keep their control sockets in, as [`runtime_dir`] chooses them
/// for that user: `$XDG_RUNTIME_DIR/larder` where it is the usual `/run/user/UID`, else `larder-UID` in
/// the temporary directory.
fn owners_dirs(uid: u32) -> Vec<PathBuf> {
    let mut dirs = vec![
        PathBuf::from(format!("/run/user/{uid}/larder")),
        PathBuf::from(format!("/tmp/larder-{uid}")),
    ];
    let tmp = std::env::temp_dir().join(format!("larder-{uid}"));
    if !dirs.contains(&tmp) {
        dirs.push(tmp);
    }
    dirs
}

/// The control socket called `name` of a daemon of user `uid`: in one of `dirs`, or wherever else a
/// socket of that name is bound on this host (a daemon started with another `XDG_RUNTIME_DIR` or
/// `TMPDIR`; /proc/net/unix lists them). Only a socket `uid` owns counts: another user could bind one
/// of that name anywhere.
fn owners_socket(uid: u32, name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    let bound: Vec<PathBuf> = std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7))
        .map(PathBuf::from)
        .filter(|p| p.file_name().is_some_and(|n| n.as_bytes() == name.as_bytes()))
        .collect();
    dirs.iter()
        .map(|d| d.join(name))
        .chain(bound)
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket() && m.uid() == uid))
}

/// The name of user `uid`, or its number if it has none.
fn user_name(uid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: a passwd of null pointers and zeros is a valid value for getpwuid_r to fill.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to a live local of the size given; getpwuid_r writes nothing past them.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return uid.to_string();
    }
    // SAFETY: on success pw_name points to a NUL-terminated string in `buf`, which is still alive.
    unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) }
        .to_string_lossy()
        .into_owned()
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
    let status = daemon_socket(&mnt)
        .ok()
        .and_then(|socket| control::status(&socket).ok());
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

/// What the kernel shows of a FUSE mount's own options, given back by mount(8) on a remount: kept as they are.
const FUSE_SHOWN: [&str; 6] = [
    "user_id",
    "group_id",
    "default_permissions",
    "allow_other",
    "max_read",
    "blksize",
];

/// Whether the daemon whose command line is `cmdline` (`/proc/PID/cmdline`) was started with the larder mount option `opt` (`key` or `key=value`,
/// as mount(8) spells it) as it is: `--key`, `--key=value` or `--key value` on its command line.
fn daemon_has(cmdline: &[u8], opt: &str) -> bool {
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let (key, value) = opt.split_once('=').map_or((opt, None), |(k, v)| (k, Some(v)));
    let long = format!("--{}", key.replace('_', "-"));
    args.iter().enumerate().any(|(i, a)| match value {
        None => *a == long.as_bytes(),
        Some(v) => {
            *a == format!("{long}={v}").as_bytes() || (*a == long.as_bytes() && args.get(i + 1) == Some(&v.as_bytes()))
        }
    })
}

/// `larder remount MNT -o OPTS` (mount(8)'s `-o remount,...` through the helper): the mount goes
/// read-only or read-write in place, keeping the kernel flags `OPTS` names (nosuid and nodev always).
/// larder's own options cannot change without a new mount: refused by name. Read-write is refused for a
/// mount whose daemon was started read-only (it cannot write).
pub fn remount(args: RemountArgs) -> Result<()> {
    let mnt = absolute(&args.mountpoint)?;
    if !matches!(mounted_at(&mnt), Mounted::Larder) {
        bail!("{} is not a larder mount", mnt.display());
    }
    // Asked once: what the daemon follows now, and the options it was started with.
    let status = crate::status::fetch(&mnt)?;
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", status.pid)).unwrap_or_default();
    let mut flags = libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV;
    let mut read_only = false;
    // The atime options asked for, if any: larder follows the ones it was mounted with.
    let mut atime: Option<&str> = None;
    let mut nodiratime = false;
    for opt in args.options.split(',').filter(|o| !o.is_empty()) {
        let key = opt.split_once('=').map_or(opt, |(k, _)| k);
        match key {
            "ro" => read_only = true,
            "rw" => read_only = false,
            "noexec" => flags |= libc::MS_NOEXEC,
            "noatime" | "relatime" | "strictatime" => atime = Some(key),
            "norelatime" => atime = Some("strictatime"),
            "nodiratime" => nodiratime = true,
            "lazytime" => flags |= libc::MS_LAZYTIME,
            "remount" | "nosuid" | "nodev" | "exec" | "atime" | "diratime" | "nolazytime" | "defaults" | "auto"
            | "noauto" | "_netdev" | "nofail" | "silent" | "async" => {}
            _ if FUSE_SHOWN.contains(&key) || key.starts_with("x-") || key == "comment" => {}
            // mount(8) passes the options the mount was made with again (from fstab, or as a script
            // repeats them): larder's own, unchanged, are no change.
            _ if daemon_has(&cmdline, opt) => {}
            _ => bail!(
                "mount option '{key}' cannot change on a remount, which changes ro and rw only: unmount {} and mount it again",
                mnt.display()
            ),
        }
    }
    // The daemon's atime options stay: asking for others is refused by name, and the kernel's flags say
    // what the daemon does (a remount without them would clear them).
    let mounted_noatime = status.atime == "noatime";
    if let Some(a) = atime {
        let asked = if nodiratime && a != "noatime" {
            format!("{a},nodiratime")
        } else {
            a.to_string()
        };
        if !status.atime.is_empty() && asked != status.atime {
            bail!(
                "mount options '{asked}' cannot change on a remount: {} reads with '{}'; unmount it and mount it again",
                mnt.display(),
                status.atime
            );
        }
    }
    if mounted_noatime {
        flags |= libc::MS_NOATIME;
    }
    if read_only {
        flags |= libc::MS_RDONLY;
    } else if status.write_mode == "read-only" {
        bail!(
            "{} was mounted --read-only: its daemon cannot write; unmount it and mount it again without --read-only",
            mnt.display()
        );
    }
    let target = CString::new(mnt.as_os_str().as_bytes())?;
    // SAFETY: a remount of an existing mount point by path, with no source, type or data.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        bail!("cannot remount {}: {}", mnt.display(), std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_socket_is_one_of_that_user_bound_where_their_daemon_put_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (elsewhere, there) = (tmp.path().join("elsewhere"), tmp.path().join("there"));
        for d in [&elsewhere, &there] {
            std::fs::create_dir(d).unwrap();
        }
        let name = format!("{:016x}.sock", fnv64(tmp.path().as_os_str().as_bytes()));
        // Not a socket: passed over.
        std::fs::write(elsewhere.join(&name), b"").unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(there.join(&name)).unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let dirs = [elsewhere.clone(), tmp.path().join("missing"), there.clone()];
        assert_eq!(owners_socket(me, &name, &dirs), Some(there.join(&name)));
        // Found among the sockets bound, in a directory not named.
        assert_eq!(owners_socket(me, &name, &dirs[..1]), Some(there.join(&name)));
        // Another user's socket of that name is not theirs.
        assert_eq!(owners_socket(me + 1, &name, &dirs), None);
    }

    #[test]
    fn paths_are_cleaned() {
        assert_eq!(absolute(Path::new("/a/./b/../c")).unwrap(), PathBuf::from("/a/c"));
        assert_eq!(unescape("/mnt/my\\040dir"), "/mnt/my dir");
    }
}
