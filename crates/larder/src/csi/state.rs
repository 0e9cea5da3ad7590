//! The node's state directory: for each volume staged on this node, its cache directory, its record
//! (what it was staged with, so that unstaging knows how to unmount and a restarted plugin can stage it
//! again) and, while it is staged, its S3 keys in a file only root may read.
//!
//! ```text
//! STATE/volumes/KEY/record.json
//! STATE/volumes/KEY/credentials
//! STATE/volumes/KEY/cache/
//! ```
//! KEY is the volume's id made safe for a file name, with a hash of the whole id.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::options::Unmount;

/// What staged a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub volume_id: String,
    pub staging_path: PathBuf,
    /// `larder mount`'s arguments (no secret: the keys are in the credentials file it names).
    pub mount: Vec<String>,
    pub unmount: Unmount,
    pub drain_timeout_secs: u64,
}

impl Record {
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_timeout_secs)
    }
}

#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

/// A name for `id` that is safe as one path component: its safe characters (at most 64) and a hash.
pub fn key(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    let safe = safe.trim_start_matches('.');
    format!("{safe}-{:016x}", crate::mounts::fnv64(id.as_bytes()))
}

impl StateDir {
    pub fn open(root: &Path) -> Result<StateDir> {
        let volumes = root.join("volumes");
        larder_util::private::create_dir_all(&volumes)
            .with_context(|| format!("cannot create the CSI state directory {}", volumes.display()))?;
        Ok(StateDir {
            root: root.to_path_buf(),
        })
    }

    /// The volume's own directory.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.root.join("volumes").join(key(id))
    }

    pub fn cache_dir(&self, id: &str) -> PathBuf {
        self.volume_dir(id).join("cache")
    }

    pub fn credentials(&self, id: &str) -> PathBuf {
        self.volume_dir(id).join("credentials")
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.volume_dir(id).join("record.json")
    }

    /// Write `text` as the volume's S3 keys, readable by this user alone.
    pub fn write_credentials(&self, id: &str, text: &str) -> std::io::Result<PathBuf> {
        larder_util::private::create_dir_all(&self.volume_dir(id))?;
        let path = self.credentials(id);
        let tmp = path.with_extension("tmp");
        larder_util::private::write(&tmp, text.as_bytes())?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    pub fn forget_credentials(&self, id: &str) {
        let _ = std::fs::remove_file(self.credentials(id));
    }

    pub fn save(&self, record: &Record) -> std::io::Result<()> {
        larder_util::private::create_dir_all(&self.volume_dir(&record.volume_id))?;
        let path = self.record_path(&record.volume_id);
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
        larder_util::private::write(&tmp, &text)?;
        std::fs::rename(&tmp, &path)
    }

    pub fn load(&self, id: &str) -> Option<Record> {
        let text = std::fs::read(self.record_path(id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// The volume is no longer staged (its cache directory stays, with any change not yet at home).
    pub fn unstaged(&self, id: &str) {
        let _ = std::fs::remove_file(self.record_path(id));
        self.forget_credentials(id);
    }

    /// Every volume recorded as staged.
    pub fn staged(&self) -> Vec<Record> {
        let Ok(dir) = std::fs::read_dir(self.root.join("volumes")) else {
            return Vec::new();
        };
        let mut out: Vec<Record> = dir
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("record.json")).ok())
            .filter_map(|text| serde_json::from_slice(&text).ok())
            .collect();
        out.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn keys_are_one_safe_component_and_tell_ids_apart() {
        let a = key("s3://bucket/data/pvc-1");
        assert!(!a.contains('/') && a.starts_with("s3---bucket-data-pvc-1-"), "{a}");
        assert_ne!(key("a/b"), key("a:b"));
        assert!(!key("../..").starts_with('.'));
        assert!(key(&"x".repeat(500)).len() <= 64 + 17);
    }

    #[test]
    fn records_round_trip_and_credentials_are_the_owners_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let r = Record {
            volume_id: "vol/1".into(),
            staging_path: "/stage/1".into(),
            mount: vec!["mount".into(), "/home".into()],
            unmount: Unmount::Drain,
            drain_timeout_secs: 60,
        };
        state.save(&r).unwrap();
        assert_eq!(state.load("vol/1"), Some(r.clone()));
        let creds = state.write_credentials("vol/1", "[default]\n").unwrap();
        assert_eq!(std::fs::metadata(&creds).unwrap().permissions().mode() & 0o077, 0);
        assert_eq!(state.staged(), vec![r]);
        state.unstaged("vol/1");
        assert!(state.staged().is_empty() && !creds.exists());
    }
}
