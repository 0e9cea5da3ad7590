//! Prefetch: a reader's window ([`window`], [`due`]), the ingest queue, and runs of blocks. Blocks ahead
//! of a reader are fetched by `--ingest-streams` background workers, through the same
//! single-flight fetch as demand reads, so a reader that catches up waits for the fetch under way.
//!
//! A job is a range of blocks of one file. A worker takes the first blocks of the job at the head of the
//! queue and leaves the rest there, so every stream works on the same file, in order, and a large file
//! comes in over as many concurrent home requests as there are streams (Panache's parallel ingest).
//!
//! **Coalescing.** A worker takes a run of adjacent blocks, its share of what the job has left (up to
//! `MAX_RUN` bytes), and the missing ones among them that are adjacent walk the tiers as one run: each is
//! asked of the tiers before home (peers and a bank keep units, not runs), and what none has comes from
//! home in one ranged request. Readers missing a block of a run under way wait for it, as for any walk
//! of its unit, instead of asking home again (one coalescer: the walk's single flight, by key).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::FileVersion;
use crate::fetch::Core;
use crate::key::Part;
use larder_util::contention::lock;

/// Most jobs waiting; a submission past it is dropped (readahead is a hint).
const QUEUE: usize = 1024;

/// Largest run of adjacent blocks fetched from home in one request.
pub(crate) const MAX_RUN: u64 = 16 << 20;

/// Smallest run a stream takes (when the job has that much left): a reader's window grows from a block
/// to the whole of `--readahead` within its first few reads, queuing jobs of a few blocks each on the way;
/// shared among the streams a block at a time, each block was a home request of its own (a cold
/// sequential read of an S3 object was a GET per 1 MiB block). Runs of 8 MiB are the ranged GETs that
/// s3fs and rclone make (16 MiB there).
pub(crate) const MIN_RUN: u64 = 8 << 20;

/// The readahead window of a reader reading at `offset`, whose window was `window` and whose last read
/// ended at `next_offset`: a reader going on where it left off, or a little further, doubles it from a block up to
/// `max` (the pages between were read by the kernel from its page cache: another reader of the file
/// brought them in, which must not cost this reader its window); a read a little behind keeps it (the
/// kernel's reads of one reader arrive out of order); any other read closes it. With
/// `Prefetch::WholeFile`, the rest of the file.
pub(crate) fn window(
    prefetch: crate::Prefetch,
    max: u64,
    bs: u64,
    (window, next_offset): (u64, u64),
    offset: u64,
) -> u64 {
    match prefetch {
        crate::Prefetch::WholeFile => u64::MAX,
        crate::Prefetch::Sequential if offset >= next_offset && offset - next_offset <= max => {
            if window == 0 {
                bs
            } else {
                (window * 2).min(max)
            }
        }
        // A little behind where the reader got (up to 4 blocks): the kernel's own readahead sends several
        // reads of a sequential reader at once, and they arrive in any order. The window stays.
        crate::Prefetch::Sequential
            if window > 0 && offset < next_offset && next_offset - offset <= (4 * bs).min(window) =>
        {
            window
        }
        crate::Prefetch::Sequential => 0,
    }
}

/// The blocks a read ending at `end` of a file of `size` bytes should queue, with its handle's `window`
/// and the end of what the handle queued already (`queued_to`): what the window adds past that (a reader
/// that went back before them is served by its own reads and the blocks still queued). In steps of half
/// the window (at least a block), or up to the end: the reader has half a window queued ahead of it when
/// the next half is asked for, and each step is large enough that the streams sharing it each take a
/// large run, one home request (a window moving on by one read's worth each time queued a job of a block
/// or two, each its own request: a cold sequential read of an object was a GET per block). `None` if
/// nothing is due.
pub(crate) fn due(window: u64, queued_to: u64, end: u64, size: u64, bs: u64) -> Option<(u64, u64)> {
    let first = queued_to.max(end).div_ceil(bs);
    let last = end.saturating_add(window).min(size).div_ceil(bs);
    let step = (window / 2).max(bs);
    let worth = last.saturating_sub(first) * bs >= step || last * bs >= size;
    (window > 0 && last > first && worth).then_some((first, last))
}

