//! Serving this node's content to the cluster's other nodes (design note 013), as the core sees it: a
//! peer names a unit by its portable key and says where home has the file; this node resolves the path in
//! its own namespace, checks that the version it knows is the one the key names, and answers from its read
//! path: its store, and home too when the asker says this node owns the unit (one home read for every node
//! that wants it, however many ask at once: the read path's single flight).
//!
//! Also here: the units this node holds ([`Fs::held_units`], for the status, for leaving and for
//! migration), and bytes of files whose changes this node holds ([`Fs::serve_held`], design note 016).
//! The transport, and what the cluster does with these, are `larder-cluster`'s.

use std::path::PathBuf;

/// What a peer asks this node for: a unit of home's content.
#[derive(Clone, Copy, Debug)]
pub struct UnitAsk<'a> {
    /// The unit's portable key, encoded.
    pub key: &'a [u8],
    /// Where home has the file, and the block the unit starts at.
    pub path: &'a [u8],
    pub index: u32,
    /// Whether this node may fetch the unit from home to answer (the asker says it is the unit's owner).
    pub forward: bool,
    /// A member to ask first for what it holds: the leaving member that hands the unit over.
    pub from: Option<u64>,
    /// The member asking: the one a walk answering the ask does not ask back.
    pub asker: u64,
}

/// A read of bytes of a file whose changes this node holds and home has not got yet (design note 016).
#[derive(Clone, Copy, Debug)]
pub struct HeldRead<'a> {
    /// The file's path below home's root.
    pub path: &'a [u8],
    /// The revision of the held record the asker read: another version is not served.
    pub revision: i64,
    pub offset: u64,
    pub len: u64,
    /// The symlink's target rather than bytes.
    pub link: bool,
}

/// Why this node does not serve what a peer asked for.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// This node does not hold it (and was not asked to, or could not, fetch it).
    #[error("not held here")]
    NotHeld,
    /// This node knows another version of the file than the ask names.
    #[error("another version is cached here")]
    OtherVersion,
    /// The ask names nothing this node can resolve.
    #[error("unreadable key: {0}")]
    BadKey(String),
    #[error("{0}")]
    Failed(String),
}

pub type ServeResult<T> = Result<T, ServeError>;

/// A unit of home's content this node holds whole: what it can serve, and hands over when it leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldUnit {
    /// The unit's portable key (encoded) and its digest.
    pub key: Vec<u8>,
    pub digest: [u8; 16],
    /// Where home has the file, and the block the unit starts at: what a peer asked for it resolves.
    pub path: PathBuf,
    pub index: u32,
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use larder_home::Version;

    use std::path::Path;

    use super::*;
    use crate::namespace::hit_tests::dir_f;
    use crate::{FileVersion, Fs};

    /// The key of unit `index` of the file at `path` as this node knows it now.
    fn key_of(fs: &Fs, ino: u64, path: &Path, index: u32) -> Vec<u8> {
        let ns = fs.names.read();
        let node = ns.inode(ino).unwrap();
        let file = FileVersion {
            object: node.object,
            epoch: 0,
            path: path.to_path_buf(),
            version: node.attr.as_ref().unwrap().version.clone(),
            home_end: node.home_end(),
        };
        fs.core().unit_of(&file, index).0.encode()
    }

    fn ask<'a>(key: &'a [u8], path: &'a [u8], forward: bool) -> UnitAsk<'a> {
        UnitAsk {
            key,
            path,
            index: 0,
            forward,
            from: None,
            asker: 0,
        }
    }

    #[test]
    fn a_unit_is_served_by_path_and_key_for_the_version_asked_only() {
        let (_tmp, fs, _, ino) = dir_f();
        let path = Path::new("dir/f");
        let key = key_of(&fs, ino, path, 0);
        // Not read yet: held only if the asker lets this node fetch it (it is the owner).
        assert!(matches!(
            fs.serve_unit(&ask(&key, b"dir/f", false)),
            Err(ServeError::NotHeld)
        ));
        assert_eq!(*fs.serve_unit(&ask(&key, b"dir/f", true)).unwrap(), vec![7u8; 10 << 10]);
        // Now held: served without forwarding.
        assert_eq!(
            *fs.serve_unit(&ask(&key, b"dir/f", false)).unwrap(),
            vec![7u8; 10 << 10]
        );
        // A key of another version of the file is not this one.
        let other = fs
            .core()
            .unit_of(
                &FileVersion {
                    object: 0,
                    epoch: 0,
                    path: path.to_path_buf(),
                    version: Version("another".into()),
                    home_end: 10 << 10,
                },
                0,
            )
            .0
            .encode();
        assert!(matches!(
            fs.serve_unit(&ask(&other, b"dir/f", true)),
            Err(ServeError::OtherVersion)
        ));
        // Nor is a path that does not exist, or one that is not plain.
        assert!(fs.serve_unit(&ask(&key, b"dir/nothing", true)).is_err());
        assert!(matches!(
            fs.serve_unit(&ask(&key, b"../etc/passwd", true)),
            Err(ServeError::BadKey(_))
        ));
    }

    #[test]
    fn the_units_held_are_those_read_by_the_keys_a_peer_asks_with_and_not_a_changed_files() {
        let (_tmp, fs, _, ino) = dir_f();
        assert!(fs.held_units().is_empty(), "nothing read yet");
        let fh = fs.open(ino, libc::O_RDONLY).unwrap().fh;
        assert_eq!(fs.read(fh, 0, 1 << 20).unwrap().len(), 10 << 10);
        let held = fs.held_units();
        let key = key_of(&fs, ino, Path::new("dir/f"), 0);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].key, key);
        // The digest every node computes of the key's encoding.
        use sha2::Digest;
        assert_eq!(held[0].digest[..], sha2::Sha256::digest(&key)[..16]);
        assert_eq!(
            (held[0].path.as_path(), held[0].index, held[0].len),
            (Path::new("dir/f"), 0, 10 << 10)
        );
        fs.release(fh).unwrap();
        // Changed here: no longer home's version, so not held as a unit of it.
        let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
        fs.write(fh, 0, b"changed").unwrap();
        assert!(fs.held_units().is_empty());
        fs.release(fh).unwrap();
    }

    #[test]
    fn a_file_with_local_changes_is_never_served_as_homes_version() {
        let (_tmp, fs, _, ino) = dir_f();
        let key = key_of(&fs, ino, Path::new("dir/f"), 0);
        assert!(fs.serve_unit(&ask(&key, b"dir/f", true)).is_ok());
        let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
        fs.write(fh, 0, b"changed here").unwrap();
        let got = fs.serve_unit(&ask(&key, b"dir/f", true));
        assert!(
            matches!(got, Err(ServeError::OtherVersion)),
            "{:?}",
            got.map(|d| d.len())
        );
        fs.release(fh).unwrap();
    }
}
