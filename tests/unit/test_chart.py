"""charts/my-controller: helm v4's lint and template, and the same objects as manifests/.

The chart and manifests/ are two ways to install one thing, so each rendering
of the chart is compared with the kustomize overlay that means the same:
default values with `kubectl kustomize manifests/`, secure metrics with
overlays/secure-metrics, sharding with overlays/sharding, the monitoring
values with the monitoring components,
namespace.name/namePrefix with an overlay's namespace:/namePrefix:. Objects
are compared whole, after taking out the labels only Helm adds (chart,
instance, version, managed-by). The CRD and the alerts are not written twice:
the chart holds copies (`make chart`), checked byte for byte here.

helm comes from $HELM or the tools cache (tests/support/helm.py); kubectl as
in test_monitoring_component.py. Without them the tests fail and say how to
get them.
"""

from __future__ import annotations

import configparser
import copy
import os
import subprocess

import pytest
import yaml

import controller
from tests.support.helm import CHART, HELM_VERSION, HOW, ROOT, find_helm, run_helm
from tests.unit.test_monitoring_component import kubectl, render  # noqa: F401 (a fixture)

MANIFESTS = ROOT / "manifests"
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by"}
SECURE = MANIFESTS / "overlays" / "secure-metrics"
SHARDING = MANIFESTS / "overlays" / "sharding"
ALERTS = MANIFESTS / "components" / "monitoring" / "alerts"
MONITORING = MANIFESTS / "components" / "monitoring"
SERVER_NAME = MANIFESTS / "transformers" / "metrics-server-name"


@pytest.fixture(scope="module")
def helm() -> str:
    found = find_helm()
    if found is None:
        pytest.fail(f"helm not found: {HOW}", pytrace=False)
    return found


@pytest.fixture
def template(helm, tmp_path):
    """`helm template` of the chart with --set values, as parsed documents."""
    def run(*values: str, namespace: str = "default", check: bool = True):
        args = ["template", "my-controller", str(CHART), "--include-crds",
                "--namespace", namespace]
        for value in values:
            args += ["--set", value]
        proc = run_helm(helm, tmp_path / "helm-home", *args, check=check)
        if not check:
            return proc
        return [d for d in yaml.safe_load_all(proc.stdout) if d]
    return run


def normalised(docs: list[dict]) -> dict[tuple[str, str, str], dict]:
    """Objects by (kind, namespace, name), without the labels only Helm adds."""
    out = {}
    for doc in copy.deepcopy(docs):
        for meta in (doc["metadata"], ((doc.get("spec") or {}).get("template") or {}).get(
                "metadata")):
            if meta and "labels" in meta:
                meta["labels"] = {k: v for k, v in meta["labels"].items()
                                  if k not in HELM_LABELS}
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        assert key not in out, f"{key} rendered twice"
        out[key] = doc
    return out


def assert_same(chart: list[dict], kustomized: list[dict]) -> None:
    ours, theirs = normalised(chart), normalised(kustomized)
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        assert ours[key] == theirs[key], key


def test_helm_is_v4(helm, tmp_path):
    version = run_helm(helm, tmp_path, "version", "--short").stdout
    assert version.startswith("v4."), version
    if helm == find_helm() and "HELM" not in os.environ:
        assert version.startswith(HELM_VERSION), version


def test_the_charts_crd_and_alerts_are_the_manifests(tmp_path):
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["my.mine.jp.yaml"]
    assert (CHART / "crds" / "my.mine.jp.yaml").read_bytes() == \
        (MANIFESTS / "base" / "crd.yaml").read_bytes(), "run `make chart`"
    assert (CHART / "files" / "prometheusrule.yaml").read_bytes() == \
        (ALERTS / "prometheusrule.yaml").read_bytes(), "run `make chart`"


def test_app_version_is_the_operators():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert chart["appVersion"] == cfg["metadata"]["version"]
    (image,) = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["images"]
    assert image["newTag"] == chart["appVersion"]


