//! The peer client: asks other nodes for units, checking every chunk, with a circuit breaker per peer.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::Status;
use tonic::transport::{Channel, Endpoint, Uri};

use super::proto::peer_client::PeerClient as RawClient;
use super::proto::{Chunk, FetchRequest, HandedOverRequest, ReadHeldRequest, ReleaseRequest};
use super::*;
use crate::membership::MemberRecord;
use crate::placement::{MemberId, UnitDigest};
use crate::tls;

/// Longest a peer may take to answer that a hand-over was taken (it drops its copy of the changes).
const HANDED_OVER_WITHIN: Duration = Duration::from_secs(10);

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

    /// Ask `peer` to give up the write token of `path` (pushing its changes to home first, or handing them
    /// over), waiting at most `within`.
    pub fn release(&self, peer: &MemberRecord, path: &[u8], within: Duration) -> Result<Release, PeerError> {
        self.allowed(peer.id)?;
        let channel = self.channel(peer)?;
        let request = ReleaseRequest {
            path: Bytes::copy_from_slice(path),
            requester: self.me,
        };
        let holder = peer.id;
        self.within(peer, within, async move {
            let r = RawClient::new(channel).release(request).await?.into_inner();
            Ok(match r.hand_over {
                None => Release::Gone {
                    revision: r.revision,
                    pushed: (r.pushed_revision != 0 && !r.pushed_version.is_empty())
                        .then_some((r.pushed_revision, r.pushed_version)),
                },
                Some(h) => Release::HandOver(larder_fs::coherence::Handover {
                    holder,
                    revision: h.revision,
                    base: h.base,
                    state: h.state.to_vec(),
                }),
            })
        })
    }

    /// Answer `peer`'s hand-over of `path` at `revision`: see `HandedOver` in the protocol.
    pub fn handed_over(&self, peer: &MemberRecord, path: &[u8], revision: i64, taken: bool) -> Result<i64, PeerError> {
        self.allowed(peer.id)?;
        let channel = self.channel(peer)?;
        let request = HandedOverRequest {
            path: Bytes::copy_from_slice(path),
            requester: self.me,
            revision,
            taken,
        };
        self.within(peer, HANDED_OVER_WITHIN, async move {
            Ok(RawClient::new(channel)
                .handed_over(request)
                .await?
                .into_inner()
                .revision)
        })
    }

    /// `call` to `peer`, waiting at most `within`; a failure or timeout counts against the peer.
    fn within<T>(
        &self,
        peer: &MemberRecord,
        within: Duration,
        call: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, PeerError> {
        let result = self
            .runtime
            .block_on(
                async move { tokio::time::timeout(within, async move { call.await.map_err(status_error) }).await },
            )
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
