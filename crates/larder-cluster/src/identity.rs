//! A node's identity: a random 64-bit id, created the first time a cache directory is used by a cluster
//! member and kept there (`node-id`, private to its owner like everything in the cache directory). The
//! id, not the address or the host name, is what the membership and placement know a node by: a node
//! that comes back with another address still owns what it owned.

use std::io::{self, Write};
use std::path::Path;

/// The file in the cache directory that holds the id, as 16 hex digits and a newline.
pub const ID_FILE: &str = "node-id";

/// Why a node's id could not be had.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read or write the node id in {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} does not hold a node id (16 hex digits); move it away to make a new one")]
    Malformed { path: String },
    #[error("no randomness for a new node id: {0}")]
    Random(String),
}

/// The id of the node whose cache directory is `cache_dir`, made (and kept) on first use. Never 0.
pub fn node_id(cache_dir: &Path) -> Result<u64, IdentityError> {
    let path = cache_dir.join(ID_FILE);
    let shown = path.display().to_string();
    let io_err = |source| IdentityError::Io {
        path: shown.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            return parse(&text).ok_or_else(|| IdentityError::Malformed { path: shown.clone() });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    let id = loop {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).map_err(|e| IdentityError::Random(e.to_string()))?;
        let id = u64::from_le_bytes(bytes);
        if id != 0 {
            break id;
        }
    };
    larder_util::private::create_dir_all(cache_dir).map_err(io_err)?;
    // Written whole under another name, then linked into place: two nodes started on one directory at once
    // (a mistake, but one the lock of the cache catches only later) agree on the first id written.
    let tmp = cache_dir.join(format!("{ID_FILE}.{id:016x}.new"));
    {
        let mut f = larder_util::private::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err)?;
        f.write_all(format!("{id:016x}\n").as_bytes()).map_err(io_err)?;
        f.sync_all().map_err(io_err)?;
    }
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(dir) = std::fs::File::open(cache_dir) {
                let _ = dir.sync_all();
            }
            Ok(id)
        }
        // Another process made it first: its id is the node's.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => node_id(cache_dir),
        Err(e) => Err(io_err(e)),
    }
}

fn parse(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.len() != 16 {
        return None;
    }
    u64::from_str_radix(t, 16).ok().filter(|id| *id != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let id = node_id(&cache).unwrap();
        assert_ne!(id, 0);
        assert_eq!(node_id(&cache).unwrap(), id, "a second start made another id");
        let mode = std::fs::metadata(cache.join(ID_FILE)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the id file is readable by others");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(node_id(other.path()).unwrap(), id, "two caches got the same id");
        let leftovers: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != ID_FILE)
            .collect();
        assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    }

    #[test]
    fn nodes_started_together_on_one_directory_agree() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(|| node_id(dir.path()).unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "ids differ: {ids:x?}");
    }

    #[test]
    fn a_damaged_id_file_is_an_error_that_names_it_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ID_FILE), "not an id\n").unwrap();
        let err = node_id(dir.path()).unwrap_err().to_string();
        assert!(err.contains("node-id") && err.contains("16 hex digits"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(ID_FILE)).unwrap(),
            "not an id\n",
            "the damaged file was replaced"
        );
    }
}
