#!/usr/bin/env bash
# Build the my-controller image without Docker: image/build.sh [OUT_DIR]  (make image)
#
#   1. mmdebstrap --variant=extract: the Debian packages of image/packages.lock,
#      every one pinned, unpacked into OUT/rootfs (no dpkg database, no maintainer
#      scripts, no shell: the distroless recipe). .debs are cached by file name
#      (= name_version_arch) under ~/.cache/my-controller/image/debs.
#   2. PyYAML and prometheus-client from image/requirements.lock (hash-checked
#      wheels, cached under ~/.cache/my-controller/image/wheels), installed with
#      the host's pip into the root's dist-packages: no pip in the image.
#   3. The `drop` packages' files are deleted, then image/assemble.sh (shared
#      with the Dockerfile) strips image/strip.list, adds the operator and its
#      console script, the nonroot user 65532, precompiles all bytecode for a
#      read-only root, and checks the result.
#   4. OUT/rootfs.tar (sorted, fixed mtimes, numeric owners), `podman build` of
#      the Dockerfile's final stage with `ADD rootfs.tar /` for its COPY (FROM
#      scratch, no RUN: no registry needed), `podman save --format
#      oci-archive` to OUT/my-controller-VERSION.oci.tar; its sizes go to
#      OUT/image.txt (`make image` prints it).
#
# Needs root (mmdebstrap's root mode, chroot), mmdebstrap, podman, and a pip
# ($PIP, default the project's .venv). Environment: IMAGE (tag), PODMAN (command).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/build}" && cd "${1:-$ROOT/build}" && pwd)
VERSION=$(sed -n 's/^version = //p' "$ROOT/setup.cfg")
IMAGE=${IMAGE:-localhost/my-controller:$VERSION}
PODMAN=${PODMAN:-podman}
PIP=${PIP:-$ROOT/.venv/bin/pip}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/my-controller/image
LOCK=$ROOT/image/packages.lock
SITE=usr/lib/python3/dist-packages        # on the Debian interpreter's sys.path
# Fixed mtimes make the tarball depend on its contents only: the last commit's time.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

