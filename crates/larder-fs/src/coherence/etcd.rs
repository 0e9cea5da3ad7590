//! [`Coherence`] over the cluster's etcd (the held records, kept by the membership's watch) and the peer
//! protocol (bytes a holder has), and the keeper that retries what could not be published and removes
//! this node's records once home has all its changes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use larder_cluster::Membership;
use larder_cluster::peer::{HeldAsk, PeerClient, PeerError};
use larder_home::{HomeError, HomeResult};

use super::{Coherence, HeldRecord};
use crate::namespace::Fs;

/// How often the keeper looks at this node's records.
const KEEP_EVERY: Duration = Duration::from_millis(200);

pub struct EtcdCoherence {
    membership: Arc<Membership>,
    client: Arc<PeerClient>,
    /// Paths whose records could not be written (etcd away): written again by the keeper.
    unpublished: Mutex<BTreeSet<Vec<u8>>>,
    /// Read the records before each open (close-to-open), rather than rely on the watch alone.
    sync: bool,
}

fn decode(value: &[u8]) -> Option<HeldRecord> {
    serde_json::from_slice(value).ok()
}

impl EtcdCoherence {
    pub fn new(membership: Arc<Membership>, client: Arc<PeerClient>, sync: bool) -> Arc<EtcdCoherence> {
        Arc::new(EtcdCoherence {
            membership,
            client,
            unpublished: Mutex::new(BTreeSet::new()),
            sync,
        })
    }

    /// Follow the records for `fs`: drop what it cached of every path another node's record changed,
    /// and start the keeper.
    pub fn attach(self: &Arc<Self>, fs: &Arc<Fs>) {
        let weak = Arc::downgrade(fs);
        self.membership.held().set_hook(Box::new(move |path| {
            if let Some(fs) = weak.upgrade() {
                fs.invalidate_path(path);
            }
        }));
        fs.set_coherence(self.clone());
        let me = Arc::downgrade(self);
        let fs = Arc::downgrade(fs);
        let _ = std::thread::Builder::new()
            .name("larder-held".into())
            .spawn(move || keep(me, fs));
    }

    /// This node's records and their revisions.
    fn own(&self) -> Vec<(Vec<u8>, i64)> {
        let me = self.me();
        self.membership
            .held()
            .all()
            .into_iter()
            .filter(|(_, h)| decode(&h.value).is_some_and(|r| r.holder == me))
            .map(|(p, h)| (p, h.revision))
            .collect()
    }
}

/// Every [`KEEP_EVERY`]: write again what could not be published, and once this node's journal is
/// empty (home has every change), remove its records, each only if it is still the one read (a change
/// published meanwhile keeps its record).
fn keep(c: Weak<EtcdCoherence>, fs: Weak<Fs>) {
    loop {
        std::thread::sleep(KEEP_EVERY);
        let (Some(c), Some(fs)) = (c.upgrade(), fs.upgrade()) else {
            return;
        };
        if !c.membership.online() {
            continue;
        }
        let retry: Vec<Vec<u8>> = std::mem::take(&mut *c.unpublished.lock().unwrap())
            .into_iter()
            .collect();
        if !retry.is_empty() {
            c.publish(fs.held_records(c.me(), retry));
        }
        if fs.journal_stats().pending_ops != 0 || !c.unpublished.lock().unwrap().is_empty() {
            continue;
        }
        let own = c.own();
        if own.is_empty() || fs.journal_stats().pending_ops != 0 {
            continue;
        }
        for (path, revision) in own {
            if let Err(e) = c.membership.unpublish_held(&path, revision) {
                tracing::debug!(error = %e, "could not remove a held record; trying again later");
                break;
            }
        }
    }
}

impl Coherence for EtcdCoherence {
    fn me(&self) -> u64 {
        self.membership.me().id
    }

    fn record(&self, path: &[u8]) -> Option<(HeldRecord, i64)> {
        let h = self.membership.held().get(path)?;
        Some((decode(&h.value)?, h.revision))
    }

    fn children(&self, dir: &[u8]) -> Vec<(Vec<u8>, HeldRecord, i64)> {
        self.membership
            .held()
            .children(dir)
            .into_iter()
            .filter_map(|(name, h)| Some((name, decode(&h.value)?, h.revision)))
            .collect()
    }

    fn live(&self, node: u64) -> bool {
        self.membership.view().live.contains(&node)
    }

    fn read_held(&self, holder: u64, ask: &HeldAsk) -> HomeResult<Vec<u8>> {
        let view = self.membership.view();
        let Some(member) = view.members.get(&holder) else {
            return Err(HomeError::Os(libc::EIO));
        };
        match self.client.read_held(member, ask) {
            Ok(data) => Ok(data.to_vec()),
            // The holder published another version, or pushed and forgot this one: ask again.
            Err(PeerError::OtherVersion | PeerError::NotHeld) => Err(HomeError::Stale),
            Err(e) => {
                tracing::warn!(holder = format!("{holder:016x}"), error = %e, "the node holding a file's changes did not give them");
                Err(HomeError::Os(libc::EIO))
            }
        }
    }

    fn sync(&self) {
        if !self.sync {
            return;
        }
        if let Err(e) = self.membership.sync_held() {
            tracing::debug!(error = %e, "could not read the held records; going on with what this node knows");
        }
    }

    fn publish(&self, records: Vec<(Vec<u8>, HeldRecord)>) {
        if records.is_empty() {
            return;
        }
        let encoded: Vec<(Vec<u8>, Vec<u8>)> = records
            .iter()
            .map(|(p, r)| (p.clone(), serde_json::to_vec(r).expect("a record serialises")))
            .collect();
        if let Err(e) = self.membership.publish_held(&encoded) {
            tracing::warn!(error = %e, "could not publish changes to the cluster; retrying");
            self.unpublished
                .lock()
                .unwrap()
                .extend(records.into_iter().map(|(p, _)| p));
        }
    }
}
