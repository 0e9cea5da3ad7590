//! `fallocate(2)`: the modes programs use to size a file or to clear part of it. Each is made by the path
//! that already makes that change, a truncation or a write, so it reaches home as one of those does.
//!
//! * Allocating (mode 0) extends the file when the range passes its end. The new bytes read as zeros and
//!   take their room on the cache disk at once (the cache file system allocates them, and the file's
//!   `st_blocks` counts them), so writes there later find it, as on a local disk; they are dirty until
//!   pushed, and home gets them as a hole (its file system sets nothing aside). Where the cache has no
//!   room for that much dirty data now (its bound, or its disk), the file is extended as a truncation
//!   extends it, with nothing set aside: a program taking most of home's free space (`df`) with one
//!   allocation gets its file, and its writes stream through the cache as any others do. Within the file
//!   it changes nothing: what home holds there is not allocated anew.
//! * `FALLOC_FL_KEEP_SIZE` alone asks for blocks past the end without a new size: nothing changes.
//! * Both are refused with `ENOSPC` at the call when the part past the end is more than home's file
//!   system has free, as `df` shows it on the mount (home's, where the data ends up); the cache disk's own
//!   room is asked by the allocation, or by the cache's size bound, as a write's is.
//! * Punching a hole (always with `KEEP_SIZE`) and zeroing a range make the range read as zeros: the range
//!   goes the way of a write ([`DataPath::write_zeros`]: dirty, committed at the next close or fsync,
//!   pushed), but its whole pages are punched out of the cache file instead of written, and a push copies
//!   a hole as a hole (a directory home punches one too): a hole stays a hole. Zeroing without
//!   `KEEP_SIZE` then extends the file as allocating does.
//!
//! Every other mode (collapsing, inserting, unsharing, write-zeroes) is `EOPNOTSUPP`, as on a file system
//! that lacks it. The size is read before the range is cleared: a writer changing the file's size at the
//! same moment may see the range cleared up to the old size.

use larder_home::SetAttr;

use crate::data::DataPath;
use crate::{FsError, FsResult};

