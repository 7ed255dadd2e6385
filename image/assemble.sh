#!/usr/bin/env bash
# image/assemble.sh ROOTFS SRC DEB...: finish an extracted root filesystem into the image's.
#
# Shared by both ways of building the image, so they make the same one:
# image/build.sh (make image: mmdebstrap, podman) and the Dockerfile's builder
# stage (apt-get download + dpkg-deb -x). Before it runs, ROOTFS holds the
# `keep` packages of image/packages.lock, extracted, and the wheels of
# image/requirements.lock in usr/lib/python3/dist-packages. SRC is the
# repository (controller.py, k8s_http/, my/, image/strip.list); the DEBs are the
# `keep` packages' .deb files.
#
#   1. the globs of image/strip.list go (but its `!` lines: copyright files)
#   2. the operator, its console script /usr/bin/my-controller, the nonroot
#      user (65532) in /etc/passwd and /etc/group, empty mount points
#   3. what scanners read, as distroless has it: var/lib/dpkg/status.d/PACKAGE
#      (the package's control fields, Status "install ok installed") and
#      PACKAGE.md5sums (the package's own sums of the files still in the root)
#   4. bytecode for every module, compiled by the image's own interpreter
#      (chroot) as unchecked-hash .pyc: valid whatever mtimes a layer gets, never
#      rewritten, so a read-only root costs nothing at start
#   5. checks: every extension module left loads, the entrypoint answers --help
#      as 65532, every .py has its .pyc, no shell, pip or package manager
#
# A root of another architecture (image/build.sh's arm64 one) takes two
# settings: EMULATOR, a static qemu-user binary that runs the root's interpreter
# for the checks (copied into the root for them, then removed), and PYC_FROM, a
# finished root of the same packages for the native architecture whose bytecode
# is copied: CPython's bytecode depends on the interpreter version and the
# source only, so it is copied for each .py equal to PYC_FROM's byte for byte,
# once the interpreters are checked to be the same package version; the few
# sources of this architecture alone are compiled under EMULATOR
# (tests/e2e/test_image.py recompiles the modules the operator loads under the
# emulator and compares with what was copied).
#
# Needs root (chroot), dpkg-deb, and bash, coreutils, findutils, grep on the host side.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 ROOTFS SRC DEB..." >&2; exit 2; }
ROOTFS=$(cd "$1" && pwd)
ROOT=$(cd "$2" && pwd)
shift 2
DEBS=("$@")
EMULATOR=${EMULATOR:-}
PYC_FROM=${PYC_FROM:-}
SITE=usr/lib/python3/dist-packages        # on the Debian interpreter's sys.path
PY=usr/bin/python3.11
UID_GID=65532                             # distroless "nonroot"

say() { printf '# image: %s\n' "$*" >&2; }
die() { printf 'image/assemble.sh: %s\n' "$*" >&2; exit 1; }

# ---- 1. strip -----------------------------------------------------------------
# The `!` lines' files are set aside first and put back after (only where they
# really are: not again through a symlinked directory).
kept=$(mktemp)
(cd "$ROOTFS" && shopt -s nullglob &&
    for pattern in $(sed -n 's/^!//p' "$ROOT/image/strip.list"); do
        for path in $pattern; do
            [ "$(cd "$(dirname "$path")" && pwd -P)" = "$(pwd -P)/$(dirname "$path")" ] && echo "$path"
        done
    done) | tar -C "$ROOTFS" -cf "$kept" --no-recursion -T -
grep -v '^\s*\(#\|$\|!\)' "$ROOT/image/strip.list" | while read -r pattern; do
    # Globs expand inside the root only (cd, then a relative pattern).
    (cd "$ROOTFS" && shopt -s nullglob && for path in $pattern; do rm -rf -- "$path"; done)
done
tar -C "$ROOTFS" -xf "$kept" && rm -f "$kept"
find "$ROOTFS" -depth -mindepth 1 -type d -empty -not -path "$ROOTFS/tmp" -delete
find "$ROOTFS" -name '__pycache__' -prune -exec rm -rf {} +   # all rebuilt in step 4

# ---- 2. the operator, its entrypoint, its user ---------------------------------
install -m 0644 "$ROOT/controller.py" "$ROOTFS/$SITE/"
# The packages (k8s_http with its wings, my): every .py, nothing else.
(cd "$ROOT" && find k8s_http my -name '*.py' -not -path '*/__pycache__/*' | sort) |
    while read -r src; do install -D -m 0644 "$ROOT/$src" "$ROOTFS/$SITE/$src"; done
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

