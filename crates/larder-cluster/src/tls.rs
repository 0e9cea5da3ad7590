//! The cluster's own certificate authority, and each node's mutual-TLS configuration (design note 014).
//!
//! Peers serve each other cached blocks, so a peer must be a member, not merely someone on the network: every
//! connection between nodes is mutual TLS, and both ends present a certificate from the cluster's CA. The
//! CA and the certificates live in one directory:
//! - `ca.pem` (0644) and `ca.key` (0600), made once by [`init`], never replaced: every node certificate
//!   depends on them;
//! - `NAME.pem` (0644) and `NAME.key` (0600) for each node, made by [`issue`] with the CA's key. A node
//!   needs only `ca.pem` and its own pair ([`NodeTls::load`]): the CA key can be kept offline.
//!
//! A node certificate names its node (common name and DNS subject alternative name) and serves both ends of
//! a connection (server and client authentication). Its [`fingerprint`], the SHA-256 of its DER, is what
//! the membership record of the node carries: a peer's certificate must chain to the CA, and its
//! fingerprint match the record of the member it claims to be ([`peer`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, CommonState, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};

/// The CA's certificate in the cluster directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA's private key in the cluster directory: needed only to issue certificates.
pub const CA_KEY: &str = "ca.key";
/// The application protocol negotiated on every peer connection: gRPC runs over HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";

/// How long the CA is valid: about ten years.
const CA_VALIDITY: Duration = Duration::from_secs(3653 * 86_400);
/// How long a node certificate is valid: about two years.
const NODE_VALIDITY: Duration = Duration::from_secs(731 * 86_400);
/// How far back a new certificate starts, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(3600);
/// Mode of the certificates (public); keys are created 0600.
const CERT_MODE: u32 = 0o644;

/// Why the cluster's CA, a certificate or a node's TLS configuration could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read or write {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} does not exist{hint}")]
    Missing { path: String, hint: &'static str },
    #[error("{dir} already holds a cluster CA ({file}): it is never replaced, every node certificate depends on it")]
    CaExists { dir: String, file: String },
    #[error("{path} already exists: replace it with --force (its node then needs the new pair)")]
    CertExists { path: String },
    #[error("{name:?} is not a node name: {why}")]
    BadName { name: String, why: &'static str },
    #[error(
        "{path} is readable by group or others (mode {mode:04o}); a private key must be its owner's only: chmod 600 {path}"
    )]
    KeyPermissions { path: String, mode: u32 },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
    #[error("cannot make a certificate: {0}")]
    Generate(String),
    #[error("cannot build the TLS configuration: {0}")]
    Config(String),
    #[error("the peer presented no usable certificate: {0}")]
    Peer(String),
    #[error("no randomness for the CA's name: {0}")]
    Random(String),
}

/// What [`init`] or [`issue`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The new certificate's [`fingerprint`].
    pub fingerprint: String,
}

/// The SHA-256 of a DER certificate, as 64 lowercase hex digits.
pub fn fingerprint(cert_der: &[u8]) -> String {
    Sha256::digest(cert_der).iter().map(|b| format!("{b:02x}")).collect()
}

