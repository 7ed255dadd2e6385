# my-controller image:   docker build -t my-controller:0.1.0 .
#                  or:   Kaniko (--context dir://<repo> --dockerfile Dockerfile)
#
# The same image `make image` builds without Docker (image/build.sh): a
# distroless-style root filesystem made of extracted Debian packages, pinned to
# the versions in image/packages.lock, plus the wheels of
# image/requirements.lock, finished by the same image/assemble.sh (strip,
# operator, nonroot user, precompiled bytecode, checks). Plain Dockerfile
# syntax only (no BuildKit-only `RUN --mount`, no heredocs), so the classic
# builder and Kaniko build it too.
#
# Builder base: Debian's dated bookworm slim image, pinned by the digest of its
# multi-platform index as docker-library/repo-info records it
# (repos/debian/remote/bookworm-20260918-slim.md). It only hosts apt, dpkg-deb
# and pip; nothing of it reaches the final image. Bumping it: take the newest
# dated `bookworm-YYYYMMDD-slim` tag and its index digest from that file (or
# `docker buildx imagetools inspect debian:bookworm-YYYYMMDD-slim`).
ARG BUILDER_IMAGE=debian:bookworm-20260918-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251

FROM ${BUILDER_IMAGE} AS builder
WORKDIR /src
# Only what the image is made from (.dockerignore keeps the rest out of the context).
COPY image/packages.lock image/requirements.lock image/strip.list image/assemble.sh image/
COPY controller.py ./
COPY k8s_http/ k8s_http/
COPY my/ my/
# 1. the `keep` packages of the lock, at their pinned versions, extracted (no
#    dpkg database, no maintainer scripts: what mmdebstrap --variant=extract does);
# 2. the hash-pinned wheels, installed by the builder's pip into the root;
# 3. image/assemble.sh: the rest, identical to `make image` (needs chroot, which
#    Docker and Kaniko allow a root build step by default), with the dpkg
#    status.d entries scanners read written from the same .debs.
# The builder's own pip is Debian's, pinned too. (apt-get download writes to the
# working directory. Plain POSIX sh, no pipes: podman's OCI-format builds ignore
# SHELL, so the step must not depend on it.)
WORKDIR /debs
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip=23.0.1+dfsg-1 \
    && awk '$1 == "keep" {print $2}' /src/image/packages.lock > /debs/keep.list \
    && xargs apt-get download < /debs/keep.list \
    && mkdir /rootfs \
    && for deb in /debs/*.deb; do dpkg-deb -x "$deb" /rootfs; done \
    && python3 -m pip install --no-cache-dir --disable-pip-version-check --break-system-packages \
        --no-deps --no-compile --only-binary=:all: --require-hashes \
        --target /rootfs/usr/lib/python3/dist-packages -r /src/image/requirements.lock \
    && rm -rf /rootfs/usr/lib/python3/dist-packages/bin /var/lib/apt/lists/* \
    && /src/image/assemble.sh /rootfs /src /debs/*.deb

FROM scratch
COPY --from=builder /rootfs/ /
LABEL org.opencontainers.image.title="my-controller" \
      org.opencontainers.image.description="A Kubernetes operator on the Python standard library: My -> Deployment + Service" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# The bytecode is precompiled; nothing may try to write it next to the code.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532 is the conventional "nonroot" UID/GID (distroless); numeric so the
# kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8080 8081
ENTRYPOINT ["/usr/bin/my-controller"]
