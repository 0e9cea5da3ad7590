//! Tiers: the places a unit of content may be found, nearest first, and the walk that reads through them.
//!
//! A [`Tier`] answers for a unit ([`Want`]: its portable [`UnitKey`], the file bytes it covers, and where
//! this node keeps the content) with a [`Unit`] (the bytes, their crc32c, and the key digest the tier says
//! they are), `None` (a miss) or a [`TierError`]. [`Tiers`] asks them in order, today the local store
//! ([`StoreTier`]) and then home ([`HomeTier`]); cluster peers and a shared bank go in between. The rules
//! (design note 010):
//!
//! * An answer whose digest is not the one asked for (another version, another block), whose length is
//!   not the unit's, or whose bytes fail their checksum is a miss, counted, and never served or kept.
//! * A tier's error is a miss and a count, except at the last tier (home), whose error is the read's.
//! * Verified bytes from a tier are offered to every nearer one; content not yet pushed is never offered to
//!   a tier shared with other nodes.
//! * One walk per key at a time, however many readers wait ([`SingleFlight`]).
//! * A tier enforces its own deadline (a timeout is its error, so a miss); the walk cannot cancel a call.

#[cfg(any(test, feature = "mock"))]
mod fault;
mod local;
#[cfg(any(test, feature = "mock"))]
mod memory;

#[cfg(any(test, feature = "mock"))]
pub use fault::{FaultTier, Faults};
pub use local::{HomeTier, StoreTier};
#[cfg(any(test, feature = "mock"))]
pub use memory::MemoryTier;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use larder_home::HomeError;
use larder_util::SingleFlight;

use crate::FileVersion;
use crate::key::{KeyDigest, UnitKey};

/// A unit fetched, or why the last tier could not give it; shared by everyone waiting for the same unit.
pub type FetchResult = Result<Arc<Vec<u8>>, HomeError>;

/// What a tier is asked for.
pub struct Want<'a> {
    /// The unit's portable name, and its digest.
    pub key: &'a UnitKey,
    pub digest: KeyDigest,
    /// The bytes of the file the unit holds.
    pub range: Range<u64>,
    /// The version of the file the unit is of, as this node has it; tiers shared between nodes go by the
    /// key alone.
    pub file: &'a FileVersion,
    /// The member handing the unit over to this node (it is leaving): asked first, for what it holds.
    pub take_from: Option<u64>,
    /// The member whose ask, as the unit's owner, this walk answers: the walk asks only the unit's
    /// previous owners, for what they hold (the asker tries the other candidates itself), and never the
    /// asker (it has not got the unit).
    pub asker: Option<u64>,
}

impl<'a> Want<'a> {
    pub fn new(key: &'a UnitKey, range: Range<u64>, file: &'a FileVersion) -> Want<'a> {
        Want {
            digest: key.digest(),
            key,
            range,
            file,
            take_from: None,
            asker: None,
        }
    }
}

/// A tier's answer: bytes, their crc32c, and the unit they claim to be.
#[derive(Clone, Debug)]
pub struct Unit {
    pub data: Arc<Vec<u8>>,
    pub crc32c: u32,
    /// The digest of the key the bytes are of: the version (and home, file and part) they claim.
    pub key: KeyDigest,
}

impl Unit {
    /// `data` as unit `key`, with its checksum.
    pub fn new(key: KeyDigest, data: Arc<Vec<u8>>) -> Unit {
        Unit {
            crc32c: crc32c::crc32c(&data),
            data,
            key,
        }
    }

    /// Why this answer cannot be served for `want`, if it cannot. The checksum is recomputed unless the
    /// tier checked it itself (`checked`).
    fn fault(&self, want: &Want, exact_len: bool, checked: bool) -> Option<&'static str> {
        if self.key != want.digest {
            Some("another version or unit")
        } else if exact_len && self.data.len() as u64 != want.key.part.len() {
            Some("the wrong length")
        } else if !checked && crc32c::crc32c(&self.data) != self.crc32c {
            Some("bytes that fail their checksum")
        } else {
            None
        }
    }
}

/// Why a tier could not answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum TierError {
    /// Home's own error (only the home tier gives these).
    #[error(transparent)]
    Home(#[from] HomeError),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("I/O error: {0}")]
    Io(String),
}

impl TierError {
    fn into_home(self) -> HomeError {
        match self {
            TierError::Home(e) => e,
            TierError::TimedOut(d) => HomeError::TimedOut(d),
            TierError::Unavailable(s) => HomeError::Unavailable(s),
            TierError::Io(_) => HomeError::Os(libc::EIO),
        }
    }
}

/// A place that may hold units.
pub trait Tier: Send + Sync {
    /// A short stable name, for logs and metrics.
    fn name(&self) -> &'static str;

    /// Whether other nodes read and fill this tier too (a peer, a bank): content not yet pushed is never
    /// offered to it.
    fn shared(&self) -> bool {
        false
    }

    /// Whether the tier checks its answers' checksums itself (the local store against its index) or is
    /// the source of truth (home): the walk then skips recomputing them.
    fn checks_own_answers(&self) -> bool {
        false
    }

