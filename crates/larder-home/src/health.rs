//! Home health: a layer that notices home is unreachable, fails calls at once while it is, and a probe
//! that brings it back.
//!
//! Any call that fails because home cannot be reached (a timeout, a refused connection) marks home
//! offline. While offline, every call fails with [`HomeError::Unavailable`] without reaching home, so a
//! read of uncached data gets its error at once instead of after a timeout. [`Health::probe`] (called by
//! the owner's checker thread) first has the unlayered home reopen its root if that was replaced or no
//! longer answers ([`Home::reconnect`]: a home that is itself a mount that died and was mounted again),
//! then asks it for its root; success marks home online again. While online, [`Health::recheck`] lets the
//! home follow its path (a mount over it) and notices a root that stopped answering between calls.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Home, HomeError, HomeResult, Layer, OpKind};

/// Says what the mount does now that home went offline (`false`) or came back (`true`), for the log.
type Explainer = Box<dyn Fn(bool) -> String + Send + Sync>;

/// Whether home is reachable, shared by the layer, the prober and status output.
#[derive(Default)]
pub struct Health {
    offline: AtomicBool,
    /// Unix seconds when home went offline (0 while online).
    since: AtomicU64,
    /// Times home went offline.
    outages: AtomicU64,
    explainer: OnceLock<Explainer>,
}

impl Health {
    /// A fresh state: online.
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    /// Whether home is believed reachable.
    pub fn online(&self) -> bool {
        !self.offline.load(Ordering::Acquire)
    }

    /// Unix seconds since which home is offline, if it is.
    pub fn offline_since(&self) -> Option<u64> {
        (!self.online()).then(|| self.since.load(Ordering::Relaxed))
    }

    /// How many times home went offline.
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// Have each transition's log line say what the mount does about it (`f(false)`: home went away,
    /// `f(true)`: it is back). Set once; `f` runs inside home calls, so it must not wait for locks.
    pub fn set_explainer(&self, f: impl Fn(bool) -> String + Send + Sync + 'static) {
        let _ = self.explainer.set(Box::new(f));
    }

    fn explain(&self, online: bool) -> String {
        match self.explainer.get().map(|f| f(online)) {
            Some(what) if !what.is_empty() => format!(": {what}"),
            _ => String::new(),
        }
    }

    /// Mark home offline (idempotent): one log line per outage.
    pub fn set_offline(&self, why: &HomeError) {
        if !self.offline.swap(true, Ordering::AcqRel) {
            self.since.store(now(), Ordering::Relaxed);
            let outage = self.outages.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                error = %why,
                outage,
                "home is unreachable; working offline{}",
                self.explain(false)
            );
        }
    }

    /// Mark home online (idempotent): one log line per return.
    pub fn set_online(&self) {
        if self.offline.swap(false, Ordering::AcqRel) {
            let away = now().saturating_sub(self.since.swap(0, Ordering::Relaxed));
            tracing::info!(
                offline_seconds = away,
                "home is reachable again after {away} s offline{}",
                self.explain(true)
            );
        }
    }

    /// Ask `home` (the unlayered backend) whether it answers; record the outcome. Returns whether online.
    pub fn probe(&self, home: &dyn Home) -> bool {
        match home.reconnect().and_then(|_| home.stat(Path::new(""))) {
            Ok(_) => {
                self.set_online();
                true
            }
            Err(e) if unreachable(&e) => {
                self.set_offline(&e);
                false
            }
            // Home answered, if unhappily: it is reachable.
            Err(_) => {
                self.set_online();
                true
            }
        }
    }

    /// While online: have `home` (the unlayered backend) reopen its root if its path names another
    /// directory now; a root that cannot be opened marks home offline. Returns whether the root was
    /// replaced.
    pub fn recheck(&self, home: &dyn Home) -> bool {
        match home.reconnect() {
            Ok(replaced) => replaced,
            Err(e) if unreachable(&e) => {
                self.set_offline(&e);
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "checking the home's root failed");
                false
            }
        }
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Errors that mean home cannot be reached at all.
pub fn unreachable(e: &HomeError) -> bool {
    matches!(e, HomeError::TimedOut(_) | HomeError::Unavailable(_))
}

/// The layer: fails fast while offline, and notices outages.
pub struct HealthLayer(pub Arc<Health>);

impl Layer for HealthLayer {
    fn before(&self, _op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        if self.0.online() {
            Ok(())
        } else {
            Err(HomeError::Unavailable("home is offline".into()))
        }
    }

    fn after(&self, _op: OpKind, _bytes_in: u64, error: Option<&HomeError>) {
        if let Some(e) = error
            && unreachable(e)
        {
            self.0.set_offline(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Layered, PosixHome};

    #[test]
    fn offline_fails_fast_and_probe_restores() {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Home> = Arc::new(PosixHome::new(dir.path(), None).unwrap());
        let health = Health::new();
        let home = Layered::new(inner.clone(), HealthLayer(health.clone()));
        assert!(home.stat(Path::new("")).is_ok());
        health.set_offline(&HomeError::Unavailable("test".into()));
        assert!(matches!(home.stat(Path::new("")), Err(HomeError::Unavailable(_))));
        assert!(health.offline_since().is_some());
        assert!(health.probe(inner.as_ref()));
        assert!(home.stat(Path::new("")).is_ok());
        assert_eq!(health.outages(), 1);
    }
}
