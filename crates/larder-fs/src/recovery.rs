//! What a cache directory holds that home does not have yet, read from its index alone (no home, no
//! mount): for `larder recover`, which saves it when the cache cannot be mounted (its index damaged or
//! lost; design note 002, "A lost index").

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::SystemTime;

use larder_cache::Db;
use larder_home::FileKind;

use crate::FsResult;
use crate::journal::Op;
use crate::namespace::ROOT;
use crate::record::InodeRecord;

/// A file with changes not yet at home, as the index has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnpushedFile {
    pub ino: u64,
    /// Its cache object (the cache file `objects/XX/OBJECT`).
    pub object: u64,
    /// Its path in the mount, below the mount point.
    pub path: PathBuf,
    pub size: u64,
    pub mode: u32,
    pub mtime: SystemTime,
    /// Whether all of its content is its own (made here, or written whole here): else the bytes outside
    /// its changes are what the cache held of home's (holes where it held nothing).
    pub whole: bool,
}

/// What an index says is not at home yet.
#[derive(Clone, Debug, Default)]
pub struct Unpushed {
    /// Regular files with data, or made here.
    pub files: Vec<UnpushedFile>,
    /// Every queued change, in order: its kind and the path it was made at (the files' among them).
    pub queued: Vec<(String, String)>,
}

/// The files of the index `db` with changes not yet at home, and its queued changes. Records that cannot
/// be read, or that lead nowhere near the root, are passed over.
pub fn unpushed(db: &Db) -> FsResult<Unpushed> {
    let mut records: HashMap<u64, InodeRecord> = HashMap::new();
    db.for_each_inode(|ino, bytes| {
        if let Some(rec) = InodeRecord::decode(bytes) {
            records.insert(ino, rec);
        }
    })?;
    let path_of = |ino: u64| -> Option<PathBuf> {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let rec = records.get(&cur)?;
            parts.push(OsStr::from_bytes(&rec.name).to_os_string());
            cur = rec.parent;
            if parts.len() > 4096 {
                return None;
            }
        }
        Some(parts.iter().rev().collect())
    };
    let mut files = Vec::new();
    for (&ino, rec) in &records {
        if rec.kind != FileKind::File || rec.object == 0 {
            continue;
        }
        let made_here = rec.home_loc.is_none();
        if rec.dirty.is_empty() && rec.attempt.is_none() && !made_here {
            continue;
        }
        let Some(path) = path_of(ino) else { continue };
        let attr = rec.attr.as_ref().map(|a| a.to_attr());
        let size = attr.as_ref().map_or(0, |a| a.size);
        let covers_all = rec.dirty.first().is_some_and(|&(start, end)| start == 0 && end >= size);
        files.push(UnpushedFile {
            ino,
            object: rec.object,
            path,
            size,
            mode: attr.as_ref().map_or(0o644, |a| a.perm),
            mtime: attr.as_ref().map_or(SystemTime::UNIX_EPOCH, |a| a.mtime),
            whole: made_here || covers_all || size == 0,
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut queued = Vec::new();
    db.for_each_op(|_, bytes| {
        if let Some(op) = Op::decode(bytes) {
            queued.push((
                op.kind.name().to_string(),
                String::from_utf8_lossy(&op.path).into_owned(),
            ));
        }
    })?;
    Ok(Unpushed { files, queued })
}
