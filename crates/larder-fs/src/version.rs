//! One version of one file, as the read path fetches it: the value the namespace hands the data path.

use std::path::PathBuf;

use larder_home::Version;

/// This version of this file: what a fetch of its blocks needs, taken together from the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileVersion {
    /// The cache object of this version: a new version is a new object, so stale blocks are never found.
    pub object: u64,
    /// The object's change epoch when this was taken: a block fetched on its word is not kept once the
    /// file changed here (a truncation would otherwise let home's old bytes back in).
    pub epoch: u64,
    /// Where home has the file, and the version expected there.
    pub path: PathBuf,
    pub version: Version,
    /// Where home's part of the content ends: the file's size at home, or less after a local truncation
    /// not yet pushed. Bytes past it exist only here.
    pub home_end: u64,
}
