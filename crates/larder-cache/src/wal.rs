//! The index's log: changes written to the operating system before the call that made them returns, so
//! that they survive the daemon being killed, while the index itself is made durable (fsynced) only by
//! group commits at short intervals ([`Durability::Process`]).
//!
//! Two files are used in turn. Each starts with a header carrying a generation; each record is one
//! [`crate::Db::submit`]'s mutations. A checkpoint moves new records to the other file, makes the index
//! durable with everything the first file held, then empties it. At open, what both files hold is applied
//! in order of generation: everything after the last durable commit is in them, and applying again what
//! the index already holds changes nothing (every mutation puts or removes keys).
//!
//! **Damage.** A record is framed by a mark, its number in its file, its length and a CRC-32C of all of
//! them and its bytes, and it is written twice, one copy after the other, in one write. A replay that
//! finds a copy damaged (a flipped byte, a bad sector) takes the other; one that finds neither looks for
//! the next mark whose record checks, and counts the records it lost by their numbers. So one flipped
//! byte loses nothing, damage reaching both copies of a record loses that record alone (and is reported:
//! the index refuses to open, [`crate::CacheError::IndexDamaged`], since what it lost may be a change not
//! yet at home), and a record cut short by a crash at the end of the log (never acknowledged) is dropped
//! without a word. Files written by the first format (one copy, no marks) are still read.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::db::Mutation;

const MAGIC: &[u8; 8] = b"LRDRWAL2";
/// The first format: records of length, CRC and bytes, once each.
const MAGIC_V1: &[u8; 8] = b"LRDRWAL1";
const HEADER: u64 = 16;
/// A record longer than this is not one of ours (a torn length): the replay ends there.
const MAX_RECORD: u32 = 256 << 20;
/// The first bytes of every record: a replay that lost its way looks for the next one by them.
const MARK: [u8; 4] = *b"LRec";
/// Mark, number, length, CRC.
const RECORD_HEAD: usize = 16;

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
    /// The number of the next record in the active file.
    seq: u32,
}

/// What the log files of an index hold.
pub(crate) struct Recovered {
    /// The changes, in the order they were made.
    pub mutations: Vec<Mutation>,
    pub files: [File; 2],
    /// The generation the next log file starts with.
    pub next_generation: u64,
    /// Records neither copy of which could be read, with records after them that could: damage, not a
    /// crash cutting the end short.
    pub lost: u64,
    /// Records whose first copy was damaged and whose second was taken.
    pub mended: u64,
}

/// One record: mark, number, length, CRC of the three and the bytes, then the bytes.
fn frame(seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut rec = Vec::with_capacity(RECORD_HEAD + payload.len());
    rec.extend_from_slice(&MARK);
    rec.extend_from_slice(&seq.to_le_bytes());
    rec.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut crc = crc32c::crc32c(&rec[4..12]);
    crc = crc32c::crc32c_append(crc, payload);
    rec.extend_from_slice(&crc.to_le_bytes());
    rec.extend_from_slice(payload);
    rec
}

/// The record at `at` of `data`, if one is there whole and checks: (number, bytes, where the next begins).
fn record_at(data: &[u8], at: usize) -> Option<(u32, &[u8], usize)> {
    let head = data.get(at..at + RECORD_HEAD)?;
    if head[..4] != MARK {
        return None;
    }
    let seq = u32::from_le_bytes(head[4..8].try_into().ok()?);
    let len = u32::from_le_bytes(head[8..12].try_into().ok()?);
    let crc = u32::from_le_bytes(head[12..16].try_into().ok()?);
    if len > MAX_RECORD {
        return None;
    }
    let body = data.get(at + RECORD_HEAD..at + RECORD_HEAD + len as usize)?;
    (crc32c::crc32c_append(crc32c::crc32c(&head[4..12]), body) == crc).then_some((
        seq,
        body,
        at + RECORD_HEAD + len as usize,
    ))
}

