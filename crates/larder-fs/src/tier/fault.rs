//! A tier that misbehaves on purpose around another: slow, failing, or answering with damaged bytes or
//! another version's. For tests of the walk's rules.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Tier, TierError, Unit, Want};
use larder_util::contention::lock;

/// What a [`FaultTier`] does to the calls it forwards.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Wait this long before each call.
    pub delay: Duration,
    /// Fail every call (after the delay).
    pub error: bool,
    /// Flip a byte of every answer, keeping its checksum (which then fails).
    pub corrupt: bool,
    /// Answer as another version: the key digest changed, the checksum right for the bytes.
    pub wrong_version: bool,
}

/// Forwards to `inner`, with [`Faults`]; counts the calls.
pub struct FaultTier {
    inner: Arc<dyn Tier>,
    faults: Mutex<Faults>,
    gets: AtomicU64,
    offers: AtomicU64,
}

impl FaultTier {
    pub fn new(inner: Arc<dyn Tier>) -> FaultTier {
        FaultTier {
            inner,
            faults: Mutex::new(Faults::default()),
            gets: AtomicU64::new(0),
            offers: AtomicU64::new(0),
        }
    }

    pub fn set(&self, faults: Faults) {
        *lock(&self.faults) = faults;
    }

    /// Calls of `get` so far.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }

    /// Calls of `offer` so far.
    pub fn offers(&self) -> u64 {
        self.offers.load(Ordering::SeqCst)
    }
}

impl Tier for FaultTier {
    fn name(&self) -> &'static str {
        "fault"
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }

    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let faults = lock(&self.faults).clone();
        std::thread::sleep(faults.delay);
        if faults.error {
            return Err(TierError::Unavailable("injected fault".into()));
        }
        let Some(mut unit) = self.inner.get(want)? else {
            return Ok(None);
        };
        if faults.corrupt {
            let data = Arc::make_mut(&mut unit.data);
            match data.first_mut() {
                Some(b) => *b ^= 0x5a,
                None => unit.crc32c ^= 1,
            }
        }
        if faults.wrong_version {
            unit.key.0[0] ^= 1;
        }
        Ok(Some(unit))
    }

    fn offer(&self, want: &Want, unit: &Unit) -> Result<(), TierError> {
        self.offers.fetch_add(1, Ordering::SeqCst);
        if lock(&self.faults).error {
            return Err(TierError::Unavailable("injected fault".into()));
        }
        self.inner.offer(want, unit)
    }
}
