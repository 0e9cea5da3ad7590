//! Readers of a version home is about to lose. A file removed, or replaced by a rename, through this
//! mount stays readable to the descriptors open on it until they close, as on a local file system (and
//! as NFS gives by renaming an open file aside): before the op that takes the version from home is
//! pushed, every block of it the cache lacks is brought in, and the object is held (never evicted) until
//! the last close. The push waits for that; home away or refusing makes it wait as for any failure of
//! its own. A version changed or removed at home by others is gone from home already: its readers get
//! `ESTALE` (or `ENOENT`) for what the cache does not hold, as before.

use std::ops::Range;

use std::os::unix::ffi::OsStringExt;

use larder_home::FileKind;

use crate::FileVersion;
use crate::data::DataPath;
use crate::journal::{Op, OpKind};
use crate::readahead::Job;
use crate::{FsError, FsResult};

impl DataPath {
    /// Before `op` reaches home: the version it removes (an unlink's file, or the target a rename
    /// replaces), if descriptors are open on it, is brought into the cache whole and held there.
    pub(crate) fn keep_for_readers(&self, op: &Op) -> FsResult<()> {
        let victim = {
            let ns = self.names.read();
            let target = match &op.kind {
                OpKind::Unlink => Some(op.ino),
                OpKind::Rename {
                    replaced: true,
                    exchange: false,
                    ..
                } => {
                    let to = op
                        .names
                        .get(1)
                        .map(|(d, n)| (*d, std::ffi::OsString::from_vec(n.clone())));
                    ns.inodes
                        .iter()
                        .find(|(i, n)| **i != op.ino && n.removed && to.is_some() && n.home_loc == to)
                        .map(|(i, _)| *i)
                }
                _ => None,
            };
            target.filter(|ino| {
                ns.inodes
                    .get(ino)
                    .is_some_and(|n| n.removed && n.kind == FileKind::File && n.object != 0 && n.opens() > 0)
            })
        };
        let Some(ino) = victim else { return Ok(()) };
        // Held first: what comes in from here on is not evicted.
        let (object, job) = {
            let mut ns = self.names.write();
            let path = ns.home_path(ino)?;
            let node = ns.inode_mut(ino)?;
            let object = node.object;
            // (Once: an attempt that failed part way is made again, and goes on where it stopped.)
            if !std::mem::replace(&mut node.kept_for_readers, true) {
                self.core.store.hold(object);
            }
            let job = match (path, node.attr.as_ref()) {
                (Some(path), Some(attr)) => Some(Job {
                    blocks: 0..node.home_end().div_ceil(self.core.store.block_size()) as u32,
                    file: FileVersion {
                        object,
                        epoch: self.core.store.epoch(object),
                        path,
                        version: attr.version.clone(),
                        home_end: node.home_end(),
                    },
                }),
                _ => None,
            };
            (object, job)
        };
        let Some(job) = job else { return Ok(()) };
        let missing = |job: &Job| -> Vec<Range<u32>> {
            let mut runs: Vec<Range<u32>> = Vec::new();
            for index in job.blocks.clone() {
                if self.core.store.contains((object, index)) {
                    continue;
                }
                match runs.last_mut() {
                    Some(r) if r.end == index => r.end += 1,
                    _ => runs.push(index..index + 1),
                }
            }
            runs
        };
        let before: u64 = missing(&job).iter().map(|r| (r.end - r.start) as u64).sum();
        if before == 0 {
            return Ok(());
        }
        let bytes = before * self.core.store.block_size();
        if bytes > self.core.store.stats().bytes_limit / 4 {
            // Too much of the cache to hold for readers: they read what the cache has, and the rest is
            // ESTALE once home has lost it, as for a change made at home.
            tracing::warn!(
                ino,
                bytes,
                "a file still open was removed or replaced here; too large to keep for its readers"
            );
            return Ok(());
        }
        tracing::debug!(
            ino,
            blocks = before,
            "bringing in the rest of a version open readers still read"
        );
        // In runs of adjacent blocks (one home request each), then block by block for what a reader took
        // meanwhile and did not keep.
        for run in missing(&job) {
            let mut at = run.start;
            while at < run.end {
                let end = run
                    .end
                    .min(at + (crate::readahead::MAX_RUN / self.core.store.block_size()).max(1) as u32);
                let stopped = self.core.fetch_run(&job.file, at..end).map_err(FsError::Home)?;
                at = stopped.max(at + 1);
            }
        }
        for run in missing(&job) {
            for index in run {
                self.fetch_block(ino, &job.file, index)?;
            }
        }
        if !missing(&job).is_empty() {
            // Not all kept (the cache had no room for it): the change goes on all the same, and its readers
            // find the rest ESTALE.
            tracing::warn!(
                ino,
                "not all of a file removed or replaced here could be kept for its readers"
            );
        }
        Ok(())
    }
}
