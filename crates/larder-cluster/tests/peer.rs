//! The peer transport over real loopback connections, mutual TLS with certificates from a cluster CA made
//! in a temporary directory: a node's server and another node's client, a peer that lies (other units,
//! wrong checksums, chunks out of place), one that answers garbage, one that hangs, and one that is gone;
//! peers refused for a certificate from another CA or one that is not their record's, on either end; and
//! handshakes that are garbage or never come.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use larder_cluster::peer::proto::peer_server::Peer;
use larder_cluster::peer::proto::{
    Chunk, FetchRequest, HandedOverRequest, ReadHeldRequest, ReleaseRequest, Released, Taken,
};
use larder_cluster::peer::{
    Admit, Ask, CHUNK, HANDSHAKE_TIMEOUT, HeldAsk, PeerClient, PeerConfig, PeerError, PeerServer, PeerStats,
    ServeError, UnitSource, digest,
};
use larder_cluster::{MemberRecord, NodeTls, tls};
use prost::bytes::Bytes;
use tonic::{Request, Response, Status};

/// Units by key; keys starting with "old" are of another version; "slow" keys take a while. Every ask
/// is noted: its key, whether it forwarded, and whom it named to ask first.
#[derive(Default)]
struct Units(Mutex<HashMap<Vec<u8>, Bytes>>, Mutex<Vec<Asked>>);

/// An ask as a source saw it: the key, whether it forwarded, whom it named to ask first, and who asked.
type Asked = (Vec<u8>, bool, Option<u64>, u64);

