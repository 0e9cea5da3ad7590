//! Modes, owners and times of objects, kept in object metadata in the convention of s3fs (which rclone
//! reads for the time): `x-amz-meta-mode` (the whole `st_mode` in decimal, type bits included, so a symlink
//! is an object whose content is its target and whose mode says `S_IFLNK`; rclone's `--metadata` writes it
//! in octal, `100644`, which is read too: see [`ModeText`]), `x-amz-meta-uid`,
//! `x-amz-meta-gid`, and `x-amz-meta-mtime` (seconds since the epoch, with a fraction when the time has
//! one, in nine digits as s3fs writes it).
//!
//! S3 lists keys without their metadata: with metadata kept, a listing asks each object for it (a HEAD
//! each, many at once), as s3fs and rclone do. An object no tool gave metadata shows 0644 (0755 for a
//! directory), the daemon's owner and the time it was stored.
//!
//! Extended attributes are s3fs's `x-amz-meta-xattr` (`xattr.rs`): kept here as stored, so that every
//! rewrite of an object (new data, a new mode, a truncate) carries them on, as it carries every key larder
//! does not read itself (s3fs's `atime` and `ctime`, other tools' keys). S3 keeps at most 2 KiB of
//! metadata per object, and a change of an attribute rewrites the object.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::xattr;
use crate::{FileKind, HomeAttr};

/// Metadata keys, without the `x-amz-meta-` prefix S3 gives them on the wire.
const MODE: &str = "mode";
const UID: &str = "uid";
const GID: &str = "gid";
const MTIME: &str = "mtime";

/// What an object's metadata says of it; `None` where it says nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ObjectMeta {
    pub mode: Option<u32>,
    /// The mode of a directory object (a key ending in `/`), where its text reads as a directory's mode in
    /// octal but not in decimal (rclone's `42775`, which in decimal would be a symlink's).
    pub dir_mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
    /// The extended attributes as stored (s3fs's percent-encoded `xattr` value), read only when asked for.
    pub xattr: Option<String>,
    /// Every other key and its value, carried on unread.
    pub other: BTreeMap<String, String>,
}

impl ObjectMeta {
    /// Read from an object's user metadata (keys without the `x-amz-meta-` prefix).
    pub fn parse<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> ObjectMeta {
        let num = |v: &str| v.trim().parse::<u32>().ok();
        let mut meta = ObjectMeta::default();
        for (k, v) in pairs {
            match k {
                MODE => {
                    let text = ModeText::parse(v);
                    meta.mode = text.for_file();
                    meta.dir_mode = text.for_dir().filter(|d| Some(*d) != meta.mode);
                }
                UID => meta.uid = num(v),
                GID => meta.gid = num(v),
                MTIME => meta.mtime = parse_time(v),
                xattr::KEY => meta.xattr = Some(v.to_string()),
                _ => {
                    meta.other.insert(k.to_string(), v.to_string());
                }
            }
        }
        meta
    }

