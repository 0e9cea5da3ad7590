//! Changing the bucket: whole-object rewrites through a multipart upload (what they move counted in
//! `wire`, as for the rewrites that copy parts at the server), a file's rename as copy and delete, and the
//! marker that keeps a directory once its last child is gone.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::meta::ObjectMeta;
use super::requests::classify;
use super::{PART, S3Home};
use crate::HomeResult;

impl S3Home {
    /// Rewrite `key` as `size` bytes: `ranges` from `source`, the rest from the object at `base` (bytes
    /// past its old end are zeros), with `meta` as its metadata. Conditional on `base` when given.
    pub(super) async fn rewrite(
        &self,
        key: &str,
        source: Option<&File>,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<(&str, u64)>,
        meta: Option<&ObjectMeta>,
    ) -> HomeResult<()> {
        let mut writer = {
            let mut w = self.op_bulk.writer_with(key).chunk(PART).concurrent(4);
            if let Some(m) = meta.filter(|_| self.spec.keep_metadata) {
                w = w.user_metadata(m.to_map());
            }
            let w = match base {
                Some((etag, _)) if !etag.is_empty() => w.if_match(etag),
                _ => w,
            };
            w.await.map_err(|e| classify(e, true))?
        };
        let old_size = base.map_or(0, |b| b.1);
        let mut pos = 0u64;
        while pos < size {
            let end = (pos + PART as u64).min(size);
            let mut part = vec![0u8; (end - pos) as usize];
            // The bytes of the old object this part keeps.
            let keep_end = end.min(old_size);
            if pos < keep_end
                && let Some((etag, _)) = base
            {
                let mut read = self.op_bulk.read_with(key).range(pos..keep_end);
                if !etag.is_empty() {
                    read = read.if_match(etag);
                }
                let old = read.await.map_err(|e| classify(e, true))?.to_vec();
                self.wire
                    .received
                    .fetch_add(old.len() as u64, std::sync::atomic::Ordering::Relaxed);
                part[..old.len()].copy_from_slice(&old);
            }
            if let Some(source) = source {
                fill_from(source, ranges, pos, &mut part)?;
            }
            let len = part.len() as u64;
            writer.write(part).await.map_err(|e| classify(e, true))?;
            self.wire.sent.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
            pos = end;
        }
        writer.close().await.map_err(|e| classify(e, true))?;
        Ok(())
    }

    pub(super) async fn rename_file(&self, from: &str, to: &str) -> HomeResult<()> {
        self.op.copy(from, to).await.map_err(|e| classify(e, false))?;
        self.op.delete(from).await.map_err(|e| classify(e, false))?;
        self.keep_parent(from).await
    }

    /// After `key` went away: a directory that existed only as a common prefix would vanish with its last
    /// child, which a file system does not do; give it a marker.
    pub(super) async fn keep_parent(&self, key: &str) -> HomeResult<()> {
        let trimmed = key.trim_end_matches('/');
        let Some(cut) = trimmed.rfind('/') else { return Ok(()) };
        let parent = &trimmed[..=cut];
        if !self.dir_exists(parent).await? {
            self.op.create_dir(parent).await.map_err(|e| classify(e, false))?;
        }
        Ok(())
    }

    /// The marker of the directory `dir_key` ("a/b/"), holding `meta`. OpenDAL's `create_dir` stores no
    /// metadata and its `write` refuses a key ending in '/', so this goes one level down, to the service's
    /// own write (through the same layers: retries, timeouts).
    pub(super) async fn put_marker(&self, dir_key: &str, meta: &ObjectMeta) -> HomeResult<()> {
        use opendal::raw::ServiceDyn;
        use opendal::raw::oio::Write;
        let options = opendal::options::WriteOptions {
            user_metadata: Some(meta.to_map()),
            ..Default::default()
        };
        let (args, _) = opendal::raw::OpWrite::from_options(&self.op.info().capability(), options)
            .map_err(|e| classify(e, true))?;
        let mut w = self
            .op
            .service()
            .write_dyn(self.op.context(), dir_key, args)
            .map_err(|e| classify(e, true))?;
        w.write(opendal::Buffer::new()).await.map_err(|e| classify(e, true))?;
        w.close().await.map_err(|e| classify(e, true))?;
        Ok(())
    }
}

/// Copy into `buf`, which holds the bytes of the object from `at` on, what `ranges` of `source` give of them
/// (where the cache copy ends in a hole, zeros).
pub(super) fn fill_from(source: &File, ranges: &[Range<u64>], at: u64, buf: &mut [u8]) -> std::io::Result<()> {
    let end = at + buf.len() as u64;
    for r in ranges {
        let (s, e) = (r.start.max(at), r.end.min(end));
        if s >= e {
            continue;
        }
        let slice = &mut buf[(s - at) as usize..(e - at) as usize];
        let mut done = 0;
        while done < slice.len() {
            let n = source.read_at(&mut slice[done..], s + done as u64)?;
            if n == 0 {
                slice[done..].fill(0);
                break;
            }
            done += n;
        }
    }
    Ok(())
}
