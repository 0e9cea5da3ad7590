//! The check at mount: whether the endpoint answers, the bucket exists and the credentials are accepted,
//! each failure told apart in one line; and the bucket-name rules.

use std::time::Duration;

use opendal::ErrorKind;

use super::{PROBE_TIMEOUT, S3Home};

impl S3Home {
    /// Check that the endpoint answers, the bucket exists and the credentials are accepted, with one
    /// listing of at most one key under the prefix (no retries: a mount that cannot work is refused at
    /// once). Fails with one line naming the problem.
    pub fn check(&self) -> Result<Checked, String> {
        let bucket = &self.spec.bucket;
        let endpoint = self.endpoint();
        let timeout = self.spec.op_timeout.min(PROBE_TIMEOUT);
        // A closed port or an unknown host: told by the connection alone, without the HTTP client's retries.
        // Not through a proxy (the HTTP client honours the proxy variables; a direct connection may be
        // barred where the proxy works): then the listing alone tells.
        let proxied = [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
        if !proxied && let Some(e) = unreachable_endpoint(&endpoint, timeout) {
            return Err(format!("endpoint {endpoint} does not answer ({e})"));
        }
        let listed = self.rt.block_on(async {
            use futures::StreamExt;
            let probe = async {
                let mut lister = self.op_probe.lister_with("/").limit(1).await?;
                lister.next().await.transpose()
            };
            match tokio::time::timeout(timeout + Duration::from_secs(1), probe).await {
                Ok(r) => r.map_err(Some),
                Err(_) => Err(None),
            }
        });
        match listed {
            Ok(Some(_)) => Ok(Checked::Populated),
            Ok(None) => Ok(Checked::Empty),
            Err(None) => Err(format!(
                "endpoint {endpoint} does not answer (no reply within {timeout:?})"
            )),
            Err(Some(e)) => {
                let text = e.to_string();
                let (code, reason) = s3_answer(&text);
                Err(match e.kind() {
                    _ if code == "NoSuchBucket" => format!("bucket '{bucket}' does not exist at {endpoint}"),
                    ErrorKind::NotFound => format!("bucket '{bucket}' does not exist at {endpoint}"),
                    ErrorKind::PermissionDenied => format!(
                        "the credentials were refused by {endpoint} for bucket '{bucket}' ({reason}; check \
                         AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
                    ),
                    _ if code == "InvalidBucketName" => {
                        format!("'{bucket}' is not a valid S3 bucket name at {endpoint} ({reason})")
                    }
                    _ if e.is_temporary() && code.is_empty() => {
                        format!("endpoint {endpoint} does not answer ({reason})")
                    }
                    _ => format!("bucket '{bucket}' at {endpoint} cannot be listed ({reason})"),
                })
            }
        }
    }

    /// The endpoint requests go to.
    fn endpoint(&self) -> String {
        match &self.spec.endpoint {
            Some(e) => e.clone(),
            None => format!(
                "https://s3.{}.amazonaws.com",
                self.spec.region.as_deref().unwrap_or("us-east-1")
            ),
        }
    }
}

/// What [`S3Home::check`] found under the prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// At least one object.
    Populated,
    /// Nothing yet: a new, empty home (S3 has no directories; a prefix exists by its objects).
    Empty,
}

/// Whether `name` is a bucket name S3 accepts (the rules for new buckets: 3 to 63 bytes of lowercase
/// letters, digits, `-` and `.`, starting and ending with a letter or digit, no `..`, not an IP address).
pub fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
        && name.parse::<std::net::Ipv4Addr>().is_err()
}

/// Why nothing can be reached at `endpoint` (a URL), or `None` when a TCP connection opens within
/// `timeout`.
pub(super) fn unreachable_endpoint(endpoint: &str, timeout: Duration) -> Option<String> {
    use std::net::{TcpStream, ToSocketAddrs};
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']');
    let addr = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:{}", if scheme == "http" { 80 } else { 443 })
    };
    let addrs: Vec<_> = match addr.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return Some(format!("cannot resolve {addr}: {e}")),
    };
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return None,
            Err(e) => last = Some(format!("{a}: {e}")),
        }
    }
    Some(last.unwrap_or_else(|| format!("{addr} resolves to no address")))
}

/// The S3 error code of an OpenDAL error's text (empty when S3 gave none) and a short reason: "CODE:
/// message", else the HTTP status, else the error's first line.
pub(super) fn s3_answer(text: &str) -> (String, String) {
    let field = |name: &str| -> Option<String> {
        let start = text.find(&format!("{name}: \""))? + name.len() + 3;
        let end = text[start..].find('"')? + start;
        Some(text[start..end].to_string())
    };
    if let Some(code) = field("code").filter(|c| !c.is_empty()) {
        let reason = match field("message").filter(|m| !m.is_empty()) {
            Some(m) => format!("{code}: {}", m.trim_end_matches('.')),
            None => code.clone(),
        };
        return (code, reason);
    }
    if let Some(i) = text.find("status: ") {
        let status: String = text[i + 8..].chars().take_while(char::is_ascii_digit).collect();
        if !status.is_empty() {
            return (String::new(), format!("HTTP {status}"));
        }
    }
    (String::new(), text.lines().next().unwrap_or("").trim().to_string())
}