/// Check that `name` can name a node: a DNS-like host name of 1 to 253 characters, letters, digits, `-`
/// and `.`, in labels of 1 to 63 that neither start nor end with `-`; not an address, and not `ca` (the
/// CA's own files).
pub fn check_name(name: &str) -> Result<(), TlsError> {
    let bad = |why| {
        Err(TlsError::BadName {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() || name.len() > 253 {
        return bad("a node name has 1 to 253 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return bad("a node name has only letters, digits, '-' and '.'");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return bad("a node name has no empty label (no leading, trailing or doubled '.')");
        }
        if label.len() > 63 {
            return bad("each '.'-separated label of a node name has at most 63 characters");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("no label of a node name starts or ends with '-'");
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return bad("a node name is a host name, not an address (its last label is not all digits)");
    }
    if name.eq_ignore_ascii_case("ca") {
        return bad("'ca' names the CA's own files");
    }
    Ok(())
}

/// Make the cluster's CA in `dir` (created owner-only if missing): `ca.key`, created 0600, and `ca.pem`,
/// a self-signed CA certificate valid about ten years. Refused if `dir` holds a CA already, or any part
/// of one.
pub fn init(dir: &Path) -> Result<Issued, TlsError> {
    for file in [CA_CERT, CA_KEY] {
        if exists(&dir.join(file))? {
            return Err(ca_exists(dir, file));
        }
    }
    let mut suffix = [0u8; 4];
    getrandom::fill(&mut suffix).map_err(|e| TlsError::Random(e.to_string()))?;
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();

    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("larder cluster CA {suffix}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (params.not_before, params.not_after) = validity(CA_VALIDITY)?;
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.self_signed(&key).map_err(generate)?;

    larder_util::private::create_dir_all(dir).map_err(io_err(dir))?;
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    // The key first, and only where none was: two runs at once make one CA.
    write_new(
        &key_path,
        key.serialize_pem().as_bytes(),
        larder_util::private::FILE_MODE,
    )
    .map_err(|e| match e {
        TlsError::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists => ca_exists(dir, CA_KEY),
        e => e,
    })?;
    if let Err(e) = write_new(&cert_path, cert.pem().as_bytes(), CERT_MODE) {
        let _ = std::fs::remove_file(&key_path);
        return Err(e);
    }
    sync_dir(dir);
    Ok(Issued {
        cert: cert_path,
        key: key_path,
        fingerprint: fingerprint(cert.der()),
    })
}

/// Issue the certificate of node `name` with the CA in `dir`: `NAME.pem` and `NAME.key` (0600) beside the
/// CA, valid about two years, for both server and client authentication. An existing pair of that name is
/// replaced only with `force`.
pub fn issue(dir: &Path, name: &str, force: bool) -> Result<Issued, TlsError> {
    issue_for(dir, name, &[], force)
}

/// Like [`issue`], the certificate naming the host names or IP addresses of `also` too: for a service
/// its clients reach by address, such as an etcd the nodes speak TLS to.
pub fn issue_for(dir: &Path, name: &str, also: &[String], force: bool) -> Result<Issued, TlsError> {
    issue_valid(dir, name, also, force, validity(NODE_VALIDITY)?)
}

fn issue_valid(
    dir: &Path,
    name: &str,
    also: &[String],
    force: bool,
    (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
) -> Result<Issued, TlsError> {
    check_name(name)?;
    let (cert_path, key_path) = node_paths(dir, name);
    if !force {
        for path in [&cert_path, &key_path] {
            if exists(path)? {
                return Err(TlsError::CertExists { path: shown(path) });
            }
        }
    }
    let ca_cert_path = dir.join(CA_CERT);
    let ca_pem = String::from_utf8(read(&ca_cert_path, NO_CA)?).map_err(|_| invalid(&ca_cert_path, "not PEM text"))?;
    let ca_key_path = dir.join(CA_KEY);
    let ca_key_pem =
        String::from_utf8(read_key(&ca_key_path, NO_CA)?).map_err(|_| invalid(&ca_key_path, "not PEM text"))?;
    let ca_key =
        KeyPair::from_pem(&ca_key_pem).map_err(|e| invalid(&ca_key_path, &format!("not a private key ({e})")))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(|e| invalid(&ca_cert_path, &format!("not a CA certificate ({e})")))?;

    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.subject_alt_names = vec![SanType::DnsName(name.try_into().map_err(generate)?)];
    for other in also {
        params.subject_alt_names.push(match other.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                check_name(other)?;
                SanType::DnsName(other.as_str().try_into().map_err(generate)?)
            }
        });
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    (params.not_before, params.not_after) = (not_before, not_after);
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, &issuer).map_err(generate)?;

    // Nothing is written that would not load: the CA's key must be the key of its certificate, and the CA
    // still valid.
    if not_after > now()? {
        let roots = root_store(&ca_cert_path, &ca_pem)?;
        check_chain(&roots, cert.der(), name).map_err(|e| {
            let why = match e {
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => {
                    format!("not the key of {}", shown(&ca_cert_path))
                }
                e => format!(
                    "a certificate it signs would not load: {}",
                    why_refused(&e, name, &ca_cert_path)
                ),
            };
            invalid(&ca_key_path, &why)
        })?;
    }

    let key_pem = key.serialize_pem();
    let cert_pem = cert.pem();
    if force {
        // Written whole under other names, then renamed into place, the key first.
        let key_tmp = tmp_path(&key_path);
        let cert_tmp = tmp_path(&cert_path);
        let _ = std::fs::remove_file(&key_tmp);
        let _ = std::fs::remove_file(&cert_tmp);
        let written = write_new(&key_tmp, key_pem.as_bytes(), larder_util::private::FILE_MODE)
            .and_then(|()| write_new(&cert_tmp, cert_pem.as_bytes(), CERT_MODE))
            .and_then(|()| std::fs::rename(&key_tmp, &key_path).map_err(io_err(&key_path)))
            .and_then(|()| std::fs::rename(&cert_tmp, &cert_path).map_err(io_err(&cert_path)));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&key_tmp);
            let _ = std::fs::remove_file(&cert_tmp);
            return Err(e);
        }
    } else {
        // Created only where nothing was: an issue of the same name at the same moment is refused.
        let exists_err = |path: &Path, e: TlsError| match e {
            TlsError::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists => {
                TlsError::CertExists { path: shown(path) }
            }
            e => e,
        };
        write_new(&key_path, key_pem.as_bytes(), larder_util::private::FILE_MODE)
            .map_err(|e| exists_err(&key_path, e))?;
        if let Err(e) = write_new(&cert_path, cert_pem.as_bytes(), CERT_MODE) {
            let _ = std::fs::remove_file(&key_path);
            return Err(exists_err(&cert_path, e));
        }
    }
    sync_dir(dir);
    Ok(Issued {
        cert: cert_path,
        key: key_path,
        fingerprint: fingerprint(cert.der()),
    })
}

/// A node's TLS: its certificate from the cluster CA, checked, and the configurations of both ends of a
/// peer connection. Each end requires the other's certificate to chain to the cluster CA (TLS 1.3 only,
/// ALPN `h2`); the caller then compares [`peer`] with the membership record of the member it expects.
#[derive(Clone, Debug)]
pub struct NodeTls {
    name: String,
    fingerprint: String,
    /// The CA's certificate's [`fingerprint`]: the cluster's, once the first node joined with it.
    ca_fingerprint: String,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

/// Who is at the other end of an established connection, as its certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The node name the certificate was issued for.
    pub name: String,
    /// The certificate's [`fingerprint`].
    pub fingerprint: String,
}

const NO_CA: &str = " (make the cluster CA with `larder cluster init DIR`)";
const NO_CERT: &str = " (issue it with `larder cluster cert DIR NAME`)";

impl NodeTls {
    /// Load node `name`'s TLS from the cluster directory `dir`: `ca.pem`, `NAME.pem` and `NAME.key` (which
    /// must be its owner's only). The certificate must be signed by that CA, name `name`, be valid now and
    /// match the key; each failure is an error naming the file.
    pub fn load(dir: &Path, name: &str) -> Result<NodeTls, TlsError> {
        check_name(name)?;
        let ca_path = dir.join(CA_CERT);
        let ca_pem = read(&ca_path, NO_CA)?;
        let ca_fingerprint = parse_certs(&ca_path, &ca_pem)?
            .first()
            .map(|c| fingerprint(c))
            .unwrap_or_default();
        let roots = Arc::new(root_store(&ca_path, &ca_pem)?);
        let (cert_path, key_path) = node_paths(dir, name);
        let chain = parse_certs(&cert_path, &read(&cert_path, NO_CERT)?)?;
        let key = PrivateKeyDer::from_pem_slice(&read_key(&key_path, NO_CERT)?)
            .map_err(|e| invalid(&key_path, &format!("no private key in PEM ({e})")))?;
        check_chain(&roots, &chain[0], name).map_err(|e| invalid(&cert_path, &why_refused(&e, name, &ca_path)))?;

        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let client_verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        // The certificate must serve as a client too.
        client_verifier
            .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
            .map_err(|e| invalid(&cert_path, &why_refused(&e, name, &ca_path)))?;
        let mismatch = |e: rustls::Error| match e {
            rustls::Error::InconsistentKeys(_) => invalid(&key_path, &format!("not the key of {}", shown(&cert_path))),
            e => invalid(&key_path, &e.to_string()),
        };
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(mismatch)?;
        server.alpn_protocols = vec![ALPN_H2.to_vec()];
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain.clone(), key)
            .map_err(mismatch)?;
        client.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(NodeTls {
            name: name.to_string(),
            fingerprint: fingerprint(&chain[0]),
            ca_fingerprint,
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fingerprint of the CA this node's certificate comes from.
    pub fn ca_fingerprint(&self) -> &str {
        &self.ca_fingerprint
    }

    /// This node's certificate's fingerprint, for its membership record.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The configuration for accepting peers: a client certificate from the cluster CA is required.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The configuration for connecting to peers: the cluster CA is the only root, and this node's
    /// certificate its client authentication. Connect with [`server_name`] of the peer's node name.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}

/// What a node presents to etcd, and trusts it by, when it speaks TLS to it (`etcds://`): the cluster's CA
/// (etcd's certificate must chain to it and name the address the node dials) and the node's own
/// certificate and key as its client certificate (etcd started with `--client-cert-auth` and the CA as
/// `--trusted-ca-file` admits it).
#[derive(Clone)]
pub struct EtcdTls {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl EtcdTls {
    /// Node `name`'s, from the cluster directory `dir` (the files [`NodeTls::load`] checks).
    pub fn load(dir: &Path, name: &str) -> Result<EtcdTls, TlsError> {
        let (cert_path, key_path) = node_paths(dir, name);
        Ok(EtcdTls {
            ca: read(&dir.join(CA_CERT), NO_CA)?,
            cert: read(&cert_path, NO_CERT)?,
            key: read_key(&key_path, NO_CERT)?,
        })
    }
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

/// The TLS server name to connect to node `name` with (its certificate must name it).
pub fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    check_name(name)?;
    ServerName::try_from(name.to_string()).map_err(|_| TlsError::BadName {
        name: name.to_string(),
        why: "not a DNS name",
    })
}

/// The peer of an established connection (either end: a `ClientConnection` or `ServerConnection` derefs to
/// [`CommonState`]), from the certificate it presented and the handshake verified.
pub fn peer(conn: &CommonState) -> Result<Peer, TlsError> {
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| TlsError::Peer("none presented (is the handshake complete?)".into()))?;
    let parsed = webpki::EndEntityCert::try_from(cert).map_err(|e| TlsError::Peer(format!("{e:?}")))?;
    let name = parsed
        .valid_dns_names()
        .next()
        .ok_or_else(|| TlsError::Peer("it names no node (no DNS name)".into()))?
        .to_string();
    Ok(Peer {
        name,
        fingerprint: fingerprint(cert),
    })
}

// Helpers ----------------------------------------------------------------------------------------------------

fn node_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")))
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".new");
    PathBuf::from(s)
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: shown(path),
        source,
    }
}

fn invalid(path: &Path, why: &str) -> TlsError {
    TlsError::Invalid {
        path: shown(path),
        why: why.to_string(),
    }
}

fn generate(e: rcgen::Error) -> TlsError {
    TlsError::Generate(e.to_string())
}

fn ca_exists(dir: &Path, file: &str) -> TlsError {
    TlsError::CaExists {
        dir: shown(dir),
        file: file.to_string(),
    }
}

fn exists(path: &Path) -> Result<bool, TlsError> {
    path.try_exists().map_err(io_err(path))
}

fn now() -> Result<time::OffsetDateTime, TlsError> {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| TlsError::Generate("the clock is before 1970".into()))?
        .as_secs();
    time::OffsetDateTime::from_unix_timestamp(secs as i64).map_err(|e| TlsError::Generate(e.to_string()))
}

/// From a little before now to `length` after now.
fn validity(length: Duration) -> Result<(time::OffsetDateTime, time::OffsetDateTime), TlsError> {
    let now = now()?;
    Ok((now - BACKDATE, now + length))
}

/// Create `path` (never replacing anything) holding `data`, with `mode` from the start, and sync it.
fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<(), TlsError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(data).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

fn open(path: &Path, hint: &'static str) -> Result<File, TlsError> {
    File::open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => TlsError::Missing {
            path: shown(path),
            hint,
        },
        _ => io_err(path)(e),
    })
}

