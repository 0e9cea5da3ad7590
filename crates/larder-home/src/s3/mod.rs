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
//! **Writes** make a new object (S3 has no partial update), through a multipart upload in 8 MiB parts: a
//! part nothing changed is copied at the server from the object as it was (UploadPartCopy, conditional on
//! its ETag; `copying.rs`, requests OpenDAL does not make), a changed part is uploaded, its dirty ranges from
//! the cache copy and its other bytes read from the object (ranged reads at the base ETag). Without a part
//! to copy, the whole object is streamed through larder (`writes.rs`). See
//! docs/design/006-object-store-home.md.
//!
//! **Modes, owners, times and symlinks** of files are kept in object metadata as s3fs keeps them (`meta.rs`),
//! so s3fs and rclone see what larder set and the other way round; a change of them alone rewrites the
//! object (OpenDAL cannot replace metadata by a server-side copy). Directories keep none: they show 0755,
//! owned by the daemon's user. `keep_metadata` off leaves objects without metadata (files 0644).
//!
//! **Extended attributes** of files and directories are kept where s3fs keeps them (`xattr.rs`): one
//! metadata key, `x-amz-meta-xattr`, the percent-encoded JSON of each name and the base64 of its value. S3
//! allows 2 KiB of metadata per object, so they must fit in what the mode, owner and times leave
//! ([`Home::check_xattrs`] refuses more with `E2BIG`); a change of one rewrites the object, as a chmod
//! does. Without `keep_metadata` there are none.
//!
//! **What S3 cannot do**: no hard links or special files, and keys of at most 1024 bytes, UTF-8 (stated by
//! [`Home::limits`], which the core checks at the call); rename is copy + delete, object by object, not
//! atomic.
//!
//! **At mount**, [`S3Home::check`] tells a missing bucket, refused credentials and an endpoint that does
//! not answer apart, without retries, each with its own one-line reason.
//!
//! [`Home::limits`]: crate::Home::limits
//! [`Home::check_xattrs`]: crate::Home::check_xattrs

mod check;
mod copying;
mod home;
mod listing;
mod meta;
mod requests;
#[cfg(test)]
mod tests;
mod writes;
mod xattr;

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use opendal::Operator;
use opendal::layers::{RetryLayer, TimeoutLayer};

use crate::{HomeError, HomeResult};

pub use check::{Checked, valid_bucket_name};

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
    /// Keys to sign with; `None`: the standard AWS environment variables and files.
    pub credentials: Option<crate::S3Credentials>,
    /// Keep modes, owners and times (and symlinks) in object metadata, as s3fs does (`meta.rs`); off:
    /// objects carry none, and listings ask nothing more than the listing.
    pub keep_metadata: bool,
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
    /// The requests OpenDAL does not make (`copying.rs`).
    raw: copying::Raw,
    /// Bytes rewrites moved, each way and at the server.
    wire: copying::Wire,
    /// What the last HEAD of each object said, for listings: `listing.rs`, [`Known`].
    known: std::sync::Mutex<std::collections::HashMap<String, Known>>,
}

/// An object as its last HEAD showed it: its ETag and last-modified second (as a listing shows them too),
/// and the attributes its metadata gave. A listing that shows an object with the same ETag and time takes
/// these attributes, without a HEAD.
#[derive(Clone)]
pub(super) struct Known {
    pub etag: String,
    pub modified: Option<u64>,
    pub attr: crate::HomeAttr,
}

/// Most objects [`S3Home::known`] holds: past it, it starts again empty (about 25 MiB at most).
const KNOWN_MAX: usize = 100_000;

impl S3Home {
    /// Connect to the bucket `spec` names. Credentials are the spec's, else those of the standard AWS
    /// environment variables and files.
    pub fn new(spec: S3Spec) -> HomeResult<S3Home> {
        // Default features are off: install the HTTP transport (reqwest) explicitly.
        opendal::install_default();
        let root = format!("/{}", spec.prefix.trim_matches('/'));
        let builder = || {
            let mut b = opendal::services::S3::default().bucket(&spec.bucket).root(&root);
            if let Some(e) = &spec.endpoint {
                b = b.endpoint(e);
            }
            if let Some(c) = &spec.credentials {
                b = b
                    .access_key_id(&c.access_key_id)
                    .secret_access_key(&c.secret_access_key);
                if let Some(t) = &c.session_token {
                    b = b.session_token(t);
                }
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
        let raw = copying::Raw::new(&spec)?;
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
            known: Default::default(),
            raw,
            wire: copying::Wire::default(),
        })
    }
}
