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
//! Every connection is **mutual TLS** with the cluster's certificates (design note 014; there is no
//! plaintext mode). The server requires a client certificate from the cluster CA, then admits the
//! connection only if [`Admit`] says its certificate belongs to a live member (name and fingerprint as in
//! that member's record); it checks again at every call, so a member removed from the membership is
//! refused on the connections it already has. The client dials a member by its record's name (the
//! server's certificate must name it and chain to the CA) and refuses a server whose certificate's
//! fingerprint is not the record's. A handshake runs in a task of its own under
//! [`HANDSHAKE_TIMEOUT`]: a slow or garbage one holds up no one else. Refusals are counted
//! ([`PeerStats::refused`]) and logged once per peer.
//!
//! Callers are synchronous (the read path's threads): the client and the server each run a small tokio
//! runtime of their own.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
pub use prost::bytes::Bytes;
use rustls::{ClientConfig, ServerConfig};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use crate::membership::MemberRecord;
use crate::placement::{MemberId, UnitDigest};
use crate::tls;

/// The generated protocol.
pub mod proto {
    tonic::include_proto!("larder.peer.v1");
}

use proto::peer_client::PeerClient as RawClient;
use proto::peer_server::{Peer, PeerServer as RawServer};
use proto::{Chunk, FetchRequest, ReadHeldRequest, ReleaseRequest, Released, Taken};

/// How long a daemon's server waits for its view of the membership to admit a certificate it does not
/// know yet (a node that has just joined) before refusing the connection.
pub const ADMIT_GRACE: Duration = Duration::from_secs(2);

/// Bytes of a unit per chunk.
pub const CHUNK: usize = 256 << 10;
/// The largest unit a peer may announce: more is garbage, not a unit.
pub const MAX_UNIT: u64 = 256 << 20;
/// HTTP/2 windows: a stream's, and the connection's (several units in flight).
const STREAM_WINDOW: u32 = 8 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;
/// The largest HTTP/2 frame a node accepts: a chunk in one frame, rather than sixteen of the default
/// 16 KiB, each read, framed and copied on its own.
const MAX_FRAME: u32 = CHUNK as u32 + (16 << 10);
/// Longest a peer's TLS handshake may take on the server.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Peers whose refusal is logged (each once); past that, refusals are only counted.
const LOGGED_PEERS: usize = 1024;

/// Whether the peer at the other end of a connection is a member now: its certificate's name is a live
/// member's name, and its fingerprint that member's record's (`View::admits` does exactly this). Called
/// for each connection and each call, on the server's runtime: it must not wait (read the membership's
/// view, never etcd).
pub type Admit = Arc<dyn Fn(&tls::Peer) -> bool + Send + Sync>;

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
    /// A member to ask first for what it holds: the leaving member that hands the unit over.
    pub from: Option<MemberId>,
    /// The member asking, as the server got it (a client sends its own id whatever this says): the one
    /// a walk that answers the ask does not ask back.
    pub asker: MemberId,
}

/// Where a node's server gets the units it serves: its own read path (cache, then home when
/// forwarding).
pub trait UnitSource: Send + Sync + 'static {
    /// The unit `ask` names. With `ask.forward`, a unit not held may be fetched (from home) to answer,
    /// and kept.
    fn unit(&self, ask: &Ask) -> Result<Bytes, SourceError>;

    /// Up to `len` bytes at `offset` of the file at `path` whose changes this node holds, as of its held
    /// record written at `revision` (`OtherVersion` if it published a newer one since); with `link`, the
    /// symlink's target.
    fn read_held(&self, held: &HeldAsk) -> Result<Bytes, SourceError> {
        let _ = held;
        Err(SourceError::NotHeld)
    }

    /// Give up the write token of `path` to a peer that wants to change it: see `Release` in the protocol.
    /// The etcd revision at which this node's held records were gone.
    fn release(&self, path: &[u8]) -> Result<i64, SourceError> {
        let _ = path;
        Err(SourceError::NotHeld)
    }
}

