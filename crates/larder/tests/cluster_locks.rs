//! File locks across a cluster (design note 017): `flock` and POSIX locks taken on one node exclude
//! processes on the others; what a holder wrote before it let go is what the next holder reads; a waiter
//! can be interrupted; a dead node's locks go with its lease. Each node is a daemon in a network
//! namespace of its own, with a real etcd on the bridge (`site`); home is a directory 10 ms away in
//! neither, pushed to an hour after a change.

mod common;
mod moto;
mod netns;
mod site;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, TestDir, drain_ok, read, require_fuse};
use site::{Site, certs};

const LATE: [&str; 6] = [
    "--write-mode",
    "write-back",
    "--sync-lag",
    "1h",
    "--emulate-wan",
    "latency=10ms,bandwidth=1GiB/s",
];

fn wait_live(nodes: &[&Mount], n: usize) {
    for m in nodes {
        assert!(
            common::wait_until(Duration::from_secs(20), || {
                m.status()["cluster"]["members"]
                    .as_array()
                    .is_some_and(|ms| ms.iter().filter(|x| x["live"] == true).count() >= n)
            }),
            "{} never saw {n} live members",
            m.mnt.display()
        );
    }
}

/// Nodes A and B of one cluster (`LATE`), each in a namespace of its own, over the directory home
/// `t/home` holding `files`; both see each other live.
fn two_nodes(label: &str, files: &[(&str, &[u8])]) -> (TestDir, std::path::PathBuf, Site, Mount, Mount) {
    let t = TestDir::new(label);
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    for (name, content) in files {
        std::fs::write(home.join(name), content).unwrap();
    }
    let site = Site::new(label, &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &LATE);
    wait_live(&[&a, &b], 2);
    (t, home, site, a, b)
}

