//! The [`Home`] calls of [`S3Home`], in terms of its requests, listings and writes.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use opendal::ErrorKind;

use super::requests::classify;
use super::{MAX_KEY, S3Home};
use crate::{
    DirEntry, FileKind, Home, HomeAttr, HomeError, HomeLimits, HomeResult, Owner, RenameFlags, SetAttr, StatFs, Version,
};

impl Home for S3Home {
    fn describe(&self) -> String {
        let prefix = self.spec.prefix.trim_matches('/');
        if prefix.is_empty() {
            format!("s3://{}", self.spec.bucket)
        } else {
            format!("s3://{}/{prefix}", self.spec.bucket)
        }
    }

    fn stat(&self, path: &Path) -> HomeResult<HomeAttr> {
        self.run(self.stat_any(path))
    }

    fn list(&self, path: &Path) -> HomeResult<Vec<DirEntry>> {
        let dir_key = self.key(path, true)?;
        self.run(async {
            let entries = self.entries(&dir_key, false).await?;
            if entries.is_empty() && !dir_key.is_empty() && !self.dir_exists(&dir_key).await? {
                return Err(HomeError::NotFound);
            }
            let mut out = Vec::with_capacity(entries.len());
            for e in entries {
                let rel = &e.path()[dir_key.len().min(e.path().len())..];
                let (name, dir) = match rel.strip_suffix('/') {
                    Some(n) => (n, true),
                    None => (rel, false),
                };
                // Keys S3 allows but a file system cannot show ("a//b", "a/./b").
                if name.is_empty() || name == "." || name == ".." || name.contains('/') {
                    continue;
                }
                let meta = e.metadata();
                // A common prefix has the attributes a stat of it would make up: its lookup is answered
                // from this listing too.
                let attr = if dir {
                    Some(self.dir_attr())
                } else {
                    meta.etag().is_some().then(|| self.file_attr(meta))
                };
                let kind = if dir { FileKind::Dir } else { FileKind::File };
                out.push(DirEntry {
                    name: name.into(),
                    kind,
                    attr,
                });
            }
            Ok(out)
        })
    }

    fn read(&self, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let key = self.key(path, false)?;
        self.run(async {
            let mut read = self.op.read_with(&key).range(offset..offset + len as u64);
            if !version.0.is_empty() {
                read = read.if_match(&version.0);
            }
            Ok(read.await.map_err(|e| classify(e, false))?.to_vec())
        })
    }

    fn readlink(&self, _path: &Path) -> HomeResult<Vec<u8>> {
        Err(HomeError::Unsupported("symlinks on S3"))
    }

