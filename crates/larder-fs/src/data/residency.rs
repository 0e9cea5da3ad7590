//! What stays in the cache, on request: prefetch (bring files in now, over the ingest streams), pin (bring
//! in and never evict), unpin, and evict (drop the clean data of files now).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use larder_home::{FileKind, HomeError};

use crate::data::DataPath;
use crate::namespace::lock;
use crate::{FileVersion, FsError, FsResult};

/// Most of the cache that pinned files may take: the rest stays for everything else.
pub const PIN_SHARE: f64 = 0.8;

/// What a residency request did to one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Residency {
    /// The file's size (0 for what is not a regular file).
    pub size: u64,
    /// Bytes of it cached after the request.
    pub cached: u64,
    /// Bytes brought in from home (prefetch, pin) or dropped (evict) by the request.
    pub moved: u64,
    pub pinned: bool,
}

/// One file to bring in: where home has it and which blocks are missing.
struct Want {
    slot: usize,
    ino: u64,
    file: FileVersion,
    blocks: Vec<u32>,
}

impl DataPath {
    /// Bring `inos` into the cache now, their blocks fetched over the ingest streams in parallel. Each file
    /// is revalidated first once the validity lag has passed. Directories and other non-files are left as
    /// they are (their metadata is cached by the lookup that named them).
    pub(crate) fn prefetch(&self, inos: &[u64]) -> Vec<FsResult<Residency>> {
        let mut results: Vec<FsResult<Residency>> = inos.iter().map(|_| Ok(Residency::default())).collect();
        let mut wants = Vec::new();
        let mut objects = vec![None; inos.len()];
        for (slot, &ino) in inos.iter().enumerate() {
            match self.want(slot, ino) {
                Ok((file, want)) => {
                    if let Some((object, size)) = file {
                        objects[slot] = Some(object);
                        results[slot] = Ok(Residency {
                            size,
                            cached: self.core.store.cached_bytes(object),
                            ..Residency::default()
                        });
                    }
                    wants.extend(want);
                }
                Err(e) => results[slot] = Err(e),
            }
        }
        let work: Vec<(usize, u32)> = wants
            .iter()
            .enumerate()
            .flat_map(|(w, want)| want.blocks.iter().map(move |b| (w, *b)))
            .collect();
        let next = AtomicUsize::new(0);
        let failed: Mutex<Vec<(usize, FsError)>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..self.cfg.ingest_streams.clamp(1, work.len().max(1)) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(w, index)) = work.get(i) else { return };
                        let want = &wants[w];
                        if self.core.store.contains((want.file.object, index)) {
                            continue;
                        }
                        if let Err(e) = self.fetch_block(want.ino, &want.file, index) {
                            lock(&failed).push((w, e));
                        }
                    }
                });
            }
        });
        for (w, e) in failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            results[wants[w].slot] = Err(e);
        }
        for (r, object) in results.iter_mut().zip(objects) {
            if let (Ok(r), Some(object)) = (r, object) {
                let before = r.cached;
                r.cached = self.core.store.cached_bytes(object);
                r.moved = r.cached.saturating_sub(before);
                r.pinned = self.core.store.pinned(object);
            }
        }
        results
    }

    /// The object and size of `ino` if it is a regular file, and what of it is missing from the cache.
    #[allow(clippy::type_complexity)]
    fn want(&self, slot: usize, ino: u64) -> FsResult<(Option<(u64, u64)>, Option<Want>)> {
        let path = {
            let ns = self.names.read();
            if ns.inode(ino)?.kind == FileKind::File {
                self.names.revalidation_path(&ns, ino)?
            } else {
                None
            }
        };
        if let Some(path) = path {
            self.names.revalidate(ino, &path)?;
        }
        let ns = self.names.read();
        let node = ns.inode(ino)?;
        if node.kind != FileKind::File {
            return Ok((None, None));
        }
        let attr = node.attr.as_ref().ok_or(FsError::NotFound)?;
        let file = Some((node.object, attr.size));
        let Some(path) = ns.home_path(ino)? else {
            // Created here and not at home yet: all of it is in the cache.
            return Ok((file, None));
        };
        let home_end = node.home_end();
        let bs = self.core.store.block_size();
        let blocks: Vec<u32> = (0..home_end.div_ceil(bs) as u32)
            .filter(|b| !self.core.store.contains((node.object, *b)))
            .collect();
        if blocks.is_empty() {
            return Ok((file, None));
        }
        Ok((
            file,
            Some(Want {
                slot,
                ino,
                file: FileVersion {
                    object: node.object,
                    epoch: self.core.store.epoch(node.object),
                    path,
                    version: attr.version.clone(),
                    home_end,
                },
                blocks,
            }),
        ))
    }

    /// Pin `inos` (bring them in and never evict them) or unpin them. Pins stay with the file across
    /// restarts and across new versions from home (a new version of a pinned file is fetched when larder
    /// learns of it). A pin that would take pinned files past [`PIN_SHARE`] of the cache is refused with
    /// `ENOSPC`.
    pub(crate) fn pin(&self, inos: &[u64], pin: bool) -> Vec<FsResult<Residency>> {
        let limit = (self.core.store.stats().bytes_limit as f64 * PIN_SHARE) as u64;
        let mut results = Vec::with_capacity(inos.len());
        let mut fetch = Vec::new();
        for &ino in inos {
            let r = (|| {
                let (object, size, kind) = {
                    let ns = self.names.read();
                    let node = ns.inode(ino)?;
                    let size = node.attr.as_ref().map_or(0, |a| a.size);
                    (node.object, size, node.kind)
                };
                if kind != FileKind::File {
                    return Ok(Residency::default());
                }
                if pin && !self.core.store.pinned(object) {
                    let st = self.core.store.stats();
                    if st.bytes_pinned + size > limit {
                        return Err(FsError::NoSpace);
                    }
                }
                self.core.store.set_pinned(object, pin);
                Ok(Residency {
                    size,
                    cached: self.core.store.cached_bytes(object),
                    moved: 0,
                    pinned: pin,
                })
            })();
            if pin && r.as_ref().is_ok_and(|r| r.size > 0) {
                fetch.push((results.len(), ino));
            }
            results.push(r);
        }
        if !fetch.is_empty() {
            let inos: Vec<u64> = fetch.iter().map(|(_, ino)| *ino).collect();
            for ((slot, _), r) in fetch.iter().zip(self.prefetch(&inos)) {
                results[*slot] = r.map(|mut r| {
                    r.pinned = true;
                    r
                });
            }
        }
        results
    }

    /// Drop the cached data of `inos` now. Changes not yet at home stay (home does not have them), and
    /// pinned files are kept (unpin them first), as are files the kernel is reading directly.
    pub(crate) fn evict(&self, inos: &[u64]) -> Vec<FsResult<Residency>> {
        inos.iter()
            .map(|&ino| {
                let (object, size, kind) = {
                    let ns = self.names.read();
                    let node = ns.inode(ino)?;
                    (node.object, node.attr.as_ref().map_or(0, |a| a.size), node.kind)
                };
                if kind != FileKind::File {
                    return Ok(Residency::default());
                }
                let pinned = self.core.store.kept(object);
                let moved = if pinned {
                    0
                } else {
                    self.core.store.evict_object(object)
                };
                Ok(Residency {
                    size,
                    cached: self.core.store.cached_bytes(object),
                    moved,
                    pinned,
                })
            })
            .collect()
    }
}

/// A short reason for a residency failure, for the command line.
pub fn describe(e: &FsError) -> String {
    match e {
        FsError::NoSpace => format!(
            "pinned files would take more than {}% of the cache",
            (PIN_SHARE * 100.0) as u32
        ),
        FsError::Home(HomeError::NotFound) | FsError::NotFound => "no such file".into(),
        other => other.to_string(),
    }
}
