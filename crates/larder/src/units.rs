//! Durations, sizes and WAN specs as the command line spells them.
//!
//! humantime reads durations and bytesize reads sizes; two habits of larder's options are kept on top:
//! a duration may be a bare number of seconds or have a fraction (`5`, `1.5s`), which humantime does not
//! take, and sizes are binary whatever the spelling (`4k` = `4KiB` = 4096, `1GB` = 1GiB), where bytesize
//! reads `k` and `KB` as powers of ten.

use std::time::Duration;

use larder_home::WanSpec;

/// A leading decimal number and the (trimmed) unit after it.
fn split_number(s: &str) -> (&str, &str) {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    (number, unit.trim())
}

/// A duration such as `20ms`, `1.5s`, `250us`, `2m`, `1h 30m` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(d);
    }
    let invalid = |why: String| format!("'{s}' is not a duration (try 20ms, 1.5s, 2m): {why}");
    let (number, unit) = split_number(s);
    let value: f64 = number
        .parse()
        .map_err(|_| invalid("it should start with a number".into()))?;
    let unit = humantime::parse_duration(&format!("1{}", if unit.is_empty() { "s" } else { unit }))
        .map_err(|e| invalid(e.to_string()))?;
    Duration::try_from_secs_f64(unit.as_secs_f64() * value).map_err(|e| invalid(e.to_string()))
}

/// A size such as `10GiB`, `512MiB`, `4k`, `1.5G` or a bare number of bytes (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (number, unit) = split_number(s);
    let unit = match unit.to_ascii_lowercase().as_str() {
        u @ ("k" | "m" | "g" | "t" | "kb" | "mb" | "gb" | "tb") => format!("{}iB", u[..1].to_ascii_uppercase()),
        _ => unit.to_string(),
    };
    format!("{number}{unit}")
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("'{s}' is not a size (try 10GiB, 512MiB, 4KiB): {e}"))
}

/// A link to emulate: `latency=20ms,bandwidth=50MiB/s` (either part may be left out).
pub fn parse_wan(s: &str) -> Result<WanSpec, String> {
    let mut spec = WanSpec::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' should be key=value (latency=20ms or bandwidth=50MiB/s)"))?;
        match key.trim() {
            "latency" | "rtt" => spec.latency = parse_duration(value)?,
            "bandwidth" | "bw" => {
                let v = value.trim();
                let bandwidth = parse_size(v.strip_suffix("/s").unwrap_or(v))?;
                if bandwidth == 0 {
                    return Err("bandwidth must be above zero".into());
                }
                spec.bandwidth = Some(bandwidth);
            }
            other => return Err(format!("unknown WAN setting '{other}' (known: latency, bandwidth)")),
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_spelling_larder_takes() {
        let ms = Duration::from_millis;
        for (s, want) in [
            ("20ms", ms(20)),
            ("1.5s", ms(1500)),
            ("250us", Duration::from_micros(250)),
            ("2m", Duration::from_secs(120)),
            ("5", Duration::from_secs(5)),
            ("0", Duration::ZERO),
            ("0.25", ms(250)),
            ("15s", Duration::from_secs(15)),
            ("10m", Duration::from_secs(600)),
            ("1h 30m", Duration::from_secs(5400)),
            (" 30s ", Duration::from_secs(30)),
        ] {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
        for s in ["", "fast", "20parsecs", "1.5.5s", "-1s"] {
            let e = parse_duration(s).unwrap_err();
            assert!(e.contains("is not a duration"), "{s}: {e}");
        }
    }

    #[test]
    fn sizes_are_binary_in_every_spelling() {
        for (s, want) in [
            ("10GiB", 10 << 30),
            ("512MiB", 512 << 20),
            ("4k", 4096),
            ("4K", 4096),
            ("4KB", 4096),
            ("1.5k", 1536),
            ("1.5G", 3 << 29),
            ("1GB", 1 << 30),
            ("256KiB", 256 << 10),
            ("4096", 4096),
            ("12b", 12),
            ("2 MiB", 2 << 20),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        for s in ["", "big", "10 parsecs", "-1k"] {
            let e = parse_size(s).unwrap_err();
            assert!(e.contains("is not a size"), "{s}: {e}");
        }
    }

    #[test]
    fn wan_specs() {
        let spec = parse_wan("latency=20ms,bandwidth=50MiB/s").unwrap();
        assert_eq!(spec.latency, Duration::from_millis(20));
        assert_eq!(spec.bandwidth, Some(50 << 20));
        assert_eq!(parse_wan("bw=1m").unwrap().bandwidth, Some(1 << 20));
        assert!(parse_wan("latency=20parsecs").is_err());
        assert!(parse_wan("speed=1").is_err());
        assert!(parse_wan("bandwidth=0").is_err());
    }
}
