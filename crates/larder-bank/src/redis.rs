//! A Redis server, through the `redis` crate (synchronous connections, kept in a small pool).

use std::sync::Mutex;
use std::time::Duration;

use redis::{Client, Connection};

use crate::{Backend, BankConfig};

/// Redis holds values up to 512 MiB; larger units than this are split all the same, to keep each
/// request short.
const ITEM_LIMIT: usize = 64 << 20;

pub(crate) struct Redis {
    client: Client,
    timeout: Duration,
    idle: Mutex<Vec<Connection>>,
    keep: usize,
}

impl Redis {
    /// Connect to `server` (`HOST:PORT`) and check that it answers.
    pub(crate) fn connect(server: &str, config: &BankConfig) -> Result<Redis, String> {
        let r = Redis::unchecked(server, config)?;
        let mut c = r.connection()?;
        redis::cmd("PING")
            .query::<String>(&mut c)
            .map_err(|e| format!("not a Redis server, or not answering: {e}"))?;
        r.idle.lock().unwrap().push(c);
        Ok(r)
    }

    /// A client of `server` that connects when first used.
    pub(crate) fn unchecked(server: &str, config: &BankConfig) -> Result<Redis, String> {
        let client = Client::open(format!("redis://{server}/"))
            .map_err(|e| format!("{server:?} is not a Redis address: {e}"))?;
        Ok(Redis {
            client,
            timeout: config.timeout,
            idle: Mutex::new(Vec::new()),
            keep: config.connections.max(1) as usize,
        })
    }

    fn connection(&self) -> Result<Connection, String> {
        if let Some(c) = self.idle.lock().unwrap().pop() {
            return Ok(c);
        }
        let c = self
            .client
            .get_connection_with_timeout(self.timeout)
            .map_err(|e| format!("cannot connect: {e}"))?;
        c.set_read_timeout(Some(self.timeout)).map_err(|e| e.to_string())?;
        c.set_write_timeout(Some(self.timeout)).map_err(|e| e.to_string())?;
        Ok(c)
    }

    /// Run `f` on a pooled connection; one that failed is dropped, not reused.
    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>) -> Result<T, String> {
        let mut c = self.connection()?;
        let out = f(&mut c).map_err(|e| e.to_string())?;
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < self.keep {
            idle.push(c);
        }
        Ok(out)
    }
}

impl Backend for Redis {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        self.with(|c| redis::cmd("GET").arg(key).query(c))
    }

    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, String> {
        self.with(|c| redis::cmd("MGET").arg(keys).query(c))
    }

    fn set(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), String> {
        self.with(|c| {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(value);
            if !ttl.is_zero() {
                cmd.arg("PX").arg(ttl.as_millis() as u64);
            }
            cmd.query(c)
        })
    }

    fn delete(&self, key: &str) -> Result<(), String> {
        self.with(|c| redis::cmd("DEL").arg(key).query(c))
    }

    fn item_limit(&self) -> usize {
        ITEM_LIMIT
    }
}