/// The records of a file of the current format: its mutations, the records lost and those mended.
fn replay(data: &[u8]) -> (Vec<Mutation>, u64, u64) {
    let (mut muts, mut lost, mut mended) = (Vec::new(), 0u64, 0u64);
    let mut at = HEADER as usize;
    let mut expect = 0u32;
    // Whether the last step skipped damaged bytes to find a record.
    let mut searched = false;
    while at < data.len() {
        let Some((seq, body, next)) = record_at(data, at) else {
            // Damaged here, or the end a crash cut short: the next record that checks, if any.
            match (at + 1..data.len().saturating_sub(RECORD_HEAD - 1))
                .find(|&i| data[i..i + 4] == MARK && record_at(data, i).is_some())
            {
                Some(i) => {
                    at = i;
                    searched = true;
                    continue;
                }
                None => break,
            }
        };
        at = next;
        if seq < expect {
            // The second copy of a record taken already.
            searched = false;
            continue;
        }
        if seq > expect {
            lost += (seq - expect) as u64;
        } else if searched {
            mended += 1;
        }
        searched = false;
        expect = seq + 1;
        match postcard::from_bytes::<Vec<Mutation>>(body) {
            Ok(m) => muts.extend(m),
            Err(_) => lost += 1,
        }
    }
    (muts, lost, mended)
}

/// The records of a file of the first format, up to the first that is torn or damaged.
fn replay_v1(data: &[u8]) -> Vec<Mutation> {
    let mut muts = Vec::new();
    let mut at = HEADER as usize;
    while at + 8 <= data.len() {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
        let body = at + 8;
        if len > MAX_RECORD || body + len as usize > data.len() {
            break;
        }
        let payload = &data[body..body + len as usize];
        if crc32c::crc32c(payload) != crc {
            break;
        }
        match postcard::from_bytes::<Vec<Mutation>>(payload) {
            Ok(m) => muts.extend(m),
            Err(_) => break,
        }
        at = body + len as usize;
    }
    muts
}

pub(crate) fn paths(index: &Path) -> [PathBuf; 2] {
    let name = index
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    [0, 1].map(|i| index.with_file_name(format!("{name}.log{i}")))
}

