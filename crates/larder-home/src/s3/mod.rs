//! A home that is an S3-compatible bucket (or a prefix of one), through Apache OpenDAL.
//!
//! **Layout.** A file `a/b.txt` is the object `PREFIX/a/b.txt`, byte for byte: any S3 client sees
//! ordinary objects. Directories are common prefixes; a directory made through larder is also a zero-byte
//! marker object `PREFIX/dir/`, so that an empty directory survives. A listing is one ListObjectsV2
//! request per 1000 entries and carries each object's size, mtime and ETag, so the cache knows them
//! without a request per file.
//!
//! **Versions** are ETags. Reads ask for the version they expect (`If-Match`); an object replaced
//! meanwhile answers "precondition failed", which is [`HomeError::Stale`]. Writes are conditional too:
//! `If-None-Match: *` for creates, `If-Match: <base ETag>` for rewrites; a change at home in between is
//! [`HomeError::Conflict`], never overwritten.
//!
//! **Writes** rewrite the whole object (S3 has no partial update): dirty ranges come from the cache copy,
//! the rest from the object as it was (ranged reads at the base ETag), streamed through a multipart upload
//! in 8 MiB parts. OpenDAL has no UploadPartCopy, so unchanged parts travel through larder; see
//! docs/design/006-object-store-home.md.
//!
//! **What S3 cannot do**: modes, owners and times are not stored (chmod, chown and utimens succeed and
//! change nothing; files show 0644, directories 0755, owned by the daemon's user); no symlinks, hard links
//! or special files, and keys of at most 1024 bytes, UTF-8 (stated by [`Home::limits`], which the core
//! checks at the call); rename is copy + delete, object by object, not atomic.
//!
//! **At mount**, [`S3Home::check`] tells a missing bucket, refused credentials and an endpoint that does
//! not answer apart, without retries, each with its own one-line reason.

use std::fs::File;
use std::future::Future;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::{ErrorKind, Operator};

use crate::{
    DirEntry, FileKind, Home, HomeAttr, HomeError, HomeLimits, HomeResult, Owner, RenameFlags, SetAttr, StatFs, Version,
};

/// S3 refuses keys longer than this many bytes.
pub const MAX_KEY: usize = 1024;
const PART: usize = 8 << 20;
/// Slowest transfer rate a call that moves data is given time for, in bytes per second.
const MIN_RATE: u64 = 4 << 20;
/// Longest wait for the check at mount (less when the home timeout is shorter).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to reach a bucket.
#[derive(Clone, Debug, Default)]
pub struct S3Spec {
    pub bucket: String,
    /// Key prefix under which the home lives ("" for the whole bucket).
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Deadline of each home call, retries included.
    pub op_timeout: Duration,
}

/// An S3 bucket as home.
pub struct S3Home {
    spec: S3Spec,
    op: Operator,
    /// The same bucket without retries, for the check at mount: a bucket that is not there or an endpoint
    /// that does not answer is told at once.
    op_probe: Operator,
    /// The same bucket, with a per-request timeout fit for whole-object transfers.
    op_bulk: Operator,
    rt: tokio::runtime::Runtime,
    uid: u32,
    gid: u32,
    started: SystemTime,
    /// Directories have no version at S3; each stat gives a new one, so listings are refreshed after the
    /// validity lag.
    dir_version: AtomicU64,
}

