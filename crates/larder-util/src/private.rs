//! The cache directory belongs to the user running larder, and to no one else: it holds copies of files
//! that the mount may deny other users (a file of mode 0600 at home is a plain object file here).
//!
//! Everything larder creates under it is created owner-only with an explicit mode (directories 0700,
//! files 0600), whatever the process umask: the daemon runs with umask 0 so that the objects it creates
//! at home get exactly the modes asked for. [`make_private`] narrows what an older version (or a hand)
//! left wider, without following symlinks.

use std::ffi::{CString, OsStr};
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};

/// Mode of every directory under the cache directory, and of the cache directory itself.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file under the cache directory.
pub const FILE_MODE: u32 = 0o600;

/// Create `dir` and its missing parents, each owner-only.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// Open options whose `create` makes an owner-only file.
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Create or replace the owner-only file `path` holding `data`.
pub fn write(path: &Path, data: &[u8]) -> io::Result<()> {
    options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?
        .write_all(data)
}

/// What [`make_private`] changed: each entry's path relative to the root (`.` for the root) and what it
/// was.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fixed {
    pub entries: Vec<(PathBuf, String)>,
}

impl Fixed {
    /// Nothing needed fixing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// One line naming what was fixed: the first `most` entries, shallowest first, then a count.
    pub fn describe(&self, most: usize) -> String {
        let mut sorted: Vec<&(PathBuf, String)> = self.entries.iter().collect();
        sorted.sort_by_key(|(p, _)| (p.components().count(), p.clone()));
        let mut parts: Vec<String> = sorted
            .into_iter()
            .take(most)
            .map(|(p, was)| format!("{} ({was})", p.display()))
            .collect();
        if self.entries.len() > most {
            parts.push(format!("and {} more", self.entries.len() - most));
        }
        parts.join(", ")
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn egid() -> u32 {
    // SAFETY: getegid has no preconditions.
    unsafe { libc::getegid() }
}

/// `name` in the directory open as `dir`, opened as a path only (no access needed, no symlink followed,
/// nothing a device does on open).
fn open_path_at(dir: &File, name: &OsStr) -> io::Result<File> {
    let c = CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is NUL-terminated and `dir` an open descriptor for the duration of the call.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The object open as `f`, by a name that reaches it and nothing else (a symlink put in its place later
/// is not followed).
fn proc_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Make `root` and everything under it belong to the user running this process, directories mode 0700
/// and everything else 0600 (symlinks are left alone and never followed). Only what is wider is changed:
/// any group or other bit, or a setuid, setgid or sticky bit. Run as root, an entry of another owner is
/// given to root; otherwise it is an error, as is a root of another owner.
pub fn make_private(root: &Path) -> io::Result<Fixed> {
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)?;
    let mut fixed = Fixed::default();
    fix_entry(&dir, Path::new("."), &mut fixed)?;
    Ok(fixed)
}

fn fix_entry(f: &File, rel: &Path, fixed: &mut Fixed) -> io::Result<()> {
    let meta = f.metadata()?;
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Ok(());
    }
    let at = proc_path(f);
    let mut was = Vec::new();
    let (me, root) = (euid(), euid() == 0);
    if meta.uid() != me {
        if !root {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to uid {}, not to the user running larder (uid {me}): it cannot be made private",
                    rel.display(),
                    meta.uid()
                ),
            ));
        }
        std::os::unix::fs::chown(&at, Some(me), Some(egid()))?;
        was.push(format!("owner uid {}", meta.uid()));
    }
    let want = if kind.is_dir() { DIR_MODE } else { FILE_MODE };
    let mode = meta.mode() & 0o7777;
    if mode & 0o7077 != 0 || !was.is_empty() {
        std::fs::set_permissions(&at, Permissions::from_mode(want))?;
        was.push(format!("mode {mode:04o}"));
    }
    if !was.is_empty() {
        fixed.entries.push((rel.to_path_buf(), was.join(", ")));
    }
    if kind.is_dir() {
        for e in std::fs::read_dir(&at)? {
            let e = e?;
            let child = match open_path_at(f, &e.file_name()) {
                Ok(c) => c,
                // Gone meanwhile, or a symlink.
                Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT) | Some(libc::ELOOP)) => continue,
                Err(err) => return Err(err),
            };
            fix_entry(&child, &rel.join(e.file_name()), fixed)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn wider_entries_are_narrowed_and_symlinks_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        std::fs::create_dir_all(root.join("objects/01")).unwrap();
        std::fs::write(root.join("objects/01/0000000000000001"), b"secret").unwrap();
        std::fs::write(root.join("index.redb"), b"").unwrap();
        std::fs::write(root.join("lock"), b"").unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"not ours to change").unwrap();
        std::fs::set_permissions(&outside, Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        for (p, m) in [
            ("", 0o777),
            ("objects", 0o777),
            ("objects/01", 0o2775),
            ("objects/01/0000000000000001", 0o666),
            ("index.redb", 0o644),
        ] {
            std::fs::set_permissions(root.join(p), Permissions::from_mode(m)).unwrap();
        }
        std::fs::set_permissions(root.join("lock"), Permissions::from_mode(0o600)).unwrap();

        let fixed = make_private(&root).unwrap();
        let mut names: Vec<String> = fixed.entries.iter().map(|(p, _)| p.display().to_string()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                ".",
                "./index.redb",
                "./objects",
                "./objects/01",
                "./objects/01/0000000000000001"
            ]
        );
        assert!(
            fixed.describe(10).contains("./objects/01 (mode 2775)"),
            "{}",
            fixed.describe(10)
        );
        for p in ["", "objects", "objects/01"] {
            assert_eq!(mode(&root.join(p)), 0o700, "{p}");
        }
        for p in ["objects/01/0000000000000001", "index.redb", "lock"] {
            assert_eq!(mode(&root.join(p)), 0o600, "{p}");
        }
        assert_eq!(mode(&outside), 0o644, "the symlink's target was changed");
        assert!(
            make_private(&root).unwrap().is_empty(),
            "a second pass found more to fix"
        );
    }

    #[test]
    fn helpers_create_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        create_dir_all(&dir).unwrap();
        write(&dir.join("f"), b"x").unwrap();
        options()
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("g"))
            .unwrap();
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("f")), 0o600);
        assert_eq!(mode(&dir.join("g")), 0o600);
        assert!(make_private(&tmp.path().join("a")).unwrap().is_empty());
    }
}
