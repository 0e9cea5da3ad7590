//! The core's [`Coherence`] over the cluster's etcd (the held records, kept by the membership's watch) and the peer
//! protocol (bytes a holder has), and the keeper that retries what could not be published and removes
//! this node's records once home has all its changes.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use larder_fs::Fs;
use larder_fs::coherence::{Coherence, GiveUp, Handover, HeldRecord, held_version};
use larder_fs::serve::HeldRead;
use larder_home::{HomeError, HomeResult, Version};

use crate::Membership;
use crate::membership::MemberRecord;
use crate::peer::{HeldAsk, PeerClient, PeerError, Release, ServeError};

/// How often the keeper looks at this node's records.
const KEEP_EVERY: Duration = Duration::from_millis(200);
/// Longest a node giving up a write token may take to push its changes to home.
const GIVE_UP_WITHIN: Duration = Duration::from_secs(30);
/// Times a node asks for a token held elsewhere (or takes it again, having given one up meanwhile)
/// before it gives up.
const TOKEN_TRIES: usize = 10;
/// How long a node that gave a token up lets the asker have it before its own writers ask for it back.
const COURTESY: Duration = Duration::from_millis(20);
/// Most paths [`EtcdCoherence::pushed`] remembers.
const PUSHED_KEPT: usize = 100_000;

/// A write token as this node has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Held,
    /// Being given up to a peer: this node's writers wait until that is done.
    GivingUp,
    /// Its changes handed over to the peer `to`, at this node's record `revision`: this node's writers
    /// wait for the peer's answer, or until `until`, after which the changes are this node's again.
    Handing {
        revision: i64,
        to: u64,
        until: Instant,
    },
}

pub struct EtcdCoherence {
    membership: Arc<Membership>,
    client: Arc<PeerClient>,
    /// Paths whose records could not be written (etcd away): written again by the keeper.
    unpublished: Mutex<BTreeSet<Vec<u8>>>,
    /// Read the records before each open (close-to-open), rather than rely on the watch alone.
    sync: bool,
    /// Changes of paths another node holds, that node gone: made on home's version (else refused).
    lost_home: bool,
    /// This node serves peers. One that does not (`--peer-serve off`) can give no one its bytes: it
    /// publishes no records and keeps no tokens, and its changes reach the others through home.
    serves: bool,
    /// The write tokens this node has, or is giving up; `tokens_changed` wakes writers waiting.
    tokens: Mutex<HashMap<Vec<u8>, Token>>,
    tokens_changed: Condvar,
    /// Counts the give-ups begun: a token taken while one began may have been given up meanwhile, and
    /// is taken again rather than believed held.
    give_ups: std::sync::atomic::AtomicU64,
    /// When this node last gave each token up: its own writers wait [`COURTESY`] before they ask for it
    /// back, so that the node that asked makes its change first (else, asking at once, they won the
    /// token back each time and the asker gave up).
    given: Mutex<HashMap<Vec<u8>, Instant>>,
    /// Paths whose tokens a thread of this node is asking for: one at a time per path (a second asking
    /// the same holder would find a hand-over to this node under way).
    taking: Mutex<HashSet<Vec<u8>>>,
    taking_done: Condvar,
    /// The file system, once attached: what a hand-over gives and takes.
    fs: OnceLock<Weak<Fs>>,
    /// The revision of this node's last record of each path it removed once home had the change (the
    /// version a node that read it then has cached), and the version home made of it then (see
    /// `Release::Gone`). Forgotten when a record of the path is published again; cleared whole past
    /// [`PUSHED_KEPT`] paths.
    pushed: Mutex<HashMap<Vec<u8>, (i64, String)>>,
}

/// This node's turn at asking for the token of a path ([`EtcdCoherence::turn`]).
struct Turn<'a> {
    c: &'a EtcdCoherence,
    path: Vec<u8>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.c.taking.lock().unwrap().remove(&self.path);
        self.c.taking_done.notify_all();
    }
}

fn decode(value: &[u8]) -> Option<HeldRecord> {
    serde_json::from_slice(value).ok()
}

