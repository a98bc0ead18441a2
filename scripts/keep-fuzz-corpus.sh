#!/usr/bin/env bash
# Copies up to N entries of a fuzz target's generated corpus (go test -fuzz keeps it in
# the build cache) into the package's testdata/fuzz/<Target>/, so that plain `go test`
# replays them. Usage: scripts/keep-fuzz-corpus.sh ./pkg FuzzTarget [N]
set -euo pipefail
pkg=$1 target=$2 n=${3:-24}
cache=$(go env GOCACHE)/fuzz/github.com/kvroute/kvroute/${pkg#./}/$target
[ -d "$cache" ] || { echo "no generated corpus at $cache (run make fuzz first)" >&2; exit 1; }
dst=$pkg/testdata/fuzz/$target
mkdir -p "$dst"
# The largest entries first: they reach the most code; names are content hashes.
for f in $(ls -S "$cache" | sed -n "1,${n}p"); do cp "$cache/$f" "$dst/$f"; done
echo "$dst: $(ls "$dst" | wc -l) entries"
