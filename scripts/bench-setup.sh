#!/usr/bin/env bash
# Install what the cache benchmarks (bench/cache.py) need on Debian 12 (run as root), and build the two
# helpers they use into the build directory (default /var/tmp/larder-bench-build, or $LARDER_BENCH_BUILD):
#   - passthrough_hp: libfuse's high-performance passthrough example, the "thinnest FUSE file system"
#     reference, built from the source of the very fuse3 release Debian installs (its orig tarball from the
#     Debian archive, checked against the .dsc's SHA-256);
#   - statbench: bench/statbench.c, a tight stat loop over a list of paths.
# Idempotent: installs only what is missing and rebuilds only what is absent or stale. Prints the helpers'
# paths on its last lines as KEY=VALUE (PASSTHROUGH_HP=..., STATBENCH=...; empty when not built, with the
# reason in PASSTHROUGH_HP_ERROR=...).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LARDER_BENCH_BUILD:-/var/tmp/larder-bench-build}
POOL=http://deb.debian.org/debian/pool/main/f/fuse3

need_apt=()
command -v rclone >/dev/null 2>&1 || need_apt+=(rclone)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
[ -e /usr/include/fuse3/fuse.h ] || need_apt+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v meson >/dev/null 2>&1 || need_apt+=(meson)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v xz >/dev/null 2>&1 || need_apt+=(xz-utils)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bench-setup: need root to install: ${need_apt[*]}" >&2
    exit 1
  fi
  echo "bench-setup: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null || { echo "bench-setup: apt-get install failed" >&2; exit 1; }
fi
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
if [ ! -e /dev/fuse ]; then
  echo "bench-setup: /dev/fuse is missing; FUSE is not available on this machine" >&2
  exit 1
fi
mkdir -p "$BUILD"

# statbench: rebuilt when the source is newer than the binary.
STATBENCH=$BUILD/statbench
if [ ! -x "$STATBENCH" ] || [ "$ROOT/bench/statbench.c" -nt "$STATBENCH" ]; then
  cc -O2 -Wall -o "$STATBENCH.tmp" "$ROOT/bench/statbench.c" && mv "$STATBENCH.tmp" "$STATBENCH" || STATBENCH=
fi

# passthrough_hp from the installed fuse3's upstream release.
build_passthrough_hp() {
  local ver upstream dsc orig sum src
  ver=$(dpkg-query -W -f='${Version}' fuse3 2>/dev/null) || { echo "fuse3 is not installed"; return 1; }
  upstream=${ver#*:}
  upstream=${upstream%-*}
  src=$BUILD/fuse-$upstream
  if [ -x "$src/build/example/passthrough_hp" ]; then
    echo "$src/build/example/passthrough_hp"
    return 0
  fi
  dsc=$BUILD/fuse3_${ver#*:}.dsc
  if [ ! -s "$dsc" ]; then
    if ! curl -fsS --max-time 120 -o "$dsc.tmp" "$POOL/fuse3_${ver#*:}.dsc"; then
      echo "cannot download $POOL/fuse3_${ver#*:}.dsc"
      return 1
    fi
    mv "$dsc.tmp" "$dsc"
  fi
  orig=$(awk '/^Checksums-Sha256:/{s=1;next} /^[^ ]/{s=0} s && $3 ~ /\.orig\.tar\./ {print $3; exit}' "$dsc")
  sum=$(awk '/^Checksums-Sha256:/{s=1;next} /^[^ ]/{s=0} s && $3 ~ /\.orig\.tar\./ {print $1; exit}' "$dsc")
  [ -n "$orig" ] || { echo "no orig tarball named in $dsc"; return 1; }
  if [ ! -s "$BUILD/$orig" ] || ! echo "$sum  $BUILD/$orig" | sha256sum -c --status; then
    if ! curl -fsS --max-time 300 -o "$BUILD/$orig.tmp" "$POOL/$orig"; then
      echo "cannot download $POOL/$orig"
      return 1
    fi
    mv "$BUILD/$orig.tmp" "$BUILD/$orig"
    echo "$sum  $BUILD/$orig" | sha256sum -c --status || { echo "$orig does not match the .dsc's SHA-256"; return 1; }
  fi
  rm -rf "$src"
  tar -xf "$BUILD/$orig" -C "$BUILD" || { echo "cannot unpack $orig"; return 1; }
  [ -d "$src" ] || { echo "$orig did not unpack to $src"; return 1; }
  (cd "$src" && meson setup build --buildtype=release -Dexamples=true -Dutils=false -Dtests=false \
      >"$BUILD/meson-setup.log" 2>&1) || { echo "meson setup failed (see $BUILD/meson-setup.log)"; return 1; }
  ninja -C "$src/build" example/passthrough_hp >"$BUILD/ninja.log" 2>&1 ||
    { echo "ninja failed (see $BUILD/ninja.log)"; return 1; }
  [ -x "$src/build/example/passthrough_hp" ] || { echo "the build made no example/passthrough_hp"; return 1; }
  echo "$src/build/example/passthrough_hp"
}
PASSTHROUGH_HP_ERROR=
if out=$(build_passthrough_hp); then
  PASSTHROUGH_HP=$(echo "$out" | tail -n 1)
else
  PASSTHROUGH_HP=
  PASSTHROUGH_HP_ERROR=$(echo "$out" | tail -n 1)
  echo "bench-setup: passthrough_hp not built: $PASSTHROUGH_HP_ERROR" >&2
fi

echo "RCLONE=$(command -v rclone || true)"
echo "STATBENCH=$STATBENCH"
echo "PASSTHROUGH_HP=$PASSTHROUGH_HP"
echo "PASSTHROUGH_HP_ERROR=$PASSTHROUGH_HP_ERROR"
