//! Writes across a cluster (design note 016): what one node changed and closed is what the others see at
//! their next open, before home has it.
//!
//! * **Held records.** Before a change returns (a create, rename, removal, attribute change, or the data
//!   of a file at its close or fsync), the node that made it publishes a [`HeldRecord`] for each path it
//!   touched: the object's attributes as this node has them now (or none: removed), and where home has it
//!   if a rename has not reached home yet. The records live in etcd, outside any lease; the holder removes
//!   them once its journal is empty (home has every change).
//! * **The overlay.** [`HeldOverlay`], a home layer over a node's home: a path another node holds a record of is
//!   answered from the record (attributes, a listing merged with the records of its entries), its version
//!   is `held:<holder>:<revision>`, and its bytes come from the holder over the peer protocol. The node's
//!   namespace takes these answers as it takes home's: a new version drops what it cached of the old.
//! * **Invalidation.** Every node follows the records (etcd's watch); a record written or removed drops
//!   what the node cached of its path and its directory, in memory and in the kernel
//!   ([`Fs::invalidate_path`]). An open or opendir first reads the records written since the last one
//!   applied ([`Coherence::sync`]): close-to-open across nodes, for one etcd read per open.
//! * **A holder gone.** Bytes held by a node that is not live are `EIO`, or, with `--holder-lost home`,
//!   its records are passed over and home's version is read instead. Never a mix: each version is read
//!   whole or not at all (a new version is a new key).

use std::ffi::OsStr;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_home::{ContentId, DirEntry, Home, HomeAttr, HomeError, HomeResult, Layer, Layered, Version};
use serde::{Deserialize, Serialize};

use crate::serve::HeldRead;

/// What a node says of a path it changed and home has not got yet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldRecord {
    /// The node that made the change and holds it.
    pub holder: u64,
    /// The object as the holder has it; `None`: removed there.
    pub attr: Option<HomeAttr>,
    /// Where home has the object, if a rename of it (or above it) has not reached home yet.
    pub home_path: Option<Vec<u8>>,
}

/// A file's changes handed over with its write token by a node that could not push them to home: the
/// taker copies the version the giver's record names and makes it its own change, on the giver's base.
#[derive(Clone, Debug, PartialEq)]
pub struct Handover {
    /// The giver, and the revision of its record of the file: the bytes are read as of it.
    pub holder: u64,
    pub revision: i64,
    /// The version home had when the giver changed the file: the taker's push is made on it.
    pub base: String,
    /// The rest of the giver's state of the file, as its journal encodes it: its queued changes of the
    /// file's attributes, made again by the taker, and what a push of the giver's cut short sent (home
    /// holding those bytes is no conflict).
    pub state: Vec<u8>,
}

/// How a node asked for a file's write token let its changes go ([`crate::Fs::give_up`]).
#[derive(Clone, Debug, PartialEq)]
pub enum GiveUp {
    /// Home has every change of this node's (its journal drained): its records can all go.
    Drained,
    /// Nothing of the file is queued here, and this node publishes no record of it: home's version is
    /// the newest, whatever else waits for home. (The cluster tells the asker which version that is if
    /// this node pushed it: the asker may have cached it as this node's held version, and home may be
    /// away; see [`crate::Fs::rebase`].)
    NothingHere,
    /// Home could not take the changes: these go to the asker instead. The giver keeps them, and its
    /// flushers off them, until [`crate::Fs::handed_over`].
    HandOver(Handover),
}

/// What a node's file system needs of the cluster for writes across it. Implemented over etcd and the
/// peer protocol by the daemon; the file system sees only this.
pub trait Coherence: Send + Sync {
    /// This node's id.
    fn me(&self) -> u64;
    /// The record of `path` (below home's root) and its revision, whoever holds it.
    fn record(&self, path: &[u8]) -> Option<(HeldRecord, i64)>;
    /// The records of the entries directly in `dir`, by name, with their revisions.
    fn children(&self, dir: &[u8]) -> Vec<(Vec<u8>, HeldRecord, i64)>;
    /// Whether `node` is a live member.
    fn live(&self, node: u64) -> bool;
    /// Bytes `ask` names from `holder`.
    fn read_held(&self, holder: u64, ask: &HeldRead) -> HomeResult<Vec<u8>>;
    /// Apply every record written before now (before an open); whether any was new here.
    fn sync(&self) -> bool;
    /// Publish these records of this node's changes, before the change returns.
    fn publish(&self, records: Vec<(Vec<u8>, HeldRecord)>);
    /// Take the write token of `path` before this node changes what is there: the node holding it gives
    /// it up once home has its changes. An error means the change must not be made. Whether another node
    /// gave it up just now (what home has of the path is then that node's last version).
    fn take(&self, path: &[u8]) -> HomeResult<bool>;
    /// Whether this node may still change `path`: it has the token, is not giving it up, or goes on alone
    /// (etcd away). Asked again under the file's write lock, which a node giving the token up takes too.
    fn still_held(&self, path: &[u8]) -> bool;
}

