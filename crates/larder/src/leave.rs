//! `larder cluster leave MNT`: a node hands the units it owns to their new owners, then unmounts
//! (design note 013).
//!
//! The node first says in etcd that it is leaving: from then on every node's placement leaves it out, so
//! each of its units has a new owner, and the node is still asked for what it holds (a hint). Then it asks
//! each new owner to take each unit it owned over (`Take`): the new owner gets the unit through its own
//! read path, asking the leaving node first, and keeps it. A unit that cannot be handed over is left for
//! home: nothing is lost, since what a node holds for the cluster is clean, home's version.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use larder_cluster::node::take_ask;
use larder_cluster::peer::PeerClient;
use larder_cluster::{Member, Membership, Placement};
use larder_fs::Fs;
use larder_fs::serve::HeldUnit;
use serde::{Deserialize, Serialize};

/// Units handed over at once.
const AT_ONCE: usize = 8;
/// How long to wait for etcd to say this node is leaving.
const HEARD_WITHIN: Duration = Duration::from_secs(10);

/// What handing over did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HandedOver {
    /// Units this node owned and held.
    pub owned: u64,
    /// Units its new owner took, and their bytes.
    pub units: u64,
    pub bytes: u64,
    /// Units not taken (the new owner unreachable or refusing, or time ran out): home has them.
    pub failed: u64,
    pub seconds: f64,
}

/// Say this node is leaving, and hand its owned units over within `time`.
pub fn hand_over(fs: &Fs, membership: &Membership, client: &PeerClient, time: Duration) -> Result<HandedOver> {
    let started = Instant::now();
    membership.start_leaving();
    while !membership.heard() {
        if started.elapsed() > HEARD_WITHIN {
            bail!("etcd did not take this node's leaving within {HEARD_WITHIN:?}: nothing handed over");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let view = membership.view();
    let me = membership.me();
    // What this node owned: the placement of the members that own units now, and this node.
    let before = Placement::new(view.serving().chain([me]).map(|r| Member {
        id: r.id,
        weight: r.weight,
    }));
    let owned: Vec<HeldUnit> = fs
        .held_units()
        .into_iter()
        .filter(|u| before.owner(&u.digest) == Some(me.id))
        .collect();
    let (units, bytes, failed) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let next = AtomicUsize::new(0);
    let deadline = started + time;
    std::thread::scope(|s| {
        for _ in 0..AT_ONCE {
            s.spawn(|| {
                while let Some(u) = owned.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let to = view.placement().owner(&u.digest).and_then(|id| view.members.get(&id));
                    let taken = match to {
                        Some(peer) if Instant::now() < deadline => client.take(peer, &take_ask(u)).map_err(|e| e.to_string()),
                        Some(_) => Err("out of time".into()),
                        None => Err("no member owns units".into()),
                    };
                    match taken {
                        Ok(len) => {
                            units.fetch_add(1, Ordering::Relaxed);
                            bytes.fetch_add(len, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(path = %u.path.display(), index = u.index, error = %e, "a unit was not handed over");
                        }
                    }
                }
            });
        }
    });
    let done = HandedOver {
        owned: owned.len() as u64,
        units: units.into_inner(),
        bytes: bytes.into_inner(),
        failed: failed.into_inner(),
        seconds: started.elapsed().as_secs_f64(),
    };
    tracing::info!(
        owned = done.owned,
        handed = done.units,
        bytes = done.bytes,
        failed = done.failed,
        "handed this node's units over to their new owners"
    );
    Ok(done)
}
