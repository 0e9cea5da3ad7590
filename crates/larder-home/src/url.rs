//! Turning a user's HOME argument into a home.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{
    Home, HomeCounters, HomeError, HomeResult, Layer, Layered, MetricsLayer, OpKind, PosixHome, WanLayer, WanSpec,
};

/// How to open a home.
#[derive(Clone, Debug, Default)]
pub struct HomeSpec {
    /// A directory path, a `file://` URL or an `s3://bucket/prefix` URL.
    pub url: String,
    /// Deadline of each home call (`None`: unbounded).
    pub op_timeout: Option<Duration>,
    /// Emulate a slow link in front of the home.
    pub wan: Option<WanSpec>,
    /// S3 endpoint (for S3-compatible servers), e.g. `http://127.0.0.1:9000`.
    pub s3_endpoint: Option<String>,
    /// S3 region.
    pub s3_region: Option<String>,
    /// S3 keys (otherwise the standard AWS environment variables and files).
    pub s3_credentials: Option<S3Credentials>,
    /// Keep modes, owners, times and symlinks in S3 object metadata (s3fs's convention).
    pub s3_metadata: bool,
    /// Testing aid: while this file exists every call fails as if home could not be reached. It sits below
    /// the counters, so those calls count as the failed home operations they stand for.
    pub fault_file: Option<PathBuf>,
}

/// The keys an S3 home signs its requests with.
#[derive(Clone, Default)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    // The secret never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Fails every home call while a file exists (home "goes away" and comes back).
struct FaultFile(PathBuf);

impl Layer for FaultFile {
    fn before(&self, _op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        if self.0.exists() {
            Err(HomeError::Unavailable(format!(
                "fault file {} is present",
                self.0.display()
            )))
        } else {
            Ok(())
        }
    }
}

/// A home opened by [`open_home`].
pub struct OpenedHome {
    /// The home with its layers.
    pub home: Arc<dyn Home>,
    pub counters: Arc<HomeCounters>,
    /// Something the user should know that does not stop the mount (an S3 prefix with nothing under it).
    pub note: Option<String>,
}

/// Open the home `spec` names, after checking that it exists and can be read. Fails with one line naming
/// the problem.
pub fn open_home(spec: &HomeSpec) -> Result<OpenedHome, String> {
    let url = spec.url.as_str();
    let mut note = None;
    let mut home: Arc<dyn Home> = if let Some(rest) = url.strip_prefix("s3://") {
        let (home, n) = open_s3(rest, spec)?;
        note = n;
        home
    } else {
        let root = if let Some(rest) = url.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(format!("home URL '{url}' must be absolute (file:///path)"));
            }
            PathBuf::from(rest)
        } else if let Some((scheme, _)) = url.split_once("://") {
            return Err(format!(
                "home URL scheme '{scheme}://' is not supported (use a directory path, file:// or s3://)"
            ));
        } else {
            PathBuf::from(url)
        };
        let root = std::fs::canonicalize(&root).map_err(|e| format!("home '{}' is not usable: {e}", root.display()))?;
        let meta = std::fs::metadata(&root).map_err(|e| format!("home '{}' is not usable: {e}", root.display()))?;
        if !meta.is_dir() {
            return Err(format!("home '{}' is not a directory", root.display()));
        }
        std::fs::read_dir(&root).map_err(|e| format!("home '{}' cannot be read: {e}", root.display()))?;
        let posix = PosixHome::new(&root, spec.op_timeout)
            .map_err(|e| format!("home '{}' cannot be opened: {e}", root.display()))?;
        Arc::new(posix)
    };
    let counters = Arc::new(HomeCounters::default());
    if let Some(wan) = spec.wan {
        home = Arc::new(Layered::new(home, WanLayer::new(wan)));
    }
    if let Some(f) = &spec.fault_file {
        home = Arc::new(Layered::new(home, FaultFile(f.clone())));
    }
    home = Arc::new(Layered::new(home, MetricsLayer(counters.clone())));
    Ok(OpenedHome { home, counters, note })
}

/// Open and check an S3 home; a note when its prefix holds nothing yet.
#[cfg(feature = "s3")]
fn open_s3(rest: &str, spec: &HomeSpec) -> Result<(Arc<dyn Home>, Option<String>), String> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("home URL 's3://{rest}' names no bucket (s3://bucket/prefix)"));
    }
    if !crate::valid_bucket_name(bucket) {
        return Err(format!(
            "home 's3://{rest}': '{bucket}' is not a valid S3 bucket name (3 to 63 lowercase letters, digits, \
             '-' and '.', starting and ending with a letter or digit)"
        ));
    }
    if prefix.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(format!(
            "home URL 's3://{rest}' has a '.' or '..' segment in its prefix"
        ));
    }
    let s3 = crate::S3Home::new(crate::S3Spec {
        bucket: bucket.to_string(),
        prefix: prefix.trim_matches('/').to_string(),
        endpoint: spec.s3_endpoint.clone(),
        region: spec.s3_region.clone(),
        op_timeout: spec.op_timeout.unwrap_or(Duration::from_secs(30)),
        credentials: spec.s3_credentials.clone(),
        keep_metadata: spec.s3_metadata,
    })
    .map_err(|e| format!("home 's3://{rest}' is not usable: {e}"))?;
    let checked = s3
        .check()
        .map_err(|e| format!("home 's3://{rest}' is not usable: {e}"))?;
    let note = (checked == crate::Checked::Empty).then(|| {
        format!(
            "nothing is stored under {} yet: it starts as an empty home",
            s3.describe()
        )
    });
    Ok((Arc::new(s3), note))
}

#[cfg(not(feature = "s3"))]
fn open_s3(rest: &str, _spec: &HomeSpec) -> Result<(Arc<dyn Home>, Option<String>), String> {
    Err(format!("home 's3://{rest}': this larder was built without S3 support"))
}
