//! How a status is printed: `larder status` (a line per figure, or the JSON document) and `larder cluster
//! members`.

use anyhow::{Result, bail};
use larder_fs::RefusedChange;

use super::{HomeState, fetch};
use crate::cli::StatusArgs;
use crate::{control, mounts};

/// Bytes as a short human figure.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// One refused change of a status's `journal.refused`: "create a/b: home's answer (3 attempts)".
pub fn describe_refused(r: &RefusedChange) -> String {
    format!(
        "{} {}: {} ({} attempt{})",
        r.op,
        r.path,
        r.error,
        r.attempts,
        if r.attempts == 1 { "" } else { "s" }
    )
}

/// `larder status`.
pub fn run(args: StatusArgs) -> Result<()> {
    let v = fetch(&args.mountpoint)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let (hits, misses) = (v.cache.hits, v.cache.misses);
    let rate = if hits + misses == 0 {
        0.0
    } else {
        100.0 * hits as f64 / (hits + misses) as f64
    };
    let limit = v.cache.bytes_limit.max(1);
    let rows = [
        (
            "mount",
            format!(
                "{} (pid {}, up {:.0}s)",
                v.mountpoint.display(),
                v.pid,
                v.uptime_seconds
            ),
        ),
        (
            "home",
            format!(
                "{} ({})",
                v.home.url,
                match v.home.state {
                    HomeState::Online => "online",
                    HomeState::Offline => "offline",
                }
            ),
        ),
        ("home ops", format!("{} ({} failed)", v.home.ops, v.home.errors)),
        (
            "inodes",
            format!(
                "{} in memory; {} left memory for the index, {} loaded back, {} the kernel was asked to forget",
                v.fs.inodes, v.fs.inodes_reclaimed, v.fs.inodes_reloaded, v.fs.inodes_trimmed
            ),
        ),
        (
            "home metadata",
            format!(
                "per second over {:.0}s: {:.1} lookups, {:.1} listings, {:.1} revalidations, {:.1} creates \
                 (in all: {} lookups, {} listings of which {} for a lookup, {} to revalidate and {} ahead of a \
                 walk, {} revalidations, {} creates)",
                v.metadata.rate_window_seconds,
                v.metadata.lookups_per_second,
                v.metadata.listings_per_second,
                v.metadata.revalidations_per_second,
                v.metadata.creates_per_second,
                v.metadata.lookups,
                v.metadata.listings,
                v.metadata.listings_for_lookups,
                v.metadata.listings_for_revalidation,
                v.metadata.listings_ahead,
                v.metadata.revalidations,
                v.metadata.creates
            ),
        ),
        (
            "home bytes",
            format!(
                "{} read, {} written{}",
                human_bytes(v.home.bytes_read),
                human_bytes(v.home.bytes_written),
                v.home.rewrites.map_or(String::new(), |r| format!(
                    " (rewrites: {} sent, {} received, {} copied at home)",
                    human_bytes(r.sent),
                    human_bytes(r.received),
                    human_bytes(r.copied)
                ))
            ),
        ),
        (
            "cache",
            format!(
                "{} of {} ({:.1}%), {} dirty",
                human_bytes(v.cache.bytes_used),
                human_bytes(v.cache.bytes_limit),
                100.0 * v.cache.bytes_used as f64 / limit as f64,
                human_bytes(v.cache.bytes_dirty)
            ),
        ),
        (
            "stored",
            format!(
                "{} of file data in {} on disk ({} saved: {} files share {} copies), {} pinned",
                human_bytes(v.cache.logical_bytes),
                human_bytes(v.cache.bytes_used),
                human_bytes(v.cache.dedup.saved_bytes),
                v.cache.dedup.files,
                v.cache.dedup.contents,
                human_bytes(v.cache.bytes_pinned)
            ),
        ),
        ("files cached", v.files_cached.to_string()),
        ("hits / misses", format!("{hits} / {misses} ({rate:.1}% hits)")),
        ("evictions", v.cache.evictions.to_string()),
        (
            "journal",
            format!(
                "{}, {} durability ({} changes waiting, {} dirty, oldest {:.1}s, {} conflicts, {} refused)",
                v.write_mode,
                v.durability,
                v.journal.pending_ops,
                human_bytes(v.journal.dirty_bytes),
                v.journal.oldest_age_seconds,
                v.journal.conflicts,
                v.journal.failed_ops
            ),
        ),
        ("cache dir", v.cache.dir.display().to_string()),
    ];
    for (k, val) in rows {
        println!("{k:<14} {val}");
    }
    for d in &v.cache.damaged_files {
        println!(
            "{:<14} /{}: changes not yet at home were damaged in the cache ({} blocks); reads of them fail \
             and it is not pushed until written again or removed",
            "DAMAGED",
            d.path,
            d.blocks.len()
        );
    }
    if let Some(p) = &v.peers {
        println!(
            "{:<14} asked {}: {} hits, {} misses, {} failed, {} skipped; served {} ({}), refused {}; \
             migrated {} ({}), took {}",
            "peers",
            p.fetches,
            p.hits,
            p.misses,
            p.failures,
            p.skipped,
            p.served,
            human_bytes(p.served_bytes),
            p.refused,
            p.migrated,
            human_bytes(p.migrated_bytes),
            p.taken
        );
    }
    if let Some(b) = &v.bank {
        let s = &b.stats;
        println!(
            "{:<14} {}: {} gets, {} hits, {} errors, {} failed checks; {} kept ({}), {} dropped; {} of {} \
             servers skipped",
            "bank",
            b.url,
            s.gets,
            s.hits,
            s.errors,
            s.bad,
            s.puts - s.put_errors,
            human_bytes(s.bytes_written),
            s.dropped,
            s.servers_down,
            s.servers
        );
    }
    if let Some(c) = &v.cluster {
        let live = c.members.iter().filter(|m| m.live).count();
        println!(
            "{:<14} {} as {} ({}): {live} of {} members live; etcd {}{}",
            "cluster",
            c.name,
            c.node_name,
            c.node,
            c.members.len(),
            if c.etcd_online {
                "online"
            } else {
                "away (last view kept)"
            },
            if c.lease_ok {
                ""
            } else {
                "; liveness not renewed lately"
            }
        );
        println!(
            "{:<14} owns {} units ({}) of what it holds; holds changes of {} paths for the others, \
             reads {} held elsewhere",
            "",
            c.owned_units,
            human_bytes(c.owned_bytes),
            c.held_here,
            c.held_elsewhere
        );
    }
    if v.tiers.walk.len() > 2 {
        let walk: Vec<String> = v
            .tiers
            .walk
            .iter()
            .map(|t| {
                format!(
                    "{} {} hits ({}), {:.0} µs mean",
                    t.name,
                    t.hits,
                    human_bytes(t.bytes),
                    t.mean_us
                )
            })
            .collect();
        println!("{:<14} {}", "walk", walk.join("; "));
    }
    for r in &v.journal.refused {
        println!("{:<14} {}", "refused", describe_refused(r));
    }
    Ok(())
}