    /// The unit `want` names, if this tier has it. Must return within the tier's own deadline.
    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError>;

    /// The units `wants` name, adjacent blocks of one file in order, in one request: `None` if the tier
    /// serves units one at a time (each is then asked for on its own). An answer may stop short at the
    /// end of the file; a unit it has is checked as [`Tier::get`]'s would be.
    fn get_run(&self, wants: &[Want]) -> Result<Option<Vec<Unit>>, TierError> {
        let _ = wants;
        Ok(None)
    }

    /// Keep `unit`, verified bytes of `want` fetched from a farther tier, if the tier wants to.
    fn offer(&self, want: &Want, unit: &Unit) -> Result<(), TierError> {
        let _ = (want, unit);
        Ok(())
    }
}

/// A tier's counts since start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub name: &'static str,
    /// Answers served.
    pub hits: u64,
    /// Asked, and it did not have the unit.
    pub misses: u64,
    /// Asked, and it failed (counted as a miss too, except at the last tier).
    pub errors: u64,
    /// Answers refused: another version, the wrong length, or a failed checksum.
    pub rejected: u64,
    /// Units offered to it, and offers it failed.
    pub offers: u64,
    pub offer_errors: u64,
    /// Times it was asked, the time its answers took in all (nanoseconds), and the bytes of its hits.
    pub asks: u64,
    pub nanos: u64,
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    rejected: AtomicU64,
    offers: AtomicU64,
    offer_errors: AtomicU64,
    asks: AtomicU64,
    nanos: AtomicU64,
    bytes: AtomicU64,
}

impl Counters {
    /// Ask `tier` for `want`, timed.
    fn ask(&self, tier: &dyn Tier, want: &Want) -> Result<Option<Unit>, TierError> {
        self.timed(|| tier.get(want))
    }

    /// Ask `tier` for the units of `run` in one request, timed: one ask.
    fn ask_run(&self, tier: &dyn Tier, run: &[Want]) -> Result<Option<Vec<Unit>>, TierError> {
        self.timed(|| tier.get_run(run))
    }

    /// Count one ask, and the time `ask` took.
    fn timed<T>(&self, ask: impl FnOnce() -> T) -> T {
        let started = std::time::Instant::now();
        let answer = ask();
        bump(&self.asks);
        self.nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        answer
    }

