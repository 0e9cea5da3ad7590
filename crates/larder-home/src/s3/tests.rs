//! Unit tests of the S3 home that need no bucket: bucket names, S3 answers, unreachable endpoints, what
//! it says of extended attributes without asking the bucket.

use std::path::Path;
use std::time::Duration;

use super::check::{s3_answer, unreachable_endpoint};
use super::home::deletion_order;
use super::{S3Home, S3Spec, valid_bucket_name};
use crate::{Home, HomeError};

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

/// A home on an endpoint nobody answers at: only what asks the bucket nothing may succeed.
fn home_nowhere(keep_metadata: bool) -> S3Home {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    S3Home::new(S3Spec {
        bucket: "nowhere".into(),
        prefix: "p".into(),
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        op_timeout: Duration::from_secs(2),
        credentials: Some(crate::S3Credentials {
            access_key_id: "k".into(),
            secret_access_key: "s".into(),
            session_token: None,
        }),
        keep_metadata,
        ..S3Spec::default()
    })
    .unwrap()
}

#[test]
fn xattrs_are_kept_only_with_metadata_and_checked_against_2_kib() {
    let home = home_nowhere(true);
    assert!(home.limits().xattrs);
    let attr = |name: &str, len: usize| (name.as_bytes().to_vec(), vec![b'v'; len]);
    home.check_xattrs(&[attr("user.a", 100), attr("trusted.b", 500)])
        .unwrap();
    // What Linux would take on a POSIX home is past S3's 2 KiB here.
    assert!(matches!(
        home.check_xattrs(&[attr("user.a", 1500)]),
        Err(HomeError::Os(libc::E2BIG))
    ));
    assert!(matches!(
        home.check_xattrs(&[attr("user.a", 1000), attr("user.b", 1000)]),
        Err(HomeError::Os(libc::E2BIG))
    ));
    assert!(matches!(
        home.check_xattrs(&[attr("user.a,b", 1)]),
        Err(HomeError::InvalidName(_))
    ));
    assert!(matches!(
        home.check_xattrs(&[attr(&"n".repeat(256), 1)]),
        Err(HomeError::Os(libc::ERANGE))
    ));
    // A name refused before the bucket is asked.
    assert!(matches!(
        home.set_xattr(Path::new("f"), b"user.a:b", Some(b"1")),
        Err(HomeError::InvalidName(_))
    ));

    let bare = home_nowhere(false);
    assert!(!bare.limits().xattrs);
    assert!(matches!(bare.check_xattrs(&[]), Err(HomeError::Unsupported(_))));
    assert!(matches!(bare.xattrs(Path::new("f")), Err(HomeError::Unsupported(_))));
    assert!(matches!(
        bare.set_xattr(Path::new("f"), b"user.a", Some(b"1")),
        Err(HomeError::Unsupported(_))
    ));
}

#[test]
fn a_moved_directorys_keys_are_deleted_below_each_marker_first_and_its_own_marker_last() {
    let keys: Vec<String> = [
        "d/z",
        "d/a/s/x",
        "d/a-b/g",
        "d/a/",
        "d/a/f",
        "d/a-b/",
        "d/a/s/",
        "d/",
        "d/a/s/t/",
        "d/a/s/t/y",
    ]
    .iter()
    .map(|k| k.to_string())
    .collect();
    let order = deletion_order(keys.clone());
    assert_eq!(order.len(), keys.len());
    assert_eq!(
        order.last().map(String::as_str),
        Some("d/"),
        "the moved directory's marker goes last"
    );
    for (i, marker) in order.iter().enumerate().filter(|(_, k)| k.ends_with('/')) {
        for (j, key) in order.iter().enumerate() {
            if key != marker && key.starts_with(marker.as_str()) {
                assert!(
                    j < i,
                    "{key} is deleted after its directory's marker {marker}: {order:?}"
                );
            }
        }
    }
}
