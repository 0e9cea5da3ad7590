#!/usr/bin/env bash
# POSIX conformance of larder: run pjdfstest (the Rust rewrite, crates.io `pjdfstest`) on a larder mount.
#
#   scripts/pjdfstest.sh [LOG]
#
# Makes a temporary home directory on a local file system, mounts larder over it with a temporary cache
# directory, runs pjdfstest inside the mount, and always unmounts and removes everything afterwards.
# The full pjdfstest output goes to LOG (default /tmp/larder-pjdfstest.log), larder's own log beside it
# (LOG with .larder.log), and one line is printed at the end:
#
#   pjdfstest: N passed, M failed, K skipped
#
# Exits 0 even when tests fail, unless STRICT=1 and more than MAX_FAILURES tests failed or the run did not
# finish (timeout) (exit 1). Setup problems (no pjdfstest, build or mount failure, no test run) exit 2.
#
# MAX_FAILURES defaults to 0: larder passes every case that runs (see docs/conformance.md).
#
# Environment:
#   LARDER_BIN      larder binary to test (default: `cargo build` in the workspace, target/debug/larder)
#   LAG             --validity-lag for the mount (default: larder's default); LAG=0 revalidates everything
#   PLAIN=1         run against a plain directory instead of a larder mount (the machine's baseline)
#   S3=1            the home is a bucket on a local S3 server (moto, scripts/s3-server.sh) instead of a directory
#   TESTS           space-separated pjdfstest name filters (default: all tests)
#   TMPBASE         where the temporary directories go (default /var/tmp; must not be tmpfs for a fair home)
#   TIMEOUT         seconds allowed for the whole pjdfstest run (default 1200)
#   STRICT, MAX_FAILURES   see above (MAX_FAILURES defaults to 0: every case that runs must pass)
#   PJDFSTEST_VERSION      version installed when pjdfstest is missing (default 0.2.2)
#   PJDFSTEST_CONFIG       configuration file (default scripts/pjdfstest.toml)
#
# Needs root: most pjdfstest cases switch users or create devices, and larder only gives created objects
# the caller's owner when its daemon runs as root.

