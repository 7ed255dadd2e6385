#!/usr/bin/env bash
# syft (Anchore's SBOM scanner) for tests/e2e/test_image_scan.py, built from the
# Go module proxy: a real scanner reads the image as a platform team's CI would.
#
#   tests/support/fetch_syft.sh CACHE_DIR [VERSION]     # prints the syft path
#
# `go install github.com/anchore/syft/cmd/syft@VERSION` into
# CACHE_DIR/syft-VERSION/ (once per version; a few minutes cold, with go's
# download lines and a count of compiled packages as progress).
set -euo pipefail
CACHE="${1:?usage: fetch_syft.sh CACHE_DIR [VERSION]}"
VERSION="${2:-v1.57.2}"
log() { printf '[syft] %s\n' "$*" >&2; }

out="$CACHE/syft-$VERSION"
if [[ ! -x "$out/syft" ]]; then
    command -v go >/dev/null || { log "go not found: install Go >= 1.26 to build syft"; exit 2; }
    mkdir -p "$out"
    exec 9>"$out/.lock"            # one build at a time per cache
    flock 9
    if [[ ! -x "$out/syft" ]]; then
        log "building github.com/anchore/syft/cmd/syft@$VERSION from the Go module proxy (once)"
        tmp="$(mktemp -d "$out/.build.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$tmp" \
            go install -v -trimpath -ldflags "-s -w" "github.com/anchore/syft/cmd/syft@$VERSION" 2>&1 |
            awk '/^go: / {print "[syft] " $0 > "/dev/stderr"; fflush("/dev/stderr"); next}
                 {n++; if (n % 200 == 0) {printf "[syft]   %d packages compiled\n", n > "/dev/stderr"; fflush("/dev/stderr")}}
                 END {printf "[syft]   %d packages compiled\n", n > "/dev/stderr"}'
        [[ ${PIPESTATUS[0]} -eq 0 && -x "$tmp/syft" ]] || { log "go install failed"; exit 1; }
        mv "$tmp/syft" "$out/syft"
    fi
fi
echo "$out/syft"
