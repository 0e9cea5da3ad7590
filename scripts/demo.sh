#!/usr/bin/env bash
# The main job on an embedded default: build larder, make a demo home (a few hundred small files and a
# 256 MiB file), mount it behind an emulated slow link, read it all cold then warm, print the costs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release -p larder
exec ./target/release/larder demo "$@"
