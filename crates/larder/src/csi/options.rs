//! A volume's options: the StorageClass's parameters, a PersistentVolume's volume attributes and its
//! mount options, made into the command line of `larder mount`.
//!
//! Keys are the long options of `larder mount` without their dashes (`cache-size`, `validity-lag`,
//! `s3-endpoint`, `cluster`, `bank`...) and `home`; a switch takes `true` or `false`. The plugin's own keys
//! are `unmount` (`leave-pending`, the default, or `drain`) and `on-delete` (`retain`, the default, or
//! `delete`). Keys with a `/` are Kubernetes' own (`csi.storage.k8s.io/...`) and are passed over. Options
//! the plugin sets itself (the mount point, the cache directory, the S3 keys) are refused by name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use larder_home::S3Credentials;
use serde::{Deserialize, Serialize};

use crate::cli::Cli;

/// Options the plugin owns: a volume cannot set them.
const OWNED: [&str; 7] = [
    "mountpoint",
    "cache-dir",
    "foreground",
    "quiet",
    "config",
    "s3-credentials",
    "fault-file",
];

/// What a staged volume is unmounted with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unmount {
    /// Changes not yet at home stay queued in the node's cache directory for the volume's next staging.
    #[default]
    LeavePending,
    /// Push every change to home first (the unstaging fails, and is retried, until home has them).
    Drain,
}

/// A volume's options, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeOptions {
    /// Its home.
    pub home: String,
    /// `larder mount`'s options other than the home, the mount point and what the plugin sets.
    pub args: Vec<String>,
    pub unmount: Unmount,
    /// How long a draining unmount may take.
    pub drain_timeout: Duration,
}

/// The long options of `larder mount`, and whether each takes a value.
fn mount_options() -> HashMap<String, bool> {
    let cmd = Cli::command();
    let mount = cmd.find_subcommand("mount").expect("larder has a mount command");
    mount
        .get_arguments()
        .filter_map(|a| Some((a.get_long()?.to_string(), a.get_action().takes_values())))
        .collect()
}

/// A switch's value.
fn switch(key: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "" | "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!("{key}={value:?}: expected true or false")),
    }
}

/// Merge a volume's attributes with its mount options (`key=value` or `key`, the later winning) and
/// check them against `larder mount`'s own parser.
pub fn volume_options(context: &HashMap<String, String>, mount_flags: &[String]) -> Result<VolumeOptions, String> {
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in context {
        if !k.contains('/') {
            given.insert(k.trim_start_matches('-').to_string(), v.clone());
        }
    }
    for flag in mount_flags.iter().flat_map(|f| f.split(',')) {
        let flag = flag.trim();
        if flag.is_empty() {
            continue;
        }
        let (k, v) = flag.split_once('=').unwrap_or((flag, ""));
        given.insert(k.trim_start_matches('-').to_string(), v.to_string());
    }
    let home = given
        .remove("home")
        .filter(|h| !h.is_empty())
        .ok_or("the volume names no home (the volume attribute or StorageClass parameter `home`)")?;
    let unmount = match given.remove("unmount").as_deref() {
        None | Some("leave-pending") => Unmount::LeavePending,
        Some("drain") => Unmount::Drain,
        Some(other) => return Err(format!("unmount={other:?}: expected leave-pending or drain")),
    };
    let drain_timeout = match given.remove("drain-timeout") {
        None => Duration::from_secs(600),
        Some(t) => crate::units::parse_duration(&t).map_err(|e| format!("drain-timeout: {e}"))?,
    };
    given.remove("on-delete");
    let known = mount_options();
    let mut args = Vec::new();
    for (key, value) in &given {
        if OWNED.contains(&key.as_str()) {
            return Err(format!("{key} is set by the CSI plugin, not by a volume"));
        }
        match known.get(key) {
            None => return Err(format!("{key} is not an option of larder mount")),
            Some(true) => {
                args.push(format!("--{key}"));
                args.push(value.clone());
            }
            Some(false) => {
                if switch(key, value)? {
                    args.push(format!("--{key}"));
                }
            }
        }
    }
    let mut line = vec!["larder".to_string(), "mount".into(), home.clone(), "/mnt".into()];
    line.extend(args.iter().cloned());
    if let Err(e) = Cli::try_parse_from(&line) {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or("").trim_start_matches("error: ");
        return Err(format!("the volume's options: {first}"));
    }
    Ok(VolumeOptions {
        home,
        args,
        unmount,
        drain_timeout,
    })
}

