//! Values that cross the [`crate::Home`] seam.

use std::ffi::OsString;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

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