/// `larder cluster members MNT`: the members of the cluster the mount is in, as its node sees them.
pub fn members(mountpoint: &std::path::Path, json: bool, all: bool) -> Result<()> {
    let socket = mounts::daemon_socket(&mounts::absolute(mountpoint)?)?;
    let status = control::status(&socket)?;
    let Some(mut c) = status.cluster else {
        bail!(
            "{} is not in a cluster (mounted without --cluster)",
            mountpoint.display()
        );
    };
    if !all {
        // Live members, the leaving among them; gone ones only when asked for.
        c.members.retain(|m| m.live);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(());
    }
    println!("cluster {} (view at etcd revision {})", c.name, c.revision);
    println!(
        "{:<16} {:<20} {:<22} {:>10} {:<8} {:<6} {:>10}",
        "id", "name", "address", "weight", "live", "serves", "free"
    );
    for m in &c.members {
        println!(
            "{:<16} {:<20} {:<22} {:>10} {:<8} {:<6} {:>10}{}",
            m.id,
            m.name,
            if m.addr.is_empty() { "-" } else { &m.addr },
            human_bytes(m.weight),
            match (m.live, m.leaving) {
                (true, true) => "leaving",
                (true, false) => "yes",
                _ => "no",
            },
            if m.serves { "yes" } else { "no" },
            if m.live { human_bytes(m.free) } else { "-".into() },
            if m.this_node { "  (this node)" } else { "" }
        );
    }
    Ok(())
}
