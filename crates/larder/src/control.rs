//! The control socket: one JSON request line in, one JSON answer line out. Owner-only.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::status::Status;

/// What a client asks the daemon: the line `{"cmd":"status"}`, `{"cmd":"drain","wait_ms":1000}`, ...
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The status document.
    Status,
    /// The conflicts recorded, and the changes home refused.
    Conflicts,
    /// Push queued changes, waiting up to `wait_ms` (at most [`DRAIN_STEP_MAX_MS`]) for home to take
    /// them; answered with how that ended and the status after.
    Drain { wait_ms: u64 },
    /// Act on the residency of the files with these inode numbers.
    Residency { action: ResidencyAction, inos: Vec<u64> },
    /// Say this node is leaving its cluster and hand its units over, within `within_ms`.
    Leave { within_ms: u64 },
}

/// The longest one drain request waits: a client that wants longer asks again.
pub const DRAIN_STEP_MAX_MS: u64 = 5000;

/// What `larder prefetch`, `pin`, `unpin` and `evict` ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidencyAction {
    Prefetch,
    Pin,
    Unpin,
    Evict,
}

impl ResidencyAction {
    /// The command's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResidencyAction::Prefetch => "prefetch",
            ResidencyAction::Pin => "pin",
            ResidencyAction::Unpin => "unpin",
            ResidencyAction::Evict => "evict",
        }
    }
}

/// How a drain request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Drained {
    /// Home has every change.
    Empty,
    /// Home refused some changes; nothing behind them can be pushed until they are taken.
    Refused,
    /// Changes still wait.
    Waiting,
}

impl From<larder_fs::Drained> for Drained {
    fn from(d: larder_fs::Drained) -> Drained {
        match d {
            larder_fs::Drained::Empty => Drained::Empty,
            larder_fs::Drained::Refused => Drained::Refused,
            larder_fs::Drained::Waiting => Drained::Waiting,
        }
    }
}

/// What a residency request did to one file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileResidency {
    pub size: u64,
    /// Bytes cached after the request.
    pub cached: u64,
    /// Bytes brought in from home (prefetch, pin) or dropped (evict).
    pub moved: u64,
    pub pinned: bool,
}

/// The daemon's answer: one variant per request, or an error.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Status(Box<Status>),
    Conflicts {
        conflicts: Vec<larder_fs::Conflict>,
        failed_ops: Vec<larder_fs::RefusedChange>,
    },
    Drain {
        drained: Drained,
        status: Box<Status>,
    },
    /// One result per inode of the request, in its order: what was done, or why not.
    Residency {
        results: Vec<Result<FileResidency, String>>,
    },
    Left(crate::leave::HandedOver),
    /// The request was not understood.
    Error {
        message: String,
    },
}

/// Answers control requests.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request) -> Response;
}

/// Listen at `path` (replacing a stale socket) and answer requests on a thread. Returns the socket's
/// inode number: at exit the daemon removes the socket only if it is still this one (a daemon mounted at
/// the same place since, while this one was still closing, has its own there).
pub fn serve(path: &Path, handler: Arc<dyn Handler>) -> Result<u64> {
    if let Some(dir) = path.parent() {
        private_dir(dir)?;
    }
    let _ = std::fs::remove_file(path);
    // Bound inside a directory only its owner can enter: no one else can reach it even before the chmod.
    let listener = UnixListener::bind(path).with_context(|| format!("cannot listen at {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path)?);
    std::thread::Builder::new()
        .name("larder-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let handler = handler.clone();
                let _ = std::thread::Builder::new()
                    .name("larder-control-conn".into())
                    .spawn(move || {
                        let _ = answer(conn, handler.as_ref());
                    });
            }
        })?;
    Ok(ino)
}

/// Create `dir` owner-only, or check that the one there is this user's own directory (in a shared
/// place such as /tmp another user could have made it first) and make it owner-only.
fn private_dir(dir: &Path) -> Result<()> {
    larder_util::private::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let m = std::fs::symlink_metadata(dir).with_context(|| format!("cannot stat {}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me {
        bail!(
            "{} is not a directory of uid {me} (it belongs to uid {}): control sockets cannot be kept private there",
            dir.display(),
            m.uid()
        );
    }
    if m.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

fn answer(conn: UnixStream, handler: &dyn Handler) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let reply = match serde_json::from_str::<Request>(&line) {
        Ok(request) => handler.handle(request),
        Err(e) => Response::Error {
            message: format!(
                "not a request this daemon understands ({e}): {}",
                line.trim_end().chars().take(200).collect::<String>()
            ),
        },
    };
    let reply = serde_json::to_string(&reply).map_err(std::io::Error::other)?;
    let mut conn = conn;
    writeln!(conn, "{reply}")
}

/// Send `request` to the daemon listening at `path` and wait up to `timeout` for its answer (`None`: as
/// long as it takes). An error answer is an `Err`.
pub fn send(path: &Path, request: &Request, timeout: Option<Duration>) -> Result<Response> {
    let mut conn =
        UnixStream::connect(path).map_err(|e| anyhow!("no larder daemon answers at {}: {e}", path.display()))?;
    conn.set_read_timeout(timeout)?;
    writeln!(conn, "{}", serde_json::to_string(request)?)?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    match serde_json::from_str(&line).context("the daemon's answer is not one this larder understands")? {
        Response::Error { message } => bail!("the daemon refused: {message}"),
        response => Ok(response),
    }
}

/// The status of the daemon listening at `path`.
pub fn status(path: &Path) -> Result<Status> {
    match send(path, &Request::Status, Some(Duration::from_secs(10)))? {
        Response::Status(status) => Ok(*status),
        other => Err(unexpected("status", &other)),
    }
}

/// The error for an answer of the wrong kind.
pub fn unexpected(asked: &str, answer: &Response) -> anyhow::Error {
    let kind = serde_json::to_value(answer)
        .ok()
        .and_then(|v| v.as_object().and_then(|o| o.keys().next().cloned()))
        .unwrap_or_else(|| "?".into());
    anyhow!("the daemon answered '{asked}' with a '{kind}' reply")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_json_object_each() {
        let drain = Request::Drain { wait_ms: 250 };
        assert_eq!(
            serde_json::to_string(&drain).unwrap(),
            r#"{"cmd":"drain","wait_ms":250}"#
        );
        assert_eq!(serde_json::to_string(&Request::Status).unwrap(), r#"{"cmd":"status"}"#);
        let pin = Request::Residency {
            action: ResidencyAction::Pin,
            inos: vec![2, 3],
        };
        let line = serde_json::to_string(&pin).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), pin);
    }

    #[test]
    fn garbled_requests_are_refused() {
        for line in ["", "status", r#"{"cmd":"reboot"}"#, r#"{"cmd":"drain"}"#] {
            assert!(serde_json::from_str::<Request>(line).is_err(), "{line}");
        }
    }

    #[test]
    fn a_garbled_request_gets_an_error_reply() {
        struct Unreached;
        impl Handler for Unreached {
            fn handle(&self, request: Request) -> Response {
                panic!("{request:?} reached the handler")
            }
        }
        for line in ["{\"cmd\":\"reboot\"}", "not json at all"] {
            let (daemon, mut client) = UnixStream::pair().unwrap();
            writeln!(client, "{line}").unwrap();
            answer(daemon, &Unreached).unwrap();
            let mut reply = String::new();
            BufReader::new(client).read_line(&mut reply).unwrap();
            match serde_json::from_str::<Response>(&reply).unwrap() {
                Response::Error { message } => assert!(message.contains(line), "{message}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