/// A read of bytes a peer holds: see [`UnitSource::read_held`].
#[derive(Clone, Copy, Debug)]
pub struct HeldAsk<'a> {
    pub path: &'a [u8],
    pub revision: i64,
    pub offset: u64,
    pub len: u64,
    pub link: bool,
}

impl HeldAsk<'_> {
    /// What the answer's chunks name: the first 16 bytes of the SHA-256 of the request's fields.
    pub fn digest(&self) -> UnitDigest {
        let mut h = Sha256::new();
        h.update(b"held\0");
        h.update((self.path.len() as u64).to_le_bytes());
        h.update(self.path);
        h.update(self.revision.to_le_bytes());
        h.update(self.offset.to_le_bytes());
        h.update(self.len.to_le_bytes());
        h.update([self.link as u8]);
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize()[..16]);
        out
    }
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
    /// Units this node took over from members that left or migrated them here.
    pub taken: AtomicU64,
    /// Units this node owned that it sent to a member with room instead of evicting them, and their
    /// bytes; units evicted because no member had room, or because migration was over its rate.
    pub migrated: AtomicU64,
    pub migrated_bytes: AtomicU64,
    pub migrate_no_room: AtomicU64,
    pub migrate_over_rate: AtomicU64,
    /// Connections and calls the server refused: failed or timed-out TLS handshakes (no certificate, one
    /// from another CA, not TLS at all), and certificates that are not a live member's.
    pub refused: AtomicU64,
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
        let (data, unit_digest) = self.unit(req, false).await?;
        Ok(self.chunked(data, &unit_digest))
    }

    type ReadHeldStream = ChunkStream;

    async fn read_held(&self, request: Request<ReadHeldRequest>) -> Result<Response<ChunkStream>, Status> {
        let req = request.into_inner();
        let ask = HeldAsk {
            path: &req.path,
            revision: req.revision,
            offset: req.offset,
            len: req.len.min(MAX_UNIT),
            link: req.link,
        };
        let data = tokio::task::block_in_place(|| self.source.read_held(&ask)).map_err(source_status)?;
        Ok(self.chunked(data, &ask.digest()))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<Released>, Status> {
        let req = request.into_inner();
        let revision = tokio::task::block_in_place(|| self.source.release(&req.path)).map_err(source_status)?;
        Ok(Response::new(Released { revision }))
    }

    async fn take(&self, request: Request<FetchRequest>) -> Result<Response<Taken>, Status> {
        let (data, _) = self.unit(request.into_inner(), true).await?;
        self.stats.taken.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(Taken { len: data.len() as u64 }))
    }
}

impl Service {
    /// `data` as a stream of chunks naming `digest`, counted as served.
    fn chunked(&self, data: Bytes, digest: &UnitDigest) -> Response<ChunkStream> {
        self.stats.served.fetch_add(1, Ordering::Relaxed);
        self.stats.served_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        let d = Bytes::copy_from_slice(digest);
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
        Response::new(Box::pin(futures::stream::iter(chunks)))
    }

    /// The unit `req` names, from the source (fetched if `forward`; a take asks its requester first), and
    /// its key's digest.
    async fn unit(&self, req: FetchRequest, take: bool) -> Result<(Bytes, UnitDigest), Status> {
        let unit_digest = digest(&req.key);
        // The source blocks (a read of the cache, or of home for an owner): on this worker, which hands
        // its other tasks to another meanwhile, rather than on a thread of the blocking pool, a hop there
        // and back that costs a small unit more than its read.
        let unit = tokio::task::block_in_place(|| {
            self.source.unit(&Ask {
                key: &req.key,
                digest: &unit_digest,
                path: &req.path,
                index: req.index,
                forward: take || req.forward,
                from: take.then_some(req.requester),
                asker: req.requester,
            })
        });
        unit.map(|d| (d, unit_digest)).map_err(source_status)
    }
}

