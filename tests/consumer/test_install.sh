#!/bin/bash
# Installs into a scratch DESTDIR and builds the C consumer from the installed header,
# library and taiji.pc alone, as a user's build would.
set -euo pipefail
build=$1 source=$2
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
DESTDIR="$dest" meson install -C "$build" --quiet >/dev/null
pc=$(find "$dest" -name taiji.pc | head -n1)
[ -n "$pc" ] || { echo "taiji.pc was not installed"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$dest$prefix" --cflags --libs taiji)
cc -std=c11 -Wall -Wextra -Werror "$source" $flags -o "$dest/consumer"
libdir=$(dirname "$(find "$dest" -name 'libtaiji.so' | head -n1)")
LD_LIBRARY_PATH="$libdir" TAIJI_WORLD_SIZE=1 TAIJI_RANK=0 "$dest/consumer" | grep -qx "rank 0 of 1 ok"
echo "installed consumer built with pkg-config and ran"
