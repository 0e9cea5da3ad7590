//! A private network for one test: a bridge in the root namespace and one network namespace per node,
//! each joined to the bridge by a veth pair, so that every larder node of a cluster test is a process
//! with an address and ports of its own. The root namespace has an address on the bridge too: servers
//! the test starts there (etcd, moto) listen on it and every node reaches them.
//!
//! Each network takes one subnet `10.77.N.0/24`: the bridge is `10.77.N.1`, the nodes `10.77.N.2` on. N is
//! claimed by an exclusive `flock` on `/run/larder-test-net/10.77.N.lock`, held as long as the network
//! lives, so tests running side by side, in one process or in several, never share a subnet, and a lock
//! the kernel released (its process died) says that whatever still carries N's names is a leftover.
//! Everything of subnet N carries N in its name: the namespaces `larder-test-N-NODE`, the bridge
//! `ltN-br` and the veths' root ends `ltN-I` (the namespace end is `eth0`). Claiming N first removes such
//! leftovers of a crashed run; dropping the network removes them again, also when the test panics.
//!
//! Traffic of a test never leaves the machine: before anything else, the root namespace gets
//! `blackhole 10.77.N.0/24` at a low priority (a high metric). While the bridge is up, its connected route
//! for the same prefix (metric 0) wins and the subnet is reached on the bridge; the blackhole drops
//! whatever would go to that subnet otherwise, e.g. once the bridge is gone. The namespaces have no
//! route but their subnet's.
//!
//! Daemons run in a namespace through `nsenter --net=/run/netns/NAME` ([`Node::prefix`]): only the
//! network namespace changes, so the FUSE mount a daemon makes is seen by the test, and `larder status`
//! reaches the daemon over its unix socket as usual. (`ip netns exec` would also make a mount namespace
//! of its own and hide the mount.)

#![allow(dead_code)]

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::{Mount, Output, log_tail, run_cmd};

/// Where the locks that claim subnets live.
const LOCK_DIR: &str = "/run/larder-test-net";

/// The metric of the blackhole route: far below the bridge's connected route (metric 0) in preference.
const BLACKHOLE_METRIC: &str = "4077";

/// How long one `ip` command may take.
const IP_DEADLINE: Duration = Duration::from_secs(20);

/// Networks made by this process so far, to spread the first subnet each one tries.
static MADE: AtomicU32 = AtomicU32::new(0);

/// One node's namespace: its name and its address.
#[derive(Clone, Debug)]
pub struct Node {
    /// The node's name as the test gave it.
    pub name: String,
    /// The namespace's name (`ip netns`).
    pub netns: String,
    /// Its address on the bridge.
    pub ip: Ipv4Addr,
}

impl Node {
    /// The command that runs a program in this namespace: append the program and its arguments.
    pub fn prefix(&self) -> Vec<String> {
        vec!["nsenter".to_string(), format!("--net={}", self.path())]
    }

    /// The namespace's file.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.netns)
    }

    /// Whether process `pid` is in this namespace.
    pub fn holds(&self, pid: i32) -> bool {
        let ours = std::fs::metadata(self.path()).expect("the namespace's file");
        std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| (m.dev(), m.ino()) == (ours.dev(), ours.ino()))
    }
}

/// A test's private network. Dropping it removes the namespaces, veths, bridge and route.
pub struct TestNet {
    /// N of `10.77.N.0/24`.
    index: u8,
    nodes: Vec<Node>,
    /// The claim on the subnet: held until the network is removed.
    lock: File,
}

fn ip(args: &[&str]) -> Output {
    run_cmd("ip", args, IP_DEADLINE)
}

#[track_caller]
fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(out.success(), "ip {} failed:\n{out}", args.join(" "));
}

