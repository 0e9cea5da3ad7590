//! The moto harness shared by the S3 test files: a local S3 server (`scripts/s3-server.sh`), a bucket
//! and prefix per test, `scripts/s3tool.py` to look at the objects, and mounts of `s3://BUCKET/PREFIX`.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::io::{AsRawFd, IntoRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::common::*;

/// The repository's root (for the scripts).
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The credentials and region every S3 client here uses (moto accepts any).
pub const CREDENTIALS: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
];

/// How long one s3tool or s3-server.sh command may take (pip may install moto on first use).
pub const TOOL_DEADLINE: Duration = Duration::from_secs(300);

pub fn script(name: &str) -> String {
    format!("{REPO}/scripts/{name}")
}

/// Whether `pid` is (still) a moto server, so cleanup never signals a process that reused its pid.
pub fn is_moto(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(4).any(|w| w == b"moto"))
}

pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

// The server ---------------------------------------------------------------------------------------------

/// A moto server started by `scripts/s3-server.sh` with a state dir of its own. Dropping it kills it.
pub struct S3Server {
    pub state: PathBuf,
    pub endpoint: String,
    pub pid: i32,
}

impl S3Server {
    /// A server on loopback.
    pub fn start(state: &Path) -> S3Server {
        S3Server::start_on(state, "127.0.0.1")
    }

    /// A server listening on `host`, an address of this machine (e.g. a test network's bridge, for
    /// mounts in other network namespaces); its endpoint names that address.
    pub fn start_on(state: &Path, host: &str) -> S3Server {
        let out = run_cmd_env(
            "bash",
            &[&script("s3-server.sh"), "start"],
            &[("S3_STATE_DIR", s(state)), ("S3_HOST", host)],
            TOOL_DEADLINE,
        );
        assert!(out.success(), "scripts/s3-server.sh start failed:\n{out}");
        let endpoint = out
            .stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix("S3_ENDPOINT="))
            .unwrap_or_else(|| panic!("no S3_ENDPOINT in the output of s3-server.sh start:\n{out}"))
            .to_string();
        let pid: i32 = std::fs::read_to_string(state.join("pid"))
            .expect("s3-server.sh writes a pid file")
            .trim()
            .parse()
            .expect("a pid in the pid file");
        assert!(is_moto(pid), "pid {pid} of the pid file is not a moto server");
        S3Server {
            state: state.to_path_buf(),
            endpoint,
            pid,
        }
    }

    /// The environment of s3tool and larder: the endpoint and the credentials.
    pub fn env(&self) -> Vec<(&str, &str)> {
        let mut env = vec![("S3_ENDPOINT", self.endpoint.as_str())];
        env.extend(CREDENTIALS);
        env
    }

    /// The HTTP requests the server has logged so far (werkzeug logs one line per request), by kind:
    /// listings (ListObjectsV2), HEADs, other GETs, and the rest.
    pub fn requests(&self) -> Requests {
        // Python's stderr is line-buffered: give the last lines a moment to land.
        std::thread::sleep(Duration::from_millis(300));
        let log = std::fs::read_to_string(self.state.join("moto.log")).unwrap_or_default();
        let mut r = Requests::default();
        for l in log.lines().filter(|l| l.contains(" HTTP/1.")) {
            if l.contains("\"GET ") && l.contains("list-type=2") {
                r.list += 1;
            } else if l.contains("\"HEAD ") {
                r.head += 1;
            } else if l.contains("\"GET ") {
                r.get += 1;
            } else {
                r.other += 1;
            }
        }
        r
    }

    /// The request lines the server has logged so far (werkzeug logs one line per request).
    pub fn request_lines(&self) -> Vec<String> {
        // Python's stderr is line-buffered: give the last lines a moment to land.
        std::thread::sleep(Duration::from_millis(300));
        let log = std::fs::read_to_string(self.state.join("moto.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains(" HTTP/1."))
            .map(str::to_string)
            .collect()
    }

    /// SIGKILL the server and wait until it is gone.
    pub fn kill(&self) {
        if is_moto(self.pid) {
            signal(self.pid, libc::SIGKILL);
        }
        assert!(
            wait_until(Duration::from_secs(10), || !is_moto(self.pid)),
            "moto (pid {}) survived SIGKILL",
            self.pid
        );
    }

    pub fn stop_process(&self) {
        signal(self.pid, libc::SIGSTOP);
        assert!(
            wait_until(Duration::from_secs(5), || process_state(self.pid) == Some('T')),
            "moto (pid {}) did not stop",
            self.pid
        );
    }

    pub fn continue_process(&self) {
        signal(self.pid, libc::SIGCONT);
        assert!(
            wait_until(Duration::from_secs(5), || process_state(self.pid) != Some('T')),
            "moto (pid {}) did not resume",
            self.pid
        );
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        // Never panics: signals only a process that still is a moto server.
        if is_moto(self.pid) {
            // SAFETY: kill has no memory preconditions; the pid is our moto server.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
            wait_until(Duration::from_secs(5), || !is_moto(self.pid));
        }
        let _ = std::fs::remove_file(self.state.join("pid"));
        let _ = std::fs::remove_file(self.state.join("port"));
    }
}

/// Counts of HTTP requests a server has served.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Requests {
    pub list: usize,
    pub head: usize,
    pub get: usize,
    pub other: usize,
}