/// S3 keys from a volume's secrets (`None`: the secrets hold none): `aws_access_key_id`,
/// `aws_secret_access_key` and optionally `aws_session_token` (also accepted in the AWS environment
/// variables' spelling, `AWS_ACCESS_KEY_ID`...).
pub fn credentials(secrets: &HashMap<String, String>) -> Result<Option<S3Credentials>, String> {
    let get = |k: &str| {
        secrets
            .get(k)
            .or_else(|| secrets.get(&k.to_ascii_uppercase()))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    match (get("aws_access_key_id"), get("aws_secret_access_key")) {
        (None, None) => Ok(None),
        (Some(access_key_id), Some(secret_access_key)) => Ok(Some(S3Credentials {
            access_key_id,
            secret_access_key,
            session_token: get("aws_session_token"),
        })),
        _ => Err("the secrets hold one of aws_access_key_id and aws_secret_access_key without the other".into()),
    }
}

/// The S3 keys of a volume's secrets as an AWS shared-credentials file's text, for `--s3-credentials`.
pub fn credentials_file(secrets: &HashMap<String, String>) -> Result<Option<String>, String> {
    Ok(credentials(secrets)?.map(|c| {
        let mut text = format!(
            "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            c.access_key_id, c.secret_access_key
        );
        if let Some(token) = &c.session_token {
            text.push_str(&format!("aws_session_token = {token}\n"));
        }
        text
    }))
}

/// The command line that stages a volume at `staging`, its cache in `cache_dir`.
pub fn mount_command(
    options: &VolumeOptions,
    staging: &Path,
    cache_dir: &Path,
    credentials: Option<&Path>,
) -> Vec<String> {
    let mut line = vec![
        "mount".to_string(),
        options.home.clone(),
        staging.display().to_string(),
        "--cache-dir".into(),
        cache_dir.display().to_string(),
        "--quiet".into(),
    ];
    if let Some(c) = credentials {
        line.push("--s3-credentials".into());
        line.push(c.display().to_string());
    }
    line.extend(options.args.iter().cloned());
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn attributes_become_mount_options_and_switches_appear_only_when_true() {
        let o = volume_options(
            &ctx(&[
                ("home", "s3://bucket/data"),
                ("cache-size", "20GiB"),
                ("no-dedup", "true"),
                ("no-passthrough", "false"),
                ("csi.storage.k8s.io/pod.name", "web-0"),
                ("storage.kubernetes.io/csiProvisionerIdentity", "123-larder"),
            ]),
            &["validity-lag=30s".into(), "read-only".into()],
        )
        .unwrap();
        assert_eq!(o.home, "s3://bucket/data");
        assert_eq!(o.unmount, Unmount::LeavePending);
        assert_eq!(
            o.args,
            [
                "--cache-size",
                "20GiB",
                "--no-dedup",
                "--read-only",
                "--validity-lag",
                "30s"
            ]
        );
        let line = mount_command(
            &o,
            Path::new("/stage"),
            Path::new("/state/c"),
            Some(Path::new("/state/k")),
        );
        assert_eq!(
            &line[..6],
            [
                "mount",
                "s3://bucket/data",
                "/stage",
                "--cache-dir",
                "/state/c",
                "--quiet"
            ]
        );
        assert_eq!(&line[6..8], ["--s3-credentials", "/state/k"]);
    }

    #[test]
    fn bad_options_are_refused_with_their_name() {
        let cases: [(&[(&str, &str)], &str); 6] = [
            (&[("cache-size", "1GiB")], "names no home"),
            (&[("home", "/h"), ("cache-sise", "1GiB")], "cache-sise is not an option"),
            (
                &[("home", "/h"), ("cache-dir", "/tmp/x")],
                "cache-dir is set by the CSI plugin",
            ),
            (
                &[("home", "/h"), ("s3-credentials", "/k")],
                "s3-credentials is set by the CSI plugin",
            ),
            (&[("home", "/h"), ("cache-size", "lots")], "the volume's options"),
            (
                &[("home", "/h"), ("unmount", "later")],
                "expected leave-pending or drain",
            ),
        ];
        for (pairs, want) in cases {
            let e = volume_options(&ctx(pairs), &[]).unwrap_err();
            assert!(e.contains(want), "{pairs:?}: {e}");
        }
        let e = volume_options(&ctx(&[("home", "/h"), ("no-dedup", "maybe")]), &[]).unwrap_err();
        assert!(e.contains("expected true or false"), "{e}");
        let o = volume_options(&ctx(&[("home", "/h"), ("unmount", "drain")]), &[]).unwrap();
        assert_eq!(o.unmount, Unmount::Drain);
    }

    #[test]
    fn secrets_become_a_credentials_file_and_half_a_pair_is_refused() {
        assert_eq!(credentials_file(&ctx(&[])).unwrap(), None);
        let text = credentials_file(&ctx(&[("aws_access_key_id", "AK"), ("aws_secret_access_key", "SK")]))
            .unwrap()
            .unwrap();
        assert!(text.contains("aws_access_key_id = AK") && text.contains("aws_secret_access_key = SK"));
        let upper = credentials_file(&ctx(&[
            ("AWS_ACCESS_KEY_ID", "AK"),
            ("AWS_SECRET_ACCESS_KEY", "SK"),
            ("AWS_SESSION_TOKEN", "T"),
        ]))
        .unwrap()
        .unwrap();
        assert!(upper.contains("aws_session_token = T"));
        let e = credentials_file(&ctx(&[("aws_access_key_id", "AK")])).unwrap_err();
        assert!(!e.contains("AK"), "a secret reached an error: {e}");
    }
}
