//! What larder refuses up front rather than accept and fail later: a home that cannot be used refuses the
//! mount with one line naming the problem, and a change home could never store fails at the call, in every
//! write mode, with nothing queued. Changes home does refuse are named by `larder drain` (at once, not at
//! its timeout) and by `larder status`.
//!
//! Runs as root with /dev/fuse; the S3 cases use a local moto server (`scripts/s3-server.sh`), one per test.

mod common;
mod moto;

use std::time::{Duration, Instant};

use common::*;
use moto::*;

// Helpers ------------------------------------------------------------------------------------------------

/// Fail the test unless `out` is a failed command whose stderr is one `larder: ` line naming `needles`.
#[track_caller]
fn assert_one_line_error(out: &Output, needles: &[&str]) {
    assert!(!out.success(), "expected a failure, got success:\n{out}");
    let err = out.stderr.trim_end();
    assert!(
        err.starts_with("larder: "),
        "stderr does not start with 'larder: ':\n{out}"
    );
    assert_eq!(err.lines().count(), 1, "the error is not one line:\n{out}");
    for n in needles {
        assert!(err.contains(n), "the error does not mention '{n}':\n{out}");
    }
    eprintln!("refused as it should be: {err}");
}

/// A TCP port on loopback where nothing listens (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = l.local_addr().expect("local addr").port();
    drop(l);
    port
}

/// POST `body` to moto's `/moto-api/reset-auth`: after `body` more requests, moto checks credentials
/// (and refuses the harness's made-up ones with 403); "inf" turns the checks off again.
fn moto_auth_after(st: &S3Test, body: &str) {
    let url = format!("{}/moto-api/reset-auth", st.srv.endpoint);
    let out = run_cmd(
        "curl",
        &[
            "-s",
            "-f",
            "--max-time",
            "10",
            "-X",
            "POST",
            "-H",
            "Content-Type: text/plain",
            "--data",
            body,
            &url,
        ],
        Duration::from_secs(20),
    );
    assert!(out.success(), "POST {url} failed:\n{out}");
}

// Mount-time refusals ------------------------------------------------------------------------------------

/// Each home that cannot be used refuses the mount with one line naming the problem, and leaves nothing
/// mounted: a missing bucket, a name S3 rejects, refused credentials, an endpoint that does not answer
/// (within a few seconds, at the default home timeout), an unknown URL scheme. A prefix with nothing
/// under it yet is a new, empty home and mounts.
#[test]
fn s3_mount_refuses_unusable_homes() {
    let st = S3Test::new("refuse-mount", "home");
    let cache = st.t.root().join("cache-refused");
    let mnt = s(&st.t.mnt);
    let try_mount = |url: &str, extra: &[&str]| -> (Output, Duration) {
        let mut args = vec!["mount", url, mnt, "--cache-dir", s(&cache)];
        args.extend_from_slice(&st.mount_args(extra));
        let t0 = Instant::now();
        let out = run_cmd_env(LARDER, &args, &st.srv.env(), COMMAND_DEADLINE);
        let took = t0.elapsed();
        assert!(
            !is_mounted(&st.t.mnt),
            "a refused mount of {url} left something mounted:\n{out}"
        );
        (out, took)
    };

    let (out, _) = try_mount("s3://nosuchbucket/p", &[]);
    assert_one_line_error(&out, &["s3://nosuchbucket/p", "bucket 'nosuchbucket' does not exist"]);

    let (out, _) = try_mount("s3://Bad_Name!/p", &[]);
    assert_one_line_error(&out, &["'Bad_Name!' is not a valid S3 bucket name"]);
    let (out, _) = try_mount("s3://ab/p", &[]);
    assert_one_line_error(&out, &["'ab' is not a valid S3 bucket name"]);

    let (out, _) = try_mount("foo://x", &[]);
    assert_one_line_error(&out, &["home URL scheme 'foo://' is not supported"]);

    // Nothing listens: refused within a few seconds although the home timeout is 30 s.
    let port = closed_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut args = vec![
        "mount".to_string(),
        st.url(),
        mnt.to_string(),
        "--cache-dir".into(),
        s(&cache).into(),
        "--s3-endpoint".into(),
        endpoint.clone(),
    ];
    args.extend(["--write-mode".into(), "write-back".into()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    let out = run_cmd_env(LARDER, &argv, &st.srv.env(), COMMAND_DEADLINE);
    let took = t0.elapsed();
    assert!(!is_mounted(&st.t.mnt), "a refused mount left something mounted:\n{out}");
    assert_one_line_error(&out, &[&format!("endpoint {endpoint} does not answer")]);
    assert!(took < Duration::from_secs(5), "the refusal took {took:?}");
    eprintln!("a closed endpoint was refused in {took:?}");

    // A prefix with nothing under it is a new home: it mounts, empty.
    let m = st.mount_url_at(&format!("s3://{}/fresh", st.bucket), &st.t.mnt, &st.t.cache, &[]);
    assert!(names(&m.mnt).is_empty(), "a fresh prefix shows entries");
    m.unmount();

    // Last, as moto then checks every request's credentials: the harness's are made up.
    moto_auth_after(&st, "0");
    let (out, _) = try_mount(&st.url(), &[]);
    moto_auth_after(&st, "inf");
    assert_one_line_error(&out, &[&st.url(), "credentials", "refused"]);
}
