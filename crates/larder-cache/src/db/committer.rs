//! The committer: one thread applying what is submitted to the index, in order, in batches (group
//! commit), and making it durable as the index's [`Durability`] says.
//!
//! **A write of the index that fails** (the cache disk full, an I/O error) latches redb: every later call
//! fails until the database is opened again. So a failed commit keeps its batch, tells those waiting for
//! durability that it failed, and reopens the database: redb goes back to its last durable commit, and the
//! committer applies again what it applied since without making it durable, then the batch. Until that
//! works (it is tried again after a second, then less and less often, up to [`REOPEN_MAX`]), submissions
//! gather in memory in order, and reads of the index do not wait for them (they read what the index
//! holds, or fail while it is reopened). Nothing submitted is dropped: the namespace in memory, and the
//! log where it could be written, hold it meanwhile.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

use redb::Database;

use super::*;

/// Longest wait between two tries at reopening an index that could not be written.
const REOPEN_MAX: Duration = Duration::from_secs(10);

pub(super) fn apply(db: &Database, batch: &[Mutation], durability: Durability) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    let level = match durability {
        Durability::Power => redb::Durability::Immediate,
        Durability::Process => redb::Durability::None,
    };
    tx.set_durability(level)
        .map_err(|e| redb::Error::from(redb::StorageError::Corrupted(e.to_string())))?;
    {
        let mut meta = tx.open_table(META)?;
        let mut inodes = tx.open_table(INODES)?;
        let mut dentries = tx.open_table(DENTRIES)?;
        let mut blocks = tx.open_table(BLOCKS)?;
        let mut journal = tx.open_table(JOURNAL)?;
        let mut objects = tx.open_table(OBJECTS)?;
        let mut listings = tx.open_table(LISTINGS)?;
        for m in batch {
            match m {
                Mutation::PutMeta(k, v) => {
                    meta.insert(*k, *v)?;
                }
                Mutation::PutInode(ino, rec) => {
                    inodes.insert(*ino, rec.as_slice())?;
                }
                Mutation::DelInode(ino) => {
                    inodes.remove(*ino)?;
                }
                Mutation::PutDentry(parent, name, ino) => {
                    dentries.insert((*parent, name.as_slice()), *ino)?;
                }
                Mutation::DelDentry(parent, name) => {
                    dentries.remove((*parent, name.as_slice()))?;
                }
                Mutation::PutBlock {
                    object,
                    index,
                    len,
                    crc,
                } => {
                    blocks.insert((*object, *index), (*len, *crc))?;
                }
                Mutation::DelBlock { object, index } => {
                    blocks.remove((*object, *index))?;
                }
                Mutation::DelObject(object) => {
                    blocks.retain_in((*object, 0u32)..=(*object, u32::MAX), |_, _| false)?;
                    objects.remove(*object)?;
                }
                Mutation::PutObject {
                    object,
                    flags,
                    len,
                    crc,
                } => {
                    objects.insert(*object, (*flags, *len, *crc))?;
                }
                Mutation::DelObjectMeta(object) => {
                    objects.remove(*object)?;
                }
                Mutation::PutOp(seq, rec) => {
                    journal.insert(*seq, rec.as_slice())?;
                }
                Mutation::DelOp(seq) => {
                    journal.remove(*seq)?;
                }
                Mutation::PutListing(dir, at) => {
                    listings.insert(*dir, *at)?;
                }
                Mutation::ClearListings => {
                    listings.retain(|_, _| false)?;
                }
            }
        }
    }
    tx.commit()?;
    Ok(())
}

/// Take `msg` into the batch or the waiters; the number of submissions it was (0 or 1).
fn take(msg: Msg, batch: &mut Vec<Mutation>, waiters: &mut Vec<SyncSender<Result<(), String>>>) -> u64 {
    match msg {
        Msg::Apply(m) => {
            batch.extend(m);
            1
        }
        Msg::Sync(w) => {
            waiters.push(w);
            0
        }
    }
}

