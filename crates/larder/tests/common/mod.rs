//! The harness of the mount tests: a temporary home, mount point and cache dir per test, running the
//! `larder` binary with deadlines, a [`Mount`] guard that always unmounts, status snapshots, and random
//! file content from a small PRNG.

// Each test binary that includes this module uses a subset of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test.
pub const LARDER: &str = env!("CARGO_BIN_EXE_larder");

/// How long any single `larder` command may take before the test fails.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

/// Fail loudly (not skip) when the machine cannot run FUSE tests.
pub fn require_fuse() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the larder mount tests must run as root (euid is {euid}): they mount FUSE file systems, chown and umount"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: the mount tests need FUSE (load the fuse module / pass the device to the container)"
    );
}

/// The output of one finished command.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn drain(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// Run `program args`, killing it and failing the test if it takes longer than `deadline`.
pub fn run_cmd(program: &str, args: &[&str], deadline: Duration) -> Output {
    run_cmd_env(program, args, &[], deadline)
}

/// Run `larder args`.
pub fn larder(args: &[&str]) -> Output {
    run_cmd(LARDER, args, COMMAND_DEADLINE)
}

/// `p` as a &str (all test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// A fresh temporary directory under /tmp holding `home/`, `mnt/` and `cache/`.
pub struct TestDir {
    pub tmp: tempfile::TempDir,
    pub home: PathBuf,
    pub mnt: PathBuf,
    pub cache: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        require_fuse();
        let tmp = tempfile::Builder::new()
            .prefix(&format!("larder-test-{name}-"))
            .tempdir_in("/tmp")
            .expect("create a temp dir under /tmp");
        let root = tmp.path().to_path_buf();
        let (home, mnt, cache) = (root.join("home"), root.join("mnt"), root.join("cache"));
        for d in [&home, &mnt] {
            std::fs::create_dir(d).expect("create test dir");
        }
        TestDir { tmp, home, mnt, cache }
    }

    pub fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// Mount this dir's home at its mount point with its cache dir and `extra` options.
    pub fn mount(&self, extra: &[&str]) -> Mount {
        Mount::new(&self.home, &self.mnt, &self.cache, extra)
    }

    /// A write-back mount with sync lag `sync_lag` whose daemon serves its metrics at a free loopback
    /// address, returned with it.
    #[allow(dead_code)]
    pub fn mount_with_metrics(&self, sync_lag: &str) -> (Mount, String) {
        let addr = free_local_addr();
        let m = self.mount(&[
            "--metrics-addr",
            &addr,
            "--write-mode",
            "write-back",
            "--sync-lag",
            sync_lag,
        ]);
        (m, addr)
    }
}

/// Whether a mount of any kind is at `mnt` (from /proc/self/mountinfo; never touches the mount itself).
pub fn is_mounted(mnt: &Path) -> bool {
    mountinfo(mnt).is_some()
}

/// The fields of the line of /proc/self/mountinfo of the topmost mount at `mnt` (the last naming it): its
/// per-mount options at 5, and after the `-` field its type, source and options.
#[allow(dead_code)]
pub fn mountinfo(mnt: &Path) -> Option<Vec<String>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .rev()
        .map(|l| l.split(' ').map(str::to_string).collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&want))
}

/// Whether process `pid` exists (zombies of our own children count; the daemons are not our children).
pub fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Whether `pid` is (still) a larder daemon, so cleanup never signals a process that reused its pid.
pub fn is_larder_daemon(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
        args.first().is_some_and(|a| a.ends_with(b"larder")) && args.contains(&&b"--foreground"[..])
    })
}

/// Send `sig` to `pid`.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill has no memory preconditions.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(r, 0, "kill({pid}, {sig}) failed: {}", std::io::Error::last_os_error());
}

/// Poll `f` every 20 ms until it is true or `deadline` passes; returns whether it became true.
pub fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + deadline;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The control socket larder uses for `mnt` (root): removed after a forced cleanup.
pub fn socket_path(mnt: &Path) -> PathBuf {
    PathBuf::from("/run/larder").join(format!("{:016x}.sock", fnv64(mnt.as_os_str().as_bytes())))
}

