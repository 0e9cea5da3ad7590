//! A rewrite that sends only what changed: a multipart upload whose unchanged parts are copied at the server
//! from the object as it was (UploadPartCopy, conditional on its ETag), and whose changed parts are
//! uploaded, their unchanged bytes read from the object first. OpenDAL builds these requests only inside its
//! S3 service, so they are made here: signed with reqsign (AWS SigV4, as OpenDAL signs) and sent with
//! reqwest (OpenDAL's own HTTP client), path-style, as OpenDAL addresses the bucket.

use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{Method, StatusCode};
use reqsign_aws_v4::{Credential, DefaultCredentialProvider, RequestSigner, StaticCredentialProvider};
use reqsign_core::{Context, OsEnv, Signer};

use super::meta::ObjectMeta;
use super::requests::classify;
use super::{PART, S3Home, S3Spec};
use crate::{HomeError, HomeResult};

/// Bytes that crossed the link for rewrites, each way, and bytes the server copied for them.
#[derive(Default)]
pub(crate) struct Wire {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub copied: AtomicU64,
}

/// The client of the requests OpenDAL does not make.
pub(super) struct Raw {
    client: reqwest::Client,
    signer: Signer<Credential>,
    /// `ENDPOINT/BUCKET`.
    base: String,
    /// `/BUCKET/`, for a copy's source.
    bucket_path: String,
    /// The home's prefix, `a/b/` (empty for a whole bucket).
    root: String,
}

/// `s` as S3 wants it in a path: every byte but the unreserved ones and `/` percent-encoded.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The parts of `span` no range of `ranges` covers, in order.
fn gaps(span: Range<u64>, ranges: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut covered: Vec<Range<u64>> = ranges
        .iter()
        .map(|r| r.start.max(span.start)..r.end.min(span.end))
        .filter(|r| r.start < r.end)
        .collect();
    covered.sort_by_key(|r| r.start);
    let mut out = Vec::new();
    let mut at = span.start;
    for r in covered {
        if r.start > at {
            out.push(at..r.start);
        }
        at = at.max(r.end);
    }
    if at < span.end {
        out.push(at..span.end);
    }
    out
}

/// The text of the first `<tag>` element in `xml`.
fn element<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    Some(&xml[start..end])
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> HomeError {
    HomeError::Unavailable(format!("{what}: {e}"))
}

impl Raw {
    pub(super) fn new(spec: &S3Spec) -> HomeResult<Raw> {
        let region = spec.region.as_deref().unwrap_or("us-east-1");
        let endpoint = spec
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let ctx = Context::new()
            .with_file_read(reqsign_file_read_tokio::TokioFileRead)
            .with_env(OsEnv);
        let request = RequestSigner::new("s3", region);
        let signer = match &spec.credentials {
            Some(c) => {
                let provider = StaticCredentialProvider::new(&c.access_key_id, &c.secret_access_key);
                let provider = match &c.session_token {
                    Some(t) => provider.with_session_token(t),
                    None => provider,
                };
                Signer::new(ctx, provider, request)
            }
            None => Signer::new(ctx, DefaultCredentialProvider::new(), request),
        };
        let root = spec.prefix.trim_matches('/');
        Ok(Raw {
            client: reqwest::Client::builder()
                .build()
                .map_err(|e| unavailable("cannot start the S3 client", e))?,
            signer,
            base: format!("{}/{}", endpoint.trim_end_matches('/'), spec.bucket),
            bucket_path: format!("/{}/", spec.bucket),
            root: if root.is_empty() {
                String::new()
            } else {
                format!("{root}/")
            },
        })
    }

    /// The key of `key` in the bucket, encoded for a path.
    fn path(&self, key: &str) -> String {
        encode(&format!("{}{key}", self.root))
    }