impl std::ops::Sub for Requests {
    type Output = Requests;
    fn sub(self, o: Requests) -> Requests {
        Requests {
            list: self.list - o.list,
            head: self.head - o.head,
            get: self.get - o.get,
            other: self.other - o.other,
        }
    }
}

// One test's world ---------------------------------------------------------------------------------------

/// A test's server, bucket, prefix, mount point and cache dir. Fields drop in order: the server is
/// killed before the temporary directory goes (a test's [`Mount`] is a local declared later, so it is
/// unmounted first).
pub struct S3Test {
    pub srv: S3Server,
    pub t: TestDir,
    pub bucket: String,
    pub prefix: String,
    /// Names of scratch files for s3tool.
    pub scratch: AtomicU64,
}

impl S3Test {
    /// A new server with bucket `larder-NAME`; the mount's home is `s3://larder-NAME/PREFIX`.
    pub fn new(name: &str, prefix: &str) -> S3Test {
        S3Test::new_on(name, prefix, "127.0.0.1")
    }

    /// Like [`S3Test::new`], the server listening on `host` (see [`S3Server::start_on`]).
    pub fn new_on(name: &str, prefix: &str, host: &str) -> S3Test {
        let t = TestDir::new(name);
        let srv = S3Server::start_on(&t.root().join("s3-state"), host);
        let st = S3Test {
            srv,
            t,
            bucket: format!("larder-{name}"),
            prefix: prefix.to_string(),
            scratch: AtomicU64::new(0),
        };
        st.tool_ok(&["mb", &st.bucket]);
        st
    }

    pub fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// The object key of `rel` in the mount.
    pub fn key(&self, rel: &str) -> String {
        format!("{}/{rel}", self.prefix)
    }

    pub fn scratch_path(&self) -> PathBuf {
        let n = self.scratch.fetch_add(1, Ordering::Relaxed);
        self.t.root().join(format!("scratch-{n}"))
    }

    /// Run `s3tool.py args`.
    pub fn tool(&self, args: &[&str]) -> Output {
        let mut argv = vec![script("s3tool.py")];
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        run_cmd_env("python3", &argv, &self.srv.env(), TOOL_DEADLINE)
    }

    /// Run `s3tool.py args`, failing the test if it fails; returns its stdout.
    pub fn tool_ok(&self, args: &[&str]) -> String {
        let out = self.tool(args);
        assert!(out.success(), "s3tool.py {} failed:\n{out}", args.join(" "));
        out.stdout
    }

    pub fn put(&self, key: &str, data: &[u8]) {
        let p = self.scratch_path();
        std::fs::write(&p, data).expect("write scratch file");
        self.tool_ok(&["put", &self.bucket, key, s(&p)]);
        let _ = std::fs::remove_file(&p);
    }

    /// The object's bytes, or None if there is no such object.
    pub fn try_get(&self, key: &str) -> Option<Vec<u8>> {
        let p = self.scratch_path();
        let out = self.tool(&["get", &self.bucket, key, s(&p)]);
        if out.code == Some(2) && out.stderr.contains("NoSuchKey") {
            return None;
        }
        assert!(out.success(), "s3tool.py get {key} failed:\n{out}");
        let v = std::fs::read(&p).expect("read scratch file");
        let _ = std::fs::remove_file(&p);
        Some(v)
    }

    pub fn get(&self, key: &str) -> Vec<u8> {
        self.try_get(key)
            .unwrap_or_else(|| panic!("there is no object {key}: {:?}", self.ls("")))
    }

    /// Every object whose key starts with `prefix`: key -> (size, etag).
    pub fn ls(&self, prefix: &str) -> BTreeMap<String, (u64, String)> {
        self.tool_ok(&["ls", &self.bucket, prefix])
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 3, "bad s3tool ls line {l:?}");
                (f[0].to_string(), (f[1].parse().expect("size"), f[2].to_string()))
            })
            .collect()
    }

    /// Keys and sizes under this test's prefix, relative to it (`PREFIX/a/b` is `a/b`). The prefix's own
    /// marker (`PREFIX/`, where the mount keeps its root directory's time) is left out.
    pub fn objects(&self) -> BTreeMap<String, u64> {
        let p = format!("{}/", self.prefix);
        self.ls(&p)
            .into_iter()
            .filter(|(k, _)| k.len() > p.len())
            .map(|(k, (size, _))| (k[p.len()..].to_string(), size))
            .collect()
    }

    pub fn mount_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["--s3-endpoint", self.srv.endpoint.as_str(), "--s3-region", "us-east-1"];
        args.extend_from_slice(extra);
        args
    }

    /// Mount this test's home at `mnt` with cache dir `cache`.
    pub fn mount_at(&self, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        self.mount_url_at(&self.url(), mnt, cache, extra)
    }

    /// Mount the home `url` (of this test's server) at `mnt` with cache dir `cache`.
    pub fn mount_url_at(&self, url: &str, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        let args = self.mount_args(extra);
        match Mount::try_new_env(url, mnt, cache, &args, &self.srv.env()) {
            Ok(m) => m,
            Err(out) => panic!(
                "larder mount {url} {} failed:\n{out}\n--- daemon log ---\n{}\n--- requests the server \
                 served so far: {:?}",
                mnt.display(),
                log_tail(cache, 60),
                self.srv.requests()
            ),
        }
    }

    pub fn mount(&self, extra: &[&str]) -> Mount {
        self.mount_at(&self.t.mnt, &self.t.cache, extra)
    }

    /// Another mount of the same home at `mntN` over an empty cache `cacheN`: what a node that never
    /// cached it, or a remount after the cache was lost, sees.
    pub fn mount_fresh(&self, n: u32, extra: &[&str]) -> Mount {
        let (mnt, cache) = (
            self.t.root().join(format!("mnt{n}")),
            self.t.root().join(format!("cache{n}")),
        );
        std::fs::create_dir(&mnt).unwrap();
        self.mount_at(&mnt, &cache, extra)
    }
}

