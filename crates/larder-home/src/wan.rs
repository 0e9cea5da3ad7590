//! WAN emulation: per-operation latency and a shared bandwidth cap in front of a home.
//!
//! Latency is paid by each operation independently (concurrent operations overlap, as on a real link);
//! bandwidth is one shared pipe: transfers queue behind each other.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Layer, OpKind};

/// A link to emulate (the command line spells it `latency=20ms,bandwidth=50MiB/s`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WanSpec {
    /// Added to every operation (one round trip).
    pub latency: Duration,
    /// Bytes per second through the link; `None` is unlimited.
    pub bandwidth: Option<u64>,
}

/// The emulation layer.
pub struct WanLayer {
    spec: WanSpec,
    /// When the shared link is free again.
    link_free_at: Mutex<Instant>,
}

impl WanLayer {
    /// A layer emulating `spec`.
    pub fn new(spec: WanSpec) -> WanLayer {
        WanLayer {
            spec,
            link_free_at: Mutex::new(Instant::now()),
        }
    }

    fn transfer(&self, bytes: u64) {
        let Some(bw) = self.spec.bandwidth else { return };
        if bytes == 0 {
            return;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / bw as f64);
        let done = {
            let mut free = self.link_free_at.lock().unwrap_or_else(|p| p.into_inner());
            let start = (*free).max(Instant::now());
            *free = start + cost;
            *free
        };
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
    }
}

impl Layer for WanLayer {
    fn before(&self, _op: OpKind, bytes_out: u64) -> crate::HomeResult<()> {
        if !self.spec.latency.is_zero() {
            std::thread::sleep(self.spec.latency);
        }
        self.transfer(bytes_out);
        Ok(())
    }
    fn after(&self, _op: OpKind, bytes_in: u64, _error: Option<&crate::HomeError>) {
        self.transfer(bytes_in);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_is_shared() {
        let layer = WanLayer::new(WanSpec {
            latency: Duration::ZERO,
            bandwidth: Some(10 << 20),
        });
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| layer.after(OpKind::Read, 1 << 20, None));
            }
        });
        // Two 1 MiB transfers over a 10 MiB/s link take at least 0.2 s together.
        assert!(start.elapsed() >= Duration::from_millis(190), "{:?}", start.elapsed());
    }
}
