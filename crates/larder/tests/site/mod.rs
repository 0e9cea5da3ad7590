//! A test's cluster: its private network (`netns`) with a namespace per node, an etcd on the bridge,
//! and the cluster's certificates made as an operator makes them.

#![allow(dead_code)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use larder_cluster::testing::Etcd;

use crate::common::{self, Mount, TestDir, s};
use crate::netns::TestNet;

/// Where every node's peer server listens, on its namespace's address.
pub const PEER_PORT: u16 = 7443;

/// The options every node of a directory home mounts with.
pub const NODE_OPTIONS: [&str; 5] = ["--block-size", "1MiB", "--no-passthrough", "--validity-lag", "1h"];

/// A cluster's certificates in `dir`, made as an operator makes them: the CA, then each node's.
pub fn certs(dir: &Path, names: &[&str]) -> PathBuf {
    let out = common::larder(&["cluster", "init", s(dir)]);
    assert!(out.success(), "larder cluster init: {out}");
    for name in names {
        let out = common::larder(&["cluster", "cert", s(dir), name]);
        assert!(out.success(), "larder cluster cert {name}: {out}");
    }
    dir.to_path_buf()
}

/// A test's cluster: its private network with a namespace per node, and an etcd on the bridge. The
/// fields drop in order, etcd before the network; a test's mounts, declared later, go first.
pub struct Site {
    pub etcd: Etcd,
    pub net: TestNet,
}

impl Site {
    pub fn new(label: &str, nodes: &[&str]) -> Site {
        Site::with_etcd(label, nodes, Etcd::start_on)
    }

    /// A site whose etcd `start` starts, on the bridge's address it is given.
    pub fn with_etcd(label: &str, nodes: &[&str], start: impl FnOnce(IpAddr) -> Etcd) -> Site {
        let net = TestNet::new(label, nodes);
        let etcd = start(IpAddr::V4(net.host_ip()));
        Site { etcd, net }
    }

    /// The options that put node `name` in the cluster with its certificates in `tls`: serving the
    /// others on its namespace's address, or a client that only reads.
    pub fn cluster_options(&self, name: &str, tls: &Path, serve: bool) -> Vec<String> {
        let mut args = vec![
            "--cluster".to_string(),
            // TLS to an etcd that speaks it.
            if self.etcd.endpoint().starts_with("https://") {
                format!("etcds://{}", self.etcd.client_addr())
            } else {
                format!("etcd://{}", self.etcd.client_addr())
            },
            "--cluster-name".into(),
            "test".into(),
            "--node-name".into(),
            name.into(),
            "--cluster-tls".into(),
            s(tls).into(),
        ];
        if serve {
            args.extend(["--listen".into(), format!("{}:{PEER_PORT}", self.net.node(name).ip)]);
        } else {
            args.extend(["--peer-serve".into(), "off".into()]);
        }
        args
    }

    /// Mount `home` (a directory or a URL) for node `name` at `mnt-NAME` in `t` with cache dir
    /// `cache-NAME`, the daemon in the node's namespace, with `args` and `env`.
    pub fn mount(&self, t: &TestDir, name: &str, home: &str, args: &[String], env: &[(&str, &str)]) -> Mount {
        self.net.mount(t.root(), name, home, args, env)
    }

    /// [`Site::node`], or what `larder mount` said when it failed.
    pub fn try_node(&self, t: &TestDir, tls: &Path, name: &str, extra: &[&str]) -> Result<Mount, common::Output> {
        let mut args = self.cluster_options(name, tls, true);
        args.extend(NODE_OPTIONS.iter().chain(extra).map(|a| a.to_string()));
        self.net
            .try_mount(t.root(), name, s(&t.root().join("home")), &args, &[])
    }

    /// Node `name` of the directory home `t/home`, serving the others, with `extra` options.
    pub fn node(&self, t: &TestDir, tls: &Path, name: &str, extra: &[&str]) -> Mount {
        let mut args = self.cluster_options(name, tls, true);
        args.extend(NODE_OPTIONS.iter().chain(extra).map(|a| a.to_string()));
        self.mount(t, name, s(&t.root().join("home")), &args, &[])
    }
}
