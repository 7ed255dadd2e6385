#!/usr/bin/env bash
# image/check_dockerfile.sh   (make image-dockerfile): build the user-facing
# Dockerfile for real, without a registry, and compare it with `make image`'s.
#
# The Dockerfile's builder stage is pinned by digest to a Docker Hub image that
# cannot be pulled here. What it needs of that base is Debian bookworm with apt,
# bash and dpkg, so an equivalent base is made from Debian's packages
# (mmdebstrap --variant=minbase, cached under ~/.cache/my-controller/image),
# imported into podman and passed as --build-arg BUILDER_IMAGE. Then `podman
# build --isolation chroot` runs the Dockerfile as a Dockerfile builder does
# (RUN steps included; chroot isolation because this sandbox refuses the OCI
# runtime). The host's CA bundle goes into the base so pip reaches PyPI through
# whatever TLS proxy the host trusts.
#
# The result must hold the same files, with the same modes, owners, sizes and
# (for the bytecode) contents, as the image `make image` built
# (localhost/my-controller:VERSION), and the same user, entrypoint and env.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=$(sed -n 's/^version = //p' "$ROOT/setup.cfg")
IMAGE=${IMAGE:-localhost/my-controller:$VERSION}
DOCKERFILE_IMAGE=localhost/my-controller-dockerfile:$VERSION
BASE=localhost/my-controller-builder-base:bookworm
PODMAN=${PODMAN:-podman}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/my-controller/image
say() { printf '# dockerfile: %s\n' "$*" >&2; }
die() { printf 'image/check_dockerfile.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, podman image mount)"
archive=$ROOT/build/my-controller-$VERSION.oci.tar
if ! $PODMAN image exists "$IMAGE"; then
    [ -f "$archive" ] || die "$IMAGE is not in podman's storage and $archive is missing: run make image"
    $PODMAN load --quiet --input "$archive" >/dev/null     # removed from storage since make image
fi

# A new base once a week at most: apt in the build refreshes its indexes anyway.
base_tar=$CACHE/builder-bookworm-minbase-$(date -u +%G-W%V).tar
if [ ! -s "$base_tar" ]; then
    say "making a bookworm builder base with mmdebstrap (once a week): $base_tar"
    rm -f "$CACHE"/builder-bookworm-minbase-*.tar
    mmdebstrap --quiet --mode=root --format=tar --variant=minbase --include=ca-certificates \
        --customize-hook='cp /etc/ssl/certs/ca-certificates.crt "$1"/etc/ssl/certs/ca-certificates.crt' \
        bookworm "$base_tar.tmp" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main"
    mv "$base_tar.tmp" "$base_tar"
fi
$PODMAN import --quiet "$base_tar" "$BASE" >/dev/null

say "podman build --isolation chroot -f Dockerfile (BUILDER_IMAGE=$BASE)"
$PODMAN build --quiet --isolation chroot --build-arg "BUILDER_IMAGE=$BASE" \
    --tag "$DOCKERFILE_IMAGE" --file "$ROOT/Dockerfile" "$ROOT" >/dev/null

describe() {   # the files of an image: mode, owner, size, path (and a digest of each .pyc)
    local dir
    dir=$($PODMAN image mount "$1")
    (cd "$dir" && find . -printf '%M %U:%G %s %p\n' | sort -k4 &&
        find . -name '*.pyc' -type f -print0 | sort -z | xargs -0 sha256sum)
    $PODMAN image umount "$1" >/dev/null
    $PODMAN image inspect --format '{{.Config.User}} {{.Config.Entrypoint}} {{.Config.Env}}' "$1"
}
if ! diff <(describe "$IMAGE") <(describe "$DOCKERFILE_IMAGE") > "$CACHE/dockerfile.diff"; then
    die "the Dockerfile's image differs from make image's:
$(head -40 "$CACHE/dockerfile.diff")"
fi
files=$(grep -c '^[-dlcbps][-rwxsStT]\{9\} ' <(describe "$IMAGE"))
say "the Dockerfile builds the same image as make image: $files entries, same metadata"
