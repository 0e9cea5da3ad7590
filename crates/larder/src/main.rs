//! The `larder` command: mount a caching file system, query it, unmount it, run the demo, make a cluster's
//! certificates.

#![deny(unsafe_op_in_unsafe_fn)]

mod cli;
mod cluster;
mod control;
mod csi;
mod daemon;
mod demo;
mod invocation;
mod journal;
mod leave;
mod metrics;
mod mounts;
mod preflight;
mod progress;
mod recover;
mod residency;
mod secrets;
mod status;
mod units;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = match invocation::args() {
        Ok(a) if a.is_empty() => return ExitCode::SUCCESS,
        Ok(a) => a,
        Err(e) => {
            eprintln!("larder: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let cli = cli::Cli::parse_from(&args);
    invocation::remember(args);
    let result = match cli.command {
        cli::Command::Mount(args) => daemon::mount(*args),
        cli::Command::Status(args) => status::run(args),
        cli::Command::Unmount(args) => mounts::unmount(args),
        cli::Command::Drain(args) => journal::drain(args),
        cli::Command::Conflicts(args) => journal::conflicts(args),
        cli::Command::Prefetch(args) => residency::run(control::ResidencyAction::Prefetch, args),
        cli::Command::Pin(args) => residency::run(control::ResidencyAction::Pin, args),
        cli::Command::Unpin(args) => residency::run(control::ResidencyAction::Unpin, args),
        cli::Command::Evict(args) => residency::run(control::ResidencyAction::Evict, args),
        cli::Command::Recover(args) => recover::run(args),
        cli::Command::Demo(args) => demo::run(args),
        cli::Command::Cluster(command) => cluster::run(command),
        cli::Command::Remount(args) => mounts::remount(args),
        cli::Command::Csi(args) => csi::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("larder: {e:#}");
            ExitCode::FAILURE
        }
    }
}
