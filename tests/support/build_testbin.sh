#!/usr/bin/env bash
# Build the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, and kwok for fake Nodes and Pods) from the Go module
# proxy into a cache outside the repository.
#
#   tests/support/build_testbin.sh            # prints the binary directory
#
# k8s.io/kubernetes and go.etcd.io/etcd/server/v3 replace their sibling modules
# with local paths (./staging/..., ../api), so `go install pkg@version` refuses
# them. The fix: a throw-away wrapper module that requires the real module and
# replaces each sibling with its published version. Only the main module's
# replace directives count, so the wrapper's win.
#
# Built once per machine and version: a finished directory holds a .complete
# stamp and every binary; anything missing is built (a cache from before
# kube-scheduler and kwok joined gets just those two).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CACHE="${MY_CONTROLLER_CACHE:-$HOME/.cache/my-controller}"
OUT="$CACHE/testbin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
WORK="$CACHE/build"

log() { printf '[build-testbin] %s\n' "$*" >&2; }

BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
complete() {
    [[ -f "$OUT/.complete" ]] || return 1
    local b; for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done
}
if complete; then
    echo "$OUT"
    exit 0
fi
command -v go >/dev/null || { log "go not found: install Go >= 1.26 to build the control plane"; exit 2; }
mkdir -p "$OUT" "$WORK"

# One build at a time per cache: a second caller (another test session, a
# `make testbin` in another terminal) waits for the first and reuses its result
# instead of racing it in the same work directories.
if command -v flock >/dev/null; then
    exec 9>"$CACHE/build.lock"
    if ! flock -n 9; then
        log "another build holds $CACHE/build.lock; waiting for it to finish"
        flock 9
    fi
    if complete; then
        echo "$OUT"
        exit 0
    fi
fi
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

# go build -v names each package as it compiles it: show a count every 100.
progress() {
    awk -v what="$1" '{n++; if (n % 100 == 0) { printf "[build-testbin]   %s: %d packages compiled\n", what, n > "/dev/stderr"; fflush("/dev/stderr") } }
                      END { printf "[build-testbin]   %s: %d packages compiled\n", what, n > "/dev/stderr" }'
}

build_kubernetes() {
    local dir="$WORK/kubernetes-$K8S_VERSION" minor staging_ver
    minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
    staging_ver="v0.${minor}.$(echo "$K8S_VERSION" | cut -d. -f3)"
    rm -rf "$dir"; mkdir -p "$dir"; cd "$dir"
    log "kubernetes $K8S_VERSION: resolving modules (staging at $staging_ver)"
    go mod init testbin-kubernetes >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
    go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    # Every `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.N.P`.
    for mod in $(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' "$gomod"); do
        go mod edit -replace="$mod=$mod@$staging_ver"
    done
    # Copy the remaining pins so the wrapper resolves what upstream tested.
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    go mod tidy >/dev/null 2>"$dir/tidy.log" || { cat "$dir/tidy.log" >&2; exit 1; }
    local pkg="k8s.io/component-base/version"
    local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
        -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ) \
        -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 \
        -X k8s.io/client-go/pkg/version.gitMinor=$minor"
    for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
        [[ -x "$OUT/$cmd" ]] && continue
        log "kubernetes $K8S_VERSION: building $cmd (cold builds take 10-30 minutes on 2 cores)"
        go build -v -trimpath -ldflags "$ldflags" -o "$OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd" 2>&1 | progress "$cmd"
        [[ -x "$OUT/$cmd" ]] || { log "building $cmd failed"; exit 1; }
    done
}

build_etcd() {
    local dir="$WORK/etcd-$ETCD_VERSION"
    rm -rf "$dir"; mkdir -p "$dir"; cd "$dir"
    log "etcd $ETCD_VERSION: resolving modules"
    go mod init testbin-etcd >/dev/null 2>&1
    go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    for mod in go.etcd.io/etcd/api/v3 go.etcd.io/etcd/client/pkg/v3 go.etcd.io/etcd/client/v3 go.etcd.io/etcd/pkg/v3; do
        go mod edit -replace="$mod=$mod@$ETCD_VERSION"
    done
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
    go mod tidy >/dev/null 2>"$dir/tidy.log" || { cat "$dir/tidy.log" >&2; exit 1; }
    log "etcd $ETCD_VERSION: building etcd"
    go build -v -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3 2>&1 | progress etcd
    [[ -x "$OUT/etcd" ]] || { log "building etcd failed"; exit 1; }
}

# kwok is its own module with no replace directives: `go install` builds it
# as published (it simulates the kubelet of fake Nodes; stages come from
# tests/support/kwok/, as the plain binary ships none).
build_kwok() {
    log "kwok $KWOK_VERSION: building (a cold build takes 2-5 minutes)"
    GOFLAGS= GOBIN="$OUT" go install -v -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" 2>&1 | progress kwok
    [[ -x "$OUT/kwok" ]] || { log "building kwok failed"; exit 1; }
}

start=$(date +%s)
[[ -x "$OUT/etcd" ]] || build_etcd
[[ -x "$OUT/kube-apiserver" && -x "$OUT/kube-controller-manager" && -x "$OUT/kube-scheduler" && -x "$OUT/kubectl" ]] || build_kubernetes
[[ -x "$OUT/kwok" ]] || build_kwok
"$OUT/kube-apiserver" --version >&2
touch "$OUT/.complete"
log "done in $(( $(date +%s) - start )) s: $OUT"
echo "$OUT"