impl UnitSource for Units {
    fn unit(&self, ask: &Ask) -> Result<Bytes, ServeError> {
        let key = ask.key;
        self.1
            .lock()
            .unwrap()
            .push((key.to_vec(), ask.forward, ask.from, ask.asker));
        if key.starts_with(b"old") {
            return Err(ServeError::OtherVersion);
        }
        if key.starts_with(b"slow") {
            std::thread::sleep(Duration::from_secs(3));
        }
        self.0.lock().unwrap().get(key).cloned().ok_or(ServeError::NotHeld)
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// A cluster's CA in a temporary directory, and its nodes' certificates.
struct Certs(tempfile::TempDir);

impl Certs {
    fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        tls::init(dir.path()).unwrap();
        Certs(dir)
    }

    /// Node `name`'s TLS, its certificate issued first if it has none.
    fn node(&self, name: &str) -> NodeTls {
        if !self.0.path().join(format!("{name}.pem")).exists() {
            tls::issue(self.0.path(), name, false).unwrap();
        }
        NodeTls::load(self.0.path(), name).unwrap()
    }

    /// Node `name`'s TLS with a new certificate (the old one still chains to the CA).
    fn reissue(&self, name: &str) -> NodeTls {
        tls::issue(self.0.path(), name, true).unwrap();
        NodeTls::load(self.0.path(), name).unwrap()
    }
}

/// The membership record of node `tls` as member `id`, reached at `addr`.
fn member(id: u64, tls: &NodeTls, addr: SocketAddr) -> MemberRecord {
    MemberRecord {
        id,
        name: tls.name().to_string(),
        addr: addr.to_string(),
        weight: 1,
        fingerprint: tls.fingerprint().to_string(),
        serve: true,
    }
}

/// The certificates (name, fingerprint) a server admits; a test changes them as the membership would.
type Members = Arc<Mutex<Vec<(String, String)>>>;

fn members(nodes: &[&NodeTls]) -> Members {
    Arc::new(Mutex::new(
        nodes
            .iter()
            .map(|n| (n.name().to_string(), n.fingerprint().to_string()))
            .collect(),
    ))
}

fn admit(members: &Members) -> Admit {
    let members = members.clone();
    Arc::new(move |p: &tls::Peer| {
        members
            .lock()
            .unwrap()
            .iter()
            .any(|(name, fp)| *name == p.name && *fp == p.fingerprint)
    })
}

/// A peer server on loopback with node `node`'s certificate, admitting `members`.
fn serve(node: &NodeTls, members: &Members, source: Arc<dyn UnitSource>) -> (PeerServer, Arc<PeerStats>) {
    serve_with_grace(node, members, source, Duration::ZERO)
}

/// The same, asking `members` again for up to `grace` about a certificate it does not admit at once.
fn serve_with_grace(
    node: &NodeTls,
    members: &Members,
    source: Arc<dyn UnitSource>,
    grace: Duration,
) -> (PeerServer, Arc<PeerStats>) {
    let stats = Arc::new(PeerStats::default());
    let server = PeerServer::start(
        "127.0.0.1:0".parse().unwrap(),
        node.server_config(),
        admit(members),
        grace,
        source,
        stats.clone(),
    )
    .unwrap();
    (server, stats)
}

fn ask<'a>(key: &'a [u8], digest: &'a [u8; 16], forward: bool) -> Ask<'a> {
    Ask {
        key,
        digest,
        path: b"some/file",
        index: 0,
        forward,
        from: None,
        asker: 0,
    }
}

fn client(node: &NodeTls, cfg: PeerConfig) -> PeerClient {
    PeerClient::new(9, cfg, node.client_config(), Arc::new(PeerStats::default())).unwrap()
}

fn quick() -> PeerConfig {
    PeerConfig {
        timeout: Duration::from_millis(800),
        connect_timeout: Duration::from_millis(300),
        failures: 2,
        cool_down: Duration::from_millis(700),
    }
}

#[test]
fn units_come_back_whole_and_right_of_every_size() {
    let units = Arc::new(Units::default());
    let sizes = [0usize, 1, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 1 << 20, (3 << 20) + 17];
    for (i, &len) in sizes.iter().enumerate() {
        units
            .0
            .lock()
            .unwrap()
            .insert(format!("k{i}").into_bytes(), pattern(len, i as u8));
    }
    let certs = Certs::new();
    let (n1, n9) = (certs.node("node1"), certs.node("node9"));
    let (server, stats) = serve(&n1, &members(&[&n9]), units.clone());
    let peer = member(1, &n1, server.addr());
    let c = client(&n9, PeerConfig::default());
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("k{i}").into_bytes();
        let got = c.fetch(&peer, &ask(&key, &digest(&key), false)).unwrap();
        assert_eq!(got, pattern(len, i as u8), "unit {i} of {len} bytes");
    }
    assert!(matches!(
        c.fetch(&peer, &ask(b"nope", &digest(b"nope"), false)),
        Err(PeerError::NotHeld)
    ));
    assert!(matches!(
        c.fetch(&peer, &ask(b"old1", &digest(b"old1"), true)),
        Err(PeerError::OtherVersion)
    ));
    assert_eq!(stats.served.load(Ordering::Relaxed), sizes.len() as u64);
    assert_eq!(stats.refused.load(Ordering::Relaxed), 0);
    assert_eq!(c.stats.hits.load(Ordering::Relaxed), sizes.len() as u64);
    assert_eq!(c.stats.misses.load(Ordering::Relaxed), 2);
    assert_eq!(
        c.stats.failures.load(Ordering::Relaxed),
        0,
        "a miss counted as a failure"
    );
    // Misses do not open the breaker: the peer is still asked.
    for _ in 0..5 {
        assert!(matches!(
            c.fetch(&peer, &ask(b"nope", &digest(b"nope"), false)),
            Err(PeerError::NotHeld)
        ));
    }
    let key = b"k6".to_vec();
    assert!(c.fetch(&peer, &ask(&key, &digest(&key), false)).is_ok());
}

/// What a lying peer does to the right unit's chunks.
type Lie = fn(Vec<Chunk>) -> Vec<Chunk>;

/// A peer that answers every fetch with the chunks `lie` makes of the right unit.
struct Liar {
    unit: Bytes,
    lie: Lie,
}

type ChunkStream = Pin<Box<dyn futures::Stream<Item = Result<Chunk, Status>> + Send>>;

