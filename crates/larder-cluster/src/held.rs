//! Held records: which node holds changes of which path that home has not got yet (design note 016).
//!
//! Keys `held/<path>` under the cluster's prefix, the path as bytes below home's root; the value is the
//! holder's own encoding (larder-fs's `HeldRecord`), opaque here. A record is not under a lease: it
//! outlives its holder, so that a reader can tell "held by a node that is gone" (an error, or home's
//! version by choice) from "never changed" (home's version). Its holder deletes it once home has the
//! change.
//!
//! [`HeldMap`] is a node's copy of all records, kept by the membership's watch, with the etcd revision
//! of each, and a hook called for every path whose record changed (the file system drops what it
//! cached of it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{OnceLock, RwLock};

/// One record as this node has it: its value and the etcd revision that wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub value: Vec<u8>,
    pub revision: i64,
}

/// Called with each path whose record was written or removed.
/// Called with a path whose record changed, and the record's value: the new one, or the one removed.
pub type HeldHook = Box<dyn Fn(&[u8], &[u8]) + Send + Sync>;

#[derive(Default)]
pub struct HeldMap {
    records: RwLock<BTreeMap<Vec<u8>, Held>>,
    /// Removals applied before the watch brought everything up to them (a removal learnt from the node
    /// that made it): a write older than one of these, arriving late, is not the record any more. Kept
    /// until [`HeldMap::applied`] passes them.
    removed: std::sync::Mutex<BTreeMap<Vec<u8>, i64>>,
    hook: OnceLock<HeldHook>,
    /// The highest revision applied (every record written at or before it is in the map).
    applied: AtomicI64,
}

impl HeldMap {
    pub fn set_hook(&self, hook: HeldHook) {
        let _ = self.hook.set(hook);
    }

    /// The record of `path`.
    pub fn get(&self, path: &[u8]) -> Option<Held> {
        self.records
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .cloned()
    }

