//! The bank: a tier of shared cache servers (memcached or Redis) that every node of a site reads and
//! fills, after IMCa (design note 015). It plugs into the core as a tier of units ([`BankTier`], a
//! `larder_fs::tier::Tier`) and as a layer over home that shares stats and listings ([`BankStat`], a
//! `larder_home::Layer`).
//!
//! A [`Bank`] keeps values under string keys on one or more servers, each key on one server chosen by
//! rendezvous hashing, so adding a server moves only its share. It is a cache and nothing more:
//!
//! * **Every failure is a miss.** A server that refuses, times out, or answers with something that fails
//!   its checks gives [`BankError`], which callers count and treat as a miss. A failed server is skipped
//!   for a back-off (1 s, doubling to 30 s) rather than costing every caller its timeout.
//! * **Values are framed and checked.** Each value is stored as a head item (magic, a random generation,
//!   the total length, the number of chunks, the crc32c of the whole) holding the first chunk; the rest go
//!   in chunk items named by the key and the generation. A read that finds a chunk missing, of another
//!   generation, or bytes that fail the checksum is a miss. Values larger than a server's item limit
//!   (memcached's `-I`, read at connect) are so split to fit.
//! * **Fills never wait.** [`Bank::put_later`] queues a value for a background writer; past a bound in
//!   bytes the value is dropped (and counted) instead of delaying the caller.

mod memcache;
mod redis;
mod stat;
#[cfg(feature = "testing")]
pub mod testing;
mod tier;

pub use stat::BankStat;
pub use tier::BankTier;

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why the bank could not answer. Always a miss to the caller.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BankError {
    #[error("bank server {server}: {why}")]
    Server { server: String, why: String },
    #[error("bank server {0} is skipped after a failure")]
    Skipped(String),
    #[error("bank value {0} failed its checks")]
    Bad(String),
}

/// Where the bank is: `memcache://HOST:PORT[,HOST:PORT...]` or `redis://HOST:PORT[,HOST:PORT...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BankUrl {
    pub kind: BankKind,
    pub servers: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BankKind {
    Memcache,
    Redis,
}

impl BankUrl {
    pub fn parse(s: &str) -> Result<BankUrl, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("{s:?}: expected memcache://HOST:PORT[,HOST:PORT...] or redis://HOST:PORT"))?;
        let kind = match scheme {
            "memcache" | "memcached" => BankKind::Memcache,
            "redis" => BankKind::Redis,
            other => {
                return Err(format!(
                    "{s:?}: unknown bank scheme {other:?}; expected memcache:// or redis://"
                ));
            }
        };
        let servers: Vec<String> = rest.trim_end_matches('/').split(',').map(str::to_owned).collect();
        for server in &servers {
            let ok = server
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(format!("{s:?}: {server:?} is not HOST:PORT"));
            }
        }
        Ok(BankUrl { kind, servers })
    }
}

impl fmt::Display for BankUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.kind {
            BankKind::Memcache => "memcache",
            BankKind::Redis => "redis",
        };
        write!(f, "{scheme}://{}", self.servers.join(","))
    }
}

/// How the bank behaves.
#[derive(Clone, Debug)]
pub struct BankConfig {
    /// The longest a call to one server may take (connect, send, answer).
    pub timeout: Duration,
    /// Connections kept per server.
    pub connections: u32,
    /// Bytes of fills queued at most; more are dropped.
    pub queue_bytes: u64,
}

impl Default for BankConfig {
    fn default() -> BankConfig {
        BankConfig {
            timeout: Duration::from_millis(500),
            connections: 8,
            queue_bytes: 64 << 20,
        }
    }
}

/// One server's protocol.
trait Backend: Send + Sync {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String>;
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, String>;
    /// Store `value` under `key`, kept at most `ttl` (zero: until the server evicts it).
    fn set(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), String>;
    fn delete(&self, key: &str) -> Result<(), String>;
    /// The largest value one item may hold.
    fn item_limit(&self) -> usize;
}

/// A server of the bank, and when it may be asked again after a failure.
struct Server {
    name: String,
    backend: Box<dyn Backend>,
    /// Seed of its rendezvous score.
    seed: u64,
    down: Mutex<Option<(Instant, Duration)>>,
}

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