/// Blocks of one version of a file to bring in.
#[derive(Clone)]
pub(crate) struct Job {
    /// The blocks to bring in, in order.
    pub blocks: Range<u32>,
    pub file: FileVersion,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Per object, the end of the blocks already queued: a reader's growing window queues only what is
    /// new to it.
    queued_to: HashMap<u64, u32>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

pub(crate) struct Readahead {
    core: Arc<Core>,
    shared: Arc<Shared>,
    submitted: AtomicU64,
    share: Share,
}

impl Readahead {
    pub fn new(core: Arc<Core>, streams: usize) -> Readahead {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        });
        let streams = streams.max(1);
        let share = Share {
            streams: streams as u32,
            min_run: (MIN_RUN / core.store.block_size()).max(1) as u32,
            max_run: (MAX_RUN / core.store.block_size()).max(1) as u32,
        };
        for i in 0..streams {
            let (shared, core) = (shared.clone(), core.clone());
            let _ = std::thread::Builder::new()
                .name(format!("larder-ingest-{i}"))
                .spawn(move || {
                    while let Some((job, run)) = next(&shared, share) {
                        if let Err(e) = ingest(&core, &job, run) {
                            tracing::debug!(error = %e, path = %job.file.path.display(), "readahead fetch failed");
                            // The rest of this file's range would most likely fail the same way.
                            drop_object(&shared, job.file.object);
                        }
                    }
                });
        }
        Readahead {
            core,
            shared,
            submitted: AtomicU64::new(0),
            share,
        }
    }

    /// Queue the blocks of `job` that are not queued already. Cached blocks and blocks being fetched are
    /// skipped when their turn comes.
    pub fn submit(&self, mut job: Job) {
        let mut q = lock(&self.shared.queue);
        if q.closed {
            return;
        }
        let queued_to = q.queued_to.get(&job.file.object).copied().unwrap_or(0);
        if job.blocks.end <= queued_to {
            return;
        }
        job.blocks.start = job.blocks.start.max(queued_to);
        while let Some(b) = job.blocks.clone().next() {
            if !self.core.store.contains((job.file.object, b)) {
                break;
            }
            job.blocks.start = b + 1;
        }
        if job.blocks.is_empty() || q.jobs.len() >= QUEUE {
            return;
        }
        tracing::debug!(object = job.file.object, blocks = ?job.blocks, "readahead queued");
        self.submitted.fetch_add(job.blocks.len() as u64, Ordering::Relaxed);
        q.queued_to.insert(job.file.object, job.blocks.end.max(queued_to));
        q.jobs.push_back(job);
        drop(q);
        self.shared.ready.notify_all();
    }

    /// A reader missing block `index` of `object` that a queued job starts with, and no stream has taken
    /// yet, takes the job's next run and brings it in itself (`ingest`), as a stream would
    /// have: a reader that catches up with busy (or not yet scheduled) streams then asks home for the run
    /// in one request, not for its blocks one by one. Nothing if no queued job starts there. A failure is
    /// left to the reader's own fetch of its block to answer.
    pub fn take_and_ingest(&self, object: u64, index: u32) {
        let (job, run) = {
            let mut q = lock(&self.shared.queue);
            let Some(at) = q
                .jobs
                .iter()
                .position(|j| j.file.object == object && j.blocks.start == index && !j.blocks.is_empty())
            else {
                return;
            };
            q.take_run(at, self.share)
        };
        if let Err(e) = ingest(&self.core, &job, run) {
            tracing::debug!(error = %e, path = %job.file.path.display(), "readahead fetch failed");
        }
    }

    /// Blocks queued so far.
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Relaxed)
    }

    /// Let the workers go once the queue is empty.
    pub fn close(&self) {
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        self.close();
    }
}

/// Sizes of the runs taken from jobs: the streams sharing a job, the least and most blocks of a run.
#[derive(Clone, Copy)]
struct Share {
    streams: u32,
    min_run: u32,
    max_run: u32,
}

impl Queue {
    /// The first blocks of job `at`: a stream's share of what the job has left (at least `min_run`
    /// blocks or what is left, at most `max_run`). The job leaves the queue with its last run.
    fn take_run(&mut self, at: usize, share: Share) -> (Job, Range<u32>) {
        let job = &mut self.jobs[at];
        let left = job.blocks.len() as u32;
        let take = left
            .div_ceil(share.streams)
            .max(share.min_run)
            .min(left)
            .clamp(1, share.max_run);
        let run = job.blocks.start..job.blocks.start + take;
        job.blocks.start = run.end;
        if !job.blocks.is_empty() {
            return (job.clone(), run);
        }
        let job = self.jobs.remove(at).expect("indexed above");
        if self.queued_to.get(&job.file.object) == Some(&job.blocks.end) {
            self.queued_to.remove(&job.file.object);
        }
        (job, run)
    }
}

