//! Errors of the core. The FUSE adapter turns them into errno, in one exhaustive match.

use larder_cache::CacheError;
use larder_home::HomeError;

/// Result of a core call.
pub type FsResult<T> = Result<T, FsError>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(transparent)]
    Home(#[from] HomeError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("file exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("unknown inode or file handle")]
    BadHandle,
    #[error("the mount is read-only")]
    ReadOnly,
    #[error("invalid argument")]
    Invalid,
    #[error("the cache has no room for more changes not yet at home")]
    NoSpace,
    /// Home cannot store objects of this kind at all (e.g. symlinks on S3).
    #[error("home cannot hold {0}")]
    HomeCannotHold(&'static str),
    /// No extended attribute of that name.
    #[error("no such extended attribute")]
    NoXattr,
    /// Extended attributes of that namespace (or any, where home keeps none) are not kept.
    #[error("extended attributes of this kind are not supported")]
    XattrUnsupported,
    /// An operation, or a mode of one, larder does not give (`fallocate` collapsing a range, say).
    #[error("operation not supported")]
    Unsupported,
    /// A file lock not granted (see [`crate::locks`]).
    #[error(transparent)]
    Lock(#[from] crate::locks::LockError),
}