/// `program args` with `env`, in the background, its output kept.
fn spawn(program: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Ctrl-C as a user's shell gives it, however the tests were started: a job a script put in the
    // background inherits SIGINT ignored, and a waiter that ignores it is rightly never interrupted.
    // SAFETY: signal(2) is async-signal-safe and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// `sh -c script` with `$1` set to `arg`, in the background.
fn sh(script: &str, arg: &std::path::Path) -> std::process::Child {
    spawn("sh", &["-c", script, "sh", common::s(arg)], &[])
}

fn finish(child: std::process::Child, what: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed ({}): {text}", out.status);
    text
}

/// [`finish`], failing if `child` is still running after `limit` (a hang: it is killed, not waited for).
fn finish_within(mut child: std::process::Child, what: &str, limit: Duration) -> String {
    if !common::wait_until(limit, || child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        panic!("{what} still running after {limit:?}");
    }
    finish(child, what)
}

fn conflicts(m: &Mount) -> String {
    common::larder(&["conflicts", common::s(&m.mnt), "--json"]).stdout
}

/// Increments of a counter file, each under an exclusive `flock` of it (flock(1), as scripts take it).
const FLOCK_COUNTER: &str = r#"
    for i in $(seq 1 40); do
        flock -x "$1" sh -c 'n=$(cat "$1"); echo $((n + 1)) > "$1"' sh "$1" || exit 1
    done
"#;

/// The same under `fcntl` locks (Python's `lockf`), the file opened before it is locked, as most
/// programs do: the lock must show the file as the last holder left it, through that open file.
const LOCKF_COUNTER: &str = r#"
import fcntl, os, sys
p = sys.argv[1]
for _ in range(40):
    with open(p, "r+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        n = int(f.read().strip() or 0)
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
        f.flush()
        fcntl.lockf(f, fcntl.LOCK_UN)
"#;

#[test]
fn counters_under_flock_and_lockf_on_two_nodes_lose_no_increment() {
    require_fuse();
    let (_t, home, _site, a, b) = two_nodes("cl-counter", &[("flocked", b"0"), ("lockfed", b"0")]);

    let runs = [a.path("flocked"), b.path("flocked")].map(|p| sh(FLOCK_COUNTER, &p));
    for r in runs {
        finish_within(r, "a flock counter", Duration::from_secs(180));
    }
    let runs =
        [a.path("lockfed"), b.path("lockfed")].map(|p| spawn("python3", &["-c", LOCKF_COUNTER, common::s(&p)], &[]));
    for r in runs {
        finish_within(r, "a lockf counter", Duration::from_secs(180));
    }
    for (m, n) in [(&a, "a"), (&b, "b")] {
        for f in ["flocked", "lockfed"] {
            assert_eq!(
                std::fs::read_to_string(m.path(f)).unwrap().trim(),
                "80",
                "{f} as node {n} shows it: increments were lost"
            );
        }
    }
    drain_ok(&a, 60);
    drain_ok(&b, 60);
    for f in ["flocked", "lockfed"] {
        assert_eq!(
            std::fs::read_to_string(home.join(f)).unwrap().trim(),
            "80",
            "{f} at home"
        );
    }
    for m in [&a, &b] {
        let c = conflicts(m);
        assert!(
            !c.contains("flocked") && !c.contains("lockfed"),
            "conflict copies were made: {c}"
        );
    }
    // A lock file removed while locked, as lock-file tools do: its close still releases the lock, and
    // the name is free on the other node.
    finish(
        sh("exec flock -x \"$1\" rm \"$1\"", &a.path("lockfile")),
        "flock, then rm",
    );
    finish(
        sh("exec flock -n -x \"$1\" true", &b.path("lockfile")),
        "b's flock of the name again",
    );
    b.unmount();
    a.unmount();
}

#[test]
fn a_waiter_for_a_lock_held_on_another_node_can_be_interrupted_and_gets_it_when_its_holder_dies() {
    require_fuse();
    let (_t, _home, _site, a, b) = two_nodes("cl-wait", &[("f", b"x")]);

    // A holds an exclusive lock, by a process that keeps it.
    let holder = sh("exec flock -x \"$1\" sleep 60", &a.path("f"));
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            Command::new("flock")
                .args(["-n", "-x", common::s(&b.path("f")), "true"])
                .status()
                .is_ok_and(|s| !s.success())
        }),
        "b's non-blocking flock never saw a's lock"
    );
    // A shared lock is refused too, and fcntl's F_GETLK on B names the lock.
    let probe = Command::new("python3")
        .args([
            "-c",
            "import fcntl,struct,sys\nf=open(sys.argv[1],'r')\nr=fcntl.fcntl(f,fcntl.F_GETLK,struct.pack('hhqqi',fcntl.F_RDLCK,0,0,0,0))\nprint(struct.unpack('hhqqi',r)[0]==fcntl.F_WRLCK)",
            common::s(&b.path("f")),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout).trim(),
        "True",
        "F_GETLK on b: {probe:?}"
    );

    // A waiter on B is interrupted by Ctrl-C (SIGINT) and gives up at once.
    let waiter = sh("exec flock -x \"$1\" true", &b.path("f"));
    std::thread::sleep(Duration::from_millis(500));
    let pid = waiter.id() as i32;
    unsafe { libc::kill(pid, libc::SIGINT) };
    let began = Instant::now();
    let out = waiter.wait_with_output().unwrap();
    assert!(!out.status.success(), "the waiter got a lock a's process holds");
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "the interrupted waiter took {:?} to give up",
        began.elapsed()
    );

    // A dies holding it (its daemon killed): its lock goes with its lease, and B's waiter gets it.
    let waiter = sh("exec flock -w 60 -x \"$1\" true", &b.path("f"));
    std::thread::sleep(Duration::from_millis(300));
    common::signal(a.pid, libc::SIGKILL);
    assert!(common::wait_until(Duration::from_secs(10), || !common::alive(a.pid)));
    a.force_cleanup();
    a.disarm();
    let began = Instant::now();
    finish(waiter, "b's flock after a died");
    assert!(began.elapsed() < Duration::from_secs(40), "took {:?}", began.elapsed());
    let _ = holder.wait_with_output();
    b.unmount();
}

/// Every line of `text`, checked: no NUL, and each node's lines in the order it wrote them.
fn lines_in_order(text: &str, prefix: char, n: usize) -> usize {
    let mine: Vec<usize> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("a mangled line in {text:?}")))
        .collect();
    assert!(
        mine.windows(2).all(|w| w[0] < w[1]),
        "{prefix}'s lines are out of order: {mine:?}"
    );
    assert!(mine.len() <= n);
    mine.len()
}

