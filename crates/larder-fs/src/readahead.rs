//! Readahead: blocks ahead of a sequential reader are fetched by a few background workers, through the
//! same single-flight fetch as demand reads, so a reader that catches up waits for the fetch under way.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use larder_home::Version;

use crate::namespace::{Core, lock};

const QUEUE: usize = 256;

pub(crate) struct Job {
    pub object: u64,
    pub index: u32,
    pub path: PathBuf,
    pub version: Version,
    /// Where home's part of the content ends, and the object's change epoch when that was so.
    pub home_end: u64,
    pub epoch: u64,
}

pub(crate) struct Readahead {
    core: Arc<Core>,
    sender: Mutex<SyncSender<Job>>,
    submitted: AtomicU64,
}

impl Readahead {
    pub fn new(core: Arc<Core>, threads: usize) -> Readahead {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let (rx, core) = (rx.clone(), core.clone());
            let _ = std::thread::Builder::new()
                .name(format!("larder-ra-{i}"))
                .spawn(move || {
                    loop {
                        let job = lock(&rx).recv();
                        let Ok(job) = job else { return };
                        if let Err(e) =
                            core.fetch(job.object, job.index, &job.path, &job.version, job.home_end, job.epoch)
                        {
                            tracing::debug!(error = %e, path = %job.path.display(), "readahead fetch failed");
                        }
                    }
                });
        }
        Readahead {
            core,
            sender: Mutex::new(tx),
            submitted: AtomicU64::new(0),
        }
    }

    /// Queue a block unless it is cached, being fetched, or the queue is full.
    pub fn submit(&self, job: Job) {
        let key = (job.object, job.index);
        if self.core.store.contains(key)
            || self
                .core
                .flights
                .in_flight(&crate::data::flight_key(job.object, job.index, &job.version))
        {
            return;
        }
        match lock(&self.sender).try_send(job) {
            Ok(()) => {
                self.submitted.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    }

    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Relaxed)
    }
}