fn source_status(e: SourceError) -> Status {
    match e {
        SourceError::NotHeld => Status::not_found("not held"),
        SourceError::OtherVersion => Status::failed_precondition("another version"),
        SourceError::BadKey(e) => Status::invalid_argument(e),
        SourceError::Failed(e) => Status::unavailable(e),
    }
}

/// Who is at the other end of a connection the server accepted: tonic's connect info, in every request's
/// extensions.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub remote: SocketAddr,
    /// As its certificate says (checked against the membership when it connected).
    pub peer: tls::Peer,
}

/// An accepted connection: TLS done, the peer admitted.
struct PeerConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
}

impl Connected for PeerConn {
    type ConnectInfo = PeerInfo;
    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for PeerConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The admitted connections, as the stream tonic serves.
struct Admitted(tokio::sync::mpsc::Receiver<PeerConn>);

impl futures::Stream for Admitted {
    type Item = Result<PeerConn, std::io::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|c| c.map(Ok))
    }
}

/// The server's refusals: counted, and logged once per peer (by its certificate's name and fingerprint,
/// or by its address when it made no handshake).
struct Refusals {
    stats: Arc<PeerStats>,
    logged: Mutex<HashSet<String>>,
}

impl Refusals {
    fn refuse(&self, who: String, why: &str) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        let mut logged = larder_util::contention::lock(&self.logged);
        if logged.len() < LOGGED_PEERS && logged.insert(who.clone()) {
            tracing::warn!(peer = %who, "refused a peer: {why} (logged once per peer; counted in refused)");
        } else {
            tracing::debug!(peer = %who, "refused a peer: {why}");
        }
    }

    fn refuse_member(&self, remote: SocketAddr, peer: &tls::Peer) {
        let who = format!(
            "{} (certificate sha256 {}, from {})",
            peer.name,
            peer.fingerprint,
            remote.ip()
        );
        self.refuse(
            who,
            "its certificate is not a live member's (name and fingerprint as in its record)",
        );
    }
}

/// A node's peer server, serving until dropped.
pub struct PeerServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl PeerServer {
    /// Listen on `listen` (port 0: any) and serve units from `source` to the peers `admit` lets in, over
    /// mutual TLS with `tls` (which must require a client certificate: [`tls::NodeTls::server_config`]).
    ///
    /// A certificate `admit` refuses at the handshake is asked about again for up to `grace` before the
    /// connection is refused: a node that has just joined may reach this one a moment before this node's
    /// view of the membership has it ([`ADMIT_GRACE`] in a daemon; no grace in tests of refusals).
    pub fn start(
        listen: SocketAddr,
        tls: Arc<ServerConfig>,
        admit: Admit,
        grace: Duration,
        source: Arc<dyn UnitSource>,
        stats: Arc<PeerStats>,
    ) -> std::io::Result<PeerServer> {
        let service = Service {
            source,
            stats: stats.clone(),
        };
        PeerServer::start_with(listen, tls, admit, grace, stats, service)
    }

