//! For tests of the cluster, in this crate and others (feature `testing`): a real etcd (Debian's
//! `etcd-server`), started on ports of its own (on loopback, or for its clients on an address the test
//! chooses) with its data in a temporary directory, and stopped when dropped.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
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
    /// Start one on loopback, and wait until it answers.
    pub fn start() -> Etcd {
        Etcd::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Start one serving its clients on `host` (an address of this machine, e.g. a test network's
    /// bridge), and wait until it answers. Its peer port stays on loopback.
    pub fn start_on(host: IpAddr) -> Etcd {
        Etcd::start_with(host, None)
    }

    /// Start one on `host` that speaks only TLS to its clients, with the certificate `cert` and key
    /// `key`, and admits only clients whose certificate chains to `ca` (`--client-cert-auth`).
    pub fn start_tls(host: IpAddr, ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> Etcd {
        Etcd::start_with(host, Some([ca.to_path_buf(), cert.to_path_buf(), key.to_path_buf()]))
    }

    fn start_with(host: IpAddr, tls: Option<[std::path::PathBuf; 3]>) -> Etcd {
        let mut e = Etcd {
            child: None,
            dir: tempfile::tempdir().expect("a temporary directory"),
            host,
            client: free_port(),
            peer: free_port(),
            tls,
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
        self.wait_answering(Instant::now() + Duration::from_secs(20));
    }

    /// Wait until it answers a status call (over TLS with its own certificate, which serves as a
    /// client's too): listening is not serving, and etcd may reset a client's first connections until
    /// it is ready.
    fn wait_answering(&self, deadline: Instant) {
        let read = |p: &std::path::Path| std::fs::read(p).expect("the test etcd's certificate files");
        let tls = self.tls.as_ref().map(|[ca, cert, key]| crate::tls::EtcdTls {
            ca: read(ca),
            cert: read(cert),
            key: read(key),
        });
        let opts = crate::membership::connect_options(Duration::from_secs(1), tls.as_ref());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime to ask etcd with");
        let answers = || {
            runtime.block_on(async {
                match etcd_client::Client::connect([self.endpoint()], Some(opts.clone())).await {
                    Ok(mut client) => client.status().await.is_ok(),
                    Err(_) => false,
                }
            })
        };
        while !answers() {
            assert!(Instant::now() < deadline, "etcd does not answer at {}", self.endpoint());
            std::thread::sleep(Duration::from_millis(50));
        }
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