    /// This metadata (made of an object's attributes) with what `stored` holds besides them: its extended
    /// attributes and the keys of other tools, which a rewrite must not lose.
    pub fn keeping(mut self, stored: &ObjectMeta) -> ObjectMeta {
        self.xattr = stored.xattr.clone();
        self.other = stored.other.clone();
        self
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
            ..ObjectMeta::default()
        }
    }

    /// As user metadata to store.
    pub fn to_map(&self) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = self.other.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
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
        if let Some(x) = self.xattr.as_ref().filter(|x| !x.is_empty()) {
            m.insert(xattr::KEY.into(), x.clone());
        }
        m
    }

    /// The bytes S3 counts against its 2 KiB: every key and value.
    pub fn stored_len(&self) -> usize {
        self.to_map().iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// `attr` (made from what S3 tells of every object) with what this metadata says.
    pub fn apply(&self, attr: &mut HomeAttr) {
        let mode = match attr.kind {
            FileKind::Dir => self.dir_mode.or(self.mode),
            _ => self.mode,
        };
        if let Some(mode) = mode {
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

/// The text of `x-amz-meta-mode`, read both ways it is written: in decimal (s3fs, larder: `33188`) and in
/// octal (rclone: `100644`), each with the file type bits. Where only one reading names a file type, it is
/// that one; where both do (`41471`: an s3fs symlink, or an rclone directory with the sticky bit), decimal
/// wins, s3fs's being the convention larder writes, except on a directory object whose octal reading is a
/// directory's and whose decimal reading is not. A text that names no type in either reading is decimal
/// permission bits, as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ModeText {
    decimal: Option<u32>,
    octal: Option<u32>,
}

impl ModeText {
    fn parse(v: &str) -> ModeText {
        let v = v.trim();
        let octal = u32::from_str_radix(v, 8).ok();
        // A leading zero ("0644") is octal whatever it reads as in decimal.
        let decimal = if v.len() > 1 && v.starts_with('0') {
            octal
        } else {
            v.parse::<u32>().ok()
        };
        ModeText { decimal, octal }
    }

    /// A whole mode of a known type.
    fn typed(m: u32) -> bool {
        m <= 0o177777
            && [
                libc::S_IFREG,
                libc::S_IFDIR,
                libc::S_IFLNK,
                libc::S_IFIFO,
                libc::S_IFSOCK,
                libc::S_IFCHR,
                libc::S_IFBLK,
            ]
            .contains(&(m & libc::S_IFMT))
    }

    fn is_dir(m: u32) -> bool {
        Self::typed(m) && m & libc::S_IFMT == libc::S_IFDIR
    }

    /// The mode of an object that is not a directory marker.
    fn for_file(&self) -> Option<u32> {
        let typed = |m: &Option<u32>| m.filter(|m| Self::typed(*m));
        typed(&self.decimal).or(typed(&self.octal)).or(self.decimal)
    }

    /// The mode of a directory marker.
    fn for_dir(&self) -> Option<u32> {
        let dir = |m: &Option<u32>| m.filter(|m| Self::is_dir(*m));
        dir(&self.decimal).or(dir(&self.octal)).or(self.for_file())
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

    /// A file of `size` bytes as S3 shows one without metadata (before the metadata's `apply`).
    fn plain_file(size: u64) -> HomeAttr {
        HomeAttr {
            kind: FileKind::File,
            id: 0,
            size,
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
        }
    }

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
        let m = ObjectMeta::parse([
            ("mode", "41471"), // S_IFLNK | 0777
            ("uid", "1000"),
            ("gid", "100"),
            ("mtime", "981173106"),
        ]);
        assert_eq!(m.mode, Some(libc::S_IFLNK | 0o777));
        let mut attr = plain_file(5);
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
        ObjectMeta::parse([]).apply(&mut attr);
        assert_eq!(attr, before);
    }

    #[test]
    fn modes_in_rclones_octal_read_as_in_s3fss_decimal() {
        let read = |mode: &str, kind: FileKind| {
            let mut attr = plain_file(1);
            attr.kind = kind;
            ObjectMeta::parse([("mode", mode)]).apply(&mut attr);
            (attr.kind, attr.perm)
        };
        use FileKind::{Dir, File, Symlink};
        for (text, kind, want) in [
            // rclone --metadata: octal, with the type bits.
            ("100644", File, (File, 0o644)),
            ("100755", File, (File, 0o755)),
            ("120777", File, (Symlink, 0o777)),
            ("40755", Dir, (Dir, 0o755)),
            // In decimal a symlink's mode: on a directory marker, rclone's setgid directory.
            ("42775", Dir, (Dir, 0o2775)),
            // s3fs and larder: decimal.
            ("33188", File, (File, 0o644)),
            ("33261", File, (File, 0o755)),
            ("16877", Dir, (Dir, 0o755)),
            // Both readings name a type: decimal, s3fs's symlink.
            ("41471", File, (Symlink, 0o777)),
            // No type either way: decimal permission bits, as before; a leading zero is octal.
            ("420", File, (File, 0o644)),
            ("0640", File, (File, 0o640)),
            // Not a number: nothing changes.
            ("rw-r--r--", File, (File, 0o644)),
        ] {
            assert_eq!(read(text, kind), want, "mode {text:?} on a {kind:?}");
        }
    }

    #[test]
    fn a_rewrite_keeps_the_xattrs_and_the_keys_of_other_tools() {
        // As s3fs leaves a file it made and gave an extended attribute.
        let stored = ObjectMeta::parse([
            ("atime", "1795646241"),
            ("ctime", "1795646246"),
            ("gid", "0"),
            ("mode", "33188"),
            ("mtime", "1795646241"),
            ("uid", "0"),
            ("xattr", "%7B%22user.k%22%3A%22dg%3D%3D%22%7D"),
        ]);
        assert_eq!(stored.xattr.as_deref(), Some("%7B%22user.k%22%3A%22dg%3D%3D%22%7D"));
        let mut attr = plain_file(2);
        stored.apply(&mut attr);
        // A chmod: the new mode, everything else as it was.
        attr.perm = 0o600;
        let map = ObjectMeta::of(&attr).keeping(&stored).to_map();
        let mut got: Vec<_> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
        got.sort();
        assert_eq!(
            got,
            [
                "atime=1795646241",
                "ctime=1795646246",
                "gid=0",
                "mode=33152",
                "mtime=1795646241",
                "uid=0",
                "xattr=%7B%22user.k%22%3A%22dg%3D%3D%22%7D",
            ]
        );
        assert_eq!(
            ObjectMeta::of(&attr).keeping(&stored).stored_len(),
            got.iter().map(|l| l.len() - 1).sum::<usize>()
        );
        // Without attributes the key is not written at all.
        let none = ObjectMeta {
            xattr: Some(String::new()),
            ..ObjectMeta::of(&attr)
        };
        assert!(!none.to_map().contains_key("xattr"));
    }
}