impl TestNet {
    /// A bridge with one namespace per name of `nodes` (short, lowercase letters and digits), each node's
    /// `lo` and `eth0` up. `label` (the test's name) is written in the subnet's lock for whoever finds
    /// the network left behind.
    pub fn new(label: &str, nodes: &[&str]) -> TestNet {
        assert!(nodes.len() <= 200, "too many nodes for one /24");
        for n in nodes {
            assert!(
                !n.is_empty() && n.len() <= 8 && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                "node name {n:?}: 1 to 8 lowercase letters or digits"
            );
            assert_eq!(
                nodes.iter().filter(|m| *m == n).count(),
                1,
                "node name {n:?} given twice"
            );
        }
        sweep_leftovers();
        let (index, lock) = claim_subnet(label);
        let mut net = TestNet {
            index,
            nodes: Vec::new(),
            lock,
        };
        // Whatever carries this subnet's names is left over from a run that died holding it.
        remove_all(index);
        // The blackhole first: from here on, nothing for the subnet can leave the machine.
        ip_ok(&["route", "add", "blackhole", &net.subnet(), "metric", BLACKHOLE_METRIC]);
        let bridge = net.bridge();
        ip_ok(&["link", "add", &bridge, "type", "bridge"]);
        ip_ok(&["addr", "add", &format!("{}/24", net.host_ip()), "dev", &bridge]);
        ip_ok(&["link", "set", &bridge, "up"]);
        for (i, name) in nodes.iter().enumerate() {
            let node = Node {
                name: name.to_string(),
                netns: format!("larder-test-{index}-{name}"),
                ip: Ipv4Addr::new(10, 77, index, i as u8 + 2),
            };
            net.nodes.push(node.clone());
            let veth = format!("lt{index}-{i}");
            let ns = node.netns.as_str();
            let addr = format!("{}/24", node.ip);
            ip_ok(&["netns", "add", ns]);
            ip_ok(&["-n", ns, "link", "set", "lo", "up"]);
            ip_ok(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ]);
            ip_ok(&["link", "set", &veth, "master", &bridge]);
            ip_ok(&["link", "set", &veth, "up"]);
            ip_ok(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]);
            ip_ok(&["-n", ns, "link", "set", "eth0", "up"]);
        }
        net
    }

    /// The root namespace's address on the bridge, where the test's own servers listen.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.index, 1)
    }

    /// `10.77.N.0/24`.
    pub fn subnet(&self) -> String {
        format!("10.77.{}.0/24", self.index)
    }

    /// The bridge's name.
    pub fn bridge(&self) -> String {
        format!("lt{}-br", self.index)
    }

    /// The node named `name`.
    /// Mount `home` (a directory or a URL) for node `name` at `ROOT/mnt-NAME` with cache dir
    /// `ROOT/cache-NAME`, the daemon in the node's namespace, with `args` and `env`.
    pub fn mount(&self, root: &Path, name: &str, home: &str, args: &[String], env: &[(&str, &str)]) -> Mount {
        let cache = root.join(format!("cache-{name}"));
        match self.try_mount(root, name, home, args, env) {
            Ok(m) => m,
            Err(out) => panic!(
                "larder mount {home} for node {name} failed:\n{out}\n--- daemon log ---\n{}",
                log_tail(&cache, 60)
            ),
        }
    }

    /// [`TestNet::mount`], or what `larder mount` said when it failed.
    pub fn try_mount(
        &self,
        root: &Path,
        name: &str,
        home: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Mount, crate::common::Output> {
        let mnt = root.join(format!("mnt-{name}"));
        let cache = root.join(format!("cache-{name}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let node = self.node(name);
        let prefix = node.prefix();
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let m = Mount::try_new_under(&prefix, home, &mnt, &cache, &args, env)?;
        assert!(
            node.holds(m.pid),
            "node {name}'s daemon (pid {}) is not in {}",
            m.pid,
            node.netns
        );
        Ok(m)
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("the test network has no node {name}"))
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Never panics: every step is best effort, and a missing piece is fine.
        remove_all(self.index);
        // SAFETY: flock on a descriptor this struct owns; closing the file would release it too.
        unsafe {
            libc::flock(self.lock.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

/// Take the first free subnet, starting from one that depends on the process and how many networks it
/// made, so that tests running side by side seldom try the same one first.
fn claim_subnet(label: &str) -> (u8, File) {
    std::fs::create_dir_all(LOCK_DIR).unwrap_or_else(|e| panic!("create {LOCK_DIR}: {e}"));
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let start = std::process::id().wrapping_mul(31).wrapping_add(made.wrapping_mul(17)) % 250;
    for k in 0..250u32 {
        let index = ((start + k) % 250 + 1) as u8;
        let path = format!("{LOCK_DIR}/10.77.{index}.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let _ = file.set_len(0);
            let _ = std::fs::write(&path, format!("pid {} test {label}\n", std::process::id()));
            return (index, file);
        }
    }
    panic!("no free subnet 10.77.N.0/24: all 250 locks in {LOCK_DIR} are held");
}

/// The names of the network namespaces.
fn namespaces() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    dir.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The names of the root namespace's links.
fn links() -> Vec<String> {
    // "7: lt12-0@if2: <...>": the name ends at '@' or ':'.
    ip(&["-o", "link", "show"])
        .stdout
        .lines()
        .filter_map(|l| l.split(": ").nth(1).and_then(|n| n.split('@').next()))
        .map(str::to_string)
        .collect()
}

/// The subnet index a namespace (`larder-test-N-NODE`), link (`ltN-...`) or blackhole route of a test
/// network names, if it is one.
fn index_in(name: &str) -> Option<u8> {
    let number_before = |rest: &str, sep: char| rest.split_once(sep).and_then(|(n, _)| n.parse::<u8>().ok());
    if let Some(rest) = name.strip_prefix("larder-test-") {
        number_before(rest, '-')
    } else if let Some(rest) = name.strip_prefix("lt") {
        number_before(rest, '-')
    } else {
        let rest = name.strip_prefix("blackhole 10.77.")?;
        let metric = format!(" metric {BLACKHOLE_METRIC}");
        rest.trim_end()
            .ends_with(&metric)
            .then(|| number_before(rest, '.'))
            .flatten()
    }
}

/// Remove what the networks of dead runs left behind: whatever carries a subnet's names while no live
/// process holds its lock.
fn sweep_leftovers() {
    let routes = ip(&["route", "show", "type", "blackhole"]).stdout;
    let mut found: Vec<u8> = namespaces()
        .iter()
        .chain(&links())
        .map(String::as_str)
        .chain(routes.lines())
        .filter_map(index_in)
        .collect();
    found.sort_unstable();
    found.dedup();
    for index in found {
        let path = format!("{LOCK_DIR}/10.77.{index}.lock");
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        // SAFETY: flock on a descriptor we own; closing it at the end of the iteration releases it.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            eprintln!("removing the test network 10.77.{index}.0/24 a dead run left behind");
            remove_all(index);
        }
    }
}

/// Remove the namespaces, links and blackhole route of subnet `index`, whichever exist.
fn remove_all(index: u8) {
    for name in namespaces() {
        if index_in(&name) == Some(index) {
            // Deleting a veth's end in the namespace deletes the pair, even if a process still holds
            // the namespace.
            let _ = ip(&["-n", &name, "link", "del", "eth0"]);
            let _ = ip(&["netns", "del", &name]);
        }
    }
    for name in links() {
        if index_in(&name) == Some(index) {
            let _ = ip(&["link", "del", &name]);
        }
    }
    let subnet = format!("10.77.{index}.0/24");
    // One at most: a second route of the same prefix, type and metric cannot be added.
    let _ = ip(&["route", "del", "blackhole", &subnet, "metric", BLACKHOLE_METRIC]);
}