    fn hit(&self, unit: &Unit) {
        bump(&self.hits);
        self.bytes.fetch_add(unit.data.len() as u64, Ordering::Relaxed);
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The ordered tiers of the read path, nearest first; the last is home.
pub struct Tiers {
    tiers: Vec<(Arc<dyn Tier>, Counters)>,
    flights: SingleFlight<KeyDigest, FetchResult>,
}

impl Tiers {
    /// Read through `tiers`, nearest first; there must be one at least (the last is the source).
    pub fn new(tiers: Vec<Arc<dyn Tier>>) -> Tiers {
        assert!(!tiers.is_empty(), "the read path needs a tier");
        Tiers {
            tiers: tiers.into_iter().map(|t| (t, Counters::default())).collect(),
            flights: SingleFlight::default(),
        }
    }

    /// The unit `want` names from the nearest tier that has it, filling the nearer ones. One walk per key
    /// at a time: callers that arrive meanwhile wait for its result.
    pub fn fetch(&self, want: &Want) -> FetchResult {
        self.flights.run(want.digest, || self.walk(want))
    }

    /// The unit `want` names if this node holds it: the tiers before the first shared one (and never
    /// home), filling the nearer ones. For a peer that asks only for what this node has: nothing is
    /// fetched, so no walk is joined or started.
    pub fn held(&self, want: &Want) -> Option<Arc<Vec<u8>>> {
        let last = self.tiers.len() - 1;
        (0..last)
            .take_while(|&i| !self.tiers[i].0.shared())
            .find_map(|i| self.ask(i, want).ok())
    }

    /// Whether a walk for `digest` is under way.
    pub fn in_flight(&self, digest: &KeyDigest) -> bool {
        self.flights.in_flight(digest)
    }

    /// The units `wants` name, adjacent blocks of one file in order, each as [`Tiers::fetch`] would get
    /// it, those that no tier before the last has coming from the last in one request where it serves
    /// runs (home: one ranged read). The run stops short of the first unit whose walk is under way (a
    /// reader's, or another run's): what it leaves is someone's already. Readers of a unit of the run wait
    /// for it meanwhile, as for any walk. Returns the results of the units it took, in order.
    pub fn fetch_run(&self, wants: &[Want]) -> Vec<FetchResult> {
        let leads: Vec<_> = wants.iter().map_while(|w| self.flights.lead(w.digest)).collect();
        let run = &wants[..leads.len()];
        let last = self.tiers.len() - 1;
        let mut got: Vec<Option<FetchResult>> = vec![None; run.len()];
        for i in 0..last {
            for (w, g) in run.iter().zip(got.iter_mut()) {
                if g.is_none()
                    && let Ok(data) = self.ask(i, w)
                {
                    *g = Some(Ok(data));
                }
            }
        }
        // What is left, in runs of adjacent units, from the source.
        let mut at = 0;
        while at < run.len() {
            if got[at].is_some() {
                at += 1;
                continue;
            }
            let mut end = at + 1;
            while end < run.len() && got[end].is_none() {
                end += 1;
            }
            for (j, result) in self.ask_run(last, &run[at..end]).into_iter().enumerate() {
                got[at + j] = Some(result);
            }
            at = end;
        }
        let results: Vec<FetchResult> = got.into_iter().map(|g| g.unwrap_or(Err(HomeError::NotFound))).collect();
        for (lead, result) in leads.into_iter().zip(&results) {
            lead.finish(result.clone());
        }
        results
    }

    pub fn stats(&self) -> Vec<TierStats> {
        self.tiers
            .iter()
            .map(|(t, c)| TierStats {
                name: t.name(),
                hits: c.hits.load(Ordering::Relaxed),
                misses: c.misses.load(Ordering::Relaxed),
                errors: c.errors.load(Ordering::Relaxed),
                rejected: c.rejected.load(Ordering::Relaxed),
                offers: c.offers.load(Ordering::Relaxed),
                offer_errors: c.offer_errors.load(Ordering::Relaxed),
                asks: c.asks.load(Ordering::Relaxed),
                nanos: c.nanos.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
            })
            .collect()
    }

    fn walk(&self, want: &Want) -> FetchResult {
        let last = self.tiers.len() - 1;
        for i in 0..last {
            if let Ok(data) = self.ask(i, want) {
                return Ok(data);
            }
        }
        self.ask(last, want)
    }

    /// Ask tier `i` for `want`, and count what it answered (see [`Tiers::take`]).
    fn ask(&self, i: usize, want: &Want) -> FetchResult {
        let (tier, counts) = &self.tiers[i];
        self.take(i, want, counts.ask(tier.as_ref(), want))
    }

    /// Tier `i`'s answer for `want`, counted. A verified answer fills the nearer tiers and is the result.
    /// Else the error is what the read gets if `i` is the last tier (the source); a nearer tier's
    /// failure, miss or refused answer counts as its miss, and the walk goes on.
    fn take(&self, i: usize, want: &Want, answer: Result<Option<Unit>, TierError>) -> FetchResult {
        let (tier, counts) = &self.tiers[i];
        let last = i == self.tiers.len() - 1;
        let unit = match answer {
            Ok(Some(unit)) => unit,
            Ok(None) => {
                bump(&counts.misses);
                return Err(HomeError::NotFound);
            }
            Err(e) => {
                bump(&counts.errors);
                if !last {
                    bump(&counts.misses);
                    tracing::debug!(tier = tier.name(), error = %e, key = %want.digest, "tier failed; asking the next");
                }
                return Err(e.into_home());
            }
        };
        // The last tier is the source: its length is the truth (short only at the end of the file).
        if let Some(why) = unit.fault(want, !last, tier.checks_own_answers()) {
            bump(&counts.rejected);
            tracing::warn!(tier = tier.name(), key = %want.digest, "a tier answered with {why}; not served");
            if !last {
                bump(&counts.misses);
            }
            return Err(HomeError::Os(libc::EIO));
        }
        counts.hit(&unit);
        self.fill(&self.tiers[..i], want, &unit);
        Ok(unit.data)
    }

    /// Ask tier `i` for the units of `run` in one request, or one by one if it serves units only, and
    /// count what it answered (one ask, and one error if it failed, for the run); each unit of the answer
    /// is taken as [`Tiers::take`] takes one. A unit the answer stops short of is asked for on its own.
    fn ask_run(&self, i: usize, run: &[Want]) -> Vec<FetchResult> {
        let (tier, counts) = &self.tiers[i];
        if run.len() == 1 {
            return vec![self.ask(i, &run[0])];
        }
        match counts.ask_run(tier.as_ref(), run) {
            Ok(None) => run.iter().map(|w| self.ask(i, w)).collect(),
            Ok(Some(units)) => {
                let mut units = units.into_iter();
                run.iter()
                    .map(|w| match units.next() {
                        Some(unit) => self.take(i, w, Ok(Some(unit))),
                        None => self.ask(i, w),
                    })
                    .collect()
            }
            Err(e) => {
                bump(&counts.errors);
                if i != self.tiers.len() - 1 {
                    bump(&counts.misses);
                }
                tracing::debug!(tier = tier.name(), error = %e, "tier failed a run");
                vec![Err(e.into_home()); run.len()]
            }
        }
    }

    /// Offer verified `unit` to the `nearer` tiers.
    fn fill(&self, nearer: &[(Arc<dyn Tier>, Counters)], want: &Want, unit: &Unit) {
        for (tier, counts) in nearer {
            if tier.shared() && !want.key.shareable() {
                continue;
            }
            bump(&counts.offers);
            if let Err(e) = tier.offer(want, unit) {
                bump(&counts.offer_errors);
                tracing::warn!(
                    tier = tier.name(),
                    error = %e,
                    path = %want.file.path.display(),
                    "could not keep fetched data in a nearer tier"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