fn read(path: &Path, hint: &'static str) -> Result<Vec<u8>, TlsError> {
    let mut data = Vec::new();
    open(path, hint)?.read_to_end(&mut data).map_err(io_err(path))?;
    Ok(data)
}

/// Read a private key, refusing one that group or others may read (as ssh does).
fn read_key(path: &Path, hint: &'static str) -> Result<Vec<u8>, TlsError> {
    let mut f = open(path, hint)?;
    let mode = f.metadata().map_err(io_err(path))?.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyPermissions {
            path: shown(path),
            mode,
        });
    }
    let mut data = Vec::new();
    f.read_to_end(&mut data).map_err(io_err(path))?;
    Ok(data)
}

fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, &format!("not a PEM certificate ({e})")))?;
    if certs.is_empty() {
        return Err(invalid(path, "holds no certificate"));
    }
    Ok(certs)
}

/// The CA certificates of `ca.pem` as the only roots.
fn root_store(path: &Path, pem: impl AsRef<[u8]>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(path, pem.as_ref())? {
        roots
            .add(cert)
            .map_err(|e| invalid(path, &format!("not a usable CA certificate ({e})")))?;
    }
    Ok(roots)
}

/// Check that `cert` chains to `roots`, names `name` and is valid now (as a peer connecting to it checks).
fn check_chain(roots: &RootCertStore, cert: &CertificateDer<'_>, name: &str) -> Result<(), rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots.clone()), provider)
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let server = ServerName::try_from(name.to_string()).map_err(|e| rustls::Error::General(e.to_string()))?;
    verifier
        .verify_server_cert(cert, &[], &server, &[], UnixTime::now())
        .map(|_| ())
}

