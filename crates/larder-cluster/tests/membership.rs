//! Membership against a real etcd (Debian's `etcd-server`), started by each test on loopback ports of its
//! own, with its data in a temporary directory.

use std::time::{Duration, Instant};

use larder_cluster::testing::{Etcd, free_port};
use larder_cluster::{MemberRecord, Membership, MembershipConfig, MembershipError};

fn config(etcd: &Etcd, cluster: &str) -> MembershipConfig {
    let mut cfg = MembershipConfig::new(vec![etcd.endpoint()], cluster);
    cfg.ttl = Duration::from_secs(2);
    cfg.renew_every = Duration::from_millis(400);
    cfg.timeout = Duration::from_secs(1);
    cfg
}

fn record(id: u64, addr: &str) -> MemberRecord {
    MemberRecord {
        id,
        name: format!("node{id}"),
        addr: addr.into(),
        weight: 10 << 30,
        fingerprint: "00".repeat(32),
        serve: true,
    }
}

/// Wait (bounded) until `cond` holds.
fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn members_see_each_other_join_and_leave() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "c1"), record(1, "10.0.0.1:7000")).unwrap();
    let b = Membership::join(config(&etcd, "c1"), record(2, "10.0.0.2:7000")).unwrap();
    // B loaded A at its join; A learns of B through its watch.
    assert!(b.view().live.contains(&1) && b.view().live.contains(&2));
    eventually("A sees B", Duration::from_secs(5), || a.view().live.contains(&2));
    assert_eq!(a.view().members[&2], record(2, "10.0.0.2:7000"));
    assert_eq!(a.view().placement().len(), 2);
    // Another cluster on the same etcd is apart.
    let other = Membership::join(config(&etcd, "c2"), record(3, "10.0.0.3:7000")).unwrap();
    assert!(!other.view().members.contains_key(&1));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !a.view().members.contains_key(&3),
        "a member of another cluster is in this one"
    );
    // B leaves: it is not live at once (its lease is revoked), and its record, its identity, stays.
    let left = Instant::now();
    b.leave();
    eventually("A sees B leave", Duration::from_secs(3), || !a.view().live.contains(&2));
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "a leave waited for the lease to run out"
    );
    assert!(a.view().members.contains_key(&2));
    assert_eq!(a.view().placement().len(), 1);
    assert!(a.online() && a.lease_ok());
}

#[test]
fn a_member_that_dies_drops_out_when_its_lease_ends() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "c"), record(1, "a:1")).unwrap();
    let b = Membership::join(config(&etcd, "c"), record(2, "b:1")).unwrap();
    eventually("A sees B", Duration::from_secs(5), || a.view().live.contains(&2));
    // Well past the TTL, a member that renews stays live.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        a.view().live.contains(&2) && b.view().live.contains(&1),
        "a renewing member dropped out"
    );
    b.abandon();
    let died = Instant::now();
    eventually("A sees B gone", Duration::from_secs(8), || !a.view().live.contains(&2));
    assert!(
        died.elapsed() >= Duration::from_millis(500),
        "gone before its lease could end"
    );
}

#[test]
fn an_address_change_is_followed_by_id() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "c"), record(1, "a:1")).unwrap();
    let b = Membership::join(config(&etcd, "c"), record(2, "10.0.0.2:7000")).unwrap();
    eventually("A sees B", Duration::from_secs(5), || a.view().live.contains(&2));
    b.leave();
    let b = Membership::join(config(&etcd, "c"), record(2, "10.0.0.9:7100")).unwrap();
    eventually("A follows B's new address", Duration::from_secs(5), || {
        a.view().members.get(&2).is_some_and(|r| r.addr == "10.0.0.9:7100") && a.view().live.contains(&2)
    });
    assert_eq!(a.view().members.len(), 2, "the same id is one member");
    drop(b);
}

#[test]
fn with_etcd_away_the_last_view_stands_and_members_come_back_when_it_returns() {
    let mut etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "c"), record(1, "a:1")).unwrap();
    let b = Membership::join(config(&etcd, "c"), record(2, "b:1")).unwrap();
    eventually("A sees B", Duration::from_secs(5), || a.view().live.contains(&2));
    etcd.kill();
    // The view is answered at once, as it was, for as long as etcd is away.
    for _ in 0..20 {
        let asked = Instant::now();
        let view = a.view();
        assert!(asked.elapsed() < Duration::from_millis(50), "the view waited for etcd");
        assert!(
            view.live.contains(&1) && view.live.contains(&2),
            "the last view was dropped"
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    eventually("A notices etcd is away", Duration::from_secs(5), || !a.online());
    eventually("A's lease is no longer sure", Duration::from_secs(5), || !a.lease_ok());
    etcd.run();
    eventually("A is back", Duration::from_secs(15), || a.online() && a.lease_ok());
    eventually("B is back", Duration::from_secs(15), || b.online() && b.lease_ok());
    eventually("A sees B live", Duration::from_secs(5), || a.view().live.contains(&2));
    // And the watch works again: a third member is seen.
    // (A first join after a restart may wait for etcd to settle: this machine is shared.)
    let mut patient = config(&etcd, "c");
    patient.timeout = Duration::from_secs(5);
    let c = Membership::join(patient, record(3, "c:1")).unwrap();
    eventually("A sees C", Duration::from_secs(5), || a.view().live.contains(&3));
    drop(c);
}

#[test]
fn joining_fails_clearly_when_etcd_cannot_be_reached_or_the_name_is_bad() {
    let port = free_port();
    let mut cfg = MembershipConfig::new(vec![format!("http://127.0.0.1:{port}")], "c");
    cfg.timeout = Duration::from_millis(500);
    let started = Instant::now();
    let err = Membership::join(cfg.clone(), record(1, "a:1"))
        .err()
        .expect("joined a cluster with no etcd");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.contains(&port.to_string()) || text.contains("did not answer"),
        "{text}"
    );
    cfg.cluster = "no/slashes".into();
    assert!(matches!(
        Membership::join(cfg, record(1, "a:1")),
        Err(MembershipError::BadName(_))
    ));
}