/// The next blocks to bring in: the first run of the job at the head of the queue.
fn next(shared: &Shared, share: Share) -> Option<(Job, Range<u32>)> {
    let mut q = lock(&shared.queue);
    loop {
        if !q.jobs.is_empty() {
            return Some(q.take_run(0, share));
        }
        if q.closed {
            return None;
        }
        q = shared.ready.wait(q).unwrap_or_else(|p| p.into_inner());
    }
}

/// Bring in the blocks `run` of `job`: those present or being fetched are skipped; adjacent missing ones
/// come through the tiers as a run, what no nearer tier has in one request to home (unless the file is a
/// small one, whole in one unit).
fn ingest(core: &Core, job: &Job, run: Range<u32>) -> Result<(), larder_home::HomeError> {
    tracing::debug!(object = job.file.object, run = ?run, "readahead run");
    let file = &job.file;
    let missing = |index: u32| core.absent(file, index);
    let per_block = matches!(core.unit_of(file, run.start).0.part, Part::Whole { .. });
    let mut index = run.start;
    while index < run.end {
        if !missing(index) {
            index += 1;
            continue;
        }
        let mut end = index + 1;
        while !per_block && end < run.end && missing(end) {
            end += 1;
        }
        if end - index == 1 {
            core.fetch(file, index)?;
            index = end;
        } else {
            // It may stop short, at a block a reader or another run fetches meanwhile (see
            // `Tiers::fetch_run`): the blocks after that one are looked at again.
            let reached = core.fetch_run(file, index..end)?;
            index = reached.max(index + 1);
        }
    }
    Ok(())
}

/// Forget the queued blocks of `object`.
fn drop_object(shared: &Shared, object: u64) {
    let mut q = lock(&shared.queue);
    q.jobs.retain(|j| j.file.object != object);
    q.queued_to.remove(&object);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Prefetch;

    #[test]
    fn a_sequential_reader_doubles_its_window_and_a_jump_closes_it() {
        let (bs, max) = (4096, 64 << 10);
        let (mut w, mut next) = (0, 0);
        let mut offset = 0;
        let mut windows = Vec::new();
        for _ in 0..6 {
            w = window(Prefetch::Sequential, max, bs, (w, next), offset);
            next = offset + bs;
            offset += bs;
            windows.push(w);
        }
        assert_eq!(windows, [4096, 8192, 16384, 32768, 65536, 65536]);
        // A little further on (the kernel served the pages between): kept, and grown.
        w = window(Prefetch::Sequential, max, bs, (w, next), offset + 2 * bs);
        assert_eq!(w, max);
        // A read a little behind (the kernel's reads of one reader arriving out of order): kept, not grown.
        assert_eq!(window(Prefetch::Sequential, max, bs, (w, next), next - 3 * bs), w);
        // Back to the start: closed.
        assert_eq!(window(Prefetch::Sequential, max, bs, (w, next), 0), 0);
        assert_eq!(window(Prefetch::WholeFile, max, bs, (w, next), 0), u64::MAX);
    }

    #[test]
    fn the_window_is_queued_in_steps_not_a_block_at_a_time() {
        let bs = 4096;
        // Nothing without a window.
        assert_eq!(due(0, 0, bs, 1 << 30, bs), None);
        // A large window queues from the end of the read to the window's end.
        assert_eq!(due(8 << 20, 0, bs, 1 << 30, bs), Some((1, ((8 << 20) + bs) / bs)));
        // Moving on by one block past what is queued: not worth a job of a block.
        let queued = (8 << 20) + bs;
        assert_eq!(due(8 << 20, queued, 2 * bs, 1 << 30, bs), None);
        // Nor by less than half the window; at half of it, that half is queued.
        assert_eq!(due(8 << 20, queued, 4 << 20, 1 << 30, bs), None);
        assert_eq!(
            due(8 << 20, queued, (4 << 20) + bs, 1 << 30, bs),
            Some((queued / bs, ((12 << 20) + bs) / bs))
        );
        // Up to the end of the file, even a block is worth it.
        assert_eq!(due(8 << 20, 0, bs, 2 * bs, bs), Some((1, 2)));
    }
}