impl S3Home {
    /// Connect to the bucket `spec` names. Credentials come from the standard AWS environment variables
    /// and files.
    pub fn new(spec: S3Spec) -> HomeResult<S3Home> {
        // Default features are off: install the HTTP transport (reqwest) explicitly.
        opendal::install_default();
        let root = format!("/{}", spec.prefix.trim_matches('/'));
        let builder = || {
            let mut b = opendal::services::S3::default().bucket(&spec.bucket).root(&root);
            if let Some(e) = &spec.endpoint {
                b = b.endpoint(e);
            }
            b.region(spec.region.as_deref().unwrap_or("us-east-1"))
        };
        let attempt = (spec.op_timeout / 3).max(Duration::from_millis(500));
        let probe = spec.op_timeout.min(PROBE_TIMEOUT);
        let op_probe = Operator::new(builder())
            .map_err(|e| HomeError::Unavailable(format!("S3 configuration: {e}")))?
            .layer(TimeoutLayer::new().with_timeout(probe).with_io_timeout(probe));
        let operator = |attempt: Duration| -> HomeResult<Operator> {
            Ok(Operator::new(builder())
                .map_err(|e| HomeError::Unavailable(format!("S3 configuration: {e}")))?
                // Errors (5xx, throttling, refused connections) are retried with backoff; an attempt that
                // times out ends the call (outer timeout), so a server that stopped answering gives EIO
                // quickly.
                .layer(
                    RetryLayer::new()
                        .with_jitter()
                        .with_min_delay(Duration::from_millis(100))
                        .with_max_delay(Duration::from_secs(2))
                        .with_max_times(6),
                )
                .layer(TimeoutLayer::new().with_timeout(attempt).with_io_timeout(attempt)))
        };
        let op = operator(attempt)?;
        // Rewrites move whole objects: completing a multipart upload of gigabytes may take a server longer
        // than one ordinary request may; their calls are bounded by a deadline that grows with the size.
        let op_bulk = operator(spec.op_timeout * 4)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("larder-s3")
            .enable_all()
            .build()
            .map_err(|e| HomeError::Unavailable(format!("cannot start the S3 runtime: {e}")))?;
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Ok(S3Home {
            spec,
            op,
            op_probe,
            op_bulk,
            rt,
            uid,
            gid,
            started: SystemTime::now(),
            dir_version: AtomicU64::new(0),
        })
    }

