//! The peer tier: the cluster's other nodes, between this node's store and home (design note 013).
//!
//! A unit's candidates are the live members that serve, in rendezvous order for its key; its hints are
//! the members that owned it before a recent membership change. If this node is the owner, only the hints
//! are asked, for what they hold (home is next, and this node keeps the unit for the others). Else the
//! owner is asked first, allowed to fetch from home to answer (collapsed forwarding: one home read for
//! every node that wants the unit), then the next candidate and the hints, for what they hold only. Any
//! failure is a miss: the walk goes on to home. Content not yet pushed is never asked for, and a walk a
//! peer started asks only the hints, never with leave to fetch: no ask goes round in circles.

use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use larder_cluster::peer::{Ask, PeerClient};
use larder_cluster::{MemberId, Membership};

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
        if !want.key.shareable() {
            return Ok(None);
        }
        let view = self.membership.view();
        let me = self.membership.me().id;
        let digest = &want.digest.0;
        let candidates = view.placement().candidates(digest, ASK);
        let key = want.key.encode();
        let index = match want.key.part {
            Part::Block { index, .. } => index,
            Part::Whole { .. } => 0,
        };
        let mut hints = view.previous_owners(digest);
        if let Some(from) = want.take_from {
            hints.insert(0, from);
        }
        for (id, forward) in asks(me, &candidates, &hints, want.from_peer) {
            let Some(peer) = view.members.get(&id) else { continue };
            let ask = Ask {
                key: &key,
                digest,
                path: want.local.path.as_os_str().as_bytes(),
                index,
                forward,
                from: None,
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

/// Whom to ask for a unit, in order, and whether each may fetch it from home to answer (`forward`).
/// `candidates` are the unit's owner and the next in rendezvous order, `hints` its previous owners.
///
/// - This node owns the unit, or a peer asked it as the owner (`from_peer`): only the previous owners,
///   for what they hold; home is next, and the unit is kept here for the others. A join thus moves a
///   unit from its previous owner to its new one, not from home.
/// - Else the owner, which may fetch from home (and asks the previous owners itself first), then the
///   next candidate and the previous owners, for what they hold.
fn asks(me: MemberId, candidates: &[MemberId], hints: &[MemberId], from_peer: bool) -> Vec<(MemberId, bool)> {
    let mut out: Vec<(MemberId, bool)> = Vec::new();
    if !(from_peer || candidates.first() == Some(&me)) {
        out.extend(candidates.iter().enumerate().map(|(rank, &id)| (id, rank == 0)));
    }
    for &id in hints {
        out.push((id, false));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|&(id, _)| id != me && seen.insert(id));
    out
}

#[cfg(test)]
mod tests {
    use super::asks;

    #[test]
    fn an_owner_asks_only_previous_owners_and_others_ask_the_owner_first() {
        // Not the owner: the owner may fetch; the next candidate and the hints only give what they hold.
        assert_eq!(asks(9, &[1, 2], &[3], false), vec![(1, true), (2, false), (3, false)]);
        // A hint that is also the next candidate is asked once.
        assert_eq!(asks(9, &[1, 2], &[2], false), vec![(1, true), (2, false)]);
        // This node owns the unit: the previous owners, then home.
        assert_eq!(asks(1, &[1, 2], &[3], false), vec![(3, false)]);
        assert!(asks(1, &[1, 2], &[], false).is_empty());
        // Asked by a peer as the owner: the same, whatever this node's view says.
        assert_eq!(asks(2, &[1, 2], &[3], true), vec![(3, false)]);
        // This node second: it never asks itself.
        assert_eq!(asks(2, &[1, 2], &[], false), vec![(1, true)]);
    }
}