impl Liar {
    /// The unit's chunks as `digest`, after the lie.
    fn answer(&self, digest: &[u8; 16]) -> Response<ChunkStream> {
        let d = Bytes::copy_from_slice(digest);
        let crc = crc32c::crc32c(&self.unit);
        let total = self.unit.len() as u64;
        let chunks: Vec<Chunk> = (0..self.unit.len())
            .step_by(CHUNK)
            .map(|at| Chunk {
                digest: d.clone(),
                offset: at as u64,
                data: self.unit.slice(at..(at + CHUNK).min(self.unit.len())),
                total,
                crc32c: crc,
            })
            .collect();
        let lied: Vec<Result<Chunk, Status>> = (self.lie)(chunks).into_iter().map(Ok).collect();
        Response::new(Box::pin(futures::stream::iter(lied)))
    }
}

#[tonic::async_trait]
impl Peer for Liar {
    type FetchStream = ChunkStream;
    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<ChunkStream>, Status> {
        Ok(self.answer(&digest(&request.into_inner().key)))
    }

    type ReadHeldStream = ChunkStream;
    async fn read_held(&self, request: Request<ReadHeldRequest>) -> Result<Response<ChunkStream>, Status> {
        let r = request.into_inner();
        let ask = HeldAsk {
            path: &r.path,
            revision: r.revision,
            offset: r.offset,
            len: r.len,
            link: r.link,
        };
        Ok(self.answer(&ask.digest()))
    }

    async fn release(&self, _: Request<ReleaseRequest>) -> Result<Response<Released>, Status> {
        Err(Status::unimplemented("a liar releases nothing"))
    }

    async fn handed_over(&self, _: Request<HandedOverRequest>) -> Result<Response<Released>, Status> {
        Err(Status::unimplemented("a liar hands nothing over"))
    }

    async fn take(&self, _: Request<FetchRequest>) -> Result<Response<Taken>, Status> {
        Err(Status::unimplemented("a liar takes nothing"))
    }
}

/// A liar with node `node`'s certificate (a member gone bad), admitting `client`.
fn serve_liar(liar: Liar, node: &NodeTls, client: &NodeTls) -> PeerServer {
    PeerServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        node.server_config(),
        admit(&members(&[client])),
        Duration::ZERO,
        Arc::new(PeerStats::default()),
        liar,
    )
    .unwrap()
}

#[test]
fn a_peer_that_lies_is_never_believed() {
    let unit = pattern((1 << 20) + 5, 3);
    let lies: [(&str, Lie); 7] = [
        ("a flipped byte", |mut c| {
            let mut d = c[1].data.to_vec();
            d[7] ^= 1;
            c[1].data = d.into();
            c
        }),
        ("another unit's digest", |mut c| {
            c[0].digest = Bytes::copy_from_slice(&digest(b"another"));
            c
        }),
        ("a chunk left out", |mut c| {
            c.remove(2);
            c
        }),
        ("the last chunk missing", |mut c| {
            c.pop();
            c
        }),
        ("chunks swapped", |mut c| {
            c.swap(0, 1);
            c
        }),
        ("a huge length", |mut c| {
            for x in &mut c {
                x.total = 1 << 40;
            }
            c
        }),
        ("no chunks at all", |_| Vec::new()),
    ];
    let certs = Certs::new();
    let (n1, n9) = (certs.node("node1"), certs.node("node9"));
    for (what, lie) in lies {
        let liar = serve_liar(
            Liar {
                unit: unit.clone(),
                lie,
            },
            &n1,
            &n9,
        );
        let c = client(&n9, PeerConfig::default());
        let got = c.fetch(&member(1, &n1, liar.addr()), &ask(b"key", &digest(b"key"), false));
        assert!(
            matches!(got, Err(PeerError::Corrupt(_))),
            "{what}: {:?}",
            got.map(|b| b.len())
        );
        assert_eq!(c.stats.corrupt.load(Ordering::Relaxed), 1, "{what}");
        // Bytes a peer holds of a file are checked alike.
        let got = c.read_held(&member(1, &n1, liar.addr()), &held_ask());
        assert!(
            matches!(got, Err(PeerError::Corrupt(_))),
            "{what}, held: {:?}",
            got.map(|b| b.len())
        );
    }
    // The honest variant of the same server is believed.
    let honest = serve_liar(
        Liar {
            unit: unit.clone(),
            lie: |c| c,
        },
        &n1,
        &n9,
    );
    assert_eq!(
        client(&n9, PeerConfig::default())
            .fetch(&member(1, &n1, honest.addr()), &ask(b"key", &digest(b"key"), false))
            .unwrap(),
        unit
    );
    let c = client(&n9, PeerConfig::default());
    assert_eq!(c.read_held(&member(1, &n1, honest.addr()), &held_ask()).unwrap(), unit);
    // An answer to another read (another revision) is not this one's.
    let other = HeldAsk {
        revision: 8,
        ..held_ask()
    };
    assert_ne!(other.digest(), held_ask().digest());
}