# ---- 3. the dpkg database scanners read -----------------------------------------
status_d=$ROOTFS/var/lib/dpkg/status.d
install -d -m 0755 "$ROOTFS/var/lib/dpkg" "$status_d"
for deb in "${DEBS[@]}"; do
    package=$(dpkg-deb -f "$deb" Package)
    dpkg-deb -f "$deb" | awk '{print} /^Package:/ && !done {print "Status: install ok installed"; done = 1}' \
        > "$status_d/$package"
    # md5sums lines are "SUM  PATH" with PATH relative to the root.
    dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./md5sums 2>/dev/null |
        while read -r sum path; do
            [ -f "$ROOTFS/$path" ] && [ ! -L "$ROOTFS/$path" ] && printf '%s  %s\n' "$sum" "$path"
        done > "$status_d/$package.md5sums" || true
    [ -s "$status_d/$package.md5sums" ] || rm -f "$status_d/$package.md5sums"
    chmod 0644 "$status_d/$package"*
done
[ -e "$ROOTFS/etc/os-release" ] || die "no /etc/os-release (base-files is a keep package of the lock)"

# ---- 4. bytecode --------------------------------------------------------------
# in_root [--userspec=U:G] ARG...: run the root's own binary, under EMULATOR if set.
in_root() {
    local opts=()
    [[ "${1:-}" == --userspec=* ]] && { opts=("$1"); shift; }
    if [ -n "$EMULATOR" ]; then
        chroot "${opts[@]}" "$ROOTFS" /.emulator "$@"
    else
        chroot "${opts[@]}" "$ROOTFS" "$@"
    fi
}
if [ -n "$EMULATOR" ]; then
    install -m 0755 "$EMULATOR" "$ROOTFS/.emulator"
    trap 'rm -f "$ROOTFS/.emulator"' EXIT
fi
if [ -n "$PYC_FROM" ]; then
    version() { sed -n 's/^Version: //p' "$1/var/lib/dpkg/status.d/$2"; }
    for package in python3.11-minimal libpython3.11-minimal; do
        [ "$(version "$ROOTFS" $package)" = "$(version "$PYC_FROM" $package)" ] ||
            die "$package differs from PYC_FROM's: its bytecode cannot be reused"
    done
    # The same source gives the same bytecode: copied. A source of this
    # architecture only (_sysconfigdata__aarch64-linux-gnu.py) is compiled here.
    own=()
    while read -r py; do
        if ! cmp -s "$ROOTFS/$py" "$PYC_FROM/$py"; then own+=("/$py"); continue; fi
        pyc="$(dirname "$py")/__pycache__/$(basename "$py" .py).cpython-311.pyc"
        install -d -m 0755 "$ROOTFS/$(dirname "$pyc")"
        install -m 0644 "$PYC_FROM/$pyc" "$ROOTFS/$pyc"
    done < <(cd "$ROOTFS" && find usr/lib/python3.11 "$SITE" -type f -name '*.py' | sort)
    say "bytecode: the same interpreter as $PYC_FROM's; its .pyc copied, ${#own[@]} of this root's own compiled: ${own[*]}"
    [ "${#own[@]}" -le 5 ] || die "${#own[@]} sources differ from PYC_FROM's: not the same packages?"
    [ "${#own[@]}" -eq 0 ] || in_root "/$PY" -I -m compileall -q --invalidation-mode unchecked-hash \
        "${own[@]}" >/dev/null || die "compileall failed"
else
    say "compiling bytecode with the image's interpreter"
    in_root "/$PY" -I -m compileall -q -j 1 --invalidation-mode unchecked-hash \
        "/usr/lib/python3.11" "/$SITE" >/dev/null || die "compileall failed"
fi

# ---- 5. checks ----------------------------------------------------------------
# Every extension module left must load: a .so whose library was dropped fails here.
in_root --userspec=$UID_GID:$UID_GID "/$PY" -I -B -c '
import importlib, os, sys
d = "/usr/lib/python3.11/lib-dynload"
names = sorted(f.split(".")[0] for f in os.listdir(d) if f.endswith(".so"))
for name in names:
    importlib.import_module(name)
import controller, k8s_http, my.status, my.render, yaml, prometheus_client, ssl, hashlib
print(f"{len(names)} extension modules load; {ssl.OPENSSL_VERSION}", file=sys.stderr)
' || die "an extension module or the operator does not import in the image"
# (An emulator runs ELF files only: it is given the #! line's interpreter.)
if [ -n "$EMULATOR" ]; then
    in_root --userspec=$UID_GID:$UID_GID "/$PY" /usr/bin/my-controller --help >/dev/null
else
    in_root --userspec=$UID_GID:$UID_GID /usr/bin/my-controller --help >/dev/null
fi || die "the entrypoint does not run"
# Every module has its bytecode (a missing .pyc would be compiled in memory at
# every start of a read-only container).
missing=$(cd "$ROOTFS" && find usr/lib/python3.11 "$SITE" -type f -name '*.py' | while read -r py; do
    pyc="$(dirname "$py")/__pycache__/$(basename "$py" .py).cpython-311.pyc"
    [ -f "$pyc" ] || echo "$py"
done)
[ -z "$missing" ] || die "no bytecode for: $missing"
for banned in bin/sh bin/bash bin/dash usr/bin/pip usr/bin/pip3 usr/bin/dpkg usr/bin/apt usr/bin/awk usr/bin/mawk; do
    [ ! -e "$ROOTFS/$banned" ] || die "$banned is in the image"
done

