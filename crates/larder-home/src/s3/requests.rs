//! What every call to the bucket goes through: the runtime and the call's deadline, the key of a path,
//! the attributes of objects and directories, and OpenDAL errors as home errors.

use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opendal::ErrorKind;

use super::meta::ObjectMeta;
use super::{MAX_KEY, MIN_RATE, S3Home};
use crate::{FileKind, HomeAttr, HomeError, HomeResult, Version};

impl S3Home {
    /// Run `f` on the runtime with the call deadline.
    pub(super) fn run<T>(&self, f: impl Future<Output = HomeResult<T>>) -> HomeResult<T> {
        self.run_for(self.spec.op_timeout, f)
    }

    /// The deadline of a call that moves `bytes`: the home timeout plus time for the bytes at a slow but
    /// working link (4 MiB/s), so a large rewrite is not cut off while it makes progress.
    pub(super) fn deadline_for(&self, bytes: u64) -> Duration {
        self.spec.op_timeout + Duration::from_secs_f64(bytes as f64 / MIN_RATE as f64)
    }

    pub(super) fn run_for<T>(&self, timeout: Duration, f: impl Future<Output = HomeResult<T>>) -> HomeResult<T> {
        self.rt.block_on(async move {
            match tokio::time::timeout(timeout, f).await {
                Ok(r) => r,
                Err(_) => Err(HomeError::TimedOut(timeout)),
            }
        })
    }

    /// The key of `path` ("a/b" or, for a directory, "a/b/"), checked against what S3 can store.
    pub(super) fn key(&self, path: &Path, dir: bool) -> HomeResult<String> {
        let mut key = String::new();
        for c in path.components() {
            let Component::Normal(name) = c else {
                return Err(HomeError::InvalidName(format!(
                    "'{}' is not a plain path",
                    path.display()
                )));
            };
            let name = std::str::from_utf8(name.as_bytes())
                .map_err(|_| HomeError::InvalidName("S3 keys must be UTF-8".into()))?;
            if !key.is_empty() {
                key.push('/');
            }
            key.push_str(name);
        }
        if dir && !key.is_empty() {
            key.push('/');
        }
        let prefix = self.spec.prefix.trim_matches('/').len();
        let full = if prefix == 0 { key.len() } else { prefix + 1 + key.len() };
        if full > MAX_KEY {
            return Err(HomeError::NameTooLong);
        }
        Ok(key)
    }

    /// The directory form of `path`, or `None` when it would be too long to exist at all.
    pub(super) fn dir_key(&self, path: &Path) -> HomeResult<Option<String>> {
        match self.key(path, true) {
            Ok(k) => Ok(Some(k)),
            Err(HomeError::NameTooLong) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn file_attr(&self, meta: &opendal::Metadata) -> HomeAttr {
        self.file_attr_meta(meta).0
    }

    /// The attributes of an object, and its user metadata (none when metadata is not kept).
    pub(super) fn file_attr_meta(&self, meta: &opendal::Metadata) -> (HomeAttr, ObjectMeta) {
        let mtime = meta.last_modified().map(SystemTime::from).unwrap_or(UNIX_EPOCH);
        let size = meta.content_length();
        let mut attr = HomeAttr {
            kind: FileKind::File,
            id: 0,
            size,
            perm: 0o644,
            uid: self.uid,
            gid: self.gid,
            nlink: 1,
            rdev: 0,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            version: Version(meta.etag().unwrap_or_default().to_string()),
        };
        let mut stored = ObjectMeta::default();
        if self.spec.keep_metadata
            && let Some(user) = meta.user_metadata()
        {
            stored = ObjectMeta::parse(user);
            stored.apply(&mut attr);
        }
        (attr, stored)
    }

    pub(super) fn dir_attr(&self) -> HomeAttr {
        let n = self.dir_version.fetch_add(1, Ordering::Relaxed);
        HomeAttr {
            kind: FileKind::Dir,
            id: 0,
            size: 0,
            perm: 0o755,
            uid: self.uid,
            gid: self.gid,
            nlink: 2,
            rdev: 0,
            blocks: 0,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            version: Version(format!("dir:{n}")),
        }
    }
}

/// Turn an OpenDAL error into a home error. `write`: a failed precondition means home changed since the
/// base version (conflict) rather than during a read (stale).
pub(super) fn classify(e: opendal::Error, write: bool) -> HomeError {
    match e.kind() {
        ErrorKind::NotFound => HomeError::NotFound,
        ErrorKind::PermissionDenied => HomeError::PermissionDenied,
        ErrorKind::AlreadyExists => HomeError::Exists,
        ErrorKind::ConditionNotMatch if write => HomeError::Conflict,
        ErrorKind::ConditionNotMatch => HomeError::Stale,
        ErrorKind::IsADirectory => HomeError::Os(libc::EISDIR),
        ErrorKind::NotADirectory => HomeError::Os(libc::ENOTDIR),
        ErrorKind::Unsupported => HomeError::Unsupported("this operation on S3"),
        ErrorKind::RateLimited => HomeError::Unavailable(e.to_string()),
        _ if e.is_temporary() => HomeError::Unavailable(e.to_string()),
        _ => HomeError::Unavailable(e.to_string()),
    }
}
