//! The peer server: answers other nodes' asks from a [`UnitSource`], admitting only live members
//! over mutual TLS.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status};

use super::proto::peer_server::{Peer, PeerServer as RawServer};
use super::proto::{
    Chunk, FetchRequest, HandOver, HandedOverRequest, ReadHeldRequest, ReleaseRequest, Released, Taken,
};
use super::*;
use crate::placement::UnitDigest;
use crate::tls;

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
        let released =
            tokio::task::block_in_place(|| self.source.release(&req.path, req.requester)).map_err(source_status)?;
        Ok(Response::new(match released {
            Release::Gone { revision, pushed } => {
                let (pushed_revision, pushed_version) = pushed.unwrap_or_default();
                Released {
                    revision,
                    hand_over: None,
                    pushed_revision,
                    pushed_version,
                }
            }
            Release::HandOver(h) => Released {
                revision: 0,
                pushed_revision: 0,
                pushed_version: String::new(),
                hand_over: Some(HandOver {
                    revision: h.revision,
                    base: h.base,
                    state: h.state.into(),
                }),
            },
        }))
    }

    async fn handed_over(&self, request: Request<HandedOverRequest>) -> Result<Response<Released>, Status> {
        let req = request.into_inner();
        let revision = tokio::task::block_in_place(|| {
            self.source
                .handed_over(&req.path, req.requester, req.revision, req.taken)
        })
        .map_err(source_status)?;
        Ok(Response::new(Released {
            revision,
            ..Default::default()
        }))
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

fn source_status(e: ServeError) -> Status {
    match e {
        ServeError::NotHeld => Status::not_found("not held"),
        ServeError::OtherVersion => Status::failed_precondition("another version"),
        ServeError::BadKey(e) => Status::invalid_argument(e),
        ServeError::Failed(e) => Status::unavailable(e),
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