say() { printf '# image: %s\n' "$*" >&2; }
die() { printf 'image/build.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap --mode=root, chroot); run as root or with sudo"
for tool in mmdebstrap "${PODMAN%% *}" dpkg-deb chroot; do
    command -v "$tool" >/dev/null || die "$tool is missing: make image-tools installs it"
done
[ -x "$PIP" ] || die "no pip at $PIP: run make venv (or set PIP=)"

ROOTFS=$OUT/rootfs
mkdir -p "$CACHE/debs" "$CACHE/wheels"
rm -rf "$ROOTFS" "$OUT/rootfs.tar" "$OUT/debs.list"

# ---- 1. Debian packages ---------------------------------------------------
! grep -q '^review ' "$LOCK" || die "$LOCK has \`review\` lines (make image-lock found new packages): mark each keep or drop"
mapfile -t PINNED < <(awk '$1 == "keep" || $1 == "drop" {print $2}' "$LOCK")
mapfile -t DROPPED < <(awk '$1 == "drop" {split($2, p, "="); print p[1]}' "$LOCK")
[ "${#PINNED[@]}" -gt 0 ] || die "$LOCK lists no packages"
say "mmdebstrap: ${#PINNED[@]} pinned packages (debs cached in $CACHE/debs)"
# The cache goes in before apt looks (download/empty is skipped so apt may find
# it there; apt still checks each file against the signed index) and comes back
# out after the download.
mmdebstrap --quiet --mode=root --variant=extract --architectures=amd64 \
    --include="$(IFS=,; echo "${PINNED[*]}")" \
    --skip=download/empty \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives' \
    --setup-hook="find '$CACHE/debs' -name '*.deb' -exec cp -t \"\$1\"/var/cache/apt/archives {} +" \
    --extract-hook="cp -n \"\$1\"/var/cache/apt/archives/*.deb '$CACHE/debs'/" \
    --extract-hook="cd \"\$1\"/var/cache/apt/archives && ls *.deb > '$OUT/debs.list'" \
    bookworm "$ROOTFS" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"

# apt extracted exactly the lock: no package more (a dependency that changed).
extracted=$(while read -r deb; do
    printf '%s=%s\n' "$(dpkg-deb -f "$CACHE/debs/$deb" Package)" "$(dpkg-deb -f "$CACHE/debs/$deb" Version)"
done < "$OUT/debs.list" | sort)
expected=$(printf '%s\n' "${PINNED[@]}" | sort)
[ "$extracted" = "$expected" ] || die "apt extracted other packages than $LOCK lists:
$(diff <(echo "$expected") <(echo "$extracted") || true)"

# ---- 2. Python packages ---------------------------------------------------
pip_target=(--no-deps --require-hashes --only-binary=:all: --platform=manylinux2014_x86_64
            --python-version=3.11 --implementation=cp --abi=cp311 -r "$ROOT/image/requirements.lock")
if ! "$PIP" install -q --disable-pip-version-check --no-index --find-links="$CACHE/wheels" \
        --no-compile --target="$ROOTFS/$SITE" "${pip_target[@]}" 2>/dev/null; then
    say "downloading wheels from PyPI into $CACHE/wheels"
    "$PIP" download -q --disable-pip-version-check --dest="$CACHE/wheels" "${pip_target[@]}"
    "$PIP" install -q --disable-pip-version-check --no-index --find-links="$CACHE/wheels" \
        --no-compile --target="$ROOTFS/$SITE" "${pip_target[@]}"
fi
rm -rf "$ROOTFS/$SITE/bin"

# ---- 3. strip, assemble ----------------------------------------------------
say "removing ${#DROPPED[@]} dropped packages and image/strip.list"
while read -r deb; do
    package=$(dpkg-deb -f "$CACHE/debs/$deb" Package)
    printf '%s\n' "${DROPPED[@]}" | grep -qxF "$package" || continue
    # Files and links only; assemble.sh prunes the directories left empty.
    dpkg-deb --fsys-tarfile "$CACHE/debs/$deb" | tar -t | grep -v '/$' | sed 's|^\./||' |
        while read -r path; do rm -f "$ROOTFS/$path"; done
done < "$OUT/debs.list"
"$ROOT/image/assemble.sh" "$ROOTFS" "$ROOT"

# ---- 4. tarball, image, archive ----------------------------------------------------
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime --numeric-owner \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$ROOTFS" -cf "$OUT/rootfs.tar" .
ctx=$OUT/context
rm -rf "$ctx" && mkdir -p "$ctx"
ln "$OUT/rootfs.tar" "$ctx/rootfs.tar"
# The Dockerfile's final stage, with the builder's root replaced by our tarball:
# one description of the image's metadata (user, entrypoint, env, labels) for both.
awk '/^FROM scratch/ {final = 1} final' "$ROOT/Dockerfile" |
    sed 's|^COPY --from=builder /rootfs/ /$|ADD rootfs.tar /|' > "$ctx/Containerfile"
grep -qx 'ADD rootfs.tar /' "$ctx/Containerfile" || die "the Dockerfile has no 'FROM scratch' + 'COPY --from=builder /rootfs/ /' final stage"
say "podman build $IMAGE"
$PODMAN build --quiet --timestamp "$SOURCE_DATE_EPOCH" --file "$ctx/Containerfile" \
    --tag "$IMAGE" "$ctx" >/dev/null
archive=$OUT/my-controller-$VERSION.oci.tar
rm -f "$archive"
$PODMAN save --quiet --format oci-archive --output "$archive" "$IMAGE"
rm -rf "$ctx"

uncompressed=$(stat -c %s "$OUT/rootfs.tar")
layer=$(tar -tvf "$archive" | awk '$3 > max && $6 ~ /^blobs/ {max = $3} END {print max}')
awk -v img="$IMAGE" -v u="$uncompressed" -v c="$layer" -v a="${archive#"$ROOT"/}" 'BEGIN {
    printf "%s: %.1f MB uncompressed (%d bytes), %.1f MB compressed (the gzip layer of %s)\n",
           img, u / 1e6, u, c / 1e6, a }' > "$OUT/image.txt"
