//! WAN emulation: per-operation latency and a shared bandwidth cap in front of a home.
//!
//! Latency is paid by each operation independently (concurrent operations overlap, as on a real link);
//! bandwidth is one shared pipe: transfers queue behind each other.

use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Layer, OpKind};

/// A link to emulate, parsed from `latency=20ms,bandwidth=50MiB/s`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WanSpec {
    /// Added to every operation (one round trip).
    pub latency: Duration,
    /// Bytes per second through the link; `None` is unlimited.
    pub bandwidth: Option<u64>,
}

/// A leading decimal number and the unit after it.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    Some((num.parse().ok()?, unit.trim()))
}

/// Parse a duration such as `20ms`, `1.5s`, `250us`, `2m` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (value, unit) = split_number(s).ok_or_else(|| format!("'{s}' is not a duration (try 20ms, 1.5s, 2m)"))?;
    let secs = match unit {
        "" | "s" | "sec" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "ns" => value / 1e9,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit '{other}' in '{s}' (use ns, us, ms, s, m, h)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("'{s}' is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parse a size such as `10GiB`, `512MiB`, `4k`, `1.5G` or a bare number of bytes (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (value, unit) =
        split_number(s.trim()).ok_or_else(|| format!("'{s}' is not a size (try 10GiB, 512MiB, 4KiB)"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{s}' (use B, KiB, MiB, GiB, TiB)"
            ));
        }
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{s}' is not a valid size"));
    }
    Ok(bytes as u64)
}

impl FromStr for WanSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<WanSpec, String> {
        let mut spec = WanSpec::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' should be key=value (latency=20ms or bandwidth=50MiB/s)"))?;
            match key.trim() {
                "latency" | "rtt" => spec.latency = parse_duration(value)?,
                "bandwidth" | "bw" => {
                    let v = value.trim();
                    let v = v.strip_suffix("/s").unwrap_or(v);
                    let bw = parse_size(v)?;
                    if bw == 0 {
                        return Err("bandwidth must be above zero".into());
                    }
                    spec.bandwidth = Some(bw);
                }
                other => return Err(format!("unknown WAN setting '{other}' (known: latency, bandwidth)")),
            }
        }
        Ok(spec)
    }
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
    fn parses_specs() {
        let spec: WanSpec = "latency=20ms,bandwidth=50MiB/s".parse().unwrap();
        assert_eq!(spec.latency, Duration::from_millis(20));
        assert_eq!(spec.bandwidth, Some(50 << 20));
        assert!("latency=20parsecs".parse::<WanSpec>().is_err());
        assert!("speed=1".parse::<WanSpec>().is_err());
        assert!("bandwidth=0".parse::<WanSpec>().is_err());
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    }

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
