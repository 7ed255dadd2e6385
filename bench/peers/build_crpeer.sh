#!/usr/bin/env bash
# Build the controller-runtime peer (bench/peers/crpeer) into a cache outside
# the repository, from the Go module proxy, pinned by crpeer/go.sum.
#
#   bench/peers/build_crpeer.sh          # prints the binary's path
#
# Keyed by the controller-runtime version and a hash of the peer's source, so
# an edit rebuilds and an unchanged tree reuses the binary. Only the bench
# uses it; never a dependency of the project.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/crpeer" && pwd)"
CACHE="${MY_CONTROLLER_CACHE:-$HOME/.cache/my-controller}"
CR_VERSION="$(sed -n 's#^[[:space:]]*sigs.k8s.io/controller-runtime \(v[^ ]*\)$#\1#p' "$SRC/go.mod")"
SRC_HASH="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go | sha256sum | cut -c1-12)"
OUT="$CACHE/peers/crpeer-$CR_VERSION-$SRC_HASH"

log() { printf '[build-crpeer] %s\n' "$*" >&2; }

if [[ -x "$OUT/crpeer" ]]; then
    echo "$OUT/crpeer"
    exit 0
fi
command -v go >/dev/null || { log "go not found: install Go >= 1.26 to build the controller-runtime peer"; exit 2; }
mkdir -p "$OUT"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
start=$(date +%s)
log "controller-runtime $CR_VERSION: building the peer (a cold build takes a few minutes on 2 cores)"
# Built to a temporary name and renamed: a binary at $OUT/crpeer is always whole.
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/crpeer.tmp" .)
mv "$OUT/crpeer.tmp" "$OUT/crpeer"
log "done in $(( $(date +%s) - start )) s: $OUT/crpeer"
echo "$OUT/crpeer"
