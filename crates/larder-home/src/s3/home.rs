//! The [`Home`] calls of [`S3Home`], in terms of its requests, listings and writes.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::time::SystemTime;

use opendal::ErrorKind;

use super::meta::ObjectMeta;
use super::requests::classify;
use super::xattr::{self, Xattrs};
use super::{MAX_KEY, S3Home};
use crate::{
    DirEntry, FileKind, Home, HomeAttr, HomeError, HomeLimits, HomeResult, NewFile, Owner, RenameFlags, SetAttr,
    StatFs, TimeSet, Version,
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
            if self.spec.keep_metadata {
                out = self.with_metadata(&dir_key, out).await?;
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

    fn readlink(&self, path: &Path) -> HomeResult<Vec<u8>> {
        if !self.spec.keep_metadata {
            return Err(HomeError::Unsupported("symlinks on S3 without metadata"));
        }
        let key = self.key(path, false)?;
        self.run(async {
            let attr = self.stat_file(&key).await?.ok_or(HomeError::NotFound)?;
            if attr.kind != FileKind::Symlink {
                return Err(HomeError::Os(libc::EINVAL));
            }
            let read = self.op.read_with(&key).if_match(&attr.version.0);
            Ok(read.await.map_err(|e| classify(e, false))?.to_vec())
        })
    }

    fn create(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        let meta = self.new_meta(libc::S_IFREG | (mode & 0o7777), owner);
        self.run(self.create_object(path, &key, Vec::new(), meta))
    }

    /// One upload, its mode, owner and time in its metadata, for content up to a part's size; a larger
    /// file is made empty, then written (a multipart upload).
    fn create_file(&self, path: &Path, new: &NewFile<'_>) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        let mut meta = self.new_meta(libc::S_IFREG | (new.mode & 0o7777), new.owner);
        if new.mtime.is_some() {
            meta.mtime = new.mtime;
        }
        let bytes = match new.content {
            None => Vec::new(),
            Some(c) if c.size <= super::PART as u64 => {
                let mut bytes = vec![0u8; c.size as usize];
                super::writes::fill_from(c.source, c.ranges, 0, &mut bytes)?;
                bytes
            }
            Some(c) => {
                self.run(self.create_object(path, &key, Vec::new(), meta))?;
                return self.write(path, c.source, c.ranges, c.size, None, new.mtime);
            }
        };
        let out = bytes.len() as u64;
        self.run_for(self.deadline_for(out), self.create_object(path, &key, bytes, meta))
    }

    fn mkdir(&self, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        let dir_key = self.key(path, true)?;
        let key = self.key(path, false)?;
        self.run(async {
            if self.stat_file(&key).await?.is_some() || self.dir_exists(&dir_key).await? {
                return Err(HomeError::Exists);
            }
            let mut attr = self.dir_attr();
            if self.spec.keep_metadata {
                let meta = self.new_meta(libc::S_IFDIR | (mode & 0o7777), owner);
                self.put_marker(&dir_key, &meta).await?;
                meta.apply(&mut attr);
            } else {
                self.op.create_dir(&dir_key).await.map_err(|e| classify(e, true))?;
            }
            Ok(attr)
        })
    }

    fn mknod(&self, _path: &Path, _mode: u32, _rdev: u64, _owner: Owner) -> HomeResult<HomeAttr> {
        Err(HomeError::Unsupported("special files on S3"))
    }

    fn symlink(&self, target: &[u8], path: &Path, owner: Owner) -> HomeResult<HomeAttr> {
        if !self.spec.keep_metadata {
            return Err(HomeError::Unsupported("symlinks on S3 without metadata"));
        }
        let key = self.key(path, false)?;
        // s3fs's symlink: an object holding the target, its mode saying S_IFLNK.
        let meta = self.new_meta(libc::S_IFLNK | 0o777, owner);
        self.run(self.create_object(path, &key, target.to_vec(), meta))
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
            self.check_removable(&dir_key).await?;
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
                    // A marker carries its directory's mode, owner, times and extended attributes: the copy
                    // gets them too (OpenDAL's copy refuses keys ending in '/').
                    let (_, meta) = self.dir_attr_meta_at(key).await?;
                    if self.spec.keep_metadata && meta != ObjectMeta::default() {
                        self.put_marker(&target, &meta).await?;
                    } else {
                        self.op.create_dir(&target).await.map_err(|e| classify(e, false))?;
                    }
                } else {
                    self.op.copy(key, &target).await.map_err(|e| classify(e, false))?;
                }
            }
            for key in &deletion_order(keys) {
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
        // A rewrite of the object (a truncate; a change of mode, owner or time, which S3 keeps in metadata
        // that only a new upload replaces): up to twice its size crosses the link.
        self.run_for(self.deadline_for(2 * changes.size.unwrap_or(0)), async {
            let file = self.stat_file_meta(&key).await?;
            let is_file = file.is_some();
            let (current, stored) = match file {
                Some(found) => found,
                // A directory: its marker holds its metadata.
                None => self.stat_any_meta(path).await?,
            };
            let size = changes.size.unwrap_or(current.size);
            let mut want = current.clone();
            if self.spec.keep_metadata {
                if let Some(p) = changes.perm {
                    want.perm = p & 0o7777;
                }
                if let Some(u) = changes.uid {
                    want.uid = u;
                }
                if let Some(g) = changes.gid {
                    want.gid = g;
                }
                match changes.mtime {
                    Some(TimeSet::At(t)) => want.mtime = t,
                    Some(TimeSet::Now) => want.mtime = SystemTime::now(),
                    None => {}
                }
            }
            let meta = ObjectMeta::of(&want).keeping(&stored);
            if size == current.size && (!self.spec.keep_metadata || meta == ObjectMeta::of(&current).keeping(&stored)) {
                return Ok(current);
            }
            if !is_file {
                if changes.size.is_some() {
                    return Err(HomeError::Os(libc::EISDIR));
                }
                let dir_key = self.key(path, true)?;
                if dir_key.is_empty() && !self.has_root_marker() {
                    // A bucket's root keeps nothing.
                    return Ok(current);
                }
                self.put_marker(&dir_key, &meta).await?;
                return self.stat_any(path).await;
            }
            self.rewrite(
                &key,
                None,
                &[],
                size,
                Some((&current.version.0, current.size)),
                Some(&meta),
            )
            .await?;
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
        mtime: Option<std::time::SystemTime>,
    ) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        // The rewrite reads the unchanged parts and uploads the whole object: up to twice its size.
        self.run_for(self.deadline_for(2 * size), async {
            let (current, stored) = self.stat_file_meta(&key).await?.ok_or(HomeError::NotFound)?;
            if let Some(base) = base
                && !base.0.is_empty()
                && base.0 != current.version.0
            {
                return Err(HomeError::Conflict);
            }
            // The object keeps its mode, owner and extended attributes, and takes the time the mount shows.
            let mut meta = ObjectMeta::of(&current).keeping(&stored);
            if mtime.is_some() {
                meta.mtime = mtime;
            }
            // Parts nothing changed are copied at the server where the object has any (`copying.rs`).
            let base = (current.version.0.as_str(), current.size);
            if self
                .rewrite_copying(&key, source, ranges, size, base, Some(&meta))
                .await?
            {
                return self.stat_file(&key).await?.ok_or(HomeError::NotFound);
            }
            self.rewrite(
                &key,
                Some(source),
                ranges,
                size,
                Some((&current.version.0, current.size)),
                Some(&meta),
            )
            .await?;
            self.stat_file(&key).await?.ok_or(HomeError::NotFound)
        })
    }

    fn xattrs(&self, path: &Path) -> HomeResult<Vec<(Vec<u8>, Vec<u8>)>> {
        if !self.spec.keep_metadata {
            return Err(HomeError::Unsupported("extended attributes on S3 without metadata"));
        }
        let (_, stored) = self.run(self.stat_any_meta(path))?;
        Ok(self.stored_xattrs(path, &stored).into_iter().collect())
    }

    fn set_xattr(&self, path: &Path, name: &[u8], value: Option<&[u8]>) -> HomeResult<()> {
        if !self.spec.keep_metadata {
            return Err(HomeError::Unsupported("extended attributes on S3 without metadata"));
        }
        if value.is_some() {
            xattr::check_name(name)?;
        }
        let (current, stored) = self.run(self.stat_any_meta(path))?;
        let mut all = self.stored_xattrs(path, &stored);
        // Nothing to change (a retried push, or taking away one it has not): the object is left alone.
        if all.get(name).map(Vec::as_slice) == value {
            return Ok(());
        }
        match value {
            Some(v) => all.insert(name.to_vec(), v.to_vec()),
            None => all.remove(name),
        };
        // Mode, owner, time and every other key as they are; only `xattr` changes.
        let meta = ObjectMeta {
            xattr: xattr::encode(&all),
            ..ObjectMeta::of(&current).keeping(&stored)
        };
        if value.is_some() && meta.stored_len() > xattr::METADATA_MAX {
            return Err(HomeError::Os(libc::E2BIG));
        }
        if current.kind == FileKind::Dir {
            let dir_key = self.key(path, true)?;
            if dir_key.is_empty() && !self.has_root_marker() {
                return Err(HomeError::Unsupported("extended attributes on a bucket's root"));
            }
            // Not conditional: a marker's ETag is that of no bytes whatever its metadata, so a condition
            // on it would guard nothing.
            return self.run(self.put_marker(&dir_key, &meta));
        }
        // A new upload is the only way S3 replaces metadata through OpenDAL: the object's bytes travel
        // down and up again, conditional on its ETag so that content changed meanwhile is not overwritten.
        let key = self.key(path, false)?;
        let base = Some((current.version.0.as_str(), current.size));
        self.run_for(
            self.deadline_for(2 * current.size),
            self.rewrite(&key, None, &[], current.size, base, Some(&meta)),
        )
    }

    fn check_xattrs(&self, xattrs: &[(Vec<u8>, Vec<u8>)]) -> HomeResult<()> {
        if !self.spec.keep_metadata {
            return Err(HomeError::Unsupported("extended attributes on S3 without metadata"));
        }
        xattr::check(xattrs)
    }

    fn limits(&self) -> HomeLimits {
        let mut limits = HomeLimits::object_store(MAX_KEY, self.spec.prefix.trim_matches('/').len());
        // Kept in object metadata, where metadata is kept at all.
        limits.symlinks = self.spec.keep_metadata;
        limits.xattrs = self.spec.keep_metadata;
        limits.times = self.spec.keep_metadata;
        limits
    }

    fn rewrite_bytes(&self) -> Option<crate::RewriteBytes> {
        use std::sync::atomic::Ordering::Relaxed;
        Some(crate::RewriteBytes {
            sent: self.wire.sent.load(Relaxed),
            received: self.wire.received.load(Relaxed),
            copied: self.wire.copied.load(Relaxed),
        })
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

impl S3Home {
    /// The extended attributes `stored` holds for the object at `path`; those not in s3fs's form are left
    /// out, and said once.
    fn stored_xattrs(&self, path: &Path, stored: &ObjectMeta) -> Xattrs {
        let Some(value) = &stored.xattr else {
            return Xattrs::new();
        };
        let (all, clean) = xattr::decode(value);
        if !clean {
            tracing::warn!(
                path = %path.display(),
                "the extended attributes of this object (x-amz-meta-xattr) are not all in s3fs's form; \
                 those that are not were left out"
            );
        }
        all
    }
}

/// The order the source keys of a moved directory are deleted in, once all are copied: every key below a
/// directory's marker before that marker, so the moved directory's own marker goes last. A move cut short
/// anywhere then leaves no directory at the source that still holds entries without its marker, which
/// carries its mode, owner, time and extended attributes: a repeat finishing the move (see the flusher)
/// gives each directory at the target the attributes of a real marker, not a bare prefix's defaults.
pub(super) fn deletion_order(mut keys: Vec<String>) -> Vec<String> {
    // A key sorts after every key it is a prefix of (a marker "a/b/" before "a/b/c"): reversed, after.
    keys.sort_unstable();
    keys.reverse();
    keys
}
