//! A cluster of larder mounts: separate daemons sharing one home, their membership in a real etcd,
//! mutual TLS with certificates made by `larder cluster init` and `larder cluster cert`. Each node is a
//! process in a network namespace of its own on a private bridge (`netns`), its peer server on its
//! namespace's address; etcd, and moto for an S3 home, listen on the bridge's address in the root
//! namespace, and a directory home is shared through the file system. Each node reads through its own
//! FUSE mount, as users do.

mod common;
mod moto;
mod netns;
mod site;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    Mount, Rng, TestDir, assert_ls_l_is_one_listing, assert_root_revalidated_by_listing, assert_same_bytes, num, read,
    require_fuse, s, write_random,
};
use larder_cluster::testing::{Etcd, free_port};
use moto::S3Test;
use site::{NODE_OPTIONS, PEER_PORT, Site, certs};

/// The data set under `root`, `total` bytes: 40 small files (whole units) and one large file of the rest
/// (many blocks, owned all over the cluster).
fn make_data_set(root: &Path, total: usize, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    std::fs::create_dir_all(root.join("set/small")).unwrap();
    let mut files = Vec::new();
    for i in 0..40 {
        let rel = format!("set/small/f{i:02}");
        let size = 1024 + rng.below(60 << 10) as usize;
        files.push((rel.clone(), write_random(&root.join(&rel), size, rng)));
    }
    let big = total
        .checked_sub(size_of(&files) as usize)
        .expect("a data set larger than its small files");
    files.push((
        "set/big.bin".to_string(),
        write_random(&root.join("set/big.bin"), big, rng),
    ));
    files
}

fn size_of(files: &[(String, Vec<u8>)]) -> u64 {
    files.iter().map(|(_, d)| d.len() as u64).sum()
}

