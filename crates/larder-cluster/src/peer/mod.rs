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

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use prost::bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::placement::{MemberId, UnitDigest};
use crate::tls;

/// The generated protocol.
pub mod proto {
    tonic::include_proto!("larder.peer.v1");
}

mod client;
mod server;

pub use client::PeerClient;
pub use server::{PeerInfo, PeerServer};

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

/// What a node's read path says when a peer asks it for a unit: the core's own answer.
pub use larder_fs::serve::ServeError;

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
    fn unit(&self, ask: &Ask) -> Result<Bytes, ServeError>;

    /// Up to `len` bytes at `offset` of the file at `path` whose changes this node holds, as of its held
    /// record written at `revision` (`OtherVersion` if it published a newer one since); with `link`, the
    /// symlink's target.
    fn read_held(&self, held: &HeldAsk) -> Result<Bytes, ServeError> {
        let _ = held;
        Err(ServeError::NotHeld)
    }

    /// Give up the write token of `path` to `requester`, a peer that wants to change it: see `Release` in
    /// the protocol.
    fn release(&self, path: &[u8], requester: MemberId) -> Result<Release, ServeError> {
        let _ = (path, requester);
        Err(ServeError::NotHeld)
    }

    /// `requester` answered the hand-over of `path` this node made at `revision`: see `HandedOver` in the
    /// protocol. The etcd revision at which this node's record of it was gone (0: replaced).
    fn handed_over(&self, path: &[u8], requester: MemberId, revision: i64, taken: bool) -> Result<i64, ServeError> {
        let _ = (path, requester, revision, taken);
        Err(ServeError::NotHeld)
    }
}

/// How a peer gave a write token up: see `Release` in the protocol.
#[derive(Clone, Debug, PartialEq)]
pub enum Release {
    /// Its changes are at home, and its held records were gone at this etcd revision (0: it had none of
    /// the path). `pushed`: the revision of its last record of the path and the version home has of it.
    Gone {
        revision: i64,
        pushed: Option<(i64, String)>,
    },
    /// Home could not take its changes: they are handed over (its `holder` is the peer).
    HandOver(larder_fs::coherence::Handover),
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
