//! Extended attributes in object metadata, in s3fs's form: one key, `x-amz-meta-xattr`, holding a
//! JSON-like object from each name to the base64 of its value, percent-encoded as a whole. s3fs 1.90
//! (`use_xattr`) stores `user.a` = `val` and `user.k` = `v` as
//!
//! ```text
//! x-amz-meta-xattr: %7B%22user.a%22%3A%22dmFs%22%2C%22user.k%22%3A%22dg%3D%3D%22%7D
//! ```
//!
//! that is `{"user.a":"dmFs","user.k":"dg=="}`: names sorted bytewise and written as they are (not JSON
//! escaped), no spaces, standard base64 with padding (an empty value is `""`), and every byte but
//! `A-Z a-z 0-9 - . _ ~ /` as `%XX` in upper-case hex. s3fs reads it back by cutting the text between the
//! first `{` and the last `}` at every `,`, each pair at its first `:`, and taking what lies between the
//! first and the last `"` of each side; a pair that does not parse is skipped. Names holding `"`, `,` or
//! `:` cannot survive that reading, so they are refused; this module writes what s3fs writes and reads
//! what it reads.
//!
//! S3 keeps at most 2 KiB of user metadata per object (names and values of every `x-amz-meta-` header),
//! which bounds what an object's extended attributes may take.

use std::collections::BTreeMap;

use crate::{HomeError, HomeResult};

/// The metadata key, without the `x-amz-meta-` prefix.
pub(super) const KEY: &str = "xattr";
/// S3's bound on an object's user metadata, in bytes (keys and values).
pub(super) const METADATA_MAX: usize = 2048;
/// What the other metadata keys may take beside `xattr` (mode, uid, gid, mtime, and s3fs's atime and
/// ctime): with the key itself, what the check of a set of attributes leaves room for.
const OTHER_METADATA: usize = 160;
/// Longest name and largest value Linux takes (`XATTR_NAME_MAX`, `XATTR_SIZE_MAX`).
const NAME_MAX: usize = 255;
const VALUE_MAX: usize = 65536;

/// An object's extended attributes, name to value, in the order s3fs writes them.
pub(super) type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// The `xattr` value that holds `xattrs`; `None` for none (s3fs then drops the key).
pub(super) fn encode(xattrs: &Xattrs) -> Option<String> {
    if xattrs.is_empty() {
        return None;
    }
    let mut json = vec![b'{'];
    for (i, (name, value)) in xattrs.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        json.push(b'"');
        json.extend_from_slice(name);
        json.extend_from_slice(b"\":\"");
        json.extend_from_slice(base64_encode(value).as_bytes());
        json.push(b'"');
    }
    json.push(b'}');
    Some(percent_encode(&json))
}

/// The attributes an `xattr` value holds, and whether all of it could be read: a value that is not
/// percent-encoded or holds no `{…}` gives none, a pair that does not parse is left out (as s3fs does).
pub(super) fn decode(value: &str) -> (Xattrs, bool) {
    let mut out = Xattrs::new();
    let Some(json) = percent_decode(value) else {
        return (out, false);
    };
    let (Some(start), Some(end)) = (
        json.iter().position(|&b| b == b'{'),
        json.iter().rposition(|&b| b == b'}'),
    ) else {
        return (out, false);
    };
    if end <= start {
        return (out, false);
    }
    let body = &json[start + 1..end];
    if body.is_empty() {
        return (out, true);
    }
    let mut clean = true;
    for pair in body.split(|&b| b == b',') {
        let parsed = pair.iter().position(|&b| b == b':').and_then(|colon| {
            let name = unquote(&pair[..colon])?;
            let value = base64_decode(unquote(&pair[colon + 1..])?)?;
            (!name.is_empty()).then(|| (name.to_vec(), value))
        });
        match parsed {
            Some((name, value)) => {
                out.insert(name, value);
            }
            None => clean = false,
        }
    }
    (out, clean)
}

/// Whether a name can be kept in the `xattr` key: one Linux takes (1 to 255 bytes, else `ERANGE`), and
/// none of the bytes that s3fs's reading cuts at (`InvalidName`).
pub(super) fn check_name(name: &[u8]) -> HomeResult<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(HomeError::Os(libc::ERANGE));
    }
    if let Some(&b) = name.iter().find(|&&b| matches!(b, 0 | b'"' | b',' | b':')) {
        return Err(HomeError::InvalidName(format!(
            "an extended attribute name on S3 cannot hold {:?} (s3fs's format)",
            b as char
        )));
    }
    Ok(())
}