impl DataPath {
    /// `fallocate(2)` of `length` bytes from `offset` on the file open as `fh` (open for writing: the
    /// kernel checks), with Linux's `mode` flags. See the module's documentation for what each mode does.
    pub(crate) fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let clear = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => false,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => true,
            libc::FALLOC_FL_ZERO_RANGE => true,
            _ => return Err(FsError::Unsupported),
        };
        self.names.writable()?;
        let ino = self.names.handles().ino(fh).ok_or(FsError::BadHandle)?;
        let end = offset
            .checked_add(length)
            .filter(|_| length > 0)
            .ok_or(FsError::Invalid)?;
        // What the kernel wrote to the cache file counts: the size is the cache file's where writers the
        // kernel serves made it longer. (Their writes are taken in at their close, not here: taking them in
        // reads the whole file, and a program punching every other page of a 100 MB file open for writing
        // made each of its 25,600 calls read all 100 MB.)
        let size = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            let size = node.attr.as_ref().map_or(0, |a| a.size);
            self.names.written_directly(node).map_or(size, |(len, _)| size.max(len))
        };
        if clear && offset < size {
            self.write_zeros_over(ino, offset..end.min(size))?;
        }
        if !clear && end > size {
            self.check_home_room(end - offset.max(size))?;
            let start = offset.max(size);
            if !keep_size && self.changes().room_now(end - start) {
                let fh = self.names.new_handle(&self.names.read(), ino, None);
                let result = self.write_allocated(fh, start, end - start);
                self.names.handles().remove(fh);
                match result {
                    // The cache disk could not set it all aside after all: extended as below.
                    Err(FsError::NoSpace | FsError::Cache(larder_cache::CacheError::NoSpace)) => {}
                    result => return result,
                }
            }
        }
        if !keep_size && end > size {
            self.changes().setattr(
                ino,
                &SetAttr {
                    size: Some(end),
                    ..SetAttr::default()
                },
            )?;
        }
        Ok(())
    }

    /// `ENOSPC` when home's file system has fewer than `bytes` free (its `statfs`, as `df` shows it on the
    /// mount). A home that cannot say (away, or an object store) refuses nothing here.
    fn check_home_room(&self, bytes: u64) -> FsResult<()> {
        match self.core.home.statfs() {
            Ok(st) if st.blocks > 0 && st.blocks_available.saturating_mul(st.block_size as u64) < bytes => {
                Err(FsError::NoSpace)
            }
            _ => Ok(()),
        }
    }

    /// Make `range` of `ino` read as zeros through a handle of its own (the caller's may be an `O_APPEND`
    /// one, whose writes go at the end of the file whatever their offset): a hole in the cache file, and
    /// so at home, where their file systems can punch one (`DataPath::write_zeros`).
    fn write_zeros_over(&self, ino: u64, range: std::ops::Range<u64>) -> FsResult<()> {
        let fh = self.names.new_handle(&self.names.read(), ino, None);
        let result = self.write_zeros(fh, range.start, range.end - range.start);
        self.names.handles().remove(fh);
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::namespace::hit_tests::dir_f;
    use crate::{Drained, Fs};

    /// The bytes of `fh` from 0, as many as `len`.
    fn content(fs: &Fs, fh: u64, len: u32) -> Vec<u8> {
        fs.read(fh, 0, len).unwrap()
    }

    #[test]
    fn each_fallocate_mode_leaves_what_a_local_file_system_would_in_the_cache_and_at_home() {
        // `dir/f` is 10 KiB of 7s at home, in blocks of 4 KiB, none cached yet.
        let (tmp, fs, _dir, ino) = dir_f();
        fs.start();
        let fh = fs.open(ino, libc::O_RDWR | libc::O_APPEND).unwrap().fh;
        let mut want = vec![7u8; 10 << 10];

        fs.fallocate(fh, 0, 64 << 10, libc::FALLOC_FL_KEEP_SIZE).unwrap();
        assert_eq!(content(&fs, fh, 1 << 20), want, "keep size alone changes nothing");

        // Across a block boundary: both edge blocks come from home, the rest is zeros.
        fs.fallocate(fh, 1000, 5000, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
            .unwrap();
        want[1000..6000].fill(0);
        assert_eq!(content(&fs, fh, 1 << 20), want, "a punched hole reads as zeros");

        // Past the end, keeping the size: only the part within the file is cleared.
        fs.fallocate(fh, 9000, 4000, libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE)
            .unwrap();
        want[9000..].fill(0);
        assert_eq!(content(&fs, fh, 1 << 20), want);

        fs.fallocate(fh, 8000, 6000, libc::FALLOC_FL_ZERO_RANGE).unwrap();
        want[8000..].fill(0);
        want.resize(14000, 0);
        assert_eq!(content(&fs, fh, 1 << 20), want, "zeroing past the end extends");

        fs.fallocate(fh, 20000, 100, 0).unwrap();
        fs.fallocate(fh, 0, 100, 0).unwrap();
        want.resize(20100, 0);
        assert_eq!(content(&fs, fh, 1 << 20), want, "allocating past the end extends");

        for mode in [
            libc::FALLOC_FL_PUNCH_HOLE,
            libc::FALLOC_FL_COLLAPSE_RANGE,
            libc::FALLOC_FL_INSERT_RANGE,
        ] {
            assert!(
                matches!(fs.fallocate(fh, 0, 4096, mode), Err(FsError::Unsupported)),
                "mode {mode:#x}"
            );
        }
        assert_eq!(content(&fs, fh, 1 << 20), want);

        fs.release(fh).unwrap();
        assert_eq!(fs.drain(Duration::from_secs(30)), Drained::Empty);
        let home = std::fs::read(tmp.path().join("home/dir/f")).unwrap();
        assert!(home == want, "home's file differs from the cache's");
    }
}