fn why_refused(e: &rustls::Error, name: &str, ca_path: &Path) -> String {
    let ca = shown(ca_path);
    let renew = "issue a new one with `larder cluster cert DIR NAME --force`";
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("not signed by the cluster CA in {ca}")
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                format!("expired; {renew}")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "not valid yet (is the clock right?)".to_string()
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!("does not name node {name:?}")
            }
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
                format!("not for both server and client authentication; {renew}")
            }
            other => format!("refused: {other:?}"),
        },
        other => format!("refused: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    use rustls::{AlertDescription, ClientConnection, ServerConnection, StreamOwned};

    /// What one end of a connection saw once the handshake was over and a message went each way.
    #[derive(Debug)]
    struct Seen {
        peer: Peer,
        alpn: Option<Vec<u8>>,
    }

    const DEADLINE: Duration = Duration::from_secs(10);

    /// A TLS connection over loopback TCP from `client` to `server` (asking for server name `name`): the
    /// client sends "ping", the server answers "pong". What each end saw, or why it failed.
    fn connect(
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
        name: &str,
    ) -> (io::Result<Seen>, io::Result<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = std::thread::spawn(move || -> io::Result<Seen> {
            let (sock, _) = listener.accept()?;
            sock.set_read_timeout(Some(DEADLINE))?;
            sock.set_write_timeout(Some(DEADLINE))?;
            let mut tls = StreamOwned::new(ServerConnection::new(server).map_err(io::Error::other)?, sock);
            let mut msg = [0u8; 4];
            tls.read_exact(&mut msg)?;
            assert_eq!(&msg, b"ping");
            tls.write_all(b"pong")?;
            tls.flush()?;
            let seen = Seen {
                peer: peer(&tls.conn).map_err(io::Error::other)?,
                alpn: tls.conn.alpn_protocol().map(<[u8]>::to_vec),
            };
            tls.conn.send_close_notify();
            let _ = tls.flush();
            Ok(seen)
        });
        let client_side = (|| -> io::Result<Seen> {
            let sock = TcpStream::connect(addr)?;
            sock.set_read_timeout(Some(DEADLINE))?;
            sock.set_write_timeout(Some(DEADLINE))?;
            let conn = ClientConnection::new(client, server_name(name).unwrap()).map_err(io::Error::other)?;
            let mut tls = StreamOwned::new(conn, sock);
            tls.write_all(b"ping")?;
            tls.flush()?;
            let mut msg = [0u8; 4];
            tls.read_exact(&mut msg)?;
            assert_eq!(&msg, b"pong");
            Ok(Seen {
                peer: peer(&tls.conn).map_err(io::Error::other)?,
                alpn: tls.conn.alpn_protocol().map(<[u8]>::to_vec),
            })
        })();
        (serving.join().unwrap(), client_side)
    }

    /// The TLS error behind an I/O error of a connection, if it was one.
    fn tls_error(r: &io::Result<Seen>) -> Option<&rustls::Error> {
        r.as_ref().err()?.get_ref()?.downcast_ref::<rustls::Error>()
    }

    /// A cluster directory with its CA and nodes `names`.
    fn cluster(names: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path()).unwrap();
        for name in names {
            issue(dir.path(), name, false).unwrap();
        }
        dir
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    fn pem_der(p: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(p).unwrap()
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::aws_lc_rs::default_provider())
    }

    /// The certificate chain and key of node `name` in `dir`, read apart from [`NodeTls::load`].
    fn pair(dir: &Path, name: &str) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let (cert, key) = node_paths(dir, name);
        (vec![pem_der(&cert)], PrivateKeyDer::from_pem_file(&key).unwrap())
    }

    fn roots(dir: &Path) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots.add(pem_der(&dir.join(CA_CERT))).unwrap();
        Arc::new(roots)
    }

    #[test]
    fn nodes_of_one_cluster_authenticate_each_other_both_ways() {
        let dir = cluster(&[]);
        let issued_a = issue(dir.path(), "node-a", false).unwrap();
        let issued_b = issue(dir.path(), "node-b.example", false).unwrap();
        let a = NodeTls::load(dir.path(), "node-a").unwrap();
        let b = NodeTls::load(dir.path(), "node-b.example").unwrap();
        assert_eq!(a.fingerprint(), issued_a.fingerprint);
        assert_eq!(b.fingerprint(), issued_b.fingerprint);
        assert_eq!(a.fingerprint(), fingerprint(&pem_der(&issued_a.cert)));
        assert_ne!(a.fingerprint(), b.fingerprint());

        for (server, client) in [(&a, &b), (&b, &a)] {
            let (at_server, at_client) = connect(server.server_config(), client.client_config(), server.name());
            let (at_server, at_client) = (at_server.unwrap(), at_client.unwrap());
            assert_eq!(
                at_server.peer,
                Peer {
                    name: client.name().to_string(),
                    fingerprint: client.fingerprint().to_string()
                },
                "what {} saw of its client",
                server.name()
            );
            assert_eq!(
                at_client.peer,
                Peer {
                    name: server.name().to_string(),
                    fingerprint: server.fingerprint().to_string()
                },
                "what {} saw of its server",
                client.name()
            );
            assert_eq!(at_server.alpn.as_deref(), Some(ALPN_H2));
            assert_eq!(at_client.alpn.as_deref(), Some(ALPN_H2));
        }
    }

    #[test]
    fn a_client_with_a_foreign_certificate_or_none_is_refused() {
        let ours = cluster(&["a", "b"]);
        let theirs = cluster(&["b"]);
        let a = NodeTls::load(ours.path(), "a").unwrap();

        // A client that trusts our CA, so that the server's certificate is no reason for it to stop, but
        // presents a certificate of the same name from another CA.
        let (chain, key) = pair(theirs.path(), "b");
        let foreign = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(ours.path()))
            .with_client_auth_cert(chain, key)
            .unwrap();
        let (at_server, at_client) = connect(a.server_config(), Arc::new(foreign), "a");
        assert!(
            matches!(
                tls_error(&at_server),
                Some(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer))
            ),
            "the server let in a client of another CA: {at_server:?}"
        );
        assert!(
            matches!(
                tls_error(&at_client),
                Some(rustls::Error::AlertReceived(AlertDescription::UnknownCA))
            ),
            "the foreign client was not told: {at_client:?}"
        );

        // A client with no certificate at all.
        let anonymous = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(ours.path()))
            .with_no_client_auth();
        let (at_server, at_client) = connect(a.server_config(), Arc::new(anonymous), "a");
        assert!(
            matches!(tls_error(&at_server), Some(rustls::Error::NoCertificatesPresented)),
            "the server let in a client with no certificate: {at_server:?}"
        );
        assert!(at_client.is_err(), "the anonymous client got an answer: {at_client:?}");
    }

    #[test]
    fn a_server_with_a_foreign_certificate_is_refused() {
        let ours = cluster(&["a", "b"]);
        let theirs = cluster(&["b"]);
        let a = NodeTls::load(ours.path(), "a").unwrap();

        // A server named like our node b, with a certificate from another CA, that would accept our client.
        let (chain, key) = pair(theirs.path(), "b");
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(ours.path()), provider())
            .build()
            .unwrap();
        let impostor = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        let (_, at_client) = connect(Arc::new(impostor), a.client_config(), "b");
        assert!(
            matches!(
                tls_error(&at_client),
                Some(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer))
            ),
            "the client accepted a server of another CA: {at_client:?}"
        );

        // The genuine b passes the same client.
        let b = NodeTls::load(ours.path(), "b").unwrap();
        let (_, at_client) = connect(b.server_config(), a.client_config(), "b");
        assert_eq!(at_client.unwrap().peer.fingerprint, b.fingerprint());
    }

    #[test]
    fn init_never_replaces_a_ca_and_keys_are_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cluster");
        let made = init(&dir).unwrap();
        assert_eq!(made.cert, dir.join(CA_CERT));
        assert_eq!(made.key, dir.join(CA_KEY));
        assert_eq!(made.fingerprint, fingerprint(&pem_der(&made.cert)));
        assert_eq!(mode(&made.key), 0o600, "the CA key is readable by others");
        assert_eq!(mode(&made.cert) & 0o600, 0o600);
        assert_eq!(mode(&dir), 0o700);
        let key_before = std::fs::read(&made.key).unwrap();

        let err = init(&dir).unwrap_err().to_string();
        assert!(
            err.contains("already holds a cluster CA") && err.contains("ca.pem"),
            "{err}"
        );
        assert_eq!(std::fs::read(&made.key).unwrap(), key_before, "the CA key was replaced");
        // Half a CA is a CA too.
        std::fs::remove_file(&made.cert).unwrap();
        let err = init(&dir).unwrap_err().to_string();
        assert!(
            err.contains("already holds a cluster CA") && err.contains("ca.key"),
            "{err}"
        );
        assert_eq!(std::fs::read(&made.key).unwrap(), key_before, "the CA key was replaced");

        let ok = cluster(&["n1"]);
        let (cert, key) = node_paths(ok.path(), "n1");
        assert_eq!(mode(&key), 0o600, "the node key is readable by others");
        assert_eq!(mode(&cert) & 0o600, 0o600);
    }

    #[test]
    fn issue_refuses_bad_names_and_replaces_a_certificate_only_with_force() {
        let dir = cluster(&[]);
        let long_label = "a".repeat(64);
        let too_long = ["abcdefgh"; 29].join(".");
        for bad in [
            "",
            "a b",
            "a_b",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "x/y",
            "../ca",
            "héllo",
            "ca",
            "CA",
            "10.0.0.1",
            long_label.as_str(),
            too_long.as_str(),
        ] {
            match issue(dir.path(), bad, true) {
                Err(TlsError::BadName { name, .. }) => assert_eq!(name, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "a refused name left files: {names:?}");
        for good in ["n", "node-1", "Node7.rack-2.example", "1host", &"a".repeat(63)] {
            issue(dir.path(), good, false).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }

        let first = issue(dir.path(), "n2", false).unwrap();
        let cert_before = std::fs::read(&first.cert).unwrap();
        let key_before = std::fs::read(&first.key).unwrap();
        let err = issue(dir.path(), "n2", false).unwrap_err();
        assert!(matches!(err, TlsError::CertExists { .. }), "{err:?}");
        assert!(
            err.to_string().contains("n2.pem") && err.to_string().contains("--force"),
            "{err}"
        );
        assert_eq!(std::fs::read(&first.cert).unwrap(), cert_before);
        assert_eq!(std::fs::read(&first.key).unwrap(), key_before);
        // A key alone is not overwritten either.
        std::fs::remove_file(&first.cert).unwrap();
        let err = issue(dir.path(), "n2", false).unwrap_err().to_string();
        assert!(err.contains("n2.key"), "{err}");
        assert_eq!(std::fs::read(&first.key).unwrap(), key_before);

        let again = issue(dir.path(), "n2", true).unwrap();
        assert_ne!(again.fingerprint, first.fingerprint);
        assert_ne!(std::fs::read(&again.key).unwrap(), key_before, "the key was kept");
        assert_eq!(mode(&again.key), 0o600);
        let node = NodeTls::load(dir.path(), "n2").unwrap();
        assert_eq!(node.fingerprint(), again.fingerprint);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".new"))
            .collect();
        assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    }

    #[test]
    fn issue_needs_the_ca_and_its_key_private() {
        let empty = tempfile::tempdir().unwrap();
        let err = issue(empty.path(), "n", false).unwrap_err().to_string();
        assert!(err.contains("ca.pem") && err.contains("larder cluster init"), "{err}");

        let dir = cluster(&[]);
        std::fs::set_permissions(dir.path().join(CA_KEY), std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = issue(dir.path(), "n", false).unwrap_err();
        assert!(matches!(err, TlsError::KeyPermissions { .. }), "{err:?}");
        assert!(err.to_string().contains("ca.key"), "{err}");

        // A CA key that is not the key of ca.pem signs nothing.
        let other = cluster(&[]);
        std::fs::copy(other.path().join(CA_KEY), dir.path().join(CA_KEY)).unwrap();
        std::fs::set_permissions(dir.path().join(CA_KEY), std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = issue(dir.path(), "n", false).unwrap_err().to_string();
        assert!(err.contains("ca.key") && err.contains("not the key of"), "{err}");
        assert!(!dir.path().join("n.pem").exists() && !dir.path().join("n.key").exists());
    }

    #[test]
    fn load_refuses_what_a_node_must_not_use_naming_the_file() {
        let dir = cluster(&["a", "b"]);
        let theirs = cluster(&["c"]);
        let p = dir.path();
        let load_err = |name: &str| NodeTls::load(p, name).unwrap_err();

        // A key others may read.
        for loose in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(p.join("a.key"), std::fs::Permissions::from_mode(loose)).unwrap();
            let err = load_err("a");
            assert!(matches!(err, TlsError::KeyPermissions { .. }), "{loose:o}: {err:?}");
            assert!(err.to_string().contains("a.key"), "{err}");
        }
        std::fs::set_permissions(p.join("a.key"), std::fs::Permissions::from_mode(0o400)).unwrap();
        NodeTls::load(p, "a").expect("a read-only owner-only key is fine");

        // A certificate of another CA.
        std::fs::copy(theirs.path().join("c.pem"), p.join("c.pem")).unwrap();
        std::fs::copy(theirs.path().join("c.key"), p.join("c.key")).unwrap();
        let err = load_err("c").to_string();
        assert!(
            err.contains("c.pem") && err.contains("not signed by the cluster CA"),
            "{err}"
        );

        // Missing files.
        let err = load_err("d").to_string();
        assert!(err.contains("d.pem") && err.contains("does not exist"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let err = NodeTls::load(empty.path(), "a").unwrap_err().to_string();
        assert!(err.contains("ca.pem") && err.contains("does not exist"), "{err}");

        // Another node's certificate under this node's name, and another node's key.
        std::fs::copy(p.join("a.pem"), p.join("e.pem")).unwrap();
        std::fs::copy(p.join("a.key"), p.join("e.key")).unwrap();
        let err = load_err("e").to_string();
        assert!(
            err.contains("e.pem") && err.contains("does not name node \"e\""),
            "{err}"
        );
        std::fs::copy(p.join("a.key"), p.join("b.key")).unwrap();
        let err = load_err("b").to_string();
        assert!(err.contains("b.key") && err.contains("not the key of"), "{err}");

        // An expired certificate.
        let long_ago = time::OffsetDateTime::from_unix_timestamp(1_500_000_000).unwrap();
        issue_valid(p, "old", &[], false, (long_ago, long_ago + Duration::from_secs(86_400))).unwrap();
        let err = load_err("old").to_string();
        assert!(err.contains("old.pem") && err.contains("expired"), "{err}");
    }

    #[test]
    fn a_fingerprint_is_the_sha256_of_the_der_in_lowercase_hex() {
        assert_eq!(
            fingerprint(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
