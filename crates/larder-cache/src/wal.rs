//! The index's log: changes written to the operating system before the call that made them returns, so
//! that they survive the daemon being killed, while the index itself is made durable (fsynced) only by
//! group commits at short intervals ([`Durability::Process`]).
//!
//! Two files are used in turn. Each starts with a header carrying a generation; each record is one
//! [`crate::Db::submit`]'s mutations, framed by their length and CRC-32C, so a record torn by a crash ends
//! the replay and is never applied in part. A checkpoint moves new records to the other file, makes the
//! index durable with everything the first file held, then empties it. At open, what both files hold is
//! applied in order of generation: everything after the last durable commit is in them, and applying
//! again what the index already holds changes nothing (every mutation puts or removes keys).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::db::Mutation;

const MAGIC: &[u8; 8] = b"LRDRWAL1";
const HEADER: u64 = 16;
/// A record longer than this is not one of ours (a torn length): the replay ends there.
const MAX_RECORD: u32 = 256 << 20;

/// How durable a change is when the call that made it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Written to the operating system (the log): survives the daemon being killed; made durable against
    /// power loss by `fsync`, and by the group commit within [`crate::Db::GROUP_COMMIT`].
    #[default]
    Process,
    /// Durable against power loss: every change waits for an fsynced commit of the index.
    Power,
}

impl Durability {
    pub fn name(self) -> &'static str {
        match self {
            Durability::Process => "process",
            Durability::Power => "power",
        }
    }
}

/// The two log files of an index.
pub(crate) struct Wal {
    files: [File; 2],
    active: usize,
    generation: u64,
    /// Where the next record goes in the active file.
    end: u64,
}

pub(crate) fn paths(index: &Path) -> [PathBuf; 2] {
    let name = index
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    [0, 1].map(|i| index.with_file_name(format!("{name}.log{i}")))
}

fn open_file(path: &Path) -> io::Result<File> {
    crate::private::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// What the log files of `index` hold, in the order the changes were made, and the files themselves.
pub(crate) fn recover(index: &Path) -> io::Result<(Vec<Mutation>, [File; 2], u64)> {
    let [a, b] = paths(index);
    let files = [open_file(&a)?, open_file(&b)?];
    let mut found: Vec<(u64, Vec<Mutation>)> = Vec::new();
    let mut torn = 0u64;
    for f in &files {
        let data = read_all(f)?;
        if data.len() < HEADER as usize || &data[..8] != MAGIC {
            continue;
        }
        let generation = u64::from_le_bytes(data[8..16].try_into().expect("8 bytes"));
        let mut muts = Vec::new();
        let mut at = HEADER as usize;
        while at + 8 <= data.len() {
            let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
            let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
            let body = at + 8;
            if len > MAX_RECORD || body + len as usize > data.len() {
                torn += 1;
                break;
            }
            let payload = &data[body..body + len as usize];
            if crc32c::crc32c(payload) != crc {
                torn += 1;
                break;
            }
            match postcard::from_bytes::<Vec<Mutation>>(payload) {
                Ok(m) => muts.extend(m),
                Err(_) => {
                    torn += 1;
                    break;
                }
            }
            at = body + len as usize;
        }
        found.push((generation, muts));
    }
    if torn > 0 {
        tracing::info!("the index's log ended in a record a crash cut short; it was never acknowledged");
    }
    found.sort_by_key(|(g, _)| *g);
    let next = found.last().map_or(1, |(g, _)| g + 1);
    let muts = found.into_iter().flat_map(|(_, m)| m).collect();
    Ok((muts, files, next))
}

fn read_all(f: &File) -> io::Result<Vec<u8>> {
    let len = f.metadata()?.len() as usize;
    let mut buf = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = f.read_at(&mut buf[at..], at as u64)?;
        if n == 0 {
            break;
        }
        at += n;
    }
    buf.truncate(at);
    Ok(buf)
}

impl Wal {
    /// Start logging into emptied `files`, the first with `generation`.
    pub(crate) fn start(files: [File; 2], generation: u64) -> io::Result<Wal> {
        for f in &files {
            f.set_len(0)?;
        }
        let mut wal = Wal {
            files,
            active: 0,
            generation,
            end: 0,
        };
        wal.header()?;
        Ok(wal)
    }

    fn header(&mut self) -> io::Result<()> {
        let mut h = [0u8; HEADER as usize];
        h[..8].copy_from_slice(MAGIC);
        h[8..].copy_from_slice(&self.generation.to_le_bytes());
        self.files[self.active].write_all_at(&h, 0)?;
        self.end = HEADER;
        Ok(())
    }

