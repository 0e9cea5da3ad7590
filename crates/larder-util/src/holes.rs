//! Holes in files: a range punched out (it reads as zeros and takes no disk), or, where a file system
//! cannot punch, zeros written over it. The cache's files and a directory home's files both keep holes
//! this way.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// Punch `range` out of `file`, keeping its size (`fallocate`'s `PUNCH_HOLE | KEEP_SIZE`). An empty range
/// is nothing to do. The error is the file system's, `EOPNOTSUPP` where it cannot punch.
pub fn punch_hole(file: &File, range: Range<u64>) -> std::io::Result<()> {
    if range.is_empty() {
        return Ok(());
    }
    // SAFETY: fallocate on an open descriptor with plain integer arguments.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            range.start as libc::off_t,
            (range.end - range.start) as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Write zeros over `range` of `file`, `zeros.len()` bytes at a time (`zeros` holds only zeros, and is not
/// empty unless `range` is).
pub fn write_zeros(file: &File, range: Range<u64>, zeros: &[u8]) -> std::io::Result<()> {
    let mut pos = range.start;
    while pos < range.end {
        let n = ((range.end - pos) as usize).min(zeros.len());
        file.write_all_at(&zeros[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn a_punched_or_zeroed_range_reads_as_zeros_and_the_file_keeps_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let before = file.metadata().unwrap().blocks();
        punch_hole(&file, 65536..524288).unwrap();
        punch_hole(&file, 10..10).unwrap();
        write_zeros(&file, 3..1000, &[0u8; 64]).unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), 1 << 20);
        for (i, b) in got.iter().enumerate() {
            let zero = (3..1000).contains(&i) || (65536..524288).contains(&i);
            assert_eq!(*b, if zero { 0 } else { 7 }, "byte {i}");
        }
        assert!(file.metadata().unwrap().blocks() < before, "nothing was punched");
    }
}
