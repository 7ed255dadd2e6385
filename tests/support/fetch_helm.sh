#!/usr/bin/env bash
# helm (v4) for the chart tests, built from the Go module proxy (fetch_go_tool.sh).
#
#   tests/support/fetch_helm.sh CACHE_DIR      # prints the helm path
#
# Into CACHE_DIR/helm-<version>/; CACHE_DIR/helm links to it. The version helm
# reports is set at link time, as helm's own Makefile does.
set -euo pipefail
CACHE="${1:?usage: fetch_helm.sh CACHE_DIR}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
helm="$("$(dirname "$0")/fetch_go_tool.sh" "$CACHE" helm helm.sh/helm/v4/cmd/helm "$HELM_VERSION" \
    "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION")"
ln -sfn "$helm" "$CACHE/helm"
echo "$CACHE/helm"
