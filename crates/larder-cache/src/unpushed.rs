//! Labels of data not yet at home, kept on the cache files themselves (an extended attribute), apart from
//! the index. The index says which cache files hold changes not yet at home; if it is lost or damaged,
//! these labels still do, with the file each belongs to: so that a start never takes such a file for an
//! orphan and deletes it, a cache directory in that state refuses to mount, and `larder recover` can save
//! every one of them.
//!
//! The core labels a file's cache file when its changes are first committed in the cache (the `close` or
//! `fsync` that acknowledges them), labels it again when the file is renamed, and takes the label off once
//! home has all of it; a cache file made a spare loses its label. The label's path is the file's path in
//! the mount when it was labelled: a directory renamed above it since is not followed (the index has the
//! path; the label is for when the index is gone).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The extended attribute holding a label.
pub const XATTR: &str = "user.larder.unpushed";

/// What a label says of the file whose unpushed data a cache file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// Its inode in the mount.
    pub ino: u64,
    /// Its path in the mount (below the mount point, no leading `/`).
    pub path: Vec<u8>,
    /// Its mode bits.
    pub mode: u32,
}

fn name() -> CString {
    CString::new(XATTR).expect("no NUL in the name")
}

/// Label the cache file `file` with `label`.
pub fn set(file: &File, label: &Label) -> io::Result<()> {
    let value = postcard::to_allocvec(label).map_err(io::Error::other)?;
    // SAFETY: a valid descriptor, a NUL-terminated name, and a buffer of the length given.
    let r = unsafe { libc::fsetxattr(file.as_raw_fd(), name().as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Take the label off `file` (none is no error).
pub fn clear(file: &File) -> io::Result<()> {
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let r = unsafe { libc::fremovexattr(file.as_raw_fd(), name().as_ptr()) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENODATA) {
            return Err(e);
        }
    }
    Ok(())
}

/// The label of the cache file at `path`, if it has one that reads.
pub fn get(path: &Path) -> Option<Label> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut buf = vec![0u8; 4096 + 64];
    // SAFETY: a NUL-terminated path and name, and a buffer of the length given.
    let n = unsafe { libc::lgetxattr(c.as_ptr(), name().as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    postcard::from_bytes(&buf).ok()
}

/// Every labelled cache file under the store's directory `objects`, with its label (the content store and
/// the spare files hold none).
pub fn scan(objects: &Path) -> Vec<(PathBuf, Label)> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(objects) else {
        return out;
    };
    for dir in dirs.flatten() {
        let name = dir.file_name();
        if name == "spare" || name == "cas" || !dir.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for f in files.flatten() {
            if let Some(label) = get(&f.path()) {
                out.push((f.path(), label));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The index of the cache directory `dir` (`index.redb`) as found before it is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexFound {
    /// There, with something in it.
    Present,
    /// Not there.
    Missing,
    /// There, and empty (cut to nothing).
    Empty,
}

/// What is at the index's place in cache directory `dir`.
pub fn index_found(dir: &Path) -> IndexFound {
    match std::fs::metadata(dir.join("index.redb")) {
        Err(_) => IndexFound::Missing,
        Ok(m) if m.len() == 0 => IndexFound::Empty,
        Ok(_) => IndexFound::Present,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_set_reads_back_is_found_by_a_scan_and_goes_when_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let objects = dir.path().join("objects");
        std::fs::create_dir_all(objects.join("0a")).unwrap();
        std::fs::create_dir_all(objects.join("spare")).unwrap();
        let path = objects.join("0a/000000000000000a");
        let f = File::create(&path).unwrap();
        std::fs::write(objects.join("0a/000000000000010a"), b"clean").unwrap();
        let label = Label {
            ino: 7,
            path: b"d/new".to_vec(),
            mode: 0o644,
        };
        set(&f, &label).unwrap();
        assert_eq!(get(&path), Some(label.clone()));
        assert_eq!(scan(&objects), vec![(path.clone(), label)]);
        clear(&f).unwrap();
        clear(&f).unwrap();
        assert!(get(&path).is_none());
        assert!(scan(&objects).is_empty());
    }
}
