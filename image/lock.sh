#!/usr/bin/env bash
# image/lock.sh   (make image-lock): re-resolve image/packages.lock.
#
# Asks apt, through the same mmdebstrap call as build.sh but unpinned, for the
# dependency closure of the `keep` packages as Debian's mirrors serve it today,
# and rewrites the lock with those versions. Actions and reasons of known
# packages are kept; a package new to the closure is written as `review`,
# which build.sh refuses until a person makes it `keep` or `drop`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOCK=$ROOT/image/packages.lock
[ "$(id -u)" = 0 ] || { echo "$0: needs root (mmdebstrap --mode=root)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mapfile -t KEEP < <(awk '$1 == "keep" {split($2, p, "="); print p[1]}' "$LOCK")
mmdebstrap --quiet --mode=root --variant=extract --architectures=amd64 \
    --include="$(IFS=,; echo "${KEEP[*]}")" \
    --extract-hook="cp \"\$1\"/var/cache/apt/archives/*.deb '$work'/" \
    bookworm /dev/null \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
{
    # The header comment (up to the first blank line), with today's date.
    awk '/^$/ {exit} {print}' "$LOCK" | sed "s/Resolved on [0-9-]*\./Resolved on $(date -u +%F)./"
    echo
    for deb in "$work"/*.deb; do
        name=$(dpkg-deb -f "$deb" Package) version=$(dpkg-deb -f "$deb" Version)
        old=$(awk -v n="$name" '{split($2, p, "=")} p[1] == n && ($1 == "keep" || $1 == "drop")' "$LOCK")
        if [ -n "$old" ]; then
            awk -v v="$name=$version" '{printf "%s %-40s", $1, v; $1 = $2 = ""; sub(/^ +/, ""); print " " $0}' <<<"$old"
        else
            printf 'review %-40s new in the closure: keep or drop?\n' "$name=$version"
        fi
    done | sort -k1,1r -s
} > "$LOCK.new"
mv "$LOCK.new" "$LOCK"
git -C "$ROOT" --no-pager diff --stat -- image/packages.lock || true