fn held_ask() -> HeldAsk<'static> {
    HeldAsk {
        path: b"dir/file",
        revision: 7,
        offset: 0,
        len: 2 << 20,
        link: false,
    }
}

#[test]
fn a_peer_answering_garbage_hanging_or_gone_is_skipped_quickly_and_its_breaker_opens() {
    // Garbage: a listener that answers any connection with bytes that are not HTTP/2.
    let garbage = TcpListener::bind("127.0.0.1:0").unwrap();
    let garbage_addr = garbage.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let accepted = accepted.clone();
        std::thread::spawn(move || {
            for conn in garbage.incoming() {
                let Ok(mut conn) = conn else { continue };
                accepted.fetch_add(1, Ordering::Relaxed);
                let mut buf = [0u8; 1024];
                let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(b"HTTP/1.0 500 nonsense\r\n\r\n\x00\xff\x13garbage garbage garbage");
            }
        });
    }
    let certs = Certs::new();
    let (n1, n2, n9) = (certs.node("node1"), certs.node("node2"), certs.node("node9"));
    let c = client(&n9, quick());
    let g = member(1, &n1, garbage_addr);
    for _ in 0..2 {
        let started = Instant::now();
        assert!(matches!(
            c.fetch(&g, &ask(b"k", &digest(b"k"), false)),
            Err(PeerError::Failed(_) | PeerError::Timeout(_))
        ));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "garbage took {:?}",
            started.elapsed()
        );
    }
    // Two failures in a row: skipped without a call until the cool-down ends, then tried once again.
    let calls = accepted.load(Ordering::Relaxed);
    let started = Instant::now();
    assert!(matches!(
        c.fetch(&g, &ask(b"k", &digest(b"k"), false)),
        Err(PeerError::Skipped(1, _))
    ));
    assert!(started.elapsed() < Duration::from_millis(50));
    assert_eq!(c.stats.skipped.load(Ordering::Relaxed), 1);
    std::thread::sleep(Duration::from_millis(800));
    assert!(matches!(
        c.fetch(&g, &ask(b"k", &digest(b"k"), false)),
        Err(PeerError::Failed(_) | PeerError::Timeout(_))
    ));
    assert!(
        accepted.load(Ordering::Relaxed) >= calls,
        "the trial after the cool-down made no call"
    );
    assert!(
        matches!(
            c.fetch(&g, &ask(b"k", &digest(b"k"), false)),
            Err(PeerError::Skipped(..))
        ),
        "a failed trial reopens it"
    );

    // Hanging: a unit that takes longer than the timeout.
    let units = Arc::new(Units::default());
    units.0.lock().unwrap().insert(b"slow".to_vec(), pattern(10, 1));
    let (server, _) = serve(&n2, &members(&[&n9]), units);
    let started = Instant::now();
    assert!(matches!(
        c.fetch(&member(2, &n2, server.addr()), &ask(b"slow", &digest(b"slow"), false)),
        Err(PeerError::Timeout(_))
    ));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "a hanging peer held the read {:?}",
        started.elapsed()
    );

    // Gone: nothing listens there any more.
    let gone = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let started = Instant::now();
    assert!(
        c.fetch(&member(3, &n1, gone), &ask(b"k", &digest(b"k"), false))
            .is_err()
    );
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_peer_that_moved_is_followed_to_its_new_address() {
    let units = Arc::new(Units::default());
    units.0.lock().unwrap().insert(b"k".to_vec(), pattern(100, 9));
    let certs = Certs::new();
    let (n1, n9) = (certs.node("node1"), certs.node("node9"));
    let admitted = members(&[&n9]);
    let (first, _) = serve(&n1, &admitted, units.clone());
    let c = client(&n9, quick());
    assert!(
        c.fetch(&member(1, &n1, first.addr()), &ask(b"k", &digest(b"k"), false))
            .is_ok()
    );
    drop(first);
    let (second, _) = serve(&n1, &admitted, units);
    assert_eq!(
        c.fetch(&member(1, &n1, second.addr()), &ask(b"k", &digest(b"k"), false))
            .unwrap(),
        pattern(100, 9)
    );
}

