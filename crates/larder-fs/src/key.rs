//! Portable unit keys: names for cached content that every node computes alike.
//!
//! The local store names a file's content by a cache object id, which means nothing on another node. A
//! [`UnitKey`] names a *unit* (one block of a file, or a small file fetched whole) by what any node can
//! know: which home ([`HomeId`]: its URL, or a name configured for it), which file and version there
//! ([`Content`]: what home reports, never a local device number or object id), and which part of it
//! ([`Part`]). Its [`KeyDigest`] is a fixed-size hash of a stable byte encoding ([`UnitKey::encode`]),
//! the same in every build, process and node: the single-flight key of fetches today, the key peers and a
//! shared bank will be asked by.
//!
//! Encoding, format 1 (integers little-endian; a byte string is its length as a u32, then its bytes):
//!
//! ```text
//! "LK" 0x01                     magic and format
//! home id                       byte string (UTF-8)
//! content                       0x01 ino u64, size u64, mtime_s i64, mtime_ns u32   (POSIX home)
//!                               0x02 path bytes, version bytes                      (named: object store)
//!                               0x03 node u64, seq u64                              (not yet pushed)
//! part                          0x01 index u32, block_size u64, len u64             (a block)
//!                               0x02 len u64                                        (a file's first len bytes, whole)
//! ```
//!
//! The digest is the first 16 bytes of the SHA-256 of the encoding: stable by definition, and hard to
//! collide on purpose, which matters once units are exchanged between nodes through a shared bank.

use std::fmt;
use std::sync::Arc;

use larder_home::ContentId;
use sha2::{Digest, Sha256};

/// The version of the encoding below; bumped if it ever changes, so old and new keys never meet.
pub const KEY_FORMAT: u8 = 1;
const MAGIC: &[u8; 2] = b"LK";

/// Which home content belongs to: its URL unless configured otherwise. Nodes that share a home must use
/// the same id for it (and different homes different ids).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HomeId(pub Arc<str>);

impl HomeId {
    pub fn new(id: impl Into<Arc<str>>) -> HomeId {
        HomeId(id.into())
    }
}

/// A node of a cluster, as named in content not yet pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeId(pub u64);

/// Which content of which file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Content {
    /// A version home holds, named as home reports it.
    Home(ContentId),
    /// Content written on `node` that is not at home yet: the `seq`th such version there. Only that node
    /// has it; it is never offered to a tier shared with other nodes.
    Unpushed { node: NodeId, seq: u64 },
}

/// Which part of the content a unit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// Block `index` of blocks of `block_size` bytes, `len` bytes of it: the block size, or less for the
    /// file's last block (or where a local truncation not yet pushed ends what is read of it).
    Block { index: u32, block_size: u64, len: u64 },
    /// The content's first `len` bytes as one unit: a small file fetched whole (all of it, unless a local
    /// truncation not yet pushed ends what is read sooner).
    Whole { len: u64 },
}

impl Part {
    /// How many bytes the unit holds.
    pub fn len(&self) -> u64 {
        match *self {
            Part::Block { len, .. } | Part::Whole { len } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The portable name of one unit of cached content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnitKey {
    pub home: HomeId,
    pub content: Content,
    pub part: Part,
}

/// A [`UnitKey`]'s hash: what tiers are asked by and answers are checked against.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyDigest(pub [u8; 16]);

impl fmt::Display for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyDigest({self})")
    }
}

impl UnitKey {
    /// Whether the unit may go to tiers shared with other nodes: content that is at home.
    pub fn shareable(&self) -> bool {
        !matches!(
            self.content,
            Content::Unpushed { .. } | Content::Home(ContentId::Held { .. })
        )
    }

    /// The key's stable encoding (see the module's documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.feed(&mut |b| out.extend_from_slice(b));
        out
    }

    /// The key's digest: the first 16 bytes of the SHA-256 of its encoding. Hashes the encoding as it is
    /// produced, without building it.
    pub fn digest(&self) -> KeyDigest {
        let mut hasher = Sha256::new();
        self.feed(&mut |b| hasher.update(b));
        let full = hasher.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        KeyDigest(out)
    }

