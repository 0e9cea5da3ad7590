//! Where a file holds data and where it has holes (`SEEK_DATA` / `SEEK_HOLE`): what a push copies to a home
//! that keeps holes, and what it leaves out.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;

use crate::HomeResult;
use crate::error::from_errno;

/// `lseek` of `file` to `pos` with `whence`: `Ok(None)` past the last data (`ENXIO`), `Err(errno)` else.
fn seek(file: &File, pos: u64, whence: libc::c_int) -> Result<Option<u64>, i32> {
    // SAFETY: lseek on a valid open descriptor; the offset it moves is not used by positioned I/O.
    let r = unsafe { libc::lseek(file.as_raw_fd(), pos as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        e => Err(e.unwrap_or(libc::EIO)),
    }
}

/// The data extents of `file` within `range`, in order. A file system that cannot tell holes reports all
/// of it as data.
pub(crate) fn data_extents(file: &File, range: Range<u64>) -> HomeResult<Vec<Range<u64>>> {
    let mut out = Vec::new();
    let mut pos = range.start;
    while pos < range.end {
        let start = match seek(file, pos, libc::SEEK_DATA) {
            Ok(Some(start)) => start,
            Ok(None) => break,
            Err(libc::EINVAL) | Err(libc::EOPNOTSUPP) => pos,
            Err(e) => return Err(from_errno(e)),
        };
        if start >= range.end {
            break;
        }
        let end = match seek(file, start, libc::SEEK_HOLE) {
            Ok(Some(end)) => end.min(range.end),
            Ok(None) => break,
            Err(libc::EINVAL) | Err(libc::EOPNOTSUPP) => range.end,
            Err(e) => return Err(from_errno(e)),
        };
        if end <= start {
            break;
        }
        out.push(start..end);
        pos = end;
    }
    Ok(out)
}

/// How many bytes of `ranges` (clipped to `size`) are data in `source`, not holes: what a write of them
/// sends to a home that keeps holes. Where the extents cannot be read, the whole range counts.
pub(crate) fn data_bytes(source: &File, ranges: &[Range<u64>], size: u64) -> u64 {
    ranges
        .iter()
        .map(|r| r.start..r.end.min(size))
        .filter(|r| !r.is_empty())
        .map(|r| match data_extents(source, r.clone()) {
            Ok(extents) => extents.iter().map(|e| e.end - e.start).sum(),
            Err(_) => r.end - r.start,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn extents_skip_holes_and_respect_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("sparse"))
            .unwrap();
        f.write_all_at(&[1; 4096], 0).unwrap();
        f.write_all_at(&[2; 4096], 8 << 20).unwrap();
        f.set_len(16 << 20).unwrap();
        assert_eq!(
            data_extents(&f, 0..16 << 20).unwrap(),
            vec![0..4096, (8 << 20)..(8 << 20) + 4096]
        );
        assert_eq!(data_extents(&f, 100..200).unwrap(), vec![100..200]);
        assert_eq!(data_extents(&f, 4096..8 << 20).unwrap(), Vec::<Range<u64>>::new());
        assert_eq!(data_bytes(&f, std::slice::from_ref(&(0..16 << 20)), 16 << 20), 8192);
        assert_eq!(data_bytes(&f, std::slice::from_ref(&(0..16 << 20)), 2048), 2048);
    }
}
