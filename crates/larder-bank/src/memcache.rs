//! A memcached server, through the `memcache` crate (binary protocol, a pool of connections).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use memcache::{Client, ConnectionManager, Url};

use crate::{Backend, BankConfig};

/// memcached's own default item limit (`-I 1m`).
const DEFAULT_ITEM_MAX: usize = 1 << 20;
/// Room an item needs beside its value: memcached's item header, the key (at most 250 bytes), the flags,
/// the CAS and the line end.
const ITEM_OVERHEAD: usize = 512;
/// memcached reads an expiry past 30 days as a point in time, not a duration.
const TTL_MAX: u64 = 30 * 24 * 3600;

pub(crate) struct Memcache {
    /// The pool of connections; made anew after a failure, so that no connection broken by it (a
    /// restarted server) is handed out again.
    client: RwLock<Arc<Client>>,
    url: Url,
    config: BankConfig,
    item_limit: usize,
}

impl Memcache {
    /// Connect to `server` (`HOST:PORT`), and read its item limit.
    pub(crate) fn connect(server: &str, config: &BankConfig) -> Result<Memcache, String> {
        let item_max = item_size_max(server, config.timeout)?;
        let mut m = Memcache::unchecked(server, config)?;
        m.item_limit = item_max.saturating_sub(ITEM_OVERHEAD).max(ITEM_OVERHEAD);
        Ok(m)
    }

    /// A client of `server` that connects when first used, assuming memcached's default item limit.
    pub(crate) fn unchecked(server: &str, config: &BankConfig) -> Result<Memcache, String> {
        let secs = config.timeout.as_secs_f64();
        let url = Url::parse(&format!("memcache://{server}?timeout={secs}&tcp_nodelay=true"))
            .map_err(|e| format!("{server:?} is not a memcached address: {e}"))?;
        Ok(Memcache {
            client: RwLock::new(pool(&url, config)?),
            url,
            config: config.clone(),
            item_limit: DEFAULT_ITEM_MAX - ITEM_OVERHEAD,
        })
    }

    /// Run `f` on the pool; after a failure, the next call gets a new pool.
    fn with<T>(&self, f: impl FnOnce(&Client) -> Result<T, memcache::MemcacheError>) -> Result<T, String> {
        let client = self.client.read().unwrap_or_else(|p| p.into_inner()).clone();
        f(&client).map_err(|e| {
            if let Ok(fresh) = pool(&self.url, &self.config) {
                *self.client.write().unwrap_or_else(|p| p.into_inner()) = fresh;
            }
            e.to_string()
        })
    }
}

/// A pool of connections to the server at `url`, none made yet.
fn pool(url: &Url, config: &BankConfig) -> Result<Arc<Client>, String> {
    let pool = r2d2::Pool::builder()
        .max_size(config.connections.max(1))
        .min_idle(Some(0))
        .connection_timeout(config.timeout)
        // The pool's check of a connection at each checkout is a `version` call: a round trip more per
        // request. A broken connection fails its request instead (a miss), and the pool is made anew.
        .test_on_check_out(false)
        .build_unchecked(ConnectionManager::new(url.clone()));
    Client::with_pool(pool).map(Arc::new).map_err(|e| e.to_string())
}

/// The server's `item_size_max`, from `stats settings` (which the client crate does not ask): one line of
/// memcached's text protocol, once at connect.
fn item_size_max(server: &str, timeout: Duration) -> Result<usize, String> {
    let addr = server
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {server}: {e}"))?
        .next()
        .ok_or_else(|| format!("{server} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("cannot connect: {e}"))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream
        .write_all(b"stats settings\r\n")
        .map_err(|e| format!("cannot ask for its settings: {e}"))?;
    let mut limit = None;
    for line in BufReader::new(stream).lines() {
        let line = line.map_err(|e| format!("cannot read its settings: {e}"))?;
        let line = line.trim_end();
        if line == "END" {
            break;
        }
        match line.strip_prefix("STAT item_size_max ") {
            Some(n) => limit = n.parse().ok(),
            None if !line.starts_with("STAT ") => return Err(format!("not a memcached server (it said {line:?})")),
            None => {}
        }
    }
    limit.ok_or_else(|| "its settings do not state item_size_max".to_owned())
}

impl Backend for Memcache {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        self.with(|c| c.get::<Vec<u8>>(key))
    }

    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, String> {
        let names: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut found = self.with(|c| c.gets::<Vec<u8>>(&names))?;
        Ok(keys.iter().map(|k| found.remove(k)).collect())
    }

    fn set(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), String> {
        // Zero keeps the item until memcached evicts it: a short time to live must not turn into that.
        let expiry = if ttl.is_zero() {
            0
        } else {
            ttl.as_secs().clamp(1, TTL_MAX) as u32
        };
        self.with(|c| c.set(key, value, expiry))
    }

    fn delete(&self, key: &str) -> Result<(), String> {
        self.with(|c| c.delete(key).map(drop))
    }

    fn item_limit(&self) -> usize {
        self.item_limit
    }
}
