//! Membership on etcd: who is in the cluster, where to reach them, and who is alive.
//!
//! Keys, under `/larder/<cluster name>/`:
//! - `members/<id>`: a member's permanent record ([`MemberRecord`]: id, name, address, weight,
//!   certificate fingerprint, whether it serves peers), written at every join, so that an address change
//!   is followed: peers are looked up by id.
//! - `live/<id>`: present while the member is alive, under an etcd lease of [`MembershipConfig::ttl`]
//!   renewed every [`MembershipConfig::renew_every`]. A member that dies stops renewing, and etcd removes
//!   the key when the lease runs out.
//!
//! A node keeps a [`View`] of both, loaded at join and kept current by a watch. [`Membership::view`] only
//! reads that snapshot: etcd being slow or away never reaches the I/O path. While etcd is away the last
//! view stands (members alive then are still asked; a dead one costs a read a timeout and a skip), and
//! the keeper keeps trying: once etcd answers again, the node registers anew (its liveness key under a
//! new lease; the old lease, if it still lives, runs out unused) and reloads the view before it watches
//! again. [`Membership::lease_ok`] says whether this
//! node renewed within half the TTL: a node that cannot should stop acting as an owner, since the others
//! may already consider it gone.
//!
//! The background work runs on a small tokio runtime of its own, so that callers stay synchronous.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity, PutOptions, TlsOptions,
    Txn, TxnOp, WatchOptions,
};
use serde::{Deserialize, Serialize};

mod locks;
pub use locks::{LockRecords, Written};

use crate::held::{Held, HeldMap};
use crate::placement::{Member, MemberId, Placement};

/// A member's permanent record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub id: MemberId,
    /// The node's name (its certificate's name; by default the host name).
    pub name: String,
    /// Where peers reach it (`host:port`).
    pub addr: String,
    /// Its weight in placement: its cache size in bytes.
    pub weight: u64,
    /// SHA-256 of its certificate, lowercase hex: a peer presenting another certificate is not it.
    pub fingerprint: String,
    /// Whether it serves units to peers (`--peer-serve off`: a client that only reads).
    pub serve: bool,
}

/// What a live member says of itself now, in its liveness key: changes while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Liveness {
    /// Bytes its cache could take without evicting.
    #[serde(default)]
    pub free: u64,
    /// It is handing its units over before it goes: it owns nothing new, and is still asked for what it
    /// holds.
    #[serde(default)]
    pub leaving: bool,
}

/// What a node knows of the cluster at one moment.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every member ever registered, by id.
    pub members: BTreeMap<MemberId, MemberRecord>,
    /// The ids whose liveness key exists.
    pub live: BTreeSet<MemberId>,
    /// What each live member last said of itself.
    pub liveness: BTreeMap<MemberId, Liveness>,
    /// The etcd revision this view reflects.
    pub revision: i64,
    /// The placement over the live members that serve, made once when the view is published.
    placement: Arc<Placement>,
    /// The placements this one replaced within the hint window, newest first, each with when it was
    /// replaced: a unit's previous owners still hold it for a while after a change.
    replaced: Vec<(Arc<Placement>, Instant)>,
}

impl View {
    /// The live members that serve and are not leaving, with their records: those that own units.
    pub fn serving(&self) -> impl Iterator<Item = &MemberRecord> {
        self.live
            .iter()
            .filter(|id| !self.liveness.get(id).is_some_and(|l| l.leaving))
            .filter_map(|id| self.members.get(id))
            .filter(|r| r.serve)
    }

    /// Whether the holder of a certificate is a live member: a live member's record has the certificate's
    /// name and fingerprint. What a peer server admits.
    pub fn admits(&self, peer: &crate::tls::Peer) -> bool {
        self.live
            .iter()
            .filter_map(|id| self.members.get(id))
            .any(|r| r.name == peer.name && r.fingerprint == peer.fingerprint)
    }

    /// The placement over the live members that serve.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Hints (as in Coopc-PVFS): the members that owned `unit` under the placements replaced within the
    /// hint window and own it no longer, newest first, each once, live ones only (a member that is
    /// leaving still counts: it is handing its units over). They may still hold it when its new owner
    /// does not yet.
    pub fn previous_owners(&self, unit: &crate::placement::UnitDigest) -> Vec<MemberId> {
        let now = self.placement.owner(unit);
        let mut out = Vec::new();
        for (placement, _) in &self.replaced {
            if let Some(id) = placement.owner(unit)
                && Some(id) != now
                && !out.contains(&id)
                && self.live.contains(&id)
            {
                out.push(id);
            }
        }
        out
    }

