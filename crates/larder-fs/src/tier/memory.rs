//! An in-memory tier bounded by bytes, least recently used out first: a stand-in for a peer or a bank in
//! tests, and the shape of a memory tier in front of the local store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::{Tier, TierError, Unit, Want};
use crate::key::KeyDigest;
use larder_util::contention::lock;

#[derive(Default)]
struct State {
    /// Unit and its last use.
    units: HashMap<KeyDigest, (Unit, u64)>,
    /// Last use -> unit, oldest first.
    order: BTreeMap<u64, KeyDigest>,
    clock: u64,
    bytes: u64,
}

/// Units kept in memory, at most `limit` bytes of them.
pub struct MemoryTier {
    limit: u64,
    shared: bool,
    state: Mutex<State>,
}

impl MemoryTier {
    /// A tier of this node only.
    pub fn new(limit: u64) -> MemoryTier {
        MemoryTier {
            limit,
            shared: false,
            state: Mutex::new(State::default()),
        }
    }

    /// A tier that stands for one shared with other nodes (it is never offered content not yet pushed).
    pub fn shared(limit: u64) -> MemoryTier {
        MemoryTier {
            shared: true,
            ..MemoryTier::new(limit)
        }
    }

    /// Keep `unit` as it is, unverified (tests plant answers with it), dropping the least recently used
    /// units past the limit.
    pub fn put(&self, unit: Unit) {
        let len = unit.data.len() as u64;
        if len > self.limit {
            return;
        }
        let mut st = lock(&self.state);
        st.clock += 1;
        let (now, key) = (st.clock, unit.key);
        if let Some((old, used)) = st.units.insert(key, (unit, now)) {
            st.order.remove(&used);
            st.bytes -= old.data.len() as u64;
        }
        st.order.insert(now, key);
        st.bytes += len;
        while st.bytes > self.limit {
            let Some((_, oldest)) = st.order.pop_first() else { break };
            if let Some((gone, _)) = st.units.remove(&oldest) {
                st.bytes -= gone.data.len() as u64;
            }
        }
    }

    /// Whether `key` is held.
    pub fn holds(&self, key: &KeyDigest) -> bool {
        lock(&self.state).units.contains_key(key)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        lock(&self.state).bytes
    }
}

impl Tier for MemoryTier {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn shared(&self) -> bool {
        self.shared
    }

    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError> {
        let mut st = lock(&self.state);
        st.clock += 1;
        let now = st.clock;
        let Some((unit, used)) = st.units.get_mut(&want.digest) else {
            return Ok(None);
        };
        let (unit, before) = (unit.clone(), std::mem::replace(used, now));
        st.order.remove(&before);
        st.order.insert(now, want.digest);
        Ok(Some(unit))
    }

    fn offer(&self, _want: &Want, unit: &Unit) -> Result<(), TierError> {
        self.put(unit.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn unit(n: u8, len: usize) -> Unit {
        Unit::new(KeyDigest([n; 16]), Arc::new(vec![n; len]))
    }

    #[test]
    fn least_recently_used_goes_first() {
        let tier = MemoryTier::new(300);
        tier.put(unit(1, 100));
        tier.put(unit(2, 100));
        tier.put(unit(3, 100));
        // A use of 1 makes 2 the oldest.
        let key = crate::key::UnitKey {
            home: crate::key::HomeId::new("h"),
            content: crate::key::Content::Unpushed {
                node: crate::key::NodeId(0),
                seq: 0,
            },
            part: crate::key::Part::Whole { len: 100 },
        };
        let file = crate::FileVersion {
            object: 1,
            epoch: 0,
            path: "f".into(),
            version: larder_home::Version::default(),
            home_end: 100,
        };
        let mut want = Want::new(&key, 0..100, &file);
        want.digest = KeyDigest([1; 16]);
        assert!(tier.get(&want).unwrap().is_some());
        tier.put(unit(4, 100));
        assert!(tier.holds(&KeyDigest([1; 16])));
        assert!(!tier.holds(&KeyDigest([2; 16])));
        assert!(tier.holds(&KeyDigest([3; 16])));
        assert_eq!(tier.bytes(), 300);
        // Too large for the tier at all: not kept, nothing dropped.
        tier.put(unit(5, 301));
        assert_eq!(tier.bytes(), 300);
        // Replacing a unit counts its bytes once.
        tier.put(unit(4, 50));
        assert_eq!(tier.bytes(), 250);
    }
}
