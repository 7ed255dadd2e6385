#!/usr/bin/env bash
# A test tool built from the Go module proxy, once per machine and version.
#
#   tests/support/fetch_go_tool.sh CACHE_DIR NAME PACKAGE VERSION [LDFLAGS]
#                                             # prints CACHE_DIR/NAME-VERSION/NAME
#
# `go install PACKAGE@VERSION` into CACHE_DIR/NAME-VERSION/, with a count of the
# compiled packages as progress (`go build -v` names each), go's own download
# lines, and its last lines when it fails. One build at a time per tool: a
# second caller waits for the first and reuses its binary. fetch_helm.sh and
# fetch_syft.sh say which tool and version.
set -euo pipefail
CACHE="${1:?usage: fetch_go_tool.sh CACHE_DIR NAME PACKAGE VERSION [LDFLAGS]}"
NAME="${2:?name}"; PACKAGE="${3:?package}"; VERSION="${4:?version}"; LDFLAGS="${5:--s -w}"
log() { printf '[%s] %s\n' "$NAME" "$*" >&2; }

out="$CACHE/$NAME-$VERSION"
if [[ ! -x "$out/$NAME" ]]; then
    command -v go >/dev/null || { log "go not found: install Go >= 1.26 to build $NAME $VERSION"; exit 2; }
    mkdir -p "$out"
    exec 9>"$out/.lock"
    flock -n 9 || { log "another build holds $out/.lock; waiting"; flock 9; }
    if [[ ! -x "$out/$NAME" ]]; then
        log "building $PACKAGE@$VERSION from the Go module proxy into $out (once)"
        tmp="$(mktemp -d "$out/.build.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        if ! GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$tmp" \
            go install -v -trimpath -ldflags "$LDFLAGS" "$PACKAGE@$VERSION" 2>&1 |
            tee "$tmp/build.log" |
            awk -v tag="[$NAME]" '/^go: / {print tag " " $0 > "/dev/stderr"; fflush("/dev/stderr"); next}
                 {n++; if (n % 200 == 0) {printf "%s   %d packages compiled\n", tag, n > "/dev/stderr"; fflush("/dev/stderr")}}
                 END {printf "%s   %d packages compiled\n", tag, n > "/dev/stderr"}'; then
            log "go install failed; its last lines:"
            tail -n 30 "$tmp/build.log" >&2
            exit 1
        fi
        [[ -x "$tmp/$NAME" ]] || { log "go install produced no $NAME binary"; exit 1; }
        mv "$tmp/$NAME" "$out/$NAME"
    fi
fi
echo "$out/$NAME"
