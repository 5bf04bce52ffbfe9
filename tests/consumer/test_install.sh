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

# The Python package went into the interpreter's site-packages, with the library's install
# directory recorded; from there (the library taken from DESTDIR) it runs a peer of one.
init=$(find "$dest" -path '*/taiji/__init__.py' -not -path '*/torch/*' | head -n1)
[ -n "$init" ] || { echo "the Python package was not installed"; exit 1; }
site=$(dirname "$(dirname "$init")")
[ -f "$site/taiji/torch/__init__.py" ] || { echo "taiji.torch was not installed"; exit 1; }
grep -q "^LIBDIR = \"$prefix/" "$site/taiji/_install_paths.py" ||
  { echo "the installed package does not record the library's directory:"; cat "$site/taiji/_install_paths.py"; exit 1; }
out=$(cd "$dest" && PYTHONPATH="$site" TAIJI_LIBRARY="$libdir/libtaiji.so" /usr/bin/python3 -c '
import numpy as np, taiji
with taiji.Peer(rank=0, size=1, job_id="installed") as p:
    print(taiji.__file__.startswith("'"$site"'"), p.allreduce(np.arange(3, dtype=np.int32), "x").tolist())')
[ "$out" = "True [0, 1, 2]" ] || { echo "the installed Python package: $out"; exit 1; }
echo "installed Python package ran a peer"