impl Server {
    fn call<T>(&self, f: impl FnOnce(&dyn Backend) -> Result<T, String>) -> Result<T, BankError> {
        if let Some((until, _)) = *self.down.lock().unwrap()
            && Instant::now() < until
        {
            return Err(BankError::Skipped(self.name.clone()));
        }
        match f(self.backend.as_ref()) {
            Ok(v) => {
                *self.down.lock().unwrap() = None;
                Ok(v)
            }
            Err(why) => {
                let mut down = self.down.lock().unwrap();
                let backoff = down.map_or(BACKOFF_FIRST, |(_, b)| (b * 2).min(BACKOFF_MAX));
                if down.is_none() {
                    tracing::warn!(server = %self.name, error = %why, "a bank server failed; skipping it for a while");
                }
                *down = Some((Instant::now() + backoff, backoff));
                Err(BankError::Server {
                    server: self.name.clone(),
                    why,
                })
            }
        }
    }

    fn is_down(&self) -> bool {
        self.down
            .lock()
            .unwrap()
            .is_some_and(|(until, _)| Instant::now() < until)
    }
}

/// The bank's counts since start.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct BankStats {
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    /// Gets that failed (a server error, timeout or skip), counted as misses too.
    pub errors: u64,
    /// Values found that failed their checks (missing or foreign chunks, bad checksum): misses too.
    pub bad: u64,
    pub puts: u64,
    pub put_errors: u64,
    /// Fills dropped because the queue was full.
    pub dropped: u64,
    pub deletes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Servers in the bank, and those skipped after a failure now.
    pub servers: u64,
    pub servers_down: u64,
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    bad: AtomicU64,
    puts: AtomicU64,
    put_errors: AtomicU64,
    dropped: AtomicU64,
    deletes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A fill waiting for the writer.
struct Pending {
    key: String,
    value: Vec<u8>,
    ttl: Duration,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Pending>,
    bytes: u64,
    closed: bool,
}

struct Shared {
    servers: Vec<Server>,
    counts: Counters,
    queue: Mutex<Queue>,
    /// The writer waits on `work`; [`Bank::settle`] on `done`.
    work: Condvar,
    done: Condvar,
    queue_bytes: u64,
}

/// A bank of cache servers: see the module doc.
pub struct Bank {
    url: BankUrl,
    shared: Arc<Shared>,
}

/// Head of a stored value: "LB", format 1, generation, total length, chunks, crc32c.
const MAGIC: &[u8; 3] = b"LB\x01";
const HEAD: usize = 3 + 8 + 8 + 4 + 4;

impl Bank {
    /// Connect to the bank's servers. Fails only if none answers (a wrong address is most likely a
    /// mistake); servers down at start are skipped like any failed server, and asked again later.
    pub fn connect(url: &BankUrl, config: &BankConfig) -> Result<Bank, String> {
        let mut servers = Vec::new();
        let mut reached = 0;
        let mut last_error = String::new();
        for name in &url.servers {
            let made: Result<Box<dyn Backend>, String> = match url.kind {
                BankKind::Memcache => memcache::Memcache::connect(name, config).map(|b| Box::new(b) as _),
                BankKind::Redis => redis::Redis::connect(name, config).map(|b| Box::new(b) as _),
            };
            let server = match made {
                Ok(backend) => {
                    reached += 1;
                    Server {
                        name: name.clone(),
                        backend,
                        seed: xxhash_rust::xxh3::xxh3_64(name.as_bytes()),
                        down: Mutex::new(None),
                    }
                }
                Err(e) => {
                    last_error = format!("{name}: {e}");
                    tracing::warn!(server = %name, error = %e, "a bank server does not answer; skipping it for now");
                    let backend: Box<dyn Backend> = match url.kind {
                        BankKind::Memcache => Box::new(memcache::Memcache::unchecked(name, config)?),
                        BankKind::Redis => Box::new(redis::Redis::unchecked(name, config)?),
                    };
                    Server {
                        name: name.clone(),
                        backend,
                        seed: xxhash_rust::xxh3::xxh3_64(name.as_bytes()),
                        down: Mutex::new(Some((Instant::now() + BACKOFF_FIRST, BACKOFF_FIRST))),
                    }
                }
            };
            servers.push(server);
        }
        if reached == 0 {
            return Err(format!("no server of the bank {url} answers ({last_error})"));
        }
        let shared = Arc::new(Shared {
            servers,
            counts: Counters::default(),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            queue_bytes: config.queue_bytes,
        });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("larder-bank".into())
            .spawn(move || writer.write_queued())
            .map_err(|e| format!("cannot start the bank's writer thread: {e}"))?;
        Ok(Bank {
            url: url.clone(),
            shared,
        })
    }