    /// Check that the endpoint answers, the bucket exists and the credentials are accepted, with one
    /// listing of at most one key under the prefix (no retries: a mount that cannot work is refused at
    /// once). Fails with one line naming the problem.
    pub fn check(&self) -> Result<Checked, String> {
        let bucket = &self.spec.bucket;
        let endpoint = self.endpoint();
        let timeout = self.spec.op_timeout.min(PROBE_TIMEOUT);
        // A closed port or an unknown host: told by the connection alone, without the HTTP client's retries.
        // Not through a proxy (the HTTP client honours the proxy variables; a direct connection may be
        // barred where the proxy works): then the listing alone tells.
        let proxied = [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
        if !proxied && let Some(e) = unreachable_endpoint(&endpoint, timeout) {
            return Err(format!("endpoint {endpoint} does not answer ({e})"));
        }
        let listed = self.rt.block_on(async {
            use futures::StreamExt;
            let probe = async {
                let mut lister = self.op_probe.lister_with("/").limit(1).await?;
                lister.next().await.transpose()
            };
            match tokio::time::timeout(timeout + Duration::from_secs(1), probe).await {
                Ok(r) => r.map_err(Some),
                Err(_) => Err(None),
            }
        });
        match listed {
            Ok(Some(_)) => Ok(Checked::Populated),
            Ok(None) => Ok(Checked::Empty),
            Err(None) => Err(format!(
                "endpoint {endpoint} does not answer (no reply within {timeout:?})"
            )),
            Err(Some(e)) => {
                let text = e.to_string();
                let (code, reason) = s3_answer(&text);
                Err(match e.kind() {
                    _ if code == "NoSuchBucket" => format!("bucket '{bucket}' does not exist at {endpoint}"),
                    ErrorKind::NotFound => format!("bucket '{bucket}' does not exist at {endpoint}"),
                    ErrorKind::PermissionDenied => format!(
                        "the credentials were refused by {endpoint} for bucket '{bucket}' ({reason}; check \
                         AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
                    ),
                    _ if code == "InvalidBucketName" => {
                        format!("'{bucket}' is not a valid S3 bucket name at {endpoint} ({reason})")
                    }
                    _ if e.is_temporary() && code.is_empty() => {
                        format!("endpoint {endpoint} does not answer ({reason})")
                    }
                    _ => format!("bucket '{bucket}' at {endpoint} cannot be listed ({reason})"),
                })
            }
        }
    }

    /// The endpoint requests go to.
    fn endpoint(&self) -> String {
        match &self.spec.endpoint {
            Some(e) => e.clone(),
            None => format!(
                "https://s3.{}.amazonaws.com",
                self.spec.region.as_deref().unwrap_or("us-east-1")
            ),
        }
    }

    /// Run `f` on the runtime with the call deadline.
    fn run<T>(&self, f: impl Future<Output = HomeResult<T>>) -> HomeResult<T> {
        self.run_for(self.spec.op_timeout, f)
    }

    /// The deadline of a call that moves `bytes`: the home timeout plus time for the bytes at a slow but
    /// working link (4 MiB/s), so a large rewrite is not cut off while it makes progress.
    fn deadline_for(&self, bytes: u64) -> Duration {
        self.spec.op_timeout + Duration::from_secs_f64(bytes as f64 / MIN_RATE as f64)
    }

    fn run_for<T>(&self, timeout: Duration, f: impl Future<Output = HomeResult<T>>) -> HomeResult<T> {
        self.rt.block_on(async move {
            match tokio::time::timeout(timeout, f).await {
                Ok(r) => r,
                Err(_) => Err(HomeError::TimedOut(timeout)),
            }
        })
    }

    /// The key of `path` ("a/b" or, for a directory, "a/b/"), checked against what S3 can store.
    fn key(&self, path: &Path, dir: bool) -> HomeResult<String> {
        let mut key = String::new();
        for c in path.components() {
            let Component::Normal(name) = c else {
                return Err(HomeError::InvalidName(format!(
                    "'{}' is not a plain path",
                    path.display()
                )));
            };
            let name = std::str::from_utf8(name.as_bytes())
                .map_err(|_| HomeError::InvalidName("S3 keys must be UTF-8".into()))?;
            if !key.is_empty() {
                key.push('/');
            }
            key.push_str(name);
        }
        if dir && !key.is_empty() {
            key.push('/');
        }
        let prefix = self.spec.prefix.trim_matches('/').len();
        let full = if prefix == 0 { key.len() } else { prefix + 1 + key.len() };
        if full > MAX_KEY {
            return Err(HomeError::NameTooLong);
        }
        Ok(key)
    }

    /// The directory form of `path`, or `None` when it would be too long to exist at all.
    fn dir_key(&self, path: &Path) -> HomeResult<Option<String>> {
        match self.key(path, true) {
            Ok(k) => Ok(Some(k)),
            Err(HomeError::NameTooLong) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn file_attr(&self, meta: &opendal::Metadata) -> HomeAttr {
        let mtime = meta.last_modified().map(SystemTime::from).unwrap_or(UNIX_EPOCH);
        let size = meta.content_length();
        HomeAttr {
            kind: FileKind::File,
            id: 0,
            size,
            perm: 0o644,
            uid: self.uid,
            gid: self.gid,
            nlink: 1,
            rdev: 0,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            version: Version(meta.etag().unwrap_or_default().to_string()),
        }
    }

    fn dir_attr(&self) -> HomeAttr {
        let n = self.dir_version.fetch_add(1, Ordering::Relaxed);
        HomeAttr {
            kind: FileKind::Dir,
            id: 0,
            size: 0,
            perm: 0o755,
            uid: self.uid,
            gid: self.gid,
            nlink: 2,
            rdev: 0,
            blocks: 0,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            version: Version(format!("dir:{n}")),
        }
    }

    async fn stat_file(&self, key: &str) -> HomeResult<Option<HomeAttr>> {
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
    async fn dir_exists(&self, dir_key: &str) -> HomeResult<bool> {
        Ok(!self.first_entries(dir_key, 1).await?.is_empty())
    }

    /// Whether the directory `dir_key` has entries besides its marker.
    async fn has_children(&self, dir_key: &str) -> HomeResult<bool> {
        Ok(self.first_entries(dir_key, 2).await?.iter().any(|p| p != dir_key))
    }

    async fn stat_any(&self, path: &Path) -> HomeResult<HomeAttr> {
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
    async fn entries(&self, dir_key: &str, recursive: bool) -> HomeResult<Vec<opendal::Entry>> {
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

    /// Rewrite `key` as `size` bytes: `ranges` from `source`, the rest from the object at `base` (bytes
    /// past its old end are zeros). Conditional on `base` when given.
    async fn rewrite(
        &self,
        key: &str,
        source: Option<&File>,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<(&str, u64)>,
    ) -> HomeResult<()> {
        let mut writer = {
            let w = self.op_bulk.writer_with(key).chunk(PART).concurrent(4);
            let w = match base {
                Some((etag, _)) if !etag.is_empty() => w.if_match(etag),
                _ => w,
            };
            w.await.map_err(|e| classify(e, true))?
        };
        let old_size = base.map_or(0, |b| b.1);
        let mut pos = 0u64;
        while pos < size {
            let end = (pos + PART as u64).min(size);
            let mut part = vec![0u8; (end - pos) as usize];
            // The bytes of the old object this part keeps.
            let keep_end = end.min(old_size);
            if pos < keep_end
                && let Some((etag, _)) = base
            {
                let mut read = self.op_bulk.read_with(key).range(pos..keep_end);
                if !etag.is_empty() {
                    read = read.if_match(etag);
                }
                let old = read.await.map_err(|e| classify(e, true))?.to_vec();
                part[..old.len()].copy_from_slice(&old);
            }
            if let Some(source) = source {
                for r in ranges {
                    let (s, e) = (r.start.max(pos), r.end.min(end));
                    if s < e {
                        let slice = &mut part[(s - pos) as usize..(e - pos) as usize];
                        let mut done = 0;
                        while done < slice.len() {
                            let n = source.read_at(&mut slice[done..], s + done as u64)?;
                            if n == 0 {
                                // The cache copy ends in a hole: zeros.
                                slice[done..].fill(0);
                                break;
                            }
                            done += n;
                        }
                    }
                }
            }
            writer.write(part).await.map_err(|e| classify(e, true))?;
            pos = end;
        }
        writer.close().await.map_err(|e| classify(e, true))?;
        Ok(())
    }

    async fn rename_file(&self, from: &str, to: &str) -> HomeResult<()> {
        self.op.copy(from, to).await.map_err(|e| classify(e, false))?;
        self.op.delete(from).await.map_err(|e| classify(e, false))?;
        self.keep_parent(from).await
    }

    /// After `key` went away: a directory that existed only as a common prefix would vanish with its last
    /// child, which a file system does not do; give it a marker.
    async fn keep_parent(&self, key: &str) -> HomeResult<()> {
        let trimmed = key.trim_end_matches('/');
        let Some(cut) = trimmed.rfind('/') else { return Ok(()) };
        let parent = &trimmed[..=cut];
        if !self.dir_exists(parent).await? {
            self.op.create_dir(parent).await.map_err(|e| classify(e, false))?;
        }
        Ok(())
    }
}

/// What [`S3Home::check`] found under the prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// At least one object.
    Populated,
    /// Nothing yet: a new, empty home (S3 has no directories; a prefix exists by its objects).
    Empty,
}

/// Whether `name` is a bucket name S3 accepts (the rules for new buckets: 3 to 63 bytes of lowercase
/// letters, digits, `-` and `.`, starting and ending with a letter or digit, no `..`, not an IP address).
pub fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
        && name.parse::<std::net::Ipv4Addr>().is_err()
}

/// Why nothing can be reached at `endpoint` (a URL), or `None` when a TCP connection opens within
/// `timeout`.
fn unreachable_endpoint(endpoint: &str, timeout: Duration) -> Option<String> {
    use std::net::{TcpStream, ToSocketAddrs};
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']');
    let addr = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:{}", if scheme == "http" { 80 } else { 443 })
    };
    let addrs: Vec<_> = match addr.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return Some(format!("cannot resolve {addr}: {e}")),
    };
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return None,
            Err(e) => last = Some(format!("{a}: {e}")),
        }
    }
    Some(last.unwrap_or_else(|| format!("{addr} resolves to no address")))
}