    /// Like [`PeerServer::start`], with any implementation of the protocol (tests: peers that lie).
    pub fn start_with<P: Peer>(
        listen: SocketAddr,
        tls: Arc<ServerConfig>,
        admit: Admit,
        grace: Duration,
        stats: Arc<PeerStats>,
        service: P,
    ) -> std::io::Result<PeerServer> {
        let runtime = crate::runtime(2, "larder-peer-serve")?;
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let refusals = Arc::new(Refusals {
            stats,
            logged: Mutex::default(),
        });
        let (admitted, incoming) = tokio::sync::mpsc::channel(64);
        runtime.spawn(accept(
            listener,
            TlsAcceptor::from(tls),
            admit.clone(),
            grace,
            refusals.clone(),
            admitted,
        ));
        // Checked again at every call: a member removed since it connected is refused on its connection.
        let check = move |request: Request<()>| -> Result<Request<()>, Status> {
            match request.extensions().get::<PeerInfo>() {
                Some(info) if admit(&info.peer) => Ok(request),
                Some(info) => {
                    refusals.refuse_member(info.remote, &info.peer);
                    Err(Status::permission_denied("not a live member of this cluster"))
                }
                None => Err(Status::permission_denied("no peer certificate")),
            }
        };
        let service = InterceptedService::new(
            RawServer::new(service)
                .max_decoding_message_size(64 << 10)
                .max_encoding_message_size(CHUNK + (64 << 10)),
            check,
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let served = Server::builder()
                .max_frame_size(Some(MAX_FRAME))
                .initial_stream_window_size(Some(STREAM_WINDOW))
                .initial_connection_window_size(Some(CONNECTION_WINDOW))
                .add_service(service)
                .serve_with_incoming_shutdown(Admitted(incoming), async {
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

/// Accept connections, each handshake and admission in a task of its own; the admitted ones go to tonic.
async fn accept(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    admit: Admit,
    grace: Duration,
    refusals: Arc<Refusals>,
    admitted: tokio::sync::mpsc::Sender<PeerConn>,
) {
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %e, "cannot accept a peer connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, admit, refusals, admitted) =
            (acceptor.clone(), admit.clone(), refusals.clone(), admitted.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return refusals.refuse(remote.ip().to_string(), &format!("TLS handshake failed: {e}")),
                Err(_) => {
                    return refusals.refuse(
                        remote.ip().to_string(),
                        &format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
                    );
                }
            };
            let peer = match tls::peer(stream.get_ref().1) {
                Ok(p) => p,
                Err(e) => return refusals.refuse(remote.ip().to_string(), &e.to_string()),
            };
            // A node that has just joined may be here before this node's view has it: ask again, a while.
            let deadline = tokio::time::Instant::now() + grace;
            while !admit(&peer) {
                if tokio::time::Instant::now() >= deadline {
                    return refusals.refuse_member(remote, &peer);
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            let _ = admitted
                .send(PeerConn {
                    stream,
                    info: PeerInfo { remote, peer },
                })
                .await;
        });
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

/// What a cached channel was made for: a member's record changing any of it means a new channel.
#[derive(Clone, PartialEq, Eq)]
struct Dialled {
    addr: String,
    name: String,
    fingerprint: String,
}

impl Dialled {
    fn of(peer: &MemberRecord) -> Dialled {
        Dialled {
            addr: peer.addr.clone(),
            name: peer.name.clone(),
            fingerprint: peer.fingerprint.clone(),
        }
    }
}

/// Asks peers for units.
pub struct PeerClient {
    cfg: PeerConfig,
    runtime: tokio::runtime::Runtime,
    tls: Arc<ClientConfig>,
    /// By member: what the channel was made for, and the channel.
    channels: Mutex<HashMap<MemberId, (Dialled, Channel)>>,
    /// Members and the certificates they presented that did not match their records, logged once each.
    mismatches: Arc<Mutex<HashSet<(MemberId, String)>>>,
    breakers: Mutex<HashMap<MemberId, Breaker>>,
    pub stats: Arc<PeerStats>,
    me: MemberId,
}

impl PeerClient {
    /// A client for node `me`, connecting with `tls` (the cluster CA its only root, this node's
    /// certificate its client authentication: [`tls::NodeTls::client_config`]).
    pub fn new(
        me: MemberId,
        cfg: PeerConfig,
        tls: Arc<ClientConfig>,
        stats: Arc<PeerStats>,
    ) -> std::io::Result<PeerClient> {
        let runtime = crate::runtime(2, "larder-peer-ask")?;
        Ok(PeerClient {
            cfg,
            runtime,
            tls,
            channels: Mutex::default(),
            mismatches: Arc::default(),
            breakers: Mutex::default(),
            stats,
            me,
        })
    }

    fn channel(&self, peer: &MemberRecord) -> Result<Channel, PeerError> {
        let dialled = Dialled::of(peer);
        let mut channels = larder_util::contention::lock(&self.channels);
        if let Some((d, ch)) = channels.get(&peer.id)
            && *d == dialled
        {
            return Ok(ch.clone());
        }
        let server_name =
            tls::server_name(&peer.name).map_err(|e| PeerError::Failed(format!("member {:016x}: {e}", peer.id)))?;
        let endpoint = Endpoint::from_shared(format!("http://{}", peer.addr))
            .map_err(|e| PeerError::Failed(format!("bad address {:?}: {e}", peer.addr)))?
            .max_frame_size(MAX_FRAME)
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let connector = TlsConnector::from(self.tls.clone());
        let timeout = self.cfg.connect_timeout;
        let (id, target, mismatches) = (peer.id, dialled.clone(), self.mismatches.clone());
        // TCP, then TLS with the member's name, then its record's fingerprint; all within the connect timeout.
        let connect = tower::service_fn(move |_: Uri| {
            let (connector, server_name, target, mismatches) = (
                connector.clone(),
                server_name.clone(),
                target.clone(),
                mismatches.clone(),
            );
            async move {
                let handshake = async {
                    let tcp = TcpStream::connect(target.addr.as_str()).await?;
                    tcp.set_nodelay(true)?;
                    connector.connect(server_name, tcp).await
                };
                let stream = tokio::time::timeout(timeout, handshake).await.map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no TLS connection to {} within {timeout:?}", target.addr),
                    )
                })??;
                let got = tls::peer(stream.get_ref().1).map_err(std::io::Error::other)?;
                if got.fingerprint != target.fingerprint {
                    let mut logged = larder_util::contention::lock(&mismatches);
                    if logged.len() < LOGGED_PEERS && logged.insert((id, got.fingerprint.clone())) {
                        tracing::warn!(
                        peer = format!("{id:016x}"),
                        name = %target.name,
                        presented = %got.fingerprint,
                        recorded = %target.fingerprint,
                        "refused a peer: its certificate is not the one in its membership record (logged once)"
                        );
                    }
                    drop(logged);
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "{} presented certificate sha256 {}, its record says {}",
                            target.name, got.fingerprint, target.fingerprint
                        ),
                    ));
                }
                Ok(TokioIo::new(stream))
            }
        });
        let ch = {
            let _guard = self.runtime.enter();
            endpoint.connect_with_connector_lazy(connect)
        };
        channels.insert(peer.id, (dialled, ch.clone()));
        Ok(ch)
    }

