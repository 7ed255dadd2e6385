#!/usr/bin/env bash
# Build the my-controller image without Docker: image/build.sh [OUT_DIR]  (make image)
#
# For linux/amd64, then linux/arm64:
#   1. mmdebstrap --variant=extract --architectures=ARCH: the Debian packages of
#      image/packages.lock, every one pinned, unpacked into OUT/rootfs-ARCH (no
#      dpkg database, no maintainer scripts, no shell: the distroless recipe; a
#      foreign architecture needs no emulation for that). .debs are cached by
#      file name (= name_version_arch) under ~/.cache/my-controller/image/debs.
#   2. PyYAML and prometheus-client from image/requirements.lock (hash-checked
#      wheels for ARCH, cached under ~/.cache/my-controller/image/wheels),
#      installed with the host's pip into the root's dist-packages: no pip.
#   3. The `drop` packages' files are deleted, then image/assemble.sh (shared
#      with the Dockerfile) strips image/strip.list, adds the operator and its
#      console script, the nonroot user 65532, the dpkg status.d entries
#      scanners read, precompiles all bytecode for a read-only root (arm64:
#      amd64's, same interpreter and sources), and checks the result (arm64:
#      under qemu-aarch64-static, no binfmt).
#   4. OUT/rootfs-ARCH.tar (sorted, fixed mtimes, numeric owners), `podman build
#      --platform linux/ARCH` of the Dockerfile's final stage with `ADD
#      rootfs.tar /` for its COPY (FROM scratch, no RUN: no registry, no
#      emulation), with the revision and source labels.
# Then image/oci_index.py joins both into OUT/my-controller-VERSION.oci.tar, an
# image index carrying the OCI annotations (source, version, revision, created =
# SOURCE_DATE_EPOCH = the last commit's time, licenses), image/sbom.py writes
# OUT/my-controller-VERSION.spdx.json beside it, and the sizes and digests go to
# OUT/image.txt (`make image` prints it). Same commit and inputs, same digests.
#
# Needs root (mmdebstrap's root mode, chroot), mmdebstrap, podman, and a pip
# ($PIP, default the project's .venv), qemu-aarch64-static. Environment: IMAGE
# (tag), PODMAN (command), IMAGE_SOURCE (default: the git remote origin).
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

ARCHES=(amd64 arm64)                       # amd64 first: arm64 reuses its bytecode
declare -A PY_PLATFORM=([amd64]=manylinux2014_x86_64 [arm64]=manylinux2014_aarch64)
declare -A QEMU=([amd64]="" [arm64]=qemu-aarch64-static)
# org.opencontainers.image.source: IMAGE_SOURCE, else the origin remote as https.
SOURCE=${IMAGE_SOURCE:-$(git -C "$ROOT" remote get-url origin 2>/dev/null |
    sed -e 's|^git@\([^:]*\):|https://\1/|' -e 's|\.git$||' || true)}
REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
[ -n "$SOURCE" ] || say "no git remote origin and no IMAGE_SOURCE: the image has no source annotation"
[ -x "$(command -v qemu-aarch64-static)" ] || die "qemu-aarch64-static is missing (runs the arm64 image's checks): make image-tools installs qemu-user-static"
mkdir -p "$CACHE/debs" "$CACHE/wheels"
rm -rf "$OUT"/rootfs* "$OUT"/debs*.list "$OUT/oci"

! grep -q '^review ' "$LOCK" || die "$LOCK has \`review\` lines (make image-lock found new packages): mark each keep or drop"
mapfile -t PINNED < <(awk '$1 == "keep" || $1 == "drop" {print $2}' "$LOCK")
mapfile -t KEPT < <(awk '$1 == "keep" {split($2, p, "="); print p[1]}' "$LOCK")
mapfile -t DROPPED < <(awk '$1 == "drop" {split($2, p, "="); print p[1]}' "$LOCK")
[ "${#PINNED[@]}" -gt 0 ] || die "$LOCK lists no packages"