pub(super) fn committer(
    db: Arc<Database>,
    shared: Arc<Shared>,
    rx: Receiver<Msg>,
    durability: Durability,
    path: &Path,
) {
    let mut db = Some(db);
    let mut batch = Vec::new();
    let mut waiters = Vec::new();
    // Applied without an fsync since the last durable commit (the log holds them), and since when.
    let mut undurable: Option<Instant> = None;
    // The same changes, kept while they are not durable: a reopened index has lost them.
    let mut since_durable: Vec<Mutation> = Vec::new();
    // Submissions taken into `batch` and not applied yet (a commit failed).
    let mut pending = 0u64;
    // A commit failed: the database is reopened before the next try, no sooner than the instant given.
    let mut failing: Option<(Instant, Duration)> = None;
    let _ = shared.committer.set(std::thread::current());
    loop {
        let due = [
            undurable.map(|since| since + Db::GROUP_COMMIT),
            failing.map(|(at, _)| at),
        ]
        .into_iter()
        .flatten()
        .min();
        let first = match due {
            None => match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => break,
            },
            Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
        };
        // At process durability the log holds a change already: applying it may wait a moment, so that a
        // burst of changes (an untar, a clone) is one commit of the index, not one each (the index's CPU
        // and the wake-ups of its thread cost a burst of small changes more than their own requests).
        // Senders do not wake the thread meanwhile; a read or a sync does (`Shared::wake_committer`).
        if durability == Durability::Process
            && failing.is_none()
            && matches!(first, Some(Msg::Apply(_)))
            && !shared.hurry.swap(false, Ordering::SeqCst)
        {
            std::thread::park_timeout(BATCH_WINDOW);
        }
        shared.hurry.store(false, Ordering::SeqCst);
        let mut next = first;
        while let Some(msg) = next.take() {
            pending += take(msg, &mut batch, &mut waiters);
            if batch.len() < MAX_BATCH || failing.is_some() {
                next = rx.try_recv().ok();
            }
        }
        if let Some((at, wait)) = failing {
            if Instant::now() < at {
                // Still failing: those waiting for durability are told at once.
                for w in waiters.drain(..) {
                    let _ = w.send(Err("the cache index cannot be written now".into()));
                }
                continue;
            }
            match reopen(&shared, db.take(), path) {
                Ok(fresh) => db = Some(fresh),
                Err((old, e)) => {
                    db = old;
                    tracing::warn!(error = %e, "reopening the cache index failed; tried again later");
                    failing = Some((Instant::now() + wait, (wait * 2).min(REOPEN_MAX)));
                    shared.failing.store(true, Ordering::SeqCst);
                    for w in waiters.drain(..) {
                        let _ = w.send(Err(e.clone()));
                    }
                    continue;
                }
            }
        }
        let Some(current) = db.as_ref() else { break };
        // Durable now: every commit at power durability; at process durability a group commit, when a
        // sync waits or the oldest change applied without an fsync is due; and after a reopen, which takes
        // in again what the reopened index lost.
        let reopened = failing.is_some();
        let durable = durability == Durability::Power
            || reopened
            || !waiters.is_empty()
            || undurable.is_some_and(|since| since.elapsed() >= Db::GROUP_COMMIT);
        // A group commit takes in what the log holds so far, then the log goes on in its other file; the
        // one it leaves is emptied once the commit is durable.
        let left = (durable && durability == Durability::Process)
            .then(|| {
                let mut guard = shared.inlet.lock().unwrap_or_else(|p| p.into_inner());
                while let Ok(msg) = rx.try_recv() {
                    pending += take(msg, &mut batch, &mut waiters);
                }
                guard
                    .as_mut()
                    .and_then(|i| i.wal.as_mut())
                    .map(|w| w.rotate().map_err(|e| e.to_string()))
            })
            .flatten();
        let result = if batch.is_empty() && !reopened && !(durable && undurable.is_some()) {
            Ok(())
        } else {
            let level = if durable {
                Durability::Power
            } else {
                Durability::Process
            };
            if reopened {
                // What the reopened index lost, then the batch: each mutation puts or removes a key, and
                // the last one for a key wins, so applying again what it kept changes nothing.
                let mut all = std::mem::take(&mut since_durable);
                all.append(&mut batch);
                batch = all;
            }
            apply(current, &batch, level).map_err(|e| e.to_string())
        };
        if let Err(e) = &result {
            tracing::error!(
                error = %e,
                mutations = batch.len(),
                "cache index commit failed; the changes are kept and applied again once the index is reopened"
            );
            // The first failure is followed by a reopening at once; a failure after one waits (a second,
            // doubling up to `REOPEN_MAX`). (After a reopening, the batch holds what the index lost too.)
            let wait = failing.map_or(Duration::from_secs(1), |(_, w)| w);
            let at = Instant::now() + if reopened { wait } else { Duration::ZERO };
            failing = Some((at, if reopened { (wait * 2).min(REOPEN_MAX) } else { wait }));
            shared.failing.store(true, Ordering::SeqCst);
            for w in waiters.drain(..) {
                let _ = w.send(Err(e.clone()));
            }
            continue;
        }
        if reopened {
            tracing::info!("the cache index is written again; changes made meanwhile are in it");
            failing = None;
            shared.failing.store(false, Ordering::SeqCst);
            if let Some(db) = &db {
                *shared.database.lock().unwrap_or_else(|p| p.into_inner()) = Some(db.clone());
            }
        }
        if durable {
            undurable = None;
            since_durable.clear();
            shared.wal_failed.store(false, Ordering::SeqCst);
            match left {
                Some(Ok(which)) => {
                    let guard = shared.inlet.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(wal) = guard.as_ref().and_then(|i| i.wal.as_ref())
                        && let Err(e) = wal.forget(which)
                    {
                        tracing::warn!(error = %e, "emptying the index's log failed");
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "starting the index's log anew failed");
                    shared.wal_failed.store(true, Ordering::SeqCst);
                }
                None => {}
            }
        } else if !batch.is_empty() {
            // Logged already: made durable by a later group commit.
            undurable.get_or_insert_with(Instant::now);
            since_durable.append(&mut batch);
        }
        batch.clear();
        if pending > 0 {
            *shared.applied.lock().unwrap_or_else(|p| p.into_inner()) += pending;
            pending = 0;
            shared.caught_up.notify_all();
        }
        for w in waiters.drain(..) {
            let _ = w.send(Ok(()));
        }
    }
}

