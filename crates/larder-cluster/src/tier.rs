//! The peer tier: the cluster's other nodes, as a core [`Tier`] between a node's store and home (design
//! note 013).
//!
//! A unit's candidates are the live members that serve, in rendezvous order for its key; its hints are
//! the members that owned it before a recent membership change. If this node is the owner, only the hints
//! are asked, for what they hold (home is next, and this node keeps the unit for the others). Else the
//! owner is asked first, allowed to fetch from home to answer (collapsed forwarding: one home read for
//! every node that wants the unit), then the next candidate and the hints, for what they hold only. Any
//! failure is a miss: the walk goes on to home. Content not yet pushed is never asked for, and a walk a
//! peer started asks only the hints, never with leave to fetch: no ask goes round in circles.

use std::collections::{HashMap, VecDeque};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use larder_fs::key::Part;
use larder_fs::tier::{Tier, TierError, Unit, Want};

use crate::peer::{Ask, PeerClient};
use crate::{MemberId, Membership};

/// Candidates asked for a unit: the owner, and the one after it.
const ASK: usize = 2;

/// The other nodes of the cluster.
pub struct PeerTier {
    membership: Arc<Membership>,
    client: Arc<PeerClient>,
    whereabouts: Arc<Whereabouts>,
}

impl PeerTier {
    /// `whereabouts` are the notes of where this node's units went instead of being evicted.
    pub fn new(membership: Arc<Membership>, client: Arc<PeerClient>, whereabouts: Arc<Whereabouts>) -> PeerTier {
        PeerTier {
            membership,
            client,
            whereabouts,
        }
    }
}

/// Where units this node owned went when it evicted them (migration instead of eviction): asked for them
/// like a previous owner. The oldest notes are forgotten past [`Whereabouts::KEPT`].
#[derive(Default)]
pub struct Whereabouts(std::sync::Mutex<Notes>);

/// Where each unit went, by its digest, and the digests oldest first.
#[derive(Default)]
struct Notes {
    to: HashMap<[u8; 16], MemberId>,
    order: VecDeque<[u8; 16]>,
}

impl Whereabouts {
    /// Notes kept at most (about 40 bytes each).
    pub const KEPT: usize = 100_000;

    /// Note that unit `digest` went to member `to`.
    pub fn note(&self, digest: [u8; 16], to: MemberId) {
        let mut notes = larder_util::contention::lock(&self.0);
        if notes.to.insert(digest, to).is_none() {
            notes.order.push_back(digest);
        }
        while notes.order.len() > Self::KEPT {
            if let Some(old) = notes.order.pop_front() {
                notes.to.remove(&old);
            }
        }
    }

    /// Where unit `digest` went, if this node sent it away.
    pub fn of(&self, digest: &[u8; 16]) -> Option<MemberId> {
        larder_util::contention::lock(&self.0).to.get(digest).copied()
    }
}

impl Tier for PeerTier {
    fn name(&self) -> &'static str {
        "peer"
    }

    fn shared(&self) -> bool {
        true
    }

    /// The client checked each chunk's key digest and the whole unit against its CRC-32C as it came.
    fn checks_own_answers(&self) -> bool {
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
        // Where the unit may still be: where this node sent it, and its previous owners; never the member
        // whose ask this walk answers (it has not got it), unless it hands the unit over itself.
        let mut hints = view.previous_owners(digest);
        if let Some(to) = self.whereabouts.of(digest) {
            hints.insert(0, to);
        }
        hints.retain(|&id| Some(id) != want.asker);
        if let Some(from) = want.take_from {
            hints.insert(0, from);
        }
        for (id, forward) in asks(me, &candidates, &hints, want.asker.is_some()) {
            let Some(peer) = view.members.get(&id) else { continue };
            let ask = Ask {
                key: &key,
                digest,
                path: want.file.path.as_os_str().as_bytes(),
                index,
                forward,
                from: None,
                asker: me,
            };
            match self.client.fetch_checked(peer, &ask) {
                // The unit's buffer is the client's own: taken over, not copied; its checksum was checked
                // as it came, and is not computed again.
                Ok((bytes, crc32c)) => {
                    return Ok(Some(Unit {
                        data: Arc::new(Vec::from(bytes)),
                        crc32c,
                        key: want.digest,
                    }));
                }
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
    use super::{Whereabouts, asks};

    #[test]
    fn whereabouts_are_kept_for_the_newest_units_only() {
        let w = Whereabouts::default();
        let digest = |i: usize| {
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&(i as u64).to_le_bytes());
            d
        };
        for i in 0..Whereabouts::KEPT + 10 {
            w.note(digest(i), i as u64 % 3);
        }
        assert_eq!(w.of(&digest(0)), None, "the oldest notes are forgotten");
        assert_eq!(w.of(&digest(9)), None);
        assert_eq!(w.of(&digest(10)), Some(1));
        assert_eq!(
            w.of(&digest(Whereabouts::KEPT + 9)),
            Some((Whereabouts::KEPT as u64 + 9) % 3)
        );
        // A unit sent again goes where it went last.
        w.note(digest(10), 7);
        assert_eq!(w.of(&digest(10)), Some(7));
    }

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
