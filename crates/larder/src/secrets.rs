//! Secrets read from files (`--s3-credentials`), never from the command line or a config file that others
//! may read: a file group or others may read is refused, as ssh refuses such a key.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use larder_home::S3Credentials;

/// Read `path` if only its owner may read it.
fn read_private(path: &Path, what: &str) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("cannot open the {what} {}", path.display()))?;
    let meta = f
        .metadata()
        .with_context(|| format!("cannot stat the {what} {}", path.display()))?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        bail!(
            "the {what} {} may be read by others (mode {mode:04o}): make it its owner's alone (chmod 600 {})",
            path.display(),
            path.display()
        );
    }
    let mut text = String::new();
    f.read_to_string(&mut text)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    Ok(text)
}

/// S3 keys from a file in the AWS shared-credentials format (`[default]`, `aws_access_key_id = ...`,
/// `aws_secret_access_key = ...`, optionally `aws_session_token = ...`): the profile `$AWS_PROFILE`, else
/// `default`, else the file's only one.
pub fn s3_credentials(path: &Path) -> Result<S3Credentials> {
    let what = "S3 credentials file";
    let text = read_private(path, what)?;
    let shown = path.display();
    let ini = ini::Ini::load_from_str(&text).map_err(|e| anyhow!("the {what} {shown} is not an INI file: {e}"))?;
    let wanted = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let named: Vec<&str> = ini.sections().flatten().collect();
    let section = match ini.section(Some(wanted.as_str())) {
        Some(s) => s,
        None if named.len() == 1 => ini.section(Some(named[0])).expect("a section listed is there"),
        None => bail!(
            "the {what} {shown} has no profile [{wanted}] (it has {})",
            if named.is_empty() {
                "none".to_string()
            } else {
                named.join(", ")
            }
        ),
    };
    let key = |k: &str| {
        section
            .get(k)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from)
    };
    let field = |k: &str| key(k).ok_or_else(|| anyhow!("the {what} {shown} has no {k}"));
    Ok(S3Credentials {
        access_key_id: field("aws_access_key_id")?,
        secret_access_key: field("aws_secret_access_key")?,
        session_token: key("aws_session_token"),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn file(text: &str, mode: u32) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("creds");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, p)
    }

    #[test]
    fn keys_come_from_the_default_profile_or_the_only_one() {
        let (_d, p) = file(
            "[other]\naws_access_key_id = O\naws_secret_access_key = o\n\n[default]\naws_access_key_id = AK\n\
             aws_secret_access_key = sk\naws_session_token = tok\n",
            0o600,
        );
        let c = s3_credentials(&p).unwrap();
        assert_eq!(
            (
                c.access_key_id.as_str(),
                c.secret_access_key.as_str(),
                c.session_token.as_deref()
            ),
            ("AK", "sk", Some("tok"))
        );
        let (_d, p) = file("[ci]\naws_access_key_id=A\naws_secret_access_key=s\n", 0o400);
        let c = s3_credentials(&p).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.session_token.as_deref()), ("A", None));
        // The secret stays out of logs.
        assert!(!format!("{c:?}").contains("\"s\""), "{c:?}");
    }

    #[test]
    fn a_file_others_may_read_or_one_without_keys_is_refused_with_the_reason() {
        let (_d, p) = file("[default]\naws_access_key_id = A\naws_secret_access_key = s\n", 0o640);
        let e = s3_credentials(&p).unwrap_err().to_string();
        assert!(e.contains("mode 0640") && e.contains("chmod 600"), "{e}");
        let (_d, p) = file("[default]\naws_access_key_id = A\n", 0o600);
        let e = s3_credentials(&p).unwrap_err().to_string();
        assert!(e.contains("aws_secret_access_key"), "{e}");
        let (_d, p) = file("[a]\naws_access_key_id = A\n[b]\naws_access_key_id = B\n", 0o600);
        let e = s3_credentials(&p).unwrap_err().to_string();
        assert!(e.contains("no profile [default]") && e.contains("a, b"), "{e}");
        let e = s3_credentials(Path::new("/nonexistent/creds")).unwrap_err().to_string();
        assert!(e.contains("cannot open the S3 credentials file"), "{e}");
    }
}