/// A live larder mount. Dropping it unmounts (`larder unmount`, else a lazy unmount and SIGKILL of the
/// daemon), so a failing test never leaves a mount behind.
pub struct Mount {
    pub mnt: PathBuf,
    pub cache: PathBuf,
    pub pid: i32,
    done: bool,
}

fn parse_pid(stdout: &str) -> Option<i32> {
    let start = stdout.rfind("(pid ")? + 5;
    let end = stdout[start..].find(')')? + start;
    stdout[start..end].trim().parse().ok()
}

impl Mount {
    /// Mount `home` at `mnt` with `--cache-dir cache` and `extra`; fails the test with larder's message
    /// and log if it cannot.
    pub fn new(home: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        match Mount::try_new(home, mnt, cache, extra) {
            Ok(m) => m,
            Err(out) => panic!(
                "larder mount {} {} failed:\n{out}\n--- daemon log ---\n{}",
                home.display(),
                mnt.display(),
                log_tail(cache, 60)
            ),
        }
    }

    /// Like [`Mount::new`], returning the command's output on failure.
    pub fn try_new(home: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Result<Mount, Output> {
        Mount::try_new_env(s(home), mnt, cache, extra, &[])
    }

    /// A mount someone else made (mount(8), a run in the foreground), guarded like one `Mount::new`
    /// made: its daemon is `pid`, or the one its status names.
    pub fn adopt(mnt: &Path, cache: &Path, pid: Option<i32>) -> Mount {
        let mnt = std::fs::canonicalize(mnt).expect("canonical mount point");
        let pid = pid.unwrap_or_else(|| {
            status(&mnt)["pid"]
                .as_i64()
                .map(|p| p as i32)
                .expect("the mount's status names its daemon")
        });
        Mount {
            mnt,
            cache: cache.to_path_buf(),
            pid,
            done: false,
        }
    }

    /// `larder status --json` of this mount.
    pub fn status(&self) -> Value {
        status(&self.mnt)
    }

    /// Wait until the daemon has no open handle: the kernel releases a handle after the `close` that
    /// ended it returns. Fails the test after 10 s.
    pub fn wait_released(&self) {
        assert!(
            wait_until(Duration::from_secs(10), || num(&self.status(), "/fs/open_handles") == 0),
            "a handle was never released"
        );
    }

    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The end of the daemon's log.
    pub fn log(&self) -> String {
        log_tail(&self.cache, 80)
    }

    /// `larder unmount`; fails the test if it does not succeed. The daemon must be gone afterwards.
    pub fn unmount(mut self) {
        let out = larder(&["unmount", s(&self.mnt), "--timeout", "20s", "--drain"]);
        assert!(
            out.success(),
            "larder unmount {} failed:\n{out}\n--- daemon log ---\n{}",
            self.mnt.display(),
            self.log()
        );
        self.done = true;
        assert!(
            wait_until(Duration::from_secs(10), || !alive(self.pid)),
            "the daemon (pid {}) is still alive after larder unmount",
            self.pid
        );
        assert!(
            !is_mounted(&self.mnt),
            "{} is still mounted after larder unmount",
            self.mnt.display()
        );
    }

    /// Forget this mount without unmounting (after the test has taken it down itself, e.g. by SIGKILL and
    /// a new mount on the same mount point).
    pub fn disarm(mut self) {
        self.done = true;
    }

    /// Force the mount away: lazy unmount and SIGKILL.
    pub fn force_cleanup(&self) {
        if is_larder_daemon(self.pid) {
            // SAFETY: signals to our own daemon.
            unsafe {
                libc::kill(self.pid, libc::SIGCONT);
            }
        }
        if is_mounted(&self.mnt) {
            let c = CString::new(self.mnt.as_os_str().as_bytes()).expect("path");
            // SAFETY: valid NUL-terminated path.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
        if is_larder_daemon(self.pid) {
            // SAFETY: our own daemon.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
            wait_until(Duration::from_secs(5), || !alive(self.pid));
        }
        let _ = std::fs::remove_file(socket_path(&self.mnt));
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "--- larder log of {} (pid {}) ---\n{}",
                self.mnt.display(),
                self.pid,
                self.log()
            );
        }
        // A stopped daemon (SIGSTOP in a test) must run again to unmount cleanly.
        if is_larder_daemon(self.pid) {
            // SAFETY: signal to our own daemon.
            unsafe {
                libc::kill(self.pid, libc::SIGCONT);
            }
        }
        if is_mounted(&self.mnt) {
            let out = run_cmd(
                LARDER,
                &["unmount", s(&self.mnt), "--timeout", "10s", "--leave-pending"],
                Duration::from_secs(20),
            );
            if !out.success() {
                eprintln!("larder unmount {} failed in cleanup: {out}", self.mnt.display());
            }
        }
        if is_mounted(&self.mnt) || is_larder_daemon(self.pid) {
            self.force_cleanup();
        }
    }
}

