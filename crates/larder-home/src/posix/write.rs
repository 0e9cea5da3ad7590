//! Pushing a file's data: the dirty ranges of the cache copy written over home's file, holes kept as holes
//! (punched, or written as zeros where the file system cannot punch), the size and time set last. The room
//! the push needs is asked for first, so that a full home fails it before anything changed. A push of the
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
    write_to(&file, current.size, source, ranges, size, mtime)
}

/// Write `ranges` of `source` to `file`, which holds `current` bytes, make it `size` bytes long with the
/// modification time `mtime` when given, and sync it: its attributes afterwards.
pub(super) fn write_to(
    file: &File,
    current: u64,
    source: &File,
    ranges: Vec<Range<u64>>,
    size: u64,
    mtime: Option<SystemTime>,
) -> HomeResult<HomeAttr> {
    // Cut first: nothing past the new end is copied or zeroed. A push of the whole content cuts to
    // nothing, so that until it ends home holds a prefix of the new content, never a mix of old and new
    // bytes: a pusher cut short can tell its own partial work from someone else's change.
    let whole = size > 0 && ranges.first().is_some_and(|r| r.start == 0 && r.end >= size);
    // Room for everything this push writes is asked for before anything changes: a home without it fails
    // here, its file as it was, rather than part way with a fragment of ours in it.
    check_room(file, source, &ranges, size, whole, current)?;
    let cut = if whole { 0 } else { size };
    let mut home_end = current;
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
            zero_range(file, pos..extent.start.min(home_end), &mut buf)?;
            pos = extent.start;
            while pos < extent.end {
                let want = ((extent.end - pos) as usize).min(COPY_CHUNK);
                let got = source.read_at(&mut buf[..want], pos)?;
                if got == 0 {
                    // The cache copy is shorter than it was: the rest is a hole.
                    break;
                }
                // Past home's bytes, zeros are left a hole (the file reads as zeros there once its size is
                // set): blocks the cache file system allocated unwritten (`fallocate`) read as data once
                // in its page cache, and would otherwise be written out as zeros.
                if pos < home_end || !all_zeros(&buf[..got]) {
                    file.write_all_at(&buf[..got], pos)?;
                }
                pos += got as u64;
            }
        }
        zero_range(file, pos..range.end.min(home_end), &mut buf)?;
    }
    if stat_fd(file)?.size != size {
        file.set_len(size)?;
    }
    if let Some(t) = mtime {
        // The time the mount shows is the time home ends with, not the time of the push.
        let times = [timespec(None), timespec(Some(TimeSet::At(t)))];
        // SAFETY: a valid open descriptor and two timespecs, as futimens requires.
        check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) })?;
    }
    file.sync_all()?;
    stat_fd(file)
}

/// Whether home has room for what this push writes, asked before anything changes: the data of `source`
/// in `ranges` (below `size`) less what `file` holds allocated there already (all of it for a push of the
/// whole content, which cuts the file to nothing first), each extent counted in whole blocks of home's
/// file system, against the space it has free. Not enough is `NoSpace`, with home's file untouched. The
/// file itself is not used to take the room (`fallocate`): an allocation that succeeds for one extent
/// and fails for the next would change its times, and the push's repeat would take home's file for
/// someone else's change. (Another writer may take the room between the look and the write: a push cut
/// short then is repeated as any other.)
fn check_room(
    file: &File,
    source: &File,
    ranges: &[Range<u64>],
    size: u64,
    whole: bool,
    current: u64,
) -> HomeResult<()> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid descriptor and a buffer for fstatvfs to fill.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        // Nothing to tell by: the push goes on as before.
        return Ok(());
    }
    // SAFETY: fstatvfs returned 0, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    let unit = st.f_frsize.max(512);
    let blocks = |extents: &[Range<u64>]| -> u64 {
        extents
            .iter()
            .map(|e| (e.end.div_ceil(unit) - e.start / unit) * unit)
            .sum()
    };
    let mut needed = 0u64;
    let mut held = 0u64;
    for range in ranges {
        let range = range.start..range.end.min(size);
        if range.is_empty() {
            continue;
        }
        needed += blocks(&data_extents(source, range.clone())?);
        if !whole {
            held += blocks(&data_extents(file, range.start..range.end.min(current))?);
        }
    }
    if whole {
        held = blocks(&data_extents(file, 0..current)?);
    }
    let free = st.f_bavail * st.f_frsize;
    if needed.saturating_sub(held) > free {
        return Err(HomeError::NoSpace);
    }
    Ok(())
}

/// Whether `bytes` are all zeros (compared a word at a time).
fn all_zeros(bytes: &[u8]) -> bool {
    // SAFETY: any bytes are a valid u128; align_to splits off what is not aligned.
    let (head, words, tail) = unsafe { bytes.align_to::<u128>() };
    head.iter().all(|b| *b == 0) && words.iter().all(|w| *w == 0) && tail.iter().all(|b| *b == 0)
}

/// Make `range` of `file` read as zeros: a punched hole where the file system can, written zeros where it
/// cannot.
fn zero_range(file: &File, range: Range<u64>, buf: &mut [u8]) -> HomeResult<()> {
    if larder_util::holes::punch_hole(file, range.clone()).is_ok() {
        return Ok(());
    }
    buf.fill(0);
    larder_util::holes::write_zeros(file, range, buf)?;
    Ok(())
}
