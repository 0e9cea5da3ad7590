//! Modes, owners and times of objects, kept in object metadata in the convention of s3fs (which rclone
//! reads for the time): `x-amz-meta-mode` (the whole `st_mode` in decimal, type bits included, so a symlink
//! is an object whose content is its target and whose mode says `S_IFLNK`), `x-amz-meta-uid`,
//! `x-amz-meta-gid`, and `x-amz-meta-mtime` (seconds since the epoch, with a fraction when the time has
//! one, in nine digits as s3fs writes it).
//!
//! S3 lists keys without their metadata: with metadata kept, a listing asks each object for it (a HEAD
//! each, many at once), as s3fs and rclone do. An object no tool gave metadata shows 0644 (0755 for a
//! directory), the daemon's owner and the time it was stored.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{FileKind, HomeAttr};

/// Metadata keys, without the `x-amz-meta-` prefix S3 gives them on the wire.
const MODE: &str = "mode";
const UID: &str = "uid";
const GID: &str = "gid";
const MTIME: &str = "mtime";

/// What an object's metadata says of it; `None` where it says nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ObjectMeta {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
}

impl ObjectMeta {
    /// Read from an object's user metadata.
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> ObjectMeta {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u32>().ok());
        ObjectMeta {
            mode: num(MODE),
            uid: num(UID),
            gid: num(GID),
            mtime: get(MTIME).and_then(parse_time),
        }
    }

    /// The metadata of an object with these attributes.
    pub fn of(attr: &HomeAttr) -> ObjectMeta {
        let kind_bits = match attr.kind {
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Dir => libc::S_IFDIR,
            _ => libc::S_IFREG,
        };
        ObjectMeta {
            mode: Some(kind_bits | (attr.perm & 0o7777)),
            uid: Some(attr.uid),
            gid: Some(attr.gid),
            mtime: Some(attr.mtime),
        }
    }

    /// As user metadata to store.
    pub fn to_map(self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        if let Some(v) = self.mode {
            m.insert(MODE.into(), v.to_string());
        }
        if let Some(v) = self.uid {
            m.insert(UID.into(), v.to_string());
        }
        if let Some(v) = self.gid {
            m.insert(GID.into(), v.to_string());
        }
        if let Some(t) = self.mtime {
            m.insert(MTIME.into(), format_time(t));
        }
        m
    }

    /// `attr` (made from what S3 tells of every object) with what this metadata says.
    pub fn apply(self, attr: &mut HomeAttr) {
        if let Some(mode) = self.mode {
            if attr.kind != FileKind::Dir {
                attr.kind = match FileKind::from_mode(mode) {
                    FileKind::Symlink => FileKind::Symlink,
                    _ => FileKind::File,
                };
            }
            attr.perm = mode & 0o7777;
        }
        if let Some(uid) = self.uid {
            attr.uid = uid;
        }
        if let Some(gid) = self.gid {
            attr.gid = gid;
        }
        if let Some(t) = self.mtime {
            attr.mtime = t;
            attr.atime = t;
        }
    }
}

/// Seconds since the epoch, with nine decimals only when there is a fraction ("1700000000",
/// "1700000000.500000000"), as s3fs writes it.
fn format_time(t: SystemTime) -> String {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.subsec_nanos() == 0 => d.as_secs().to_string(),
        // Nine digits: s3fs reads the fraction as a count of nanoseconds.
        Ok(d) => format!("{}.{:09}", d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            // Before the epoch: negative seconds, whole (s3fs's form has no fraction there).
            format!("-{}", e.duration().as_secs_f64().ceil() as u64)
        }
    }
}

fn parse_time(v: &str) -> Option<SystemTime> {
    let v = v.trim();
    let (neg, v) = match v.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let secs: u64 = secs.parse().ok()?;
    let nanos = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().take(9).collect();
        if !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        format!("{digits:0<9}").parse::<u32>().ok()?
    };
    let d = Duration::new(secs, nanos);
    if neg {
        UNIX_EPOCH.checked_sub(d)
    } else {
        UNIX_EPOCH.checked_add(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_read_what_s3fs_and_rclone_write() {
        for t in [
            UNIX_EPOCH + Duration::new(1_700_000_000, 0),
            UNIX_EPOCH + Duration::new(1_700_000_000, 500_000_000),
            UNIX_EPOCH + Duration::new(981_173_106, 123_456_789),
            UNIX_EPOCH - Duration::from_secs(86_400),
        ] {
            assert_eq!(parse_time(&format_time(t)), Some(t), "{}", format_time(t));
        }
        assert_eq!(format_time(UNIX_EPOCH + Duration::new(5, 0)), "5");
        assert_eq!(format_time(UNIX_EPOCH + Duration::new(5, 250_000_000)), "5.250000000");
        // rclone's form: seconds with nine decimals.
        assert_eq!(
            parse_time("1700000000.000000001"),
            Some(UNIX_EPOCH + Duration::new(1_700_000_000, 1))
        );
        assert_eq!(parse_time("soon"), None);
        assert_eq!(parse_time("12.x"), None);
    }

    #[test]
    fn a_mode_with_type_bits_says_symlink_and_other_tools_metadata_is_read() {
        let m = ObjectMeta::parse(|k| match k {
            "mode" => Some("41471"), // S_IFLNK | 0777
            "uid" => Some("1000"),
            "gid" => Some("100"),
            "mtime" => Some("981173106"),
            _ => None,
        });
        assert_eq!(m.mode, Some(libc::S_IFLNK | 0o777));
        let mut attr = HomeAttr {
            kind: FileKind::File,
            id: 0,
            size: 5,
            perm: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            rdev: 0,
            blocks: 1,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            version: crate::Version("e".into()),
        };
        m.apply(&mut attr);
        assert_eq!(
            (attr.kind, attr.perm, attr.uid, attr.gid),
            (FileKind::Symlink, 0o777, 1000, 100)
        );
        assert_eq!(attr.mtime, UNIX_EPOCH + Duration::from_secs(981_173_106));
        // And back: what is stored for it.
        let map = ObjectMeta::of(&attr).to_map();
        assert_eq!(map["mode"], "41471");
        assert_eq!(map["mtime"], "981173106");
        // Nothing said: nothing changed.
        let before = attr.clone();
        ObjectMeta::parse(|_| None).apply(&mut attr);
        assert_eq!(attr, before);
    }
}
