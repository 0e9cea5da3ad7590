#!/usr/bin/env bash
# The Linux file system test suite xfstests (fstests) on larder mounts.
#
#   scripts/xfstests.sh [--auto] SRC_DIR [CHECK_ARGS...]
#
# SRC_DIR is a checkout of fstests (git clone https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git, or
# its GitHub mirror https://github.com/kdave/xfstests). The script installs the Debian packages fstests
# needs when they are missing, builds SRC_DIR with make when it is not built, makes the users fstests
# runs some tests as (fsgqa, fsgqa2, 123456-fsgqa) when they are missing, and then runs
#
#   ./check -E scripts/xfstests-exclude -g quick [CHECK_ARGS]    (--auto: -g auto)
#
# CHECK_ARGS go to check after the group, e.g. "-e generic/070" or "-x dangerous"; if they name tests
# (generic/001 generic/013) or a group (-g rw), they replace "-g GROUP".
#
# with FSTYP=fuse and FUSE_SUBTYP=.larder: fstests mounts with `mount -t fuse.larder HOME MNT -o ...`,
# which runs the helper /sbin/mount.fuse.larder. Two larder mounts of two directory homes:
#
#   TEST_DEV    file://$WORK/test-home      at $WORK/test-mnt     cache $WORK/test-cache
#   SCRATCH_DEV file://$WORK/scratch-home   at $WORK/scratch-mnt  cache $WORK/scratch-cache
#
# The homes are given as file:// URLs, not paths: fstests unmounts the scratch file system with
# `umount $SCRATCH_DEV`, and umount(8) takes a directory path for a mount point, never for a source; a URL
# it looks up as the source (larder shows a URL home as given in /proc/mounts). fstests has no mkfs for
# FUSE: its _scratch_mkfs empties the scratch mount, and there is no fsck (_check_test_fs does nothing).
#
# fstests checks that TEST_DEV is mounted "as FSTYP" by comparing `df -T`'s type column with FSTYP
# (fuse); a FUSE file system with a subtype shows as fuse.larder there, so the run puts a `df` first on
# PATH that prints fuse for fuse.larder (nothing else changes; $WORK/path/df).
#
# Needs root (fstests' check refuses to run otherwise), /dev/fuse, and these Debian packages (installed
# when missing): build-essential autoconf automake libtool libtool-bin pkg-config uuid-dev uuid-runtime
# xfslibs-dev xfsprogs libacl1-dev libaio-dev liburing-dev libgdbm-dev libgdbm-compat-dev libcap-dev
# acl attr bc dbench fio gawk psmisc sqlite3 fuse3. Not installed, as no test of a FUSE mount needs
# them: dump, xfsdump and quota (quotas and dump/restore are xfs/ext4 tests), lvm2 (device-mapper tests
# need a block device), indent.
#
# larder: the binary at $LARDER (default target/debug/larder), copied to $WORK/bin at the start so that
# a rebuild does not change it mid-run. The helper /sbin/mount.fuse.larder is a link to that copy for the
# run; one that was there before is put aside (/sbin/mount.fuse.larder.before-xfstests) and restored.
#
# Results: fstests' results directory $WORK/results/DATE (check.log; for each test NNN.out.bad, NNN.full
# and NNN.notrun), with check's whole output (check.out), both daemons' larder.log and summary.txt.
# Printed at the end:
#
#   xfstests: N ran, P passed, F failed, K not run, E excluded (results: DIR)
#
# followed by the failed tests and the reasons tests were not run, with their counts. Exits 0 even when
# tests fail, unless STRICT=1 and more than MAX_FAILURES (default 0) failed or the run timed out (exit
# 1). Setup problems exit 2. Mounts and daemons of the run are always removed at the end.
#
# Environment:
#   LARDER       larder binary (default target/debug/larder; not built here: cargo build -p larder first)
#   LARDER_OPTS  extra larder mount options for both mounts, as mount -o takes them (comma-separated,
#                without dashes), e.g. "validity-lag=0" or "write-mode=write-through"
#   WORK         where homes, caches, mount points and results go (default /tmp/xfst); homes, caches and
#                mount points are emptied at the start of a run, results are kept
#   EXCLUDE      exclude file passed to check -E (default scripts/xfstests-exclude)
#   TIMEOUT      seconds allowed for the whole check run (default 7200; with --auto 43200)
#   STRICT, MAX_FAILURES   see above

set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

say() { echo "xfstests.sh: $*" >&2; }
die() { say "$*"; exit 2; }

group=quick
if [ "${1:-}" = --auto ]; then
    group=auto
    shift
