//! `larder drain` and `larder conflicts`: the client side of the write-back journal.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::Value;

use crate::cli::{ConflictsArgs, DrainArgs};
use crate::{control, mounts, status};

/// Push everything queued at `mnt` to home, waiting up to `timeout`; a progress line on a terminal.
pub fn drain_mount(mnt: &Path, timeout: Duration) -> Result<()> {
    let socket = mounts::socket_path(mnt);
    let deadline = Instant::now() + timeout;
    let tty = std::io::stderr().is_terminal();
    let first = status::fetch(mnt)?;
    let total = first
        .pointer("/journal/pending_ops")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .max(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = left.min(Duration::from_secs(1));
        let v = control::request(&socket, &format!("drain {}", step.as_millis()))?;
        let pending = v.pointer("/journal/pending_ops").and_then(Value::as_u64).unwrap_or(0);
        let online = v.pointer("/home/state").and_then(Value::as_str) == Some("online");
        if tty {
            let done = total.saturating_sub(pending);
            let width = 30;
            let filled = (done * width / total) as usize;
            eprint!(
                "\r[{}{}] {pending} changes left, {} dirty{}   ",
                "#".repeat(filled),
                "-".repeat(width as usize - filled),
                status::human_bytes(v.pointer("/journal/dirty_bytes").and_then(Value::as_u64).unwrap_or(0)),
                if online { "" } else { " (home offline)" }
            );
            let _ = std::io::stderr().flush();
        }
        if pending == 0 {
            if tty {
                eprintln!();
            }
            return Ok(());
        }
        if v["drained"] == "refused" {
            if tty {
                eprintln!();
            }
            let refused: Vec<String> = v
                .pointer("/journal/refused")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(status::describe_refused)
                .collect();
            bail!(
                "home refused {} change{} ({pending} wait in all; the others are queued behind them): {}",
                refused.len(),
                if refused.len() == 1 { "" } else { "s" },
                refused.join("; ")
            );
        }
        if Instant::now() >= deadline {
            if tty {
                eprintln!();
            }
            bail!(
                "{pending} changes still wait for home after {timeout:?}{}",
                if online { "" } else { " (home is offline)" }
            );
        }
    }
}

/// `larder drain`.
pub fn drain(args: DrainArgs) -> Result<()> {
    let mnt = mounts::absolute(&args.mountpoint)?;
    drain_mount(&mnt, args.timeout)?;
    println!("every change at {} reached home", mnt.display());
    Ok(())
}

/// `larder conflicts`.
pub fn conflicts(args: ConflictsArgs) -> Result<()> {
    let mnt = mounts::absolute(&args.mountpoint)?;
    if mounts::mounted_at(&mnt) != mounts::Mounted::Larder {
        bail!("{} is not a larder mount", mnt.display());
    }
    let v = control::request(&mounts::socket_path(&mnt), "conflicts")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let list = v["conflicts"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no conflicts");
    }
    for c in list {
        let s = |k: &str| c[k].as_str().unwrap_or("?").to_string();
        println!(
            "{}  {}  {}  -> {}{}",
            s("time"),
            s("policy"),
            s("path"),
            s("kept_at"),
            if c["complete"].as_bool() == Some(false) {
                "  (incomplete: uncached blocks are zeros)"
            } else {
                ""
            }
        );
    }
    Ok(())
}
