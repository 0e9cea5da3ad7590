//! `larder cluster`: the cluster's own CA and its nodes' certificates (design note 014).

use std::path::Path;

use anyhow::Context;
use larder_cluster::tls;

use crate::cli::{ClusterCertArgs, ClusterCommand, ClusterInitArgs, ClusterLeaveArgs};
use crate::control::{self, Request, Response};

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Init(args) => init(args),
        ClusterCommand::Cert(args) => cert(args),
        ClusterCommand::Members(args) => crate::status::members(&args.mountpoint, args.json, args.all),
        ClusterCommand::Leave(args) => leave(args),
    }
}

fn leave(args: ClusterLeaveArgs) -> anyhow::Result<()> {
    let mnt = &args.unmount.mountpoint;
    let socket = crate::mounts::daemon_socket(&crate::mounts::absolute(mnt)?)?;
    let request = Request::Leave {
        within_ms: args.hand_over_for.as_millis() as u64,
    };
    let done = match control::send(&socket, &request, Some(args.hand_over_for + HAND_OVER_SLACK))? {
        Response::Left(done) => done,
        other => return Err(control::unexpected("leave", &other)),
    };
    println!(
        "handed {} of the {} units this node owned ({}) to their new owners in {:.1} s{}",
        done.units,
        done.owned,
        crate::status::human_bytes(done.bytes),
        done.seconds,
        if done.failed > 0 {
            format!("; {} left for home", done.failed)
        } else {
            String::new()
        }
    );
    crate::mounts::unmount(args.unmount)
}

/// Beyond the hand-over's own time: waiting for etcd to take the leaving.
const HAND_OVER_SLACK: std::time::Duration = std::time::Duration::from_secs(20);

fn init(args: ClusterInitArgs) -> anyhow::Result<()> {
    let made = tls::init(&args.dir)?;
    println!("made the cluster CA in {}:", args.dir.display());
    println!("  {}  certificate: give it to every node", made.cert.display());
    println!(
        "  {}  private key (mode 0600): issue the nodes' certificates with it, then keep it offline",
        made.key.display()
    );
    println!("fingerprint: sha256 {}", made.fingerprint);
    println!(
        "next: larder cluster cert {} NAME, for each node",
        shell_word(&args.dir)
    );
    Ok(())
}

fn cert(args: ClusterCertArgs) -> anyhow::Result<()> {
    let name = match args.name {
        Some(name) => name,
        None => {
            let name = host_name().context("no node name given, and this host's name cannot be had")?;
            tls::check_name(&name).context("no node name given, and this host's name cannot name a node")?;
            name
        }
    };
    let issued = tls::issue_for(&args.dir, &name, &args.also, args.force)?;
    println!(
        "issued the certificate of node {name}, signed by the CA in {}:",
        args.dir.display()
    );
    println!("  {}  certificate", issued.cert.display());
    println!("  {}  private key (mode 0600)", issued.key.display());
    println!("fingerprint: sha256 {}", issued.fingerprint);
    Ok(())
}

/// This host's name, as the kernel has it: a node's name unless it is given.
pub fn host_name() -> anyhow::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// `dir` as one word for a shell command shown to the user.
fn shell_word(dir: &Path) -> String {
    let s = dir.display().to_string();
    if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%".contains(&b)) {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
