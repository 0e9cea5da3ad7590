//! A cache file's stamp: its size and times, which show whether a writer the kernel serves from it
//! (passthrough) wrote since they were last looked at.

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime};

/// A cache file's size and times: unchanged, they say no write landed since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

pub(crate) fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Times closer to now than this cannot tell a later write: the file system may stamp it with the same.
const CLOCK_TICK: Duration = Duration::from_millis(50);

/// Whether the file system at `dir` stamps each change with a time of its own once the previous one was
/// looked at (Linux 6.13's multigrain timestamps on ext4, xfs, btrfs, tmpfs): then a stamp shows every
/// later write however soon it comes. Probed once: two writes, each right after a stat, must move the
/// modification time every time.
pub(crate) fn fine_grained_times(dir: &std::path::Path) -> bool {
    static FINE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FINE.get_or_init(|| {
        let path = dir.join(".larder-time-probe");
        let probe = || -> std::io::Result<bool> {
            use std::os::unix::fs::FileExt;
            let f = larder_util::private::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)?;
            let mut last = f.metadata()?.modified()?;
            for i in 0..8u8 {
                f.write_all_at(&[i], 0)?;
                let now = f.metadata()?.modified()?;
                if now <= last {
                    return Ok(false);
                }
                last = now;
            }
            Ok(true)
        };
        let fine = probe().unwrap_or(false);
        let _ = std::fs::remove_file(&path);
        tracing::debug!(fine, "probed the cache file system's timestamps");
        fine
    })
}

/// The stamp of `file` now, if its times show any write made after it.
pub(crate) fn stamp(file: &File, fine: bool) -> Option<Stamp> {
    stamp_of(&file.metadata().ok()?, fine)
}

/// The stamp of a file whose metadata is `m`, if its times show any write made after them.
pub(crate) fn stamp_of(m: &Metadata, fine: bool) -> Option<Stamp> {
    let s = Stamp {
        size: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    };
    let at =
        |(secs, nanos): (i64, i64)| SystemTime::UNIX_EPOCH + Duration::new(secs.max(0) as u64, nanos.max(0) as u32);
    let latest = at(s.mtime).max(at(s.ctime));
    let recent = !fine
        && SystemTime::now()
            .duration_since(latest)
            .is_ok_and(|age| age < CLOCK_TICK)
        || latest > SystemTime::now();
    (!recent).then_some(s)
}