impl EtcdCoherence {
    pub fn new(
        membership: Arc<Membership>,
        client: Arc<PeerClient>,
        sync: bool,
        lost_home: bool,
        serves: bool,
    ) -> Arc<EtcdCoherence> {
        Arc::new(EtcdCoherence {
            membership,
            client,
            unpublished: Mutex::new(BTreeSet::new()),
            sync,
            lost_home,
            serves,
            tokens: Mutex::new(HashMap::new()),
            tokens_changed: Condvar::new(),
            give_ups: Default::default(),
            given: Mutex::new(HashMap::new()),
            taking: Mutex::new(HashSet::new()),
            taking_done: Condvar::new(),
            fs: OnceLock::new(),
            pushed: Mutex::new(HashMap::new()),
        })
    }

    fn fs(&self) -> Option<Arc<Fs>> {
        self.fs.get().and_then(Weak::upgrade)
    }

    /// Wait until no other thread of this node asks for the token of `path`, then ask.
    fn turn(&self, path: &[u8]) -> Turn<'_> {
        let mut taking = self.taking.lock().unwrap();
        while taking.contains(path) {
            taking = self.taking_done.wait(taking).unwrap();
        }
        taking.insert(path.to_vec());
        Turn {
            c: self,
            path: path.to_vec(),
        }
    }

    /// Follow the records for `fs`: drop what it cached of every path another node's record changed,
    /// and start the keeper.
    pub fn attach(self: &Arc<Self>, fs: &Arc<Fs>) {
        let weak = Arc::downgrade(fs);
        let me = self.me();
        self.membership.held().set_hook(Box::new(move |path, value| {
            // This node's own records (written, or removed once home had its changes) say what its
            // namespace and the kernel know already: nothing to drop, and nothing to ask home again.
            if decode(value).is_some_and(|r| r.holder == me) {
                return;
            }
            if let Some(fs) = weak.upgrade() {
                fs.invalidate_path(path);
            }
        }));
        fs.set_coherence(self.clone());
        let _ = self.fs.set(Arc::downgrade(fs));
        let me = Arc::downgrade(self);
        let fs = Arc::downgrade(fs);
        let _ = std::thread::Builder::new()
            .name("larder-held".into())
            .spawn(move || keep(me, fs));
    }

    /// Ask `holder` to give up the token of `path`. Whether it pushed its changes to home (its record of
    /// the path is gone here then), rather than hand them over to this node, which took them.
    fn ask_to_give_up(&self, holder: u64, path: &[u8]) -> HomeResult<bool> {
        let view = self.membership.view();
        let member = view.members.get(&holder).ok_or(HomeError::Os(libc::EIO))?;
        match self.client.release(member, path, GIVE_UP_WITHIN) {
            Ok(Release::Gone { revision, pushed }) => {
                self.membership.held().apply(path, None, revision);
                if let (Some((pushed, version)), Some(fs)) = (pushed, self.fs()) {
                    fs.rebase(path, &held_version(holder, pushed), Version(version));
                }
                Ok(true)
            }
            Ok(Release::HandOver(h)) => self.take_over(member, path, &h).map(|()| false),
            Err(e) => {
                tracing::warn!(holder = format!("{holder:016x}"), error = %e, "a node would not give up a file's write token");
                Err(HomeError::Os(libc::EIO))
            }
        }
    }

    /// Make the changes of `path` `holder` hands over this node's own, then tell it so: it drops its own
    /// and lets the token go. Told that the holder kept them (it stopped waiting), this node drops its
    /// copy. Any other failure to tell leaves both with the changes (never neither): the one that pushes
    /// second finds home changed, and its copy is kept as a conflict.
    fn take_over(&self, holder: &MemberRecord, path: &[u8], h: &Handover) -> HomeResult<()> {
        let eio = HomeError::Os(libc::EIO);
        let fs = self.fs().ok_or(HomeError::Os(libc::EIO))?;
        if let Err(e) = fs.take_handover(path, h) {
            tracing::warn!(holder = format!("{:016x}", holder.id), error = %e, "could not take over the changes a node handed over");
            if let Err(e) = self.client.handed_over(holder, path, h.revision, false) {
                tracing::debug!(error = %e, "could not tell a node its hand-over was not taken");
            }
            return Err(eio);
        }
        match self.client.handed_over(holder, path, h.revision, true) {
            Ok(_) => Ok(()),
            Err(PeerError::OtherVersion) => {
                tracing::warn!(
                    holder = format!("{:016x}", holder.id),
                    "the node handing a file over kept its changes; dropping the copy taken"
                );
                fs.abandon_handover(path);
                let me = self.me();
                if let Some((_, revision)) = self.record(path).filter(|(r, _)| r.holder == me)
                    && let Err(e) = self.membership.unpublish_held(path, revision)
                {
                    tracing::debug!(error = %e, "could not remove this node's record of a file it did not take over");
                }
                Err(eio)
            }
            Err(e) => {
                tracing::warn!(holder = format!("{:016x}", holder.id), error = %e, "could not tell a node its hand-over was taken; both keep the changes");
                Err(eio)
            }
        }
    }

    /// The token of `path` is another node's now: this node's writers let it have it first ([`COURTESY`]).
    fn given_up(&self, path: &[u8]) {
        let mut given = self.given.lock().unwrap();
        given.retain(|_, at| at.elapsed() < COURTESY);
        given.insert(path.to_vec(), Instant::now());
        self.tokens.lock().unwrap().remove(path);
    }

    /// The changes of hand-overs no answer came for in time are this node's again.
    fn take_back_unanswered(&self) {
        let now = Instant::now();
        let late: Vec<(Vec<u8>, i64, u64)> = self
            .tokens
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(p, t)| match *t {
                Token::Handing { revision, to, until } if until <= now => Some((p.clone(), revision, to)),
                _ => None,
            })
            .collect();
        for (path, revision, to) in late {
            if self.handed_over(&path, to, revision, false).is_ok() {
                tracing::warn!(path = %String::from_utf8_lossy(&path), node = format!("{to:016x}"), "a node a file's changes were handed over to never answered; they are this node's again");
            }
        }
    }

    /// Remove this node's record of `path` at `revision`, home having the change (see
    /// [`Membership::unpublish_held`]); remembered in [`EtcdCoherence::pushed`] with the version home
    /// has of it, as `fs` knows it.
    fn remove_pushed(&self, fs: &Fs, path: &[u8], revision: i64) -> Result<Option<i64>, crate::MembershipError> {
        let at = self.membership.unpublish_held(path, revision)?;
        if let (Some(_), Some(version)) = (at, fs.home_version(path)) {
            let mut pushed = self.pushed.lock().unwrap();
            if pushed.len() >= PUSHED_KEPT {
                pushed.clear();
            }
            pushed.insert(path.to_vec(), (revision, version.0));
        }
        Ok(at)
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

    /// Give the write token of `path` up to `to`, a peer that asked (see [`Fs::give_up`]): this node's
    /// changes go to home first, and then its held records and the token; or, home unable to take them,
    /// they are handed over to the peer, and the token goes once it answers ([`EtcdCoherence::handed_over`]).
    /// This node's writers of the path wait meanwhile.
    pub fn give_up(&self, path: &[u8], to: u64) -> Result<Release, ServeError> {
        {
            // A hand-over of it under way (to another asker) is settled first.
            let deadline = Instant::now() + GIVE_UP_WITHIN;
            let mut tokens = self.tokens.lock().unwrap();
            while matches!(tokens.get(path), Some(Token::Handing { .. })) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ServeError::Failed("a hand-over of it is under way".into()));
                }
                tokens = self.tokens_changed.wait_timeout(tokens, left).unwrap().0;
            }
            self.give_ups.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokens.insert(path.to_vec(), Token::GivingUp);
        }
        let result = (|| {
            let fs = self.fs().ok_or("shutting down")?;
            match fs.give_up(path, GIVE_UP_WITHIN)? {
                GiveUp::Drained => {
                    let mut gone = 0;
                    for (p, revision) in self.own() {
                        let at = self.remove_pushed(&fs, &p, revision).map_err(|e| e.to_string())?;
                        gone = gone.max(at.unwrap_or(0));
                    }
                    self.membership.drop_token(path).map_err(|e| e.to_string())?;
                    Ok(Release::Gone {
                        revision: gone,
                        pushed: None,
                    })
                }
                GiveUp::NothingHere => {
                    self.membership.drop_token(path).map_err(|e| e.to_string())?;
                    let pushed = self.pushed.lock().unwrap().get(path).cloned();
                    Ok(Release::Gone { revision: 0, pushed })
                }
                GiveUp::HandOver(h) => {
                    if self.unpublished.lock().unwrap().contains(path) {
                        let _ = fs.handed_over(path, false);
                        return Err("this node's record of it is not published yet".to_string());
                    }
                    Ok(Release::HandOver(h))
                }
            }
        })();
        match &result {
            Ok(Release::HandOver(h)) => {
                // An asker that never answers does not keep the changes from home: the keeper takes them
                // back after this.
                let until = Instant::now() + GIVE_UP_WITHIN;
                let handing = Token::Handing {
                    revision: h.revision,
                    to,
                    until,
                };
                self.tokens.lock().unwrap().insert(path.to_vec(), handing);
                return result.map_err(ServeError::Failed);
            }
            Ok(Release::Gone { .. }) => self.given_up(path),
            Err(_) => {
                self.tokens.lock().unwrap().remove(path);
            }
        }
        self.tokens_changed.notify_all();
        result.map_err(ServeError::Failed)
    }

    /// `requester` answered the hand-over of `path` this node made at its record `revision`: `taken`, its
    /// changes of the path are dropped here and the token goes; else they are this node's again (its
    /// record published anew, if the peer's replaced it). `OtherVersion` if no such hand-over is under
    /// way (the answer came too late, and this node kept its changes). The revision at which this
    /// node's record was gone (0: the peer's replaced it).
    pub fn handed_over(&self, path: &[u8], requester: u64, revision: i64, taken: bool) -> Result<i64, ServeError> {
        {
            let mut tokens = self.tokens.lock().unwrap();
            match tokens.get(path) {
                Some(Token::Handing { revision: r, to, .. }) if *r == revision && *to == requester => {}
                _ => return Err(ServeError::OtherVersion),
            }
            tokens.insert(path.to_vec(), Token::GivingUp);
        }
        let fs = self.fs();
        let mut gone = 0;
        if taken {
            if let Some(fs) = &fs
                && let Err(e) = fs.handed_over(path, true)
            {
                tracing::warn!(error = %e, "could not record dropping a file's changes handed over");
            }
            match self.membership.unpublish_held(path, revision) {
                Ok(at) => gone = at.unwrap_or(0),
                Err(e) => tracing::debug!(error = %e, "could not remove the record of a file handed over"),
            }
            if let Err(e) = self.membership.drop_token(path) {
                tracing::debug!(error = %e, "could not let the token of a file handed over go; the next ask takes it");
            }
            self.given_up(path);
        } else {
            if let Some(fs) = &fs {
                let _ = fs.handed_over(path, false);
                self.publish(fs.held_records(self.me(), vec![path.to_vec()]));
            }
            self.tokens.lock().unwrap().insert(path.to_vec(), Token::Held);
        }
        self.tokens_changed.notify_all();
        Ok(gone)
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
        c.take_back_unanswered();
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
            if let Err(e) = c.remove_pushed(&fs, &path, revision) {
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

    fn read_held(&self, holder: u64, read: &HeldRead) -> HomeResult<Vec<u8>> {
        let ask = &HeldAsk {
            path: read.path,
            revision: read.revision,
            offset: read.offset,
            len: read.len,
            link: read.link,
        };
        let view = self.membership.view();
        let Some(member) = view.members.get(&holder) else {
            return Err(HomeError::Os(libc::EIO));
        };
        match self.client.read_held(member, ask) {
            Ok(data) => Ok(data.to_vec()),
            // The holder published another version, or pushed and forgot this one: ask again.
            Err(e @ (PeerError::OtherVersion | PeerError::NotHeld)) => {
                tracing::debug!(holder = format!("{holder:016x}"), revision = ask.revision, error = %e, "held bytes are of another version now");
                Err(HomeError::Stale)
            }
            Err(e) => {
                tracing::warn!(holder = format!("{holder:016x}"), error = %e, "the node holding a file's changes did not give them");
                Err(HomeError::Os(libc::EIO))
            }
        }
    }

    fn still_held(&self, path: &[u8]) -> bool {
        match self.tokens.lock().unwrap().get(path) {
            Some(Token::Held) => true,
            Some(Token::GivingUp | Token::Handing { .. }) => false,
            // Given up, or never taken: only a node going on alone (etcd away) or keeping no tokens may.
            None => !self.membership.online() || !self.serves,
        }
    }

    fn take(&self, path: &[u8]) -> HomeResult<bool> {
        if !self.membership.online() {
            // etcd away: this node goes on alone; conflicts are settled at home by the policy.
            return Ok(false);
        }
        let mut handed = false;
        let me = self.me();
        if self.tokens.lock().unwrap().get(path) == Some(&Token::Held) {
            return Ok(false);
        }
        let _turn = self.turn(path);
        for _ in 0..TOKEN_TRIES {
            {
                let deadline = Instant::now() + GIVE_UP_WITHIN;
                let mut tokens = self.tokens.lock().unwrap();
                loop {
                    match tokens.get(path) {
                        Some(Token::Held) => return Ok(handed),
                        Some(Token::GivingUp | Token::Handing { .. }) if Instant::now() < deadline => {
                            tokens = self.tokens_changed.wait_timeout(tokens, GIVE_UP_WITHIN).unwrap().0;
                        }
                        _ => break,
                    }
                }
            }
            // A token this node gave up just now (while this writer waited, too) is the asker's first.
            let given = self.given.lock().unwrap().get(path).copied();
            if let Some(wait) = given.map(|at| COURTESY.saturating_sub(at.elapsed())) {
                std::thread::sleep(wait);
            }
            let epoch = self.give_ups.load(std::sync::atomic::Ordering::SeqCst);
            match self.membership.take_token(path) {
                Ok(None) => {
                    // A holder of changes of the path that has no token (gone, or its lease was renewed).
                    if let Some((r, _)) = self.record(path).filter(|(r, _)| r.holder != me) {
                        if self.live(r.holder) {
                            handed |= self.ask_to_give_up(r.holder, path)?;
                        } else if !self.lost_home {
                            return Err(HomeError::Os(libc::EIO));
                        }
                    }
                    if !self.serves
                        && let Err(e) = self.membership.drop_token(path)
                    {
                        tracing::debug!(error = %e, "could not let a write token go");
                    }
                    let mut tokens = self.tokens.lock().unwrap();
                    if self.give_ups.load(std::sync::atomic::Ordering::SeqCst) != epoch {
                        // This node gave a token up meanwhile, perhaps this one: take it again.
                        continue;
                    }
                    tokens.insert(path.to_vec(), Token::Held);
                    return Ok(handed);
                }
                Ok(Some(holder)) => {
                    handed |= self.ask_to_give_up(holder, path)?;
                }
                Err(e) => {
                    // etcd away: this node goes on alone; conflicts are settled at home by the policy.
                    tracing::warn!(error = %e, "cannot take a write token; changing the file alone");
                    return Ok(handed);
                }
            }
        }
        tracing::warn!(path = %String::from_utf8_lossy(path), tries = TOKEN_TRIES, "could not take a file's write token: other nodes took it back each time");
        Err(HomeError::Os(libc::EIO))
    }

    fn sync(&self) -> bool {
        // etcd away: no open waits for it; the watch brings what was missed once it is back.
        if !self.sync || !self.membership.online() {
            return false;
        }
        self.membership.sync_held().unwrap_or_else(|e| {
            tracing::debug!(error = %e, "could not read the held records; going on with what this node knows");
            false
        })
    }

    fn publish(&self, records: Vec<(Vec<u8>, HeldRecord)>) {
        if !self.serves {
            return;
        }
        // A record the same as the one this node last published (a second close of unchanged data) is
        // not written again: a new revision would be a new version to the others, who would drop theirs.
        let records: Vec<(Vec<u8>, HeldRecord)> = records
            .into_iter()
            .filter(|(p, r)| self.record(p).is_none_or(|(known, _)| &known != r))
            .collect();
        if records.is_empty() {
            return;
        }
        {
            let mut pushed = self.pushed.lock().unwrap();
            for (p, _) in &records {
                pushed.remove(p);
            }
        }
        if !self.membership.online() {
            // Published by the keeper once etcd is back; no change waits for etcd meanwhile.
            self.unpublished
                .lock()
                .unwrap()
                .extend(records.into_iter().map(|(p, _)| p));
            return;
        }
        let encoded: Vec<(Vec<u8>, Vec<u8>)> = records
            .iter()
            .map(|(p, r)| (p.clone(), serde_json::to_vec(r).expect("a record serialises")))
            .collect();
        let published = self.membership.publish_held(&encoded);
        tracing::debug!(paths = ?records.iter().map(|(p, _)| String::from_utf8_lossy(p).into_owned()).collect::<Vec<_>>(), revision = ?published.as_ref().ok(), "published held records");
        if let Err(e) = published {
            tracing::warn!(error = %e, "could not publish changes to the cluster; retrying");
            self.unpublished
                .lock()
                .unwrap()
                .extend(records.into_iter().map(|(p, _)| p));
        }
    }
}
