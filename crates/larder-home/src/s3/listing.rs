//! Looking at the bucket: an object's attributes, whether a directory exists (a marker or anything under
//! its prefix) or has children, and the entries under a prefix.

use std::path::Path;

use opendal::ErrorKind;

use super::S3Home;
use super::meta::ObjectMeta;
use super::requests::classify;
use crate::{DirEntry, FileKind, HomeAttr, HomeError, HomeResult, Owner};

/// Objects asked for their metadata at once while listing.
const HEADS_AT_ONCE: usize = 32;

impl S3Home {
    pub(super) async fn stat_file(&self, key: &str) -> HomeResult<Option<HomeAttr>> {
        Ok(self.stat_file_meta(key).await?.map(|(attr, _)| attr))
    }

    /// The attributes of the object `key` and its user metadata; `None` when there is no such object.
    pub(super) async fn stat_file_meta(&self, key: &str) -> HomeResult<Option<(HomeAttr, ObjectMeta)>> {
        match self.op.stat(key).await {
            Ok(meta) if meta.is_file() => {
                let found = self.file_attr_meta(&meta);
                self.keep_known(key, &meta, &found.0);
                Ok(Some(found))
            }
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

    /// What is in the way of removing the directory `dir_key`: NotEmpty if it has entries, or if its
    /// marker holds bytes (a key ending in `/` that some tool stored data in: removing the marker would
    /// lose them); NotFound if there is no such directory.
    pub(super) async fn check_removable(&self, dir_key: &str) -> HomeResult<()> {
        let first = self.first_entries(dir_key, 2).await?;
        if first.is_empty() {
            return Err(HomeError::NotFound);
        }
        if first.iter().any(|path| path != dir_key) {
            return Err(HomeError::NotEmpty);
        }
        // The marker itself: a listing names it as a directory, and OpenDAL's stat of it gives no size;
        // a HEAD of its key tells.
        let len = self.raw.length(dir_key).await?.unwrap_or(0);
        if len > 0 {
            tracing::warn!(key = %dir_key, bytes = len, "not removing a directory whose marker holds data");
            return Err(HomeError::NotEmpty);
        }
        Ok(())
    }

    pub(super) async fn stat_any(&self, path: &Path) -> HomeResult<HomeAttr> {
        Ok(self.stat_any_meta(path).await?.0)
    }

    /// The attributes of the object or directory at `path`, and the user metadata of the object or the
    /// directory's marker.
    pub(super) async fn stat_any_meta(&self, path: &Path) -> HomeResult<(HomeAttr, ObjectMeta)> {
        if path.as_os_str().is_empty() {
            return self.dir_attr_meta_at("").await;
        }
        let key = self.key(path, false)?;
        if let Some(found) = self.stat_file_meta(&key).await? {
            return Ok(found);
        }
        if let Some(dir_key) = self.dir_key(path)?
            && self.dir_exists(&dir_key).await?
        {
            return self.dir_attr_meta_at(&dir_key).await;
        }
        Err(HomeError::NotFound)
    }

    /// The attributes of the directory `dir_key`: with metadata kept, what its marker says (a directory
    /// that is only a common prefix, or whose marker another tool made, has the defaults).
    pub(super) async fn dir_attr_at(&self, dir_key: &str) -> HomeResult<HomeAttr> {
        Ok(self.dir_attr_meta_at(dir_key).await?.0)
    }

    /// The attributes of the directory `dir_key`, and the user metadata of its marker (none without one).
    pub(super) async fn dir_attr_meta_at(&self, dir_key: &str) -> HomeResult<(HomeAttr, ObjectMeta)> {
        let mut attr = self.dir_attr();
        let mut stored = ObjectMeta::default();
        // The root of a home under a prefix has the prefix's marker; the root of a bucket has none.
        if !self.spec.keep_metadata || (dir_key.is_empty() && !self.has_root_marker()) {
            return Ok((attr, stored));
        }
        // Straight to the S3 service: OpenDAL's operator answers a directory's stat from a listing, which
        // carries no metadata.
        use opendal::raw::ServiceDyn;
        let head = self
            .op
            .base_service()
            .stat_dyn(self.op.base_context(), dir_key, opendal::raw::OpStat::default())
            .await
            .map(|rp| rp.into_metadata());
        match head {
            Ok(meta) => {
                if let Some(user) = meta.user_metadata() {
                    stored = ObjectMeta::parse(user);
                    stored.apply(&mut attr);
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(classify(e, false)),
        }
        Ok((attr, stored))
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

    /// The listed `entries` of `dir_key` with each one's metadata (a HEAD of each object or directory
    /// marker, [`HEADS_AT_ONCE`] at a time): its kind (a symlink), mode, owner and time. An object gone
    /// meanwhile is left out.
    pub(super) async fn with_metadata(&self, dir_key: &str, entries: Vec<DirEntry>) -> HomeResult<Vec<DirEntry>> {
        use futures::StreamExt;
        let heads = entries.into_iter().map(|mut e| async move {
            if e.kind == FileKind::Dir {
                e.attr = Some(
                    self.dir_attr_at(&format!("{dir_key}{}/", e.name.to_string_lossy()))
                        .await?,
                );
                return Ok(Some(e));
            }
            let key = format!("{dir_key}{}", e.name.to_string_lossy());
            if let Some(attr) = e.attr.as_ref().and_then(|listed| self.known_as(&key, listed)) {
                e.kind = attr.kind;
                e.attr = Some(attr);
                return Ok(Some(e));
            }
            Ok(self.stat_file(&key).await?.map(|attr| {
                e.kind = attr.kind;
                e.attr = Some(attr);
                e
            }))
        });
        let got: Vec<HomeResult<Option<DirEntry>>> =
            futures::stream::iter(heads).buffered(HEADS_AT_ONCE).collect().await;
        got.into_iter().filter_map(Result::transpose).collect()
    }

    /// Remember what a HEAD of `key` said (`meta`, and the attributes made of it).
    fn keep_known(&self, key: &str, meta: &opendal::Metadata, attr: &HomeAttr) {
        let Some(etag) = meta.etag() else { return };
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= super::KNOWN_MAX && !known.contains_key(key) {
            known.clear();
        }
        known.insert(
            key.to_string(),
            super::Known {
                etag: etag.to_string(),
                modified: meta.last_modified().map(|t| second_of(t.into())),
                attr: attr.clone(),
            },
        );
    }

    /// The attributes of `key` from its last HEAD, if a listing shows it (`listed`: its ETag as version,
    /// its last-modified time as mtime) unchanged since: the same ETag, modified in the same second.
    fn known_as(&self, key: &str, listed: &HomeAttr) -> Option<HomeAttr> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let k = known.get(key)?;
        (!k.etag.is_empty() && k.etag == listed.version.0 && k.modified == Some(second_of(listed.mtime))).then(|| {
            HomeAttr {
                // The listing's size is as good as the HEAD's; they agree for one ETag.
                size: listed.size,
                ..k.attr.clone()
            }
        })
    }

    /// Whether the home's root has a marker to hold its metadata: it lies under a prefix.
    pub(super) fn has_root_marker(&self) -> bool {
        !self.spec.prefix.trim_matches('/').is_empty()
    }

    /// The metadata of an object made now with `mode` for `owner` (the daemon's user where it names none).
    pub(super) fn new_meta(&self, mode: u32, owner: Owner) -> ObjectMeta {
        ObjectMeta {
            mode: Some(mode),
            uid: Some(owner.uid.unwrap_or(self.uid)),
            gid: Some(owner.gid.unwrap_or(self.gid)),
            mtime: Some(std::time::SystemTime::now()),
            ..ObjectMeta::default()
        }
    }

    /// Make the object `key` (for `path`) holding `content`, with `meta` where metadata is kept; `Exists`
    /// if anything, object or directory, has that name.
    pub(super) async fn create_object(
        &self,
        path: &Path,
        key: &str,
        content: Vec<u8>,
        meta: ObjectMeta,
    ) -> HomeResult<HomeAttr> {
        if let Some(dir_key) = self.dir_key(path)?
            && self.dir_exists(&dir_key).await?
        {
            return Err(HomeError::Exists);
        }
        let mut write = self.op.write_with(key, content).if_not_exists(true);
        if self.spec.keep_metadata {
            write = write.user_metadata(meta.to_map());
        }
        match write.await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConditionNotMatch => return Err(HomeError::Exists),
            Err(e) => return Err(classify(e, true)),
        }
        self.stat_file(key).await?.ok_or(HomeError::NotFound)
    }
}

/// The whole seconds since the epoch of `t`: a listing gives times to the millisecond, a HEAD to the second.
fn second_of(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