/// The status's figures of the peer transport.
fn peers(m: &Mount, figure: &str) -> u64 {
    num(&m.status(), &format!("/peers/{figure}"))
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

/// `larder cluster members MNT --json`, parsed.
/// Every member `m` knows of, gone ones too.
fn members(m: &Mount) -> serde_json::Value {
    let out = common::larder(&["cluster", "members", s(&m.mnt), "--json", "--all"]);
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

/// Wait (10 s at most) until each of `nodes` sees exactly `names` live: the first nodes learn of the
/// later ones through their watch.
fn wait_all_live(nodes: &[&Mount], names: &[&str]) {
    for m in nodes {
        assert!(
            common::wait_until(Duration::from_secs(10), || live_names(&members(m)) == names),
            "{} does not see {names:?} live: {}",
            m.mnt.display(),
            members(m)
        );
    }
}

/// Wait (`secs` at most) until each of `nodes` says etcd is online (`want`) or not.
fn wait_etcd_online(nodes: &[&Mount], want: bool, secs: u64) {
    for m in nodes {
        assert!(
            common::wait_until(Duration::from_secs(secs), || m.status()["cluster"]["etcd_online"]
                == want),
            "{} does not say etcd_online {want} within {secs} s: {}",
            m.mnt.display(),
            m.status()["cluster"]
        );
    }
}

/// Three nodes read `files` one after another; returns the bytes home sent over all of them, after
/// checking they are at most 1.05 × the data set and that peers served reads.
fn read_by_three(nodes: &[Mount], files: &[(String, Vec<u8>)], what: &str) -> u64 {
    let total = size_of(files);
    let started = Instant::now();
    for (i, m) in nodes.iter().enumerate() {
        let t = Instant::now();
        read_all(m, files, &format!("node {i}"));
        eprintln!("{what}: node {i} read the data set in {:?}", t.elapsed());
    }
    let from_home: u64 = nodes.iter().map(home_bytes).sum();
    let peer_hits: u64 = nodes.iter().map(|m| tier_hits(m, "peer")).sum();
    eprintln!(
        "{what}: data set {total} bytes ({} MiB), read by three nodes in {:?}; home sent {from_home} bytes \
         ({:.3} × the data set); peer hits {peer_hits}",
        total >> 20,
        started.elapsed(),
        from_home as f64 / total as f64
    );
    assert!(
        from_home as f64 <= total as f64 * 1.05,
        "{what}: home sent {from_home} bytes for a data set of {total} read by three nodes"
    );
    assert!(peer_hits > 0, "{what}: no read was served by a peer");
    from_home
}

/// The TTL of a node's liveness lease in etcd (larder's default).
const LEASE_TTL: Duration = Duration::from_secs(10);

/// The size of the data set of most tests.
const SMALL_SET: usize = 25 << 20;

/// The data set three nodes read over a directory home, as the cluster's requirement states it.
const FULL_SET: usize = 256 << 20;

/// The link to home of the three nodes over a directory home.
const WAN: [&str; 2] = ["--emulate-wan", "latency=10ms,bandwidth=100MiB/s"];

#[test]
fn three_nodes_read_one_data_set_and_home_sends_each_byte_about_once() {
    require_fuse();
    let site = Site::new("three", &["a", "b", "c"]);
    let t = TestDir::new("cluster-three");
    let mut rng = Rng::new(0x5eed_c105);
    let files = make_data_set(&t.root().join("home"), FULL_SET, &mut rng);
    let tls = certs(&t.root().join("tls"), &["a", "b", "c"]);
    let nodes: Vec<Mount> = ["a", "b", "c"].iter().map(|n| site.node(&t, &tls, n, &WAN)).collect();
    wait_all_live(&nodes.iter().collect::<Vec<_>>(), &["a", "b", "c"]);
    read_by_three(&nodes, &files, "a directory home behind --emulate-wan");
    for m in nodes {
        m.unmount();
    }
}

#[test]
fn three_nodes_read_one_data_set_over_an_s3_home_and_home_sends_each_byte_about_once() {
    require_fuse();
    let site = Site::new("three-s3", &["a", "b", "c"]);
    let st = S3Test::new_on("cluster-s3", "home", &site.net.host_ip().to_string());
    let staging = st.t.root().join("staging");
    let mut rng = Rng::new(0x53_c105);
    let files = make_data_set(&staging, 32 << 20, &mut rng);
    st.tool_ok(&["put-dir", &st.bucket, &st.prefix, s(&staging)]);
    let tls = certs(&st.t.root().join("tls"), &["a", "b", "c"]);
    let env = st.srv.env();
    let nodes: Vec<Mount> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            let mut args = site.cluster_options(n, &tls, true);
            args.extend(st.mount_args(&NODE_OPTIONS).iter().map(|a| a.to_string()));
            site.mount(&st.t, n, &st.url(), &args, &env)
        })
        .collect();
    wait_all_live(&nodes.iter().collect::<Vec<_>>(), &["a", "b", "c"]);
    let gets_before = st.srv.requests().get;
    read_by_three(&nodes, &files, "an S3 home");
    let gets = st.srv.requests().get - gets_before;
    eprintln!("an S3 home: moto served {gets} GETs for {} files", files.len());
    for m in nodes {
        m.unmount();
    }
}