fi
[ $# -ge 1 ] || die "usage: scripts/xfstests.sh [--auto] SRC_DIR [CHECK_ARGS...]"
src=$(cd "$1" 2>/dev/null && pwd) || die "no directory $1"
shift
[ -x "$src/check" ] && [ -d "$src/tests/generic" ] || die "$src is not an fstests checkout (no check, tests/generic)"
check_args=("$@")
# Without a group (-g) or test names of its own, CHECK_ARGS add to "-g GROUP" (e.g. -e generic/070).
selects=0 skip=0
for a in "${check_args[@]}"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case $a in
        -g | [a-z]*/[0-9]*) selects=1 ;;
        -e | -x | -E | -X | -s | -S | -R | -i | -I | -L) skip=1 ;; # their value is no selection
    esac
done
[ "$selects" = 1 ] || check_args=(-g "$group" "${check_args[@]}")

larder_src=${LARDER:-$root/target/debug/larder}
case $larder_src in /*) ;; *) larder_src=$root/$larder_src ;; esac
work=${WORK:-/tmp/xfst}
exclude=${EXCLUDE:-$here/xfstests-exclude}
if [ "$group" = auto ]; then timeout_s=${TIMEOUT:-43200}; else timeout_s=${TIMEOUT:-7200}; fi
max_failures=${MAX_FAILURES:-0}
helper=/sbin/mount.fuse.larder
saved_helper=/sbin/mount.fuse.larder.before-xfstests

[ "$(id -u)" -eq 0 ] || die "run as root (fstests' check refuses to run otherwise)"
[ -x "$larder_src" ] || die "no larder binary at $larder_src (cargo build -p larder first, or set LARDER)"
[ -f "$exclude" ] || die "no exclude file $exclude"

# --- packages ----------------------------------------------------------------------------------------
need_apt=()
command -v cc >/dev/null 2>&1 && command -v make >/dev/null 2>&1 || need_apt+=(build-essential)
command -v autoreconf >/dev/null 2>&1 || need_apt+=(autoconf)
command -v automake >/dev/null 2>&1 || need_apt+=(automake)
command -v libtoolize >/dev/null 2>&1 || need_apt+=(libtool)
command -v libtool >/dev/null 2>&1 || need_apt+=(libtool-bin)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
[ -e /usr/include/uuid/uuid.h ] || need_apt+=(uuid-dev)
command -v uuidgen >/dev/null 2>&1 || need_apt+=(uuid-runtime)
[ -e /usr/include/xfs/xfs.h ] || need_apt+=(xfslibs-dev)
command -v xfs_io >/dev/null 2>&1 || need_apt+=(xfsprogs)
[ -e /usr/include/sys/acl.h ] || need_apt+=(libacl1-dev)
[ -e /usr/include/libaio.h ] || need_apt+=(libaio-dev)
[ -e /usr/include/liburing.h ] || need_apt+=(liburing-dev)
[ -e /usr/include/gdbm.h ] || need_apt+=(libgdbm-dev)
[ -e /usr/include/ndbm.h ] || need_apt+=(libgdbm-compat-dev)
[ -e /usr/include/sys/capability.h ] || need_apt+=(libcap-dev)
command -v setfacl >/dev/null 2>&1 || need_apt+=(acl)
command -v setfattr >/dev/null 2>&1 || need_apt+=(attr)
command -v bc >/dev/null 2>&1 || need_apt+=(bc)
command -v dbench >/dev/null 2>&1 || need_apt+=(dbench)
command -v fio >/dev/null 2>&1 || need_apt+=(fio)
command -v gawk >/dev/null 2>&1 || need_apt+=(gawk)
command -v killall >/dev/null 2>&1 || need_apt+=(psmisc)
command -v sqlite3 >/dev/null 2>&1 || need_apt+=(sqlite3)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
if [ ${#need_apt[@]} -gt 0 ]; then
    say "installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null || die "apt-get install failed"
fi
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null
[ -e /dev/fuse ] || die "/dev/fuse is missing; FUSE is not available on this machine"

# --- fstests, built ----------------------------------------------------------------------------------
if [ ! -x "$src/ltp/fsstress" ] || [ ! -x "$src/ltp/fsx" ] || [ ! -x "$src/src/open_by_handle" ]; then
    say "building fstests in $src (make; about a minute)"
    (cd "$src" && make -j"$(nproc)" >"$src/make.log" 2>&1) || { tail -20 "$src/make.log" >&2; die "make failed in $src (see $src/make.log)"; }
fi

# The users fstests runs tests as (its README, "Create fsgqa test users and groups").
for u in fsgqa fsgqa2 123456-fsgqa; do
    if ! id "$u" >/dev/null 2>&1; then
        say "adding the user $u (fstests runs tests as it)"
        if [ "$u" = fsgqa ]; then useradd -m "$u"; else useradd "$u"; fi || say "warning: cannot add the user $u"
    fi
done

# --- the run's directories, larder and the helper ------------------------------------------------------
test_home=$work/test-home test_mnt=$work/test-mnt test_cache=$work/test-cache
scratch_home=$work/scratch-home scratch_mnt=$work/scratch-mnt scratch_cache=$work/scratch-cache
bin=$work/bin/larder

# larder daemons of this run (or of an earlier run in $WORK): those started from $WORK's copy.
our_daemons() { pgrep -f "^$bin mount " 2>/dev/null; }

# Unmount everything mounted under $WORK and stop its daemons (only those started from $WORK/bin).
unmount_all() {
    local m pids i
    for m in "$test_mnt" "$scratch_mnt"; do
        if mountpoint -q "$m" 2>/dev/null; then
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
        fi
    done
    # findmnt lists anything else a test mounted under $WORK (nested or bind mounts).
    while read -r m; do
        [ -n "$m" ] && umount -l "$m" 2>/dev/null
    done < <(findmnt -rn -o TARGET | grep -E "^$work/" | sort -r)
    # An unmounted daemon closes its cache and exits by itself; give it 30 s, then stop it.
    for i in $(seq 30); do
        pids=$(our_daemons)
        [ -z "$pids" ] && return 0
        sleep 1
    done
    say "stopping larder daemons that outlived their mounts: $(echo $pids)"
    # shellcheck disable=SC2086  # a list of pids
    kill -TERM $pids 2>/dev/null
    sleep 5
    pids=$(our_daemons)
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    return 0
}

mkdir -p "$work" || die "cannot make $work"
chmod 755 "$work"
unmount_all
rm -rf "$test_home" "$test_mnt" "$test_cache" "$scratch_home" "$scratch_mnt" "$scratch_cache" "$work/bin" "$work/path"
mkdir -p "$test_home" "$test_mnt" "$scratch_home" "$scratch_mnt" "$work/bin" "$work/path" "$work/results"
chmod 755 "$test_home" "$test_mnt" "$scratch_home" "$scratch_mnt"
cp "$larder_src" "$bin" || die "cannot copy $larder_src to $bin"
larder_version="$("$bin" --version 2>/dev/null) (sha256 $(sha256sum "$bin" | cut -c1-12); tree $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$([ -n "$(git -C "$root" status --porcelain -- crates 2>/dev/null)" ] && echo "+uncommitted changes in crates/"))"

helper_was=none
# shellcheck disable=SC2317  # called by the traps
restore_helper() {
    case $helper_was in
        none) ;;
        absent) rm -f "$helper" ;;
        saved) rm -f "$helper"; mv -f "$saved_helper" "$helper" ;;
    esac
    helper_was=none
}
if [ -e "$helper" ] || [ -L "$helper" ]; then
    [ -e "$saved_helper" ] || [ -L "$saved_helper" ] && die "$saved_helper exists (left by an interrupted run?): put it back as $helper or remove it"
    mv "$helper" "$saved_helper" || die "cannot put $helper aside"
    helper_was=saved
else
    helper_was=absent
fi
ln -s "$bin" "$helper" || die "cannot make $helper"

# df -T shows the mount's type as fuse.larder; fstests wants FSTYP (fuse) there.
real_df=$(command -v df)
cat >"$work/path/df" <<EOF
#!/bin/bash
# For fstests: its _fs_type compares df -T's type column with FSTYP (fuse); larder's mount is fuse.larder.
set -o pipefail
$real_df "\$@" | sed -E 's/(^|[[:space:]])fuse\\.larder([[:space:]])/\\1fuse\\2/'
EOF
chmod 755 "$work/path/df"

results=$work/results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$results"
opts_extra=${LARDER_OPTS:+,$LARDER_OPTS}
config=$results/local.config
cat >"$config" <<EOF
# written by scripts/xfstests.sh: two larder mounts of directory homes
export FSTYP=fuse
export FUSE_SUBTYP=.larder
export TEST_DEV=file://$test_home
export TEST_DIR=$test_mnt
export SCRATCH_DEV=file://$scratch_home
export SCRATCH_MNT=$scratch_mnt
export TEST_FS_MOUNT_OPTS="-o cache-dir=$test_cache$opts_extra"
export MOUNT_OPTIONS="-o cache-dir=$scratch_cache$opts_extra"
export RESULT_BASE=$results
EOF

child=
# shellcheck disable=SC2317  # called by the traps
cleanup() {
    trap '' INT TERM HUP
    cd /
    unmount_all
    for c in test scratch; do
        [ -f "$work/$c-cache/larder.log" ] && cp "$work/$c-cache/larder.log" "$results/$c-larder.log" 2>/dev/null
    done
    restore_helper
    if [ -n "$(our_daemons)" ] || findmnt -rn -o TARGET | grep -qE "^$work/"; then
        say "warning: mounts or daemons of the run are left: $(findmnt -rn -o TARGET | grep -E "^$work/" | tr '\n' ' ')$(our_daemons | tr '\n' ' ')"
    fi
}
# A signal stops check (which then writes its summary) and the run ends with the summary of what ran.
interrupted=0
# shellcheck disable=SC2317
on_signal() {
    interrupted=1
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null
    else
        exit 130
    fi
}
trap cleanup EXIT
trap on_signal INT TERM HUP

# --- the run -----------------------------------------------------------------------------------------
say "fstests $(cd "$src" && git describe --tags --always 2>/dev/null || echo "(no git)") in $src; $larder_version ($larder_src)"
say "running ./check -E $exclude ${check_args[*]} (results: $results; at most ${timeout_s}s)"
start=$SECONDS
(
    cd "$src" || exit 2
    export HOST_OPTIONS=$config PATH="$work/path:$PATH"
    exec timeout --kill-after=60 "$timeout_s" ./check -E "$exclude" "${check_args[@]}"
) > >(tee "$results/check.out") 2>&1 &
child=$!
wait "$child"
rc=$?
# A signal interrupts wait: wait again for check to write its summary and stop.
while kill -0 "$child" 2>/dev/null; do
    wait "$child"
    rc=$?
done
child=
elapsed=$((SECONDS - start))
sleep 1 # tee finishes
timed_out=0
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    timed_out=1
    say "the run did not finish within ${timeout_s}s"
fi
[ "$interrupted" = 1 ] && say "interrupted"

# --- summary -----------------------------------------------------------------------------------------
# check.log (written when check ends, also when it is stopped): "Ran:" lists every test started, those
# not run included; "Not run:" and "Failures:" their subsets. check.time lists the tests that passed (a
# fresh results directory per run, so exactly this run's). A test in none of them was cut off.
log=$results/check.log
listed() { [ -f "$log" ] && grep "^$1: " "$log" | tail -1 | sed "s/^$1: //" | tr ' ' '\n' | grep -v '^$'; }
mapfile -t started < <(listed Ran)
mapfile -t notrun < <(listed 'Not run')
mapfile -t failures < <(listed Failures)
mapfile -t passed < <([ -f "$results/check.time" ] && awk '$1 ~ /^[a-z0-9]+\/[0-9]+$/ {print $1}' "$results/check.time")
mapfile -t cut_off < <(printf '%s\n' "${started[@]}" | grep -v '^$' | grep -vxF -f <(printf '%s\n' "${notrun[@]}" "${failures[@]}" "${passed[@]}" | grep -v '^$'))
excluded=$(grep -c '\[expunged\]' "$results/check.out" 2>/dev/null)
n_pass=${#passed[@]} n_fail=${#failures[@]} n_notrun=${#notrun[@]}
n_ran=$((n_pass + n_fail))
incomplete=
[ "$timed_out" = 1 ] && incomplete=" (incomplete: timed out after ${timeout_s}s)"
[ "$interrupted" = 1 ] && incomplete=" (incomplete: interrupted)"
{
    echo "fstests $(cd "$src" && git describe --tags --always 2>/dev/null); $larder_version; FSTYP=fuse.larder; ./check -E $(basename "$exclude") ${check_args[*]}${LARDER_OPTS:+; LARDER_OPTS=$LARDER_OPTS}"
    echo "took ${elapsed}s$incomplete"
    for t in "${failures[@]}"; do
        echo "  failed: $t"
    done
    for t in "${cut_off[@]}"; do
        echo "  cut off (no result): $t"
    done
    if [ "$n_notrun" -gt 0 ]; then
        echo "not run, by reason:"
        for t in "${notrun[@]}"; do
            f=$results/$t.notrun
            if [ -f "$f" ]; then head -1 "$f"; else echo "(no reason recorded)"; fi
        done | sort | uniq -c | sort -rn | sed 's/^/  /'
    fi
    echo "xfstests: $n_ran ran, $n_pass passed, $n_fail failed, $n_notrun not run, $excluded excluded$incomplete (results: $results)"
} >"$results/summary.txt"
cat "$results/summary.txt"

if [ "${STRICT:-0}" = 1 ]; then
    [ -n "$incomplete" ] && exit 1
    if [ "$n_fail" -gt "$max_failures" ]; then
        say "$n_fail failures exceed MAX_FAILURES=$max_failures"
        exit 1
    fi
fi
[ "${#started[@]}" -gt 0 ] || die "check ran no test (exit $rc); see $results/check.out"
exit 0
