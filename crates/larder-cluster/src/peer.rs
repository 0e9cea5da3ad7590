//! The peer transport: a node serves the units it holds to the other nodes, and asks them for units.
//!
//! gRPC (tonic) with the protocol in `proto/peer.proto` (`larder.peer.v1.Peer`): one call per unit, by
//! its portable key; the unit comes back in chunks of [`CHUNK`] bytes, each carrying the key's digest,
//! its offset, the unit's length and the CRC-32C of the whole unit. The asker checks all of it: a chunk
//! of another key, out of order, past the end, or a unit whose checksum does not match is **corrupt**, a
//! miss that is never served. HTTP/2 flow-control windows are sized for MiB units (tonic's 64 KiB
//! defaults would cap a stream at a window per round trip).
//!
//! A peer that fails (cannot be reached, times out, answers garbage or corrupt data) counts a failure;
//! [`PeerConfig::failures`] in a row open its **circuit breaker**: it is skipped without a call for
//! [`PeerConfig::cool_down`], then tried again once. "Not held" and "another version" are answers, not
//! failures. Every failure is the caller's cue to go on to the next candidate or home: a clean read never
//! fails because a peer died.
//!
//! Callers are synchronous (the read path's threads): the client and the server each run a small tokio
//! runtime of their own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use prost::bytes::Bytes;
use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

use crate::membership::MemberRecord;
use crate::placement::{MemberId, UnitDigest};

/// The generated protocol.
pub mod proto {
    tonic::include_proto!("larder.peer.v1");
}

use proto::peer_client::PeerClient as RawClient;
use proto::peer_server::{Peer, PeerServer as RawServer};
use proto::{Chunk, FetchRequest};

/// Bytes of a unit per chunk.
pub const CHUNK: usize = 256 << 10;
/// The largest unit a peer may announce: more is garbage, not a unit.
pub const MAX_UNIT: u64 = 256 << 20;
/// HTTP/2 windows: a stream's, and the connection's (several units in flight).
const STREAM_WINDOW: u32 = 8 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;

/// The digest of a unit key's encoding: the first 16 bytes of its SHA-256, as every node computes it.
pub fn digest(key: &[u8]) -> UnitDigest {
    let full = Sha256::digest(key);
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// What a node's read path says when a peer asks it for a unit.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// This node does not hold it (and was not asked to, or could not, fetch it).
    #[error("not held here")]
    NotHeld,
    /// This node knows another version of the file than the key names.
    #[error("another version is cached here")]
    OtherVersion,
    /// The key is not one this node can read.
    #[error("unreadable key: {0}")]
    BadKey(String),
    #[error("{0}")]
    Failed(String),
}

/// What one node asks another for.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    /// The unit's portable key (its encoding), and the digest every node computes of it.
    pub key: &'a [u8],
    pub digest: &'a UnitDigest,
    /// Where home has the file, and the block the unit starts at.
    pub path: &'a [u8],
    pub index: u32,
    /// Whether the peer may fetch the unit from home to answer (it is the unit's owner).
    pub forward: bool,
}

/// Where a node's server gets the units it serves: its own read path (cache, then home when
/// forwarding).
pub trait UnitSource: Send + Sync + 'static {
    /// The unit `ask` names. With `ask.forward`, a unit not held may be fetched (from home) to answer,
    /// and kept.
    fn unit(&self, ask: &Ask) -> Result<Bytes, SourceError>;
}

/// Figures of the peer tier, both directions.
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Units asked of peers, and got.
    pub fetches: AtomicU64,
    pub hits: AtomicU64,
    pub bytes: AtomicU64,
    /// Time spent on fetches, in nanoseconds.
    pub nanos: AtomicU64,
    /// Answers "not held" or "another version".
    pub misses: AtomicU64,
    /// Calls that failed (unreachable, timed out, refused), and units that came back corrupt.
    pub failures: AtomicU64,
    pub corrupt: AtomicU64,
    /// Calls not made because the peer's breaker was open.
    pub skipped: AtomicU64,
    /// Units served to peers, and their bytes.
    pub served: AtomicU64,
    pub served_bytes: AtomicU64,
}

/// How the client treats peers.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// Longest a unit's fetch may take, connection included.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Failures in a row that open a peer's breaker, and how long it stays open.
    pub failures: u32,
    pub cool_down: Duration,
}

impl Default for PeerConfig {
    fn default() -> PeerConfig {
        PeerConfig {
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            failures: 3,
            cool_down: Duration::from_secs(5),
        }
    }
}

/// Why a fetch from a peer gave nothing. Each is a miss: go on to the next candidate, or home.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {0:016x} skipped: it failed {1} times in a row")]
    Skipped(MemberId, u32),
    #[error("the peer does not hold it")]
    NotHeld,
    #[error("the peer caches another version")]
    OtherVersion,
    #[error("the peer did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the peer's data is corrupt: {0}")]
    Corrupt(String),
    #[error("the peer failed: {0}")]
    Failed(String),
}