const HELD: &str = "held:";

/// The version of content `holder` published at `revision`.
pub fn held_version(holder: u64, revision: i64) -> Version {
    Version(format!("{HELD}{holder:016x}:{revision}"))
}

/// The holder and revision of a held version.
pub fn parse_held(v: &Version) -> Option<(u64, i64)> {
    let (holder, revision) = v.0.strip_prefix(HELD)?.split_once(':')?;
    Some((u64::from_str_radix(holder, 16).ok()?, revision.parse().ok()?))
}

pub(crate) fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

/// The layer that shows a home through the records of changes other nodes hold: see the module doc.
pub struct HeldOverlay {
    c: Arc<dyn Coherence>,
    /// Pass over the records of holders that are gone (home's version), rather than fail their reads.
    lost_home: bool,
}

impl HeldOverlay {
    /// `inner` seen through the records `c` follows; with `lost_home`, those of holders that are gone are
    /// passed over.
    pub fn over(inner: Arc<dyn Home>, c: Arc<dyn Coherence>, lost_home: bool) -> Layered<HeldOverlay> {
        Layered::new(inner, HeldOverlay { c, lost_home })
    }

    /// Another node's record of `path` that stands: none if its holder is gone and home's version is
    /// wanted.
    fn standing(&self, path: &[u8]) -> Option<(HeldRecord, i64)> {
        let (r, rev) = self.c.record(path)?;
        (r.holder != self.c.me() && (!self.lost_home || self.c.live(r.holder))).then_some((r, rev))
    }

    /// Where home has `path`: through the nearest recorded path at or above it that moved; not found if
    /// that record says it is removed.
    fn at_home(&self, path: &Path) -> HomeResult<PathBuf> {
        let mut at = Some(path);
        while let Some(a) = at {
            if let Some((r, _)) = self.standing(bytes(a)) {
                if r.attr.is_none() {
                    return Err(HomeError::NotFound);
                }
                if let Some(h) = r.home_path {
                    let rest = path.strip_prefix(a).unwrap_or(Path::new(""));
                    let base = PathBuf::from(OsStr::from_bytes(&h));
                    return Ok(if rest.as_os_str().is_empty() {
                        base
                    } else {
                        base.join(rest)
                    });
                }
                return Ok(path.to_path_buf());
            }
            if a.as_os_str().is_empty() {
                break;
            }
            at = a.parent();
        }
        Ok(path.to_path_buf())
    }

    fn with_held_version(r: &HeldRecord, rev: i64) -> Option<HomeAttr> {
        r.attr.clone().map(|mut a| {
            a.version = held_version(r.holder, rev);
            a
        })
    }

    fn held_read(&self, holder: u64, ask: &HeldRead) -> HomeResult<Vec<u8>> {
        if !self.c.live(holder) {
            return Err(if self.lost_home {
                HomeError::Stale
            } else {
                HomeError::Os(libc::EIO)
            });
        }
        self.c.read_held(holder, ask)
    }

    /// Home's entries of `path` with the records of its entries merged in: a record stands for its name.
    fn merged(&self, path: &Path, listed: HomeResult<Vec<DirEntry>>, recorded: bool) -> HomeResult<Vec<DirEntry>> {
        let mut entries = match listed {
            Ok(e) => e,
            Err(HomeError::NotFound) if recorded => Vec::new(),
            Err(e) => return Err(e),
        };
        for (name, r, rev) in self.c.children(bytes(path)) {
            if r.holder == self.c.me() || (self.lost_home && !self.c.live(r.holder)) {
                continue;
            }
            entries.retain(|e| e.name.as_bytes() != name.as_slice());
            if let Some(a) = Self::with_held_version(&r, rev) {
                entries.push(DirEntry {
                    name: std::ffi::OsString::from_vec(name),
                    kind: a.kind,
                    attr: Some(a),
                });
            }
        }
        Ok(entries)
    }
}

// Changes go to home as this node's journal has them: they pass through (the defaults).
impl Layer for HeldOverlay {
    fn content_id(&self, next: &dyn Home, path: &Path, version: &Version) -> ContentId {
        match parse_held(version) {
            Some((node, rev)) => ContentId::Held { node, seq: rev as u64 },
            None => next.content_id(&self.at_home(path).unwrap_or_else(|_| path.to_path_buf()), version),
        }
    }

