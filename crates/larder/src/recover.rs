//! A cache directory whose index is lost or damaged: refused at mount while it holds changes not yet at
//! home, and `larder recover CACHE_DIR --to DIR`, which saves every one of them (design note 002, "A lost
//! index").
//!
//! What holds changes not yet at home is read from the index where it still opens (salvaging what its log
//! can give: `Db::open_salvaging`), and from the labels the cache files carry beside it
//! (`larder_cache::unpushed`) where it does not. Each file is copied to `DIR/<its path in the mount>` with
//! its mode and time, and `DIR/larder-recovered.json` lists them, with every change the journal still
//! held (renames, removals, new directories: those cannot be saved as files; the list says what they
//! were). A damaged or lost index is then set aside (`index.redb.damaged-TIME`) and the saved files'
//! labels taken off, so that the next mount starts with an empty cache; an intact index is left as it is.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use larder_cache::unpushed::{self, IndexFound};
use larder_cache::{CacheError, Db};
use serde::Serialize;

use crate::cli::RecoverArgs;

/// The command that saves what `cache` holds, for messages.
fn command(cache: &Path) -> String {
    format!("`larder recover {} --to DIR`", cache.display())
}

/// Refuse a cache directory whose index is missing or empty while its cache files hold changes not yet at
/// home (labelled): one line naming the problem and the command that saves them. Without any, a lost index
/// is a cache that starts empty (said in the log).
pub fn check_index(cache: &Path) -> Result<()> {
    let found = unpushed::index_found(cache);
    if found == IndexFound::Present {
        return Ok(());
    }
    let labelled = unpushed::scan(&cache.join("objects"));
    let how = if found == IndexFound::Missing {
        "missing"
    } else {
        "empty"
    };
    if !labelled.is_empty() {
        bail!(
            "the cache index {} is {how} while the cache holds changes not yet at home of {} files; nothing was \
             mounted: {} saves them, then mount again",
            cache.join("index.redb").display(),
            labelled.len(),
            command(cache)
        );
    }
    if cache.join("objects").exists() {
        tracing::warn!(
            "the cache index was {how}: no changes were waiting for home (no cache file is labelled as holding \
             any); the cache starts empty"
        );
    }
    Ok(())
}

/// The error for an index that does not open: with the command that saves what the cache holds when its
/// files say they hold changes not yet at home, or when the index itself says it lost some.
pub fn index_error(cache: &Path, e: &CacheError) -> anyhow::Error {
    let labelled = unpushed::scan(&cache.join("objects")).len();
    let damaged = matches!(e, CacheError::IndexDamaged(_));
    if labelled > 0 || damaged {
        anyhow!(
            "cache index in {}: {e}; nothing was mounted: {} saves every change not yet at home it still holds \
             ({labelled} files labelled), and sets the index aside",
            cache.display(),
            command(cache)
        )
    } else {
        anyhow!("cache index in {}: {e}", cache.display())
    }
}

/// One file saved.
#[derive(Debug, Serialize)]
struct Saved {
    /// Its path in the mount.
    path: String,
    /// Where it was saved.
    saved_as: PathBuf,
    size: u64,
    /// All of its content is its own (else bytes outside its changes are what the cache held of home's).
    whole: bool,
    /// Where it was known from: `index` or `label`.
    from: &'static str,
}

/// What `larder recover` did, as `larder-recovered.json` and `--json` say.
#[derive(Debug, Serialize)]
struct Report {
    cache_dir: PathBuf,
    /// `intact`, `missing`, `empty`, or `damaged: ...`.
    index: String,
    saved: Vec<Saved>,
    /// Files that could not be saved, and why.
    failed: Vec<(String, String)>,
    /// Every change the journal held (kind, path), files' included.
    queued: Vec<(String, String)>,
    /// Where a damaged or lost index went.
    index_set_aside: Option<PathBuf>,
}