/// `larder status MNT --json`, parsed; fails the test if the command fails.
pub fn status(mnt: &Path) -> Value {
    let out = larder(&["status", s(mnt), "--json"]);
    assert!(out.success(), "larder status {} --json failed:\n{out}", mnt.display());
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("status is not JSON ({e}):\n{}", out.stdout))
}

/// The unsigned number at JSON `pointer` of a status, failing the test if it is missing.
pub fn num(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("status has no number at {pointer}: {v}"))
}

/// The last `lines` lines of the daemon log in `cache`.
pub fn log_tail(cache: &Path, lines: usize) -> String {
    match std::fs::read_to_string(cache.join("larder.log")) {
        Ok(t) => {
            let all: Vec<&str> = t.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(no log: {e})"),
    }
}

/// xorshift64*: deterministic pseudo-random numbers for file contents, sizes and offsets.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545F4914F6CDD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Between `lo` and `hi` (inclusive) random bytes.
    pub fn bytes_between(&mut self, lo: usize, hi: usize) -> Vec<u8> {
        let n = lo + self.below((hi - lo) as u64 + 1) as usize;
        self.bytes(n)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Write `size` random bytes to `path` (creating parents); returns the content.
pub fn write_random(path: &Path, size: usize, rng: &mut Rng) -> Vec<u8> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).expect("create parent dirs");
    }
    let data = rng.bytes(size);
    std::fs::write(path, &data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    data
}

/// Every regular file, directory and symlink under `root`, by relative path (sorted).
pub fn walk(root: &Path) -> BTreeMap<PathBuf, std::fs::Metadata> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display())) {
            let e = e.expect("dir entry");
            let r = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(root.join(&r))
                .unwrap_or_else(|err| panic!("lstat {}: {err}", root.join(&r).display()));
            if m.is_dir() {
                stack.push(r.clone());
            }
            out.insert(r, m);
        }
    }
    out
}

/// Names in directory `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Read a whole file, failing the test with the path on error.
pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Assert two byte strings are equal without printing megabytes: names the first difference.
#[track_caller]
pub fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    panic!(
        "{what}: content differs (got {} bytes, want {} bytes; first differing offset {:?})",
        got.len(),
        want.len(),
        first.or(Some(got.len().min(want.len())))
    );
}

/// Run `f` on a thread; fail the test if it does not finish within `deadline` (the thread is left behind).
pub fn with_deadline<T: Send + 'static>(deadline: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(deadline) {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {deadline:?} (it hangs)"),
    }
}

/// Set the mtime of `path` to `secs` after the epoch (atime likewise).
pub fn set_mtime(path: &Path, secs: i64) {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs as u64);
    let f = std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open for set_times");
    f.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
        .expect("set_times");
}

/// The mtime of `path` in whole seconds.
pub fn mtime_secs(path: &Path) -> i64 {
    std::fs::metadata(path).expect("stat").mtime()
}

/// Like [`run_cmd`], with `env` added to the child's environment (e.g. credentials of an S3 home).
pub fn run_cmd_env(program: &str, args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let out = drain(child.stdout.take().expect("stdout pipe"));
    let err = drain(child.stderr.take().expect("stderr pipe"));
    let until = Instant::now() + deadline;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for child") {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{program} {}` did not finish within {deadline:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The pipes close when the child exits (the daemon larder starts does not inherit them).
    let stdout = out.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    let stderr = err.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    Output {
        code: status.code(),
        stdout,
        stderr,
    }
}