for ARCH in "${ARCHES[@]}"; do
ROOTFS=$OUT/rootfs-$ARCH
DEBS_LIST=$OUT/debs-$ARCH.list
# ---- 1. Debian packages ---------------------------------------------------
say "$ARCH: mmdebstrap: ${#PINNED[@]} pinned packages (debs cached in $CACHE/debs)"
# The cache goes in before apt looks (download/empty is skipped so apt may find
# it there; apt still checks each file against the signed index) and comes back
# out after the download. --variant=extract runs no maintainer script, so a
# foreign architecture needs no emulation here.
mmdebstrap --quiet --mode=root --variant=extract --architectures="$ARCH" \
    --include="$(IFS=,; echo "${PINNED[*]}")" \
    --skip=download/empty \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives' \
    --setup-hook="find '$CACHE/debs' -name '*_${ARCH}.deb' -exec cp -t \"\$1\"/var/cache/apt/archives {} +" \
    --setup-hook="find '$CACHE/debs' -name '*_all.deb' -exec cp -t \"\$1\"/var/cache/apt/archives {} +" \
    --extract-hook="cp -n \"\$1\"/var/cache/apt/archives/*.deb '$CACHE/debs'/" \
    --extract-hook="cd \"\$1\"/var/cache/apt/archives && ls *.deb > '$DEBS_LIST'" \
    bookworm "$ROOTFS" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"

# apt extracted exactly the lock: no package more (a dependency that changed).
extracted=$(while read -r deb; do
    printf '%s=%s\n' "$(dpkg-deb -f "$CACHE/debs/$deb" Package)" "$(dpkg-deb -f "$CACHE/debs/$deb" Version)"
done < "$DEBS_LIST" | sort)
expected=$(printf '%s\n' "${PINNED[@]}" | sort)
[ "$extracted" = "$expected" ] || die "apt extracted other packages for $ARCH than $LOCK lists:
$(diff <(echo "$expected") <(echo "$extracted") || true)"

# ---- 2. Python packages ---------------------------------------------------
pip_target=(--no-deps --require-hashes --only-binary=:all: --platform="${PY_PLATFORM[$ARCH]}"
            --python-version=3.11 --implementation=cp --abi=cp311 -r "$ROOT/image/requirements.lock")
if ! "$PIP" install -q --disable-pip-version-check --no-index --find-links="$CACHE/wheels" \
        --no-compile --target="$ROOTFS/$SITE" "${pip_target[@]}" 2>/dev/null; then
    say "$ARCH: downloading wheels from PyPI into $CACHE/wheels"
    "$PIP" download -q --disable-pip-version-check --dest="$CACHE/wheels" "${pip_target[@]}"
    "$PIP" install -q --disable-pip-version-check --no-index --find-links="$CACHE/wheels" \
        --no-compile --target="$ROOTFS/$SITE" "${pip_target[@]}"
fi
rm -rf "$ROOTFS/$SITE/bin"

# ---- 3. strip, assemble ----------------------------------------------------
say "$ARCH: removing ${#DROPPED[@]} dropped packages and image/strip.list"
keep_debs=()
while read -r deb; do
    package=$(dpkg-deb -f "$CACHE/debs/$deb" Package)
    if printf '%s\n' "${KEPT[@]}" | grep -qxF "$package"; then
        keep_debs+=("$CACHE/debs/$deb")
        continue
    fi
    # Files and links only; assemble.sh prunes the directories left empty.
    dpkg-deb --fsys-tarfile "$CACHE/debs/$deb" | tar -t | grep -v '/$' | sed 's|^\./||' |
        while read -r path; do rm -f "$ROOTFS/$path"; done
done < "$DEBS_LIST"
if [ "$ARCH" = amd64 ]; then
    "$ROOT/image/assemble.sh" "$ROOTFS" "$ROOT" "${keep_debs[@]}"
else
    EMULATOR=$(command -v "${QEMU[$ARCH]}") PYC_FROM=$OUT/rootfs-amd64 \
        "$ROOT/image/assemble.sh" "$ROOTFS" "$ROOT" "${keep_debs[@]}"
