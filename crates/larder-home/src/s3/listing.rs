//! Looking at the bucket: an object's attributes, whether a directory exists (a marker or anything under
//! its prefix) or has children, and the entries under a prefix.

use std::path::Path;

use opendal::ErrorKind;

use super::S3Home;
use super::requests::classify;
use crate::{HomeAttr, HomeError, HomeResult};

impl S3Home {
    pub(super) async fn stat_file(&self, key: &str) -> HomeResult<Option<HomeAttr>> {
        match self.op.stat(key).await {
            Ok(meta) if meta.is_file() => Ok(Some(self.file_attr(&meta))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(classify(e, false)),
        }
    }

    /// Up to `n` entries directly under `dir_key` (its marker included): one request, however large the
    /// directory. (`list_with(..).limit(n)` would fetch every page of `n`.)
    async fn first_entries(&self, dir_key: &str, n: usize) -> HomeResult<Vec<String>> {
        use futures::StreamExt;
        let mut lister = match self.op.lister_with(dir_key).limit(n.max(1)).await {
            Ok(l) => l,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(classify(e, false)),
        };
        let mut out = Vec::new();
        while out.len() < n {
            match lister.next().await {
                Some(Ok(e)) => out.push(e.path().to_string()),
                Some(Err(e)) if e.kind() == ErrorKind::NotFound => break,
                Some(Err(e)) => return Err(classify(e, false)),
                None => break,
            }
        }
        Ok(out)
    }

    /// Whether the directory `dir_key` ("a/b/") exists: a marker or anything under it.
    pub(super) async fn dir_exists(&self, dir_key: &str) -> HomeResult<bool> {
        Ok(!self.first_entries(dir_key, 1).await?.is_empty())
    }

    /// Whether the directory `dir_key` has entries besides its marker.
    pub(super) async fn has_children(&self, dir_key: &str) -> HomeResult<bool> {
        Ok(self.first_entries(dir_key, 2).await?.iter().any(|p| p != dir_key))
    }

    pub(super) async fn stat_any(&self, path: &Path) -> HomeResult<HomeAttr> {
        if path.as_os_str().is_empty() {
            return Ok(self.dir_attr());
        }
        let key = self.key(path, false)?;
        if let Some(a) = self.stat_file(&key).await? {
            return Ok(a);
        }
        if let Some(dir_key) = self.dir_key(path)?
            && self.dir_exists(&dir_key).await?
        {
            return Ok(self.dir_attr());
        }
        Err(HomeError::NotFound)
    }

    /// Children of `dir_key`, recursively or not, without the marker itself.
    pub(super) async fn entries(&self, dir_key: &str, recursive: bool) -> HomeResult<Vec<opendal::Entry>> {
        let list = if dir_key.is_empty() { "/" } else { dir_key };
        match self.op.list_with(list).recursive(recursive).await {
            Ok(v) => Ok(v
                .into_iter()
                .filter(|e| e.path() != dir_key && e.path() != "/")
                .collect()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(classify(e, false)),
        }
    }
}
