#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, integration tests on real FUSE mounts, data
# integrity under random operations (fsx) and the POSIX conformance suite (pjdfstest) against larder
# mounts. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --tests
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
[ -d /usr/local/go/bin ] && export PATH="/usr/local/go/bin:$PATH"

if [ "$(id -u)" -ne 0 ]; then
  echo "test: the integration tests mount FUSE file systems and need root" >&2
  exit 1
fi

# Tests talk to S3 servers on loopback only: never let the AWS credential chain probe the EC2 metadata
# address when a test runs without credentials.
export AWS_EC2_METADATA_DISABLED=true

echo "== script checks"
./scripts/tests/apt-src-test.sh

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings

echo "== unit and integration tests"
cargo test --workspace -- --test-threads=2

echo "== the CSI plugin against the community's conformance suite (csi-sanity)"
./scripts/csi-sanity.sh

echo "== Kubernetes manifests (contrib/kubernetes) decode strictly and agree"
(cd scripts/tests/k8s-manifests && GOFLAGS=-buildvcs=false go run . ../../../contrib/kubernetes)

echo "== data integrity under random operations (fsx)"
./scripts/fsx.sh

if [ "${SKIP_PJDFSTEST:-0}" != 1 ] && [ -x scripts/pjdfstest.sh ]; then
  echo "== POSIX conformance (pjdfstest)"
  STRICT=1 ./scripts/pjdfstest.sh
fi