    pub fn url(&self) -> &BankUrl {
        &self.url
    }

    /// The value under `key`, if the bank has it whole and intact.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, BankError> {
        let s = &self.shared;
        bump(&s.counts.gets, 1);
        let answer = s.get(key);
        match &answer {
            Ok(Some(v)) => {
                bump(&s.counts.hits, 1);
                bump(&s.counts.bytes_read, v.len() as u64);
            }
            Ok(None) => bump(&s.counts.misses, 1),
            Err(BankError::Bad(_)) => {
                bump(&s.counts.bad, 1);
                bump(&s.counts.misses, 1);
            }
            Err(_) => {
                bump(&s.counts.errors, 1);
                bump(&s.counts.misses, 1);
            }
        }
        answer
    }

    /// Store `value` under `key` now, kept at most `ttl` (zero: until the server evicts it).
    pub fn put(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), BankError> {
        self.shared.put(key, value, ttl)
    }

    /// Store `value` under `key` from the background writer; dropped (and counted) if the queue is full.
    pub fn put_later(&self, key: String, value: Vec<u8>, ttl: Duration) {
        let s = &self.shared;
        let mut q = s.queue.lock().unwrap();
        if q.bytes + value.len() as u64 > s.queue_bytes && !q.items.is_empty() {
            bump(&s.counts.dropped, 1);
            return;
        }
        q.bytes += value.len() as u64;
        q.items.push_back(Pending { key, value, ttl });
        s.work.notify_one();
    }

    /// Wait until the fills queued so far are written (or `timeout` passes): for tests and shutdown.
    pub fn settle(&self, timeout: Duration) -> bool {
        let s = &self.shared;
        let deadline = Instant::now() + timeout;
        let mut q = s.queue.lock().unwrap();
        while !q.items.is_empty() || q.bytes > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = s.done.wait_timeout(q, left).unwrap().0;
        }
        true
    }

    /// Forget the value under `key` (best effort: a failure is counted and logged).
    pub fn delete(&self, key: &str) {
        let s = &self.shared;
        bump(&s.counts.deletes, 1);
        if let Err(e) = s.server(key).call(|b| b.delete(key)) {
            tracing::debug!(error = %e, key, "could not forget a bank value");
        }
    }

    pub fn stats(&self) -> BankStats {
        let c = &self.shared.counts;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BankStats {
            gets: l(&c.gets),
            hits: l(&c.hits),
            misses: l(&c.misses),
            errors: l(&c.errors),
            bad: l(&c.bad),
            puts: l(&c.puts),
            put_errors: l(&c.put_errors),
            dropped: l(&c.dropped),
            deletes: l(&c.deletes),
            bytes_read: l(&c.bytes_read),
            bytes_written: l(&c.bytes_written),
            servers: self.shared.servers.len() as u64,
            servers_down: self.shared.servers.iter().filter(|s| s.is_down()).count() as u64,
        }
    }
}

impl Drop for Bank {
    fn drop(&mut self) {
        let mut q = self.shared.queue.lock().unwrap();
        q.closed = true;
        self.shared.work.notify_all();
    }
}