    /// Whether `peer` may be asked now (its breaker is closed, or its cool-down is over: one trial).
    fn allowed(&self, peer: MemberId) -> Result<(), PeerError> {
        let mut b = larder_util::contention::lock(&self.breakers);
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
        let mut b = larder_util::contention::lock(&self.breakers);
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

    /// Ask `peer`, the new owner of the unit `ask` names, to take it over from this node (which is
    /// leaving); its length once kept there. Not counted as a fetch; a failure counts on the peer's breaker.
    pub fn take(&self, peer: &MemberRecord, ask: &Ask) -> Result<u64, PeerError> {
        self.allowed(peer.id)?;
        let channel = self.channel(peer)?;
        let request = self.request(ask);
        let result = self.within_timeout(async move {
            let mut client = RawClient::new(channel);
            let taken = client.take(request).await.map_err(status_error)?;
            Ok(taken.into_inner().len)
        });
        let failed = !matches!(result, Ok(_) | Err(PeerError::NotHeld | PeerError::OtherVersion));
        self.record(peer.id, failed);
        result
    }

    /// Run `call` on the client's runtime, given up after the timeout of one unit.
    fn within_timeout<T>(&self, call: impl Future<Output = Result<T, PeerError>>) -> Result<T, PeerError> {
        let timeout = self.cfg.timeout;
        // The timer is made inside the runtime: it needs the runtime's clock.
        self.runtime
            .block_on(async move { tokio::time::timeout(timeout, call).await })
            .unwrap_or(Err(PeerError::Timeout(timeout)))
    }

    fn request(&self, ask: &Ask) -> FetchRequest {
        FetchRequest {
            key: Bytes::copy_from_slice(ask.key),
            requester: self.me,
            forward: ask.forward,
            path: Bytes::copy_from_slice(ask.path),
            index: ask.index,
        }
    }

    /// Bytes `held` names, from `peer`, which holds them (not counted as a unit fetch; a failure counts
    /// on the peer's breaker).
    pub fn read_held(&self, peer: &MemberRecord, held: &HeldAsk) -> Result<Bytes, PeerError> {
        self.allowed(peer.id)?;
        let channel = self.channel(peer)?;
        let request = ReadHeldRequest {
            path: Bytes::copy_from_slice(held.path),
            revision: held.revision,
            offset: held.offset,
            len: held.len,
            link: held.link,
            requester: self.me,
        };
        let want = held.digest();
        let result = self.within_timeout(async move {
            let mut client = RawClient::new(channel).max_decoding_message_size(CHUNK + (64 << 10));
            let stream = client.read_held(request).await.map_err(status_error)?.into_inner();
            collect(stream, &want).await.map(|(data, _)| data)
        });
        let failed = !matches!(result, Ok(_) | Err(PeerError::NotHeld | PeerError::OtherVersion));
        self.record(peer.id, failed);
        result
    }

    /// Ask `peer` to give up the write token of `path` (pushing its changes to home first), waiting at
    /// most `within`.
    pub fn release(&self, peer: &MemberRecord, path: &[u8], within: Duration) -> Result<i64, PeerError> {
        self.allowed(peer.id)?;
        let channel = self.channel(peer)?;
        let request = ReleaseRequest {
            path: Bytes::copy_from_slice(path),
            requester: self.me,
        };
        let result = self
            .runtime
            .block_on(async move {
                tokio::time::timeout(within, async move {
                    RawClient::new(channel)
                        .release(request)
                        .await
                        .map(|r| r.into_inner().revision)
                        .map_err(status_error)
                })
                .await
            })
            .unwrap_or(Err(PeerError::Timeout(within)));
        self.record(
            peer.id,
            matches!(result, Err(PeerError::Timeout(_) | PeerError::Failed(_))),
        );
        result
    }

    /// The unit `ask` names, from `peer`.
    pub fn fetch(&self, peer: &MemberRecord, ask: &Ask) -> Result<Bytes, PeerError> {
        self.fetch_checked(peer, ask).map(|(data, _)| data)
    }

    /// The unit `ask` names, from `peer`, and the CRC-32C every byte of it was checked against: the
    /// caller need not compute it again.
    pub fn fetch_checked(&self, peer: &MemberRecord, ask: &Ask) -> Result<(Bytes, u32), PeerError> {
        if let Err(e) = self.allowed(peer.id) {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        self.stats.fetches.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let channel = self.channel(peer)?;
        let request = self.request(ask);
        let result = self.within_timeout(fetch_on(channel, request, ask.digest));
        self.stats
            .nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match &result {
            Ok((data, _)) => {
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

/// One fetch over `channel`, every chunk checked; the unit and its CRC-32C.
async fn fetch_on(channel: Channel, request: FetchRequest, want: &UnitDigest) -> Result<(Bytes, u32), PeerError> {
    let mut client = RawClient::new(channel).max_decoding_message_size(CHUNK + (64 << 10));
    let stream = client.fetch(request).await.map_err(status_error)?.into_inner();
    collect(stream, want).await
}

/// The chunks of `stream`, every one checked against `want` and all of them against their checksum.
async fn collect(mut stream: tonic::Streaming<Chunk>, want: &UnitDigest) -> Result<(Bytes, u32), PeerError> {
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
    Ok((Bytes::from(out), crc))
}

fn status_error(s: Status) -> PeerError {
    match s.code() {
        tonic::Code::NotFound => PeerError::NotHeld,
        tonic::Code::FailedPrecondition => PeerError::OtherVersion,
        tonic::Code::DeadlineExceeded => PeerError::Timeout(Duration::ZERO),
        _ => PeerError::Failed(format!("{}: {}", s.code(), s.message())),
    }
}
