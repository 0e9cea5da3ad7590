//! The flusher: threads that take journal ops to home in dependency order, and what happens when home
//! says no (offline: wait; conflict: the mount's policy; refused: retry with backoff, then keep the
//! cache's version as a conflict so the queue moves on).

use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use backon::{BackoffBuilder, ExponentialBuilder};
use larder_cache::Mutation;
use larder_home::{FileKind, HomeAttr, HomeError, Owner, SetAttr, TimeSet, Version};

use crate::changes::Changes;
use crate::data::COMPARE_MAX;
use crate::journal::{Op, OpKind, now_ms};
use crate::namespace::lock;
use crate::pipeline::{Ended, Window};
use crate::{Conflict, ConflictPolicy, Drained, FsError, FsResult, JournalStats, RefusedChange, WriteMode};

/// The version of a file whose local changes were dropped: none home could have, so that the next
/// revalidation takes home's as new.
pub(crate) const DISCARDED: &str = "discarded";

/// Attempts at an op home refuses before its change is set aside as a conflict.
const MAX_ATTEMPTS: u32 = 6;
/// How often an idle pusher looks at the journal: a change made within the sync lag wakes nobody, and
/// waits this long at most past its lag.
const POLL: Duration = Duration::from_millis(100);
/// Wait before the second attempt at an op home refused; each refusal doubles it, up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between attempts at a refused op, before jitter.
const MAX_BACKOFF: Duration = Duration::from_secs(64);

enum Outcome {
    Done,
    /// Home is away: try again when it is back.
    Retry(HomeError),
    /// Home refused: try again later (write-back), or tell the caller (write-through).
    Refused(FsError),
}

fn os(p: &[u8]) -> PathBuf {
    PathBuf::from(std::ffi::OsString::from_vec(p.to_vec()))
}

fn owner_of(uid: Option<u32>, gid: Option<u32>) -> Owner {
    Owner { uid, gid }
}

/// UTC time as `YYYYMMDDTHHMMSSZ` (file names) and RFC 3339 (listings).
fn utc(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (
        format!("{y:04}{m:02}{d:02}T{h:02}{mi:02}{s:02}Z"),
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z"),
    )
}

/// How long an op waits after its `refusals`+1-th failed attempt: [`MIN_BACKOFF`] doubling per refusal up
/// to [`MAX_BACKOFF`], plus up to as much again at random, so that ops refused together (a read-only home
/// refuses every queued op at once) do not all come back in the same instant.
fn refusal_backoff(refusals: u32) -> Duration {
    let steps = ExponentialBuilder::new()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build();
    // Past log2(MAX / MIN) + 1 steps the delay stays at the cap: no need to walk further.
    let capped = refusals.min((MAX_BACKOFF.as_secs() / MIN_BACKOFF.as_secs()).ilog2() + 1);
    steps.into_iter().nth(capped as usize).unwrap_or(MAX_BACKOFF)
}

/// Whether a change refused with `e` stays queued however often it is refused, rather than being set aside
/// after [`MAX_ATTEMPTS`]:
/// - home is full (or over quota): a full disk is temporary, and a change set aside would leave home's
///   version, or what a cut-short push left of it, as the truth; it lands once there is room;
/// - its cache copy is damaged: pushing it would send wrong bytes, and setting it aside would let home's
///   version stand in silence; the user writes the file again or removes it.
fn never_set_aside(e: &FsError) -> bool {
    matches!(
        e,
        FsError::Home(HomeError::NoSpace) | FsError::Cache(larder_cache::CacheError::Damaged { .. })
    )
}

/// How long a pusher outside the window, or past the first [`Window::START`] when idle, waits before it
/// looks again by itself.
const SPARE_WAIT: Duration = Duration::from_secs(1);

/// Largest file whose data push still times home's answers for the window.
const TIMED_MAX: u64 = 256 << 10;

/// How a push that ended as `outcome`, home answering in `took` (`None`: not timed), counts for the window.
fn ended(outcome: &Outcome, took: Option<Duration>) -> Ended {
    match outcome {
        Outcome::Retry(_) | Outcome::Refused(FsError::Home(HomeError::TimedOut(_))) => Ended::Away,
        _ => Ended::Answered(took),
    }
}