#[test]
fn nodes_keep_serving_while_etcd_is_away_and_come_back_online_with_it() {
    require_fuse();
    let mut site = Site::new("etcd-away", &["a", "b", "c"]);
    let t = TestDir::new("cluster-etcd-away");
    let mut rng = Rng::new(0xe7cd);
    let files = make_data_set(&t.root().join("home"), SMALL_SET, &mut rng);
    let total = size_of(&files);
    let tls = certs(&t.root().join("tls"), &["a", "b", "c"]);
    let nodes: Vec<Mount> = ["a", "b", "c"].iter().map(|n| site.node(&t, &tls, n, &[])).collect();
    let all: Vec<&Mount> = nodes.iter().collect();
    wait_all_live(&all, &["a", "b", "c"]);
    // Each node reads a third of the files: every node's cache holds some units, of every owner.
    for (i, m) in nodes.iter().enumerate() {
        let part: Vec<(String, Vec<u8>)> = files.iter().skip(i).step_by(3).cloned().collect();
        read_all(m, &part, &format!("node {i}, its part"));
    }
    let hits_before: u64 = nodes.iter().map(|m| tier_hits(m, "peer")).sum();
    site.etcd.kill();
    let stopped = Instant::now();
    wait_etcd_online(&all, false, 30);
    eprintln!("every node saw etcd gone within {:?}", stopped.elapsed());
    // The last view stands: every member is still live to every node, and asked.
    for m in &nodes {
        assert_eq!(live_names(&members(m)), ["a", "b", "c"], "{}", m.mnt.display());
    }
    let started = Instant::now();
    for (i, m) in nodes.iter().enumerate() {
        read_all(m, &files, &format!("node {i}, with etcd away"));
    }
    let read_in = started.elapsed();
    let from_home: u64 = nodes.iter().map(home_bytes).sum();
    let peer_hits = nodes.iter().map(|m| tier_hits(m, "peer")).sum::<u64>() - hits_before;
    eprintln!(
        "with etcd away, three nodes read the data set of {total} bytes in {read_in:?}; home sent {from_home} \
         bytes in all; peer hits while away {peer_hits}"
    );
    assert!(peer_hits > 0, "no read was served by a peer while etcd was away");
    assert!(
        from_home as f64 <= total as f64 * 1.05,
        "home sent {from_home} bytes for a data set of {total}: the nodes stopped asking their peers"
    );
    for m in &nodes {
        assert_eq!(
            m.status()["cluster"]["etcd_online"],
            false,
            "etcd is still away: {}",
            m.mnt.display()
        );
    }
    // etcd returns on its data and ports: every node registers again and watches again.
    site.etcd.run();
    let restarted = Instant::now();
    wait_etcd_online(&all, true, 30);
    eprintln!(
        "every node was back online within {:?} of etcd's return",
        restarted.elapsed()
    );
    for m in &nodes {
        assert!(
            common::wait_until(Duration::from_secs(15), || m.status()["cluster"]["lease_ok"] == true),
            "{} did not renew its lease after etcd returned: {}",
            m.mnt.display(),
            m.status()["cluster"]
        );
    }
    wait_all_live(&all, &["a", "b", "c"]);
    // The leases taken before the outage run out (etcd gave them a full TTL again when it came back):
    // each node's liveness is under the lease it took on its return, and stays.
    std::thread::sleep(LEASE_TTL + Duration::from_secs(2));
    for m in &nodes {
        assert_eq!(live_names(&members(m)), ["a", "b", "c"], "{}", m.mnt.display());
    }
    for m in nodes {
        m.unmount();
    }
}

#[test]
fn a_node_killed_while_serving_costs_its_peers_no_error() {
    require_fuse();
    let site = Site::new("kill", &["a", "b", "c"]);
    let t = TestDir::new("cluster-kill");
    let mut rng = Rng::new(0xdead_beef);
    let files = make_data_set(&t.root().join("home"), SMALL_SET, &mut rng);
    let tls = certs(&t.root().join("tls"), &["a", "b", "c"]);
    let a = site.node(&t, &tls, "a", &[]);
    let b = site.node(&t, &tls, "b", &[]);
    wait_all_live(&[&a, &b], &["a", "b"]);
    read_all(&a, &files, "a");
    // B goes down hard: no leave, its lease still runs, so the others still think it is live.
    common::signal(b.pid, libc::SIGKILL);
    assert!(common::wait_until(Duration::from_secs(10), || !common::alive(b.pid)));
    b.force_cleanup();
    b.disarm();
    // A new node reads everything: what B owned comes from A (the next candidate) or home, never an error.
    let c = site.node(&t, &tls, "c", &[]);
    let started = Instant::now();
    read_all(&c, &files, "c, with b dead");
    eprintln!("read with a dead peer in {:?}", started.elapsed());
    c.unmount();
    a.unmount();
}