/// The S3 error code of an OpenDAL error's text (empty when S3 gave none) and a short reason: "CODE:
/// message", else the HTTP status, else the error's first line.
fn s3_answer(text: &str) -> (String, String) {
    let field = |name: &str| -> Option<String> {
        let start = text.find(&format!("{name}: \""))? + name.len() + 3;
        let end = text[start..].find('"')? + start;
        Some(text[start..end].to_string())
    };
    if let Some(code) = field("code").filter(|c| !c.is_empty()) {
        let reason = match field("message").filter(|m| !m.is_empty()) {
            Some(m) => format!("{code}: {}", m.trim_end_matches('.')),
            None => code.clone(),
        };
        return (code, reason);
    }
    if let Some(i) = text.find("status: ") {
        let status: String = text[i + 8..].chars().take_while(char::is_ascii_digit).collect();
        if !status.is_empty() {
            return (String::new(), format!("HTTP {status}"));
        }
    }
    (String::new(), text.lines().next().unwrap_or("").trim().to_string())
}

/// Turn an OpenDAL error into a home error. `write`: a failed precondition means home changed since the
/// base version (conflict) rather than during a read (stale).
fn classify(e: opendal::Error, write: bool) -> HomeError {
    match e.kind() {
        ErrorKind::NotFound => HomeError::NotFound,
        ErrorKind::PermissionDenied => HomeError::PermissionDenied,
        ErrorKind::AlreadyExists => HomeError::Exists,
        ErrorKind::ConditionNotMatch if write => HomeError::Conflict,
        ErrorKind::ConditionNotMatch => HomeError::Stale,
        ErrorKind::IsADirectory => HomeError::Os(libc::EISDIR),
        ErrorKind::NotADirectory => HomeError::Os(libc::ENOTDIR),
        ErrorKind::Unsupported => HomeError::Unsupported("this operation on S3"),
        ErrorKind::RateLimited => HomeError::Unavailable(e.to_string()),
        _ if e.is_temporary() => HomeError::Unavailable(e.to_string()),
        _ => HomeError::Unavailable(e.to_string()),
    }
}