impl Mount {
    /// Mount the home URL `home` (e.g. `s3://bucket/prefix`) at `mnt` with `--cache-dir cache` and
    /// `extra`, the `larder mount` command (and so the daemon) running with `env` added to its
    /// environment; returns the command's output on failure.
    pub fn try_new_env(
        home: &str,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Mount, Output> {
        Mount::try_new_with(home, mnt, cache, extra, env, None)
    }

    /// Like [`Mount::try_new_env`], the `larder mount` command started under `umask` if given (through
    /// `sh`), as a user whose shell has that umask would start it.
    pub fn try_new_with(
        home: &str,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        umask: Option<u32>,
    ) -> Result<Mount, Output> {
        match umask {
            None => Mount::launch(&[], home, mnt, cache, extra, env),
            Some(u) => {
                let u = format!("{u:03o}");
                let prefix = ["sh", "-c", "umask \"$0\" && exec \"$@\"", &u];
                Mount::launch(&prefix, home, mnt, cache, extra, env)
            }
        }
    }

    /// Like [`Mount::try_new_env`], the `larder mount` command (and so the daemon) run under `prefix`, a
    /// command that runs the program appended to it: e.g. `nsenter --net=/run/netns/NS`, to put the
    /// daemon in a network namespace while it mounts where the test sees it.
    pub fn try_new_under(
        prefix: &[&str],
        home: &str,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Mount, Output> {
        assert!(!prefix.is_empty(), "an empty prefix: use Mount::try_new_env");
        Mount::launch(prefix, home, mnt, cache, extra, env)
    }

    /// `larder mount` with these arguments, run under `prefix` (a command that runs the program appended
    /// to it) if it is not empty.
    fn launch(
        prefix: &[&str],
        home: &str,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Mount, Output> {
        let mut args: Vec<&str> = vec!["mount", home, s(mnt), "--cache-dir", s(cache)];
        args.extend_from_slice(extra);
        // Tests of the part-one behaviour check home right after each call: they run write-through unless
        // they choose a mode.
        if !extra.iter().any(|a| *a == "--write-mode" || *a == "--read-only") {
            args.extend_from_slice(&["--write-mode", "write-through"]);
        }
        let out = match prefix {
            [] => run_cmd_env(LARDER, &args, env, COMMAND_DEADLINE),
            [program, rest @ ..] => {
                let mut argv: Vec<&str> = rest.to_vec();
                argv.push(LARDER);
                argv.extend_from_slice(&args);
                run_cmd_env(program, &argv, env, COMMAND_DEADLINE)
            }
        };
        if !out.success() {
            return Err(out);
        }
        let mnt = std::fs::canonicalize(mnt).expect("canonical mount point");
        let pid = parse_pid(&out.stdout)
            .or_else(|| status(&mnt)["pid"].as_i64().map(|p| p as i32))
            .unwrap_or_else(|| panic!("no daemon pid in `larder mount` output:\n{out}"));
        assert!(
            is_mounted(&mnt),
            "larder mount succeeded but nothing is mounted at {}:\n{out}",
            mnt.display()
        );
        Ok(Mount {
            mnt,
            cache: cache.to_path_buf(),
            pid,
            done: false,
        })
    }
}

/// `larder drain MNT --timeout SECSs`; fails the test (with the daemon log) if it does not succeed.
#[track_caller]
/// Wait up to `secs` for the daemon of `m` to report home online again (its prober asks once a second);
/// fail the test with `what` and the home section of its status if it does not.
pub fn wait_online(m: &Mount, secs: u64, what: &str) {
    assert!(
        wait_until(Duration::from_secs(secs), || m.status()["home"]["state"] == "online"),
        "home did not come back online within {secs} s {what}: {}",
        m.status()["home"]
    );
}

pub fn drain_ok(m: &Mount, secs: u64) {
    let timeout = format!("{secs}s");
    let started = Instant::now();
    let out = run_cmd(
        LARDER,
        &["drain", s(&m.mnt), "--timeout", &timeout],
        Duration::from_secs(secs + 30),
    );
    assert!(
        out.success(),
        "larder drain {} --timeout {timeout} failed after {:?}:\n{out}\n--- status ---\n{}\n--- conflicts ---\n{}\n\
         --- daemon log ---\n{}",
        m.mnt.display(),
        started.elapsed(),
        m.status(),
        larder(&["conflicts", s(&m.mnt), "--json"]).stdout,
        m.log()
    );
}

/// Whether `name` has the form `BASE.conflict-HOST-YYYYMMDDTHHMMSSZ` with a non-empty HOST.
pub fn is_conflict_name(name: &str, base: &str) -> bool {
    let Some(rest) = name.strip_prefix(&format!("{base}.conflict-")) else {
        return false;
    };
    let Some((host, stamp)) = rest.rsplit_once('-') else {
        return false;
    };
    let b = stamp.as_bytes();
    !host.is_empty()
        && b.len() == 16
        && b[8] == b'T'
        && b[15] == b'Z'
        && b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit)
}

/// The command failed with one `larder: ` line on stderr naming every `needle`.
#[track_caller]
pub fn assert_cli_error(out: &Output, needles: &[&str]) {
    assert!(!out.success(), "expected a failure, got success:\n{out}");
    let err = out.stderr.trim_end();
    assert!(
        err.starts_with("larder: "),
        "stderr does not start with 'larder: ':\n{out}"
    );
    assert_eq!(err.lines().count(), 1, "the error is not one line:\n{out}");
    for n in needles {
        assert!(err.contains(n), "the error does not mention '{n}':\n{out}");
    }
}

impl TestDir {
    /// A write-back mount whose home is away while the file `fault` exists (the hidden `--fault-file`),
    /// pushing after 1 s, with `extra` options.
    pub fn mount_with_fault(&self, fault: &Path, extra: &[&str]) -> Mount {
        let mut args = vec![
            "--write-mode",
            "write-back",
            "--fault-file",
            s(fault),
            "--sync-lag",
            "1s",
        ];
        args.extend_from_slice(extra);
        self.mount(&args)
    }
}

/// Whether this kernel has FUSE passthrough (6.9 or later).
pub fn kernel_has_passthrough() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 9)
}

