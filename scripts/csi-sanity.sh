#!/usr/bin/env bash
# The community's CSI conformance suite (csi-sanity, kubernetes-csi/csi-test) against `larder csi`, with
# a directory home: every Identity, Controller and Node test for the capabilities larder advertises,
# staging and publishing real larder mounts. Run as root (FUSE and bind mounts).
#
#   ./scripts/csi-sanity.sh [extra csi-sanity flags, e.g. -ginkgo.focus=NodePublish]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
[ -d /usr/local/go/bin ] && export PATH="/usr/local/go/bin:$PATH"

CSI_TEST_VERSION=v5.6.0
tools="$PWD/target/tools"
sanity="$tools/csi-sanity-$CSI_TEST_VERSION"
if [ ! -x "$sanity" ]; then
  command -v go >/dev/null 2>&1 || { echo "csi-sanity: Go is needed to build csi-sanity" >&2; exit 1; }
  echo "csi-sanity: building csi-sanity $CSI_TEST_VERSION"
  mkdir -p "$tools/gobin"
  GOBIN="$tools/gobin" GOFLAGS=-buildvcs=false \
    go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_TEST_VERSION"
  mv "$tools/gobin/csi-sanity" "$sanity"
fi

cargo build -q -p larder
larder="$PWD/target/debug/larder"

work=$(mktemp -d /tmp/larder-test-csi-sanity-XXXXXX)
plugin=
cleanup() {
  [ -n "$plugin" ] && kill "$plugin" 2>/dev/null && wait "$plugin" 2>/dev/null || true
  # Whatever a failed run left mounted: binds first, then the daemons' mounts.
  awk -v w="$work" '$5 ~ "^"w {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/home"
cat >"$work/params.yaml" <<YAML
home: $work/home
validity-lag: 1s
cache-size: 256MiB
YAML

"$larder" csi --mode all --node-id sanity-node --endpoint "unix://$work/csi.sock" \
  --state-dir "$work/state" 2>"$work/plugin.log" &
plugin=$!
for _ in $(seq 100); do [ -S "$work/csi.sock" ] && break; sleep 0.1; done
[ -S "$work/csi.sock" ] || { cat "$work/plugin.log"; echo "csi-sanity: larder csi did not start" >&2; exit 1; }

status=0
"$sanity" \
  --csi.endpoint="$work/csi.sock" \
  --csi.testvolumeparameters="$work/params.yaml" \
  --csi.mountdir="$work/target" \
  --csi.stagingdir="$work/staging" \
  -ginkgo.no-color "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "csi-sanity: failed; the plugin's log:" >&2
  tail -50 "$work/plugin.log" >&2
  exit "$status"
fi
left=$(awk -v w="$work" '$5 ~ "^"w {print $5}' /proc/self/mountinfo)
if [ -n "$left" ]; then
  echo "csi-sanity: mounts left behind:" >&2
  echo "$left" >&2
  exit 1
fi
echo "csi-sanity: passed, nothing left mounted"
