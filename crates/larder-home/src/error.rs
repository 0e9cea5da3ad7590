//! Errors a home reports, classified where they arise.

use std::io;
use std::time::Duration;

/// Result of a home call.
pub type HomeResult<T> = Result<T, HomeError>;

/// What went wrong at home.
#[derive(Clone, Debug, thiserror::Error)]
pub enum HomeError {
    /// No such object.
    #[error("not found at home")]
    NotFound,
    /// The name is taken.
    #[error("already exists at home")]
    Exists,
    /// The directory is not empty.
    #[error("directory not empty at home")]
    NotEmpty,
    /// Home refused access.
    #[error("permission denied by home")]
    PermissionDenied,
    /// Home is out of space or quota.
    #[error("no space left at home")]
    NoSpace,
    /// A name or path is longer than home allows.
    #[error("name too long for home")]
    NameTooLong,
    /// A name home cannot store.
    #[error("name not valid at home: {0}")]
    InvalidName(String),
    /// The object changed at home while it was being read.
    #[error("object changed at home during the operation")]
    Stale,
    /// The object at home is no longer at the version the change was based on.
    #[error("object changed at home since it was cached (conflict)")]
    Conflict,
    /// Home did not answer within the deadline.
    #[error("home did not answer within {0:?}")]
    TimedOut(Duration),
    /// Home cannot be reached now.
    #[error("home unavailable: {0}")]
    Unavailable(String),
    /// The home cannot do this at all.
    #[error("not supported by this home: {0}")]
    Unsupported(&'static str),
    /// Any other error of a POSIX home, by its errno.
    #[error("home error: {}", io::Error::from_raw_os_error(*.0))]
    Os(i32),
}

impl HomeError {
    /// Whether this is home's answer about its objects rather than a failure: the name is not there,
    /// is taken, or the directory is not empty. A lookup of a missing name, an exclusive create of a taken
    /// one and an `rmdir` of a full directory were served; home did what was asked, and said no.
    pub fn is_answer(&self) -> bool {
        matches!(self, HomeError::NotFound | HomeError::Exists | HomeError::NotEmpty)
    }

    /// Whether retrying the same call later may succeed.
    pub fn is_temporary(&self) -> bool {
        match self {
            HomeError::TimedOut(_) | HomeError::Unavailable(_) => true,
            HomeError::Os(e) => matches!(*e, libc::EAGAIN | libc::EINTR | libc::EBUSY),
            HomeError::NotFound
            | HomeError::Exists
            | HomeError::NotEmpty
            | HomeError::PermissionDenied
            | HomeError::NoSpace
            | HomeError::NameTooLong
            | HomeError::InvalidName(_)
            | HomeError::Stale
            | HomeError::Conflict
            | HomeError::Unsupported(_) => false,
        }
    }
}

impl From<io::Error> for HomeError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(code) => from_errno(code),
            None => match e.kind() {
                io::ErrorKind::NotFound => HomeError::NotFound,
                io::ErrorKind::AlreadyExists => HomeError::Exists,
                io::ErrorKind::PermissionDenied => HomeError::PermissionDenied,
                io::ErrorKind::TimedOut => HomeError::TimedOut(Duration::ZERO),
                _ => HomeError::Unavailable(e.to_string()),
            },
        }
    }
}

/// Classify an errno reported by a POSIX home.
pub(crate) fn from_errno(code: i32) -> HomeError {
    match code {
        libc::ENOENT => HomeError::NotFound,
        libc::EEXIST => HomeError::Exists,
        libc::ENOTEMPTY => HomeError::NotEmpty,
        libc::EACCES => HomeError::PermissionDenied,
        libc::ENOSPC | libc::EDQUOT => HomeError::NoSpace,
        libc::ENAMETOOLONG => HomeError::NameTooLong,
        libc::ESTALE => HomeError::Stale,
        libc::ENOTCONN | libc::ECONNREFUSED | libc::ECONNRESET | libc::EHOSTDOWN | libc::EHOSTUNREACH => {
            HomeError::Unavailable(io::Error::from_raw_os_error(code).to_string())
        }
        libc::ETIMEDOUT => HomeError::TimedOut(Duration::ZERO),
        other => HomeError::Os(other),
    }
}