/// The service: answers `Fetch` from a [`UnitSource`].
struct Service {
    source: Arc<dyn UnitSource>,
    stats: Arc<PeerStats>,
}

type ChunkStream = Pin<Box<dyn futures::Stream<Item = Result<Chunk, Status>> + Send>>;

#[tonic::async_trait]
impl Peer for Service {
    type FetchStream = ChunkStream;

    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<ChunkStream>, Status> {
        let req = request.into_inner();
        let source = self.source.clone();
        let asked = req.clone();
        let unit = tokio::task::spawn_blocking(move || {
            let digest = digest(&asked.key);
            source.unit(&Ask {
                key: &asked.key,
                digest: &digest,
                path: &asked.path,
                index: asked.index,
                forward: asked.forward,
            })
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        let data = match unit {
            Ok(d) => d,
            Err(SourceError::NotHeld) => return Err(Status::not_found("not held")),
            Err(SourceError::OtherVersion) => return Err(Status::failed_precondition("another version")),
            Err(SourceError::BadKey(e)) => return Err(Status::invalid_argument(e)),
            Err(SourceError::Failed(e)) => return Err(Status::unavailable(e)),
        };
        self.stats.served.fetch_add(1, Ordering::Relaxed);
        self.stats.served_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        let d = Bytes::copy_from_slice(&digest(&req.key));
        let (total, crc) = (data.len() as u64, crc32c::crc32c(&data));
        let chunks: Vec<Result<Chunk, Status>> = (0..data.len().max(1))
            .step_by(CHUNK)
            .map(|at| {
                Ok(Chunk {
                    digest: d.clone(),
                    offset: at as u64,
                    data: data.slice(at.min(data.len())..(at + CHUNK).min(data.len())),
                    total,
                    crc32c: crc,
                })
            })
            .collect();
        Ok(Response::new(Box::pin(Iter(chunks.into_iter()))))
    }
}

/// A stream over a list already made.
struct Iter(std::vec::IntoIter<Result<Chunk, Status>>);

impl futures::Stream for Iter {
    type Item = Result<Chunk, Status>;
    fn poll_next(mut self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        std::task::Poll::Ready(self.0.next())
    }
}

/// A node's peer server, serving until dropped.
pub struct PeerServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl PeerServer {
    /// Listen on `listen` (port 0: any) and serve units from `source`.
    pub fn start(
        listen: SocketAddr,
        source: Arc<dyn UnitSource>,
        stats: Arc<PeerStats>,
    ) -> std::io::Result<PeerServer> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("larder-peer-serve")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let incoming = {
            let _guard = runtime.enter();
            tonic::transport::server::TcpIncoming::from(tokio::net::TcpListener::from_std(listener)?)
                .with_nodelay(Some(true))
        };
        let service = RawServer::new(Service { source, stats })
            .max_decoding_message_size(64 << 10)
            .max_encoding_message_size(CHUNK + (64 << 10));
        runtime.spawn(async move {
            let served = Server::builder()
                .initial_stream_window_size(Some(STREAM_WINDOW))
                .initial_connection_window_size(Some(CONNECTION_WINDOW))
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the peer server stopped");
            }
        });
        Ok(PeerServer {
            addr,
            stop: Some(stop),
            runtime: Some(runtime),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// A peer's breaker: failures in a row, and until when it is open.
#[derive(Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

/// Asks peers for units.
pub struct PeerClient {
    cfg: PeerConfig,
    runtime: tokio::runtime::Runtime,
    /// By member: the address the channel goes to, and the channel.
    channels: Mutex<HashMap<MemberId, (String, Channel)>>,
    breakers: Mutex<HashMap<MemberId, Breaker>>,
    pub stats: Arc<PeerStats>,
    me: MemberId,
}

impl PeerClient {
    pub fn new(me: MemberId, cfg: PeerConfig, stats: Arc<PeerStats>) -> std::io::Result<PeerClient> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("larder-peer-ask")
            .enable_all()
            .build()?;
        Ok(PeerClient {
            cfg,
            runtime,
            channels: Mutex::default(),
            breakers: Mutex::default(),
            stats,
            me,
        })
    }

    fn channel(&self, peer: &MemberRecord) -> Result<Channel, PeerError> {
        let mut channels = larder_cache::contention::lock(&self.channels);
        if let Some((addr, ch)) = channels.get(&peer.id)
            && *addr == peer.addr
        {
            return Ok(ch.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{}", peer.addr))
            .map_err(|e| PeerError::Failed(format!("bad address {:?}: {e}", peer.addr)))?
            .connect_timeout(self.cfg.connect_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = {
            let _guard = self.runtime.enter();
            endpoint.connect_lazy()
        };
        channels.insert(peer.id, (peer.addr.clone(), ch.clone()));
        Ok(ch)
    }

    /// Whether `peer` may be asked now (its breaker is closed, or its cool-down is over: one trial).
    fn allowed(&self, peer: MemberId) -> Result<(), PeerError> {
        let mut b = larder_cache::contention::lock(&self.breakers);
        let e = b.entry(peer).or_default();
        match e.open_until {
            Some(until) if Instant::now() < until => Err(PeerError::Skipped(peer, e.failures)),
            Some(_) => {
                // Half open: this call is the trial; another failure opens it again at once.
                e.open_until = None;
                e.failures = self.cfg.failures.saturating_sub(1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn record(&self, peer: MemberId, failed: bool) {
        let mut b = larder_cache::contention::lock(&self.breakers);
        let e = b.entry(peer).or_default();
        if failed {
            e.failures += 1;
            if e.failures >= self.cfg.failures {
                e.open_until = Some(Instant::now() + self.cfg.cool_down);
                tracing::warn!(
                    peer = format!("{peer:016x}"),
                    failures = e.failures,
                    "a peer keeps failing: skipping it for a while"
                );
            }
        } else {
            *e = Breaker::default();
        }
    }

    /// The unit `ask` names, from `peer`.
    pub fn fetch(&self, peer: &MemberRecord, ask: &Ask) -> Result<Bytes, PeerError> {
        if let Err(e) = self.allowed(peer.id) {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        self.stats.fetches.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let channel = self.channel(peer)?;
        let request = FetchRequest {
            key: Bytes::copy_from_slice(ask.key),
            requester: self.me,
            forward: ask.forward,
            path: Bytes::copy_from_slice(ask.path),
            index: ask.index,
        };
        let timeout = self.cfg.timeout;
        let want = ask.digest;
        let result = self
            .runtime
            .block_on(async move { tokio::time::timeout(timeout, fetch_on(channel, request, want)).await })
            .unwrap_or(Err(PeerError::Timeout(timeout)));
        self.stats
            .nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match &result {
            Ok(data) => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                self.record(peer.id, false);
            }
            Err(PeerError::NotHeld | PeerError::OtherVersion) => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                self.record(peer.id, false);
            }
            Err(e) => {
                if matches!(e, PeerError::Corrupt(_)) {
                    self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = format!("{:016x}", peer.id), error = %e, "a peer fetch failed");
                self.record(peer.id, true);
            }
        }
        result
    }
}

/// One fetch over `channel`, every chunk checked.
async fn fetch_on(channel: Channel, request: FetchRequest, want: &UnitDigest) -> Result<Bytes, PeerError> {
    let mut client = RawClient::new(channel).max_decoding_message_size(CHUNK + (64 << 10));
    let mut stream = client.fetch(request).await.map_err(status_error)?.into_inner();
    let mut out: Vec<u8> = Vec::new();
    let mut expect: Option<(u64, u32)> = None;
    while let Some(chunk) = stream.message().await.map_err(status_error)? {
        if chunk.digest.as_ref() != want {
            return Err(PeerError::Corrupt("a chunk of another unit".into()));
        }
        if chunk.total > MAX_UNIT {
            return Err(PeerError::Corrupt(format!("a unit of {} bytes", chunk.total)));
        }
        match expect {
            None => {
                expect = Some((chunk.total, chunk.crc32c));
                out.reserve_exact(chunk.total as usize);
            }
            Some(e) if e != (chunk.total, chunk.crc32c) => {
                return Err(PeerError::Corrupt("chunks disagree on the unit".into()));
            }
            Some(_) => {}
        }
        if chunk.offset != out.len() as u64 || out.len() as u64 + chunk.data.len() as u64 > chunk.total {
            return Err(PeerError::Corrupt("a chunk out of place".into()));
        }
        out.extend_from_slice(&chunk.data);
    }
    let Some((total, crc)) = expect else {
        return Err(PeerError::Corrupt("no data".into()));
    };
    if out.len() as u64 != total {
        return Err(PeerError::Corrupt(format!("{} of {total} bytes", out.len())));
    }
    if crc32c::crc32c(&out) != crc {
        return Err(PeerError::Corrupt("checksum mismatch".into()));
    }
    Ok(Bytes::from(out))
}

fn status_error(s: Status) -> PeerError {
    match s.code() {
        tonic::Code::NotFound => PeerError::NotHeld,
        tonic::Code::FailedPrecondition => PeerError::OtherVersion,
        tonic::Code::DeadlineExceeded => PeerError::Timeout(Duration::ZERO),
        _ => PeerError::Failed(format!("{}: {}", s.code(), s.message())),
    }
}
