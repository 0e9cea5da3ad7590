//! The peer transport over real loopback connections: a node's server and another node's client, a peer
//! that lies (other units, wrong checksums, chunks out of place), one that answers garbage, one that hangs,
//! and one that is gone.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use larder_cluster::MemberRecord;
use larder_cluster::peer::proto::peer_server::{Peer, PeerServer as RawServer};
use larder_cluster::peer::proto::{Chunk, FetchRequest};
use larder_cluster::peer::{
    Ask, CHUNK, PeerClient, PeerConfig, PeerError, PeerServer, PeerStats, SourceError, UnitSource, digest,
};
use prost::bytes::Bytes;
use tonic::{Request, Response, Status};

/// Units by key; keys starting with "old" are of another version; "slow" keys take a while.
#[derive(Default)]
struct Units(Mutex<HashMap<Vec<u8>, Bytes>>);

impl UnitSource for Units {
    fn unit(&self, ask: &Ask) -> Result<Bytes, SourceError> {
        let key = ask.key;
        if key.starts_with(b"old") {
            return Err(SourceError::OtherVersion);
        }
        if key.starts_with(b"slow") {
            std::thread::sleep(Duration::from_secs(3));
        }
        self.0.lock().unwrap().get(key).cloned().ok_or(SourceError::NotHeld)
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

fn member(id: u64, addr: SocketAddr) -> MemberRecord {
    MemberRecord {
        id,
        name: format!("node{id}"),
        addr: addr.to_string(),
        weight: 1,
        fingerprint: String::new(),
        serve: true,
    }
}

fn ask<'a>(key: &'a [u8], digest: &'a [u8; 16], forward: bool) -> Ask<'a> {
    Ask {
        key,
        digest,
        path: b"some/file",
        index: 0,
        forward,
    }
}

fn client(cfg: PeerConfig) -> PeerClient {
    PeerClient::new(9, cfg, Arc::new(PeerStats::default())).unwrap()
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
    let stats = Arc::new(PeerStats::default());
    let server = PeerServer::start("127.0.0.1:0".parse().unwrap(), units.clone(), stats.clone()).unwrap();
    let peer = member(1, server.addr());
    let c = client(PeerConfig::default());
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

#[tonic::async_trait]
impl Peer for Liar {
    type FetchStream = ChunkStream;
    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<ChunkStream>, Status> {
        let key = request.into_inner().key;
        let d = Bytes::copy_from_slice(&digest(&key));
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
        Ok(Response::new(Box::pin(futures::stream::iter(lied))))
    }
}

fn serve_liar(liar: Liar) -> (SocketAddr, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = {
        let _g = rt.enter();
        tonic::transport::server::TcpIncoming::from(tokio::net::TcpListener::from_std(listener).unwrap())
    };
    rt.spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(RawServer::new(liar))
            .serve_with_incoming(incoming)
            .await;
    });
    (addr, rt)
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
    for (what, lie) in lies {
        let (addr, _rt) = serve_liar(Liar {
            unit: unit.clone(),
            lie,
        });
        let c = client(PeerConfig::default());
        let got = c.fetch(&member(1, addr), &ask(b"key", &digest(b"key"), false));
        assert!(
            matches!(got, Err(PeerError::Corrupt(_))),
            "{what}: {:?}",
            got.map(|b| b.len())
        );
        assert_eq!(c.stats.corrupt.load(Ordering::Relaxed), 1, "{what}");
    }
    // The honest variant of the same server is believed.
    let (addr, _rt) = serve_liar(Liar {
        unit: unit.clone(),
        lie: |c| c,
    });
    assert_eq!(
        client(PeerConfig::default())
            .fetch(&member(1, addr), &ask(b"key", &digest(b"key"), false))
            .unwrap(),
        unit
    );
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
    let c = client(quick());
    let g = member(1, garbage_addr);
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
    let server = PeerServer::start("127.0.0.1:0".parse().unwrap(), units, Arc::new(PeerStats::default())).unwrap();
    let started = Instant::now();
    assert!(matches!(
        c.fetch(&member(2, server.addr()), &ask(b"slow", &digest(b"slow"), false)),
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
    assert!(c.fetch(&member(3, gone), &ask(b"k", &digest(b"k"), false)).is_err());
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_peer_that_moved_is_followed_to_its_new_address() {
    let units = Arc::new(Units::default());
    units.0.lock().unwrap().insert(b"k".to_vec(), pattern(100, 9));
    let first = PeerServer::start(
        "127.0.0.1:0".parse().unwrap(),
        units.clone(),
        Arc::new(PeerStats::default()),
    )
    .unwrap();
    let c = client(quick());
    assert!(
        c.fetch(&member(1, first.addr()), &ask(b"k", &digest(b"k"), false))
            .is_ok()
    );
    drop(first);
    let second = PeerServer::start("127.0.0.1:0".parse().unwrap(), units, Arc::new(PeerStats::default())).unwrap();
    assert_eq!(
        c.fetch(&member(1, second.addr()), &ask(b"k", &digest(b"k"), false))
            .unwrap(),
        pattern(100, 9)
    );
}