set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
log=${1:-/tmp/larder-pjdfstest.log}
case $log in /*) ;; *) log=$PWD/$log ;; esac
config=${PJDFSTEST_CONFIG:-$here/pjdfstest.toml}
version=${PJDFSTEST_VERSION:-0.2.2}
timeout_s=${TIMEOUT:-1200}
tmpbase=${TMPBASE:-/var/tmp}
max_failures=${MAX_FAILURES:-0}
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
export NO_COLOR=1 CLICOLOR=0

say() { echo "pjdfstest.sh: $*" >&2; }
die() { say "$*"; exit 2; }

[ "$(id -u)" -eq 0 ] || say "warning: not root; pjdfstest skips or fails the cases that need root"

# --- pjdfstest ---------------------------------------------------------------------------------------
if ! command -v pjdfstest >/dev/null 2>&1 || [ "$(pjdfstest --version 2>/dev/null)" != "pjdfstest $version" ]; then
    say "installing pjdfstest $version with cargo (takes a few minutes)"
    cargo install --locked pjdfstest --version "$version" >&2 || die "cargo install pjdfstest failed"
fi
pjd_version=$(pjdfstest --version)

# --- larder ------------------------------------------------------------------------------------------
larder=
if [ "${PLAIN:-0}" != 1 ]; then
    if [ -n "${LARDER_BIN:-}" ]; then
        larder=$LARDER_BIN
    else
        (cd "$root" && cargo build -p larder >&2) || die "cargo build failed"
        larder=$root/target/debug/larder
    fi
    [ -x "$larder" ] || die "no larder binary at $larder"
    command -v fusermount3 >/dev/null 2>&1 || say "warning: fusermount3 not found (apt-get install fuse3)"
fi

# --- temporary directories, always cleaned up ---------------------------------------------------------
work=$(mktemp -d "$tmpbase/larder-pjdfstest.XXXXXX") || die "cannot make a directory under $tmpbase"
chmod 755 "$work"
home=$work/home mnt=$work/mnt cache=$work/cache
mkdir -p "$home" "$mnt" "$cache"
chmod 755 "$home" "$mnt"
# A directory on another file system, for the EXDEV cases.
secondary=$(mktemp -d /dev/shm/larder-pjdfstest-xdev.XXXXXX 2>/dev/null || true)
if [ -n "$secondary" ] && [ "$(stat -f -c %T "$secondary")" = "$(stat -f -c %T "$work")" ]; then
    rm -rf "$secondary"; secondary=
fi
mounted=0

# shellcheck disable=SC2317  # called by the traps
cleanup() {
    trap '' INT TERM HUP
    cd /
    if [ "$mounted" = 1 ]; then
        if ! "$larder" unmount "$mnt" --timeout 30s >/dev/null 2>&1; then
            say "larder unmount failed; detaching lazily"
            fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
        fi
    fi
    [ -f "$cache/larder.log" ] && cp "$cache/larder.log" "${log%.log}.larder.log" 2>/dev/null
    [ "${S3:-0}" = 1 ] && S3_STATE_DIR=$work/s3 "$here/s3-server.sh" stop >/dev/null 2>&1
    if mountpoint -q "$mnt" 2>/dev/null; then
        say "$mnt is still mounted; leaving $work in place"
    else
        rm -rf "$work"
    fi
    [ -n "$secondary" ] && rm -rf "$secondary"
}
child=
# shellcheck disable=SC2317  # called by the traps
on_signal() {
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    exit 130
}
trap cleanup EXIT
trap on_signal INT TERM HUP

if [ "${PLAIN:-0}" = 1 ]; then
    target=$home
    what="plain directory $home ($(findmnt -no FSTYPE -T "$home" 2>/dev/null || stat -f -c %T "$home"))"
else
    lag_args=()
    [ -n "${LAG:-}" ] && lag_args=(--validity-lag "$LAG")
    home_url=$home
    if [ "${S3:-0}" = 1 ]; then
        s3_env=$(S3_STATE_DIR=$work/s3 "$here/s3-server.sh" start) || die "cannot start the S3 server"
        eval "$s3_env"
        python3 "$here/s3tool.py" mb pjdfstest >&2 || die "cannot make the bucket"
        home_url=s3://pjdfstest/home
        home="$home_url at $S3_ENDPOINT"
        lag_args+=(--s3-endpoint "$S3_ENDPOINT")
    fi
    "$larder" mount "$home_url" "$mnt" --cache-dir "$cache" "${lag_args[@]}" >&2 || {
        [ -f "$cache/larder.log" ] && tail -20 "$cache/larder.log" >&2
        die "larder mount failed"
    }
    mounted=1
    target=$mnt
    what="larder mount $mnt of $home (validity lag ${LAG:-default})"
fi

# --- the run -----------------------------------------------------------------------------------------
mkdir -p "$(dirname "$log")"
args=(-c "$config" -p "$target")
[ -n "$secondary" ] && args+=(-s "$secondary")
# shellcheck disable=SC2206  # TESTS is a list of filters on purpose
[ -n "${TESTS:-}" ] && args+=(${TESTS})
{
    echo "# $pjd_version on Linux $(uname -r); $what"
    echo "# pjdfstest ${args[*]}"
} >"$log"
say "running $pjd_version on the $what (log: $log)"
cd /
# In the background, so that a signal to this script runs the traps at once.
timeout --kill-after=30 "$timeout_s" pjdfstest "${args[@]}" >>"$log" 2>&1 &
child=$!
wait "$child"
rc=$?
child=
[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "# pjdfstest timed out after ${timeout_s}s" >>"$log"

# --- summary -----------------------------------------------------------------------------------------
# pjdfstest ends with "Summary: F failed, S skipped, P passed, E expected failures, T total". If it was
# cut short, count the per-test result lines instead.
plain_log=$(sed 's/\x1b\[[0-9;]*m//g' "$log")
summary=$(grep -E '^Summary: ' <<<"$plain_log" | tail -1)
if [ -n "$summary" ]; then
    failed=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$summary")
    skipped=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$summary")
    passed=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$summary")
    note=
else
    passed=$(grep -cE '^[a-z_0-9:]+ +ok$' <<<"$plain_log")
    failed=$(grep -cE '^[a-z_0-9:]+ +(FAILED|PASSED UNEXPECTEDLY)$' <<<"$plain_log")
    skipped=$(grep -cE '^[a-z_0-9:]+ +skipped$' <<<"$plain_log")
    if [ $((passed + failed + skipped)) -eq 0 ]; then
        tail -5 "$log" >&2
        die "pjdfstest ran no test (exit $rc); see $log"
    fi
    failed=$((failed + 1)) # the case that was running when the run stopped
    note=" (incomplete: pjdfstest exited $rc without a summary)"
fi
grep -E '^[a-z_0-9:]+ +(FAILED|PASSED UNEXPECTEDLY)$' <<<"$plain_log" | awk '{print "  failed: " $1}' >&2
echo "pjdfstest: $passed passed, $failed failed, $skipped skipped$note"

if [ "${STRICT:-0}" = 1 ]; then
    if [ -n "$note" ]; then
        say "the run did not finish"
        exit 1
    fi
    if [ "$failed" -gt "$max_failures" ]; then
        say "$failed failures exceed MAX_FAILURES=$max_failures"
        exit 1
    fi
fi
exit 0
