//! A cluster of larder mounts: separate daemons sharing one home, their membership in a real etcd, their
//! peer servers on loopback. Each node reads through its own FUSE mount, as users do.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Mount, Rng, TestDir, assert_same_bytes, num, read, require_fuse, s, write_random};
use larder_cluster::testing::{Etcd, free_port};

/// The data set: one large file (many blocks, owned all over the cluster) and small files (whole units).
fn make_data_set(home: &Path, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    std::fs::create_dir_all(home.join("set/small")).unwrap();
    let mut files = vec![(
        "set/big.bin".to_string(),
        write_random(&home.join("set/big.bin"), 24 << 20, rng),
    )];
    for i in 0..40 {
        let rel = format!("set/small/f{i:02}");
        let size = 1024 + rng.below(60 << 10) as usize;
        files.push((rel.clone(), write_random(&home.join(&rel), size, rng)));
    }
    files
}

fn node(t: &TestDir, etcd: &Etcd, name: &str, extra: &[&str]) -> Mount {
    let mnt = t.root().join(format!("mnt-{name}"));
    let cache = t.root().join(format!("cache-{name}"));
    std::fs::create_dir_all(&mnt).unwrap();
    let cluster = format!("etcd://127.0.0.1:{}", etcd.client);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        "--cluster",
        &cluster,
        "--cluster-name",
        "test",
        "--node-name",
        name,
        "--listen",
        &listen,
        "--block-size",
        "1MiB",
        "--no-passthrough",
        "--validity-lag",
        "1h",
    ];
    args.extend_from_slice(extra);
    Mount::new(&t.root().join("home"), &mnt, &cache, &args)
}

fn home_bytes(m: &Mount) -> u64 {
    num(&m.status(), "/home/bytes_read")
}

/// The status's count of hits of the tier named `name`.
fn tier_hits(m: &Mount, name: &str) -> u64 {
    let st = m.status();
    let tiers = st["tiers"]["walk"].as_array().cloned().unwrap_or_default();
    tiers
        .iter()
        .find(|t| t["name"] == name)
        .map_or(0, |t| t["hits"].as_u64().unwrap_or(0))
}

fn read_all(m: &Mount, files: &[(String, Vec<u8>)], what: &str) {
    for (rel, want) in files {
        assert_same_bytes(&read(&m.path(rel)), want, &format!("{rel} on {what}"));
    }
}

#[test]
fn three_nodes_read_one_data_set_and_home_sends_each_byte_about_once() {
    require_fuse();
    let etcd = Etcd::start();
    let t = TestDir::new("cluster-three");
    let mut rng = Rng::new(0x5eed_c105);
    let files = make_data_set(&t.root().join("home"), &mut rng);
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let nodes: Vec<Mount> = ["a", "b", "c"].iter().map(|n| node(&t, &etcd, n, &[])).collect();
    // The first nodes learn of the later ones through their watch.
    std::thread::sleep(Duration::from_millis(500));
    for (i, m) in nodes.iter().enumerate() {
        read_all(m, &files, &format!("node {i}"));
    }
    let from_home: u64 = nodes.iter().map(home_bytes).sum();
    let peer_hits: u64 = nodes.iter().map(|m| tier_hits(m, "peer")).sum();
    eprintln!("data set {total} bytes; home sent {from_home} over three nodes; peer hits {peer_hits}");
    assert!(
        from_home as f64 <= total as f64 * 1.05,
        "home sent {from_home} bytes for a data set of {total} read by three nodes"
    );
    assert!(peer_hits > 0, "no read was served by a peer");
    for m in nodes {
        m.unmount();
    }
}

#[test]
fn a_node_killed_while_serving_costs_its_peers_no_error() {
    require_fuse();
    let etcd = Etcd::start();
    let t = TestDir::new("cluster-kill");
    let mut rng = Rng::new(0xdead_beef);
    let files = make_data_set(&t.root().join("home"), &mut rng);
    let a = node(&t, &etcd, "a", &[]);
    let b = node(&t, &etcd, "b", &[]);
    std::thread::sleep(Duration::from_millis(500));
    read_all(&a, &files, "a");
    // B goes down hard: no leave, its lease still runs, so the others still think it is live.
    common::signal(b.pid, libc::SIGKILL);
    assert!(common::wait_until(Duration::from_secs(10), || !common::alive(b.pid)));
    b.force_cleanup();
    b.disarm();
    // A new node reads everything: what B owned comes from A (the next candidate) or home, never an error.
    let c = node(&t, &etcd, "c", &[]);
    let started = Instant::now();
    read_all(&c, &files, "c, with b dead");
    eprintln!("read with a dead peer in {:?}", started.elapsed());
    c.unmount();
    a.unmount();
}

#[test]
fn a_client_that_does_not_serve_still_reads_from_its_peers() {
    require_fuse();
    let etcd = Etcd::start();
    let t = TestDir::new("cluster-client");
    let mut rng = Rng::new(7);
    let files = make_data_set(&t.root().join("home"), &mut rng);
    let a = node(&t, &etcd, "a", &[]);
    read_all(&a, &files, "a");
    let home_before = home_bytes(&a);
    // A read-only client: no --listen, nothing served; every unit is A's to give.
    let mnt = t.root().join("mnt-client");
    std::fs::create_dir_all(&mnt).unwrap();
    let cluster = format!("etcd://127.0.0.1:{}", etcd.client);
    let client = Mount::new(
        &t.root().join("home"),
        &mnt,
        &t.root().join("cache-client"),
        &[
            "--cluster",
            &cluster,
            "--cluster-name",
            "test",
            "--peer-serve",
            "off",
            "--no-passthrough",
        ],
    );
    read_all(&client, &files, "the client");
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(home_bytes(&client), 0, "the client went to home for data a peer held");
    assert!(tier_hits(&client, "peer") > 0);
    assert_eq!(home_bytes(&a), home_before, "the owner fetched again what it held");
    eprintln!("client read {total} bytes, all from its peer");
    client.unmount();
    a.unmount();
}

#[test]
fn mounting_into_a_cluster_with_bad_settings_fails_at_the_call() {
    require_fuse();
    let t = TestDir::new("cluster-bad");
    std::fs::create_dir_all(t.root().join("home")).unwrap();
    let mnt = t.root().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let cache = t.root().join("cache");
    let dead = format!("etcd://127.0.0.1:{}", free_port());
    for (args, expect) in [
        (vec!["--cluster", "http://x:1"], "etcd://"),
        (vec!["--cluster", dead.as_str()], "--listen"),
        (
            vec!["--cluster", dead.as_str(), "--listen", "0.0.0.0:7000"],
            "unspecified",
        ),
        (
            vec!["--cluster", dead.as_str(), "--listen", "127.0.0.1:7000"],
            "cannot join cluster",
        ),
    ] {
        let out = Mount::try_new(&t.root().join("home"), &mnt, &cache, &args)
            .err()
            .unwrap_or_else(|| {
                panic!("mounted with {args:?}");
            });
        assert!(out.to_string().contains(expect), "{args:?}: {out}");
        assert!(!common::is_mounted(&mnt), "{}", s(&mnt));
    }
}
