//! Where `larder mount`'s options come from besides its own command line: a TOML file (`--config FILE`),
//! whose keys are the long options of `larder mount` (and `home`, `mountpoint`), overridden by the
//! command line; and the form mount(8) calls a helper in (`mount.fuse.larder HOME MNT -o k=v,...`), so
//! that `mount -t fuse.larder` and `/etc/fstab` mount larder.
//!
//! Both are turned into the plain `larder mount ...` command line before clap reads it; that line (without
//! `--config`) is also what the daemon is started with.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};
use clap::CommandFactory;

use crate::cli::Cli;

/// The names mount(8) may call the helper by.
const HELPER_NAMES: [&str; 2] = ["mount.fuse.larder", "mount.larder"];

/// Mount options of mount(8) and fstab that are not larder's: the kernel's generic ones (larder's mount is
/// always nodev and nosuid as FUSE makes it), and those only mount(8), systemd or fstab read.
const GENERIC: [&str; 23] = [
    "rw",
    "defaults",
    "auto",
    "noauto",
    "_netdev",
    "nofail",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "diratime",
    "async",
    "lazytime",
    "nolazytime",
    "silent",
];

/// The command line `larder` acts on, once made (see [`remember`]).
static ARGS: OnceLock<Vec<OsString>> = OnceLock::new();

/// Keep the command line `larder` acts on: a daemon started from it is given the same.
pub fn remember(args: Vec<OsString>) {
    let _ = ARGS.set(args);
}

/// The arguments (after the program's name) `larder` acts on: what a re-run of it is given.
pub fn given() -> Vec<OsString> {
    match ARGS.get() {
        Some(a) => a.iter().skip(1).cloned().collect(),
        None => std::env::args_os().skip(1).collect(),
    }
}

/// The command line `larder` acts on: its own, or the helper's and the config file's made into one.
pub fn args() -> Result<Vec<OsString>> {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let called = argv
        .first()
        .map(|a| Path::new(a).file_name().unwrap_or(a.as_os_str()).to_os_string())
        .unwrap_or_default();
    if HELPER_NAMES.iter().any(|n| called == OsStr::new(n)) {
        argv = from_helper(&argv[1..])?;
        if argv.is_empty() {
            // `-f`: mount(8) asks for everything but the mount itself.
            return Ok(Vec::new());
        }
    }
    if argv.get(1).is_some_and(|a| a == "mount") {
        argv = with_config(argv)?;
    }
    Ok(argv)
}

