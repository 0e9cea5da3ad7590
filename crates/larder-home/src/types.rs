//! Values that cross the [`crate::Home`] seam.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::{HomeError, HomeResult};

/// Kind of a home object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    /// The kind encoded in the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => FileKind::File,
        }
    }
}

/// The identity of one state of a home object's content. Opaque: backends build it (a POSIX home from
/// inode, size and mtime; an object store from the ETag), the cache only compares it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Version(pub String);

/// How every node names one version of a file's content, so that cache keys agree between nodes. A home
/// builds it from what it reports about the object, never from anything local to the node reading it
/// (a device number, a cache object id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ContentId {
    /// A POSIX home: the inode number as home reports it, the size, and the modification time (seconds
    /// and nanoseconds since the epoch).
    Inode {
        ino: u64,
        size: u64,
        mtime_s: i64,
        mtime_ns: u32,
    },
    /// A home that names objects by path (an object store: the key and its ETag): the path below home's
    /// root, and the version home gave.
    Named { path: Vec<u8>, version: Vec<u8> },
    /// Content a cluster node holds and home has not got yet (design note 016): the `seq`th version of it
    /// that `node` published. Only that node can give it; it is never kept in a shared tier.
    Held { node: u64, seq: u64 },
}

impl ContentId {
    /// The path-and-version name of `version` of the object at `path`.
    pub fn named(path: &Path, version: &Version) -> ContentId {
        ContentId::Named {
            path: path.as_os_str().as_bytes().to_vec(),
            version: version.0.as_bytes().to_vec(),
        }
    }
}

/// Attributes of a home object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeAttr {
    pub kind: FileKind,
    /// The object's identity at home where it has one (a POSIX inode number), else 0. Names with the same
    /// non-zero id are hard links to one object.
    pub id: u64,
    pub size: u64,
    /// Permission bits including setuid, setgid and sticky (`0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub rdev: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Version of the content (for directories: of the entry list).
    pub version: Version,
}

/// One directory entry as listed.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: FileKind,
    /// Attributes, where the listing carried them.
    pub attr: Option<HomeAttr>,
}

/// Who should own a newly created object. `gid: None` keeps what home chose (a setgid parent's group).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// A regular file to make with all it starts with, for [`crate::Home::create_file`].
#[derive(Clone, Copy, Debug)]
pub struct NewFile<'a> {
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub owner: Owner,
    /// Its modification time; `None`: home's clock.
    pub mtime: Option<SystemTime>,
    /// What it holds; `None`: nothing.
    pub content: Option<Content<'a>>,
}

/// Bytes for home to take from a file of the cache: the `ranges` of `source`, in a file `size` bytes long
/// (zeros, or holes, elsewhere).
#[derive(Clone, Copy, Debug)]
pub struct Content<'a> {
    pub source: &'a std::fs::File,
    pub ranges: &'a [std::ops::Range<u64>],
    pub size: u64,
}

/// Bytes a home's rewrites moved ([`crate::Home::rewrite_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewriteBytes {
    /// Sent to home over the link.
    pub sent: u64,
    /// Received from home over the link.
    pub received: u64,
    /// Copied by home from the object as it was, crossing no link.
    pub copied: u64,
}

/// A time to set: now (home's clock) or a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(SystemTime),
}

/// Attribute changes; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// How a rename treats an existing target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists.
    pub no_replace: bool,
    /// Swap source and target atomically.
    pub exchange: bool,
}

/// Capacity figures, as `statvfs` gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub block_size: u32,
    pub name_max: u32,
}

/// What a home can store. The core checks every new name and object kind against it at the call, in every
/// write mode, so a change home could never take is refused before anything is queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeLimits {
    /// Longest name (one path component), in bytes.
    pub name_max: usize,
    /// Longest path of an object as home counts it, in bytes: `path_base` plus the path relative to the
    /// root (plus `dir_suffix` for a directory).
    pub path_max: usize,
    /// Bytes home puts in front of every relative path (an S3 home's `PREFIX/`).
    pub path_base: usize,
    /// Bytes a directory's own entry adds to its path (an S3 directory marker's trailing `/`).
    pub dir_suffix: usize,
    /// Names must be valid UTF-8 (S3 keys).
    pub utf8_names: bool,
    pub symlinks: bool,
    pub hard_links: bool,
    /// FIFOs, sockets and device nodes.
    pub special_files: bool,
    /// Renames that swap two names atomically (`RENAME_EXCHANGE`).
    pub rename_exchange: bool,
    /// A renamed file keeps its version. An object store renames by copying, and a copy is a new version
    /// (a new ETag for an object uploaded in parts).
    pub rename_keeps_version: bool,
    /// Times set on objects and directories are kept as set (an object store stamps each object with the
    /// time it was stored).
    pub times: bool,
    /// Holes in a file are kept as holes, and not sent when written (an object store uploads them).
    pub holes: bool,
    /// Extended attributes are kept ([`crate::Home::set_xattr`]); without them an object has none and
    /// setting one is refused. An object store keeps them in object metadata where it keeps metadata at all.
    pub xattrs: bool,
}

