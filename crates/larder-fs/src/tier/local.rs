//! The tiers every node has: its local store, and home.

use std::sync::Arc;

use larder_cache::Store;
use larder_home::Home;

use super::{Tier, TierError, Unit, Want};
use crate::key::Part;

/// The local store: blocks and whole small files of this node's cache objects.
pub struct StoreTier {
    store: Arc<Store>,
}

impl StoreTier {
    pub fn new(store: Arc<Store>) -> StoreTier {
        StoreTier { store }
    }

    /// The first `len` bytes of `object` if every block of them is in the store.
    fn cached_whole(&self, object: u64, len: u64) -> Option<Vec<u8>> {
        if !self.store.present(object, len) {
            return None;
        }
        let bs = self.store.block_size();
        let mut out = Vec::with_capacity(len as usize);
        for index in 0..len.div_ceil(bs) {
            let want = (len - index * bs).min(bs) as usize;
            let mut block = self.store.read((object, index as u32), 0, want).ok()??;
            block.resize(want, 0);
            out.extend_from_slice(&block);
        }
        Some(out)
    }
}

impl Tier for StoreTier {
    fn name(&self) -> &'static str {
        "cache"
    }

    /// The store checks each block against the checksum in its index on its first read from disk.
    fn checks_own_answers(&self) -> bool {
        true
    }

    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError> {
        let object = want.file.object;
        let data = match want.key.part {
            Part::Whole { len } => self.cached_whole(object, len),
            Part::Block { index, len, .. } => {
                if !self.store.contains((object, index)) {
                    return Ok(None);
                }
                let block = self
                    .store
                    .read((object, index), 0, len as usize)
                    .map_err(|e| TierError::Io(e.to_string()))?;
                // A hole at the end of the cached copy reads as zeros.
                block.map(|mut b| {
                    b.resize(len as usize, 0);
                    b
                })
            }
        };
        Ok(data.map(|d| Unit::new(want.digest, Arc::new(d))))
    }

    fn offer(&self, want: &Want, unit: &Unit) -> Result<(), TierError> {
        let Want { file, key, .. } = want;
        match key.part {
            Part::Whole { .. } => self.store.fill_whole(file.object, &unit.data, file.epoch),
            // A block's unit is the block: its checksum, checked on the way here, is the block's.
            Part::Block { index, .. } => {
                self.store
                    .fill_checked((file.object, index), &unit.data, unit.crc32c, file.epoch)
            }
        }
        .map_err(|e| TierError::Io(e.to_string()))
    }
}

/// Home: the source of every unit, at the version asked for (a version home no longer has is
/// [`larder_home::HomeError::Stale`]). Never filled.
pub struct HomeTier {
    home: Arc<dyn Home>,
}

impl HomeTier {
    pub fn new(home: Arc<dyn Home>) -> HomeTier {
        HomeTier { home }
    }
}

impl Tier for HomeTier {
    fn name(&self) -> &'static str {
        "home"
    }

    /// Home's answer is the truth, its version checked by home itself.
    fn checks_own_answers(&self) -> bool {
        true
    }

    /// One ranged read for the run, cut into its units (the last ones short, or missing, where the file
    /// ends sooner than asked).
    fn get_run(&self, wants: &[Want]) -> Result<Option<Vec<Unit>>, TierError> {
        let (Some(first), Some(last)) = (wants.first(), wants.last()) else {
            return Ok(Some(Vec::new()));
        };
        let (path, version) = (&first.file.path, &first.file.version);
        let start = first.range.start;
        let data = self
            .home
            .read(path, version, start, (last.range.end - start) as usize)?;
        let mut units = Vec::with_capacity(wants.len());
        for want in wants {
            let from = (want.range.start - start) as usize;
            if from >= data.len() && !units.is_empty() {
                break;
            }
            let to = ((want.range.end - start) as usize).min(data.len());
            let bytes = data.get(from..to).unwrap_or_default().to_vec();
            units.push(Unit::new(want.digest, Arc::new(bytes)));
        }
        Ok(Some(units))
    }

    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError> {
        let (path, version) = (&want.file.path, &want.file.version);
        let len = (want.range.end - want.range.start) as usize;
        let data = self.home.read(path, version, want.range.start, len)?;
        Ok(Some(Unit::new(want.digest, Arc::new(data))))
    }
}
