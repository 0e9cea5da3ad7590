//! larder's cluster: several larder nodes, on several hosts, as one cache.
//!
//! This crate holds what every node of a cluster must compute alike, and the transport between them:
//! - [`identity`]: a node's id, created once and kept in its cache directory, so that a node keeps its
//!   identity (and what it owns) across restarts and address changes;
//! - [`placement`]: which member owns a unit, and which to ask next, by weighted rendezvous hashing over
//!   the live members (design note 013);
//! - [`membership`]: the members' records and liveness in etcd, and each node's last view of them, which
//!   the I/O path reads without ever waiting for etcd;
//! - [`peer`]: the transport that serves units to peers and fetches them, every chunk checked;
//! - [`tls`]: the cluster's own certificate authority, the nodes' certificates, and the mutual-TLS
//!   configuration every peer connection uses (design note 014).
//!
//! And how a node's core ([`larder_fs`]) plugs into the cluster, through the core's own seams:
//! - [`tier`]: the other nodes as a tier between the store and home ([`tier::PeerTier`]);
//! - [`node`]: the core's read path as what the peer server serves, and migration instead of eviction;
//! - [`coherence`]: the core's `Coherence` (writes across the cluster, design note 016) over etcd and
//!   the peer protocol.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod coherence;
pub mod held;
pub mod identity;
pub mod locks;
pub mod membership;
pub mod node;
pub mod peer;
pub mod placement;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tier;
pub mod tls;

pub use identity::{IdentityError, node_id};
pub use membership::{MemberRecord, Membership, MembershipConfig, MembershipError, View};
pub use placement::{Member, MemberId, Placement, UnitDigest};
pub use tls::{EtcdTls, NodeTls, Peer, TlsError, fingerprint};

/// A small tokio runtime of the cluster's own, `threads` workers named `name`: the membership, the peer
/// server and the peer client each run one, so that their callers stay synchronous.
pub(crate) fn runtime(threads: usize, name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
}