/// Calls of kind `kind` (stat, list, read, ...) `m` made of its home so far.
#[allow(dead_code)]
pub fn home_ops(m: &Mount, kind: &str) -> u64 {
    num(&m.status(), &format!("/home/ops_by_kind/{kind}"))
}

/// `ls -l` of `dir` on `m`, a directory of `n` files one byte long: every entry seen, for one listing of
/// home and no stat (the listing carried every attribute).
#[allow(dead_code)]
pub fn assert_ls_l_is_one_listing(m: &Mount, dir: &str, n: usize) {
    assert!(std::fs::metadata(m.path(dir)).unwrap().is_dir());
    let (stats, lists) = (home_ops(m, "stat"), home_ops(m, "list"));
    let seen: Vec<u64> = std::fs::read_dir(m.path(dir))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .collect();
    assert_eq!(seen.len(), n);
    assert!(seen.iter().all(|&len| len == 1), "every file one byte long");
    assert_eq!(home_ops(m, "list") - lists, 1, "one listing of the directory");
    assert_eq!(
        home_ops(m, "stat") - stats,
        0,
        "no stat: the listing carried every attribute"
    );
}

/// After `wait` (past the validity lag), a stat of `m`'s root revalidates it by its own listing, which
/// carries its attributes, not by a stat.
#[allow(dead_code)]
pub fn assert_root_revalidated_by_listing(m: &Mount, wait: Duration) {
    std::thread::sleep(wait);
    let (stats, lists) = (home_ops(m, "stat"), home_ops(m, "list"));
    assert!(std::fs::metadata(&m.mnt).unwrap().is_dir());
    let (stats, lists) = (home_ops(m, "stat") - stats, home_ops(m, "list") - lists);
    assert!(
        stats == 0 && lists >= 1,
        "the root revalidated by its own listing, not a stat: {stats} stats, {lists} listings"
    );
}

/// A loopback address with a port free now, for a daemon's `--metrics-addr`.
#[allow(dead_code)]
pub fn free_local_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// The Prometheus text a daemon serves at `addr` (`/metrics`), with the HTTP status line first.
#[allow(dead_code)]
pub fn metrics_text(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).unwrap();
    resp
}

/// The value of the metric line `name` (name and labels, as printed) in Prometheus text.
#[allow(dead_code)]
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l[name.len()..].trim().parse().ok())
}