#[test]
fn a_take_asks_the_new_owner_to_get_the_unit_from_the_leaving_node_first_and_keep_it() {
    let certs = Certs::new();
    let (server_tls, leaving) = (certs.node("new-owner"), certs.node("leaving"));
    let units = one_unit();
    let (server, stats) = serve(&server_tls, &members(&[&leaving]), units.clone());
    let c = client(&leaving, quick());
    let owner = member(1, &server_tls, server.addr());
    assert_eq!(c.take(&owner, &ask(b"k", &digest(b"k"), false)).unwrap(), 1000);
    // The source was asked as the owner (it may fetch), naming the leaving node (id 9) to ask first.
    assert_eq!(*units.1.lock().unwrap(), vec![(b"k".to_vec(), true, Some(9), 9)]);
    assert_eq!(stats.taken.load(Ordering::Relaxed), 1);
    assert_eq!(stats.served.load(Ordering::Relaxed), 0, "a take sends no data back");
    // A unit the new owner cannot get is the leaving node's to report, not a failure of the peer.
    assert!(matches!(
        c.take(&owner, &ask(b"none", &digest(b"none"), false)),
        Err(PeerError::NotHeld)
    ));
    // Fetches name no one to ask first; the server knows who asks.
    fetch_k(&c, &owner).unwrap();
    assert_eq!(
        units.1.lock().unwrap().last().unwrap(),
        &(b"k".to_vec(), false, None, 9)
    );
}

/// A server holding one unit, "k", for the tests of who is refused.
fn one_unit() -> Arc<Units> {
    let units = Arc::new(Units::default());
    units.0.lock().unwrap().insert(b"k".to_vec(), pattern(1000, 4));
    units
}

/// Wait (a little) for the server's count of refusals to reach `n`, and check it goes no further.
fn refused_reaches(stats: &PeerStats, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while stats.refused.load(Ordering::Relaxed) < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stats.refused.load(Ordering::Relaxed), n);
}

fn fetch_k(c: &PeerClient, peer: &MemberRecord) -> Result<Bytes, PeerError> {
    c.fetch(peer, &ask(b"k", &digest(b"k"), false))
}

/// A client configuration that trusts `ca`'s CA (so it accepts our servers) but presents `node`'s
/// certificate, from whatever CA issued it.
fn presenting(ca: &Certs, node: &str, certs_of: &Certs) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca.0.path().join(tls::CA_CERT)).unwrap())
        .unwrap();
    let cert = CertificateDer::from_pem_file(certs_of.0.path().join(format!("{node}.pem"))).unwrap();
    let key = PrivateKeyDer::from_pem_file(certs_of.0.path().join(format!("{node}.key"))).unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert], key)
        .unwrap();
    cfg.alpn_protocols = vec![tls::ALPN_H2.to_vec()];
    Arc::new(cfg)
}

