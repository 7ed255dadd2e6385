#!/usr/bin/env bash
# syft (Anchore's SBOM scanner) for tests/e2e/test_image_scan.py, built from the
# Go module proxy (fetch_go_tool.sh): a real scanner reads the image as a
# platform team's CI would.
#
#   tests/support/fetch_syft.sh CACHE_DIR [VERSION]     # prints the syft path
set -euo pipefail
CACHE="${1:?usage: fetch_syft.sh CACHE_DIR [VERSION]}"
exec "$(dirname "$0")/fetch_go_tool.sh" "$CACHE" syft github.com/anchore/syft/cmd/syft "${2:-v1.57.2}"