/// Whether one object may hold all of `xattrs` beside its other metadata: each name keepable, each value
/// one Linux takes, and the encoded key within S3's 2 KiB of metadata with room left for the rest
/// (`E2BIG` past it).
pub(super) fn check(xattrs: &[(Vec<u8>, Vec<u8>)]) -> HomeResult<()> {
    let mut all = Xattrs::new();
    for (name, value) in xattrs {
        check_name(name)?;
        if value.len() > VALUE_MAX {
            return Err(HomeError::Os(libc::E2BIG));
        }
        all.insert(name.clone(), value.clone());
    }
    let encoded = encode(&all).map_or(0, |v| KEY.len() + v.len());
    if encoded + OTHER_METADATA > METADATA_MAX {
        return Err(HomeError::Os(libc::E2BIG));
    }
    Ok(())
}

/// The bytes between the first and the last `"` of `s`, which must hold no other; `s` itself when it has
/// none (s3fs's reading).
fn unquote(s: &[u8]) -> Option<&[u8]> {
    let Some(first) = s.iter().position(|&b| b == b'"') else {
        return Some(s);
    };
    let rest = &s[first + 1..];
    let last = rest.iter().rposition(|&b| b == b'"')?;
    let inner = &rest[..last];
    (!inner.contains(&b'"')).then_some(inner)
}

/// Every byte but `A-Z a-z 0-9 - . _ ~ /` as `%XX`, upper-case (s3fs's `urlEncode`).
fn percent_encode(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
    out
}

