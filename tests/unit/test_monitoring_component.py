"""The monitoring component moves with the install: rendered by kubectl's kustomize.

A platform team's overlays (the README's, "Deploying") put the operator in
`platform-ops` under the name prefix `team-a-`: the secure install with the
alerts and the server-name transformer, and the plain install with the whole
monitoring component. Every object must land in `platform-ops` under its
prefixed name, every selector must find what it selects there, and the
HTTPS ServiceMonitor must verify the certificate of the Service as the overlay
names it. The same renders with the default namespace and no prefix must give
the files' own names, so the derivation is not a constant.

kubectl comes from $KUBEBUILDER_ASSETS or the control plane's cache (as the
e2e suite takes it), else the PATH. Without one the test fails and says how to
get it: `make test` builds the cache before the suites run.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
import yaml

from tests.support.controlplane import ControlPlaneError, find_binaries

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
MONITORING = MANIFESTS / "components" / "monitoring"
SERVER_NAME = MANIFESTS / "transformers" / "metrics-server-name"
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
NAMESPACE, PREFIX = "platform-ops", "team-a-"


@pytest.fixture(scope="module")
def kubectl() -> str:
    try:
        found = find_binaries(build=False, need_controller_manager=False).kubectl
    except ControlPlaneError:
        found = None
    found = found or shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl not found: run `make testbin` (or set KUBEBUILDER_ASSETS to "
                    "envtest binaries, or put kubectl on the PATH)", pytrace=False)
    return found


def render(kubectl: str, directory: pathlib.Path, *, resources: list[pathlib.Path],
           components: list[pathlib.Path] = (), transformers: list[pathlib.Path] = (),
           namespace: str | None = NAMESPACE, prefix: str | None = PREFIX) -> list[dict]:
    """`kubectl kustomize` of an overlay written in `directory`, as a user writes one."""
    def rel(paths):
        return [os.path.relpath(p, directory) for p in paths]
    kust = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": rel(resources)}
    if namespace:
        kust["namespace"] = namespace
    if prefix:
        kust["namePrefix"] = prefix
    if components:
        kust["components"] = rel(components)
    if transformers:
        kust["transformers"] = rel(transformers)
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    proc = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "arning" not in proc.stderr, proc.stderr          # nothing deprecated
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def only(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, [d["metadata"]["name"] for d in found])
    return found[0]


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def check_moved(docs: list[dict], namespace: str, prefix: str) -> None:
    """Every object in `namespace` under `prefix`, and the monitoring objects find theirs."""
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] == "Namespace":
            assert meta["name"] == namespace
        elif doc["kind"] == "CustomResourceDefinition":
            assert meta["name"] == "my.mine.jp"                  # a CRD's name is its API
        else:
            assert meta["name"].startswith(prefix + "my-"), (doc["kind"], meta["name"])
            if doc["kind"] not in CLUSTER_SCOPED:
                assert meta["namespace"] == namespace, (doc["kind"], meta)

    service = only(docs, "Service")
    deployment = only(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(service["spec"]["selector"], pod_labels)
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)

    monitor = only(docs, "ServiceMonitor")
    assert monitor["metadata"]["name"] == f"{prefix}my-controller"
    assert monitor["metadata"]["namespace"] == namespace == service["metadata"]["namespace"]
    # no namespaceSelector: Prometheus looks in the ServiceMonitor's own namespace
    assert "namespaceSelector" not in monitor["spec"]
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    # ... and that label selection finds the metrics Service alone, not the Pods' one
    assert not selects(monitor["spec"]["selector"]["matchLabels"], pod_labels)
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    assert endpoint["port"] == port["name"]
    assert endpoint["scheme"] == service["metadata"]["annotations"]["prometheus.io/scheme"]

    rule = only(docs, "PrometheusRule")
    assert rule["metadata"]["name"] == f"{prefix}my-controller"
    assert rule["metadata"]["namespace"] == namespace
    # the rules select by what the operator exports, which no overlay renames
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert exprs and not any(namespace in e or "my-controller-system" in e for e in exprs)


@pytest.mark.parametrize("namespace,prefix", [(NAMESPACE, PREFIX), (None, None)])
def test_the_secure_install_moves_with_its_monitoring(kubectl, tmp_path, namespace, prefix):
    docs = render(kubectl, tmp_path / "platform-ops",
                  resources=[MANIFESTS / "overlays" / "secure-metrics"],
                  components=[MONITORING / "alerts"], transformers=[SERVER_NAME],
                  namespace=namespace, prefix=prefix)
    namespace, prefix = namespace or "my-controller-system", prefix or ""
    check_moved(docs, namespace, prefix)

    service, monitor = only(docs, "Service"), only(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    # the name the certificate carries for the Service, as the overlay names it
    assert endpoint["tlsConfig"]["serverName"] == \
        f"{prefix}my-controller-metrics.{namespace}.svc" == \
        f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    # the CA Secret and the serving Secret are one (neither is in the manifests,
    # so kustomize prefixes neither)
    (volume,) = only(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert endpoint["tlsConfig"]["ca"]["secret"]["name"] == volume["secret"]["secretName"]


def test_the_plain_install_moves_with_its_monitoring(kubectl, tmp_path):
    docs = render(kubectl, tmp_path / "platform-ops", resources=[MANIFESTS],
                  components=[MONITORING])
    check_moved(docs, NAMESPACE, PREFIX)
    (endpoint,) = only(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint


def test_without_the_transformer_the_server_name_is_stale(kubectl, tmp_path):
    """Why the transformer exists: a moved overlay without it keeps the default name."""
    docs = render(kubectl, tmp_path / "platform-ops",
                  resources=[MANIFESTS / "overlays" / "secure-metrics"])
    (endpoint,) = only(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["serverName"] == "my-controller-metrics.my-controller-system.svc"


def test_the_readme_overlay_is_the_tested_one():
    readme = (ROOT / "README.md").read_text()
    for line in ("namespace: platform-ops", "namePrefix: team-a-",
                 "- ../my-controller/manifests/overlays/secure-metrics",
                 "- ../my-controller/manifests/components/monitoring/alerts",
                 "- ../my-controller/manifests/transformers/metrics-server-name"):
        assert line in readme, line
