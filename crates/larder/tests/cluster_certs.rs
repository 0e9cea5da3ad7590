//! `larder cluster init` and `larder cluster cert`, run as a user runs them: what they write, what they
//! print, and what they refuse. Needs neither root nor FUSE.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn larder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(args)
        .output()
        .expect("run larder")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The fingerprint a command printed.
fn printed_fingerprint(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    let fp = out
        .lines()
        .find_map(|l| l.strip_prefix("fingerprint: sha256 "))
        .unwrap_or_else(|| panic!("no fingerprint in {}", text(o)))
        .to_string();
    assert!(
        fp.len() == 64 && fp.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{fp}"
    );
    fp
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_cluster_ca_and_node_certificates_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let d = dir.to_str().unwrap();

    let made = larder(&["cluster", "init", d]);
    assert!(made.status.success(), "{}", text(&made));
    assert!(
        String::from_utf8_lossy(&made.stdout).contains("ca.pem"),
        "{}",
        text(&made)
    );
    printed_fingerprint(&made);
    assert_eq!(mode(&dir.join("ca.key")), 0o600);
    let ca_key = std::fs::read(dir.join("ca.key")).unwrap();

    let again = larder(&["cluster", "init", d]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.starts_with("larder: ") && err.contains("already holds a cluster CA"),
        "{}",
        text(&again)
    );
    assert_eq!(
        std::fs::read(dir.join("ca.key")).unwrap(),
        ca_key,
        "the CA key was replaced"
    );

    let issued = larder(&["cluster", "cert", d, "node-1"]);
    assert!(issued.status.success(), "{}", text(&issued));
    let fp = printed_fingerprint(&issued);
    assert_eq!(mode(&dir.join("node-1.key")), 0o600);
    let node = larder_cluster::NodeTls::load(&dir, "node-1").expect("the issued pair loads");
    assert_eq!(
        node.fingerprint(),
        fp,
        "the fingerprint printed is not the certificate's"
    );

    let twice = larder(&["cluster", "cert", d, "node-1"]);
    assert_eq!(twice.status.code(), Some(1), "{}", text(&twice));
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("--force"),
        "{}",
        text(&twice)
    );
    let forced = larder(&["cluster", "cert", d, "node-1", "--force"]);
    assert!(forced.status.success(), "{}", text(&forced));
    assert_ne!(printed_fingerprint(&forced), fp, "--force kept the old certificate");

    let bad = larder(&["cluster", "cert", d, "node_1"]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("is not a node name"),
        "{}",
        text(&bad)
    );
    assert!(!dir.join("node_1.pem").exists());

    // No name: this host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let by_host = larder(&["cluster", "cert", d]);
    if larder_cluster::tls::check_name(&host).is_ok() {
        assert!(by_host.status.success(), "{}", text(&by_host));
        assert!(dir.join(format!("{host}.pem")).exists(), "{}", text(&by_host));
    } else {
        assert!(
            String::from_utf8_lossy(&by_host.stderr).contains("this host's name"),
            "{}",
            text(&by_host)
        );
    }
}
