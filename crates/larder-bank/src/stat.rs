//! Stat caching in the bank (IMCa §4): home's attributes and directory listings kept in the shared bank
//! for the validity lag, so that the nodes of one site cost home one stat of a file, and one listing of a
//! directory, per lag, not one per node (design note 015).
//!
//! [`BankStat`] is a home layer ([`larder_home::Layer`]). `stat` and the listings ask the bank first; an answer younger than the lag (by
//! the time home gave it, kept with it) is served, anything else (absent, older, damaged, a bank failure)
//! asks home and leaves its answer in the bank for the others, in the background. Only answers are kept:
//! a missing name is asked of home each time. Every change made through this home forgets what the bank
//! had of the paths it touches (the object, its parent's listing; for a rename both sides) and keeps the
//! attributes home answered with. Entries below a renamed or removed directory are not found by path and
//! expire with the lag.
//!
//! The lag's promise becomes twice the lag for changes made at home by others: a node may take an entry
//! the bank kept for nearly a lag and then trust it for a lag of its own. Changes made through larder
//! nodes are forgotten at once.

use std::fs::File;
use std::ops::Range;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use larder_home::{
    DirEntry, FileKind, Home, HomeAttr, HomeResult, Layer, Layered, NewFile, Owner, RenameFlags, SetAttr, Version,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Bank;

/// The layer that shares a home's stats and listings through a bank: see the module doc.
pub struct BankStat {
    bank: Arc<Bank>,
    lag: Duration,
    /// Names this home in the bank's keys (its URL, as in unit keys).
    home_id: String,
}

#[derive(Serialize, Deserialize)]
struct Kept<T> {
    /// When home gave the answer, in milliseconds since the epoch.
    at_ms: u64,
    answer: T,
}

/// The key kind of a listing: its entries and the directory's own attributes where home gave them, in
/// one value, so that a listing costs one get.
const LISTING: &str = "L";

#[derive(Serialize, Deserialize)]
struct Listing {
    own: Option<HomeAttr>,
    entries: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    name: Vec<u8>,
    kind: FileKind,
    attr: Option<HomeAttr>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl BankStat {
    /// `inner` with its answers kept in `bank` for `lag` (at least a second: the bank's expiry counts
    /// whole seconds). `home_id` names the home as every node names it.
    pub fn over(inner: Arc<dyn Home>, bank: Arc<Bank>, lag: Duration, home_id: String) -> Layered<BankStat> {
        Layered::new(inner, BankStat { bank, lag, home_id })
    }

    /// Whether a lag this short can be kept in a bank (whose servers count expiry in seconds).
    pub fn worth_it(lag: Duration) -> bool {
        lag >= Duration::from_secs(1)
    }

    fn key(&self, what: &str, path: &Path) -> String {
        let mut h = Sha256::new();
        h.update(self.home_id.as_bytes());
        h.update([0]);
        h.update(path.as_os_str().as_bytes());
        let d = h.finalize();
        let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("larder/{what}/{hex}")
    }

    /// What the bank keeps under `key`, if home gave it within the lag.
    fn kept<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Option<T> {
        let value = self.bank.get(key).ok()??;
        let kept: Kept<T> = postcard::from_bytes(&value).ok()?;
        let age = now_ms().saturating_sub(kept.at_ms);
        (age < self.lag.as_millis() as u64).then_some(kept.answer)
    }

    fn keep<T: Serialize>(&self, key: String, at_ms: u64, answer: &T) {
        if let Ok(value) = postcard::to_allocvec(&Kept { at_ms, answer }) {
            self.bank.put_later(key, value, self.lag);
        }
    }

    /// Forget what the bank has of `path` and of its parent's listing (which may carry its attributes).
    fn forget(&self, path: &Path) {
        self.bank.delete(&self.key("a", path));
        if let Some(parent) = path.parent() {
            self.bank.delete(&self.key(LISTING, parent));
        }
    }

    /// Forget `path` as [`BankStat::forget`] does, and its parent's attributes, wherever they are kept
    /// (its own key, and its parent's listing): a name made or removed there changed the directory's
    /// times and perhaps its link count.
    fn forget_name(&self, path: &Path) {
        self.forget(path);
        if let Some(parent) = path.parent() {
            self.forget(parent);
        }
    }

    /// After a change to `path` that home answered `attr` for: forget, and keep the new attributes.
    fn changed(&self, path: &Path, attr: HomeResult<HomeAttr>) -> HomeResult<HomeAttr> {
        self.forget(path);
        self.keep_attr(path, attr)
    }

    /// After `path` was made: forget it, its parent's listing and attributes; keep its attributes.
    fn made(&self, path: &Path, attr: HomeResult<HomeAttr>) -> HomeResult<HomeAttr> {
        self.forget_name(path);
        self.keep_attr(path, attr)
    }

    fn keep_attr(&self, path: &Path, attr: HomeResult<HomeAttr>) -> HomeResult<HomeAttr> {
        if let Ok(a) = &attr {
            self.keep(self.key("a", path), now_ms(), a);
        }
        attr
    }

    /// The listing of `path` the bank keeps: the directory's own attributes (if home gave them) and its
    /// entries.
    fn kept_listing(&self, path: &Path) -> Option<(Option<HomeAttr>, Vec<DirEntry>)> {
        let listing = self.kept::<Listing>(&self.key(LISTING, path))?;
        let entries = listing
            .entries
            .into_iter()
            .map(|e| DirEntry {
                name: std::ffi::OsString::from_vec(e.name),
                kind: e.kind,
                attr: e.attr,
            })
            .collect();
        Some((listing.own, entries))
    }

    fn keep_listing(&self, path: &Path, at: u64, own: Option<&HomeAttr>, entries: &[DirEntry]) {
        let listing = Listing {
            own: own.cloned(),
            entries: entries
                .iter()
                .map(|e| Entry {
                    name: e.name.as_bytes().to_vec(),
                    kind: e.kind,
                    attr: e.attr.clone(),
                })
                .collect(),
        };
        self.keep(self.key(LISTING, path), at, &listing);
    }
}

// Reads and what asks home nothing pass through (the defaults).
impl Layer for BankStat {
    fn stat(&self, next: &dyn Home, path: &Path) -> HomeResult<HomeAttr> {
        let key = self.key("a", path);
        if let Some(attr) = self.kept(&key) {
            return Ok(attr);
        }
        let at = now_ms();
        let attr = next.stat(path)?;
        self.keep(key, at, &attr);
        Ok(attr)
    }

    fn list(&self, next: &dyn Home, path: &Path) -> HomeResult<Vec<DirEntry>> {
        if let Some((_, entries)) = self.kept_listing(path) {
            return Ok(entries);
        }
        let at = now_ms();
        let entries = next.list(path)?;
        self.keep_listing(path, at, None, &entries);
        Ok(entries)
    }

    /// The listing with the directory's own attributes, kept together in one value: served from the bank
    /// when it has them both, else one call to home that leaves them there (and the own attributes also as
    /// a stat's answer, for the stats of other nodes).
    fn list_with_own(&self, next: &dyn Home, path: &Path) -> HomeResult<(Option<HomeAttr>, Vec<DirEntry>)> {
        if let Some((Some(own), entries)) = self.kept_listing(path) {
            return Ok((Some(own), entries));
        }
        let at = now_ms();
        let (own, entries) = next.list_with_own(path)?;
        self.keep_listing(path, at, own.as_ref(), &entries);
        if let Some(own) = &own {
            self.keep(self.key("a", path), at, own);
        }
        Ok((own, entries))
    }

    fn create(&self, next: &dyn Home, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        self.made(path, next.create(path, mode, owner))
    }
    fn create_file(&self, next: &dyn Home, path: &Path, new: &NewFile<'_>) -> HomeResult<HomeAttr> {
        self.made(path, next.create_file(path, new))
    }
    fn mkdir(&self, next: &dyn Home, path: &Path, mode: u32, owner: Owner) -> HomeResult<HomeAttr> {
        self.made(path, next.mkdir(path, mode, owner))
    }
    fn mknod(&self, next: &dyn Home, path: &Path, mode: u32, rdev: u64, owner: Owner) -> HomeResult<HomeAttr> {
        self.made(path, next.mknod(path, mode, rdev, owner))
    }
    fn symlink(&self, next: &dyn Home, target: &[u8], path: &Path, owner: Owner) -> HomeResult<HomeAttr> {
        self.made(path, next.symlink(target, path, owner))
    }
    fn link(&self, next: &dyn Home, existing: &Path, new: &Path) -> HomeResult<HomeAttr> {
        // The link count of the object changed under its other name too.
        self.forget(existing);
        self.made(new, next.link(existing, new))
    }
    fn unlink(&self, next: &dyn Home, path: &Path) -> HomeResult<()> {
        let r = next.unlink(path);
        self.forget_name(path);
        r
    }
    fn rmdir(&self, next: &dyn Home, path: &Path) -> HomeResult<()> {
        let r = next.rmdir(path);
        self.forget_name(path);
        self.bank.delete(&self.key(LISTING, path));
        r
    }
    fn rename(&self, next: &dyn Home, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()> {
        let r = next.rename(from, to, flags);
        self.forget_name(from);
        self.forget_name(to);
        for dir in [from, to] {
            self.bank.delete(&self.key(LISTING, dir));
        }
        r
    }
    fn setattr(&self, next: &dyn Home, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr> {
        self.changed(path, next.setattr(path, changes))
    }
    fn write(
        &self,
        next: &dyn Home,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
        mtime: Option<SystemTime>,
    ) -> HomeResult<HomeAttr> {
        self.changed(path, next.write(path, source, ranges, size, base, mtime))
    }
}
