//! The persistent form of an inode.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use larder_home::{FileKind, HomeAttr, Version};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub(crate) struct AttrRecord {
    kind: FileKind,
    id: u64,
    size: u64,
    perm: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    rdev: u64,
    blocks: u64,
    atime_ns: i128,
    mtime_ns: i128,
    ctime_ns: i128,
    version: String,
}

/// What survives a restart of one inode.
#[derive(Serialize, Deserialize)]
pub(crate) struct InodeRecord {
    pub parent: u64,
    pub name: Vec<u8>,
    pub kind: FileKind,
    pub attr: Option<AttrRecord>,
    pub object: u64,
    pub symlink: Option<Vec<u8>>,
    /// Further (parent, name) pairs of the same object (hard links).
    pub aliases: Vec<(u64, Vec<u8>)>,
    /// Where home has the object now: (parent inode, name); `None` until a create made here reaches home.
    pub home_loc: Option<(u64, Vec<u8>)>,
    /// Size of the version at home the local content was based on: bytes past it exist only here.
    pub home_size: Option<u64>,
    /// Byte ranges not yet at home.
    pub dirty: Vec<(u64, u64)>,
    /// Home took the name for another object while this one waited to be created there.
    pub conflict: bool,
    /// A push that may have reached home, not yet confirmed: the ranges it sent and the size.
    pub attempt: Option<(Vec<(u64, u64)>, u64)>,
    /// Its extended attributes, where known (names with values).
    pub xattrs: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    /// The push in `attempt` sent the whole content (home cut the file to nothing first): the ranges kept
    /// are only those still comparable, so they cannot tell.
    pub attempt_whole: bool,
}

/// An inode record as index format 5 wrote it, before a push attempt said whether it was of the whole
/// content: the format-4 record and its extended attributes.
#[derive(Deserialize)]
struct RecordV5 {
    v4: RecordV4,
    xattrs: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl RecordV5 {
    fn upgrade(self) -> InodeRecord {
        InodeRecord {
            xattrs: self.xattrs,
            ..self.v4.upgrade()
        }
    }
}

/// An inode record as index format 4 wrote it before extended attributes were kept: the format-3 record and
/// its push attempt (postcard writes a struct's fields one after the other, so nesting the older form reads
/// the same bytes).
#[derive(Deserialize)]
struct RecordV4 {
    v3: RecordV3,
    attempt: Option<(Vec<(u64, u64)>, u64)>,
}

impl RecordV4 {
    fn upgrade(self) -> InodeRecord {
        // Its ranges were all the push sent, or what was comparable of them: whole as far as they tell.
        let attempt_whole = self
            .attempt
            .as_ref()
            .is_some_and(|(ranges, size)| *size > 0 && ranges.first().is_some_and(|r| r.0 == 0 && r.1 >= *size));
        InodeRecord {
            attempt: self.attempt,
            attempt_whole,
            ..self.v3.upgrade()
        }
    }
}

/// An inode record as index format 3 wrote it (before pushes were recorded).
#[derive(Deserialize)]
struct RecordV3 {
    parent: u64,
    name: Vec<u8>,
    kind: FileKind,
    attr: Option<AttrRecord>,
    object: u64,
    symlink: Option<Vec<u8>>,
    aliases: Vec<(u64, Vec<u8>)>,
    home_loc: Option<(u64, Vec<u8>)>,
    home_size: Option<u64>,
    dirty: Vec<(u64, u64)>,
    conflict: bool,
}

impl RecordV3 {
    fn upgrade(self) -> InodeRecord {
        InodeRecord {
            parent: self.parent,
            name: self.name,
            kind: self.kind,
            attr: self.attr,
            object: self.object,
            symlink: self.symlink,
            aliases: self.aliases,
            home_loc: self.home_loc,
            home_size: self.home_size,
            dirty: self.dirty,
            conflict: self.conflict,
            attempt: None,
            xattrs: None,
            attempt_whole: false,
        }
    }
}

/// Nanoseconds since the epoch (negative before it).
pub(crate) fn to_ns(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// The time `ns` nanoseconds from the epoch.
pub(crate) fn from_ns(ns: i128) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs() as u64)
    }
}

impl AttrRecord {
    pub fn from_attr(a: &HomeAttr) -> AttrRecord {
        AttrRecord {
            kind: a.kind,
            id: a.id,
            size: a.size,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            rdev: a.rdev,
            blocks: a.blocks,
            atime_ns: to_ns(a.atime),
            mtime_ns: to_ns(a.mtime),
            ctime_ns: to_ns(a.ctime),
            version: a.version.0.clone(),
        }
    }