    /// Append one record holding `mutations`.
    pub(crate) fn append(&mut self, mutations: &[Mutation]) -> io::Result<()> {
        let mut rec = postcard::to_extend(mutations, vec![0u8; 8]).map_err(io::Error::other)?;
        let len = (rec.len() - 8) as u32;
        let crc = crc32c::crc32c(&rec[8..]);
        rec[..4].copy_from_slice(&len.to_le_bytes());
        rec[4..8].copy_from_slice(&crc.to_le_bytes());
        self.files[self.active].write_all_at(&rec, self.end)?;
        self.end += rec.len() as u64;
        Ok(())
    }

    /// Go on in the other file (emptied first); the one left holds everything logged so far. Returns it,
    /// to be emptied with [`Wal::forget`] once the index is durable.
    pub(crate) fn rotate(&mut self) -> io::Result<usize> {
        let old = self.active;
        self.active = 1 - old;
        self.generation += 1;
        self.files[self.active].set_len(0)?;
        self.header()?;
        Ok(old)
    }

    /// Empty file `which`: the index holds all of it durably.
    pub(crate) fn forget(&self, which: usize) -> io::Result<()> {
        self.files[which].set_len(0)
    }

    /// Empty both files and start the active one anew: the index holds everything durably (at close).
    pub(crate) fn clear(&mut self) -> io::Result<()> {
        let other = 1 - self.active;
        self.files[other].set_len(0)?;
        self.files[self.active].set_len(0)?;
        self.header()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Mutation> {
        vec![
            Mutation::PutMeta("next_ino", 7),
            Mutation::PutInode(3, b"rec".to_vec()),
            Mutation::DelInode(4),
            Mutation::PutDentry(1, b"name".to_vec(), 3),
            Mutation::DelDentry(1, b"old".to_vec()),
            Mutation::PutBlock {
                object: 9,
                index: 2,
                len: 4096,
                crc: 0xdead_beef,
            },
            Mutation::DelBlock { object: 9, index: 3 },
            Mutation::DelObject(10),
            Mutation::PutObject {
                object: 11,
                flags: 3,
                len: 1 << 40,
                crc: 5,
            },
            Mutation::DelObjectMeta(12),
            Mutation::PutOp(13, b"op".to_vec()),
            Mutation::DelOp(14),
            Mutation::PutListing(15, 1_700_000_000_000),
            Mutation::ClearListings,
        ]
    }

    #[test]
    fn every_mutation_comes_back_as_it_was_logged() {
        let out = postcard::to_allocvec(&sample()).unwrap();
        let back: Vec<Mutation> = postcard::from_bytes(&out).unwrap();
        assert_eq!(format!("{back:?}"), format!("{:?}", sample()));
    }

    #[test]
    fn a_torn_last_record_is_dropped_and_earlier_ones_and_the_other_file_replayed_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("index.redb");
        let (m, files, next) = recover(&index).unwrap();
        assert!(m.is_empty());
        let mut wal = Wal::start(files, next).unwrap();
        wal.append(&[Mutation::PutMeta("next_ino", 1)]).unwrap();
        let old = wal.rotate().unwrap();
        wal.append(&[Mutation::PutMeta("next_ino", 2)]).unwrap();
        wal.append(&[Mutation::PutMeta("next_ino", 3)]).unwrap();
        let [_, p1] = paths(&index);
        assert_eq!(old, 0);
        // Cut the last record short, as a crash in its write would.
        let f = open_file(&p1).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len - 3).unwrap();
        drop(wal);
        let (m, _, next2) = recover(&index).unwrap();
        assert_eq!(format!("{m:?}"), "[PutMeta(\"next_ino\", 1), PutMeta(\"next_ino\", 2)]");
        assert_eq!(next2, next + 2);
    }

    #[test]
    fn a_flipped_byte_ends_the_replay_there() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("index.redb");
        let (_, files, next) = recover(&index).unwrap();
        let mut wal = Wal::start(files, next).unwrap();
        wal.append(&[Mutation::DelInode(1)]).unwrap();
        wal.append(&[Mutation::DelInode(2)]).unwrap();
        let [p0, _] = paths(&index);
        let f = open_file(&p0).unwrap();
        let mut b = [0u8; 1];
        let at = f.metadata().unwrap().len() - 2;
        f.read_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
        let (m, _, _) = recover(&index).unwrap();
        assert_eq!(format!("{m:?}"), "[DelInode(1)]");
    }
}
