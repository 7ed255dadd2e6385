#!/usr/bin/env bash
# image/assemble.sh ROOTFS SRC: finish an extracted root filesystem into the image's.
#
# Shared by both ways of building the image, so they make the same one:
# image/build.sh (make image: mmdebstrap, podman) and the Dockerfile's builder
# stage (apt-get download + dpkg-deb -x). Before it runs, ROOTFS holds the
# `keep` packages of image/packages.lock, extracted, and the wheels of
# image/requirements.lock in usr/lib/python3/dist-packages. SRC is the
# repository (controller.py, k8s_http/, image/strip.list).
#
#   1. the globs of image/strip.list go
#   2. the operator, its console script /usr/bin/my-controller, the nonroot
#      user (65532) in /etc/passwd and /etc/group, empty mount points
#   3. bytecode for every module, compiled by the image's own interpreter
#      (chroot) as unchecked-hash .pyc: valid whatever mtimes a layer gets, never
#      rewritten, so a read-only root costs nothing at start
#   4. checks: every extension module left loads, the entrypoint answers --help
#      as 65532, every .py has its .pyc, no shell, pip or package manager
#
# Needs root (chroot) and bash, coreutils, findutils, grep on the host side.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 ROOTFS SRC" >&2; exit 2; }
ROOTFS=$(cd "$1" && pwd)
ROOT=$(cd "$2" && pwd)
SITE=usr/lib/python3/dist-packages        # on the Debian interpreter's sys.path
PY=usr/bin/python3.11
UID_GID=65532                             # distroless "nonroot"

say() { printf '# image: %s\n' "$*" >&2; }
die() { printf 'image/assemble.sh: %s\n' "$*" >&2; exit 1; }

# ---- 1. strip -----------------------------------------------------------------
grep -v '^\s*\(#\|$\)' "$ROOT/image/strip.list" | while read -r pattern; do
    # Globs expand inside the root only (cd, then a relative pattern).
    (cd "$ROOTFS" && shopt -s nullglob && for path in $pattern; do rm -rf -- "$path"; done)
done
find "$ROOTFS" -depth -mindepth 1 -type d -empty -not -path "$ROOTFS/tmp" -delete
find "$ROOTFS" -name '__pycache__' -prune -exec rm -rf {} +   # all rebuilt in step 3

# ---- 2. the operator, its entrypoint, its user ---------------------------------
install -m 0644 "$ROOT/controller.py" "$ROOTFS/$SITE/"
install -d "$ROOTFS/$SITE/k8s_http"
install -m 0644 "$ROOT"/k8s_http/*.py "$ROOTFS/$SITE/k8s_http/"
# The console script setup.cfg declares (my-controller = controller:main). The
# kernel runs its #! line itself: no shell needed.
cat > "$ROOTFS/usr/bin/my-controller" <<EOF
#!/$PY
import sys
from controller import main
sys.exit(main())
EOF
chmod 0755 "$ROOTFS/usr/bin/my-controller"
install -d "$ROOTFS/etc"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n' \
    $UID_GID $UID_GID > "$ROOTFS/etc/passwd"
printf 'root:x:0:\nnonroot:x:%s:\n' $UID_GID > "$ROOTFS/etc/group"
# Mount points a runtime fills, and $HOME: /home/nonroot, empty, root-owned like
# everything else (the root is read-only in the Pod; nothing is written there).
install -d -m 0755 "$ROOTFS/proc" "$ROOTFS/sys" "$ROOTFS/dev" "$ROOTFS/etc" "$ROOTFS/run" "$ROOTFS/var"
install -d -m 1777 "$ROOTFS/tmp"
install -d -m 0755 "$ROOTFS/home/nonroot"

# ---- 3. bytecode --------------------------------------------------------------
say "compiling bytecode with the image's interpreter"
chroot "$ROOTFS" "/$PY" -I -m compileall -q -j 1 --invalidation-mode unchecked-hash \
    "/usr/lib/python3.11" "/$SITE" >/dev/null || die "compileall failed"

# ---- 4. checks ----------------------------------------------------------------
# Every extension module left must load: a .so whose library was dropped fails here.
chroot --userspec=$UID_GID:$UID_GID "$ROOTFS" "/$PY" -I -B -c '
import importlib, os, sys
d = "/usr/lib/python3.11/lib-dynload"
names = sorted(f.split(".")[0] for f in os.listdir(d) if f.endswith(".so"))
for name in names:
    importlib.import_module(name)
import controller, k8s_http, yaml, prometheus_client, ssl, hashlib
print(f"{len(names)} extension modules load; {ssl.OPENSSL_VERSION}", file=sys.stderr)
' || die "an extension module or the operator does not import in the image"
chroot --userspec=$UID_GID:$UID_GID "$ROOTFS" /usr/bin/my-controller --help >/dev/null \
    || die "the entrypoint does not run"
# Every module has its bytecode (a missing .pyc would be compiled in memory at
# every start of a read-only container).
missing=$(cd "$ROOTFS" && find usr/lib/python3.11 "$SITE" -type f -name '*.py' | while read -r py; do
    pyc="$(dirname "$py")/__pycache__/$(basename "$py" .py).cpython-311.pyc"
    [ -f "$pyc" ] || echo "$py"
done)
[ -z "$missing" ] || die "no bytecode for: $missing"
for banned in bin/sh bin/bash bin/dash usr/bin/pip usr/bin/pip3 usr/bin/dpkg usr/bin/apt; do
    [ ! -e "$ROOTFS/$banned" ] || die "$banned is in the image"
done