    pub fn to_attr(&self) -> HomeAttr {
        HomeAttr {
            kind: self.kind,
            id: self.id,
            size: self.size,
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            rdev: self.rdev,
            blocks: self.blocks,
            atime: from_ns(self.atime_ns),
            mtime: from_ns(self.mtime_ns),
            ctime: from_ns(self.ctime_ns),
            version: Version(self.version.clone()),
        }
    }
}

impl InodeRecord {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<InodeRecord> {
        // Each older form is a prefix of the newer: tried newest first, whole records only (postcard would
        // take an older form's fields from the front of a newer record and ignore the rest).
        fn whole<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
            postcard::take_from_bytes::<T>(bytes)
                .ok()
                .filter(|(_, rest)| rest.is_empty())
                .map(|(r, _)| r)
        }
        whole::<InodeRecord>(bytes)
            .or_else(|| whole::<RecordV5>(bytes).map(RecordV5::upgrade))
            .or_else(|| whole::<RecordV4>(bytes).map(RecordV4::upgrade))
            .or_else(|| whole::<RecordV3>(bytes).map(RecordV3::upgrade))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_including_times_before_1970() {
        let attr = HomeAttr {
            kind: FileKind::File,
            id: 42,
            size: 5,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            rdev: 0,
            blocks: 8,
            atime: UNIX_EPOCH - Duration::from_secs(86400 * 365),
            mtime: UNIX_EPOCH + Duration::new(1_700_000_000, 123),
            ctime: UNIX_EPOCH,
            version: Version("1:5:7".into()),
        };
        let rec = InodeRecord {
            parent: 1,
            name: b"f".to_vec(),
            kind: FileKind::File,
            attr: Some(AttrRecord::from_attr(&attr)),
            object: 9,
            symlink: None,
            aliases: vec![(3, b"g".to_vec())],
            home_loc: Some((1, b"f".to_vec())),
            home_size: Some(5),
            dirty: vec![(0, 3)],
            conflict: false,
            attempt: Some((vec![(3, 5)], 5)),
            xattrs: Some(vec![(b"user.a".to_vec(), b"\0bin".to_vec())]),
            attempt_whole: true,
        };
        let back = InodeRecord::decode(&rec.encode()).unwrap();
        assert_eq!(back.attr.unwrap().to_attr(), attr);
        assert_eq!(back.object, 9);
        assert_eq!(back.dirty, vec![(0, 3)]);
        assert_eq!(back.attempt, Some((vec![(3, 5)], 5)));
        assert_eq!(back.xattrs, Some(vec![(b"user.a".to_vec(), b"\0bin".to_vec())]));
        assert!(back.attempt_whole);
    }

    /// A file's record with a push attempt of `ranges` of its 5 bytes, nothing else of note.
    fn with_attempt(ranges: Vec<(u64, u64)>) -> InodeRecord {
        InodeRecord {
            parent: 1,
            name: b"f".to_vec(),
            kind: FileKind::File,
            attr: None,
            object: 9,
            symlink: None,
            aliases: Vec::new(),
            home_loc: Some((1, b"f".to_vec())),
            home_size: Some(5),
            dirty: Vec::new(),
            conflict: false,
            attempt: Some((ranges, 5)),
            xattrs: None,
            attempt_whole: false,
        }
    }

    #[test]
    fn a_record_from_before_extended_attributes_keeps_its_push_attempt() {
        let rec = InodeRecord {
            dirty: vec![(0, 3)],
            ..with_attempt(vec![(3, 5)])
        };
        // The older form is this one without its last two fields (`None` and `false`: one byte each).
        let mut old = rec.encode();
        assert_eq!((old.pop(), old.pop()), (Some(0), Some(0)));
        let back = InodeRecord::decode(&old).expect("an older record decodes");
        assert_eq!(
            back.attempt,
            Some((vec![(3, 5)], 5)),
            "read as the older form, not the oldest"
        );
        assert_eq!((back.dirty, back.xattrs), (vec![(0, 3)], None));
    }

    #[test]
    fn a_record_from_before_attempts_said_whether_they_were_whole_reads_it_from_the_ranges() {
        let rec = |ranges: Vec<(u64, u64)>| InodeRecord {
            xattrs: Some(vec![(b"user.a".to_vec(), b"1".to_vec())]),
            ..with_attempt(ranges)
        };
        for (ranges, whole) in [(vec![(0, 5)], true), (vec![(3, 5)], false)] {
            // The older form is this one without its last field (`false`: one byte).
            let mut old = rec(ranges.clone()).encode();
            assert_eq!(old.pop(), Some(0));
            let back = InodeRecord::decode(&old).expect("an older record decodes");
            assert_eq!(back.attempt, Some((ranges, 5)));
            assert_eq!(back.xattrs, Some(vec![(b"user.a".to_vec(), b"1".to_vec())]));
            assert_eq!(back.attempt_whole, whole);
        }
    }
}