    /// One signed request; its status, headers and body.
    async fn send(
        &self,
        method: Method,
        key: &str,
        query: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> HomeResult<(StatusCode, http::HeaderMap, String)> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}/{}{query}", self.base, self.path(key)))
            .header("x-amz-content-sha256", "UNSIGNED-PAYLOAD")
            .header(http::header::CONTENT_LENGTH, body.len());
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let (mut parts, ()) = req.body(()).map_err(|e| unavailable("an S3 request", e))?.into_parts();
        self.signer
            .sign(&mut parts, None)
            .await
            .map_err(|e| unavailable("signing an S3 request", e))?;
        let req = reqwest::Request::try_from(http::Request::from_parts(parts, body))
            .map_err(|e| unavailable("an S3 request", e))?;
        let resp = self
            .client
            .execute(req)
            .await
            .map_err(|e| unavailable("an S3 request", e))?;
        let (status, headers) = (resp.status(), resp.headers().clone());
        let text = resp.text().await.map_err(|e| unavailable("an S3 answer", e))?;
        Ok((status, headers, text))
    }

    /// The length S3 gives the object `key` (a HEAD); `None` if there is none.
    pub(super) async fn length(&self, key: &str) -> HomeResult<Option<u64>> {
        match self.ok(Method::HEAD, key, "", &[], Vec::new()).await {
            Ok((headers, _)) => Ok(headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())),
            Err(HomeError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `send`, failing on an answer other than 200 (or an error S3 puts in a 200's body): a failed
    /// precondition is [`HomeError::Conflict`].
    async fn ok(
        &self,
        method: Method,
        key: &str,
        query: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> HomeResult<(http::HeaderMap, String)> {
        let (status, headers, text) = self.send(method, key, query, headers, body).await?;
        match status {
            StatusCode::PRECONDITION_FAILED => Err(HomeError::Conflict),
            StatusCode::NOT_FOUND => Err(HomeError::NotFound),
            StatusCode::FORBIDDEN => Err(HomeError::PermissionDenied),
            s if s.is_success() && !text.contains("<Error>") => Ok((headers, text)),
            _ if text.contains("PreconditionFailed") => Err(HomeError::Conflict),
            s => Err(HomeError::Unavailable(format!(
                "S3 answered {s}: {}",
                element(&text, "Message").unwrap_or(&text[..text.len().min(200)])
            ))),
        }
    }
}

impl S3Home {
    /// Rewrite `key` (at `etag`, `old_size` bytes) as `size` bytes holding `ranges` of `source` and the
    /// rest of the object as it was, with `meta`: a multipart upload whose parts no range touches, and
    /// which the old object holds whole, are copied at the server; the others are uploaded. `Ok(false)`
    /// when no part can be copied (the caller uploads it all). Fails with [`HomeError::Conflict`] when the
    /// object is no longer at `etag`.
    pub(super) async fn rewrite_copying(
        &self,
        key: &str,
        source: &File,
        ranges: &[Range<u64>],
        size: u64,
        (etag, old_size): (&str, u64),
        meta: Option<&ObjectMeta>,
    ) -> HomeResult<bool> {
        let part = PART as u64;
        let parts: Vec<Range<u64>> = (0..size.div_ceil(part))
            .map(|i| i * part..((i + 1) * part).min(size))
            .collect();
        let clean = |p: &Range<u64>| p.end <= old_size && !ranges.iter().any(|r| r.start < p.end && p.start < r.end);
        if etag.is_empty() || !parts.iter().any(clean) {
            return Ok(false);
        }
        let raw = &self.raw;
        let mut headers: Vec<(&str, String)> = Vec::new();
        let names: Vec<(String, String)> = meta
            .filter(|_| self.spec.keep_metadata)
            .map(|m| {
                m.to_map()
                    .into_iter()
                    .map(|(k, v)| (format!("x-amz-meta-{k}"), v))
                    .collect()
            })
            .unwrap_or_default();
        for (k, v) in &names {
            headers.push((k.as_str(), v.clone()));
        }
        let (_, text) = raw.ok(Method::POST, key, "?uploads", &headers, Vec::new()).await?;
        let upload = element(&text, "UploadId")
            .ok_or_else(|| HomeError::Unavailable("S3 gave no upload id".into()))?
            .to_string();
        let done = self
            .upload_parts(key, &upload, &parts, source, ranges, (etag, old_size))
            .await;
        let result = match done {
            Ok(etags) => {
                let mut body = String::from("<CompleteMultipartUpload>");
                for (n, e) in etags.iter().enumerate() {
                    body.push_str(&format!(
                        "<Part><PartNumber>{}</PartNumber><ETag>{e}</ETag></Part>",
                        n + 1
                    ));
                }
                body.push_str("</CompleteMultipartUpload>");
                let cond = [("if-match", etag.to_string())];
                raw.ok(
                    Method::POST,
                    key,
                    &format!("?uploadId={}", encode(&upload)),
                    &cond,
                    body.into_bytes(),
                )
                .await
                .map(|_| true)
            }
            Err(e) => Err(e),
        };
        if result.is_err() {
            let _ = raw
                .send(
                    Method::DELETE,
                    key,
                    &format!("?uploadId={}", encode(&upload)),
                    &[],
                    Vec::new(),
                )
                .await;
        }
        result
    }

    /// The parts of upload `upload` of `key`: copied where [`S3Home::rewrite_copying`] says, else uploaded.
    /// Their ETags, in order.
    async fn upload_parts(
        &self,
        key: &str,
        upload: &str,
        parts: &[Range<u64>],
        source: &File,
        ranges: &[Range<u64>],
        (etag, old_size): (&str, u64),
    ) -> HomeResult<Vec<String>> {
        use futures::StreamExt;
        let raw = &self.raw;
        let wire = &self.wire;
        let each = parts.iter().enumerate().map(|(i, p)| async move {
            let query = format!("?partNumber={}&uploadId={}", i + 1, encode(upload));
            let touched = ranges.iter().any(|r| r.start < p.end && p.start < r.end);
            if !touched && p.end <= old_size {
                let headers = [
                    ("x-amz-copy-source", format!("{}{}", raw.bucket_path, raw.path(key))),
                    ("x-amz-copy-source-range", format!("bytes={}-{}", p.start, p.end - 1)),
                    ("x-amz-copy-source-if-match", etag.to_string()),
                ];
                let (_, text) = raw.ok(Method::PUT, key, &query, &headers, Vec::new()).await?;
                wire.copied.fetch_add(p.end - p.start, Ordering::Relaxed);
                return element(&text, "ETag")
                    .map(|e| e.replace("&quot;", "\""))
                    .ok_or_else(|| HomeError::Unavailable("S3 gave a copied part no ETag".into()));
            }
            let mut bytes = vec![0u8; (p.end - p.start) as usize];
            // The bytes of the old object this part keeps (those no range gives).
            for gap in gaps(p.start..p.end.min(old_size), ranges) {
                let old = self
                    .op_bulk
                    .read_with(key)
                    .range(gap.clone())
                    .if_match(etag)
                    .await
                    .map_err(|e| classify(e, true))?
                    .to_vec();
                wire.received.fetch_add(old.len() as u64, Ordering::Relaxed);
                let at = (gap.start - p.start) as usize;
                bytes[at..at + old.len()].copy_from_slice(&old);
            }
            super::writes::fill_from(source, ranges, p.start, &mut bytes)?;
            let len = bytes.len() as u64;
            let (headers, _) = raw.ok(Method::PUT, key, &query, &[], bytes).await?;
            wire.sent.fetch_add(len, Ordering::Relaxed);
            headers
                .get(http::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .ok_or_else(|| HomeError::Unavailable("S3 gave an uploaded part no ETag".into()))
        });
        let got: Vec<HomeResult<String>> = futures::stream::iter(each).buffered(4).collect().await;
        got.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_for_a_path_and_elements_found() {
        assert_eq!(encode("a b/ü+x.txt"), "a%20b/%C3%BC%2Bx.txt");
        assert_eq!(encode("plain/Key-1_2.~"), "plain/Key-1_2.~");
        let xml = "<R><UploadId>abc</UploadId><ETag>&quot;e1&quot;</ETag></R>";
        assert_eq!(element(xml, "UploadId"), Some("abc"));
        assert_eq!(element(xml, "ETag"), Some("&quot;e1&quot;"));
        assert_eq!(element(xml, "Missing"), None);
    }

    #[test]
    fn gaps_are_what_no_range_covers() {
        assert_eq!(gaps(0..100, &[]), vec![0..100]);
        assert_eq!(gaps(0..100, &[10..20, 15..30, 90..200]), vec![0..10, 30..90]);
        assert_eq!(gaps(50..60, &[0..55, 58..70]), vec![55..58]);
        assert_eq!(gaps(0..10, &[0..4, 4..10]), Vec::<Range<u64>>::new());
        assert_eq!(gaps(5..5, &[]), Vec::<Range<u64>>::new());
    }
}
