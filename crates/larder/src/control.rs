//! The control socket: one JSON request line in, one JSON answer line out. Owner-only.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

/// Answers control requests.
pub trait Handler: Send + Sync + 'static {
    /// Answer `cmd`; `req` is the whole request, for commands with arguments.
    fn handle(&self, cmd: &str, req: &Value) -> Value;
}

/// Listen at `path` (replacing a stale socket) and answer requests on a thread.
pub fn serve(path: &Path, handler: Arc<dyn Handler>) -> Result<()> {
    if let Some(dir) = path.parent() {
        private_dir(dir)?;
    }
    let _ = std::fs::remove_file(path);
    // Bound inside a directory only its owner can enter: no one else can reach it even before the chmod.
    let listener = UnixListener::bind(path).with_context(|| format!("cannot listen at {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
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
    Ok(())
}

/// Create `dir` owner-only, or check that the one there is this user's own directory (in a shared
/// place such as /tmp another user could have made it first) and make it owner-only.
fn private_dir(dir: &Path) -> Result<()> {
    larder_cache::private::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
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
    let reply = match serde_json::from_str::<Value>(&line) {
        Ok(req) => match req["cmd"].as_str() {
            Some(cmd) => handler.handle(cmd, &req),
            None => serde_json::json!({"error": "request has no \"cmd\""}),
        },
        Err(e) => serde_json::json!({"error": format!("request is not JSON: {e}")}),
    };
    let mut conn = conn;
    writeln!(conn, "{reply}")
}

/// Send `cmd` to the daemon listening at `path`.
pub fn request(path: &Path, cmd: &str) -> Result<Value> {
    send(path, &serde_json::json!({ "cmd": cmd }), Some(Duration::from_secs(10)))
}

/// Send the request `req` (an object with a `cmd`) and wait up to `timeout` for the answer.
pub fn send(path: &Path, req: &Value, timeout: Option<Duration>) -> Result<Value> {
    let mut conn =
        UnixStream::connect(path).map_err(|e| anyhow!("no larder daemon answers at {}: {e}", path.display()))?;
    conn.set_read_timeout(timeout)?;
    writeln!(conn, "{req}")?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line).context("the daemon's answer is not JSON")?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(anyhow!("the daemon refused: {e}"));
    }
    Ok(v)
}
