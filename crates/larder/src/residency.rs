//! `larder prefetch`, `pin`, `unpin` and `evict`: the command walks the paths through the mount (which
//! caches their metadata), then asks the daemon to act on the files found, a batch at a time.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use larder_fs::Fs;

use crate::cli::ResidencyArgs;
use crate::control::{FileResidency, Request, ResidencyAction, Response};
use crate::status::human_bytes;
use crate::{control, mounts, progress};

/// Files per request, and bytes per request (a batch is cut at whichever comes first).
const BATCH_FILES: usize = 64;
const BATCH_BYTES: u64 = 256 << 20;

/// The daemon's side: act on the files with inode numbers `inos`.
pub fn serve(fs: &Arc<Fs>, action: ResidencyAction, inos: &[u64]) -> Response {
    let results = match action {
        ResidencyAction::Prefetch => fs.prefetch(inos),
        ResidencyAction::Pin => fs.pin(inos, true),
        ResidencyAction::Unpin => fs.pin(inos, false),
        ResidencyAction::Evict => fs.evict(inos),
    };
    let results = results
        .into_iter()
        .map(|r| match r {
            Ok(r) => Ok(FileResidency {
                size: r.size,
                cached: r.cached,
                moved: r.moved,
                pinned: r.pinned,
            }),
            Err(e) => Err(larder_fs::describe_residency_error(&e)),
        })
        .collect();
    Response::Residency { results }
}

/// The larder mount that holds `path`: its nearest ancestor (or itself) that is one.
fn mount_of(path: &Path) -> Result<PathBuf> {
    let abs = mounts::absolute(path)?;
    let mut at = Some(abs.as_path());
    while let Some(p) = at {
        if mounts::mounted_at(p) == mounts::Mounted::Larder {
            return Ok(p.to_path_buf());
        }
        at = p.parent();
    }
    bail!("{} is not inside a larder mount", path.display())
}

struct Target {
    path: PathBuf,
    ino: u64,
    size: u64,
}

/// The files named by `args`: each file, the files in each directory, and with `--recursive` everything
/// below. Symbolic links are not followed. Every directory is listed and every entry looked up through
/// the mount, which is what caches their metadata.
fn walk(args: &ResidencyArgs, mount: &Path, out: &mut Vec<Target>, dirs: &mut u64) -> Result<()> {
    let mut stack: Vec<(PathBuf, bool)> = Vec::new();
    for p in &args.paths {
        let abs = mounts::absolute(p)?;
        if !abs.starts_with(mount) {
            bail!(
                "{} and {} are on different mounts",
                args.paths[0].display(),
                p.display()
            );
        }
        let meta = std::fs::symlink_metadata(&abs).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        if meta.is_dir() {
            stack.push((abs, true));
        } else if meta.is_file() {
            out.push(Target {
                path: abs,
                ino: meta.ino(),
                size: meta.len(),
            });
        }
    }
    while let Some((dir, named)) = stack.pop() {
        *dirs += 1;
        let entries = std::fs::read_dir(&dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry?;
            let meta = std::fs::symlink_metadata(entry.path())?;
            if meta.is_dir() {
                if args.recursive {
                    stack.push((entry.path(), false));
                }
            } else if meta.is_file() && (named || args.recursive) {
                out.push(Target {
                    path: entry.path(),
                    ino: meta.ino(),
                    size: meta.len(),
                });
            }
        }
    }
    Ok(())
}

/// `larder prefetch|pin|unpin|evict PATH...`.
pub fn run(action: ResidencyAction, args: ResidencyArgs) -> Result<()> {
    let cmd = action.as_str();
    let started = Instant::now();
    let mount = mount_of(&args.paths[0])?;
    let socket = mounts::daemon_socket(&mount)?;
    let mut targets = Vec::new();
    let mut dirs = 0;
    walk(&args, &mount, &mut targets, &mut dirs)?;
    let total_bytes: u64 = targets.iter().map(|t| t.size).sum();
    let (mut done, mut done_bytes, mut moved, mut cached) = (0usize, 0u64, 0u64, 0u64);
    let mut failures: Vec<String> = Vec::new();
    let mut kept_pinned = 0;
    if !(action == ResidencyAction::Prefetch && args.metadata_only) {
        let bar = progress::bar(total_bytes, progress::RESIDENCY, format!("0/{} files", targets.len()));
        bar.set_prefix(cmd);
        let mut i = 0;
        while i < targets.len() {
            let mut end = i;
            let mut bytes = 0;
            while end < targets.len() && end - i < BATCH_FILES && (end == i || bytes + targets[end].size <= BATCH_BYTES)
            {
                bytes += targets[end].size;
                end += 1;
            }
            let batch = &targets[i..end];
            let request = Request::Residency {
                action,
                inos: batch.iter().map(|t| t.ino).collect(),
            };
            // A batch takes as long as home needs to give its bytes: no timeout but the daemon's own.
            let results = match control::send(&socket, &request, None)? {
                Response::Residency { results } => results,
                other => return Err(control::unexpected(cmd, &other)),
            };
            for (t, r) in batch.iter().zip(results) {
                match r {
                    Err(e) => failures.push(format!("{}: {e}", t.path.display())),
                    Ok(r) => {
                        moved += r.moved;
                        cached += r.cached;
                        if action == ResidencyAction::Evict && r.pinned {
                            kept_pinned += 1;
                        }
                    }
                }
            }
            done += batch.len();
            done_bytes += bytes;
            i = end;
            bar.set_position(done_bytes);
            bar.set_message(format!("{done}/{} files", targets.len()));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let what = match action {
        ResidencyAction::Prefetch if args.metadata_only => {
            format!("metadata of {} files in {dirs} directories cached", targets.len())
        }
        ResidencyAction::Prefetch => format!("{} from home, {} cached", human_bytes(moved), human_bytes(cached)),
        ResidencyAction::Pin => format!(
            "{} from home, {} pinned and cached",
            human_bytes(moved),
            human_bytes(cached)
        ),
        ResidencyAction::Unpin => format!("{} cached, now evictable", human_bytes(cached)),
        ResidencyAction::Evict => format!(
            "{} dropped, {} still cached{}",
            human_bytes(moved),
            human_bytes(cached),
            if kept_pinned > 0 {
                format!(" ({kept_pinned} pinned or open files kept)")
            } else {
                String::new()
            }
        ),
    };
    println!(
        "{cmd}: {} files ({}): {what}; {} failed; {secs:.1} s",
        targets.len(),
        human_bytes(total_bytes),
        failures.len()
    );
    for f in failures.iter().take(20) {
        eprintln!("larder {cmd}: {f}");
    }
    if failures.len() > 20 {
        eprintln!("larder {cmd}: ... and {} more", failures.len() - 20);
    }
    if !failures.is_empty() {
        bail!("{} of {} files failed", failures.len(), targets.len());
    }
    Ok(())
}
