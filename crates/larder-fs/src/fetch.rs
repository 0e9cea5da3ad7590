//! The data path's fetching half, shared by the file system and its ingest workers: which unit holds a
//! block of a version of a file, and fetching units and runs of them through the tiers.

use std::ops::Range;
use std::sync::Arc;

use larder_cache::Store;
use larder_home::{Home, HomeError};

use crate::FileVersion;
use crate::key::{Content, HomeId, Part, UnitKey};
use crate::stamp::fine_grained_times;
use crate::tier::{FetchResult, Tiers, Want};

/// Home, the store and the tiers between: what a fetch needs, shared with the ingest workers.
pub(crate) struct Core {
    pub home: Arc<dyn Home>,
    pub store: Arc<Store>,
    /// The read path: the store, any tiers between, home; one fetch per unit at a time.
    pub tiers: Tiers,
    /// The home's name in portable keys.
    pub home_id: HomeId,
    /// Files at most this large are fetched whole.
    pub small_file_threshold: u64,
}

impl Core {
    /// The unit that holds block `index` of `file`: the whole file if it is small (as far as home's content
    /// goes), else the block. With the bytes of the file it covers.
    pub(crate) fn unit_of(&self, file: &FileVersion, index: u32) -> (UnitKey, Range<u64>) {
        let home_end = file.home_end;
        let home = self.home_id.clone();
        let content = Content::Home(self.home.content_id(&file.path, &file.version));
        if home_end > 0 && home_end <= self.small_file_threshold {
            // A small file comes in whole, in one request, and is kept as one unit.
            let part = Part::Whole { len: home_end };
            return (UnitKey { home, content, part }, 0..home_end);
        }
        let bs = self.store.block_size();
        let start = index as u64 * bs;
        let len = home_end.saturating_sub(start).min(bs);
        let part = Part::Block {
            index,
            block_size: bs,
            len,
        };
        (UnitKey { home, content, part }, start..start + len)
    }

    /// Block `index` of `object` through the tiers (the store, then home; one fetch per unit at a time),
    /// kept in the nearer tiers on the way back. Callers asking for another version of the block (our own
    /// push moved home on) do not join a fetch of the older one: its key is another.
    ///
    /// The block is kept only if the object did not change locally since `file.epoch`. A caller joining a
    /// fetch under way must clip the answer to its own `home_end`.
    pub(crate) fn fetch(&self, file: &FileVersion, index: u32) -> FetchResult {
        // A run bringing this block in is joined as any walk of its key is (see `Tiers::fetch_run`).
        let (key, range) = self.unit_of(file, index);
        let unit = self.tiers.fetch(&Want::new(&key, range, file))?;
        if let Part::Whole { .. } = key.part {
            let bs = self.store.block_size();
            let from = (index as u64 * bs).min(unit.len() as u64) as usize;
            let to = (from + bs as usize).min(unit.len());
            return Ok(Arc::new(unit[from..to].to_vec()));
        }
        Ok(unit)
    }

    /// Whether block `index` of `file` is neither in the store nor on its way through the tiers.
    pub(crate) fn absent(&self, file: &FileVersion, index: u32) -> bool {
        !self.store.contains((file.object, index)) && !self.tiers.in_flight(&self.unit_of(file, index).0.digest())
    }

    /// Blocks `run` of `file` through the tiers, those no nearer tier has from the source in one request
    /// (home: one ranged read), each kept in the store (a block changed here meanwhile is not: the epoch
    /// moved). Readers missing one of them wait for it meanwhile.
    ///
    /// The run stops short of the first block that is cached or whose fetch is under way (a reader's, or
    /// another run's): what it leaves is someone's already. Returns where it stopped; the first error of
    /// the blocks it fetched, if any.
    pub(crate) fn fetch_run(&self, file: &FileVersion, run: Range<u32>) -> Result<u32, HomeError> {
        let mut units = Vec::with_capacity(run.len());
        for index in run.clone() {
            if self.store.contains((file.object, index)) {
                break;
            }
            units.push(self.unit_of(file, index));
        }
        let wants: Vec<Want> = units
            .iter()
            .map(|(key, range)| Want::new(key, range.clone(), file))
            .collect();
        let results = self.tiers.fetch_run(&wants);
        let reached = run.start + results.len() as u32;
        results.into_iter().find_map(Result::err).map_or(Ok(reached), Err)
    }
}

impl Core {
    /// Whether the cache's file system stamps every write (see [`fine_grained_times`]).
    pub(crate) fn fine_times(&self) -> bool {
        fine_grained_times(self.store.dir())
    }
}
