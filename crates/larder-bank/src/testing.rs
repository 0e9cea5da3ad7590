//! For tests of the bank, in this crate and others (feature `testing`): real memcached and Redis servers
//! (Debian's packages), started on loopback ports of their own and stopped when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Memcached,
    Redis,
}

/// A cache server of the test's own.
pub struct CacheServer {
    kind: Kind,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Where it listens, and memcached's item limit in bytes (`-I`).
    pub host: String,
    pub port: u16,
    item_max: usize,
}

impl CacheServer {
    /// memcached on loopback with its default item limit (1 MiB) and 64 MiB of memory.
    pub fn memcached() -> CacheServer {
        CacheServer::memcached_with(1 << 20)
    }

    /// memcached on loopback with items of at most `item_max` bytes.
    pub fn memcached_with(item_max: usize) -> CacheServer {
        CacheServer::start(Kind::Memcached, "127.0.0.1", item_max)
    }

    /// redis-server on loopback, keeping nothing on disk.
    pub fn redis() -> CacheServer {
        CacheServer::start(Kind::Redis, "127.0.0.1", 0)
    }

    /// A server of `kind` listening on `host` (an address of this machine).
    pub fn start(kind: Kind, host: &str, item_max: usize) -> CacheServer {
        let mut s = CacheServer {
            kind,
            child: None,
            dir: tempfile::tempdir().expect("a temporary directory"),
            host: host.to_owned(),
            port: free_port(),
            item_max,
        };
        s.run();
        s
    }

    /// `HOST:PORT`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The bank URL naming it alone.
    pub fn url(&self) -> String {
        match self.kind {
            Kind::Memcached => format!("memcache://{}", self.addr()),
            Kind::Redis => format!("redis://{}", self.addr()),
        }
    }

    /// Start it (again, on the same port, after [`CacheServer::kill`]), and wait until it accepts.
    pub fn run(&mut self) {
        let port = self.port.to_string();
        let mut command = match self.kind {
            Kind::Memcached => {
                let mut c = Command::new("memcached");
                c.args(["-u", "nobody", "-l", &self.host, "-p", &port, "-U", "0", "-m", "64"])
                    .arg("-I")
                    .arg(self.item_max.to_string());
                c
            }
            Kind::Redis => {
                let mut c = Command::new("redis-server");
                c.args([
                    "--bind",
                    &self.host,
                    "--port",
                    &port,
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    // A test's server on a private bridge, without a password.
                    "--protected-mode",
                    "no",
                ])
                .arg("--dir")
                .arg(self.dir.path());
                c
            }
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {:?} (install it: scripts/setup.sh --tests): {e}",
                    self.kind
                )
            });
        self.child = Some(child);
        // Ready once it answers its own protocol: a listening socket alone may be another process's (the
        // port taken meanwhile), or a server not serving yet.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{:?} on {} exited at start: {status}", self.kind, self.addr());
            }
            assert!(
                Instant::now() < deadline,
                "{:?} did not answer on {}",
                self.kind,
                self.addr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it answers a version request (memcached) or a ping (Redis).
    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(self.addr()) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let (ask, want): (&[u8], &[u8]) = match self.kind {
            Kind::Memcached => (b"version\r\n", b"VERSION "),
            Kind::Redis => (b"PING\r\n", b"+PONG"),
        };
        let mut got = [0u8; 64];
        stream.write_all(ask).is_ok() && matches!(stream.read(&mut got), Ok(n) if got[..n].starts_with(want))
    }

    /// Kill it (SIGKILL) and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for CacheServer {
    fn drop(&mut self) {
        self.kill();
    }
}
