//! A cluster of larder mounts: separate daemons sharing one home, their membership in a real etcd, their
//! peer servers on loopback, mutual TLS with certificates made by `larder cluster init` and `larder
//! cluster cert`. Each node reads through its own FUSE mount, as users do.

mod common;

use std::path::{Path, PathBuf};
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

/// A cluster's certificates in `dir`, made as an operator makes them: the CA, then each node's.
fn certs(dir: &Path, names: &[&str]) -> PathBuf {
    let out = common::larder(&["cluster", "init", s(dir)]);
    assert!(out.success(), "larder cluster init: {out}");
    for name in names {
        let out = common::larder(&["cluster", "cert", s(dir), name]);
        assert!(out.success(), "larder cluster cert {name}: {out}");
    }
    dir.to_path_buf()
}

/// The status's figures of the peer transport.
fn peers(m: &Mount, figure: &str) -> u64 {
    num(&m.status(), &format!("/peers/{figure}"))
}

fn node(t: &TestDir, etcd: &Etcd, tls: &Path, name: &str, extra: &[&str]) -> Mount {
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
        "--cluster-tls",
        s(tls),
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
    let tls = certs(&t.root().join("tls"), &["a", "b", "c"]);
    let nodes: Vec<Mount> = ["a", "b", "c"].iter().map(|n| node(&t, &etcd, &tls, n, &[])).collect();
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
    let tls = certs(&t.root().join("tls"), &["a", "b", "c"]);
    let a = node(&t, &etcd, &tls, "a", &[]);
    let b = node(&t, &etcd, &tls, "b", &[]);
    std::thread::sleep(Duration::from_millis(500));
    read_all(&a, &files, "a");
    // B goes down hard: no leave, its lease still runs, so the others still think it is live.
    common::signal(b.pid, libc::SIGKILL);
    assert!(common::wait_until(Duration::from_secs(10), || !common::alive(b.pid)));
    b.force_cleanup();
    b.disarm();
    // A new node reads everything: what B owned comes from A (the next candidate) or home, never an error.
    let c = node(&t, &etcd, &tls, "c", &[]);
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
    let tls = certs(&t.root().join("tls"), &["a", "client"]);
    let a = node(&t, &etcd, &tls, "a", &[]);
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
            "--node-name",
            "client",
            "--cluster-tls",
            s(&tls),
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
    let tls = certs(&t.root().join("tls"), &["n1"]);
    let tls = s(&tls);
    let listen = ["--listen", "127.0.0.1:7000"];
    for (args, expect) in [
        (vec!["--cluster", "http://x:1"], "etcd://"),
        (vec!["--cluster", dead.as_str()], "--listen"),
        (
            vec!["--cluster", dead.as_str(), "--listen", "0.0.0.0:7000"],
            "unspecified",
        ),
        ([&["--cluster", dead.as_str()], &listen[..]].concat(), "--cluster-tls"),
        (
            [
                &["--cluster", dead.as_str(), "--cluster-tls", tls, "--node-name", "n2"],
                &listen[..],
            ]
            .concat(),
            "n2.pem does not exist",
        ),
        (
            [
                &["--cluster", dead.as_str(), "--cluster-tls", tls, "--node-name", "n1"],
                &listen[..],
            ]
            .concat(),
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

#[test]
fn a_node_with_a_certificate_from_another_ca_joins_but_is_served_nothing() {
    require_fuse();
    let etcd = Etcd::start();
    let t = TestDir::new("cluster-foreign");
    let mut rng = Rng::new(0xf0e1);
    let files = make_data_set(&t.root().join("home"), &mut rng);
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let ours = certs(&t.root().join("tls"), &["a", "b"]);
    // Another CA's certificate, of a name no member of ours has.
    let theirs = certs(&t.root().join("tls-theirs"), &["x"]);
    let a = node(&t, &etcd, &ours, "a", &[]);
    let b = node(&t, &etcd, &ours, "b", &[]);
    std::thread::sleep(Duration::from_millis(500));
    read_all(&a, &files, "a");
    read_all(&b, &files, "b");
    let served = peers(&a, "served") + peers(&b, "served");
    assert_eq!(peers(&a, "refused") + peers(&b, "refused"), 0);
    // X joins etcd like any node, and asks A and B for what it reads.
    let x = node(&t, &etcd, &theirs, "x", &[]);
    std::thread::sleep(Duration::from_millis(500));
    read_all(&x, &files, "x, a node of another CA");
    assert_eq!(tier_hits(&x, "peer"), 0, "a node of another CA was served by a peer");
    assert_eq!(peers(&x, "hits"), 0);
    assert!(peers(&x, "failures") + peers(&x, "skipped") > 0, "x never asked a peer");
    assert!(
        home_bytes(&x) >= total,
        "x read {} of {total} bytes from home",
        home_bytes(&x)
    );
    assert_eq!(
        peers(&a, "served") + peers(&b, "served"),
        served,
        "a unit went to a node of another CA"
    );
    let refused = peers(&a, "refused") + peers(&b, "refused");
    eprintln!("x read {total} bytes from home; a and b refused it {refused} times");
    assert!(refused > 0, "a and b did not count x refused");
    // Logged once per peer, not once per connection.
    let logged: Vec<usize> = [&a, &b]
        .iter()
        .map(|m| m.log().matches("refused a peer").count())
        .collect();
    assert!(
        logged.iter().sum::<usize>() >= 1 && logged.iter().all(|&n| n <= 1),
        "{logged:?}\n{}",
        a.log()
    );
    x.unmount();
    b.unmount();
    a.unmount();
}

/// `larder cluster members MNT --json`, parsed.
fn members(m: &Mount) -> serde_json::Value {
    let out = common::larder(&["cluster", "members", s(&m.mnt), "--json"]);
    assert!(out.success(), "larder cluster members: {out}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn live_names(v: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["live"] == true)
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn members_and_their_liveness_show_in_the_status_and_cluster_members() {
    require_fuse();
    let etcd = Etcd::start();
    let t = TestDir::new("cluster-members");
    std::fs::create_dir_all(t.root().join("home")).unwrap();
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = node(&t, &etcd, &tls, "a", &[]);
    let b = node(&t, &etcd, &tls, "b", &[]);
    assert!(
        common::wait_until(Duration::from_secs(5), || live_names(&members(&a)) == ["a", "b"]),
        "a does not see both live: {}",
        members(&a)
    );
    let v = members(&a);
    assert_eq!(v["name"], "test");
    let me: Vec<&serde_json::Value> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["this_node"] == true)
        .collect();
    assert_eq!(me.len(), 1);
    assert_eq!(me[0]["name"], "a");
    assert_eq!(v["node"], me[0]["id"]);
    assert_eq!(me[0]["weight"].as_u64(), Some(10 << 30), "the weight is the cache size");
    assert_eq!(a.status()["cluster"]["etcd_online"], true);
    let human = common::larder(&["status", s(&a.mnt)]);
    assert!(
        human.stdout.contains("cluster") && human.stdout.contains("2 of 2 members live"),
        "{human}"
    );
    // B leaves: gone from A's view at once, its record kept.
    b.unmount();
    assert!(
        common::wait_until(Duration::from_secs(5), || live_names(&members(&a)) == ["a"]),
        "b is still live after it left: {}",
        members(&a)
    );
    assert_eq!(
        members(&a)["members"].as_array().unwrap().len(),
        2,
        "b's record, its identity, is kept"
    );
    // A mount not in a cluster says so.
    let plain_mnt = t.root().join("mnt-plain");
    std::fs::create_dir_all(&plain_mnt).unwrap();
    let plain = Mount::new(&t.root().join("home"), &plain_mnt, &t.root().join("cache-plain"), &[]);
    let out = common::larder(&["cluster", "members", s(&plain.mnt)]);
    assert!(!out.success() && out.to_string().contains("not in a cluster"), "{out}");
    plain.unmount();
    a.unmount();
}

/// `name`'s status figure of the units it holds and owns.
fn owned(m: &Mount) -> u64 {
    num(&m.status(), "/cluster/owned_units")
}

/// A node that only reads (`--peer-serve off`): it owns nothing, so each unit it reads comes from its
/// owner, which fetches it from home if it does not hold it.
fn client(t: &TestDir, etcd: &Etcd, tls: &Path, name: &str) -> Mount {
    node(t, etcd, tls, name, &["--peer-serve", "off"])
}

fn live_count(m: &Mount) -> usize {
    live_names(&members(m)).len()
}

#[test]
fn a_node_that_joins_takes_its_units_from_their_previous_owners_and_one_that_leaves_hands_them_over() {
    require_fuse();
    let etcd = Etcd::start();
    let t = TestDir::new("cluster-churn");
    let mut rng = Rng::new(0xc4a1);
    let files = make_data_set(&t.root().join("home"), &mut rng);
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let tls = certs(&t.root().join("tls"), &["a", "b", "c", "d", "x", "y", "z"]);
    let owners: Vec<Mount> = ["a", "b", "c"].iter().map(|n| node(&t, &etcd, &tls, n, &[])).collect();
    // A client reads the data set: each owner fetches its share from home, once, and keeps it.
    let x = client(&t, &etcd, &tls, "x");
    assert!(common::wait_until(Duration::from_secs(5), || live_count(&x) == 4));
    read_all(&x, &files, "client x");
    let from_home = |ms: &[&Mount]| ms.iter().map(|m| home_bytes(m)).sum::<u64>();
    let home_first = from_home(&owners.iter().collect::<Vec<_>>());
    assert!(
        home_first as f64 <= total as f64 * 1.05 && home_bytes(&x) == 0,
        "home sent {home_first} bytes to the owners and {} to the client for {total}",
        home_bytes(&x)
    );
    let units: u64 = owners.iter().map(owned).sum();
    assert!(units > 40, "the owners own {units} units");

    // D joins. A second client reads it all: the units D now owns come from their previous owners
    // (hints), not from home.
    let d = node(&t, &etcd, &tls, "d", &[]);
    let y = client(&t, &etcd, &tls, "y");
    assert!(common::wait_until(Duration::from_secs(5), || {
        [&owners[0], &owners[1], &owners[2], &y]
            .iter()
            .all(|m| live_count(m) == 6)
    }));
    read_all(&y, &files, "client y, after d joined");
    let all: Vec<&Mount> = owners.iter().chain([&d]).collect();
    let home_after_join = from_home(&all) + home_bytes(&y);
    let moved = owned(&d);
    eprintln!(
        "d joined: it owns {moved} of {units} units; home sent {} more bytes",
        home_after_join - home_first
    );
    assert!(
        home_after_join - home_first <= total / 50,
        "home sent {} bytes again after a join",
        home_after_join - home_first
    );
    let share = moved as f64 / units as f64;
    assert!(
        (0.1..=0.45).contains(&share),
        "a fourth node took {moved} of {units} units ({share:.2}), not about a quarter"
    );
    assert_eq!(
        all.iter().map(|m| owned(m)).sum::<u64>() - moved,
        owners.iter().map(owned).sum::<u64>(),
        "a unit has two owners"
    );

    // B leaves, handing its units to their new owners; a third client reads it all, again without home.
    let [a, b, c]: [Mount; 3] = owners.try_into().ok().unwrap();
    let (b_owned, b_home) = (owned(&b), home_bytes(&b));
    let out = common::larder(&["cluster", "leave", s(&b.mnt), "--timeout", "20s"]);
    assert!(out.success(), "larder cluster leave: {out}\n{}", b.log());
    assert!(
        b_owned > 0 && out.stdout.contains(&format!("handed {b_owned} of the {b_owned} units")),
        "b owned {b_owned} units: {out}"
    );
    assert!(common::wait_until(Duration::from_secs(10), || !common::alive(b.pid)));
    b.disarm();
    let z = client(&t, &etcd, &tls, "z");
    read_all(&z, &files, "client z, after b left");
    let home_after_leave = from_home(&[&a, &c, &d, &y, &z]) + b_home;
    eprintln!(
        "b left, handing over {b_owned} units; home sent {} more bytes",
        home_after_leave - home_after_join
    );
    assert!(
        home_after_leave - home_after_join <= total / 50,
        "home sent {} bytes again after a node left: its units were not handed over",
        home_after_leave - home_after_join
    );
    for m in [x, y, z, a, c, d] {
        m.unmount();
    }
}

#[test]
fn a_node_joins_an_etcd_that_requires_client_certificates_over_etcds() {
    require_fuse();
    let t = TestDir::new("cluster-etcd-tls");
    std::fs::create_dir_all(t.root().join("home")).unwrap();
    let tls = certs(&t.root().join("tls"), &["a"]);
    let out = common::larder(&["cluster", "cert", s(&tls), "etcd", "--also-name", "127.0.0.1"]);
    assert!(out.success(), "{out}");
    let etcd = Etcd::start_tls(&tls.join("ca.pem"), &tls.join("etcd.pem"), &tls.join("etcd.key"));
    let mnt = t.root().join("mnt-a");
    std::fs::create_dir_all(&mnt).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let args = |scheme: &str| {
        vec![
            "--cluster".to_string(),
            format!("{scheme}://127.0.0.1:{}", etcd.client),
            "--cluster-tls".into(),
            s(&tls).into(),
            "--node-name".into(),
            "a".into(),
            "--listen".into(),
            listen.clone(),
        ]
    };
    // Plain text to an etcd that speaks TLS: the mount fails, saying it could not join.
    let plain = args("etcd");
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    let out = Mount::try_new(&t.root().join("home"), &mnt, &t.root().join("cache-a"), &plain)
        .err()
        .expect("mounted against a TLS etcd in plain text");
    assert!(out.to_string().contains("cannot join cluster"), "{out}");
    let over_tls = args("etcds");
    let over_tls: Vec<&str> = over_tls.iter().map(String::as_str).collect();
    let a = Mount::new(&t.root().join("home"), &mnt, &t.root().join("cache-a"), &over_tls);
    assert_eq!(a.status()["cluster"]["etcd_online"], true);
    assert_eq!(live_names(&members(&a)), ["a"]);
    a.unmount();
}

#[test]
fn a_node_sends_the_units_it_owns_to_a_member_with_room_rather_than_evicting_them() {
    require_fuse();
    let etcd = Etcd::start();
    let t = TestDir::new("cluster-migrate");
    let mut rng = Rng::new(0x3167);
    std::fs::create_dir_all(t.root().join("home")).unwrap();
    let big = write_random(&t.root().join("home/big.bin"), 40 << 20, &mut rng);
    let files = vec![("big.bin".to_string(), big)];
    let tls = certs(&t.root().join("tls"), &["a", "b", "y"]);
    // A owns about a third of the units, and its cache holds little more than half the file.
    let a = node(&t, &etcd, &tls, "a", &["--cache-size", "24MiB", "--readahead", "1MiB"]);
    let b = node(&t, &etcd, &tls, "b", &["--cache-size", "48MiB"]);
    assert!(common::wait_until(Duration::from_secs(5), || live_count(&a) == 2));
    // Read at a pace the harvester keeps up with (it migrates as it evicts); past it, reads evict for
    // themselves, without migrating (counted as `evictions_by_fills`).
    {
        use std::io::Read;
        let mut f = std::fs::File::open(a.path("big.bin")).unwrap();
        let mut got = Vec::new();
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
            std::thread::sleep(Duration::from_millis(25));
        }
        assert_same_bytes(&got, &files[0].1, "big.bin on a, whose cache is too small for it");
    }
    let p = a.status()["peers"].clone();
    let by_fills = num(&a.status(), "/cache/evictions_by_fills");
    eprintln!("a: {p}; {by_fills} blocks evicted by reads");
    assert_eq!(by_fills, 0, "the harvester fell behind reads at 40 MiB/s");
    let migrated = p["migrated"].as_u64().unwrap();
    assert!(
        migrated > 0,
        "a evicted the units it owns rather than send them to b: {p}"
    );
    assert_eq!(peers(&b, "taken"), migrated);
    // A client reads the file: the units a sent away come back through a from b, not from home.
    let home_before = home_bytes(&a) + home_bytes(&b);
    let y = client(&t, &etcd, &tls, "y");
    assert!(common::wait_until(Duration::from_secs(5), || live_count(&y) == 3));
    read_all(&y, &files, "client y");
    let again = home_bytes(&a) + home_bytes(&b) + home_bytes(&y) - home_before;
    let lost = p["migrate_no_room"].as_u64().unwrap() + p["migrate_over_rate"].as_u64().unwrap();
    eprintln!("a migrated {migrated} units ({lost} evicted for want of room or rate); home sent {again} bytes again");
    assert!(
        again <= lost * (1 << 20),
        "home sent {again} bytes again for {lost} units evicted without migration"
    );
    for m in [y, b, a] {
        m.unmount();
    }
}
