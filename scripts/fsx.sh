#!/usr/bin/env bash
# Data integrity of larder under random operations: run fsx (crates.io `fsx`, the file system exerciser:
# reads, writes, truncates, mmap reads and writes, each checked against a model) on larder mounts, once
# with default settings and once with a cache so small (4 KiB blocks, 16 KiB) that nearly every block is
# evicted and fetched again, and once more with a validity lag of one second, so that revalidations race
# the pushes of fsx's own writes. Bounded: fixed seeds and operation counts.
#
#   scripts/fsx.sh            prints "fsx: N passed, M failed" and exits non-zero on any failure
#
# Environment: LARDER_BIN (default: cargo build, target/debug/larder), FSX_OPS (default 3000 per run),
# FSX_VERSION (installed when fsx is missing, default 0.3.2).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
ops=${FSX_OPS:-3000}
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

say() { echo "fsx.sh: $*" >&2; }

if ! command -v fsx >/dev/null 2>&1; then
  say "installing fsx ${FSX_VERSION:-0.3.2}"
  cargo install --locked fsx --version "${FSX_VERSION:-0.3.2}" >/dev/null 2>&1 || { say "cannot install fsx"; exit 2; }
fi
if [ -z "${LARDER_BIN:-}" ]; then
  (cd "$root" && cargo build -p larder >/dev/null 2>&1) || { say "cannot build larder"; exit 2; }
  LARDER_BIN=$root/target/debug/larder
fi

work=$(mktemp -d /var/tmp/larder-fsx.XXXXXX)
cleanup() {
  for m in "$work"/mnt*; do
    [ -d "$m" ] && { "$LARDER_BIN" unmount "$m" --leave-pending >/dev/null 2>&1 || umount -l "$m" 2>/dev/null; }
  done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

passed=0 failed=0
run_config() {
  local name=$1; shift
  mkdir -p "$work/home-$name" "$work/mnt-$name"
  if ! "$LARDER_BIN" mount "$work/home-$name" "$work/mnt-$name" --cache-dir "$work/cache-$name" "$@" >/dev/null; then
    say "cannot mount ($name)"; exit 2
  fi
  for seed in 1 2 3; do
    if [ "${PRECREATE:-0}" = 1 ]; then
      # The file exists, empty and so whole in the cache, before fsx opens it: the kernel serves fsx's
      # reads, writes and mappings from its cache file (passthrough), and larder takes in what it wrote.
      : >"$work/mnt-$name/fsx-$seed.bin"
      sleep 0.2
    fi
    if timeout 600 fsx -N "$ops" -S "$seed" -P "$work" "$work/mnt-$name/fsx-$seed.bin" >"$work/$name-$seed.log" 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      say "fsx failed ($name, seed $seed):"
      grep -v -E '^\[ERROR fsx\] +[0-9]+ +(READ|WRITE|MAPREAD|MAPWRITE|TRUNCATE|SKIPPED)' "$work/$name-$seed.log" | head -20 >&2
      tail -12 "$work/$name-$seed.log" >&2
      tail -20 "$work/cache-$name/larder.log" >&2
    fi
  done
  if [ "${PRECREATE:-0}" = 1 ]; then
    reads=$("$LARDER_BIN" status "$work/mnt-$name" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["efficiency"]["reads"])')
    if [ "$reads" != 0 ]; then
      say "fsx's reads went through the daemon ($reads), not through passthrough ($name)"; failed=$((failed + 1))
    fi
  fi
  # fsx checked every read against its model: what the mount shows now is the model's final state.
  for seed in 1 2 3; do
    cp "$work/mnt-$name/fsx-$seed.bin" "$work/final-$name-$seed.bin" 2>/dev/null || true
  done
  "$LARDER_BIN" unmount "$work/mnt-$name" --drain --timeout 120s >/dev/null || { say "unmount failed ($name)"; failed=$((failed + 1)); }
  # Whatever the write mode, home must end with exactly that.
  for seed in 1 2 3; do
    if ! cmp -s "$work/final-$name-$seed.bin" "$work/home-$name/fsx-$seed.bin"; then
      say "home's fsx-$seed.bin differs from the file fsx left on the mount ($name)"; failed=$((failed + 1))
    fi
  done
}

# Write-back (the default mode), pushed after the default sync lag.
run_config default
# Nearly every block evicted and fetched again (write-through: every close pushes).
run_config tiny-cache --block-size 4KiB --cache-size 16KiB --write-mode write-through
# Revalidation every second, racing pushes that start as soon as a change is queued.
run_config short-lag --block-size 4KiB --validity-lag 1s --write-mode write-back --sync-lag 0s
# The kernel writes the file in its cache file (passthrough), racing pushes of what larder took in.
PRECREATE=1 run_config passthrough --write-mode write-back --sync-lag 0s

echo "fsx: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