#[test]
fn a_client_with_a_certificate_from_another_ca_is_refused() {
    let (ours, theirs) = (Certs::new(), Certs::new());
    let (n1, n9) = (ours.node("node1"), ours.node("node9"));
    let foreign = theirs.node("node9");
    // The server would admit the foreign certificate's name and fingerprint: only the CA refuses it.
    let (server, stats) = serve(&n1, &members(&[&n9, &foreign]), one_unit());
    let peer = member(1, &n1, server.addr());
    // A client that trusts our CA but presents a certificate from theirs, and a node of their cluster.
    let trusting = PeerClient::new(9, quick(), presenting(&ours, "node9", &theirs), Arc::default()).unwrap();
    let theirs_node = client(&foreign, quick());
    for (what, c) in [("presenting theirs", &trusting), ("their node", &theirs_node)] {
        let got = fetch_k(c, &peer);
        assert!(
            matches!(got, Err(PeerError::Failed(_))),
            "{what}: {:?}",
            got.map(|b| b.len())
        );
        assert_eq!(c.stats.failures.load(Ordering::Relaxed), 1, "{what}");
    }
    assert_eq!(
        stats.served.load(Ordering::Relaxed),
        0,
        "a unit went to a foreign CA's node"
    );
    // The client may see the server's alert a moment before the server counts it.
    refused_reaches(&stats, 2);
    // The same name from our CA is served, by the same configuration but for its certificate.
    let ours_too = PeerClient::new(9, quick(), presenting(&ours, "node9", &ours), Arc::default()).unwrap();
    assert_eq!(fetch_k(&ours_too, &peer).unwrap(), pattern(1000, 4));
    assert_eq!(stats.served.load(Ordering::Relaxed), 1);
}

#[test]
fn a_peer_whose_certificate_is_not_its_records_is_refused_by_the_server() {
    let certs = Certs::new();
    let (n1, old) = (certs.node("node1"), certs.node("node9"));
    let admitted = members(&[&old]);
    let (server, stats) = serve(&n1, &admitted, one_unit());
    let peer = member(1, &n1, server.addr());
    // Valid certificates from the cluster CA, neither in the membership: node9's new one (its record still
    // names the old), and one of a name no member has.
    let new = certs.reissue("node9");
    let stranger = certs.node("stranger");
    for (what, node) in [("a new certificate", &new), ("a stranger", &stranger)] {
        let got = fetch_k(&client(node, quick()), &peer);
        assert!(
            matches!(got, Err(PeerError::Failed(_))),
            "{what}: {:?}",
            got.map(|b| b.len())
        );
    }
    assert_eq!(stats.served.load(Ordering::Relaxed), 0, "a unit went to a non-member");
    assert_eq!(stats.refused.load(Ordering::Relaxed), 2);
    // The certificate in the record is served, until the record changes: then the connection it already
    // has is refused at the next call.
    let c = client(&old, quick());
    assert_eq!(fetch_k(&c, &peer).unwrap(), pattern(1000, 4));
    *admitted.lock().unwrap() = vec![(new.name().to_string(), new.fingerprint().to_string())];
    let got = fetch_k(&c, &peer);
    assert!(matches!(got, Err(PeerError::Failed(_))), "{:?}", got.map(|b| b.len()));
    assert_eq!(stats.served.load(Ordering::Relaxed), 1);
    assert_eq!(stats.refused.load(Ordering::Relaxed), 3);
    // And the new one is served now.
    assert_eq!(fetch_k(&client(&new, quick()), &peer).unwrap(), pattern(1000, 4));
}

