#!/usr/bin/env bash
# Derive deb-src entries from a machine's apt sources, so that `apt-get source` can fetch from the very
# archives (or local mirror) the machine installs its packages from, without touching /etc/apt:
#
#   scripts/apt-src.sh derive ETC OUT
#
# reads ETC/sources.list, ETC/sources.list.d/*.list (one-line format) and ETC/sources.list.d/*.sources (deb822
# format) and writes the same files under OUT (OUT/sources.list, OUT/sources.list.d/NAME.list|.sources), each
# with its entries turned into deb-src ones. Files that apt would not read (other extensions, such as
# *.disabled) are skipped, as apt skips them; a file left with no entry is not written. OUT is meant for apt's
# Dir::Etc::SourceList and Dir::Etc::SourceParts.
#
# One-line format: `deb [opts] uri suite comps` becomes `deb-src [opts] uri suite comps`; existing deb-src lines
# are kept; comments (apt ignores everything from a `#`) and other lines are dropped; a line repeated within a
# file (a deb and its deb-src twin) is written once, since apt warns about a source configured twice.
# deb822 format: a stanza whose Types name deb or deb-src gets `Types: deb-src`, every other field kept as it
# is (Signed-By with an embedded key, Architectures, and Enabled: no, which keeps it disabled); comment lines
# are dropped; a stanza with neither type is dropped.
set -euo pipefail

usage() {
  echo "usage: $0 derive ETC OUT" >&2
  exit 2
}

derive_list() {  # one-line format, $1 -> stdout
  awk '
    { sub(/#.*/, "") }
    $1 == "deb" || $1 == "deb-src" {
      $1 = "deb-src"  # also squeezes the blanks between fields
      if (!seen[$0]++) print
    }
  ' "$1"
}

derive_sources() {  # deb822 format, $1 -> stdout
  awk '
    function flush(   i) {
      if (n > 0 && src) {
        if (out++) print ""
        for (i = 1; i <= n; i++) print buf[i]
      }
      n = 0; src = 0; intypes = 0
    }
    # A comment line is no part of a stanza (and does not end one).
    /^[ \t]*#/ { next }
    # A blank line ends the stanza.
    /^[ \t]*$/ { flush(); next }
    # A continuation line of the Types field: more types.
    intypes && /^[ \t]/ {
      if ($0 ~ /(^|[ \t])deb(-src)?([ \t]|$)/) src = 1
      next
    }
    {
      intypes = 0
      if (tolower($0) ~ /^types[ \t]*:/) {
        intypes = 1
        v = $0
        sub(/^[^:]*:/, "", v)
        if (v ~ /(^|[ \t])deb(-src)?([ \t]|$)/) src = 1
        buf[++n] = "Types: deb-src"
        next
      }
      buf[++n] = $0
    }
    END { flush() }
  ' "$1"
}

# Writes $2 only when the derivation $1 of $3 yields something.
emit() {
  local fn=$1 out=$2 in=$3 text
  text=$("$fn" "$in")
  [ -n "$text" ] || return 0
  printf '%s\n' "$text" >"$out"
}

derive() {
  local etc=$1 out=$2 f
  [ -d "$etc" ] || { echo "apt-src: $etc is not a directory" >&2; return 1; }
  rm -rf "$out/sources.list" "$out/sources.list.d"
  mkdir -p "$out/sources.list.d"
  if [ -f "$etc/sources.list" ]; then
    emit derive_list "$out/sources.list" "$etc/sources.list"
  fi
  for f in "$etc"/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    emit derive_list "$out/sources.list.d/${f##*/}" "$f"
  done
  for f in "$etc"/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    emit derive_sources "$out/sources.list.d/${f##*/}" "$f"
  done
}

[ $# -eq 3 ] && [ "$1" = derive ] || usage
derive "$2" "$3"