    /// The records of the entries directly in directory `dir` (`""` is home's root), by name.
    pub fn children(&self, dir: &[u8]) -> Vec<(Vec<u8>, Held)> {
        let map = self.records.read().unwrap_or_else(|p| p.into_inner());
        let prefix: Vec<u8> = if dir.is_empty() {
            Vec::new()
        } else {
            [dir, b"/"].concat()
        };
        map.range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| !k.is_empty() && !k[prefix.len()..].contains(&b'/'))
            .map(|(k, v)| (k[prefix.len()..].to_vec(), v.clone()))
            .collect()
    }

    /// Every record, by path.
    pub fn all(&self) -> Vec<(Vec<u8>, Held)> {
        let map = self.records.read().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    pub fn applied(&self) -> i64 {
        self.applied.load(Ordering::SeqCst)
    }

    /// Apply one record written (`Some`) or removed (`None`) at `revision`. A write older than the one
    /// the map has, or than a removal applied ahead of the watch, is ignored (a sync and the watch may
    /// bring the same event twice, and the watch may bring a write after its removal was learnt).
    pub fn apply(&self, path: &[u8], value: Option<&[u8]>, revision: i64) {
        let changed: Option<Vec<u8>> = {
            let mut map = self.records.write().unwrap_or_else(|p| p.into_inner());
            let mut removed = self.removed.lock().unwrap_or_else(|p| p.into_inner());
            if value.is_none() && revision > self.applied() {
                let r = removed.entry(path.to_vec()).or_insert(revision);
                *r = (*r).max(revision);
            }
            match value {
                Some(v) => {
                    if map.get(path).is_some_and(|h| h.revision >= revision)
                        || removed.get(path).is_some_and(|&r| r >= revision)
                    {
                        None
                    } else {
                        map.insert(
                            path.to_vec(),
                            Held {
                                value: v.to_vec(),
                                revision,
                            },
                        );
                        Some(v.to_vec())
                    }
                }
                None if map.get(path).is_some_and(|h| h.revision < revision) => map.remove(path).map(|h| h.value),
                None => None,
            }
        };
        if let Some(value) = changed
            && let Some(hook) = self.hook.get()
        {
            hook(path, &value);
        }
    }

    /// Note that everything up to `revision` is applied.
    pub fn applied_up_to(&self, revision: i64) {
        let applied = self.applied.fetch_max(revision, Ordering::SeqCst).max(revision);
        let mut removed = self.removed.lock().unwrap_or_else(|p| p.into_inner());
        if !removed.is_empty() {
            removed.retain(|_, r| *r > applied);
        }
    }

    /// Replace every record with `fresh` (a full load at `revision`), calling the hook for each path
    /// whose record changed or went.
    pub fn replace(&self, fresh: BTreeMap<Vec<u8>, Held>, revision: i64) {
        let changed: Vec<(Vec<u8>, Vec<u8>)> = {
            let mut map = self.records.write().unwrap_or_else(|p| p.into_inner());
            let mut changed: Vec<(Vec<u8>, Vec<u8>)> = map
                .iter()
                .filter(|(k, v)| fresh.get(*k) != Some(v))
                .map(|(k, v)| (k.clone(), fresh.get(k).unwrap_or(v).value.clone()))
                .collect();
            changed.extend(
                fresh
                    .iter()
                    .filter(|(k, _)| !map.contains_key(*k))
                    .map(|(k, v)| (k.clone(), v.value.clone())),
            );
            *map = fresh;
            changed
        };
        self.applied_up_to(revision);
        if let Some(hook) = self.hook.get() {
            for (path, value) in changed {
                hook(&path, &value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn records_apply_in_revision_order_and_the_hook_hears_each_change_once() {
        let m = HeldMap::default();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        m.set_hook(Box::new(move |p, _| h.lock().unwrap().push(p.to_vec())));
        m.apply(b"a/b", Some(b"1"), 5);
        m.apply(b"a/b", Some(b"0"), 4); // older: ignored
        m.apply(b"a/b", Some(b"1"), 5); // again: ignored
        assert_eq!(m.get(b"a/b").unwrap().value, b"1");
        m.apply(b"a/b", None, 3); // a removal older than the write: ignored
        assert!(m.get(b"a/b").is_some());
        m.apply(b"a/b", None, 6);
        assert!(m.get(b"a/b").is_none());
        assert_eq!(heard.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_write_older_than_a_removal_learnt_ahead_of_the_watch_does_not_come_back() {
        let m = HeldMap::default();
        m.apply(b"f", Some(b"r3"), 3);
        m.applied_up_to(3);
        // The holder says its records are gone at 9; the watch has brought only up to 3.
        m.apply(b"f", None, 9);
        // Then the watch brings the holder's writes at 5 and 7, and the removal at 9.
        m.apply(b"f", Some(b"r5"), 5);
        m.apply(b"f", Some(b"r7"), 7);
        assert!(m.get(b"f").is_none(), "an older write came back");
        m.apply(b"f", None, 9);
        m.applied_up_to(9);
        // A write after the removal is the record again.
        m.apply(b"f", Some(b"r11"), 11);
        assert_eq!(m.get(b"f").unwrap().value, b"r11");
        assert!(
            m.removed.lock().unwrap().is_empty(),
            "the removal is forgotten once the watch passed it"
        );
    }

    #[test]
    fn children_are_the_entries_directly_in_a_directory() {
        let m = HeldMap::default();
        for (p, r) in [("x", 1), ("x/a", 2), ("x/b", 3), ("x/b/c", 4), ("xy", 5), ("y/a", 6)] {
            m.apply(p.as_bytes(), Some(b"v"), r);
        }
        let names = |d: &str| -> Vec<String> {
            m.children(d.as_bytes())
                .into_iter()
                .map(|(n, _)| String::from_utf8(n).unwrap())
                .collect()
        };
        assert_eq!(names("x"), ["a", "b"]);
        assert_eq!(names(""), ["x", "xy"]);
        assert_eq!(names("x/b"), ["c"]);
        assert!(names("z").is_empty());
    }

    #[test]
    fn a_full_load_replaces_the_records_and_names_what_changed() {
        let m = HeldMap::default();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        m.set_hook(Box::new(move |p, _| {
            h.lock().unwrap().push(String::from_utf8(p.to_vec()).unwrap())
        }));
        m.apply(b"gone", Some(b"v"), 1);
        m.apply(b"same", Some(b"v"), 2);
        let mut fresh = BTreeMap::new();
        fresh.insert(
            b"same".to_vec(),
            Held {
                value: b"v".to_vec(),
                revision: 2,
            },
        );
        fresh.insert(
            b"new".to_vec(),
            Held {
                value: b"w".to_vec(),
                revision: 9,
            },
        );
        heard.lock().unwrap().clear();
        m.replace(fresh, 9);
        let mut got = heard.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, ["gone", "new"]);
        assert_eq!(m.applied(), 9);
    }
}