    /// This view with its placement made over its members now, and the placement of `before` (the view it
    /// replaces) kept as a hint if it differs, for `hint_for` from `now`. A node's first view has no
    /// view before it: the placement before it joined, over the others, is the hint then.
    fn placed(mut self, before: &View, me: MemberId, hint_for: Duration, now: Instant) -> View {
        let placement = Placement::new(self.serving().map(|r| Member {
            id: r.id,
            weight: r.weight,
        }));
        let previous = if before.revision == 0 && before.placement.is_empty() {
            Arc::new(Placement::new(self.serving().filter(|r| r.id != me).map(|r| Member {
                id: r.id,
                weight: r.weight,
            })))
        } else {
            before.placement.clone()
        };
        self.replaced = before.replaced.clone();
        if placement != *previous && !previous.is_empty() {
            self.replaced.insert(0, (previous, now));
        }
        self.replaced
            .retain(|(_, at)| now.saturating_duration_since(*at) < hint_for);
        self.replaced.truncate(MAX_HINTS);
        self.placement = Arc::new(placement);
        self
    }
}

/// Replaced placements kept as hints at most: a unit's last few owners.
const MAX_HINTS: usize = 4;

/// Where the cluster's coordination lives, and how liveness is kept.
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    /// etcd endpoints, `http://host:port`.
    pub endpoints: Vec<String>,
    /// The cluster's name: clusters sharing an etcd keep apart by it.
    pub cluster: String,
    /// How long a member stays live without renewing.
    pub ttl: Duration,
    /// How often the lease is renewed.
    pub renew_every: Duration,
    /// How long one etcd call may take before it counts as failed.
    pub timeout: Duration,
    /// How long after a membership change a unit's previous owner is still asked for it (a hint)
    /// before home.
    pub hint_for: Duration,
    /// TLS to etcd (endpoints `https://`), with the node's certificate as its client certificate.
    pub tls: Option<crate::tls::EtcdTls>,
    /// The fingerprint of the CA this node's certificates come from: written into etcd by the first node
    /// that joins, and a node of another CA is refused (`None`: not checked).
    pub ca: Option<String>,
    /// A member not live for this long (as this node saw it) has its record removed from etcd: it is no
    /// longer listed, nor asked for anything. It registers again when it comes back.
    pub forget_after: Duration,
}

impl MembershipConfig {
    pub fn new(endpoints: Vec<String>, cluster: impl Into<String>) -> MembershipConfig {
        MembershipConfig {
            endpoints,
            cluster: cluster.into(),
            ttl: Duration::from_secs(10),
            renew_every: Duration::from_secs(3),
            timeout: Duration::from_secs(2),
            hint_for: Duration::from_secs(600),
            tls: None,
            ca: None,
            forget_after: Duration::from_secs(3600),
        }
    }

    fn prefix(&self) -> String {
        format!("/larder/{}/", self.cluster)
    }

    fn member_key(&self, id: MemberId) -> String {
        format!("{}members/{id:016x}", self.prefix())
    }

    fn live_key(&self, id: MemberId) -> String {
        format!("{}live/{id:016x}", self.prefix())
    }

    /// The fingerprint of the cluster's CA.
    fn ca_key(&self) -> String {
        format!("{}ca", self.prefix())
    }

    fn held_prefix(&self) -> Vec<u8> {
        format!("{}held/", self.prefix()).into_bytes()
    }

    fn held_key(&self, path: &[u8]) -> Vec<u8> {
        [self.held_prefix().as_slice(), path].concat()
    }

    /// Written in every transaction that writes held records: its revision is the last such write's.
    fn held_mark(&self) -> String {
        format!("{}held-mark", self.prefix())
    }

    fn token_key(&self, path: &[u8]) -> Vec<u8> {
        [format!("{}tokens/", self.prefix()).as_bytes(), path].concat()
    }
}

/// Operations etcd takes in one transaction by default (`--max-txn-ops`).
const TXN_OPS: usize = 128;

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("cannot reach etcd at {endpoints}: {source}")]
    Connect {
        endpoints: String,
        source: etcd_client::Error,
    },
    #[error("etcd refused {what}: {source}")]
    Etcd {
        what: &'static str,
        source: etcd_client::Error,
    },
    #[error("etcd did not answer {what} within {timeout:?}")]
    Timeout { what: &'static str, timeout: Duration },
    #[error("invalid cluster name {0:?}: letters, digits, '-', '_' and '.' only")]
    BadName(String),
    #[error("cannot start the membership's runtime: {0}")]
    Runtime(std::io::Error),
    #[error(
        "this node's certificates come from another CA than the cluster's: its CA's fingerprint is {ours}, \
         the cluster's is {cluster} (--cluster-tls must hold the ca.pem the cluster's other nodes use, or \
         --cluster-name must name another cluster)"
    )]
    ForeignCa { ours: String, cluster: String },
}