@pytest.mark.parametrize("values", [
    [],
    ["metrics.secure=true", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
     "namespace.name=platform-ops", "namePrefix=team-a-", "replicas=2", "logLevel=debug",
     "workers=8", "image.digest=sha256:" + "0" * 64],
    ["namespace.create=false", "namespace.name=", "leaderElection.enabled=false"],
    ["sharding.enabled=true", "replicas=3"],
])
def test_helm_lint_is_clean(helm, tmp_path, values):
    args = ["lint", "--strict", str(CHART), "--namespace", "elsewhere"]
    for value in values:
        args += ["--set", value]
    proc = run_helm(helm, tmp_path, *args)
    assert "0 chart(s) failed" in proc.stdout, proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_default_values_render_what_kustomize_renders(template, kubectl):  # noqa: F811
    proc = subprocess.run([kubectl, "kustomize", str(MANIFESTS)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    kustomized = [d for d in yaml.safe_load_all(proc.stdout) if d]
    rendered = template()
    assert_same(rendered, kustomized)
    # and Helm's labels are there, so `helm` commands and selectors by release work
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/instance"] == "my-controller"


def test_sharding_renders_the_sharding_overlay(template, kubectl):  # noqa: F811
    """sharding.enabled (with replicas=3, as the overlay) replaces leader election:
    --shards=auto, POD_NAME, list, watch and delete on leases."""
    proc = subprocess.run([kubectl, "kustomize", str(SHARDING)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    kustomized = [d for d in yaml.safe_load_all(proc.stdout) if d]
    rendered = template("sharding.enabled=true", "replicas=3")
    assert_same(rendered, kustomized)
    args = controller.build_parser().parse_args(_container(rendered)["args"])
    assert args.shards == "auto" and not args.leader_elect
    # leaderElection is not used then, whatever it says
    assert_same(template("sharding.enabled=true", "replicas=3", "leaderElection.enabled=false"),
                kustomized)


def test_secure_metrics_render_the_secure_overlay(template, kubectl, tmp_path):  # noqa: F811
    kustomized = render(kubectl, tmp_path / "secure", resources=[SECURE], namespace=None,
                        prefix=None)
    # the overlay brings its HTTPS ServiceMonitor along
    assert_same(template("metrics.secure=true", "serviceMonitor.enabled=true"), kustomized)


@pytest.mark.parametrize("secure", [False, True])
def test_a_moved_install_with_monitoring_renders_the_overlay(template, kubectl,  # noqa: F811
                                                             tmp_path, secure):
    """namespace.name and namePrefix as an overlay's namespace: and namePrefix:,
    with the ServiceMonitor and the alerts (secure: the HTTPS ServiceMonitor,
    its serverName derived by the transformer)."""
    if secure:
        kustomized = render(kubectl, tmp_path / "overlay", resources=[SECURE],
                            components=[ALERTS], transformers=[SERVER_NAME])
    else:
        kustomized = render(kubectl, tmp_path / "overlay", resources=[MANIFESTS],
                            components=[MONITORING])
    rendered = template(f"metrics.secure={str(secure).lower()}", "serviceMonitor.enabled=true",
                        "prometheusRule.enabled=true", "namespace.name=platform-ops",
                        "namePrefix=team-a-")
    assert_same(rendered, kustomized)
    # the rule's own {{ $labels }} templates reach Prometheus untouched
    rule = next(d for d in rendered if d["kind"] == "PrometheusRule")
    assert "{{ $labels.namespace }}" in yaml.safe_dump(rule["spec"])


def _container(docs: list[dict]) -> dict:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_values_reach_the_container(template):
    docs = template("replicas=3", "leaderElection.id=ops-lease", "logLevel=debug", "workers=8",
                    "extraArgs={--qps=50}", "image.repository=registry.example/my-controller",
                    "image.digest=sha256:" + "a" * 64, "resources.limits.memory=1Gi",
                    "nodeSelector.pool=ops")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "ops"}
    container = _container(docs)
    args = controller.build_parser().parse_args(container["args"])
    assert (args.leader_elect, args.leader_election_id) == (True, "ops-lease")
    assert (args.log_level, args.workers, args.qps) == ("debug", 8, 50)
    assert container["image"] == "registry.example/my-controller@sha256:" + "a" * 64
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert template("image.tag=0.2.0") and _container(template("image.tag=0.2.0"))[
        "image"] == "my-controller:0.2.0"


def test_without_leader_election_no_lease_role_and_one_replica(template):
    docs = template("leaderElection.enabled=false")
    args = controller.build_parser().parse_args(_container(docs)["args"])
    assert args.leader_elect is False
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    proc = template("leaderElection.enabled=false", "replicas=2", check=False)
    assert proc.returncode != 0 and "needs leaderElection.enabled" in proc.stderr
    assert "or sharding.enabled" in proc.stderr


def test_the_release_namespace_as_the_install_namespace(template):
    docs = template("namespace.create=false", "namespace.name=", namespace="ops")
    assert not [d for d in docs if d["kind"] == "Namespace"]
    namespaced = [d for d in docs if d["kind"] not in (
        "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")]
    assert namespaced and {d["metadata"]["namespace"] for d in namespaced} == {"ops"}
    # a Namespace the chart would make where Helm keeps the release: refused, with the way out
    proc = template("namespace.name=", namespace="ops", check=False)
    assert proc.returncode != 0 and "namespace.create=false" in proc.stderr


@pytest.mark.parametrize("value, complaint", [
    ("replica=2", "replica"),                        # a misspelt value is not ignored
    ("replicas=two", "replicas"),
    ("metrics.secure=yes", "secure"),
    ("image.digest=latest", "digest"),
    ("logLevel=verbose", "logLevel"),
    ("sharding.enabled=yes", "enabled"),
    ("sharding.replicas=3", "replicas"),
])
def test_values_schema_refuses_what_would_not_work(template, value, complaint):
    proc = template(value, check=False)
    assert proc.returncode != 0 and complaint in proc.stderr, proc.stderr
