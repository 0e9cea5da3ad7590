//! Turning a user's HOME argument into a home.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{Home, HomeCounters, Layered, MetricsLayer, PosixHome, WanLayer, WanSpec};

/// How to open a home.
#[derive(Clone, Debug, Default)]
pub struct HomeSpec {
    /// A directory path or `file://` URL.
    pub url: String,
    /// Deadline of each home call (`None`: unbounded).
    pub op_timeout: Option<Duration>,
    /// Emulate a slow link in front of the home.
    pub wan: Option<WanSpec>,
}

/// Open the home `spec` names, after checking that it exists and can be read. Returns the layered home and
/// its counters.
pub fn open_home(spec: &HomeSpec) -> Result<(Arc<dyn Home>, Arc<HomeCounters>), String> {
    let url = spec.url.as_str();
    let root = if let Some(rest) = url.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(format!("home URL '{url}' must be absolute (file:///path)"));
        }
        PathBuf::from(rest)
    } else if let Some((scheme, _)) = url.split_once("://") {
        return Err(format!(
            "home URL scheme '{scheme}://' is not supported (use a directory path or file://)"
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
    let counters = Arc::new(HomeCounters::default());
    let posix = PosixHome::new(&root, spec.op_timeout)
        .map_err(|e| format!("home '{}' cannot be opened: {e}", root.display()))?;
    let mut home: Arc<dyn Home> = Arc::new(posix);
    if let Some(wan) = spec.wan {
        home = Arc::new(Layered::new(home, WanLayer::new(wan)));
    }
    home = Arc::new(Layered::new(home, MetricsLayer(counters.clone())));
    Ok((home, counters))
}
