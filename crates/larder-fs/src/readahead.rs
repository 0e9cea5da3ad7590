//! Ingest: blocks ahead of a reader are fetched by `--ingest-streams` background workers, through the same
//! single-flight fetch as demand reads, so a reader that catches up waits for the fetch under way.
//!
//! A job is a range of blocks of one file. A worker takes the first block of the job at the head of the
//! queue and leaves the rest there, so every stream works on the same file, in order, and a large file
//! comes in over as many concurrent home requests as there are streams (Panache's parallel ingest).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use larder_home::Version;

use crate::namespace::{Core, lock};

/// Most jobs waiting; a submission past it is dropped (readahead is a hint).
const QUEUE: usize = 1024;

#[derive(Clone)]
pub(crate) struct Job {
    pub object: u64,
    /// The blocks to bring in, in order.
    pub blocks: Range<u32>,
    pub path: PathBuf,
    pub version: Version,
    /// Where home's part of the content ends, and the object's change epoch when that was so.
    pub home_end: u64,
    pub epoch: u64,
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
}

impl Readahead {
    pub fn new(core: Arc<Core>, streams: usize) -> Readahead {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        });
        for i in 0..streams.max(1) {
            let (shared, core) = (shared.clone(), core.clone());
            let _ = std::thread::Builder::new()
                .name(format!("larder-ingest-{i}"))
                .spawn(move || {
                    while let Some((job, index)) = next(&shared) {
                        if core.store.contains((job.object, index))
                            || core
                                .tiers
                                .in_flight(&core.unit_of(index, &job.path, &job.version, job.home_end).0.digest())
                        {
                            continue;
                        }
                        if let Err(e) = core.fetch(job.object, index, &job.path, &job.version, job.home_end, job.epoch)
                        {
                            tracing::debug!(error = %e, path = %job.path.display(), "readahead fetch failed");
                            // The rest of this file's range would most likely fail the same way.
                            drop_object(&shared, job.object);
                        }
                    }
                });
        }
        Readahead {
            core,
            shared,
            submitted: AtomicU64::new(0),
        }
    }

    /// Queue the blocks of `job` that are not queued already. Cached blocks and blocks being fetched are
    /// skipped when their turn comes.
    pub fn submit(&self, mut job: Job) {
        let mut q = lock(&self.shared.queue);
        if q.closed {
            return;
        }
        let queued_to = q.queued_to.get(&job.object).copied().unwrap_or(0);
        if job.blocks.end <= queued_to {
            return;
        }
        job.blocks.start = job.blocks.start.max(queued_to);
        while let Some(b) = job.blocks.clone().next() {
            if !self.core.store.contains((job.object, b)) {
                break;
            }
            job.blocks.start = b + 1;
        }
        if job.blocks.is_empty() || q.jobs.len() >= QUEUE {
            return;
        }
        self.submitted.fetch_add(job.blocks.len() as u64, Ordering::Relaxed);
        q.queued_to.insert(job.object, job.blocks.end.max(queued_to));
        q.jobs.push_back(job);
        drop(q);
        self.shared.ready.notify_all();
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

/// The next block to bring in: the first of the job at the head of the queue.
fn next(shared: &Shared) -> Option<(Job, u32)> {
    let mut q = lock(&shared.queue);
    loop {
        if let Some(job) = q.jobs.front_mut() {
            let index = job.blocks.start;
            job.blocks.start += 1;
            let job = if job.blocks.is_empty() {
                let job = q.jobs.pop_front()?;
                if q.queued_to.get(&job.object) == Some(&job.blocks.end) {
                    q.queued_to.remove(&job.object);
                }
                job
            } else {
                job.clone()
            };
            return Some((job, index));
        }
        if q.closed {
            return None;
        }
        q = shared.ready.wait(q).unwrap_or_else(|p| p.into_inner());
    }
}

/// Forget the queued blocks of `object`.
fn drop_object(shared: &Shared, object: u64) {
    let mut q = lock(&shared.queue);
    q.jobs.retain(|j| j.object != object);
    q.queued_to.remove(&object);
}