    fn feed(&self, put: &mut dyn FnMut(&[u8])) {
        let bytes = |put: &mut dyn FnMut(&[u8]), b: &[u8]| {
            put(&(b.len() as u32).to_le_bytes());
            put(b);
        };
        put(MAGIC);
        put(&[KEY_FORMAT]);
        bytes(put, self.home.0.as_bytes());
        match &self.content {
            Content::Home(ContentId::Inode {
                ino,
                size,
                mtime_s,
                mtime_ns,
            }) => {
                put(&[1]);
                put(&ino.to_le_bytes());
                put(&size.to_le_bytes());
                put(&mtime_s.to_le_bytes());
                put(&mtime_ns.to_le_bytes());
            }
            Content::Home(ContentId::Named { path, version }) => {
                put(&[2]);
                bytes(put, path);
                bytes(put, version);
            }
            Content::Unpushed {
                node: NodeId(node),
                seq,
            }
            | Content::Home(ContentId::Held { node, seq }) => {
                put(&[3]);
                put(&node.to_le_bytes());
                put(&seq.to_le_bytes());
            }
        }
        match self.part {
            Part::Block { index, block_size, len } => {
                put(&[1]);
                put(&index.to_le_bytes());
                put(&block_size.to_le_bytes());
                put(&len.to_le_bytes());
            }
            Part::Whole { len } => {
                put(&[2]);
                put(&len.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posix(index: u32) -> UnitKey {
        UnitKey {
            home: HomeId::new("file:///srv/data"),
            content: Content::Home(ContentId::Inode {
                ino: 1234,
                size: 3 << 20,
                mtime_s: 1_700_000_000,
                mtime_ns: 123_456_789,
            }),
            part: Part::Block {
                index,
                block_size: 1 << 20,
                len: 1 << 20,
            },
        }
    }

    fn s3(etag: &str) -> UnitKey {
        UnitKey {
            home: HomeId::new("s3://bucket/prefix"),
            content: Content::Home(ContentId::Named {
                path: b"dir/file.txt".to_vec(),
                version: etag.as_bytes().to_vec(),
            }),
            part: Part::Whole { len: 42 },
        }
    }

    #[test]
    fn encoding_is_as_documented() {
        let key = posix(2);
        let mut want = b"LK\x01".to_vec();
        want.extend_from_slice(&16u32.to_le_bytes());
        want.extend_from_slice(b"file:///srv/data");
        want.push(1);
        want.extend_from_slice(&1234u64.to_le_bytes());
        want.extend_from_slice(&(3u64 << 20).to_le_bytes());
        want.extend_from_slice(&1_700_000_000i64.to_le_bytes());
        want.extend_from_slice(&123_456_789u32.to_le_bytes());
        want.push(1);
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&(1u64 << 20).to_le_bytes());
        want.extend_from_slice(&(1u64 << 20).to_le_bytes());
        assert_eq!(key.encode(), want);
        // The digest hashes exactly the encoding.
        assert_eq!(&key.digest().0[..], &Sha256::digest(&want)[..16]);
    }

    #[test]
    fn digests_are_stable() {
        // Golden values (also computed apart from this code, from the documented encoding): a change here
        // changes every key of every node and bank; bump KEY_FORMAT instead.
        assert_eq!(posix(2).digest().to_string(), "4f1cb9c2bc00e962e4f01cb8331118ca");
        assert_eq!(s3("\"abc\"").digest().to_string(), "5d5d131c965fd9bd3fb0cfb9892328ca");
        assert_eq!(posix(2).digest(), posix(2).clone().digest());
    }

    #[test]
    fn every_part_of_the_key_counts() {
        let base = posix(2);
        let mut seen = std::collections::HashSet::new();
        assert!(seen.insert(base.digest()));
        let mut other_home = base.clone();
        other_home.home = HomeId::new("file:///srv/other");
        let mut other_mtime = base.clone();
        other_mtime.content = Content::Home(ContentId::Inode {
            ino: 1234,
            size: 3 << 20,
            mtime_s: 1_700_000_000,
            mtime_ns: 123_456_790,
        });
        let mut other_size = base.clone();
        other_size.content = Content::Home(ContentId::Inode {
            ino: 1234,
            size: (3 << 20) + 1,
            mtime_s: 1_700_000_000,
            mtime_ns: 123_456_789,
        });
        let mut short = base.clone();
        short.part = Part::Block {
            index: 2,
            block_size: 1 << 20,
            len: 100,
        };
        let mut other_block_size = base.clone();
        other_block_size.part = Part::Block {
            index: 2,
            block_size: 1 << 19,
            len: 1 << 20,
        };
        let mut whole = base.clone();
        whole.part = Part::Whole { len: 1 << 20 };
        let mut unpushed = base.clone();
        unpushed.content = Content::Unpushed {
            node: NodeId(1),
            seq: 7,
        };
        let mut unpushed_elsewhere = unpushed.clone();
        unpushed_elsewhere.content = Content::Unpushed {
            node: NodeId(2),
            seq: 7,
        };
        for key in [
            posix(3),
            other_home,
            other_mtime,
            other_size,
            short,
            other_block_size,
            whole,
            unpushed.clone(),
            unpushed_elsewhere,
            s3("\"abc\""),
            s3("\"abd\""),
        ] {
            assert!(seen.insert(key.digest()), "{key:?} collides");
        }
        assert!(base.shareable());
        assert!(!unpushed.shareable());
    }

    #[test]
    fn byte_strings_are_delimited() {
        // Moving a byte from the path to the version is another key.
        let a = ContentId::Named {
            path: b"ab".to_vec(),
            version: b"c".to_vec(),
        };
        let b = ContentId::Named {
            path: b"a".to_vec(),
            version: b"bc".to_vec(),
        };
        let key = |c| UnitKey {
            home: HomeId::new("s3://b"),
            content: Content::Home(c),
            part: Part::Whole { len: 3 },
        };
        assert_ne!(key(a).digest(), key(b).digest());
    }
}
