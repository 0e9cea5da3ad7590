//! `larder drain` and `larder conflicts`: the client side of the write-back journal.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::cli::{ConflictsArgs, DrainArgs};
use crate::control::{Drained, Request, Response};
use crate::status::HomeState;
use crate::{control, mounts, progress, status};

/// Push everything queued at `mnt` to home, waiting up to `timeout`; a progress line on a terminal.
pub fn drain_mount(mnt: &Path, timeout: Duration) -> Result<()> {
    let socket = mounts::daemon_socket(mnt)?;
    let deadline = Instant::now() + timeout;
    // Changes waiting at the start, or since, whichever is more: the bar's length.
    let mut total = status::fetch(mnt)?.journal.pending_ops;
    let bar = progress::bar(total, progress::DRAIN, format!("{total} changes left"));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = left.min(Duration::from_secs(1));
        let request = Request::Drain {
            wait_ms: step.as_millis() as u64,
        };
        let (drained, v) = match control::send(&socket, &request, Some(Duration::from_secs(10)))? {
            Response::Drain { drained, status } => (drained, status),
            other => return Err(control::unexpected("drain", &other)),
        };
        let pending = v.journal.pending_ops;
        let online = v.home.state == HomeState::Online;
        total = total.max(pending);
        bar.set_length(total);
        bar.set_position(total - pending);
        bar.set_message(format!(
            "{pending} changes left, {} dirty{}",
            status::human_bytes(v.journal.dirty_bytes),
            if online { "" } else { " (home offline)" }
        ));
        if pending == 0 {
            return Ok(());
        }
        if drained == Drained::Refused {
            let refused: Vec<String> = v.journal.refused.iter().map(status::describe_refused).collect();
            bail!(
                "home refused {} change{} ({pending} wait in all; the others are queued behind them): {}",
                refused.len(),
                if refused.len() == 1 { "" } else { "s" },
                refused.join("; ")
            );
        }
        if Instant::now() >= deadline {
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
    let (conflicts, failed_ops) = match control::send(
        &mounts::daemon_socket(&mnt)?,
        &Request::Conflicts,
        Some(Duration::from_secs(10)),
    )? {
        Response::Conflicts { conflicts, failed_ops } => (conflicts, failed_ops),
        other => return Err(control::unexpected("conflicts", &other)),
    };
    if args.json {
        let v = serde_json::json!({ "conflicts": conflicts, "failed_ops": failed_ops });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if conflicts.is_empty() {
        println!("no conflicts");
    }
    for c in conflicts {
        println!(
            "{}  {}  {}  -> {}{}",
            c.time,
            c.policy,
            c.path,
            c.kept_at,
            if c.complete {
                ""
            } else {
                "  (incomplete: uncached blocks are zeros)"
            }
        );
    }
    Ok(())
}