/// `larder recover CACHE_DIR --to DIR`.
pub fn run(args: RecoverArgs) -> Result<()> {
    let cache = crate::mounts::absolute(&args.cache_dir)?;
    if !cache.join("objects").is_dir() && !cache.join("index.redb").exists() {
        bail!(
            "{} is not a larder cache directory (no objects/ nor index.redb)",
            cache.display()
        );
    }
    let to = crate::mounts::absolute(&args.to)?;
    if to.starts_with(&cache) {
        bail!("{} is inside the cache directory {}", to.display(), cache.display());
    }
    if to.exists() && std::fs::read_dir(&to).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("{} is not an empty directory", to.display());
    }
    let _lock = crate::daemon::lock_cache_dir(&cache, None).context("(unmount it first)")?;
    let objects = cache.join("objects");
    // The index, where it opens: what it says, and what its log could not give.
    let (index_state, from_index) = match unpushed::index_found(&cache) {
        IndexFound::Missing => ("missing".to_string(), None),
        IndexFound::Empty => ("empty".to_string(), None),
        IndexFound::Present => match Db::open_salvaging(&cache.join("index.redb")) {
            Ok((db, lost)) => {
                let found = larder_fs::recovery::unpushed(&db).map_err(|e| anyhow!("reading the index: {e}"));
                let _ = db.close();
                let state = if lost > 0 {
                    format!("damaged: {lost} records of its log could not be read")
                } else {
                    "intact".to_string()
                };
                (state, Some(found?))
            }
            Err(e) => (format!("damaged: {e}"), None),
        },
    };
    std::fs::create_dir_all(&to).with_context(|| format!("cannot make {}", to.display()))?;
    let mut report = Report {
        cache_dir: cache.clone(),
        index: index_state.clone(),
        saved: Vec::new(),
        failed: Vec::new(),
        queued: Vec::new(),
        index_set_aside: None,
    };
    let mut taken: HashSet<PathBuf> = HashSet::new();
    let object_file = |object: u64| {
        objects
            .join(format!("{:02x}", object & 0xff))
            .join(format!("{object:016x}"))
    };
    if let Some(found) = &from_index {
        report.queued = found.queued.clone();
        for f in &found.files {
            let src = object_file(f.object);
            taken.insert(src.clone());
            let path = f.path.display().to_string();
            match save(&src, &to, &f.path, Some(f.size), f.mode, Some(f.mtime)) {
                Ok(saved_as) => report.saved.push(Saved {
                    path,
                    saved_as,
                    size: f.size,
                    whole: f.whole,
                    from: "index",
                }),
                Err(e) => report.failed.push((path, format!("{e:#}"))),
            }
        }
    }
    // Labelled cache files the index did not name (it is lost, or lost them), and those moved to
    // lost+found at an earlier start.
    let mut labelled = unpushed::scan(&objects);
    labelled.extend(lost_found(&cache.join("conflicts/lost+found")));
    let mut cleared = Vec::new();
    for (src, label) in labelled {
        if taken.contains(&src) {
            cleared.push(src);
            continue;
        }
        let rel = PathBuf::from(std::ffi::OsStr::from_bytes(&label.path));
        let path = rel.display().to_string();
        let size = std::fs::metadata(&src).map_or(0, |m| m.len());
        match save(&src, &to, &rel, None, label.mode, None) {
            Ok(saved_as) => {
                report.saved.push(Saved {
                    path,
                    saved_as,
                    size,
                    whole: false,
                    from: "label",
                });
                cleared.push(src);
            }
            Err(e) => report.failed.push((path, format!("{e:#}"))),
        }
    }
    // A lost or damaged index is set aside, and the labels of what was saved taken off: the next mount
    // starts anew. (Not when a file could not be saved: the user decides.)
    if index_state != "intact" && report.failed.is_empty() {
        report.index_set_aside = Some(set_index_aside(&cache)?);
        for src in cleared {
            if let Ok(f) = std::fs::File::open(&src) {
                let _ = unpushed::clear(&f);
            }
        }
    }
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::File::create(to.join("larder-recovered.json"))
        .and_then(|mut f| f.write_all(json.as_bytes()))
        .context("cannot write larder-recovered.json")?;
    if args.json {
        println!("{json}");
    } else {
        print_report(&report, &to);
    }
    if !report.failed.is_empty() {
        bail!("{} files could not be saved (listed above)", report.failed.len());
    }
    Ok(())
}

