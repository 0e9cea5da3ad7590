//! The peer tier: the cluster's other nodes, between this node's store and home (design note 013).
//!
//! A unit's candidates are the live members that serve, in rendezvous order for its key. If this node is
//! the owner, the peers are not asked (home is next, and this node keeps the unit for the others). Else
//! the owner is asked first, allowed to fetch from home to answer (collapsed forwarding: one home read
//! for every node that wants the unit), then the next candidate, for what it holds only. Any failure is a
//! miss: the walk goes on to home. Content not yet pushed is never asked for, and a walk a peer started
//! never asks peers in turn.

use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use larder_cluster::Membership;
use larder_cluster::peer::{Ask, PeerClient};

use super::{Tier, TierError, Unit, Want};
use crate::key::Part;

/// Candidates asked for a unit: the owner, and the one after it.
const ASK: usize = 2;

/// The other nodes of the cluster.
pub struct PeerTier {
    membership: Arc<Membership>,
    client: Arc<PeerClient>,
}

impl PeerTier {
    pub fn new(membership: Arc<Membership>, client: Arc<PeerClient>) -> PeerTier {
        PeerTier { membership, client }
    }
}

impl Tier for PeerTier {
    fn name(&self) -> &'static str {
        "peer"
    }

    fn shared(&self) -> bool {
        true
    }

    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError> {
        if want.from_peer || !want.key.shareable() {
            return Ok(None);
        }
        let view = self.membership.view();
        let me = self.membership.me().id;
        let key = want.key.encode();
        let index = match want.key.part {
            Part::Block { index, .. } => index,
            Part::Whole { .. } => 0,
        };
        for (rank, id) in view.placement().candidates(&want.digest.0, ASK).into_iter().enumerate() {
            if id == me {
                if rank == 0 {
                    // This node owns the unit: home is next, and the unit is kept here for the others.
                    return Ok(None);
                }
                continue;
            }
            let Some(peer) = view.members.get(&id) else { continue };
            let ask = Ask {
                key: &key,
                digest: &want.digest.0,
                path: want.local.path.as_os_str().as_bytes(),
                index,
                forward: rank == 0,
            };
            match self.client.fetch(peer, &ask) {
                // The unit's buffer is the client's own: taken over, not copied.
                Ok(bytes) => return Ok(Some(Unit::new(want.digest, Arc::new(Vec::from(bytes))))),
                Err(e) => tracing::debug!(peer = %peer.name, key = %want.digest, error = %e, "a peer had nothing"),
            }
        }
        Ok(None)
    }
}