/// Shared between the handle and its background task.
struct Shared {
    cfg: MembershipConfig,
    me: MemberRecord,
    view: RwLock<Arc<View>>,
    /// Milliseconds since the Unix epoch of the last lease renewal etcd confirmed.
    renewed_ms: AtomicU64,
    /// Whether the last etcd call succeeded.
    online: AtomicBool,
    stop: AtomicBool,
    /// The lease this node's liveness key is under now (0: none).
    lease: AtomicU64,
    /// What this node says of itself in its liveness key, and a wake-up for the keeper to say it again.
    said: std::sync::Mutex<Liveness>,
    resay: tokio::sync::Notify,
    /// The records of changes held by nodes and not at home yet.
    held: HeldMap,
    /// A client of the current connection, for calls made on behalf of the file system.
    client: std::sync::Mutex<Option<Client>>,
    /// Counts the changes of lock records the watch brought; waiters for a lock wake on it.
    locks_changed: (std::sync::Mutex<u64>, std::sync::Condvar),
    /// Members this node has seen not live, with when it first did: forgotten after `forget_after`.
    gone_since: std::sync::Mutex<BTreeMap<MemberId, Instant>>,
}

/// This node's membership: its registration, kept alive, and its view of the others.
pub struct Membership {
    shared: Arc<Shared>,
    runtime: std::sync::Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn timed<T>(
    cfg: &MembershipConfig,
    what: &'static str,
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, MembershipError> {
    match tokio::time::timeout(cfg.timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(MembershipError::Etcd { what, source }),
        Err(_) => Err(MembershipError::Timeout {
            what,
            timeout: cfg.timeout,
        }),
    }
}

/// How a client connects to etcd: each call within `timeout`, over TLS with `tls` if given.
pub(crate) fn connect_options(timeout: Duration, tls: Option<&crate::tls::EtcdTls>) -> ConnectOptions {
    let opts = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    match tls {
        Some(tls) => opts.with_tls(
            TlsOptions::new()
                .ca_certificate(Certificate::from_pem(&tls.ca))
                .identity(Identity::from_pem(&tls.cert, &tls.key)),
        ),
        None => opts,
    }
}

impl Shared {
    fn new(cfg: MembershipConfig, me: MemberRecord) -> Shared {
        Shared {
            cfg,
            me,
            view: RwLock::new(Arc::new(View::default())),
            renewed_ms: AtomicU64::new(0),
            online: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            lease: AtomicU64::new(0),
            said: std::sync::Mutex::new(Liveness::default()),
            resay: tokio::sync::Notify::new(),
            held: HeldMap::default(),
            client: std::sync::Mutex::new(None),
            locks_changed: Default::default(),
            gone_since: Default::default(),
        }
    }

    async fn connect(&self) -> Result<Client, MembershipError> {
        let opts = connect_options(self.cfg.timeout, self.cfg.tls.as_ref());
        Client::connect(self.cfg.endpoints.clone(), Some(opts))
            .await
            .map_err(|source| MembershipError::Connect {
                endpoints: self.cfg.endpoints.join(","),
                source,
            })
    }

    /// Remove the records of members this node has seen not live for longer than `forget_after`, each
    /// only if it is still not live (its liveness key absent). Best effort: tried again at the next tick.
    async fn forget_gone(&self, client: &mut Client) {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner()).clone();
        let due: Vec<MemberId> = {
            let mut gone = self.gone_since.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            gone.retain(|id, _| view.members.contains_key(id) && !view.live.contains(id));
            for id in view
                .members
                .keys()
                .filter(|id| !view.live.contains(id) && **id != self.me.id)
            {
                gone.entry(*id).or_insert(now);
            }
            gone.iter()
                .filter(|(_, since)| now.duration_since(**since) >= self.cfg.forget_after)
                .map(|(id, _)| *id)
                .collect()
        };
        for id in due {
            let txn = Txn::new()
                .when(vec![Compare::create_revision(
                    self.cfg.live_key(id),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![TxnOp::delete(self.cfg.member_key(id), None)]);
            match timed(&self.cfg, "a gone member's removal", client.txn(txn)).await {
                Ok(_) => {
                    tracing::info!(
                        member = format!("{id:016x}"),
                        "forgot a member gone longer than the set time"
                    );
                    self.gone_since.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                }
                Err(e) => tracing::debug!(error = %e, "could not remove a gone member's record"),
            }
        }
    }

    /// The cluster's CA, as the first node to join wrote it, must be this node's.
    async fn check_ca(&self, client: &mut Client) -> Result<(), MembershipError> {
        let Some(ours) = &self.cfg.ca else {
            return Ok(());
        };
        let key = self.cfg.ca_key();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.clone(), ours.clone(), None)])
            .or_else(vec![TxnOp::get(key, None)]);
        let resp = timed(&self.cfg, "the cluster's CA", client.txn(txn)).await?;
        if resp.succeeded() {
            return Ok(());
        }
        let cluster = resp
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                _ => None,
            })
            .unwrap_or_default();
        if &cluster == ours {
            Ok(())
        } else {
            Err(MembershipError::ForeignCa {
                ours: ours.clone(),
                cluster,
            })
        }
    }

    /// Write this node's record, and its liveness key under a new lease; the lease id.
    async fn register(&self, client: &mut Client) -> Result<i64, MembershipError> {
        self.check_ca(client).await?;
        let record = serde_json::to_vec(&self.me).expect("a record serialises");
        timed(
            &self.cfg,
            "the member record",
            client.put(self.cfg.member_key(self.me.id), record, None),
        )
        .await?;
        let ttl = self.cfg.ttl.as_secs().max(1) as i64;
        let lease = timed(&self.cfg, "a lease", client.lease_grant(ttl, None)).await?.id();
        self.say(client, lease).await?;
        self.lease.store(lease as u64, Ordering::SeqCst);
        self.renewed_ms.store(now_ms(), Ordering::SeqCst);
        Ok(lease)
    }

    /// Write this node's liveness key, under `lease`, with what it says of itself now.
    async fn say(&self, client: &mut Client, lease: i64) -> Result<(), MembershipError> {
        let said = *self.said.lock().unwrap_or_else(|p| p.into_inner());
        let value = serde_json::to_vec(&said).expect("liveness serialises");
        let opts = PutOptions::new().with_lease(lease);
        let live = self.cfg.live_key(self.me.id);
        timed(&self.cfg, "the liveness key", client.put(live, value, Some(opts))).await?;
        Ok(())
    }

    /// Read every record and liveness key; the new view.
    async fn load(&self, client: &mut Client) -> Result<View, MembershipError> {
        let opts = GetOptions::new().with_prefix();
        let resp = timed(&self.cfg, "the membership", client.get(self.cfg.prefix(), Some(opts))).await?;
        let mut view = View {
            revision: resp.header().map_or(0, |h| h.revision()),
            ..View::default()
        };
        let held_prefix = self.cfg.held_prefix();
        let mut held = BTreeMap::new();
        for kv in resp.kvs() {
            match kv.key().strip_prefix(held_prefix.as_slice()) {
                Some(path) => {
                    held.insert(
                        path.to_vec(),
                        Held {
                            value: kv.value().to_vec(),
                            revision: kv.mod_revision(),
                        },
                    );
                }
                None => self.apply(&mut view, kv.key(), Some(kv.value()), kv.mod_revision()),
            }
        }
        self.held.replace(held, view.revision);
        Ok(view)
    }

    /// Apply one key's value (`None`: deleted) at `revision` to `view`, or to the held records.
    fn apply(&self, view: &mut View, key: &[u8], value: Option<&[u8]>, revision: i64) {
        let prefix = self.cfg.prefix();
        let Some(rest) = key.strip_prefix(prefix.as_bytes()) else {
            return;
        };
        if let Some(path) = rest.strip_prefix(b"held/") {
            self.held.apply(path, value, revision);
            return;
        }
        if rest.starts_with(b"locks/") {
            self.lock_changed();
            return;
        }
        let parse = |hex: &[u8]| {
            std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u64::from_str_radix(h, 16).ok())
        };
        if let Some(id) = rest.strip_prefix(b"members/").and_then(parse) {
            match value.map(serde_json::from_slice::<MemberRecord>) {
                Some(Ok(r)) if r.id == id => {
                    view.members.insert(id, r);
                }
                Some(_) => tracing::warn!(member = id, "a member record in etcd is not readable; ignored"),
                None => {
                    view.members.remove(&id);
                }
            }
        } else if let Some(id) = rest.strip_prefix(b"live/").and_then(parse) {
            if let Some(value) = value {
                view.live.insert(id);
                // Nodes of an earlier make wrote their id alone: live, nothing more said.
                view.liveness
                    .insert(id, serde_json::from_slice(value).unwrap_or_default());
            } else {
                view.live.remove(&id);
                view.liveness.remove(&id);
            }
        }
    }

    fn publish(&self, view: View) {
        let mut current = self.view.write().unwrap_or_else(|p| p.into_inner());
        *current = Arc::new(view.placed(&current, self.me.id, self.cfg.hint_for, Instant::now()));
    }

    /// The keeper: renew, watch, and on any failure wait a moment, connect again, register again and
    /// reload, until stopped.
    async fn keep(self: Arc<Self>, mut client: Client, lease: i64, start_revision: i64) {
        let mut session = Some((lease, start_revision));
        while !self.stop.load(Ordering::SeqCst) {
            let (lease, revision) = match session.take() {
                Some(s) => s,
                None => match self.rejoin(&mut client).await {
                    Ok(s) => s,
                    Err(e) => {
                        self.online.store(false, Ordering::SeqCst);
                        tracing::debug!(error = %e, "etcd is away; keeping the last view of the cluster");
                        tokio::time::sleep(self.cfg.renew_every.min(Duration::from_secs(1))).await;
                        if let Ok(c) = self.connect().await {
                            client = c;
                        }
                        continue;
                    }
                },
            };
            self.online.store(true, Ordering::SeqCst);
            *self.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(client.clone());
            if let Err(e) = self.serve(&mut client, lease, revision).await {
                self.online.store(false, Ordering::SeqCst);
                if !self.stop.load(Ordering::SeqCst) {
                    tracing::warn!(error = %e, "lost etcd; keeping the last view of the cluster and trying again");
                }
            }
        }
    }

    /// Register again (on a new lease: the old one, if it still lives, runs out unused) and reload the
    /// view.
    async fn rejoin(&self, client: &mut Client) -> Result<(i64, i64), MembershipError> {
        let lease = self.register(client).await?;
        let view = self.load(client).await?;
        let revision = view.revision;
        self.publish(view);
        Ok((lease, revision))
    }

    /// Renew the lease and follow the watch until something fails or the node stops.
    async fn serve(&self, client: &mut Client, lease: i64, revision: i64) -> Result<(), MembershipError> {
        let (mut keeper, mut acks) = timed(&self.cfg, "keep-alive", client.lease_keep_alive(lease)).await?;
        let opts = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let mut events = timed(&self.cfg, "a watch", client.watch(self.cfg.prefix(), Some(opts))).await?;
        let mut tick = tokio::time::interval(self.cfg.renew_every);
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            tokio::select! {
                _ = self.resay.notified() => self.say(client, lease).await?,
                _ = tick.tick() => {
                    self.forget_gone(client).await;
                    timed(&self.cfg, "keep-alive", keeper.keep_alive()).await?;
                    match timed(&self.cfg, "keep-alive", acks.message()).await? {
                        Some(ack) if ack.ttl() > 0 => self.renewed_ms.store(now_ms(), Ordering::SeqCst),
                        // The lease ran out (etcd was away longer than the TTL): register anew.
                        _ => return Err(MembershipError::Timeout { what: "a lease that expired", timeout: self.cfg.ttl }),
                    }
                }
                msg = events.message() => {
                    let msg = msg.map_err(|source| MembershipError::Etcd { what: "the watch", source })?;
                    let Some(resp) = msg else {
                        return Err(MembershipError::Timeout { what: "the watch, which ended", timeout: self.cfg.timeout });
                    };
                    if resp.canceled() {
                        return Err(MembershipError::Timeout { what: "the watch, which was cancelled", timeout: self.cfg.timeout });
                    }
                    let mut view = (*self.view.read().unwrap_or_else(|p| p.into_inner())).as_ref().clone();
                    for ev in resp.events() {
                        if let Some(kv) = ev.kv() {
                            let value = (ev.event_type() == EventType::Put).then(|| kv.value());
                            self.apply(&mut view, kv.key(), value, kv.mod_revision());
                            view.revision = view.revision.max(kv.mod_revision());
                        }
                    }
                    self.held.applied_up_to(view.revision);
                    self.publish(view);
                }
            }
        }
    }
}