impl Home for S3Home {
    fn describe(&self) -> String {
        let prefix = self.spec.prefix.trim_matches('/');
        if prefix.is_empty() {
            format!("s3://{}", self.spec.bucket)
        } else {
            format!("s3://{}/{prefix}", self.spec.bucket)
        }
    }

    fn stat(&self, path: &Path) -> HomeResult<HomeAttr> {
        self.run(self.stat_any(path))
    }

    fn list(&self, path: &Path) -> HomeResult<Vec<DirEntry>> {
        let dir_key = self.key(path, true)?;
        self.run(async {
            let entries = self.entries(&dir_key, false).await?;
            if entries.is_empty() && !dir_key.is_empty() && !self.dir_exists(&dir_key).await? {
                return Err(HomeError::NotFound);
            }
            let mut out = Vec::with_capacity(entries.len());
            for e in entries {
                let rel = &e.path()[dir_key.len().min(e.path().len())..];
                let (name, dir) = match rel.strip_suffix('/') {
                    Some(n) => (n, true),
                    None => (rel, false),
                };
                // Keys S3 allows but a file system cannot show ("a//b", "a/./b").
                if name.is_empty() || name == "." || name == ".." || name.contains('/') {
                    continue;
                }
                let meta = e.metadata();
                let attr = if dir {
                    None
                } else {
                    meta.etag().is_some().then(|| self.file_attr(meta))
                };
                let kind = if dir { FileKind::Dir } else { FileKind::File };
                out.push(DirEntry {
                    name: name.into(),
                    kind,
                    attr,
                });
            }
            Ok(out)
        })
    }