fi

# ---- 4. tarball, image ------------------------------------------------------
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime --numeric-owner \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$ROOTFS" -cf "$ROOTFS.tar" .
ctx=$OUT/context
rm -rf "$ctx" && mkdir -p "$ctx"
ln "$ROOTFS.tar" "$ctx/rootfs.tar"
# The Dockerfile's final stage, with the builder's root replaced by our tarball:
# one description of the image's metadata (user, entrypoint, env, labels) for both.
awk '/^FROM scratch/ {final = 1} final' "$ROOT/Dockerfile" |
    sed 's|^COPY --from=builder /rootfs/ /$|ADD rootfs.tar /|' > "$ctx/Containerfile"
grep -qx 'ADD rootfs.tar /' "$ctx/Containerfile" || die "the Dockerfile has no 'FROM scratch' + 'COPY --from=builder /rootfs/ /' final stage"
# FROM scratch and no RUN: a foreign platform needs no emulation either.
tag=$IMAGE-$ARCH
[ "$ARCH" = amd64 ] && tag=$IMAGE          # the native one keeps the plain tag
say "$ARCH: podman build $tag"
$PODMAN build --quiet --platform "linux/$ARCH" --timestamp "$SOURCE_DATE_EPOCH" \
    --label "org.opencontainers.image.revision=$REVISION" \
    ${SOURCE:+--label "org.opencontainers.image.source=$SOURCE"} \
    --file "$ctx/Containerfile" --tag "$tag" "$ctx" >/dev/null
$PODMAN save --quiet --format oci-archive --output "$OUT/oci-$ARCH.tar" "$tag"
rm -rf "$ctx"
done

# ---- 5. one archive, an image index for both; the SBOM beside it -------------------
archive=$OUT/my-controller-$VERSION.oci.tar
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
annotations=(
    "org.opencontainers.image.title=my-controller"
    "org.opencontainers.image.version=$VERSION"
    "org.opencontainers.image.revision=$REVISION"
    "org.opencontainers.image.created=$created"
    "org.opencontainers.image.licenses=$(sed -n 's/^license = //p' "$ROOT/setup.cfg")"
)
[ -z "$SOURCE" ] || annotations+=("org.opencontainers.image.source=$SOURCE")
oci_tars=() roots=()
for ARCH in "${ARCHES[@]}"; do oci_tars+=("$OUT/oci-$ARCH.tar") roots+=("$OUT/rootfs-$ARCH"); done
python3 "$ROOT/image/oci_index.py" "$archive" "$IMAGE" "$SOURCE_DATE_EPOCH" "${annotations[@]}" -- \
    "${oci_tars[@]}" > "$OUT/digests.txt"
python3 "$ROOT/image/sbom.py" "$OUT/my-controller-$VERSION.spdx.json" "$OUT/digests.txt" \
    "$SOURCE_DATE_EPOCH" "${annotations[@]}" -- "${roots[@]}"
# bench/image_footprint.py measures the native layer as build/rootfs.tar.
ln -f "$OUT/rootfs-amd64.tar" "$OUT/rootfs.tar"

{
    for ARCH in "${ARCHES[@]}"; do
        layer=$(tar -tvf "$OUT/oci-$ARCH.tar" | awk '$3 > max && $6 ~ /^blobs/ {max = $3} END {print max}')
        awk -v img="$IMAGE" -v arch="$ARCH" -v u="$(stat -c %s "$OUT/rootfs-$ARCH.tar")" -v c="$layer" 'BEGIN {
            printf "%s linux/%s: %.1f MB uncompressed (%d bytes), %.1f MB compressed (its gzip layer)\n",
                   img, arch, u / 1e6, u, c / 1e6 }'
    done
    sed 's/^/digest /' "$OUT/digests.txt"
    echo "in ${archive#"$ROOT"/}, its SBOM (SPDX 2.3 JSON) in build/my-controller-$VERSION.spdx.json"
} > "$OUT/image.txt"
rm -f "${oci_tars[@]}"