/// `mount.fuse.larder HOME MNT [-o OPTS]... [-n] [-s] [-v] [-r] [-w] [-f]` as `larder mount HOME MNT --opt...`;
/// empty for `-f` (fake: mount nothing).
fn from_helper(args: &[OsString]) -> Result<Vec<OsString>> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut read_only = false;
    let mut verbose = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a
            .to_str()
            .ok_or_else(|| anyhow!("mount argument is not UTF-8: {a:?}"))?;
        match s {
            "-o" => {
                let o = it.next().ok_or_else(|| anyhow!("-o needs a value"))?;
                options.push(
                    o.to_str()
                        .ok_or_else(|| anyhow!("mount options are not UTF-8"))?
                        .to_string(),
                );
            }
            "-f" => return Ok(Vec::new()),
            "-r" => read_only = true,
            "-v" => verbose = true,
            "-n" | "-s" | "-w" => {}
            _ if s.starts_with("-o") => options.push(s[2..].to_string()),
            _ if s.starts_with('-') => bail!("mount.fuse.larder: unknown flag {s}"),
            _ => positional.push(a.clone()),
        }
    }
    let [home, mountpoint] = <[OsString; 2]>::try_from(positional)
        .map_err(|p| anyhow!("mount.fuse.larder takes HOME and MOUNTPOINT, got {} arguments", p.len()))?;
    // `mount -o remount,...`: the mount changes in place (`larder remount`), not a new one.
    if options.iter().flat_map(|o| o.split(',')).any(|o| o == "remount") {
        let mut o = options.join(",");
        if read_only {
            o.push_str(",ro");
        }
        return Ok(vec![
            "larder".into(),
            "remount".into(),
            mountpoint,
            "-o".into(),
            o.into(),
        ]);
    }
    let mount = Cli::command();
    let mount = mount.find_subcommand("mount").expect("larder has a mount command");
    let mut out: Vec<OsString> = vec!["larder".into(), "mount".into(), home, mountpoint];
    for opt in options.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        // The atime options are larder's to follow: the kernel leaves a FUSE file's atime to the daemon.
        let atime = match key {
            "noatime" => Some("--atime=noatime"),
            "relatime" => Some("--atime=relatime"),
            "strictatime" | "norelatime" => Some("--atime=strictatime"),
            "nodiratime" => Some("--nodiratime"),
            _ => None,
        };
        if let (Some(a), None) = (atime, value) {
            out.push(a.into());
            continue;
        }
        if value.is_none() && (GENERIC.contains(&key) || key == "ro") {
            read_only |= key == "ro";
            continue;
        }
        if key.starts_with("x-") || key == "comment" {
            continue;
        }
        let long = key.replace('_', "-");
        let arg = option(mount, &long).ok_or_else(|| {
            anyhow!("mount option '{key}' is not an option of larder mount (see larder mount --help; values with commas go in a config=FILE)")
        })?;
        match (value, arg.get_action().takes_values()) {
            (Some(v), true) => out.push(format!("--{long}={v}").into()),
            (None, false) => out.push(format!("--{long}").into()),
            (None, true) => bail!("mount option '{key}' needs a value ({key}=...)"),
            (Some(_), false) => bail!("mount option '{key}' takes no value"),
        }
    }
    if read_only {
        out.push("--read-only".into());
    }
    // mount(8)'s helpers are silent on success; `-v` asks for words.
    if !verbose && !out.iter().any(|a| a == "--quiet") {
        out.push("--quiet".into());
    }
    Ok(out)
}

/// A long option of `larder mount` (not the help, not a positional).
fn option<'a>(mount: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    mount
        .get_arguments()
        .find(|a| a.get_long() == Some(long) && a.get_id() != "help")
}

/// `larder mount ... --config FILE ...`: the file's options first, the command line's after (a later
/// occurrence of an option overrides an earlier one); HOME and MOUNTPOINT from the file when the command
/// line has none. `--config` itself is taken out.
fn with_config(argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let mut file: Option<PathBuf> = None;
    let mut rest = Vec::new();
    let mut it = argv.into_iter().skip(2);
    while let Some(a) = it.next() {
        if a == "--config" {
            file = Some(it.next().ok_or_else(|| anyhow!("--config needs a file"))?.into());
        } else if let Some(f) = a.to_str().and_then(|s| s.strip_prefix("--config=")) {
            file = Some(f.into());
        } else {
            rest.push(a);
        }
    }
    let mut out: Vec<OsString> = vec!["larder".into(), "mount".into()];
    let Some(file) = file else {
        out.extend(rest);
        return Ok(out);
    };
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read the config {}", file.display()))?;
    let cli = Cli::command();
    let mount = cli.find_subcommand("mount").expect("larder has a mount command");
    let (options, positional) = from_toml(mount, &text).with_context(|| format!("config {}", file.display()))?;
    out.extend(options);
    if positionals(mount, &rest) == 0 {
        let [home, mountpoint] = positional;
        out.extend(
            home.zip(mountpoint)
                .map(|(h, m)| [h.into(), m.into()])
                .into_iter()
                .flatten(),
        );
    }
    out.extend(rest);
    Ok(out)
}

/// How many of `args` are positional (not options, nor the values of options that take one).
fn positionals(mount: &clap::Command, args: &[OsString]) -> usize {
    let mut n = 0;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--" {
            return n + it.count();
        }
        if let Some(long) = s.strip_prefix("--") {
            if !long.contains('=') && option(mount, long).is_some_and(|o| o.get_action().takes_values()) {
                it.next();
            }
        } else if !s.starts_with('-') || s == "-" {
            n += 1;
        }
    }
    n
}

