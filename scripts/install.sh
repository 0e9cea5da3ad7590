#!/bin/bash
# Install a built larder (run as root after `cargo build --release`):
#   /usr/local/bin/larder                  the command
#   /sbin/mount.fuse.larder -> it          the helper mount(8) runs for `mount -t fuse.larder` and fstab
#   /etc/systemd/system/larder@.service    a service per config file /etc/larder/NAME.toml
#   /etc/larder/                           where config files and secrets go (owner-only)
# PREFIX (default /usr/local) and BIN (default target/release/larder) change where from and to.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
BIN=${BIN:-$ROOT/target/release/larder}

[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
[ -x "$BIN" ] || { echo "install.sh: no larder binary at $BIN (cargo build --release first)" >&2; exit 1; }

install -D -m 0755 "$BIN" "$PREFIX/bin/larder"
ln -sfn "$PREFIX/bin/larder" /sbin/mount.fuse.larder
install -d -m 0700 /etc/larder
if [ -d /etc/systemd/system ]; then
  sed "s|/usr/local/bin/larder|$PREFIX/bin/larder|g" "$ROOT/contrib/systemd/larder@.service" \
    >/etc/systemd/system/larder@.service
  command -v systemctl >/dev/null 2>&1 && systemctl daemon-reload 2>/dev/null || true
fi
install -D -m 0644 "$ROOT/README.md" "$PREFIX/share/doc/larder/README.md"
echo "installed: $PREFIX/bin/larder, /sbin/mount.fuse.larder, /etc/systemd/system/larder@.service"