    fn create(&self, path: &Path, _mode: u32, _owner: Owner) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        self.run(async {
            if let Some(dir_key) = self.dir_key(path)?
                && self.dir_exists(&dir_key).await?
            {
                return Err(HomeError::Exists);
            }
            match self.op.write_with(&key, Vec::<u8>::new()).if_not_exists(true).await {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConditionNotMatch => return Err(HomeError::Exists),
                Err(e) => return Err(classify(e, true)),
            }
            self.stat_file(&key).await?.ok_or(HomeError::NotFound)
        })
    }

    fn mkdir(&self, path: &Path, _mode: u32, _owner: Owner) -> HomeResult<HomeAttr> {
        let dir_key = self.key(path, true)?;
        let key = self.key(path, false)?;
        self.run(async {
            if self.stat_file(&key).await?.is_some() || self.dir_exists(&dir_key).await? {
                return Err(HomeError::Exists);
            }
            self.op.create_dir(&dir_key).await.map_err(|e| classify(e, true))?;
            Ok(self.dir_attr())
        })
    }

    fn mknod(&self, _path: &Path, _mode: u32, _rdev: u64, _owner: Owner) -> HomeResult<HomeAttr> {
        Err(HomeError::Unsupported("special files on S3"))
    }

    fn symlink(&self, _target: &[u8], _path: &Path, _owner: Owner) -> HomeResult<HomeAttr> {
        Err(HomeError::Unsupported("symlinks on S3"))
    }

    fn link(&self, _existing: &Path, _new: &Path) -> HomeResult<HomeAttr> {
        Err(HomeError::Unsupported("hard links on S3"))
    }

    fn unlink(&self, path: &Path) -> HomeResult<()> {
        let key = self.key(path, false)?;
        self.run(async {
            if self.stat_file(&key).await?.is_none() {
                let dir = match self.dir_key(path)? {
                    Some(d) => self.dir_exists(&d).await?,
                    None => false,
                };
                return Err(if dir {
                    HomeError::Os(libc::EISDIR)
                } else {
                    HomeError::NotFound
                });
            }
            self.op.delete(&key).await.map_err(|e| classify(e, false))?;
            self.keep_parent(&key).await
        })
    }

    fn rmdir(&self, path: &Path) -> HomeResult<()> {
        let dir_key = self.key(path, true)?;
        self.run(async {
            if self.has_children(&dir_key).await? {
                return Err(HomeError::NotEmpty);
            }
            if !self.dir_exists(&dir_key).await? {
                return Err(HomeError::NotFound);
            }
            self.op.delete(&dir_key).await.map_err(|e| classify(e, false))?;
            self.keep_parent(&dir_key).await
        })
    }

    fn rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()> {
        if flags.exchange {
            return Err(HomeError::Unsupported("atomic exchange on S3"));
        }
        let (from_file, from_dir) = (self.key(from, false)?, self.key(from, true)?);
        let (to_file, to_dir) = (self.key(to, false)?, self.key(to, true)?);
        self.run(async {
            // The source is looked at first, as rename(2) does: a missing source is NotFound whatever is at
            // the target (a retried rename that had landed tells so by that answer).
            let from_is_file = self.stat_file(&from_file).await?.is_some();
            if !from_is_file && !self.dir_exists(&from_dir).await? {
                return Err(HomeError::NotFound);
            }
            let to_is_file = self.stat_file(&to_file).await?.is_some();
            let to_is_dir = !to_is_file && self.dir_exists(&to_dir).await?;
            if flags.no_replace && (to_is_file || to_is_dir) {
                return Err(HomeError::Exists);
            }
            if from_is_file {
                if to_is_dir {
                    return Err(HomeError::Os(libc::EISDIR));
                }
                return self.rename_file(&from_file, &to_file).await;
            }
            if to_is_file {
                return Err(HomeError::Os(libc::ENOTDIR));
            }
            if to_is_dir {
                if self.has_children(&to_dir).await? {
                    return Err(HomeError::NotEmpty);
                }
                self.op.delete(&to_dir).await.map_err(|e| classify(e, false))?;
            }
            // Copy everything under the prefix (markers included), then delete the originals: a crash in
            // between leaves both copies, never neither.
            let mut keys: Vec<String> = self
                .entries(&from_dir, true)
                .await?
                .into_iter()
                .map(|e| e.path().to_string())
                .collect();
            keys.push(from_dir.clone());
            for key in &keys {
                let target = format!("{to_dir}{}", &key[from_dir.len()..]);
                if key.ends_with('/') {
                    self.op.create_dir(&target).await.map_err(|e| classify(e, false))?;
                } else {
                    self.op.copy(key, &target).await.map_err(|e| classify(e, false))?;
                }
            }
            for key in &keys {
                match self.op.delete(key).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(classify(e, false)),
                }
            }
            self.keep_parent(&from_dir).await
        })
    }

    fn setattr(&self, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        // A truncate rewrites the object: up to twice its size crosses the link.
        self.run_for(self.deadline_for(2 * changes.size.unwrap_or(0)), async {
            let Some(size) = changes.size else {
                // Modes, owners and times are not stored on S3.
                return self.stat_any(path).await;
            };
            let current = self.stat_file(&key).await?.ok_or(HomeError::NotFound)?;
            if current.size != size {
                self.rewrite(&key, None, &[], size, Some((&current.version.0, current.size)))
                    .await?;
            }
            self.stat_file(&key).await?.ok_or(HomeError::NotFound)
        })
    }

    fn write(
        &self,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
        // Times are not stored on S3: an object's time is that of its upload.
        _mtime: Option<std::time::SystemTime>,
    ) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        // The rewrite reads the unchanged parts and uploads the whole object: up to twice its size.
        self.run_for(self.deadline_for(2 * size), async {
            let current = self.stat_file(&key).await?.ok_or(HomeError::NotFound)?;
            if let Some(base) = base
                && !base.0.is_empty()
                && base.0 != current.version.0
            {
                return Err(HomeError::Conflict);
            }
            self.rewrite(
                &key,
                Some(source),
                ranges,
                size,
                Some((&current.version.0, current.size)),
            )
            .await?;
            self.stat_file(&key).await?.ok_or(HomeError::NotFound)
        })
    }

    fn limits(&self) -> HomeLimits {
        HomeLimits::object_store(MAX_KEY, self.spec.prefix.trim_matches('/').len())
    }

    fn statfs(&self) -> HomeResult<StatFs> {
        // A bucket has no capacity to speak of; report a large, mostly free file system.
        Ok(StatFs {
            blocks: 1 << 40,
            blocks_free: 1 << 40,
            blocks_available: 1 << 40,
            files: 1 << 40,
            files_free: 1 << 40,
            block_size: 4096,
            name_max: 255,
        })
    }
}
