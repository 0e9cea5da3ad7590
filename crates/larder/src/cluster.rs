//! `larder cluster`: the cluster's own CA and its nodes' certificates (design note 014).

use std::path::Path;

use anyhow::Context;
use larder_cluster::tls;

use crate::cli::{ClusterCertArgs, ClusterCommand, ClusterInitArgs};

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Init(args) => init(args),
        ClusterCommand::Cert(args) => cert(args),
        ClusterCommand::Members(args) => crate::status::members(&args.mountpoint, args.json),
    }
}

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
    let issued = tls::issue(&args.dir, &name, args.force)?;
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
