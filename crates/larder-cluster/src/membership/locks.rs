//! The lock records of a file in etcd (design note 017): under `locks/<hex of the path>/`, a key per node
//! holding locks on it, `n/<node>`, under that node's lease (its locks go with it), and `gate`, rewritten
//! by every change of the file's locks, under the lease of the node that made it. A change is one
//! transaction made only if the gate is still the revision its maker read, so no two nodes grant each
//! other conflicting locks; and a node that finds the gate at its own last write knows no other node
//! changed its locks on the file since.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::{Membership, MembershipError, Shared};
use crate::placement::MemberId;

/// The lock records of one file as read at one revision.
pub struct LockRecords {
    /// Each node's value, by node.
    pub nodes: Vec<(MemberId, Vec<u8>)>,
    /// The gate's revision when read (0: none).
    pub gate: i64,
}

fn hex(path: &[u8]) -> String {
    path.iter().map(|b| format!("{b:02x}")).collect()
}

impl Shared {
    fn lock_prefix(&self, path: &[u8]) -> String {
        format!("{}locks/{}/", self.cfg.prefix(), hex(path))
    }

    /// A change of lock records arrived: wake the waiters.
    pub(super) fn lock_changed(&self) {
        let (count, changed) = &self.locks_changed;
        *count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        changed.notify_all();
    }
}

impl Membership {
    /// How many changes of lock records this node has seen: pass it to [`Membership::wait_for_locks`].
    pub fn locks_seen(&self) -> u64 {
        *self.shared.locks_changed.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until a change of lock records arrives after the `seen`-th, or `timeout` passes.
    pub fn wait_for_locks(&self, seen: u64, timeout: Duration) {
        let (count, changed) = &self.shared.locks_changed;
        let count = count.lock().unwrap_or_else(|p| p.into_inner());
        let _ = changed.wait_timeout_while(count, timeout, |c| *c == seen);
    }

    /// Every node's lock records of `path`, and the gate's revision.
    pub fn read_locks(&self, path: &[u8]) -> Result<LockRecords, MembershipError> {
        let prefix = self.shared.lock_prefix(path);
        let key = prefix.clone();
        let opts = GetOptions::new().with_prefix();
        let resp = self.call("a file's locks", async move |mut c| c.get(key, Some(opts)).await)?;
        Ok(records(&prefix, resp.kvs()))
    }

    /// Write this node's lock records of `path` (`None`: it holds none now) if the gate is still at
    /// `gate`: the revision it was written at and the held records' mark as of it (see
    /// [`Membership::sync_held_to`]), or, if another node changed the file's locks since, the records as
    /// they are now (read in the same transaction). (The gate stays once no node holds a lock: it goes
    /// with the lease of the node that wrote it last.)
    pub fn write_locks(
        &self,
        path: &[u8],
        gate: i64,
        mine: Option<Vec<u8>>,
    ) -> Result<Result<Written, LockRecords>, MembershipError> {
        let prefix = self.shared.lock_prefix(path);
        let node_key = format!("{prefix}n/{:016x}", self.shared.me.id);
        let gate_key = format!("{prefix}gate");
        let lease = self.shared.lease.load(Ordering::SeqCst) as i64;
        let under_lease = || Some(PutOptions::new().with_lease(lease));
        let ops = vec![
            match mine {
                Some(v) => TxnOp::put(node_key, v, under_lease()),
                None => TxnOp::delete(node_key, None),
            },
            TxnOp::put(gate_key.clone(), Vec::new(), under_lease()),
            TxnOp::get(self.shared.cfg.held_mark(), None),
        ];
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(gate_key, CompareOp::Equal, gate)])
            .and_then(ops)
            .or_else(vec![TxnOp::get(prefix.clone(), Some(GetOptions::new().with_prefix()))]);
        let resp = self.call("a file's locks", async move |mut c| c.txn(txn).await)?;
        let got = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        if resp.succeeded() {
            return Ok(Ok(Written {
                revision: resp.header().map_or(0, |h| h.revision()),
                held_mark: got.and_then(|g| g.kvs().first().map(|kv| kv.mod_revision())),
            }));
        }
        match got {
            Some(g) => Ok(Err(records(&prefix, g.kvs()))),
            None => self.read_locks(path).map(Err),
        }
    }
}

/// A change of a node's lock records etcd took.
pub struct Written {
    /// The revision it was written at.
    pub revision: i64,
    /// The held records' mark as of that revision (`None`: there is none yet).
    pub held_mark: Option<i64>,
}

/// The lock records under `prefix` among `kvs`.
fn records(prefix: &str, kvs: &[KeyValue]) -> LockRecords {
    let mut out = LockRecords {
        nodes: Vec::new(),
        gate: 0,
    };
    for kv in kvs {
        let Some(rest) = kv.key().strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        if rest == b"gate" {
            out.gate = kv.mod_revision();
        } else if let Some(node) = rest
            .strip_prefix(b"n/")
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        {
            out.nodes.push((node, kv.value().to_vec()));
        }
    }
    out
}
