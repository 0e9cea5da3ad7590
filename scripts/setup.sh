#!/usr/bin/env bash
# Install what building, demonstrating and testing larder needs on Debian 12 (run as root).
# Idempotent: installs only what is missing. `setup.sh --tests` also installs what the tests need: a
# local S3 server (moto) and boto3 for the S3 tests.
set -euo pipefail

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
[ -e /usr/include/fuse3/fuse.h ] || need_apt+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
# The etcd client's build compiles etcd's protocol definitions.
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || need_apt+=(libprotobuf-dev)
if [ "${1:-}" = --tests ]; then
  command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
  command -v curl >/dev/null 2>&1 || need_apt+=(curl)
  # Real programs the tests run on mounts.
  command -v sqlite3 >/dev/null 2>&1 || need_apt+=(sqlite3)
  command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)
  command -v fio >/dev/null 2>&1 || need_apt+=(fio)
  command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
  # The cluster's coordination service, started by the tests themselves (the package starts no service).
  command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
  # The shared cache bank's servers, started by the tests themselves.
  command -v memcached >/dev/null 2>&1 || need_apt+=(memcached)
  command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
  # The cluster tests run each node in a network namespace of its own, entered with nsenter.
  command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
  command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
  # systemd-analyze checks the service unit (the tests never start systemd itself).
  command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
  command -v mount >/dev/null 2>&1 || need_apt+=(mount)
  # larder and s3fs-fuse on one bucket: the metadata convention they share.
  command -v s3fs >/dev/null 2>&1 || need_apt+=(s3fs)
  # And rclone: the metadata it writes (modes in octal).
  command -v rclone >/dev/null 2>&1 || need_apt+=(rclone)
  command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${need_apt[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -e /dev/fuse ]; then
  modprobe fuse 2>/dev/null || true
fi
if [ ! -e /dev/fuse ]; then
  echo "setup: /dev/fuse is missing; FUSE is not available on this machine" >&2
  exit 1
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: Rust (cargo >= 1.91) is required; install it with rustup (https://rustup.rs)" >&2
  exit 1
fi

# csi-sanity and the Kubernetes manifests' check are Go programs, built by the tests themselves.
[ -d /usr/local/go/bin ] && export PATH="/usr/local/go/bin:$PATH"
if [ "${1:-}" = --tests ] && ! go version 2>/dev/null | grep -Eq 'go1\.(2[4-9]|[3-9][0-9])'; then
  echo "setup: the tests need Go 1.24 or later (csi-sanity, the manifests' check); install it from https://go.dev/dl" >&2
  exit 1
fi

if [ "${1:-}" = --tests ] && ! python3 -c 'import moto, boto3, flask' >/dev/null 2>&1; then
  echo "setup: installing moto[server] and boto3 for the S3 tests"
  python3 -m pip install --quiet 'moto[server]' boto3 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages 'moto[server]' boto3
fi
