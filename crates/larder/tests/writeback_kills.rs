//! Integration tests of the write-back journal through real FUSE mounts, run as root with /dev/fuse: the
//! daemon killed (SIGKILL) with changes pending. Random workloads killed at random points must leave home
//! as a model of every call that returned; writes the kernel made to a cache file (passthrough) survive a
//! kill before the close, or go with the file when it was removed.
//!
//! Every mount here passes `--write-mode write-back` (the harness defaults to write-through). Changes
//! return once they are durable in the cache dir and reach home after `--sync-lag` or `larder drain`; the
//! tests compare the plain home directory with what the mount showed or with a model of the changes.

mod common;
mod writeback;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use writeback::*;

/// With `LARDER_TEST_KEEP=DIR` set, copy the home and cache dir of `t` under DIR (for a failure that is hard
/// to reproduce); returns where, for the failure message.
fn keep_evidence(t: &TestDir, live: Option<&Mount>) -> String {
    let Some(dir) = std::env::var_os("LARDER_TEST_KEEP") else {
        return "(set LARDER_TEST_KEEP=DIR to keep the home and cache dir of a failure)".into();
    };
    // A daemon still running would go on changing both while they are copied: what is kept is the state
    // it crashed in.
    if let Some(m) = live
        && is_larder_daemon(m.pid)
    {
        signal(m.pid, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(300));
    }
    let dest = PathBuf::from(dir).join(t.root().file_name().expect("temp dir name"));
    let _ = std::fs::create_dir_all(&dest);
    for src in [&t.home, &t.cache] {
        let _ = std::process::Command::new("cp").arg("-a").arg(src).arg(&dest).status();
    }
    format!("home and cache dir kept in {}", dest.display())
}

/// `parent/name`, or `name` at the root.
fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// A random workload of file-system calls on a mount, with a model of what every call that returned did.
struct Workload {
    rng: Rng,
    model: Tree,
    seq: u64,
    umask: u32,
    ops: u64,
    mix: Mix,
    /// Every call made (and every kill), in order.
    history: Vec<String>,
}

/// Which calls a [`Workload`] makes.
#[derive(Clone, Copy, Debug)]
struct Mix {
    /// Renames of files, symlinks and directories.
    renames: bool,
    symlinks: bool,
    /// ftruncate to a size inside the file's last block (O_TRUNC to zero stays in).
    truncates: bool,
    /// List a directory just before removing it (its listing is then fresh in the cache).
    list_before_rmdir: bool,
}

const CHMOD_FILE: [u32; 6] = [0o600, 0o640, 0o644, 0o660, 0o700, 0o755];
const CHMOD_DIR: [u32; 3] = [0o700, 0o750, 0o755];

impl Workload {
    fn dirs(&self) -> Vec<String> {
        std::iter::once(String::new())
            .chain(
                self.model
                    .iter()
                    .filter(|(_, n)| matches!(n, Node::Dir { .. }))
                    .map(|(k, _)| k.clone()),
            )
            .collect()
    }