impl HomeLimits {
    /// The limits of a POSIX file system (`name_max` from statvfs; paths relative to the home's root).
    pub fn posix(name_max: usize) -> HomeLimits {
        HomeLimits {
            name_max,
            // PATH_MAX counts the terminating NUL.
            path_max: libc::PATH_MAX as usize - 1,
            path_base: 0,
            dir_suffix: 0,
            utf8_names: false,
            symlinks: true,
            hard_links: true,
            special_files: true,
            rename_exchange: true,
            rename_keeps_version: true,
            times: true,
            holes: true,
            xattrs: true,
        }
    }

    /// The limits of an object store whose keys are at most `max_key` bytes, under a prefix of
    /// `prefix_len` bytes (0: none) followed by `/`.
    pub fn object_store(max_key: usize, prefix_len: usize) -> HomeLimits {
        HomeLimits {
            name_max: max_key,
            path_max: max_key,
            path_base: if prefix_len == 0 { 0 } else { prefix_len + 1 },
            // A directory is also a marker object, its key ending in '/'.
            dir_suffix: 1,
            utf8_names: true,
            symlinks: false,
            hard_links: false,
            special_files: false,
            rename_exchange: false,
            rename_keeps_version: false,
            times: false,
            holes: false,
            // The S3 home has them where it keeps metadata.
            xattrs: false,
        }
    }

    /// Whether home can hold an object of `kind` at `path` (relative to its root); `descendants`: the
    /// length in bytes of the longest path below it (a directory being moved there), counted from `path`.
    /// Fails with [`HomeError::NameTooLong`], [`HomeError::InvalidName`] or [`HomeError::Unsupported`].
    pub fn check(&self, path: &Path, kind: FileKind, descendants: usize) -> HomeResult<()> {
        match kind {
            FileKind::Symlink if !self.symlinks => return Err(HomeError::Unsupported("symlinks")),
            FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice if !self.special_files => {
                return Err(HomeError::Unsupported("special files"));
            }
            _ => {}
        }
        for c in path.components() {
            let name = c.as_os_str().as_bytes();
            if name.len() > self.name_max {
                return Err(HomeError::NameTooLong);
            }
            if self.utf8_names && std::str::from_utf8(name).is_err() {
                return Err(HomeError::InvalidName(format!(
                    "'{}' is not UTF-8",
                    String::from_utf8_lossy(name)
                )));
            }
        }
        let mut len = self.path_base + path.as_os_str().len();
        if kind == FileKind::Dir {
            len += self.dir_suffix;
        }
        if len > self.path_max || self.path_base + path.as_os_str().len() + descendants > self.path_max {
            return Err(HomeError::NameTooLong);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    fn s3(prefix: usize) -> HomeLimits {
        HomeLimits::object_store(1024, prefix)
    }

    #[test]
    fn s3_keys_count_the_prefix_and_a_directory_marker() {
        // "home/" + 1019 bytes = 1024: a file fits, a directory's marker ("…/") does not.
        let l = s3(4);
        let p = "a".repeat(1019);
        assert!(l.check(Path::new(&p), FileKind::File, 0).is_ok());
        assert!(matches!(
            l.check(Path::new(&p), FileKind::Dir, 0),
            Err(HomeError::NameTooLong)
        ));
        let q = format!("{}/{}", "b".repeat(500), "c".repeat(519));
        assert!(matches!(
            l.check(Path::new(&q), FileKind::File, 0),
            Err(HomeError::NameTooLong)
        ));
        // A directory moved where the longest path below it (16 bytes) would pass the limit.
        let d = "d".repeat(1000);
        assert!(l.check(Path::new(&d), FileKind::Dir, 16).is_ok());
        assert!(matches!(
            l.check(Path::new(&d), FileKind::Dir, 20),
            Err(HomeError::NameTooLong)
        ));
    }

    #[test]
    fn s3_refuses_names_not_utf8_and_objects_it_cannot_hold() {
        let l = s3(4);
        let bad = Path::new(OsStr::from_bytes(b"dir/bad-\xff"));
        assert!(matches!(
            l.check(bad, FileKind::File, 0),
            Err(HomeError::InvalidName(_))
        ));
        for k in [
            FileKind::Symlink,
            FileKind::Fifo,
            FileKind::Socket,
            FileKind::CharDevice,
            FileKind::BlockDevice,
        ] {
            assert!(
                matches!(l.check(Path::new("x"), k, 0), Err(HomeError::Unsupported(_))),
                "{k:?}"
            );
        }
    }

    #[test]
    fn posix_counts_path_max_and_name_max() {
        let l = HomeLimits::posix(255);
        let bad = Path::new(OsStr::from_bytes(b"bad-\xff"));
        assert!(l.check(bad, FileKind::Symlink, 0).is_ok());
        assert!(matches!(
            l.check(Path::new(&"n".repeat(256)), FileKind::File, 0),
            Err(HomeError::NameTooLong)
        ));
        // 16 levels of 250 bytes and 15 slashes: 4015 bytes; 17 levels: 4266.
        let level = "p".repeat(250);
        let sixteen = vec![level.as_str(); 16].join("/");
        assert!(l.check(Path::new(&sixteen), FileKind::Dir, 0).is_ok());
        let seventeen = vec![level.as_str(); 17].join("/");
        assert!(matches!(
            l.check(Path::new(&seventeen), FileKind::Dir, 0),
            Err(HomeError::NameTooLong)
        ));
    }
}
