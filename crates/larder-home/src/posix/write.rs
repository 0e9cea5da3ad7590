//! Pushing a file's data: the dirty ranges of the cache copy written over home's file, holes kept as holes
//! (punched, or written as zeros where the file system cannot punch), the size and time set last. The room
//! the push needs is allocated first, so that a full home fails it before anything changed. A push of the
//! whole content first cuts the file to nothing.

use std::ffi::CStr;
use std::fs::File;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::time::SystemTime;

use super::sys::{check, open_at, stat_fd, timespec};
use crate::extents::data_extents;
use crate::{HomeAttr, HomeError, HomeResult, TimeSet, Version};

const COPY_CHUNK: usize = 1 << 20;

/// Write `ranges` of `source` to the file at `path` under `dir` and make it `size` bytes long, with the
/// modification time `mtime` when given; a file no longer at the version `base` is a conflict.
pub(super) fn write_at(
    dir: RawFd,
    path: &CStr,
    source: &File,
    ranges: Vec<Range<u64>>,
    size: u64,
    base: Option<Version>,
    mtime: Option<SystemTime>,
) -> HomeResult<HomeAttr> {
    let file = open_at(dir, path, libc::O_WRONLY | libc::O_NOFOLLOW, 0)?;
    let current = stat_fd(&file)?;
    if let Some(base) = base
        && current.version != base
    {
        return Err(HomeError::Conflict);
    }
    // Cut first: nothing past the new end is copied or zeroed. A push of the whole content cuts to
    // nothing, so that until it ends home holds a prefix of the new content, never a mix of old and new
    // bytes: a pusher cut short can tell its own partial work from someone else's change.
    let whole = size > 0 && ranges.first().is_some_and(|r| r.start == 0 && r.end >= size);
    // Room for everything this push writes is taken before anything changes: a home without it fails
    // here, its file as it was, rather than part way with a fragment of ours in it.
    reserve(&file, source, &ranges, size)?;
    let cut = if whole { 0 } else { size };
    let mut home_end = current.size;
    if cut < home_end {
        file.set_len(cut)?;
        home_end = cut;
    }
    let mut buf = vec![0u8; COPY_CHUNK];
    for range in ranges {
        let range = range.start..range.end.min(size);
        // Holes in the cache copy stay holes at home: only its data is sent, and where home had
        // bytes under a hole they are zeroed.
        let mut pos = range.start;
        for extent in data_extents(source, range.clone())? {
            zero_range(&file, pos..extent.start.min(home_end), &mut buf)?;
            pos = extent.start;
            while pos < extent.end {
                let want = ((extent.end - pos) as usize).min(COPY_CHUNK);
                let got = source.read_at(&mut buf[..want], pos)?;
                if got == 0 {
                    // The cache copy is shorter than it was: the rest is a hole.
                    break;
                }
                file.write_all_at(&buf[..got], pos)?;
                pos += got as u64;
            }
        }
        zero_range(&file, pos..range.end.min(home_end), &mut buf)?;
    }
    if stat_fd(&file)?.size != size {
        file.set_len(size)?;
    }
    if let Some(t) = mtime {
        // The time the mount shows is the time home ends with, not the time of the push.
        let times = [timespec(None), timespec(Some(TimeSet::At(t)))];
        // SAFETY: a valid open descriptor and two timespecs, as futimens requires.
        check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) })?;
    }
    file.sync_all()?;
    stat_fd(&file)
}

/// Allocate in `file` the blocks the data of `source` in `ranges` (below `size`) will take, without changing
/// its size or bytes (`FALLOC_FL_KEEP_SIZE`): a home file system without the room answers `ENOSPC` here,
/// before the push writes anything. Holes in `source` stay holes (only its data extents are allocated).
/// Where the file system cannot allocate ahead (`EOPNOTSUPP`: some network and FUSE file systems), the push
/// goes on as before: a full home then fails it part way, and the repeat writes it again.
fn reserve(file: &File, source: &File, ranges: &[Range<u64>], size: u64) -> HomeResult<()> {
    for range in ranges {
        let range = range.start..range.end.min(size);
        if range.is_empty() {
            continue;
        }
        for extent in data_extents(source, range)? {
            // SAFETY: fallocate on a valid open descriptor with plain integer arguments.
            let r = unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    extent.start as libc::off_t,
                    (extent.end - extent.start) as libc::off_t,
                )
            };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => Ok(()),
                    _ => Err(e.into()),
                };
            }
        }
    }
    Ok(())
}

/// Make `range` of `file` read as zeros: a punched hole where the file system can, written zeros where it
/// cannot.
fn zero_range(file: &File, range: Range<u64>, buf: &mut [u8]) -> HomeResult<()> {
    if range.is_empty() {
        return Ok(());
    }
    // SAFETY: fallocate on a valid open descriptor with plain integer arguments.
    let punched = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            range.start as libc::off_t,
            (range.end - range.start) as libc::off_t,
        )
    };
    if punched == 0 {
        return Ok(());
    }
    buf.fill(0);
    let mut pos = range.start;
    while pos < range.end {
        let n = ((range.end - pos) as usize).min(buf.len());
        file.write_all_at(&buf[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}