    fn files(&self) -> Vec<String> {
        self.model
            .iter()
            .filter(|(_, n)| matches!(n, Node::File { .. }))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Regular files and symlinks.
    fn leaves(&self) -> Vec<String> {
        self.model
            .iter()
            .filter(|(_, n)| !matches!(n, Node::Dir { .. }))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn pick(&mut self, v: &[String]) -> Option<String> {
        if v.is_empty() {
            None
        } else {
            Some(v[self.rng.below(v.len() as u64) as usize].clone())
        }
    }

    fn fresh(&mut self, parent: &str, prefix: &str) -> String {
        self.seq += 1;
        join(parent, &format!("{prefix}{}", self.seq))
    }

    fn data_mut(&mut self, rel: &str) -> &mut Vec<u8> {
        match self.model.get_mut(rel) {
            Some(Node::File { data, .. }) => data,
            _ => panic!("{rel} is not a file in the model"),
        }
    }

    /// Run one random call (or a few making up one step, e.g. write then fsync); the model changes only
    /// once they all returned. Returns what was done, or the error.
    fn step(&mut self, mnt: &Path) -> Result<String, String> {
        let r = self.step_inner(mnt);
        self.history.push(match &r {
            Ok(what) => what.clone(),
            Err(e) => format!("FAILED: {e}"),
        });
        r
    }

    /// Note something that is not a call (a kill) in the history.
    fn note(&mut self, what: String) {
        self.history.push(what);
    }

    /// The calls that named `rel` (as a whole path component sequence), with the kills between them.
    fn history_of(&self, rel: &str) -> String {
        let mentions = |line: &str| {
            line.match_indices(rel).any(|(i, _)| {
                let before = line[..i].chars().last();
                let after = line[i + rel.len()..].chars().next();
                before.is_none_or(|c| c == ' ' || c == '/') && after.is_none_or(|c| c == ' ' || c == ':')
            })
        };
        self.history
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("--") || mentions(l))
            .map(|(i, l)| format!("#{i} {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The differences (lines of [`diff_trees`]), each followed by the history of its path.
    fn explain(&self, diffs: &[String]) -> String {
        diffs
            .iter()
            .take(20)
            .map(|d| {
                let rel = d.split_whitespace().nth(1).unwrap_or("").trim_end_matches(':');
                format!("{d}\nits history:\n{}", self.history_of(rel))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn step_inner(&mut self, mnt: &Path) -> Result<String, String> {
        self.ops += 1;
        let files = self.files();
        let dirs = self.dirs();
        let mut roll = self.rng.below(100);
        if !self.mix.renames && (56..=69).contains(&roll) {
            roll = 10; // a create instead
        }
        if !self.mix.truncates && (35..=41).contains(&roll) {
            roll = 20; // an overwrite instead
        }
        if !self.mix.symlinks && roll >= 94 {
            roll = 47; // a mkdir instead
        }
        if files.len() > 60 && roll < 20 {
            roll = 70; // unlink instead of create
        }
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        match roll {
            // Create and write a file; fsync half of the time; close.
            0..=19 => {
                let parent = self.pick(&dirs).expect("the root is always there");
                let rel = self.fresh(&parent, "f");
                let size = if self.rng.below(5) == 0 {
                    16 * 1024 + self.rng.below(400 * 1024) as usize
                } else {
                    self.rng.below(16 * 1024) as usize
                };
                let data = self.rng.bytes(size);
                let fsync = self.rng.below(2) == 0;
                let what = format!("create {rel} ({size} bytes, fsync {fsync})");
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&format!("{what}: open"), e))?;
                f.write_all(&data).map_err(|e| io(&format!("{what}: write"), e))?;
                if fsync {
                    f.sync_all().map_err(|e| io(&format!("{what}: fsync"), e))?;
                }
                close(f).map_err(|e| io(&format!("{what}: close"), e))?;
                self.model.insert(
                    rel,
                    Node::File {
                        data,
                        mode: 0o644 & !self.umask,
                    },
                );
                Ok(what)
            }
            // Overwrite parts of a file (maybe past its end), fsync, close.
            20..=34 => {
                let Some(rel) = self.pick(&files) else {
                    return Ok("no file to overwrite".into());
                };
                let mut model = match &self.model[&rel] {
                    Node::File { data, .. } => data.clone(),
                    _ => unreachable!(),
                };
                let what = format!("overwrite parts of {rel}");
                let f = OpenOptions::new()
                    .write(true)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                for _ in 0..1 + self.rng.below(4) {
                    let off = self.rng.below(model.len() as u64 + 2000) as usize;
                    let chunk = self.rng.bytes_between(1, 32 * 1024);
                    f.write_all_at(&chunk, off as u64).map_err(|e| io(&what, e))?;
                    if model.len() < off + chunk.len() {
                        model.resize(off + chunk.len(), 0);
                    }
                    model[off..off + chunk.len()].copy_from_slice(&chunk);
                }
                f.sync_all().map_err(|e| io(&what, e))?;
                close(f).map_err(|e| io(&what, e))?;
                *self.data_mut(&rel) = model;
                Ok(what)
            }
            // Truncate (shrink or grow).
            35..=41 => {
                let Some(rel) = self.pick(&files) else {
                    return Ok("no file to truncate".into());
                };
                let len = self.data_mut(&rel).len();
                let new_len = self.rng.below(len as u64 + 5000) as usize;
                let what = format!("truncate {rel} from {len} to {new_len}");
                let f = OpenOptions::new()
                    .write(true)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                f.set_len(new_len as u64).map_err(|e| io(&what, e))?;
                close(f).map_err(|e| io(&what, e))?;
                self.data_mut(&rel).resize(new_len, 0);
                Ok(what)
            }
            // Replace a file's whole content (O_TRUNC).
            42..=46 => {
                let Some(rel) = self.pick(&files) else {
                    return Ok("no file to replace".into());
                };
                let data = self.rng.bytes_between(0, 48 * 1024);
                let what = format!("replace {rel} with {} bytes", data.len());
                let mut f = OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                f.write_all(&data).map_err(|e| io(&what, e))?;
                close(f).map_err(|e| io(&what, e))?;
                *self.data_mut(&rel) = data;
                Ok(what)
            }
            // mkdir.
            47..=55 => {
                let parents: Vec<String> = dirs.iter().filter(|d| d.matches('/').count() < 3).cloned().collect();
                if dirs.len() > 20 {
                    return Ok("enough dirs".into());
                }
                let parent = self.pick(&parents).expect("the root is always there");
                let rel = self.fresh(&parent, "d");
                let what = format!("mkdir {rel}");
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(mnt.join(&rel))
                    .map_err(|e| io(&what, e))?;
                self.model.insert(
                    rel,
                    Node::Dir {
                        mode: 0o755 & !self.umask,
                    },
                );
                Ok(what)
            }
            // Rename a file or symlink: to a new name, or over another file.
            56..=64 => {
                let leaves = self.leaves();
                let Some(from) = self.pick(&leaves) else {
                    return Ok("nothing to rename".into());
                };
                let to = if self.rng.below(3) == 0 && files.len() > 1 {
                    let to = self.pick(&files).expect("files");
                    if to == from {
                        return Ok("rename onto itself skipped".into());
                    }
                    to
                } else {
                    let parent = self.pick(&dirs).expect("the root is always there");
                    self.fresh(&parent, "r")
                };
                let what = format!("rename {from} -> {to}");
                std::fs::rename(mnt.join(&from), mnt.join(&to)).map_err(|e| io(&what, e))?;
                let node = self.model.remove(&from).expect("from is in the model");
                self.model.insert(to, node);
                Ok(what)
            }
            // Rename a directory (with what is under it) somewhere outside itself.
            65..=69 => {
                let movable: Vec<String> = dirs.iter().filter(|d| !d.is_empty()).cloned().collect();
                let Some(from) = self.pick(&movable) else {
                    return Ok("no dir to rename".into());
                };
                let inside = format!("{from}/");
                let parents: Vec<String> = dirs
                    .iter()
                    .filter(|p| **p != from && !p.starts_with(&inside) && p.matches('/').count() < 3)
                    .cloned()
                    .collect();
                let parent = self.pick(&parents).expect("the root is always a candidate");
                let to = self.fresh(&parent, "m");
                let what = format!("rename dir {from} -> {to}");
                std::fs::rename(mnt.join(&from), mnt.join(&to)).map_err(|e| io(&what, e))?;
                move_subtree(&mut self.model, &from, &to);
                Ok(what)
            }
            // unlink a file or symlink.
            70..=79 => {
                let leaves = self.leaves();
                let Some(rel) = self.pick(&leaves) else {
                    return Ok("nothing to unlink".into());
                };
                let what = format!("unlink {rel}");
                std::fs::remove_file(mnt.join(&rel)).map_err(|e| io(&what, e))?;
                self.model.remove(&rel);
                Ok(what)
            }
            // rmdir an empty dir.
            80..=85 => {
                let empty: Vec<String> = dirs
                    .iter()
                    .filter(|d| !d.is_empty())
                    .filter(|d| {
                        let inside = format!("{d}/");
                        !self.model.keys().any(|k| k.starts_with(&inside))
                    })
                    .cloned()
                    .collect();
                let Some(rel) = self.pick(&empty) else {
                    return Ok("no empty dir".into());
                };
                let what = format!("rmdir {rel}");
                if self.mix.list_before_rmdir {
                    std::fs::read_dir(mnt.join(&rel))
                        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
                        .map_err(|e| io(&format!("{what}: listing it first"), e))?;
                }
                std::fs::remove_dir(mnt.join(&rel)).map_err(|e| io(&what, e))?;
                self.model.remove(&rel);
                Ok(what)
            }
            // chmod a file or a dir.
            86..=93 => {
                if self.rng.below(4) == 0 {
                    let movable: Vec<String> = dirs.iter().filter(|d| !d.is_empty()).cloned().collect();
                    let Some(rel) = self.pick(&movable) else {
                        return Ok("no dir to chmod".into());
                    };
                    let mode = CHMOD_DIR[self.rng.below(CHMOD_DIR.len() as u64) as usize];
                    let what = format!("chmod {mode:o} dir {rel}");
                    std::fs::set_permissions(mnt.join(&rel), std::fs::Permissions::from_mode(mode))
                        .map_err(|e| io(&what, e))?;
                    self.model.insert(rel, Node::Dir { mode });
                    Ok(what)
                } else {
                    let Some(rel) = self.pick(&files) else {
                        return Ok("no file to chmod".into());
                    };
                    let mode = CHMOD_FILE[self.rng.below(CHMOD_FILE.len() as u64) as usize];
                    let what = format!("chmod {mode:o} {rel}");
                    std::fs::set_permissions(mnt.join(&rel), std::fs::Permissions::from_mode(mode))
                        .map_err(|e| io(&what, e))?;
                    if let Some(Node::File { mode: m, .. }) = self.model.get_mut(&rel) {
                        *m = mode;
                    }
                    Ok(what)
                }
            }
            // symlink.
            _ => {
                let parent = self.pick(&dirs).expect("the root is always there");
                let rel = self.fresh(&parent, "l");
                let target = PathBuf::from(format!("../target-{}", self.seq));
                let what = format!("symlink {rel} -> {}", target.display());
                std::os::unix::fs::symlink(&target, mnt.join(&rel)).map_err(|e| io(&what, e))?;
                self.model.insert(rel, Node::Symlink { target });
                Ok(what)
            }
        }
    }

    /// Read a few model files (and one directory listing) back through the mount.
    fn spot_check(&mut self, mnt: &Path, home: &Path, count: usize) -> Result<(), String> {
        let files = self.files();
        for _ in 0..count.min(files.len()) {
            let rel = self.pick(&files).expect("files");
            let got = std::fs::read(mnt.join(&rel))
                .map_err(|e| format!("read {rel}: {e}\nits history:\n{}", self.history_of(&rel)))?;
            let Node::File { data, .. } = &self.model[&rel] else {
                unreachable!()
            };
            if got != *data {
                let at_home = match std::fs::read(home.join(&rel)) {
                    Ok(h) if h == got => "the same as home has now".to_string(),
                    Ok(h) if h == *data => "while home has the model's".to_string(),
                    Ok(h) => format!("home has {} bytes (fnv {:016x})", h.len(), fnv(&h)),
                    Err(e) => format!("home: {e}"),
                };
                let first = got.iter().zip(data).position(|(a, b)| a != b);
                let zeros = if got.iter().all(|b| *b == 0) {
                    " (all zeros)"
                } else {
                    ""
                };
                return Err(format!(
                    "{rel} reads {} bytes{zeros} (fnv {:016x}) through the mount, the model has {} (fnv {:016x}); \
                     first difference at {first:?}; {at_home}\nits history:\n{}",
                    got.len(),
                    fnv(&got),
                    data.len(),
                    fnv(data),
                    self.history_of(&rel)
                ));
            }
        }
        let dirs = self.dirs();
        let dir = self.pick(&dirs).expect("root");
        let mut got: Vec<String> = match std::fs::read_dir(mnt.join(&dir)) {
            Ok(entries) => entries
                .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) => return Err(format!("list {dir}: {e}\nits history:\n{}", self.history_of(&dir))),
        };
        got.sort();
        let mut want: Vec<String> = self
            .model
            .keys()
            .filter(|k| {
                let parent = k.rsplit_once('/').map_or("", |(p, _)| p);
                parent == dir
            })
            .map(|k| k.rsplit('/').next().expect("name").to_string())
            .collect();
        want.sort();
        if got != want {
            return Err(format!("listing of '{dir}' through the mount: {got:?}, model {want:?}"));
        }
        Ok(())
    }
}

/// Run `mix` on a write-back mount with `durability`, SIGKILL the daemon between calls at random points
/// (20-25 times) and mount again; then drain and compare home with the model of every call that returned.
fn kill_9_workload(name: &'static str, seed: u64, mix: Mix, durability: &'static str) {
    let t = TestDir::new(name);
    let dog = Watchdog::new(Duration::from_secs(240), name);
    let mut rng = Rng::new(seed);
    // A starting home the workload changes too.
    let mut w = Workload {
        rng: Rng::new(seed * 10),
        model: Tree::new(),
        seq: 0,
        umask: umask(),
        ops: 0,
        mix,
        history: Vec::new(),
    };
    for i in 0..6 {
        let rel = format!("h{i}.bin");
        let data = write_random(&t.home.join(&rel), 1 + rng.below(100_000) as usize, &mut rng);
        std::fs::set_permissions(t.home.join(&rel), std::fs::Permissions::from_mode(0o644)).unwrap();
        w.model.insert(rel, Node::File { data, mode: 0o644 });
    }
    std::fs::create_dir(t.home.join("hd")).unwrap();
    std::fs::set_permissions(t.home.join("hd"), std::fs::Permissions::from_mode(0o755)).unwrap();
    w.model.insert("hd".into(), Node::Dir { mode: 0o755 });
    let data = write_random(&t.home.join("hd/inner.bin"), 30_000, &mut rng);
    std::fs::set_permissions(t.home.join("hd/inner.bin"), std::fs::Permissions::from_mode(0o644)).unwrap();
    w.model.insert("hd/inner.bin".into(), Node::File { data, mode: 0o644 });

    let lag_of = |kill: u32| if kill.is_multiple_of(2) { "0s" } else { "1s" };
    let args = |kill: u32| {
        [
            "--sync-lag",
            lag_of(kill),
            "--flush-threads",
            "4",
            "--validity-lag",
            "15s",
            "--durability",
            durability,
        ]
    };
    let mut m = wb_mount(&t, &args(0));
    dog.watch(&m);
    let started = Instant::now();
    let mut kills = 0u32;
    let mut last_ops: Vec<String> = Vec::new();
    let mut pending_at_kill = Vec::new();
    while kills < 25 && started.elapsed() < Duration::from_secs(120) {
        let run_for = Duration::from_millis(50 + rng.below(351));
        let until = Instant::now() + run_for;
        let mut n = 0;
        while n == 0 || Instant::now() < until {
            match w.step(&m.mnt) {
                Ok(what) => {
                    last_ops.push(what);
                    if last_ops.len() > 30 {
                        last_ops.remove(0);
                    }
                }
                Err(e) => panic!(
                    "after {kills} kills, op #{} failed: {e}\nlast ops:\n{}\n{}\n--- daemon log ---\n{}",
                    w.ops,
                    last_ops.join("\n"),
                    keep_evidence(&t, Some(&m)),
                    m.log()
                ),
            }
            n += 1;
        }
        // Between calls, never during one: every call in the model returned.
        pending_at_kill.push(pending(&m));
        kills += 1;
        last_ops.push(format!("-- kill #{kills} and remount (sync lag {}) --", lag_of(kills)));
        w.note(last_ops.last().expect("just pushed").clone());
        m = kill_and_remount(&t, m, &args(kills));
        dog.watch(&m);
        if let Err(e) = w.spot_check(&m.mnt, &t.home, 4) {
            panic!(
                "after kill #{kills} and remount: {e}\nlast ops before the kill:\n{}\n{}\n--- daemon log ---\n{}",
                last_ops.join("\n"),
                keep_evidence(&t, Some(&m)),
                m.log()
            );
        }
    }
    eprintln!(
        "{kills} kills in {:?}, {} ops; pending ops at each kill: {pending_at_kill:?}",
        started.elapsed(),
        w.ops
    );
    assert!(kills >= 20, "only {kills} kills in the time budget");
    assert!(
        pending_at_kill.iter().filter(|p| **p > 0).count() >= 5,
        "too few kills landed with changes pending ({pending_at_kill:?}): the test is not testing anything"
    );

    drain_ok(&m, 120);
    let st = m.status();
    assert_eq!(num(&st, "/journal/pending_ops"), 0, "{}", st["journal"]);
    let diffs = diff_trees(&snapshot(&m.mnt), &w.model);
    if !diffs.is_empty() {
        panic!(
            "the mount after the last remount and drain differs from the model:\n{}\n{}\n--- daemon log ---\n{}",
            w.explain(&diffs),
            keep_evidence(&t, None),
            m.log()
        );
    }
    assert_eq!(
        (num(&st, "/journal/conflicts"), num(&st, "/journal/failed_ops")),
        (0, 0),
        "the kills caused conflicts or failed ops: {}\n{}",
        st["journal"],
        larder(&["conflicts", s(&m.mnt), "--json"]).stdout
    );
    m.unmount();
    let diffs = diff_trees(&snapshot(&t.home), &w.model);
    if !diffs.is_empty() {
        panic!(
            "home after {kills} kill -9s and a drain differs from the model:\n{}\n{}",
            w.explain(&diffs),
            keep_evidence(&t, None)
        );
    }
}

#[test]
fn kill_9_at_random_points_loses_nothing_acknowledged() {
    let mix = Mix {
        renames: true,
        symlinks: true,
        truncates: true,
        list_before_rmdir: false,
    };
    kill_9_workload("wb-kill9", 303, mix, "process");
}

/// The same workload with every change fsynced before it returns.
#[test]
fn kill_9_at_random_points_at_power_durability_loses_nothing_acknowledged() {
    let mix = Mix {
        renames: true,
        symlinks: true,
        truncates: true,
        list_before_rmdir: false,
    };
    kill_9_workload("wb-kill9-power", 323, mix, "power");
}

/// The same without the calls that hit the bugs above: no renames, no symlinks, no truncation inside a
/// block (O_TRUNC stays), and a directory is listed before it is removed. What remains (creates, writes,
/// overwrites, fsyncs, chmods, mkdirs, unlinks, rmdirs) must survive the kills.
#[test]
fn kill_9_at_random_points_without_renames_loses_nothing_acknowledged() {
    let mix = Mix {
        renames: false,
        symlinks: false,
        truncates: false,
        list_before_rmdir: true,
    };
    kill_9_workload("wb-kill9-norename", 313, mix, "process");
}

/// A writer the kernel serves from the cache file (passthrough) writes there without a call to the daemon:
/// a SIGKILL of the daemon before the writer's close must not lose what the kernel acknowledged, nor leave
/// the cache showing bytes home never gets. The next start takes those writes in and pushes them.
#[test]
fn writes_the_kernel_made_to_a_cache_file_survive_a_kill_before_the_close() {
    if !kernel_has_passthrough() {
        eprintln!("skipped: this kernel has no FUSE passthrough");
        return;
    }
    use std::os::unix::fs::FileExt;
    let t = TestDir::new("wb-kill-pt");
    let mut rng = Rng::new(91);
    let mut want = write_random(&t.home.join("f.bin"), 2 << 20, &mut rng);
    let m = wb_mount(&t, &["--sync-lag", "60s", "--validity-lag", "60s"]);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "cold read");
    // The kernel releases the reader's handle after its close returns; passthrough waits for that.
    m.wait_released();
    let reads = num(&m.status(), "/efficiency/reads");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f.bin"))
        .unwrap();
    let write = |want: &mut Vec<u8>, off: usize, chunk: &[u8]| {
        f.write_all_at(chunk, off as u64).unwrap();
        if want.len() < off + chunk.len() {
            want.resize(off + chunk.len(), 0);
        }
        want[off..off + chunk.len()].copy_from_slice(chunk);
    };
    write(&mut want, 100, &rng.bytes(1000));
    let mut back = vec![0u8; 1100];
    f.read_exact_at(&mut back, 0).unwrap();
    assert_same_bytes(&back, &want[..1100], "read back through the writer");
    // (Starting a process flushes the writer: its copy of the descriptor closes at exec.)
    assert_eq!(
        num(&m.status(), "/efficiency/reads"),
        reads,
        "the daemon served a read of a file whole in the cache: no passthrough"
    );
    // Written after that flush: the daemon never sees these before it dies.
    for (off, len) in [(4096usize, 5000usize), ((1 << 20) + 3, 70_000), ((2 << 20) - 10, 100)] {
        write(&mut want, off, &rng.bytes(len));
    }
    // Killed with the writer still open: its close never reaches the daemon.
    let m = kill_and_remount(&t, m, &["--sync-lag", "0s", "--validity-lag", "60s"]);
    drop(f);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "the mount after the restart");
    drain_ok(&m, 30);
    assert_same_bytes(
        &std::fs::read(t.home.join("f.bin")).unwrap(),
        &want,
        "home after the drain",
    );
    m.unmount();
}

/// A file the kernel serves from its cache file, written there and removed while still open (SQLite's
/// `-wal` file at the end of a session), then the daemon killed before the close: after the remount the
/// file is gone, as it would be on a local file system after a crash. Its writes the daemon never saw
/// must not be taken in and pushed after its removal (to a name home no longer has: a conflict copy).
#[test]
fn a_file_removed_while_written_by_the_kernel_is_gone_after_a_kill() {
    if !kernel_has_passthrough() {
        eprintln!("skipped: this kernel has no FUSE passthrough");
        return;
    }
    use std::os::unix::fs::FileExt;
    let t = TestDir::new("wb-kill-unlinked");
    let mut rng = Rng::new(92);
    write_random(&t.home.join("f.bin"), 300_000, &mut rng);
    write_random(&t.home.join("keep.bin"), 1000, &mut rng);
    let m = wb_mount(&t, &["--sync-lag", "0s", "--validity-lag", "60s"]);
    let _ = read(&m.path("f.bin"));
    m.wait_released();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f.bin"))
        .unwrap();
    f.write_all_at(&rng.bytes(5000), 100).unwrap();
    std::fs::remove_file(m.path("f.bin")).unwrap();
    drain_ok(&m, 30);
    assert!(!t.home.join("f.bin").exists(), "the removal reached home");
    // Written again after the removal, through the kernel alone; then the daemon dies, the file open.
    f.write_all_at(&rng.bytes(7000), 9000).unwrap();
    let m = kill_and_remount(&t, m, &["--sync-lag", "0s", "--validity-lag", "60s"]);
    drop(f);
    drain_ok(&m, 30);
    let st = m.status();
    assert_eq!(num(&st, "/journal/conflicts"), 0, "{}", st["journal"]);
    assert_eq!(names(&m.mnt), ["keep.bin"], "the mount after the restart");
    assert_eq!(names(&t.home), ["keep.bin"], "home after the drain");
    m.unmount();
}