#[test]
fn over_tls_etcd_admits_a_node_with_the_clusters_certificate_and_no_other() {
    use larder_cluster::{EtcdTls, tls};
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    for dir in [ours.path(), theirs.path()] {
        tls::init(dir).unwrap();
        tls::issue(dir, "node1", false).unwrap();
    }
    // etcd's own certificate, from the cluster's CA, naming the address the nodes dial.
    tls::issue_for(ours.path(), "etcd", &["127.0.0.1".into()], false).unwrap();
    let p = ours.path();
    let localhost = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let etcd = Etcd::start_tls(localhost, &p.join("ca.pem"), &p.join("etcd.pem"), &p.join("etcd.key"));
    let with = |dir: &std::path::Path| {
        let mut cfg = config(&etcd, "tls");
        cfg.tls = Some(EtcdTls::load(dir, "node1").unwrap());
        cfg
    };
    let a = Membership::join(with(ours.path()), record(1, "10.0.0.1:7000")).unwrap();
    eventually("a sees itself live", Duration::from_secs(5), || {
        a.view().live.contains(&1)
    });
    assert!(a.online());
    // A certificate from another CA: etcd refuses the handshake, and the join says it could not.
    assert!(Membership::join(with(theirs.path()), record(2, "10.0.0.2:7000")).is_err());
    // Plain text to a TLS etcd: refused too.
    let mut plain = config(&etcd, "tls");
    plain.endpoints = vec![format!("http://127.0.0.1:{}", etcd.client)];
    assert!(Membership::join(plain, record(3, "10.0.0.3:7000")).is_err());
    assert_eq!(a.view().live.len(), 1, "a refused node joined: {:?}", a.view().live);
    a.leave();
}

#[test]
fn held_records_reach_another_node_by_its_watch_or_at_once_by_a_sync_and_a_stale_removal_fails() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "h"), record(1, "10.0.0.1:7000")).unwrap();
    let b = Membership::join(config(&etcd, "h"), record(2, "10.0.0.2:7000")).unwrap();
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let h = heard.clone();
    b.held()
        .set_hook(Box::new(move |p, _| h.lock().unwrap().push(p.to_vec())));

    let rev = a
        .publish_held(&[(b"d/f".to_vec(), b"one".to_vec()), (b"d".to_vec(), b"dir".to_vec())])
        .unwrap();
    // A has its own records at once; B, after a sync, without waiting for the watch.
    assert_eq!(a.held().get(b"d/f").unwrap().revision, rev);
    b.sync_held().unwrap();
    assert_eq!(b.held().get(b"d/f").unwrap().value, b"one");
    assert_eq!(b.held().children(b"d").len(), 1);
    assert_eq!(b.held().children(b"").len(), 1);
    assert!(heard.lock().unwrap().contains(&b"d/f".to_vec()));

    // A newer record of the path: a removal that names the older one changes nothing.
    let rev2 = a.publish_held(&[(b"d/f".to_vec(), b"two".to_vec())]).unwrap();
    assert_eq!(a.unpublish_held(b"d/f", rev).unwrap(), None);
    eventually("b has the newer record", Duration::from_secs(5), || {
        b.held().get(b"d/f").is_some_and(|h| h.value == b"two")
    });
    assert!(a.unpublish_held(b"d/f", rev2).unwrap().is_some_and(|r| r > rev2));
    eventually("b hears of the removal", Duration::from_secs(5), || {
        b.held().get(b"d/f").is_none()
    });
    // Records outlive their holder: they are not under its lease.
    a.abandon();
    std::thread::sleep(Duration::from_secs(3));
    let c = Membership::join(config(&etcd, "h"), record(3, "10.0.0.3:7000")).unwrap();
    assert!(!c.view().live.contains(&1), "a's lease ran out");
    assert_eq!(c.held().get(b"d").unwrap().value, b"dir", "a's record stays");
}

#[test]
fn more_held_records_than_etcd_takes_in_one_transaction_are_published_all() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "big"), record(1, "10.0.0.1:7000")).unwrap();
    let b = Membership::join(config(&etcd, "big"), record(2, "10.0.0.2:7000")).unwrap();
    // As a node republishes what it changed while etcd was away: 300 paths at once.
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..300)
        .map(|i| (format!("d/f{i}").into_bytes(), b"x".to_vec()))
        .collect();
    a.publish_held(&records).expect("etcd took every record");
    b.sync_held().unwrap();
    assert_eq!(b.held().children(b"d").len(), 300, "b has every record");
}
