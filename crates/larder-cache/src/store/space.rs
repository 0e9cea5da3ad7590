//! Room on the cache disk. `--cache-size` bounds the bytes of cached data, but the disk holds more than
//! that (the index, its log, conflict copies, and every small file takes a whole page of the file system),
//! and it may be smaller than the limit, or shared with others. So data stops short of a **headroom** of
//! free space kept for the index: it must always be able to commit, or (redb latching a failed write) the
//! whole mount would stop. A fill that would eat into it first evicts clean blocks and, if that frees
//! nothing, is not kept (the reader still gets its bytes); a write that would is refused with `ENOSPC`
//! after the core has pushed and evicted what it could (`Fs::make_room`).
//!
//! The free space is asked of the file system (`statvfs`) at most every [`LOOK_EVERY`] while there is
//! plenty of it, and at every check once it is within twice the headroom.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// Least and most of the headroom; between them, a sixteenth of the cache's file system.
const HEADROOM_MIN: u64 = 4 << 20;
const HEADROOM_MAX: u64 = 256 << 20;
/// How long a look at the free space is trusted while it is more than twice the headroom.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// The free space of one file system, as last looked at.
pub(super) struct Space {
    dir: CString,
    headroom: u64,
    /// When the free space was last asked, and what it was, less the bytes written into it since.
    last: Mutex<(Instant, u64)>,
}

/// `(total, free)` bytes of the file system holding `dir` (free to an unprivileged user: root's reserve is
/// not the cache's).
fn statvfs(dir: &CString) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid NUL-terminated path and a buffer of the right type for statvfs to fill.
    let r = unsafe { libc::statvfs(dir.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    let unit = st.f_frsize;
    Some((st.f_blocks * unit, st.f_bavail * unit))
}

impl Space {
    pub(super) fn new(dir: &Path) -> Space {
        let dir = CString::new(dir.as_os_str().as_bytes()).unwrap_or_default();
        let (total, free) = statvfs(&dir).unwrap_or((u64::MAX, u64::MAX));
        Space {
            dir,
            headroom: (total / 16).clamp(HEADROOM_MIN, HEADROOM_MAX),
            last: Mutex::new((Instant::now(), free)),
        }
    }

    /// The free space kept for the index.
    pub(super) fn headroom(&self) -> u64 {
        self.headroom
    }

    /// Whether `bytes` more of cached data leave the headroom free; with `spend`, a yes counts them as
    /// spent until the next look.
    pub(super) fn room_for(&self, bytes: u64, spend: bool) -> bool {
        let mut last = lock(&self.last);
        let (at, free) = *last;
        let plenty = free >= 2 * self.headroom + bytes;
        let free = if plenty && at.elapsed() < LOOK_EVERY {
            free
        } else {
            let now = statvfs(&self.dir).map_or(u64::MAX, |(_, f)| f);
            *last = (Instant::now(), now);
            now
        };
        if free >= self.headroom + bytes {
            if spend {
                last.1 = free - bytes;
            }
            true
        } else {
            false
        }
    }
}

impl Store {
    /// Whether `bytes` more of cached data fit on the cache disk, above the headroom kept free for the
    /// index; if not, clean blocks are evicted (in the policy's order, limit or no limit) until they do or
    /// nothing more can go. Called with no shard lock held.
    pub fn room_on_disk(&self, bytes: u64) -> bool {
        if self.space.room_for(bytes, true) {
            return true;
        }
        loop {
            let evicted = self.evictions.load(Ordering::Relaxed);
            // In batches, so that the buffered hits of the shards are passed on between them.
            self.evict_while(|s| !s.space.room_for(bytes, false), 64, false);
            if self.space.room_for(bytes, true) {
                return true;
            }
            if self.evictions.load(Ordering::Relaxed) == evicted {
                return false;
            }
        }
    }

    /// The free space this store keeps on the cache disk for its index.
    pub fn disk_headroom(&self) -> u64 {
        self.space.headroom()
    }
}