/// The conflicts recorded in `dir` by earlier runs.
pub(crate) fn load_conflicts(dir: &Path) -> Vec<Conflict> {
    std::fs::read_to_string(dir.join("conflicts.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

mod conflicts;
mod push;
mod through;

/// Hand the allocator's free memory back to the system.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Changes {
    /// What this mount does now that home went away (`online` false) or came back, for the log. Runs
    /// inside home calls, perhaps under the journal's lock: it never waits for it.
    pub(crate) fn explain_health(&self, online: bool) -> String {
        let queued = self.pipeline.try_journal().map(|j| j.len());
        let count = |f: fn(usize) -> String| queued.map_or_else(String::new, f);
        match (self.cfg.write_mode, online) {
            (WriteMode::WriteBack, false) => format!(
                "cached data and listings are served, uncached reads fail with EIO, and changes are kept in \
                 the journal until home is back{}",
                count(|n| format!(" ({n} queued now)"))
            ),
            (WriteMode::WriteBack, true) => format!("pushing the{} queued changes", count(|n| format!(" {n}"))),
            (WriteMode::WriteThrough, false) => {
                "cached data and listings are served; uncached reads and changes fail with EIO until home is back"
                    .into()
            }
            (_, false) => "cached data and listings are served; uncached reads fail with EIO until home is back".into(),
            (_, true) => "reads and lookups go to home again".into(),
        }
    }

    /// Stop the flusher threads (what is queued stays queued).
    pub(crate) fn stop_flushers(&self) {
        self.data.stop_verifier();
        self.pipeline.stopping.store(true, Ordering::SeqCst);
        self.pipeline.notify();
        self.pipeline.window.wake_all();
        let handles: Vec<_> = lock(&self.pipeline.flushers).drain(..).collect();
        for h in handles {
            let _ = h.join();
        }
    }

    /// Push everything queued now, regardless of the sync lag (ops home refused are tried again at once);
    /// wait up to `timeout`, or until only refused ops (and those queued behind them) are left.
    pub(crate) fn drain(&self, timeout: Duration) -> Drained {
        let _hurry = self.pipeline.hurry();
        let began = Instant::now();
        self.pipeline.journal().retry_refused_before(began);
        self.pipeline.notify();
        let deadline = began + timeout;
        let mut j = self.pipeline.journal();
        loop {
            // An attempt under way when the drain began, refused since, is asked again.
            if j.retry_refused_before(began) {
                self.pipeline.notify_one();
            }
            if j.is_empty() {
                // Empty once the last ops' directories have their times at home too.
                if self.pipeline.settling.load(Ordering::SeqCst) == 0 {
                    break Drained::Empty;
                }
            } else {
                if self.cfg.write_mode.keeps_changes() {
                    break Drained::Waiting;
                }
                if self.health.online() && j.only_refused_left(began) {
                    break Drained::Refused;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                break Drained::Waiting;
            }
            j = self
                .pipeline
                .wait_done(j, (deadline - now).min(Duration::from_millis(200)));
        }
    }

    /// The journal's figures.
    pub(crate) fn journal_stats(&self) -> JournalStats {
        let j = self.pipeline.journal();
        JournalStats {
            pending_ops: j.len() as u64,
            dirty_bytes: self.core.store.stats().bytes_dirty,
            oldest_age_seconds: j.oldest_age().as_secs_f64(),
            conflicts: lock(&self.pipeline.conflicts).len() as u64,
            failed_ops: j.failures().count() as u64,
            home_online: self.health.online(),
        }
    }

    /// Every conflict recorded in this cache directory.
    pub(crate) fn conflicts(&self) -> Vec<Conflict> {
        lock(&self.pipeline.conflicts).clone()
    }

    /// Ops that home refused and that wait to be retried, in queue order.
    pub(crate) fn failed_ops(&self) -> Vec<RefusedChange> {
        let j = self.pipeline.journal();
        let mut out: Vec<(u64, RefusedChange)> = j
            .failures()
            .filter_map(|(seq, f)| {
                let op = j.get(*seq)?;
                Some((
                    *seq,
                    RefusedChange {
                        op: op.kind.name().to_string(),
                        path: String::from_utf8_lossy(&op.path).into_owned(),
                        error: f.error.clone(),
                        attempts: f.attempts,
                    },
                ))
            })
            .collect();
        out.sort_by_key(|(seq, _)| *seq);
        out.into_iter().map(|(_, c)| c).collect()
    }

    /// The pusher `index` (from 0): it pushes while the window admits it ([`crate::pipeline::Window`]).
    pub(crate) fn flush_worker(self: Arc<Self>, index: usize) {
        let window = &self.pipeline.window;
        loop {
            if self.pipeline.stopping.load(Ordering::SeqCst) {
                return;
            }
            if !window.admits(index, SPARE_WAIT) {
                continue;
            }
            let picked = {
                let mut j = self.pipeline.journal();
                loop {
                    if self.pipeline.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    if index >= window.limit() {
                        // The window shrank: this pusher waits outside it, and passes on a wake-up it took.
                        self.pipeline.notify_one();
                        break None;
                    }
                    if self.health.online() {
                        let urgent = self.pipeline.urgent();
                        let ready = j.ready(self.cfg.sync_lag, urgent, 2);
                        if let Some(&seq) = ready.first()
                            && let Some(op) = j.get(seq).cloned()
                        {
                            if ready.len() > 1 {
                                self.pipeline.notify_one();
                            }
                            let mut muts = j.begin(seq);
                            let first = !muts.is_empty() && !op.attempted;
                            // A file made here goes with its content when its data push is due too.
                            let lag = self.cfg.sync_lag.as_millis() as u64;
                            let carried = j
                                .data_after(seq)
                                .and_then(|d| j.get(d).cloned().map(|o| (d, o)))
                                .filter(|(_, d)| urgent || now_ms().saturating_sub(d.since_ms) >= lag);
                            if let Some((d, _)) = &carried {
                                muts.extend(j.begin(*d));
                            }
                            self.core.store.db().submit(muts);
                            break Some((seq, op, first, carried));
                        }
                    }
                    // Pushers past the first few are woken by a change (or another pusher), not the clock.
                    j = self
                        .pipeline
                        .wait(j, if index < Window::START { POLL } else { SPARE_WAIT });
                }
            };
            let Some((seq, op, first_attempt, carried)) = picked else {
                continue;
            };
            window.began();
            let began = Instant::now();
            // The attempt is on record before home sees it: after a crash, "already done" answers to
            // this op are recognised as ours. A data push records what it sends and makes that durable
            // with this together, in one sync, just before it writes to home (`DataPath::push_data`).
            if op.kind != OpKind::Data
                && carried.is_none()
                && let Err(e) = self.core.store.db().sync()
            {
                tracing::error!(error = %e, "cannot record a push attempt; not pushing");
                let mut j = self.pipeline.journal();
                let backoff = refusal_backoff(j.refusals(seq));
                j.fail(seq, e.to_string(), Some(backoff));
                continue;
            }
            self.pushing_rename(&op);
            tracing::debug!(seq, ino = op.ino, op = op.kind.name(), path = %String::from_utf8_lossy(&op.path), repeated = !first_attempt, with_data = carried.is_some(), "pushing");
            // Timed for the window unless it moves much file data.
            let timed = (op.kind != OpKind::Data && carried.is_none()) || self.small_file(op.ino);
            let Some((d, data)) = carried else {
                let outcome = self.push_op(&op, !first_attempt, false);
                window.ended(ended(&outcome, timed.then(|| began.elapsed())));
                self.conclude(seq, &op, outcome);
                continue;
            };
            let (outcome, landed) = self.push_new_file(&op, &data, !first_attempt);
            window.ended(ended(&outcome, timed.then(|| began.elapsed())));
            let done = matches!(outcome, Outcome::Done) && landed;
            self.conclude(seq, &op, outcome);
            if done {
                self.conclude(d, &data, Outcome::Done);
            } else {
                // Back in the queue behind its create, as it was.
                self.pipeline.journal().fail(d, String::new(), None);
                self.pipeline.finished();
            }
        }
    }

    /// Whether `ino` is a file whose push moves little data (at most [`TIMED_MAX`] bytes): such a push
    /// takes about a round trip, and times home's answers for the window.
    fn small_file(&self, ino: u64) -> bool {
        self.names
            .read()
            .inode(ino)
            .ok()
            .and_then(|n| n.attr.as_ref().map(|a| a.size <= TIMED_MAX))
            .unwrap_or(false)
    }

    fn conclude(&self, seq: u64, op: &Op, outcome: Outcome) {
        match outcome {
            Outcome::Done => {
                // Counted before the op leaves the journal, until its directories have their times.
                self.pipeline.settling.fetch_add(1, Ordering::SeqCst);
                let ns = self.names.write();
                let muts = {
                    let mut j = self.pipeline.journal();
                    j.finish(seq).1
                };
                let mut muts = muts;
                let mut ns = ns;
                if op.kind == OpKind::Rmdir {
                    // Kept until now for the home paths through it.
                    muts.push(Mutation::DelInode(op.ino));
                    if ns
                        .inodes
                        .get(&op.ino)
                        .is_some_and(|n| n.lookups() == 0 && n.opens() == 0)
                        && !self.pipeline.journal().has(op.ino)
                    {
                        ns.inodes.remove(&op.ino);
                    }
                } else if let Ok(node) = ns.inode(op.ino)
                    && node.keeps_record()
                {
                    muts.push(Mutation::PutInode(op.ino, node.record().encode()));
                }
                if self.cfg.write_mode.shows_home_times() {
                    // Write-through shows home's times, as home gives them: the directories whose
                    // entries changed are asked again, not given the mount's time.
                    for (dir, _) in &op.names {
                        if let Some(d) = ns.inodes.get_mut(dir) {
                            d.checked = None;
                        }
                    }
                }
                // Under the namespace's lock, as every record (`Changes::queue`).
                self.core.store.db().submit(muts);
                drop(ns);
                if !self.cfg.write_mode.shows_home_times() {
                    self.settle_dir_times(op);
                }
                self.pipeline.settling.fetch_sub(1, Ordering::SeqCst);
                // What the kernel forgot while its change waited leaves memory now that home has it.
                let mut ns = self.names.write();
                self.names.reclaim(&mut ns, op.ino);
            }
            Outcome::Retry(e) => {
                tracing::debug!(error = %e, op = op.kind.name(), "home away; the op waits");
                self.rename_unsettled(op);
                self.pipeline.journal().fail(seq, e.to_string(), None);
            }
            Outcome::Refused(e) => {
                self.rename_unsettled(op);
                let kept_queued = never_set_aside(&e);
                let e = e.to_string();
                let attempts = {
                    let mut j = self.pipeline.journal();
                    let backoff = refusal_backoff(j.refusals(seq));
                    j.fail(seq, e.clone(), Some(backoff))
                };
                let path = String::from_utf8_lossy(&op.path);
                if attempts == 1 && kept_queued {
                    tracing::warn!(
                        error = %e,
                        op = op.kind.name(),
                        path = %path,
                        "a change cannot go to home now; it stays queued and is retried (after 1 s, then doubling \
                         up to about a minute) until it can"
                    );
                } else if attempts == 1 {
                    tracing::warn!(
                        error = %e,
                        op = op.kind.name(),
                        path = %path,
                        "home refused a change; it stays queued and is retried (after 1 s, then doubling); after \
                         {MAX_ATTEMPTS} refusals it is set aside as a conflict so the queue moves on"
                    );
                } else {
                    tracing::debug!(error = %e, op = op.kind.name(), path = %path, attempts, "home refused a change again");
                }
                if attempts >= MAX_ATTEMPTS && !kept_queued {
                    // Keep the cache's version where it cannot be lost, and let the queue move on.
                    self.set_aside(op, &e);
                    let mut ns = self.names.write();
                    let muts = self.pipeline.journal().finish(seq).1;
                    ns.renames.remove(&op.ino);
                    if let Some(node) = ns.inodes.get_mut(&op.ino) {
                        node.dirty.clear();
                        if std::mem::take(&mut node.labelled) {
                            // Its changes are kept in the conflicts area now.
                            self.data.unlabel(op.ino, node.object);
                        }
                    }
                    self.core.store.db().submit(muts);
                    self.names.persist(&ns, op.ino);
                    drop(ns);
                }
            }
        }
        self.pipeline.finished();
    }

    /// A rename is about to reach home: until it is settled here, home's answers about the paths below its
    /// source may be either side of it ([`Namespace::moving`]).
    pub(super) fn pushing_rename(&self, op: &Op) {
        if matches!(op.kind, OpKind::Rename { .. }) {
            self.names
                .write()
                .renames
                .insert(op.ino, crate::namespace::Unsettled::of(op, true));
        }
    }

    /// A rename's push failed: home may or may not have made it; it waits for a retry.
    pub(super) fn rename_unsettled(&self, op: &Op) {
        if let Some(r) = self.names.write().renames.get_mut(&op.ino) {
            r.under_way = false;
        }
    }

    /// Home stamps what it creates with the time of the push; the mount shows the time it was made here,
    /// or one set since. Unless a queued change of it gives the time again (a file's data push, a time
    /// set), home gets the mount's time now: a queued change that gives none (a mode set, as `rsync` makes
    /// after each `mkdir`) adopts home's time when it lands. Home's attributes afterwards: they are
    /// adopted, so the mount's time must be home's first. (A directory whose entries are queued gets its
    /// time again once they have landed: [`Changes::settle_dir_times`].)
    fn created_with_local_time(&self, op: &Op, path: &Path, attr: HomeAttr) -> HomeAttr {
        // A time set since is an op of its own; write-through shows home's time for what it creates (adopted
        // now: `local_mtime` gives none).
        if self.pipeline.journal().time_given_later(op.ino) {
            return attr;
        }
        let Some(mtime) = self.local_mtime(op.ino).filter(|t| *t != attr.mtime) else {
            return attr;
        };
        self.give_home_time(path, mtime).unwrap_or(attr)
    }

    /// Set the mtime of `path` at home to `mtime`: home's attributes afterwards, `None` if it failed (the
    /// time is then home's own, as before; nothing else depends on it).
    fn give_home_time(&self, path: &Path, mtime: std::time::SystemTime) -> Option<HomeAttr> {
        let changes = SetAttr {
            mtime: Some(TimeSet::At(mtime)),
            ..SetAttr::default()
        };
        self.core
            .home
            .setattr(path, &changes)
            .inspect_err(
                |e| tracing::debug!(error = %e, path = %path.display(), "could not give home the mount's time"),
            )
            .ok()
    }

    /// Home stamps a directory with the time it was made and each change of its entries reached it; the
    /// mount shows the time each was made here (or one set since). Once the last queued change of a
    /// directory `op` changed (an entry of it, or the directory itself) has landed, home's directory gets
    /// the mount's time, so the two agree again (`rsync -a`, `tar` and `cp -a` set directory times before
    /// or after filling them).
    fn settle_dir_times(&self, op: &Op) {
        if !self.core.home.limits().times {
            return;
        }
        let mut dirs: Vec<u64> = op.names.iter().map(|(d, _)| *d).collect();
        // A time just given to it (set, or given to what was just created) is home's already.
        // (An extended attribute's change gives nothing a time: it is not waited for either.)
        if !op.kind.creates()
            && !matches!(
                op.kind,
                OpKind::SetAttr { mtime: Some(_), .. } | OpKind::SetXattr { .. }
            )
        {
            dirs.push(op.ino);
        }
        dirs.sort_unstable();
        dirs.dedup();
        for dir in dirs {
            let (path, mtime) = {
                let ns = self.names.read();
                if !self.pipeline.journal().dir_settled(dir) {
                    continue;
                }
                let Ok(node) = ns.inode(dir) else { continue };
                let (Some(attr), false, FileKind::Dir) = (node.attr.as_ref(), node.removed, node.kind) else {
                    continue;
                };
                let Ok(Some(path)) = ns.home_path(dir) else { continue };
                (path, attr.mtime)
            };
            let Some(attr) = self.give_home_time(&path, mtime) else {
                continue;
            };
            let mut ns = self.names.write();
            // A change of it made meanwhile stands: its own push settles the time again.
            let unchanged = ns
                .inode(dir)
                .is_ok_and(|n| n.attr.as_ref().is_some_and(|a| a.mtime == mtime));
            if unchanged && self.pipeline.journal().dir_settled(dir) {
                self.names.adopt_attr(&mut ns, dir, attr);
            }
        }
    }

    /// An op home keeps refusing: its data (if any) is copied to the conflicts area and listed. The data of
    /// a file made here, or written here, is copied whatever the op that could not land (its creation, as
    /// when the directory it was made in was removed or renamed at home meanwhile, or its data), and the
    /// file's other content changes go with the copy: they could land no better.
    fn set_aside(&self, op: &Op, error: &str) {
        let file = self
            .names
            .read()
            .inode(op.ino)
            .is_ok_and(|n| n.kind == FileKind::File && n.object != 0);
        let kept = if file && matches!(op.kind, OpKind::Data | OpKind::Create { .. }) {
            let kept = self
                .keep_locally(op.ino, &op.path)
                .unwrap_or_else(|e| format!("(copy failed: {e})"));
            let ns = self.names.write();
            let muts = self.pipeline.journal().drop_content_ops(op.ino);
            // Under the namespace's lock, as every record (`Changes::queue`).
            self.core.store.db().submit(muts);
            drop(ns);
            kept
        } else {
            format!("{:?}", op.kind)
        };
        self.record_conflict(
            &op.path,
            "refused",
            kept,
            true,
            format!(
                "home refused the {} {MAX_ATTEMPTS} times ({error}); set aside so the queue moves on",
                op.kind.name()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_backoff_doubles_from_one_second_up_to_the_cap_with_jitter() {
        for refusals in 0..12u32 {
            let base = MIN_BACKOFF * (1 << refusals.min(6));
            for _ in 0..50 {
                let d = refusal_backoff(refusals);
                assert!(d >= base && d < base * 2, "refusal {refusals}: {d:?}, base {base:?}");
            }
        }
        assert_eq!(MIN_BACKOFF * (1 << 6), MAX_BACKOFF);
        assert!(refusal_backoff(u32::MAX) < MAX_BACKOFF * 2);
    }
}
