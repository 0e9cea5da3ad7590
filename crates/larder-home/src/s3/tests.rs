//! Unit tests of the S3 home that need no bucket: bucket names, S3 answers, unreachable endpoints.

use std::time::Duration;

use super::check::{s3_answer, unreachable_endpoint};
use super::valid_bucket_name;

#[test]
fn bucket_names_s3_accepts() {
    for ok in ["abc", "my-bucket.data", "larder-s3wb-order", &"a".repeat(63)] {
        assert!(valid_bucket_name(ok), "{ok}");
    }
    for bad in [
        "ab",
        "Bad_Name!",
        "UPPER",
        "-start",
        "end-",
        "a..b",
        "192.168.1.1",
        &"a".repeat(64),
        "",
    ] {
        assert!(!valid_bucket_name(bad), "{bad}");
    }
}

#[test]
fn s3_answers_are_shortened_to_code_and_message() {
    let text = r#"ConfigInvalid (permanent) at list, context: { response: Parts { status: 404 } } => S3Error { code: "NoSuchBucket", message: "The specified bucket does not exist", resource: "" }"#;
    assert_eq!(
        s3_answer(text),
        (
            "NoSuchBucket".into(),
            "NoSuchBucket: The specified bucket does not exist".into()
        )
    );
    assert_eq!(
        s3_answer("Unexpected at list, context: { response: Parts { status: 502, version } }"),
        (String::new(), "HTTP 502".into())
    );
}

#[test]
fn a_closed_port_is_told_by_the_connection() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    assert_eq!(
        unreachable_endpoint(&format!("http://127.0.0.1:{port}"), Duration::from_secs(2)),
        None
    );
    drop(l);
    let why = unreachable_endpoint(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(2));
    assert!(why.is_some_and(|w| w.contains("refused")));
}