#[test]
fn a_server_whose_certificate_is_not_its_records_is_refused_by_the_client() {
    let certs = Certs::new();
    let (n9, n2) = (certs.node("node9"), certs.node("node2"));
    let old = certs.node("node1");
    let new = certs.reissue("node1");
    let (server, stats) = serve(&new, &members(&[&n9]), one_unit());
    let c = client(&n9, quick());
    // Its record has the old certificate: the server chains to the CA and names node1, and is refused.
    let recorded = member(1, &old, server.addr());
    let got = fetch_k(&c, &recorded);
    assert!(matches!(got, Err(PeerError::Failed(_))), "{:?}", got.map(|b| b.len()));
    // A record naming another node, with the fingerprint the server presents, is refused too.
    let mut renamed = member(2, &new, server.addr());
    renamed.name = n2.name().to_string();
    let got = fetch_k(&c, &renamed);
    assert!(matches!(got, Err(PeerError::Failed(_))), "{:?}", got.map(|b| b.len()));
    assert_eq!(c.stats.failures.load(Ordering::Relaxed), 2);
    assert_eq!(stats.served.load(Ordering::Relaxed), 0);
    // A refusal is a failure like any other: the breaker opens.
    let got = fetch_k(&c, &recorded);
    assert!(matches!(got, Err(PeerError::Failed(_))), "{:?}", got.map(|b| b.len()));
    assert!(matches!(fetch_k(&c, &recorded), Err(PeerError::Skipped(1, _))));
    // Once the record has the new certificate, the client connects anew and is served.
    std::thread::sleep(quick().cool_down);
    assert_eq!(fetch_k(&c, &member(1, &new, server.addr())).unwrap(), pattern(1000, 4));
    assert_eq!(stats.served.load(Ordering::Relaxed), 1);
}

#[test]
fn a_garbage_or_stalled_handshake_does_not_stop_the_server_serving_others() {
    let certs = Certs::new();
    let (n1, n9) = (certs.node("node1"), certs.node("node9"));
    let (server, stats) = serve(&n1, &members(&[&n9]), one_unit());
    // One connection that never says a word, one that says garbage and waits.
    let started = Instant::now();
    let mut silent = std::net::TcpStream::connect(server.addr()).unwrap();
    let mut garbage = std::net::TcpStream::connect(server.addr()).unwrap();
    garbage
        .write_all(b"\x16\x03\x01\x00\x05garbage that is not a client hello at all")
        .unwrap();
    // Meanwhile a member is served at once.
    let c = client(&n9, quick());
    let asked = Instant::now();
    assert_eq!(fetch_k(&c, &member(1, &n1, server.addr())).unwrap(), pattern(1000, 4));
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "served in {:?}",
        asked.elapsed()
    );
    // The garbage is refused at once, the silence when the handshake's time is up: both closed.
    let mut buf = [0u8; 64];
    garbage.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    while matches!(garbage.read(&mut buf), Ok(n) if n > 0) {}
    silent.set_read_timeout(Some(HANDSHAKE_TIMEOUT * 2)).unwrap();
    assert!(
        matches!(silent.read(&mut buf), Ok(0)),
        "the silent connection was left open"
    );
    let took = started.elapsed();
    assert!(
        took >= HANDSHAKE_TIMEOUT - Duration::from_millis(100) && took < HANDSHAKE_TIMEOUT + Duration::from_secs(2),
        "the silent connection was closed after {took:?}"
    );
    refused_reaches(&stats, 2);
    assert_eq!(stats.served.load(Ordering::Relaxed), 1);
}

#[test]
fn a_node_that_has_just_joined_is_admitted_once_the_view_has_it_within_the_grace() {
    let certs = Certs::new();
    let (n1, newcomer) = (certs.node("node1"), certs.node("node2"));
    // The server's view does not have the newcomer yet; it will in 300 ms.
    let admitted = members(&[]);
    let (server, stats) = serve_with_grace(&n1, &admitted, one_unit(), Duration::from_secs(2));
    let peer = member(1, &n1, server.addr());
    let later = {
        let admitted = admitted.clone();
        let entry = (newcomer.name().to_string(), newcomer.fingerprint().to_string());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            admitted.lock().unwrap().push(entry);
        })
    };
    let c = client(&newcomer, PeerConfig::default());
    assert_eq!(fetch_k(&c, &peer).unwrap(), pattern(1000, 4));
    later.join().unwrap();
    assert_eq!(stats.refused.load(Ordering::Relaxed), 0);
    // A stranger is still refused, once the grace is over.
    let stranger = certs.node("stranger");
    let started = Instant::now();
    assert!(fetch_k(&client(&stranger, PeerConfig::default()), &peer).is_err());
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "refused before the grace ran out"
    );
    refused_reaches(&stats, 1);
    assert_eq!(stats.served.load(Ordering::Relaxed), 1);
}