impl S3Test {
    /// Every file object under the prefix (directory markers left out), relative key -> bytes.
    pub fn home_files(&self) -> BTreeMap<String, Vec<u8>> {
        let keys: Vec<String> = self.objects().into_keys().filter(|k| !k.ends_with('/')).collect();
        let dir = self.scratch_path();
        self.tool_ok(&["get-dir", &self.bucket, &self.prefix, s(&dir)]);
        let files = keys
            .into_iter()
            .map(|k| {
                let v = std::fs::read(dir.join(&k)).unwrap_or_else(|e| panic!("s3tool get-dir gave no {k}: {e}"));
                (k, v)
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        files
    }

    /// The directory markers under the prefix (relative, without the trailing '/').
    pub fn markers(&self) -> BTreeSet<String> {
        self.objects()
            .into_keys()
            .filter_map(|k| k.strip_suffix('/').map(str::to_string))
            .collect()
    }

    /// Fail the test unless the bucket's files under the prefix are exactly `model` (keys and bytes).
    #[track_caller]
    pub fn assert_home_is(&self, model: &BTreeMap<String, Vec<u8>>, m: &Mount, what: &str) {
        let home = self.home_files();
        let diffs = differences(&home, model);
        assert!(
            diffs.is_empty(),
            "{what}: {} difference(s) between the bucket (left) and the model (right):\n  {}\n--- daemon log ---\n{}",
            diffs.len(),
            diffs.join("\n  "),
            m.log()
        );
    }

    /// Fail the test if the bucket has a directory marker for a directory that does not exist in the
    /// model (a stale marker shows a ghost directory to every other client).
    #[track_caller]
    pub fn assert_markers_within(&self, dirs: &BTreeSet<String>, what: &str) {
        let stale: Vec<String> = self.markers().difference(dirs).cloned().collect();
        assert!(
            stale.is_empty(),
            "{what}: markers of directories that do not exist: {stale:?} (directories: {dirs:?})"
        );
    }
}

// Helpers ------------------------------------------------------------------------------------------------

/// Read `path` after dropping the kernel's page cache of it, so the read reaches the daemon.
pub fn read_uncached(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    // SAFETY: fadvise on a valid descriptor.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

pub fn read_uncached_ok(path: &Path) -> Vec<u8> {
    read_uncached(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `home.ops_by_kind.KIND` of a status.
pub fn ops(v: &serde_json::Value, kind: &str) -> u64 {
    num(v, &format!("/home/ops_by_kind/{kind}"))
}

/// Close `f` and fail the test if close(2) fails (write-through: close reports the upload).
pub fn close_checked(f: File, what: &str) {
    let fd = f.into_raw_fd();
    // SAFETY: we own fd (taken from the File).
    let r = unsafe { libc::close(fd) };
    assert_eq!(r, 0, "close of {what} failed: {}", std::io::Error::last_os_error());
}

/// Write `data` to a new file `path` in the mount, checking write and close.
pub fn create_with(path: &Path, data: &[u8]) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    close_checked(f, &path.display().to_string());
}

pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// What differs between `got` (e.g. the bucket) and `want` (the model), one line per key.
pub fn differences(got: &BTreeMap<String, Vec<u8>>, want: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let mut d = Vec::new();
    for (k, w) in want {
        match got.get(k) {
            None => d.push(format!("{k}: missing (the model has {} bytes)", w.len())),
            Some(g) if g != w => {
                let first = g
                    .iter()
                    .zip(w)
                    .position(|(a, b)| a != b)
                    .unwrap_or(g.len().min(w.len()));
                d.push(format!(
                    "{k}: {} bytes, the model {} bytes, first difference at {first}",
                    g.len(),
                    w.len()
                ));
            }
            Some(_) => {}
        }
    }
    for (k, g) in got {
        if !want.contains_key(k) {
            d.push(format!("{k}: {} bytes, not in the model", g.len()));
        }
    }
    d
}
