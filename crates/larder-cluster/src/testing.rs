//! For tests of the cluster, in this crate and others (feature `testing`): a real etcd (Debian's
//! `etcd-server`), started on ports of its own (on loopback, or for its clients on an address the test
//! chooses) with its data in a temporary directory, and stopped when dropped.

use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// An etcd of the test's own.
pub struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Where it serves its clients.
    pub host: IpAddr,
    pub client: u16,
    peer: u16,
    /// With TLS: the CA its clients must chain to, and its own certificate and key.
    tls: Option<[std::path::PathBuf; 3]>,
}

impl Etcd {
    /// Start one on loopback, and wait until it listens.
    pub fn start() -> Etcd {
        Etcd::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Start one serving its clients on `host` (an address of this machine, e.g. a test network's
    /// bridge), and wait until it listens. Its peer port stays on loopback.
    pub fn start_on(host: IpAddr) -> Etcd {
        let mut e = Etcd {
            child: None,
            dir: tempfile::tempdir().expect("a temporary directory"),
            host,
            client: free_port(),
            peer: free_port(),
            tls: None,
        };
        e.run();
        e
    }

    /// Start one on `host` that speaks only TLS to its clients, with the certificate `cert` and key
    /// `key`, and admits only clients whose certificate chains to `ca` (`--client-cert-auth`).
    pub fn start_tls(host: IpAddr, ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> Etcd {
        let mut e = Etcd {
            child: None,
            dir: tempfile::tempdir().expect("a temporary directory"),
            host,
            client: free_port(),
            peer: free_port(),
            tls: Some([ca.to_path_buf(), cert.to_path_buf(), key.to_path_buf()]),
        };
        e.run();
        e
    }

    /// Its client endpoint, `http://HOST:PORT` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.client_addr())
    }

    /// Its client address, `HOST:PORT` (as `--cluster etcd://HOST:PORT` names it).
    pub fn client_addr(&self) -> String {
        std::net::SocketAddr::new(self.host, self.client).to_string()
    }

    /// Start it (again, on the same data and ports, after [`Etcd::kill`]).
    pub fn run(&mut self) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let mut command = Command::new("etcd");
        if let Some([ca, cert, key]) = &self.tls {
            command
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(ca)
                .arg("--cert-file")
                .arg(cert)
                .arg("--key-file")
                .arg(key);
        }
        let child = command
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (Debian's etcd-server) must be installed: scripts/setup.sh --tests installs it");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect((self.host, self.client)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Listening is not serving: etcd may reset a client's first connections until it is ready.
        while !self.answers() {
            assert!(Instant::now() < deadline, "etcd listens but does not answer");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether it answers a status call now (over TLS with its own certificate, which serves as a
    /// client's too).
    fn answers(&self) -> bool {
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(1));
        if let Some([ca, cert, key]) = &self.tls {
            let read = |p: &std::path::Path| std::fs::read(p).expect("the test etcd's certificate files");
            opts = opts.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(read(ca)))
                    .identity(etcd_client::Identity::from_pem(read(cert), read(key))),
            );
        }
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return false;
        };
        runtime.block_on(async {
            match etcd_client::Client::connect([self.endpoint()], Some(opts)).await {
                Ok(mut client) => client.status().await.is_ok(),
                Err(_) => false,
            }
        })
    }

    /// Kill it, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
