//! Ingest: blocks ahead of a reader are fetched by `--ingest-streams` background workers, through the same
//! single-flight fetch as demand reads, so a reader that catches up waits for the fetch under way.
//!
//! A job is a range of blocks of one file. A worker takes the first blocks of the job at the head of the
//! queue and leaves the rest there, so every stream works on the same file, in order, and a large file
//! comes in over as many concurrent home requests as there are streams (Panache's parallel ingest).
//!
//! **Coalescing.** A worker takes a run of adjacent blocks, its share of what the job has left (up to
//! `MAX_RUN` bytes), and the missing ones among them that are adjacent come from home in one request when
//! home is the next tier after the store (with peers or a bank between, each block walks the tiers on its
//! own: they keep units, not runs). Readers missing a block of a run under way wait for the run
//! ([`Runs`]) instead of asking home again.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::FileVersion;
use crate::key::Part;
use crate::namespace::{Core, lock};

/// Most jobs waiting; a submission past it is dropped (readahead is a hint).
const QUEUE: usize = 1024;

/// Largest run of adjacent blocks fetched from home in one request.
pub(crate) const MAX_RUN: u64 = 16 << 20;

/// Smallest run a stream takes (when the job has that much left), and the step a reader's window is
/// queued in: with small blocks, a share of a job per stream would otherwise be a block or two, and each
/// run is a home round trip.
pub(crate) const MIN_JOB: u64 = 1 << 20;

/// Longest a reader waits for a run covering its block before asking for the block itself.
const RUN_WAIT: Duration = Duration::from_secs(60);

/// Runs of blocks being fetched from home in one request, so that a reader missing one of their blocks
/// waits for it rather than fetching it again; and the blocks readers are fetching one by one, so that a
/// run stops short of them rather than fetching them a second time. Both are decided under one lock: a
/// reader either claims its block before a run covering it is registered (the run then stops short of
/// it), or finds the run registered and waits for it.
#[derive(Default)]
pub(crate) struct Runs {
    state: Mutex<RunsState>,
    done: Condvar,
}

#[derive(Default)]
struct RunsState {
    under_way: Vec<(u64, Range<u32>)>,
    /// Blocks readers are fetching, with how many readers fetch each.
    claimed: HashMap<(u64, u32), u32>,
}

impl RunsState {
    fn covered(&self, object: u64, index: u32) -> bool {
        self.under_way.iter().any(|(o, b)| *o == object && b.contains(&index))
    }
}

/// A reader's claim on a block it is fetching itself ([`Runs::claim`]); dropped when its fetch is over.
pub(crate) struct Claim<'a> {
    runs: &'a Runs,
    block: (u64, u32),
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.runs.state);
        if let Some(n) = state.claimed.get_mut(&self.block) {
            *n -= 1;
            if *n == 0 {
                state.claimed.remove(&self.block);
            }
        }
    }
}

impl Runs {
    /// Register a run of `blocks` of `object`, cut short at the first block that is not `missing`, that
    /// a reader is fetching or that another run covers. Returns the blocks registered (perhaps none);
    /// [`Runs::end_run`] takes them back.
    pub(crate) fn begin_run(&self, object: u64, blocks: Range<u32>, missing: impl Fn(u32) -> bool) -> Range<u32> {
        let mut state = lock(&self.state);
        let mut end = blocks.start;
        while end < blocks.end
            && !state.claimed.contains_key(&(object, end))
            && !state.covered(object, end)
            && missing(end)
        {
            end += 1;
        }
        let run = blocks.start..end;
        if !run.is_empty() {
            state.under_way.push((object, run.clone()));
        }
        run
    }

    pub(crate) fn end_run(&self, object: u64, blocks: &Range<u32>) {
        let mut state = lock(&self.state);
        if let Some(i) = state.under_way.iter().position(|(o, b)| *o == object && b == blocks) {
            state.under_way.swap_remove(i);
        }
        drop(state);
        self.done.notify_all();
    }

    /// Whether a reader is fetching block `index` of `object`, or a run under way covers it.
    pub(crate) fn busy(&self, object: u64, index: u32) -> bool {
        let state = lock(&self.state);
        state.claimed.contains_key(&(object, index)) || state.covered(object, index)
    }

    /// Wait (bounded) until no run covering block `index` of `object` is under way, then claim the block
    /// for the caller's own fetch of it: no run registered while the claim is held includes it.
    pub(crate) fn claim(&self, object: u64, index: u32) -> Claim<'_> {
        let deadline = Instant::now() + RUN_WAIT;
        let mut state = lock(&self.state);
        while state.covered(object, index) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self.done.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        *state.claimed.entry((object, index)).or_insert(0) += 1;
        Claim {
            runs: self,
            block: (object, index),
        }
    }
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
            min_run: (MIN_JOB / core.store.block_size()).max(1) as u32,
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
/// come in one home request where home is the next tier (and the file is not a small one, whole in one
/// unit), else one by one through the tiers.
fn ingest(core: &Core, job: &Job, run: Range<u32>) -> Result<(), larder_home::HomeError> {
    let file = &job.file;
    let missing = |index: u32| core.absent(file, index) && !core.runs.busy(file.object, index);
    let per_block = !core.tiers.home_next() || matches!(core.unit_of(file, run.start).0.part, Part::Whole { .. });
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
            // `Core::fetch_run`): the blocks after that one are looked at again.
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

    #[test]
    fn a_run_stops_short_of_a_block_a_reader_claimed_and_of_another_run() {
        let runs = Runs::default();
        let claim = runs.claim(1, 5);
        assert!(runs.busy(1, 5) && !runs.busy(1, 4));
        assert_eq!(runs.begin_run(1, 2..10, |_| true), 2..5);
        assert!(runs.busy(1, 4), "the run covers it");
        assert!(runs.begin_run(1, 5..10, |_| true).is_empty(), "block 5 is the reader's");
        assert_eq!(
            runs.begin_run(2, 5..7, |_| true),
            5..7,
            "another object's block 5 is free"
        );
        drop(claim);
        assert!(
            runs.begin_run(1, 4..8, |_| true).is_empty(),
            "block 4 is the first run's"
        );
        assert_eq!(runs.begin_run(1, 5..8, |i| i != 7), 5..7);
        runs.end_run(1, &(2..5));
        runs.end_run(1, &(5..7));
        runs.end_run(2, &(5..7));
        assert_eq!(
            runs.begin_run(1, 0..8, |_| true),
            0..8,
            "every run ended, every claim dropped"
        );
    }

    #[test]
    fn a_reader_missing_a_block_of_a_run_waits_for_the_run_to_end() {
        let runs = Arc::new(Runs::default());
        assert_eq!(runs.begin_run(1, 0..4, |_| true), 0..4);
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (runs, ended) = (runs.clone(), ended.clone());
            std::thread::spawn(move || {
                let _claim = runs.claim(1, 2);
                ended.load(Ordering::SeqCst)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        ended.store(true, Ordering::SeqCst);
        runs.end_run(1, &(0..4));
        assert!(
            reader.join().unwrap(),
            "the reader claimed block 2 while the run covering it was under way"
        );
    }
}