#[test]
fn writers_on_two_nodes_at_once_get_no_error_and_lose_nothing_they_were_told_was_written() {
    require_fuse();
    let (_t, home, _site, a, b) = two_nodes("cl-race", &[("over", b"start\n"), ("log", b"")]);

    // Overwrites: each `echo > f` must succeed, and the file end as the last one to get the token left it.
    let over = "for i in $(seq 1 30); do echo \"$X$i\" > \"$1\" || exit 1; done";
    let runs =
        [(&a, "a"), (&b, "b")].map(|(m, x)| spawn("sh", &["-c", over, "sh", common::s(&m.path("over"))], &[("X", x)]));
    for r in runs {
        finish(r, "overwrites");
    }
    let last = std::fs::read_to_string(a.path("over")).unwrap();
    assert!(
        last == "a30\n" || last == "b30\n",
        "the file ended as {last:?}, not a last write"
    );
    assert_eq!(
        std::fs::read_to_string(b.path("over")).unwrap(),
        last,
        "b shows another file"
    );

    // Appends: every line each node was told it wrote is there, in its order.
    let append = "for i in $(seq 1 30); do echo \"$X$i\" >> \"$1\" || exit 1; done";
    let runs =
        [(&a, "a"), (&b, "b")].map(|(m, x)| spawn("sh", &["-c", append, "sh", common::s(&m.path("log"))], &[("X", x)]));
    for r in runs {
        finish(r, "appends");
    }
    for m in [&a, &b] {
        let text = std::fs::read_to_string(m.path("log")).unwrap();
        assert!(!text.contains('\0'), "a NUL byte in {text:?}");
        assert_eq!(lines_in_order(&text, 'a', 30), 30, "a's appends lost: {text:?}");
        assert_eq!(lines_in_order(&text, 'b', 30), 30, "b's appends lost: {text:?}");
    }
    drain_ok(&a, 60);
    drain_ok(&b, 60);
    assert_eq!(std::fs::read_to_string(home.join("over")).unwrap(), last, "home");
    assert_eq!(
        std::fs::read_to_string(home.join("log")).unwrap().lines().count(),
        60,
        "home's log"
    );
    for m in [&a, &b] {
        let c = conflicts(m);
        assert!(
            !c.contains("over") && !c.contains("log"),
            "conflict copies were made: {c}"
        );
    }
    b.unmount();
    a.unmount();
}

#[test]
fn with_home_away_appenders_on_two_nodes_at_once_lose_nothing_and_home_gets_it_all_later() {
    require_fuse();
    let t = TestDir::new("cl-away");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("log"), b"").unwrap();
    let away = t.root().join("home-away");
    let opts = [LATE.as_slice(), &["--fault-file", common::s(&away)]].concat();
    let site = Site::new("cl-away", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &opts);
    let b = site.node(&t, &tls, "b", &opts);
    wait_live(&[&a, &b], 2);
    assert_eq!(read(&a.path("log")), b"");
    assert_eq!(read(&b.path("log")), b"");
    std::fs::write(&away, b"").unwrap();

    // Each append takes the token from the other node, which cannot push: every handover is a copy of
    // the file peer to peer, and none may fail or lose a line.
    let append = "for i in $(seq 1 20); do echo \"$X$i\" >> \"$1\" || exit 1; done";
    let runs =
        [(&a, "a"), (&b, "b")].map(|(m, x)| spawn("sh", &["-c", append, "sh", common::s(&m.path("log"))], &[("X", x)]));
    for r in runs {
        finish_within(r, "appends with home away", Duration::from_secs(120));
    }
    let text = std::fs::read_to_string(a.path("log")).unwrap();
    for m in [&a, &b] {
        let here = std::fs::read_to_string(m.path("log")).unwrap();
        assert_eq!(here, text, "{} shows another file", m.mnt.display());
        assert!(!here.contains('\0'), "a NUL byte in {here:?}");
        assert_eq!(lines_in_order(&here, 'a', 20), 20, "a's appends lost: {here:?}");
        assert_eq!(lines_in_order(&here, 'b', 20), 20, "b's appends lost: {here:?}");
    }
    assert_eq!(std::fs::read(home.join("log")).unwrap(), b"", "home has nothing yet");

    std::fs::remove_file(&away).unwrap();
    drain_ok(&a, 90);
    drain_ok(&b, 90);
    assert_eq!(std::fs::read_to_string(home.join("log")).unwrap(), text, "home");
    assert_eq!(common::names(&home), vec!["log"], "no conflict copy at home");
    for m in [&a, &b] {
        let c = conflicts(m);
        assert!(!c.contains("log"), "conflict copies were made: {c}");
    }
    b.unmount();
    a.unmount();
}

/// Inserts into one SQLite database (rollback journal, SQLite's default) by `procs` processes, each
/// committing `rows` rows one at a time, waiting up to 60 s for the database's locks.
const SQLITE_WRITERS: &str = r#"
import sqlite3, sys, multiprocessing as mp
db, node, procs, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def work(k):
    c = sqlite3.connect(db, timeout=60)
    for i in range(rows):
        c.execute("insert into t values (?, ?)", (node, k * 1000 + i))
        c.commit()
    c.close()