/// `%XX` (either case) as its byte, anything else as it is; `None` for a `%` not followed by two hex
/// digits.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with `=` padding.
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64, padded or not; `None` for anything else.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    let text = match text.iter().position(|&b| b == b'=') {
        // Padding only at the end, and at most two.
        Some(p) if text[p..].iter().all(|&b| b == b'=') && text.len() - p <= 2 => &text[..p],
        Some(_) => return None,
        None => text,
    };
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = BASE64.iter().position(|&a| a == c)? as u32;
            n |= v << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xattrs(pairs: &[(&[u8], &[u8])]) -> Xattrs {
        pairs.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
    }

    /// What s3fs 1.90 (`-o use_xattr`) stored for `os.setxattr` of these five on one file, as S3 gave it
    /// back: names sorted, base64 padded, `*`, `+`, ` `, `=`, `%` and UTF-8 percent-encoded, `/` and `~` not.
    const S3FS_WROTE: &str = "%7B%22user.a%22%3A%22dmFs%22%2C%22user.bin%22%3A%22AAEC//4%2BPw%3D%3D%22%2C%22user.k%22\
        %3A%22dg%3D%3D%22%2C%22user.%C3%BCn%C3%AF%20%25~%2A%2B%20x%22%3A%224oKs%22%7D";

    fn s3fs_example() -> Xattrs {
        xattrs(&[
            (b"user.k", b"v"),
            (b"user.a", b"val"),
            (b"user.bin", &[0, 1, 2, 0xff, 0xfe, 0x3e, 0x3f]),
            ("user.ünï %~*+ x".as_bytes(), "€".as_bytes()),
        ])
    }

    #[test]
    fn what_s3fs_wrote_is_read_and_written_byte_for_byte() {
        assert_eq!(decode(S3FS_WROTE), (s3fs_example(), true));
        assert_eq!(encode(&s3fs_example()).as_deref(), Some(S3FS_WROTE));
        // A directory's marker, from the same run.
        assert_eq!(
            decode("%7B%22user.dir%22%3A%22RA%3D%3D%22%7D"),
            (xattrs(&[(b"user.dir", b"D")]), true)
        );
    }

    #[test]
    fn binary_values_and_odd_names_round_trip() {
        let all_bytes: Vec<u8> = (0..=255).collect();
        let x = xattrs(&[
            (b"user.all", &all_bytes),
            (b"user.empty", b""),
            (b"user.one", b"1"),
            (b"user.two", b"12"),
            (b"user.three", b"123"),
            ("user.ß ∂ 日本 %41 %".as_bytes(), b"\0\0"),
            (b"trusted.{x}", b"braces"),
            (b"user.not-utf8-\xff\xfe", b"\xff"),
            (b"user.slash/tilde~", b"+/="),
        ]);
        let encoded = encode(&x).unwrap();
        // A header value: printable ASCII only.
        assert!(encoded.bytes().all(|b| b.is_ascii_graphic()), "{encoded}");
        assert_eq!(decode(&encoded), (x, true));
        // An empty value is "" as s3fs writes the base64 of nothing.
        assert_eq!(
            encode(&xattrs(&[(b"user.e", b"")])).as_deref(),
            Some("%7B%22user.e%22%3A%22%22%7D")
        );
        assert_eq!(encode(&Xattrs::new()), None);
        assert_eq!(base64_encode(b"val"), "dmFs");
        assert_eq!(base64_encode(b"v"), "dg==");
        assert_eq!(base64_encode(b"12"), "MTI=");
    }

    #[test]
    fn what_does_not_parse_is_left_out_and_said() {
        // Not percent-encoded as s3fs does, or no object at all: nothing.
        assert_eq!(decode("%7B%22user.a%22%3A%22dmFs%22%7"), (Xattrs::new(), false));
        assert_eq!(decode("%ZZ"), (Xattrs::new(), false));
        assert_eq!(decode("%+7B%22a%22%3A%22%22%7D"), (Xattrs::new(), false));
        assert_eq!(decode("just text"), (Xattrs::new(), false));
        assert_eq!(decode("}{"), (Xattrs::new(), false));
        // An empty object is none, cleanly.
        assert_eq!(decode("%7B%7D"), (Xattrs::new(), true));
        // One bad pair (not base64, no colon, no name) is skipped; the others are read.
        let mixed = percent_encode(br#"{"user.a":"dmFs","user.b":"not base64!","user.c","":"dg==","user.d":"dg=="}"#);
        assert_eq!(
            decode(&mixed),
            (xattrs(&[(b"user.a", b"val"), (b"user.d", b"v")]), false)
        );
        // Spacing and lower-case hex as other writers may give them, unpadded base64.
        assert_eq!(
            decode("%7b %22user.a%22 : %22dmFs%22 , %22user.k%22:%22dg%22 %7d"),
            (xattrs(&[(b"user.a", b"val"), (b"user.k", b"v")]), true)
        );
    }

    #[test]
    fn names_s3fs_cannot_read_back_are_refused() {
        for bad in [&b"user.a,b"[..], b"user.a:b", b"user.\"q\"", b"user.a\0b"] {
            assert!(
                matches!(check_name(bad), Err(HomeError::InvalidName(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(check_name(b""), Err(HomeError::Os(libc::ERANGE))));
        assert!(matches!(check_name(&[b'n'; 256]), Err(HomeError::Os(libc::ERANGE))));
        check_name(&[b'n'; 255]).unwrap();
        check_name("user.100% ünï{}".as_bytes()).unwrap();
    }

    #[test]
    fn the_check_leaves_room_for_the_other_metadata_in_2_kib() {
        let one = |len: usize| vec![(b"user.a".to_vec(), vec![b'x'; len])];
        check(&[]).unwrap();
        // `xattr` (5) + "%7B%22user.a%22%3A%22" (21) + base64 + "%22%7D" (6) + 160 for the rest.
        let fits = (METADATA_MAX - OTHER_METADATA - 5 - 21 - 6) / 4 * 3;
        check(&one(fits)).unwrap();
        assert!(matches!(check(&one(fits + 3)), Err(HomeError::Os(libc::E2BIG))));
        assert!(matches!(check(&one(65537)), Err(HomeError::Os(libc::E2BIG))));
        // Each fits, not both.
        let two = vec![
            (b"user.a".to_vec(), vec![b'x'; fits / 2 + 30]),
            (b"user.b".to_vec(), vec![b'y'; fits / 2 + 30]),
        ];
        check(&two[..1]).unwrap();
        assert!(matches!(check(&two), Err(HomeError::Os(libc::E2BIG))));
        assert!(matches!(
            check(&[(b"user.a:b".to_vec(), b"1".to_vec())]),
            Err(HomeError::InvalidName(_))
        ));
    }
}
