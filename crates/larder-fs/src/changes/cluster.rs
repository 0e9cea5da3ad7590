//! The change pipeline in a cluster: draining this node's changes before it gives a file's write token up.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::*;

impl Changes {
    /// Drain before giving the write token of `path` up to a peer: the changes this node holds go to home
    /// first (every one, in order: the journal is drained), within `drain_within`. The cluster removes
    /// this node's held records and the token after.
    pub(crate) fn give_up(&self, path: &[u8], drain_within: std::time::Duration) -> Result<(), String> {
        let ino = {
            let ns = self.names.read();
            ns.resolve_known(Path::new(OsStr::from_bytes(path))).0
        };
        if let Some(ino) = ino {
            let dirty = self.names.read().inodes.get(&ino).is_some_and(|n| !n.dirty.is_empty());
            if dirty {
                self.commit_data(ino, false).map_err(|e| e.to_string())?;
            }
        }
        match self.drain(drain_within) {
            crate::Drained::Empty => Ok(()),
            other => Err(format!("this node's changes did not reach home ({other:?})")),
        }
    }
}