/// Let go of `old` (the database a failed write latched: every later call of it fails) and open the index
/// at `path` again: redb goes back to its last durable commit. Readers under way end first (bounded); new
/// ones fail meanwhile. The old database comes back with the error if it cannot be let go of.
fn reopen(
    shared: &Shared,
    old: Option<Arc<Database>>,
    path: &Path,
) -> Result<Arc<Database>, (Option<Arc<Database>>, String)> {
    shared.database.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(mut old) = old {
        let deadline = Instant::now() + CLOSE_WAIT;
        loop {
            match Arc::try_unwrap(old) {
                Ok(db) => {
                    drop(db);
                    break;
                }
                Err(shared_db) if Instant::now() > deadline => {
                    return Err((Some(shared_db), "a read of the index outlasted its reopening".into()));
                }
                Err(shared_db) => {
                    old = shared_db;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    open_database(path).map(Arc::new).map_err(|e| (None, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A tmpfs of `mib` MiB at a new temporary directory, unmounted when dropped.
    struct Tmpfs(tempfile::TempDir);

    impl Tmpfs {
        fn new(mib: u64) -> Tmpfs {
            let dir = tempfile::tempdir().unwrap();
            let status = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "mount -t tmpfs (the index's tests run as root)");
            Tmpfs(dir)
        }

        fn path(&self) -> PathBuf {
            self.0.path().to_path_buf()
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0.path())
                .status();
        }
    }

    /// Take all the room left on the file system of `dir` with one file; returns it.
    fn fill(dir: &Path) -> PathBuf {
        use std::io::Write;
        let path = dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![1u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        path
    }

    #[test]
    fn a_full_disk_fails_commits_without_losing_them_and_the_index_is_written_once_there_is_room() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        for durability in [Durability::Process, Durability::Power] {
            let fs = Tmpfs::new(8);
            let index = fs.path().join("index.redb");
            let db = Db::open_with(&index, durability).unwrap();
            let record = |ino: u64| Mutation::PutInode(ino, vec![ino as u8; 2000]);
            for ino in 0..100 {
                db.submit(vec![record(ino)]);
            }
            db.sync().unwrap();
            let filler = fill(&fs.path());
            // The disk is full: commits fail, and a sync says so, but nothing submitted is lost.
            for ino in 100..2000 {
                db.submit(vec![record(ino)]);
            }
            assert!(
                db.sync().is_err(),
                "{durability:?}: a commit to a full disk was said to be durable"
            );
            std::fs::remove_file(filler).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while db.sync().is_err() {
                assert!(
                    Instant::now() < deadline,
                    "{durability:?}: the index was never written again"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            for ino in (0..2000).step_by(97) {
                assert_eq!(
                    db.inode(ino).unwrap(),
                    Some(vec![ino as u8; 2000]),
                    "{durability:?}: inode {ino}"
                );
            }
            db.close().unwrap();
            let db = Db::open(&index).unwrap();
            for ino in 0..2000 {
                assert!(
                    db.inode(ino).unwrap().is_some(),
                    "{durability:?}: inode {ino} lost at the reopen"
                );
            }
            db.close().unwrap();
        }
    }
}