impl Shared {
    /// The server that keeps `key`: the highest rendezvous score.
    fn server(&self, key: &str) -> &Server {
        let h = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
        self.servers
            .iter()
            .max_by_key(|s| xxhash_rust::xxh3::xxh3_64_with_seed(&h.to_le_bytes(), s.seed))
            .expect("a bank has a server")
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, BankError> {
        let server = self.server(key);
        let Some(head) = server.call(|b| b.get(key))? else {
            return Ok(None);
        };
        let bad = || BankError::Bad(key.to_owned());
        if head.len() < HEAD || &head[..3] != MAGIC {
            return Err(bad());
        }
        let generation = u64::from_le_bytes(head[3..11].try_into().unwrap());
        let total = u64::from_le_bytes(head[11..19].try_into().unwrap()) as usize;
        let chunks = u32::from_le_bytes(head[19..23].try_into().unwrap());
        let crc = u32::from_le_bytes(head[23..27].try_into().unwrap());
        if chunks == 0 || head.len() - HEAD > total {
            return Err(bad());
        }
        let mut value = Vec::with_capacity(total);
        value.extend_from_slice(&head[HEAD..]);
        if chunks > 1 {
            let keys: Vec<String> = (1..chunks).map(|i| chunk_key(key, generation, i)).collect();
            for part in server.call(|b| b.get_many(&keys))? {
                let Some(part) = part else {
                    return Err(bad());
                };
                if value.len() + part.len() > total {
                    return Err(bad());
                }
                value.extend_from_slice(&part);
            }
        }
        if value.len() != total || crc32c::crc32c(&value) != crc {
            return Err(bad());
        }
        Ok(Some(value))
    }

    fn put(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), BankError> {
        bump(&self.counts.puts, 1);
        let server = self.server(key);
        let result = server.call(|b| {
            let limit = b.item_limit();
            let first = value.len().min(limit - HEAD);
            let rest = &value[first..];
            let chunks = 1 + rest.len().div_ceil(limit);
            let generation = random_u64();
            // The chunks first: a reader that finds the head finds its chunks (unless evicted since).
            for (i, part) in rest.chunks(limit).enumerate() {
                b.set(&chunk_key(key, generation, i as u32 + 1), part, ttl)?;
            }
            let mut head = Vec::with_capacity(HEAD + first);
            head.extend_from_slice(MAGIC);
            head.extend_from_slice(&generation.to_le_bytes());
            head.extend_from_slice(&(value.len() as u64).to_le_bytes());
            head.extend_from_slice(&(chunks as u32).to_le_bytes());
            head.extend_from_slice(&crc32c::crc32c(value).to_le_bytes());
            head.extend_from_slice(&value[..first]);
            b.set(key, &head, ttl)
        });
        match &result {
            Ok(()) => bump(&self.counts.bytes_written, value.len() as u64),
            Err(_) => bump(&self.counts.put_errors, 1),
        }
        result
    }

    /// The background writer: fills, in order, until the bank is dropped.
    fn write_queued(&self) {
        loop {
            let item = {
                let mut q = self.queue.lock().unwrap();
                loop {
                    if let Some(item) = q.items.pop_front() {
                        break item;
                    }
                    if q.closed {
                        return;
                    }
                    q = self.work.wait(q).unwrap();
                }
            };
            if let Err(e) = self.put(&item.key, &item.value, item.ttl) {
                tracing::debug!(error = %e, key = %item.key, "a bank fill failed");
            }
            let mut q = self.queue.lock().unwrap();
            q.bytes -= item.value.len() as u64;
            self.done.notify_all();
        }
    }
}

fn chunk_key(key: &str, generation: u64, index: u32) -> String {
    format!("{key}.{generation:016x}.{index}")
}

fn random_u64() -> u64 {
    // Unique enough to tell two writers' chunks apart: time and a process-wide counter, mixed.
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    xxhash_rust::xxh3::xxh3_64_with_seed(
        &[nanos.to_le_bytes(), n.to_le_bytes()].concat(),
        std::process::id() as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_bad_ones_say_what_is_expected() {
        let u = BankUrl::parse("memcache://10.0.0.1:11211,cache-b:11211").unwrap();
        assert_eq!(u.kind, BankKind::Memcache);
        assert_eq!(u.servers, ["10.0.0.1:11211", "cache-b:11211"]);
        assert_eq!(u.to_string(), "memcache://10.0.0.1:11211,cache-b:11211");
        assert_eq!(BankUrl::parse("redis://r:6379").unwrap().kind, BankKind::Redis);
        for bad in [
            "memcache://",
            "redis://r",
            "http://a:1",
            "a:1",
            "memcache://a:0",
            "redis://:6379",
        ] {
            let e = BankUrl::parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