#[test]
fn a_client_that_does_not_serve_still_reads_from_its_peers() {
    require_fuse();
    let site = Site::new("client", &["a", "client"]);
    let t = TestDir::new("cluster-client");
    let mut rng = Rng::new(7);
    let files = make_data_set(&t.root().join("home"), SMALL_SET, &mut rng);
    let tls = certs(&t.root().join("tls"), &["a", "client"]);
    let a = site.node(&t, &tls, "a", &[]);
    read_all(&a, &files, "a");
    let home_before = home_bytes(&a);
    // A read-only client: no --listen, nothing served; every unit is A's to give.
    let mut args = site.cluster_options("client", &tls, false);
    args.push("--no-passthrough".into());
    let client = site.mount(&t, "client", s(&t.root().join("home")), &args, &[]);
    read_all(&client, &files, "the client");
    let total = size_of(&files);
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
fn a_node_with_a_certificate_from_another_ca_is_refused_at_mount_and_never_a_member() {
    require_fuse();
    let site = Site::new("foreign", &["a", "b", "x"]);
    let t = TestDir::new("cluster-foreign");
    let mut rng = Rng::new(0xf0e1);
    let files = make_data_set(&t.root().join("home"), SMALL_SET, &mut rng);
    let ours = certs(&t.root().join("tls"), &["a", "b"]);
    // Another CA's certificate, of a name no member of ours has.
    let theirs = certs(&t.root().join("tls-theirs"), &["x"]);
    let a = site.node(&t, &ours, "a", &[]);
    let b = site.node(&t, &ours, "b", &[]);
    wait_all_live(&[&a, &b], &["a", "b"]);
    // X uses the same etcd and cluster name: refused, in one line that says why, and nothing mounted.
    let out = match site.try_node(&t, &theirs, "x", &[]) {
        Ok(x) => {
            let listed = members(&a);
            x.unmount();
            panic!("a node of another CA mounted; a lists {listed}");
        }
        Err(out) => out.to_string(),
    };
    assert!(out.contains("another CA than the cluster's"), "{out}");
    assert!(!common::is_mounted(&t.root().join("mnt-x")));
    // It never was a member: a and b list only each other, and go on serving each other.
    std::thread::sleep(Duration::from_secs(1));
    for m in [&a, &b] {
        let v = members(m);
        assert_eq!(live_names(&v), vec!["a".to_string(), "b".to_string()], "{v}");
        assert!(!v.to_string().contains("\"x\""), "x is listed: {v}");
    }
    read_all(&a, &files, "a");
    read_all(&b, &files, "b");
    assert!(
        peers(&b, "hits") + peers(&a, "hits") > 0,
        "a and b no longer serve each other"
    );
    assert_eq!(peers(&a, "refused") + peers(&b, "refused"), 0);
    b.unmount();
    a.unmount();
}

#[test]
fn members_and_their_liveness_show_in_the_status_and_cluster_members() {
    require_fuse();
    let site = Site::new("members", &["a", "b"]);
    let t = TestDir::new("cluster-members");
    std::fs::create_dir_all(t.root().join("home")).unwrap();
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &["--forget-gone-after", "4s"]);
    let b = site.node(&t, &tls, "b", &[]);
    wait_all_live(&[&a], &["a", "b"]);
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
    // Each member is reached at its own namespace's address.
    for m in v["members"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        assert_eq!(
            m["addr"].as_str(),
            Some(format!("{}:{PEER_PORT}", site.net.node(name).ip).as_str()),
            "{m}"
        );
    }
    assert_eq!(a.status()["cluster"]["etcd_online"], true);
    let human = common::larder(&["status", s(&a.mnt)]);
    assert!(
        human.stdout.contains("cluster") && human.stdout.contains("2 of 2 members live"),
        "{human}"
    );
    // The mount point may be given relative to the working directory, as to every other command.
    let relative = common::run_cmd(
        "sh",
        &[
            "-c",
            "cd \"$1\" && exec \"$2\" cluster members mnt-a",
            "sh",
            s(t.root()),
            common::LARDER,
        ],
        Duration::from_secs(30),
    );
    assert!(
        relative.success() && relative.stdout.contains("(this node)"),
        "{relative}"
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
    // Listed only when asked for all; removed from etcd once gone longer than --forget-gone-after.
    let out = common::larder(&["cluster", "members", s(&a.mnt)]);
    assert!(out.success() && !out.stdout.contains(" b "), "{out}");
    assert!(
        common::wait_until(Duration::from_secs(20), || members(&a)["members"]
            .as_array()
            .is_some_and(|ms| ms.len() == 1)),
        "b's record was never removed: {}",
        members(&a)
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
fn client(site: &Site, t: &TestDir, tls: &Path, name: &str) -> Mount {
    site.node(t, tls, name, &["--peer-serve", "off"])
}

fn live_count(m: &Mount) -> usize {
    live_names(&members(m)).len()
}

#[test]
fn a_node_that_joins_takes_its_units_from_their_previous_owners_and_one_that_leaves_hands_them_over() {
    require_fuse();
    let names = ["a", "b", "c", "d", "x", "y", "z"];
    let site = Site::new("churn", &names);
    let t = TestDir::new("cluster-churn");
    let mut rng = Rng::new(0xc4a1);
    let files = make_data_set(&t.root().join("home"), SMALL_SET, &mut rng);
    let total = size_of(&files);
    let tls = certs(&t.root().join("tls"), &names);
    let owners: Vec<Mount> = ["a", "b", "c"].iter().map(|n| site.node(&t, &tls, n, &[])).collect();
    // A client reads the data set: each owner fetches its share from home, once, and keeps it.
    let x = client(&site, &t, &tls, "x");
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
    let d = site.node(&t, &tls, "d", &[]);
    let y = client(&site, &t, &tls, "y");
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
    let z = client(&site, &t, &tls, "z");
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
    // etcd's own certificate, from the cluster's CA, naming the address the nodes dial.
    let site = Site::with_etcd("etcd-tls", &["a"], |ip| {
        let out = common::larder(&["cluster", "cert", s(&tls), "etcd", "--also-name", &ip.to_string()]);
        assert!(out.success(), "{out}");
        Etcd::start_tls(ip, &tls.join("ca.pem"), &tls.join("etcd.pem"), &tls.join("etcd.key"))
    });
    // Plain text to an etcd that speaks TLS: the mount fails, saying it could not join.
    let mut plain = site.cluster_options("a", &tls, true);
    plain[1] = plain[1].replace("etcds://", "etcd://");
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    let node = site.net.node("a");
    let prefix = node.prefix();
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let (mnt, cache) = (t.root().join("mnt-a"), t.root().join("cache-a"));
    std::fs::create_dir_all(&mnt).unwrap();
    let home = t.root().join("home");
    let out = Mount::try_new_under(&prefix, s(&home), &mnt, &cache, &plain, &[])
        .err()
        .expect("mounted against a TLS etcd in plain text");
    assert!(out.to_string().contains("cannot join cluster"), "{out}");
    let a = site.node(&t, &tls, "a", &[]);
    assert_eq!(a.status()["cluster"]["etcd_online"], true);
    assert_eq!(live_names(&members(&a)), ["a"]);
    a.unmount();
}

/// Read `file` through `m` a MiB at a time, at a pace a harvester keeps up with (it migrates as it evicts;
/// past it, reads evict for themselves, without migrating: `cache.evictions_by_fills`), and compare.
fn read_slowly(m: &Mount, file: &(String, Vec<u8>), what: &str) {
    use std::io::Read;
    let mut f = std::fs::File::open(m.path(&file.0)).unwrap();
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..=file.1.len() >> 20 {
        let n = f.read(&mut chunk).unwrap();
        got.extend_from_slice(&chunk[..n]);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_same_bytes(&got, &file.1, &format!("{} on {what}", file.0));
}

#[test]
fn a_node_sends_the_units_it_owns_to_a_member_with_room_rather_than_evicting_them() {
    require_fuse();
    let site = Site::new("migrate", &["a", "b", "y"]);
    let t = TestDir::new("cluster-migrate");
    let mut rng = Rng::new(0x3167);
    std::fs::create_dir_all(t.root().join("home")).unwrap();
    let big = write_random(&t.root().join("home/big.bin"), 40 << 20, &mut rng);
    let file = ("big.bin".to_string(), big);
    let tls = certs(&t.root().join("tls"), &["a", "b", "y"]);
    // A owns about a third of the units, and its cache holds little more than half the file.
    let a = site.node(&t, &tls, "a", &["--cache-size", "24MiB", "--readahead", "1MiB"]);
    let b = site.node(&t, &tls, "b", &["--cache-size", "48MiB"]);
    assert!(common::wait_until(Duration::from_secs(5), || live_count(&a) == 2));
    read_slowly(&a, &file, "a, whose cache is too small for it");
    let p = a.status()["peers"].clone();
    // Reads evict themselves (without offering) only when the harvester falls behind them, which a
    // busy machine may make it do: such units are counted, and home may send them again below.
    let by_fills = num(&a.status(), "/cache/evictions_by_fills");
    eprintln!("a: {p}; {by_fills} blocks evicted by reads");
    let migrated = p["migrated"].as_u64().unwrap();
    assert!(
        migrated > 0,
        "a evicted the units it owns rather than send them to b: {p}"
    );
    assert_eq!(peers(&b, "taken"), migrated);
    // A client reads the file: the units a sent away come back through a from b, not from home.
    let home_before = home_bytes(&a) + home_bytes(&b);
    let y = client(&site, &t, &tls, "y");
    assert!(common::wait_until(Duration::from_secs(5), || live_count(&y) == 3));
    // As A takes back what it owns, it evicts (and migrates) again.
    read_slowly(&y, &file, "client y");
    let again = home_bytes(&a) + home_bytes(&b) + home_bytes(&y) - home_before;
    let p = a.status()["peers"].clone();
    let lost = p["migrate_no_room"].as_u64().unwrap()
        + p["migrate_over_rate"].as_u64().unwrap()
        + num(&a.status(), "/cache/evictions_by_fills");
    eprintln!("a migrated {migrated} units ({lost} evicted for want of room or rate); home sent {again} bytes again");
    assert!(
        again <= lost * (1 << 20),
        "home sent {again} bytes again for {lost} units evicted without migration"
    );
    for m in [y, b, a] {
        m.unmount();
    }
}

/// `ls -l` of a directory of 2,000 files on a cluster node: one listing of home and no stat, through
/// the layer that shows other nodes' held changes as the bank's mounts are. Past the lag, the mount's
/// root is revalidated by its own listing (which carries its attributes), not by a stat.
#[test]
fn a_listing_on_a_cluster_node_is_one_home_call_with_the_directorys_own_attributes() {
    require_fuse();
    let site = Site::new("cluster-ls", &["a"]);
    let t = TestDir::new("cluster-ls");
    let home = t.root().join("home");
    std::fs::create_dir_all(home.join("many")).unwrap();
    for i in 0..2000 {
        std::fs::write(home.join(format!("many/f{i}")), [i as u8]).unwrap();
    }
    let tls = certs(&t.root().join("tls"), &["a"]);
    let a = site.node(&t, &tls, "a", &["--validity-lag", "2s"]);
    wait_all_live(&[&a], &["a"]);
    assert_ls_l_is_one_listing(&a, "many", 2000);
    assert_root_revalidated_by_listing(&a, Duration::from_millis(2500));
    a.unmount();
}