ps = [mp.Process(target=work, args=(k,)) for k in range(procs)]
[p.start() for p in ps]
[p.join() for p in ps]
bad = [p.exitcode for p in ps if p.exitcode != 0]
sys.exit(f"{len(bad)} writers failed: {bad}" if bad else 0)
"#;

fn sqlite(db: &std::path::Path, sql: &str) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1],timeout=60)\nprint(c.execute(sys.argv[2]).fetchone()[0])",
            common::s(db),
            sql,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn sqlite_in_rollback_mode_from_three_nodes_at_once_keeps_every_row() {
    require_fuse();
    let t = TestDir::new("cl-sqlite");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let made = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nc.execute('create table t(node, n)')\nc.commit()",
            common::s(&home.join("db")),
        ])
        .status()
        .unwrap();
    assert!(made.success());
    let site = Site::new("cl-sqlite", &["a", "b", "c"]);
    let tls = certs(&t.root().join("tls"), &["a", "b", "c"]);
    let nodes: Vec<Mount> = ["a", "b", "c"].iter().map(|n| site.node(&t, &tls, n, &LATE)).collect();
    wait_live(&nodes.iter().collect::<Vec<_>>(), 3);

    let (procs, rows) = (2, 10);
    let runs: Vec<_> = nodes
        .iter()
        .zip(["a", "b", "c"])
        .map(|(m, n)| {
            Command::new("python3")
                .args([
                    "-c",
                    SQLITE_WRITERS,
                    common::s(&m.path("db")),
                    n,
                    &procs.to_string(),
                    &rows.to_string(),
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in runs {
        finish(r, "sqlite writers");
    }
    let want = (3 * procs * rows).to_string();
    for m in &nodes {
        assert_eq!(
            sqlite(&m.path("db"), "pragma integrity_check"),
            "ok",
            "{}",
            m.mnt.display()
        );
        assert_eq!(
            sqlite(&m.path("db"), "select count(*) from t"),
            want,
            "{}",
            m.mnt.display()
        );
    }
    for m in &nodes {
        drain_ok(m, 60);
    }
    assert_eq!(sqlite(&home.join("db"), "pragma integrity_check"), "ok", "home");
    assert_eq!(sqlite(&home.join("db"), "select count(*) from t"), want, "home");
    for m in &nodes {
        let c = conflicts(m);
        assert!(!c.contains("\"db"), "conflict copies were made: {c}");
    }
    for m in nodes {
        m.unmount();
    }
}

/// WAL mode from two nodes is not supported (its `-shm` index must be memory every process shares), but
/// no process may die of it or hang: each either commits or gets an error. Ten writers a node: with
/// fewer, neither a page mapped past a size another node changed (SIGBUS) nor a write waiting on the
/// kernel's writeback of its own mapped page (a hang) showed.
const SQLITE_WAL: &str = r#"
import sqlite3, sys, multiprocessing as mp, signal
db, node = sys.argv[1], sys.argv[2]
def work(k):
    try:
        c = sqlite3.connect(db, timeout=3)
        for i in range(10):
            c.execute("insert into t values (?, ?)", (node, k * 1000 + i))
            c.commit()
        c.close()
    except sqlite3.Error as e:
        print(f"an error, as may be: {e}")
ps = [mp.Process(target=work, args=(k,)) for k in range(10)]
[p.start() for p in ps]
[p.join() for p in ps]
killed = [signal.Signals(-p.exitcode).name for p in ps if p.exitcode < 0]
sys.exit(f"writers died of {killed}" if killed else 0)
"#;

#[test]
fn sqlite_in_wal_mode_from_two_nodes_kills_no_process() {
    require_fuse();
    let (_t, _home, _site, a, b) = two_nodes("cl-wal", &[]);
    let made = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nc.execute('pragma journal_mode=wal')\nc.execute('create table t(node, n)')\nc.commit()",
            common::s(&a.path("db")),
        ])
        .status()
        .unwrap();
    assert!(made.success());
    let runs =
        [(&a, "a"), (&b, "b")].map(|(m, n)| spawn("python3", &["-c", SQLITE_WAL, common::s(&m.path("db")), n], &[]));
    for r in runs {
        let out = finish_within(r, "sqlite in WAL mode", Duration::from_secs(240));
        eprintln!("{out}");
    }
    b.unmount();
    a.unmount();
}