fn open_file(path: &Path) -> io::Result<File> {
    larder_util::private::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// What the log files of `index` hold, in the order the changes were made, and the files themselves.
pub(crate) fn recover(index: &Path) -> io::Result<Recovered> {
    let [a, b] = paths(index);
    let files = [open_file(&a)?, open_file(&b)?];
    let mut found: Vec<(u64, Vec<Mutation>)> = Vec::new();
    let (mut lost, mut mended) = (0, 0);
    for f in &files {
        let data = read_all(f)?;
        if data.len() < HEADER as usize {
            continue;
        }
        let generation = u64::from_le_bytes(data[8..16].try_into().expect("8 bytes"));
        let muts = match &data[..8] {
            m if m == MAGIC => {
                let (muts, l, m) = replay(&data);
                lost += l;
                mended += m;
                muts
            }
            m if m == MAGIC_V1 => replay_v1(&data),
            _ => continue,
        };
        found.push((generation, muts));
    }
    found.sort_by_key(|(g, _)| *g);
    let next_generation = found.last().map_or(1, |(g, _)| g + 1);
    let mutations = found.into_iter().flat_map(|(_, m)| m).collect();
    Ok(Recovered {
        mutations,
        files,
        next_generation,
        lost,
        mended,
    })
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
            seq: 0,
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
        self.seq = 0;
        Ok(())
    }

    /// Append one record holding `mutations`: framed, and written twice (see the module doc).
    pub(crate) fn append(&mut self, mutations: &[Mutation]) -> io::Result<()> {
        let payload = postcard::to_allocvec(mutations).map_err(io::Error::other)?;
        let rec = frame(self.seq, &payload);
        let mut both = Vec::with_capacity(2 * rec.len());
        both.extend_from_slice(&rec);
        both.extend_from_slice(&rec);
        self.files[self.active].write_all_at(&both, self.end)?;
        self.end += both.len() as u64;
        self.seq = self.seq.wrapping_add(1);
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
        let r = recover(&index).unwrap();
        assert!(r.mutations.is_empty());
        let next = r.next_generation;
        let mut wal = Wal::start(r.files, next).unwrap();
        wal.append(&[Mutation::PutMeta("next_ino", 1)]).unwrap();
        let old = wal.rotate().unwrap();
        wal.append(&[Mutation::PutMeta("next_ino", 2)]).unwrap();
        wal.append(&[Mutation::PutMeta("next_ino", 3)]).unwrap();
        let [_, p1] = paths(&index);
        assert_eq!(old, 0);
        // Cut the last record short, as a crash in its write would: both of its copies go.
        let f = open_file(&p1).unwrap();
        let len = f.metadata().unwrap().len();
        let one = (len - HEADER) / 2;
        f.set_len(len - one - 3).unwrap();
        drop(wal);
        let r = recover(&index).unwrap();
        assert_eq!(
            format!("{:?}", r.mutations),
            "[PutMeta(\"next_ino\", 1), PutMeta(\"next_ino\", 2)]"
        );
        assert_eq!((r.lost, r.mended), (0, 0), "a torn end is not damage");
        assert_eq!(r.next_generation, next + 2);
    }

    /// Twenty records of one mutation each, in the first log file of an index in `dir`; the file's path.
    fn twenty(dir: &Path) -> PathBuf {
        let index = dir.join("index.redb");
        let r = recover(&index).unwrap();
        let mut wal = Wal::start(r.files, r.next_generation).unwrap();
        for ino in 0..20 {
            wal.append(&[Mutation::PutInode(ino, vec![ino as u8; 40])]).unwrap();
        }
        paths(&index)[0].clone()
    }

    fn inos(m: &[Mutation]) -> Vec<u64> {
        m.iter()
            .map(|m| match m {
                Mutation::PutInode(ino, _) => *ino,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_flipped_byte_anywhere_in_a_record_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = twenty(dir.path());
        let len = open_file(&log).unwrap().metadata().unwrap().len();
        // Every byte of the records, one at a time.
        for at in HEADER..len {
            let f = open_file(&log).unwrap();
            let mut b = [0u8; 1];
            f.read_at(&mut b, at).unwrap();
            f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
            let r = recover(&dir.path().join("index.redb")).unwrap();
            assert_eq!(inos(&r.mutations), (0..20).collect::<Vec<_>>(), "byte {at} flipped");
            assert_eq!(r.lost, 0, "byte {at} flipped");
            f.write_all_at(&b, at).unwrap();
        }
    }

    #[test]
    fn damage_to_both_copies_of_a_record_loses_it_alone_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let log = twenty(dir.path());
        let len = open_file(&log).unwrap().metadata().unwrap().len();
        let pair = (len - HEADER) / 20;
        // The 16 bytes around the joint of the two copies of record 7.
        let joint = HEADER + 7 * pair + pair / 2;
        open_file(&log).unwrap().write_all_at(&[0xa5; 16], joint - 8).unwrap();
        let r = recover(&dir.path().join("index.redb")).unwrap();
        let want: Vec<u64> = (0..20).filter(|i| *i != 7).collect();
        assert_eq!(inos(&r.mutations), want);
        assert_eq!(r.lost, 1);
        // And 16 bytes within one copy lose nothing.
        let dir = tempfile::tempdir().unwrap();
        let log = twenty(dir.path());
        open_file(&log)
            .unwrap()
            .write_all_at(&[0xa5; 16], HEADER + 12 * pair + 3)
            .unwrap();
        let r = recover(&dir.path().join("index.redb")).unwrap();
        assert_eq!(inos(&r.mutations), (0..20).collect::<Vec<_>>());
        assert_eq!((r.lost, r.mended), (0, 1));
    }

    #[test]
    fn a_log_of_the_first_format_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("index.redb");
        let [p0, _] = paths(&index);
        let mut data = Vec::new();
        data.extend_from_slice(MAGIC_V1);
        data.extend_from_slice(&5u64.to_le_bytes());
        for ino in 0..3u64 {
            let payload = postcard::to_allocvec(&vec![Mutation::DelInode(ino)]).unwrap();
            data.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            data.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
            data.extend_from_slice(&payload);
        }
        std::fs::write(&p0, &data).unwrap();
        let r = recover(&index).unwrap();
        assert_eq!(format!("{:?}", r.mutations), "[DelInode(0), DelInode(1), DelInode(2)]");
        assert_eq!(r.next_generation, 6);
    }
}
