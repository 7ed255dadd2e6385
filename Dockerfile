# syntax=docker/dockerfile:1
#
# my-controller image:   docker build -t my-controller:0.1.0 .
#
# Two stages. The builder turns the repository into wheels (ours, pure Python,
# plus PyYAML's and prometheus-client's, which PyPI serves as ready wheels, so
# nothing is compiled). The final stage installs those wheels and nothing
# else: no compiler, no build tools, no pip cache, no wheel files, and in the
# end not even pip. tests/integration/test_install.py repeats this install in
# a clean virtualenv; bench/RESULTS.footprint.md has the sizes.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest out of the context).
COPY pyproject.toml setup.cfg README.md controller.py ./
COPY k8s_http/ k8s_http/
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="my-controller" \
      org.opencontainers.image.description="A Kubernetes operator on the Python standard library: My -> Deployment + Service" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# The wheels are bind-mounted from the builder for this one step, so they never
# become a layer. pip compiles the bytecode here, at build time: the container
# runs with a read-only root filesystem, where Python could never cache it, and
# without it every start would recompile (bench/RESULTS.footprint.md: about
# 1.0 s instead of 0.6 s to start; 1 MB of .pyc). Then pip, setuptools and
# wheel go: nothing is installed at run time.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels --disable-pip-version-check \
        my-controller==0.1.0 \
    && python -m pip uninstall --yes --quiet pip setuptools wheel \
    && rm -rf /root/.cache
# Set after the install: nothing may try to write bytecode next to the code at run time.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532 is the conventional "nonroot" UID/GID (distroless); numeric so the
# kubelet can verify runAsNonRoot without an /etc/passwd entry.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["my-controller"]
