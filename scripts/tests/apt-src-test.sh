#!/usr/bin/env bash
# scripts/apt-src.sh on sample apt sources, without network: each derived file is compared with the text it
# must be, and any difference (or a file too many or missing) fails the test.
set -euo pipefail
cd "$(dirname "$0")/../.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
etc=$tmp/etc out=$tmp/out want=$tmp/want
mkdir -p "$etc/sources.list.d" "$want/sources.list.d"

# One-line format: a deb line with options, a commented-out line, a deb-src line that is already there (and
# twin of the deb line), a line with a trailing comment and uneven blanks, a blank line.
cat >"$etc/sources.list" <<'IN'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian bookworm main
# deb http://mirror.example/debian bookworm-backports main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian bookworm main

deb   http://mirror.example/debian-security  bookworm-security main contrib   # security
IN
cat >"$want/sources.list" <<'OUT'
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian bookworm main
deb-src http://mirror.example/debian-security bookworm-security main contrib
OUT

# deb822 format: a deb stanza with a comment inside, and a disabled deb + deb-src stanza whose Signed-By is
# an embedded key (continuation lines, with " ." for its blank line).
cat >"$etc/sources.list.d/debian.sources" <<'IN'
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://mirror.example/extra
Suites: bookworm
Components: main contrib
Enabled: no
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mDMEZAAAABYJKwYBBAHaRw8BAQdA
 -----END PGP PUBLIC KEY BLOCK-----
IN
cat >"$want/sources.list.d/debian.sources" <<'OUT'
Types: deb-src
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://mirror.example/extra
Suites: bookworm
Components: main contrib
Enabled: no
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mDMEZAAAABYJKwYBBAHaRw8BAQdA
 -----END PGP PUBLIC KEY BLOCK-----
OUT

# Files apt does not read are not derived; a file with nothing to derive is not written.
echo "deb http://mirror.example/other bookworm main" >"$etc/sources.list.d/other.list.disabled"
echo "# deb http://mirror.example/old bookworm main" >"$etc/sources.list.d/old.list"

scripts/apt-src.sh derive "$etc" "$out"
if ! diff -ru "$want" "$out"; then
  echo "apt-src: the derived sources differ from the expected ones (diff above)" >&2
  exit 1
fi
echo "apt-src: ok"