/// The options a config file holds, as command-line arguments, and its `home` and `mountpoint`.
fn from_toml(mount: &clap::Command, text: &str) -> Result<(Vec<OsString>, [Option<String>; 2])> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow!("{}", e.to_string().trim()))?;
    let mut out = Vec::new();
    let mut positional = [None, None];
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let slot = match long.as_str() {
            "home" => Some(0),
            "mountpoint" => Some(1),
            _ => None,
        };
        if let Some(i) = slot {
            let toml::Value::String(s) = value else {
                bail!("'{key}' must be a string");
            };
            positional[i] = Some(s.clone());
            continue;
        }
        if long == "config" {
            bail!("a config file cannot name another (config = ...)");
        }
        let arg = option(mount, &long).ok_or_else(|| anyhow!("'{key}' is not an option of larder mount"))?;
        let takes = arg.get_action().takes_values();
        let values = match value {
            toml::Value::Array(a) => a.clone(),
            v => vec![v.clone()],
        };
        for v in values {
            let text = match (&v, takes) {
                (toml::Value::Boolean(b), false) => {
                    if *b {
                        out.push(format!("--{long}").into());
                    }
                    continue;
                }
                (toml::Value::Boolean(b), true) => if *b { "on" } else { "off" }.to_string(),
                (toml::Value::String(s), true) => s.clone(),
                (toml::Value::Integer(i), true) => i.to_string(),
                (toml::Value::Float(f), true) => f.to_string(),
                (_, false) => bail!("'{key}' is a switch: true or false"),
                (other, true) => bail!("'{key}' cannot be {}", other.type_str()),
            };
            out.push(format!("--{long}={text}").into());
        }
    }
    Ok((out, positional))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `larder mount`'s command, as the config's keys are checked against.
    fn mount() -> &'static clap::Command {
        static CLI: std::sync::OnceLock<clap::Command> = std::sync::OnceLock::new();
        CLI.get_or_init(Cli::command)
            .find_subcommand("mount")
            .expect("larder has a mount command")
    }

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    fn helper(args: &[&str]) -> Result<Vec<String>> {
        from_helper(&args.iter().map(OsString::from).collect::<Vec<_>>()).map(|v| strs(&v))
    }

    #[test]
    fn mount_options_become_long_options_and_generic_ones_are_dropped() {
        let got = helper(&[
            "s3://b/p",
            "/mnt/x",
            "-o",
            "rw,noauto,_netdev,x-systemd.automount,cache-dir=/var/cache/x,validity_lag=30s,no-dedup",
        ])
        .unwrap();
        assert_eq!(
            got,
            [
                "larder",
                "mount",
                "s3://b/p",
                "/mnt/x",
                "--cache-dir=/var/cache/x",
                "--validity-lag=30s",
                "--no-dedup",
                "--quiet"
            ]
        );
        let ro = helper(&["/h", "/m", "-o", "ro"]).unwrap();
        assert_eq!(ro, ["larder", "mount", "/h", "/m", "--read-only", "--quiet"]);
        assert!(helper(&["/h", "/m", "-f"]).unwrap().is_empty());
        // `-v` lets a terminal hear of the mount; `quiet` given as an option is not given twice.
        assert_eq!(helper(&["/h", "/m", "-v"]).unwrap(), ["larder", "mount", "/h", "/m"]);
        assert_eq!(
            helper(&["/h", "/m", "-o", "quiet"]).unwrap(),
            ["larder", "mount", "/h", "/m", "--quiet"]
        );
        // A remount changes the mount in place.
        assert_eq!(
            helper(&["/h", "/m", "-o", "ro,nosuid,remount,user_id=0"]).unwrap(),
            ["larder", "remount", "/m", "-o", "ro,nosuid,remount,user_id=0"]
        );
    }

    #[test]
    fn atime_options_are_passed_to_larder_which_follows_them() {
        let got = helper(&["/h", "/m", "-o", "noatime,nodiratime,cache-dir=/c"]).unwrap();
        assert_eq!(
            got,
            [
                "larder",
                "mount",
                "/h",
                "/m",
                "--atime=noatime",
                "--nodiratime",
                "--cache-dir=/c",
                "--quiet"
            ]
        );
        for (opt, want) in [
            ("strictatime", "--atime=strictatime"),
            ("norelatime", "--atime=strictatime"),
            ("relatime", "--atime=relatime"),
        ] {
            let got = helper(&["/h", "/m", "-o", opt]).unwrap();
            assert!(got.iter().any(|a| a == want), "{opt}: {got:?}");
        }
        // `atime` and `diratime` are the defaults' names: nothing to pass.
        assert_eq!(
            helper(&["/h", "/m", "-o", "atime,diratime"]).unwrap(),
            ["larder", "mount", "/h", "/m", "--quiet"]
        );
    }

    #[test]
    fn a_mount_option_larder_does_not_have_is_refused_by_name() {
        let e = helper(&["/h", "/m", "-o", "cache-dir=/c,colour=blue"]).unwrap_err();
        assert!(e.to_string().contains("'colour'"), "{e}");
        let e = helper(&["/h", "/m", "-o", "validity-lag"]).unwrap_err();
        assert!(e.to_string().contains("needs a value"), "{e}");
        assert!(helper(&["/h"]).is_err());
    }

    #[test]
    fn a_config_file_gives_options_the_command_line_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.toml");
        std::fs::write(
            &f,
            "home = \"/srv/home\"\nmountpoint = \"/mnt/m\"\nvalidity_lag = \"30s\"\nno-dedup = true\n\
             peer-serve = false\nflush-threads = 4\n",
        )
        .unwrap();
        let argv = |extra: &[&str]| {
            let mut v: Vec<OsString> = vec!["larder".into(), "mount".into()];
            v.extend(extra.iter().map(OsString::from));
            v.push("--config".into());
            v.push(f.clone().into());
            strs(&with_config(v).unwrap())
        };
        let got = argv(&[]);
        assert_eq!(got[..2], ["larder", "mount"]);
        assert!(got.contains(&"--validity-lag=30s".to_string()), "{got:?}");
        assert!(got.contains(&"--no-dedup".to_string()));
        assert!(got.contains(&"--peer-serve=off".to_string()));
        assert!(got.contains(&"--flush-threads=4".to_string()));
        assert_eq!(got[got.len() - 2..], ["/srv/home", "/mnt/m"]);
        // The command line's positionals and options win: they come after the file's.
        let got = argv(&["/other", "/mnt/o", "--validity-lag", "1s"]);
        assert!(!got.contains(&"/srv/home".to_string()), "{got:?}");
        assert_eq!(got[got.len() - 4..], ["/other", "/mnt/o", "--validity-lag", "1s"]);
        let parsed = Cli::try_parse_from(&got).unwrap();
        let crate::cli::Command::Mount(m) = parsed.command else {
            panic!()
        };
        assert_eq!(m.validity_lag, std::time::Duration::from_secs(1));
        assert!(m.no_dedup);
        assert_eq!(m.home, "/other");
    }

    #[test]
    fn a_config_key_that_is_no_option_is_refused_by_name() {
        let e = from_toml(mount(), "validity-lag = \"1s\"\nvalidity-lagg = \"2s\"\n").unwrap_err();
        assert!(e.to_string().contains("'validity-lagg'"), "{e}");
        let e = from_toml(mount(), "no-dedup = \"yes\"\n").unwrap_err();
        assert!(e.to_string().contains("switch"), "{e}");
        assert!(from_toml(mount(), "home = 3\n").is_err());
        assert!(from_toml(mount(), "not toml at all [\n").is_err());
    }
}