    fn stat(&self, next: &dyn Home, path: &Path) -> HomeResult<HomeAttr> {
        if let Some((r, rev)) = self.standing(bytes(path)) {
            return Self::with_held_version(&r, rev).ok_or(HomeError::NotFound);
        }
        next.stat(&self.at_home(path)?)
    }

    fn list(&self, next: &dyn Home, path: &Path) -> HomeResult<Vec<DirEntry>> {
        let recorded = self.standing(bytes(path)).is_some();
        self.merged(path, next.list(&self.at_home(path)?), recorded)
    }

    /// As `list`, with the directory's own attributes: its record's where another node holds one, else
    /// what home read with the listing.
    fn list_with_own(&self, next: &dyn Home, path: &Path) -> HomeResult<(Option<HomeAttr>, Vec<DirEntry>)> {
        let record = self.standing(bytes(path));
        let (own, listed) = match next.list_with_own(&self.at_home(path)?) {
            Ok((own, entries)) => (own, Ok(entries)),
            Err(e) => (None, Err(e)),
        };
        let own = match &record {
            Some((r, rev)) => Self::with_held_version(r, *rev),
            None => own,
        };
        Ok((own, self.merged(path, listed, record.is_some())?))
    }

    fn read(&self, next: &dyn Home, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>> {
        match parse_held(version) {
            Some((holder, revision)) => self.held_read(
                holder,
                &HeldRead {
                    path: bytes(path),
                    revision,
                    offset,
                    len: len as u64,
                    link: false,
                },
            ),
            None => next.read(&self.at_home(path)?, version, offset, len),
        }
    }

    fn readlink(&self, next: &dyn Home, path: &Path) -> HomeResult<Vec<u8>> {
        match self.standing(bytes(path)) {
            Some((r, revision)) => self.held_read(
                r.holder,
                &HeldRead {
                    path: bytes(path),
                    revision,
                    offset: 0,
                    len: libc::PATH_MAX as u64,
                    link: true,
                },
            ),
            None => next.readlink(&self.at_home(path)?),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use larder_home::{FileKind, PosixHome};

    use super::*;
    use crate::namespace::hit_tests::dir_f;

    #[test]
    fn held_versions_name_their_holder_and_revision_and_nothing_else_parses() {
        let v = held_version(0xabc, 42);
        assert_eq!(v.0, "held:0000000000000abc:42");
        assert_eq!(parse_held(&v), Some((0xabc, 42)));
        for other in ["", "held:", "held:zz:1", "held:1", "1:2", "ino:1:2.3"] {
            assert_eq!(parse_held(&Version(other.into())), None, "{other}");
        }
    }

    /// Records kept in memory, for the overlay alone.
    #[derive(Default)]
    struct Records {
        records: Mutex<BTreeMap<Vec<u8>, (HeldRecord, i64)>>,
        live: HashSet<u64>,
    }

    impl Records {
        fn put(&self, path: &str, holder: u64, attr: Option<HomeAttr>, home_path: Option<&str>, rev: i64) {
            let r = HeldRecord {
                holder,
                attr,
                home_path: home_path.map(|h| h.as_bytes().to_vec()),
            };
            self.records.lock().unwrap().insert(path.as_bytes().to_vec(), (r, rev));
        }
    }

    impl Coherence for Records {
        fn me(&self) -> u64 {
            1
        }
        fn record(&self, path: &[u8]) -> Option<(HeldRecord, i64)> {
            self.records.lock().unwrap().get(path).cloned()
        }
        fn children(&self, dir: &[u8]) -> Vec<(Vec<u8>, HeldRecord, i64)> {
            let prefix = if dir.is_empty() {
                Vec::new()
            } else {
                [dir, b"/"].concat()
            };
            self.records
                .lock()
                .unwrap()
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix) && !k[prefix.len()..].contains(&b'/') && !k.is_empty())
                .map(|(k, (r, rev))| (k[prefix.len()..].to_vec(), r.clone(), *rev))
                .collect()
        }
        fn live(&self, node: u64) -> bool {
            self.live.contains(&node)
        }
        fn read_held(&self, holder: u64, ask: &HeldRead) -> HomeResult<Vec<u8>> {
            Ok(format!("{holder}:{}:{}", String::from_utf8_lossy(ask.path), ask.revision).into_bytes())
        }
        fn sync(&self) -> bool {
            false
        }
        fn publish(&self, _: Vec<(Vec<u8>, HeldRecord)>) {}
        fn take(&self, _: &[u8]) -> HomeResult<bool> {
            Ok(false)
        }
        fn still_held(&self, _: &[u8]) -> bool {
            true
        }
    }

    fn names(entries: &[DirEntry]) -> Vec<String> {
        let mut n: Vec<String> = entries.iter().map(|e| e.name.to_string_lossy().into_owned()).collect();
        n.sort();
        n
    }

    #[test]
    fn the_overlay_answers_from_other_nodes_records_and_from_home_for_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path();
        std::fs::create_dir_all(home.join("d/old")).unwrap();
        std::fs::write(home.join("d/old/kept"), b"kept").unwrap();
        std::fs::write(home.join("d/gone"), b"x").unwrap();
        std::fs::write(home.join("d/mine"), b"x").unwrap();
        let inner: Arc<dyn Home> = Arc::new(PosixHome::new(home, Some(Duration::from_secs(10))).unwrap());
        let file = inner.stat(Path::new("d/gone")).unwrap();
        let dir = inner.stat(Path::new("d/old")).unwrap();
        let mut live = HashSet::new();
        live.insert(2);
        let c = Arc::new(Records {
            live,
            ..Records::default()
        });
        c.put("d/gone", 2, None, None, 5);
        c.put("d/new", 2, Some(file.clone()), None, 6);
        c.put("d/older", 2, Some(dir.clone()), Some("d/old"), 7);
        c.put("d/mine", 1, None, None, 8);
        c.put("d/dead", 3, Some(file.clone()), None, 9);
        let h = HeldOverlay::over(inner.clone(), c.clone(), false);

        assert!(matches!(h.stat(Path::new("d/gone")), Err(HomeError::NotFound)));
        assert_eq!(h.stat(Path::new("d/new")).unwrap().version, held_version(2, 6));
        // A directory renamed on the holder: below it, home under its old name.
        assert_eq!(h.stat(Path::new("d/older/kept")).unwrap().size, 4);
        assert_eq!(names(&h.list(Path::new("d/older")).unwrap()), ["kept"]);
        // This node's own record is its namespace's business, not the overlay's.
        assert!(h.stat(Path::new("d/mine")).is_ok());
        assert_eq!(
            names(&h.list(Path::new("d")).unwrap()),
            ["dead", "mine", "new", "old", "older"]
        );
        // The listing with the directory's own attributes, as home reads them with it: the same entries,
        // and for a directory a holder renamed, its record's attributes.
        let (own, entries) = h.list_with_own(Path::new("d")).unwrap();
        assert_eq!(names(&entries), ["dead", "mine", "new", "old", "older"]);
        assert_eq!(
            own.map(|a| a.kind),
            Some(FileKind::Dir),
            "home's own attributes came through"
        );
        let (own, entries) = h.list_with_own(Path::new("d/older")).unwrap();
        assert_eq!(names(&entries), ["kept"]);
        assert_eq!(own.unwrap().version, held_version(2, 7));
        // Bytes of a held version come from its holder; a holder gone is EIO.
        let v = held_version(2, 6);
        assert_eq!(h.read(Path::new("d/new"), &v, 0, 10).unwrap(), b"2:d/new:6");
        assert!(matches!(
            h.content_id(Path::new("d/new"), &v),
            ContentId::Held { node: 2, seq: 6 }
        ));
        let dead = held_version(3, 9);
        assert!(matches!(
            h.read(Path::new("d/dead"), &dead, 0, 10),
            Err(HomeError::Os(libc::EIO))
        ));

        // With --holder-lost home, a gone holder's records are passed over: home's version, whole.
        let lost = HeldOverlay::over(inner, c, true);
        assert!(matches!(lost.stat(Path::new("d/dead")), Err(HomeError::NotFound)));
        assert!(!names(&lost.list(Path::new("d")).unwrap()).contains(&"dead".to_string()));
        assert!(matches!(
            lost.read(Path::new("d/dead"), &dead, 0, 10),
            Err(HomeError::Stale)
        ));
        assert_eq!(lost.stat(Path::new("d/new")).unwrap().kind, FileKind::File);
    }

    #[test]
    fn an_answer_asked_for_before_another_nodes_change_dropped_the_cache_is_not_counted_fresh() {
        let (_tmp, fs, _, ino) = dir_f();
        let attr = fs.names.read().inode(ino).unwrap().attr.clone().unwrap();
        // Home is asked; meanwhile another node's change drops what is cached; then the answer comes.
        let asked = Instant::now();
        fs.invalidate_path(b"dir/f");
        {
            let mut ns = fs.names.write();
            fs.names.update_attr(&mut ns, ino, attr.clone(), asked);
            assert_eq!(
                ns.inode(ino).unwrap().checked,
                None,
                "an answer older than the change is not fresh"
            );
        }
        // An answer asked for after it is.
        let later = Instant::now();
        let mut ns = fs.names.write();
        fs.names.update_attr(&mut ns, ino, attr, later);
        assert!(ns.inode(ino).unwrap().checked.is_some());
    }
}
