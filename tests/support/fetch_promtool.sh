#!/usr/bin/env bash
# promtool for the alert-rule tests, from Debian's `prometheus` package.
#
#   tests/support/fetch_promtool.sh CACHE_DIR      # prints the promtool path
#
# The package is downloaded (apt-get download: no install, no service, no
# postinst) and only /usr/bin/promtool is extracted, into CACHE_DIR/<version>/;
# CACHE_DIR/promtool links to the latest. Done once per package version.
set -euo pipefail
CACHE="${1:?usage: fetch_promtool.sh CACHE_DIR}"
log() { printf '[promtool] %s\n' "$*" >&2; }

candidate() { apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}'; }
version="$(candidate)"
if [[ -z "$version" || "$version" == "(none)" ]]; then
    log "no prometheus package known to apt; running apt-get update"
    apt-get update -qq >&2
    version="$(candidate)"
fi
[[ -n "$version" && "$version" != "(none)" ]] || { log "apt has no prometheus package"; exit 2; }

out="$CACHE/${version//[^A-Za-z0-9.+~-]/_}"
if [[ ! -x "$out/promtool" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    log "downloading Debian's prometheus $version (for promtool only)"
    # _apt cannot write into a private temp dir: let it be world-writable for the download.
    chmod 0777 "$work"
    (cd "$work" && apt-get download -qq "prometheus=$version" >&2)
    dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
    mkdir -p "$out"
    install -m 0755 "$work/root/usr/bin/promtool" "$out/promtool.tmp"
    mv "$out/promtool.tmp" "$out/promtool"
fi
ln -sfn "$out/promtool" "$CACHE/promtool"
echo "$CACHE/promtool"