/// Copy the cache file `src` to `to/rel` (a free name beside it if that is taken), `size` bytes long
/// (else as long as the cache file), with `mode` and `mtime`. Where it went.
fn save(
    src: &Path,
    to: &Path,
    rel: &Path,
    size: Option<u64>,
    mode: u32,
    mtime: Option<std::time::SystemTime>,
) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let rel: PathBuf = rel
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    let mut dest = to.join(&rel);
    let mut n = 1;
    while dest.exists() {
        dest = to.join(format!("{}.recovered-{n}", rel.display()));
        n += 1;
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::File::open(src) {
        Ok(mut from) => {
            let mut out = std::fs::File::create(&dest)?;
            std::io::copy(&mut from, &mut out)?;
            if let Some(size) = size {
                out.set_len(size)?;
            }
            out.sync_all()?;
        }
        // A file made here and never written has no cache file.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && size.is_some_and(|s| s == 0) => {
            std::fs::File::create(&dest)?;
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", src.display())),
    }
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode & 0o7777))?;
    if let Some(t) = mtime {
        let f = std::fs::File::options().write(true).open(&dest)?;
        f.set_modified(t)?;
    }
    Ok(dest)
}

/// The labelled files a start moved to `dir` (lost+found), with their labels.
fn lost_found(dir: &Path) -> Vec<(PathBuf, unpushed::Label)> {
    let Ok(files) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    files
        .flatten()
        .filter_map(|f| unpushed::get(&f.path()).map(|l| (f.path(), l)))
        .collect()
}

/// Move `cache`'s index and its log aside (`index.redb.damaged-TIME`, ...): the next mount makes a new one.
fn set_index_aside(cache: &Path) -> Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = cache.join(format!("index.redb.damaged-{stamp}"));
    for suffix in ["", ".log0", ".log1"] {
        let from = cache.join(format!("index.redb{suffix}"));
        if from.exists() {
            let to = cache.join(format!("index.redb.damaged-{stamp}{suffix}"));
            std::fs::rename(&from, &to).with_context(|| format!("cannot move {} aside", from.display()))?;
        }
    }
    Ok(aside)
}

fn print_report(r: &Report, to: &Path) {
    println!("cache index: {}", r.index);
    for s in &r.saved {
        let note = if s.whole {
            ""
        } else {
            " (bytes outside its changes: what the cache held)"
        };
        println!("saved  /{} -> {}{note}", s.path, s.saved_as.display());
    }
    for (path, e) in &r.failed {
        println!("FAILED /{path}: {e}");
    }
    let others: Vec<&(String, String)> = r
        .queued
        .iter()
        .filter(|(op, _)| op != "data" && op != "create")
        .collect();
    if !others.is_empty() {
        println!("changes that were queued and are not files (redo them by hand if they matter):");
        for (op, path) in others {
            println!("  {op} /{path}");
        }
    }
    match &r.index_set_aside {
        Some(p) => println!(
            "the index was set aside as {}; the next mount starts with an empty cache",
            p.display()
        ),
        None if r.index == "intact" => {
            println!("the index is intact and was left as it is: mounting the cache pushes these changes")
        }
        None => println!("the index was left as it is: some files could not be saved"),
    }
    println!(
        "{} files saved in {} (list: larder-recovered.json)",
        r.saved.len(),
        to.display()
    );
}