impl Membership {
    /// Join the cluster as `me`: write its record, take a lease for its liveness, load the view, and keep
    /// all of it current in the background. Fails (with etcd's error, or a timeout) only if etcd cannot be
    /// reached now; once joined, etcd's absence is ridden out.
    pub fn join(cfg: MembershipConfig, me: MemberRecord) -> Result<Membership, MembershipError> {
        if cfg.cluster.is_empty()
            || !cfg
                .cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(MembershipError::BadName(cfg.cluster.clone()));
        }
        let runtime = crate::runtime(1, "larder-members").map_err(MembershipError::Runtime)?;
        let shared = Arc::new(Shared::new(cfg, me));
        let (client, lease, revision) = runtime.block_on(async {
            let mut client = shared.connect().await?;
            let (lease, revision) = shared.rejoin(&mut client).await?;
            Ok::<_, MembershipError>((client, lease, revision))
        })?;
        shared.online.store(true, Ordering::SeqCst);
        *shared.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(client.clone());
        let handle = runtime.handle().clone();
        runtime.spawn(shared.clone().keep(client, lease, revision));
        Ok(Membership {
            shared,
            runtime: std::sync::Mutex::new(Some(runtime)),
            handle,
        })
    }

    /// The last view of the cluster. Never waits for etcd.
    pub fn view(&self) -> Arc<View> {
        self.shared.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This node's record.
    pub fn me(&self) -> &MemberRecord {
        &self.shared.me
    }

    /// Whether etcd answered the last call.
    pub fn online(&self) -> bool {
        self.shared.online.load(Ordering::SeqCst)
    }

    /// Whether this node renewed its liveness within half the TTL: if not, the others may soon consider
    /// it gone, and it should stop acting as an owner.
    pub fn lease_ok(&self) -> bool {
        let age = now_ms().saturating_sub(self.shared.renewed_ms.load(Ordering::SeqCst));
        Duration::from_millis(age) < self.shared.cfg.ttl / 2
    }

    /// Say how much its cache could take without evicting. Written to etcd by the background task once it
    /// moved by a hundredth of the node's weight since last said, so a busy cache does not write to etcd
    /// at every fill.
    pub fn say_free(&self, free: u64) {
        let mut said = self.shared.said.lock().unwrap_or_else(|p| p.into_inner());
        if free.abs_diff(said.free) >= (self.shared.me.weight / 100).max(1) {
            said.free = free;
            self.shared.resay.notify_one();
        }
    }

    /// Say that this node is leaving: it owns nothing new from now on (once the others' views have it),
    /// and is still asked for what it holds. Written to etcd at once; [`Membership::heard`] tells when
    /// it is there.
    pub fn start_leaving(&self) {
        self.shared.said.lock().unwrap_or_else(|p| p.into_inner()).leaving = true;
        self.shared.resay.notify_one();
    }

    /// Whether this node's view shows it as it said it is (its last [`Membership::say`] is in etcd and
    /// came back through the watch).
    pub fn heard(&self) -> bool {
        let said = *self.shared.said.lock().unwrap_or_else(|p| p.into_inner());
        self.view().liveness.get(&self.shared.me.id) == Some(&said)
    }

    /// Leave: stop renewing and remove this node's liveness at once (its record stays: it is who the node
    /// is when it comes back). Best effort within the call timeout; etcd's lease ends it anyway.
    pub fn leave(&self) {
        self.shutdown(true);
    }

    fn shutdown(&self, revoke: bool) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let Some(runtime) = self.runtime.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        if revoke {
            let shared = self.shared.clone();
            let lease = shared.lease.load(Ordering::SeqCst) as i64;
            let started = Instant::now();
            let _ = runtime.block_on(async move {
                let mut client = shared.connect().await?;
                timed(&shared.cfg, "the lease's revocation", client.lease_revoke(lease)).await
            });
            tracing::debug!(took = ?started.elapsed(), "left the cluster");
        }
        runtime.shutdown_timeout(Duration::from_secs(1));
    }

    /// Stop renewing without telling etcd, as a node that dies does: its liveness ends with its lease.
    pub fn abandon(&self) {
        self.shutdown(false);
    }

    /// The records of changes nodes hold that home has not got yet, as this node knows them.
    pub fn held(&self) -> &HeldMap {
        &self.shared.held
    }

    /// Run `f` with a client of etcd, within the call timeout. Must not be called on a runtime's thread.
    fn call<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(Client) -> Result<T, etcd_client::Error>,
    ) -> Result<T, MembershipError> {
        let client = self.shared.client.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(client) = client else {
            return Err(MembershipError::Timeout {
                what,
                timeout: self.shared.cfg.timeout,
            });
        };
        let cfg = &self.shared.cfg;
        self.handle.block_on(timed(cfg, what, f(client)))
    }

    /// Write held records (path and value), and apply them here at once; the revision the last were
    /// written at. One transaction for a change's records; more (in order) when there are more than
    /// etcd takes in one (its default limit is 128 operations: a node republishing what it changed while
    /// etcd was away).
    pub fn publish_held(&self, records: &[(Vec<u8>, Vec<u8>)]) -> Result<i64, MembershipError> {
        let mut revision = 0;
        for batch in records.chunks(TXN_OPS - 1) {
            let mut ops: Vec<TxnOp> = batch
                .iter()
                .map(|(path, value)| TxnOp::put(self.shared.cfg.held_key(path), value.clone(), None))
                .collect();
            ops.push(TxnOp::put(self.shared.cfg.held_mark(), Vec::new(), None));
            let resp = self.call("held records", async move |mut c| c.txn(Txn::new().and_then(ops)).await)?;
            revision = resp.header().map_or(0, |h| h.revision());
            for (path, value) in batch {
                self.shared.held.apply(path, Some(value), revision);
            }
        }
        Ok(revision)
    }

    /// Remove the held record of `path` if it is still the one written at `revision`; the revision of
    /// the removal if it was.
    pub fn unpublish_held(&self, path: &[u8], revision: i64) -> Result<Option<i64>, MembershipError> {
        let key = self.shared.cfg.held_key(path);
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(key.clone(), CompareOp::Equal, revision)])
            .and_then(vec![TxnOp::delete(key, None)]);
        let resp = self.call("a held record's removal", async move |mut c| c.txn(txn).await)?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let at = resp.header().map_or(revision + 1, |h| h.revision());
        self.shared.held.apply(path, None, at);
        Ok(Some(at))
    }

    /// Take the write token of `path` for this node, under its lease: `None` if it has it now, else the
    /// member that holds it.
    pub fn take_token(&self, path: &[u8]) -> Result<Option<MemberId>, MembershipError> {
        let key = self.shared.cfg.token_key(path);
        let me = self.shared.me.id;
        let lease = self.shared.lease.load(Ordering::SeqCst) as i64;
        for _ in 0..3 {
            let txn = Txn::new()
                .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then(vec![TxnOp::put(
                    key.clone(),
                    me.to_string(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else(vec![TxnOp::get(key.clone(), None)]);
            let resp = self.call("a write token", async move |mut c| c.txn(txn).await)?;
            if resp.succeeded() {
                return Ok(None);
            }
            let holder = resp.op_responses().into_iter().find_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<MemberId>().ok()),
                _ => None,
            });
            match holder {
                Some(h) if h == me => return Ok(None),
                Some(h) => return Ok(Some(h)),
                // Gone between the compare and the get: try again.
                None => {}
            }
        }
        Err(MembershipError::Timeout {
            what: "a write token that keeps changing hands",
            timeout: self.shared.cfg.timeout,
        })
    }

    /// Give up this node's write token of `path`, if it has it.
    pub fn drop_token(&self, path: &[u8]) -> Result<(), MembershipError> {
        let key = self.shared.cfg.token_key(path);
        let me = self.shared.me.id.to_string();
        let txn = Txn::new()
            .when(vec![Compare::value(key.clone(), CompareOp::Equal, me)])
            .and_then(vec![TxnOp::delete(key, None)]);
        self.call("a write token's release", async move |mut c| c.txn(txn).await)?;
        Ok(())
    }

    /// Make sure every held record written before this call is applied here (the watch may lag a
    /// moment): one linearizable read of the mark every write of records rewrites, and if the watch has
    /// not brought that write yet, a read of the records written since the last one applied. Removals
    /// are left to the watch. Whether records were written that the watch had not brought.
    pub fn sync_held(&self) -> Result<bool, MembershipError> {
        let mark = self.shared.cfg.held_mark();
        let resp = self.call("the held records' mark", async move |mut c| c.get(mark, None).await)?;
        self.sync_held_to(resp.kvs().first().map_or(0, |kv| kv.mod_revision()))
    }

    /// [`Membership::sync_held`] with the held records' mark already read (as `written`, its revision):
    /// the records written since this node applied them last are read only if the mark moved.
    pub fn sync_held_to(&self, written: i64) -> Result<bool, MembershipError> {
        if written <= self.shared.held.applied() {
            return Ok(false);
        }
        let since = self.shared.held.applied() + 1;
        let prefix = self.shared.cfg.held_prefix();
        let opts = GetOptions::new().with_prefix().with_min_mod_revision(since);
        let resp = self.call("the held records", async move |mut c| c.get(prefix, Some(opts)).await)?;
        let prefix = self.shared.cfg.held_prefix();
        for kv in resp.kvs() {
            if let Some(path) = kv.key().strip_prefix(prefix.as_slice()) {
                self.shared.held.apply(path, Some(kv.value()), kv.mod_revision());
            }
        }
        if let Some(h) = resp.header() {
            self.shared.held.applied_up_to(h.revision());
        }
        Ok(true)
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.shutdown(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::Peer;

    fn record(id: MemberId, name: &str, fingerprint: &str) -> MemberRecord {
        MemberRecord {
            id,
            name: name.into(),
            addr: String::new(),
            weight: 1,
            fingerprint: fingerprint.into(),
            serve: false,
        }
    }

    fn peer(name: &str, fingerprint: &str) -> Peer {
        Peer {
            name: name.into(),
            fingerprint: fingerprint.into(),
        }
    }

    /// A view of serving members `ids`, all live, of weight 1, placed after `before` at `at`.
    fn view_of(ids: &[MemberId], before: &View, at: Instant) -> View {
        let mut view = View::default();
        for &id in ids {
            let mut r = record(id, &format!("n{id}"), "f");
            r.serve = true;
            view.members.insert(id, r);
            view.live.insert(id);
        }
        view.placed(before, 0, Duration::from_secs(60), at)
    }

    fn digest(i: u32) -> crate::placement::UnitDigest {
        crate::peer::digest(&i.to_le_bytes())
    }

    #[test]
    fn after_a_join_the_previous_owner_of_each_moved_unit_is_a_hint_until_the_window_ends() {
        let t0 = Instant::now();
        let three = view_of(&[1, 2, 3], &View::default(), t0);
        assert!(
            (0..1000).all(|i| three.previous_owners(&digest(i)).is_empty()),
            "a first view has no hints"
        );
        let four = view_of(&[1, 2, 3, 4], &three, t0 + Duration::from_secs(1));
        let mut moved = 0;
        for i in 0..1000 {
            let d = digest(i);
            let (was, is) = (three.placement().owner(&d), four.placement().owner(&d));
            let hints = four.previous_owners(&d);
            if was == is {
                assert!(hints.is_empty(), "unit {i} did not move, yet hints {hints:?}");
            } else {
                moved += 1;
                assert_eq!(is, Some(4), "a join moves units to the new member only");
                assert_eq!(hints, vec![was.unwrap()], "unit {i}");
            }
        }
        assert!(
            (150..350).contains(&moved),
            "{moved} of 1000 units moved to the fourth member"
        );
        // A later view that changes nothing keeps the hints; past the window they are gone.
        let same = view_of(&[1, 2, 3, 4], &four, t0 + Duration::from_secs(30));
        assert_eq!(same.replaced.len(), 1);
        let later = view_of(&[1, 2, 3, 4], &same, t0 + Duration::from_secs(62));
        assert!(later.replaced.is_empty());
        assert!((0..1000).all(|i| later.previous_owners(&digest(i)).is_empty()));
    }

    #[test]
    fn a_nodes_first_view_hints_the_owners_from_before_it_joined() {
        let t0 = Instant::now();
        let three = view_of(&[1, 2, 3], &View::default(), t0);
        let mut first = view_of(&[1, 2, 3, 4], &View::default(), t0);
        first = first.placed(&View::default(), 4, Duration::from_secs(60), t0);
        for i in 0..300 {
            let d = digest(i);
            let want: Vec<MemberId> = match three.placement().owner(&d) {
                was if was != first.placement().owner(&d) => was.into_iter().collect(),
                _ => vec![],
            };
            assert_eq!(first.previous_owners(&d), want, "unit {i}");
        }
    }

    #[test]
    fn a_leaving_member_owns_nothing_but_is_still_a_hint_and_a_dead_one_is_not() {
        let t0 = Instant::now();
        let three = view_of(&[1, 2, 3], &View::default(), t0);
        let mut leaving = three.clone();
        leaving.liveness.insert(2, Liveness { free: 0, leaving: true });
        let leaving = leaving.placed(&three, 0, Duration::from_secs(60), t0);
        let owned_by_2: Vec<u32> = (0..300)
            .filter(|&i| three.placement().owner(&digest(i)) == Some(2))
            .collect();
        assert!(!owned_by_2.is_empty());
        for &i in &owned_by_2 {
            assert_ne!(leaving.placement().owner(&digest(i)), Some(2));
            assert_eq!(leaving.previous_owners(&digest(i)), vec![2]);
        }
        // Once its liveness key is gone, it is asked no more.
        let mut gone = leaving.clone();
        gone.live.remove(&2);
        gone.liveness.remove(&2);
        let gone = gone.placed(&leaving, 0, Duration::from_secs(60), t0);
        assert!(owned_by_2.iter().all(|&i| gone.previous_owners(&digest(i)).is_empty()));
    }

    #[test]
    fn a_liveness_key_of_an_earlier_make_reads_as_live_with_nothing_said() {
        let cfg = MembershipConfig::new(vec![], "c");
        let shared = Shared::new(cfg, record(1, "a", "f"));
        let mut view = View::default();
        shared.apply(&mut view, b"/larder/c/live/0000000000000007", Some(b"7"), 1);
        shared.apply(
            &mut view,
            b"/larder/c/live/0000000000000008",
            Some(br#"{"free":5,"leaving":true}"#),
            2,
        );
        assert!(view.live.contains(&7) && view.live.contains(&8));
        assert_eq!(view.liveness[&7], Liveness::default());
        assert_eq!(view.liveness[&8], Liveness { free: 5, leaving: true });
        shared.apply(&mut view, b"/larder/c/live/0000000000000008", None, 3);
        assert!(!view.live.contains(&8) && !view.liveness.contains_key(&8));
    }

    #[test]
    fn a_view_admits_a_live_members_certificate_only() {
        let mut view = View::default();
        for r in [record(1, "a", "aa"), record(2, "b", "bb"), record(3, "gone", "cc")] {
            view.members.insert(r.id, r);
        }
        view.live.extend([1, 2]);
        assert!(view.admits(&peer("a", "aa")));
        assert!(
            view.admits(&peer("b", "bb")),
            "a client that does not serve is a member too"
        );
        assert!(!view.admits(&peer("a", "bb")), "another member's certificate");
        assert!(!view.admits(&peer("a", "old")), "an old certificate");
        assert!(!view.admits(&peer("stranger", "aa")), "a name no member has");
        assert!(!view.admits(&peer("gone", "cc")), "a member that is not live");
        assert!(!view.admits(&peer("a", "")));
    }
}