    fn read(&self, path: &Path, version: &Version, offset: u64, len: usize) -> HomeResult<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let key = self.key(path, false)?;
        self.run(async {
            let mut read = self.op.read_with(&key).range(offset..offset + len as u64);
            if !version.0.is_empty() {
                read = read.if_match(&version.0);
            }
            Ok(read.await.map_err(|e| classify(e, false))?.to_vec())
        })
    }

    fn readlink(&self, _path: &Path) -> HomeResult<Vec<u8>> {
        Err(HomeError::Unsupported("symlinks on S3"))
    }

    fn create(&self, path: &Path, _mode: u32, _owner: Owner) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        self.run(async {
            if let Some(dir_key) = self.dir_key(path)?
                && self.dir_exists(&dir_key).await?
            {
                return Err(HomeError::Exists);
            }
            match self.op.write_with(&key, Vec::<u8>::new()).if_not_exists(true).await {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConditionNotMatch => return Err(HomeError::Exists),
                Err(e) => return Err(classify(e, true)),
            }
            self.stat_file(&key).await?.ok_or(HomeError::NotFound)
        })
    }

    fn mkdir(&self, path: &Path, _mode: u32, _owner: Owner) -> HomeResult<HomeAttr> {
        let dir_key = self.key(path, true)?;
        let key = self.key(path, false)?;
        self.run(async {
            if self.stat_file(&key).await?.is_some() || self.dir_exists(&dir_key).await? {
                return Err(HomeError::Exists);
            }
            self.op.create_dir(&dir_key).await.map_err(|e| classify(e, true))?;
            Ok(self.dir_attr())
        })
    }

    fn mknod(&self, _path: &Path, _mode: u32, _rdev: u64, _owner: Owner) -> HomeResult<HomeAttr> {
        Err(HomeError::Unsupported("special files on S3"))
    }

    fn symlink(&self, _target: &[u8], _path: &Path, _owner: Owner) -> HomeResult<HomeAttr> {
        Err(HomeError::Unsupported("symlinks on S3"))
    }

    fn link(&self, _existing: &Path, _new: &Path) -> HomeResult<HomeAttr> {
        Err(HomeError::Unsupported("hard links on S3"))
    }

    fn unlink(&self, path: &Path) -> HomeResult<()> {
        let key = self.key(path, false)?;
        self.run(async {
            if self.stat_file(&key).await?.is_none() {
                let dir = match self.dir_key(path)? {
                    Some(d) => self.dir_exists(&d).await?,
                    None => false,
                };
                return Err(if dir {
                    HomeError::Os(libc::EISDIR)
                } else {
                    HomeError::NotFound
                });
            }
            self.op.delete(&key).await.map_err(|e| classify(e, false))?;
            self.keep_parent(&key).await
        })
    }

    fn rmdir(&self, path: &Path) -> HomeResult<()> {
        let dir_key = self.key(path, true)?;
        self.run(async {
            if self.has_children(&dir_key).await? {
                return Err(HomeError::NotEmpty);
            }
            if !self.dir_exists(&dir_key).await? {
                return Err(HomeError::NotFound);
            }
            self.op.delete(&dir_key).await.map_err(|e| classify(e, false))?;
            self.keep_parent(&dir_key).await
        })
    }

    fn rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> HomeResult<()> {
        if flags.exchange {
            return Err(HomeError::Unsupported("atomic exchange on S3"));
        }
        let (from_file, from_dir) = (self.key(from, false)?, self.key(from, true)?);
        let (to_file, to_dir) = (self.key(to, false)?, self.key(to, true)?);
        self.run(async {
            // The source is looked at first, as rename(2) does: a missing source is NotFound whatever is at
            // the target (a retried rename that had landed tells so by that answer).
            let from_is_file = self.stat_file(&from_file).await?.is_some();
            if !from_is_file && !self.dir_exists(&from_dir).await? {
                return Err(HomeError::NotFound);
            }
            let to_is_file = self.stat_file(&to_file).await?.is_some();
            let to_is_dir = !to_is_file && self.dir_exists(&to_dir).await?;
            if flags.no_replace && (to_is_file || to_is_dir) {
                return Err(HomeError::Exists);
            }
            if from_is_file {
                if to_is_dir {
                    return Err(HomeError::Os(libc::EISDIR));
                }
                return self.rename_file(&from_file, &to_file).await;
            }
            if to_is_file {
                return Err(HomeError::Os(libc::ENOTDIR));
            }
            if to_is_dir {
                if self.has_children(&to_dir).await? {
                    return Err(HomeError::NotEmpty);
                }
                self.op.delete(&to_dir).await.map_err(|e| classify(e, false))?;
            }
            // Copy everything under the prefix (markers included), then delete the originals: a crash in
            // between leaves both copies, never neither.
            let mut keys: Vec<String> = self
                .entries(&from_dir, true)
                .await?
                .into_iter()
                .map(|e| e.path().to_string())
                .collect();
            keys.push(from_dir.clone());
            for key in &keys {
                let target = format!("{to_dir}{}", &key[from_dir.len()..]);
                if key.ends_with('/') {
                    self.op.create_dir(&target).await.map_err(|e| classify(e, false))?;
                } else {
                    self.op.copy(key, &target).await.map_err(|e| classify(e, false))?;
                }
            }
            for key in &keys {
                match self.op.delete(key).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(classify(e, false)),
                }
            }
            self.keep_parent(&from_dir).await
        })
    }

    fn setattr(&self, path: &Path, changes: &SetAttr) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        // A truncate rewrites the object: up to twice its size crosses the link.
        self.run_for(self.deadline_for(2 * changes.size.unwrap_or(0)), async {
            let Some(size) = changes.size else {
                // Modes, owners and times are not stored on S3.
                return self.stat_any(path).await;
            };
            let current = self.stat_file(&key).await?.ok_or(HomeError::NotFound)?;
            if current.size != size {
                self.rewrite(&key, None, &[], size, Some((&current.version.0, current.size)))
                    .await?;
            }
            self.stat_file(&key).await?.ok_or(HomeError::NotFound)
        })
    }

    fn write(
        &self,
        path: &Path,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        base: Option<&Version>,
        // Times are not stored on S3: an object's time is that of its upload.
        _mtime: Option<std::time::SystemTime>,
    ) -> HomeResult<HomeAttr> {
        let key = self.key(path, false)?;
        // The rewrite reads the unchanged parts and uploads the whole object: up to twice its size.
        self.run_for(self.deadline_for(2 * size), async {
            let current = self.stat_file(&key).await?.ok_or(HomeError::NotFound)?;
            if let Some(base) = base
                && !base.0.is_empty()
                && base.0 != current.version.0
            {
                return Err(HomeError::Conflict);
            }
            self.rewrite(
                &key,
                Some(source),
                ranges,
                size,
                Some((&current.version.0, current.size)),
            )
            .await?;
            self.stat_file(&key).await?.ok_or(HomeError::NotFound)
        })
    }

    fn limits(&self) -> HomeLimits {
        HomeLimits::object_store(MAX_KEY, self.spec.prefix.trim_matches('/').len())
    }

    fn statfs(&self) -> HomeResult<StatFs> {
        // A bucket has no capacity to speak of; report a large, mostly free file system.
        Ok(StatFs {
            blocks: 1 << 40,
            blocks_free: 1 << 40,
            blocks_available: 1 << 40,
            files: 1 << 40,
            files_free: 1 << 40,
            block_size: 4096,
            name_max: 255,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_s3_accepts() {
        for ok in ["abc", "my-bucket.data", "larder-s3wb-order", &"a".repeat(63)] {
            assert!(valid_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            "Bad_Name!",
            "UPPER",
            "-start",
            "end-",
            "a..b",
            "192.168.1.1",
            &"a".repeat(64),
            "",
        ] {
            assert!(!valid_bucket_name(bad), "{bad}");
        }
    }

    #[test]
    fn s3_answers_are_shortened_to_code_and_message() {
        let text = r#"ConfigInvalid (permanent) at list, context: { response: Parts { status: 404 } } => S3Error { code: "NoSuchBucket", message: "The specified bucket does not exist", resource: "" }"#;
        assert_eq!(
            s3_answer(text),
            (
                "NoSuchBucket".into(),
                "NoSuchBucket: The specified bucket does not exist".into()
            )
        );
        assert_eq!(
            s3_answer("Unexpected at list, context: { response: Parts { status: 502, version } }"),
            (String::new(), "HTTP 502".into())
        );
    }

    #[test]
    fn a_closed_port_is_told_by_the_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(
            unreachable_endpoint(&format!("http://127.0.0.1:{port}"), Duration::from_secs(2)),
            None
        );
        drop(l);
        let why = unreachable_endpoint(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(2));
        assert!(why.is_some_and(|w| w.contains("refused")));
    }
}
