#!/usr/bin/env bash
# helm (v4) for the chart tests, built from the Go module proxy.
#
#   tests/support/fetch_helm.sh CACHE_DIR      # prints the helm path
#
# `go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION` into CACHE_DIR/helm-<version>/;
# CACHE_DIR/helm links to it. Built once per machine and version (a few minutes
# the first time; `go build -v` names each package, and a count is shown).
set -euo pipefail
CACHE="${1:?usage: fetch_helm.sh CACHE_DIR}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
log() { printf '[helm] %s\n' "$*" >&2; }

out="$CACHE/helm-$HELM_VERSION"
if [[ ! -x "$out/helm" ]]; then
    command -v go >/dev/null || { log "go not found: install Go to build helm $HELM_VERSION"; exit 2; }
    mkdir -p "$CACHE"
    # One build at a time per cache: a second caller waits and reuses the result.
    if command -v flock >/dev/null; then
        exec 9>"$CACHE/helm.lock"
        flock -n 9 || { log "another build holds $CACHE/helm.lock; waiting"; flock 9; }
    fi
    if [[ ! -x "$out/helm" ]]; then
        log "building helm $HELM_VERSION from the Go module proxy into $out (once)"
        bin="$(mktemp -d "$CACHE/.helm-build.XXXXXX")"
        trap 'rm -rf "$bin"' EXIT
        # The version helm reports is set at link time, as helm's own Makefile does.
        if ! GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$bin" \
            go install -v -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
            "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" 2>&1 | tee "$bin/build.log" |
            awk '{n++; if (n % 100 == 0) { printf "[helm]   %d packages compiled\n", n > "/dev/stderr"; fflush("/dev/stderr") } }
                 END { printf "[helm]   %d packages compiled\n", n > "/dev/stderr" }'; then
            log "go install failed; its last lines:"
            tail -n 30 "$bin/build.log" >&2
            exit 1
        fi
        [[ -x "$bin/helm" ]] || { log "go install produced no helm binary"; exit 1; }
        mkdir -p "$out"
        mv "$bin/helm" "$out/helm"
    fi
fi
ln -sfn "$out/helm" "$CACHE/helm"
echo "$CACHE/helm"
