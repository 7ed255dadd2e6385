"""The Helm chart on a real apiserver: install, run, upgrade, uninstall.

`helm install --wait` puts the chart into a namespace it makes (namespace.name),
under a name prefix (namePrefix) so its cluster-scoped roles stand beside the
other tests' `kubectl apply -k manifests/`, and sees its Deployment Available
(kwok's Pods, admitted under the restricted Pod Security level the Namespace
enforces). kwok runs no image, so the operator is then run beside it with the
args of the Deployment Helm applied, under the chart's ServiceAccount,
watching the test's namespace: once from the image's root filesystem with the
ServiceAccount's files where a kubelet mounts them (as tests/e2e/test_image.py
runs it), once as a local process with a token kubeconfig. Each must lead (the
Lease in the chart's namespace), bring a My to Available, and stop cleanly.
`helm upgrade` changes the Deployment and the operator runs again with its new
args; `helm uninstall` removes what the chart made but the CRD (Helm never
deletes crds/), so the Mys survive it.
"""

from __future__ import annotations

import signal
import uuid

import pytest
import yaml

from k8s_http.core.errors import NotFoundError
from k8s_http.core.objects import DEPLOYMENTS, NAMESPACES, Resource
from tests.e2e.operator_process import (MY, free_port, http_get, is_available, kubectl,
                                        lease_spec, make_my, metric_sum)
from tests.e2e.test_image import image, service_account_files  # noqa: F401 (a fixture)
from tests.support.helm import CHART, HOW, find_helm, run_helm
from tests.support.image_runtime import PodSandbox
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(300)

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False,
                "CustomResourceDefinition")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", False, "ClusterRole")
# The operator beside the plane picks its own local ports.
LOCAL_FLAGS = ("--metrics-bind-address", "--health-probe-bind-address")


class Release:
    """One `helm install` of the chart, into a namespace and under a prefix of its own."""

    def __init__(self, helm: str, control_plane, release_namespace: str, tmp_path):
        suffix = uuid.uuid4().hex[:6]
        self.helm, self.home = helm, tmp_path / "helm-home"
        self.name, self.namespace, self.prefix = f"mc-{suffix}", f"helm-{suffix}", \
            f"helm-{suffix}-"
        self.common = ["--namespace", release_namespace,
                       "--kubeconfig", str(control_plane.admin_kubeconfig)]
        self.values = ["--set", f"namespace.name={self.namespace}",
                       "--set", f"namePrefix={self.prefix}"]
        self.installed = False

    def helm_run(self, *args: str, check: bool = True):
        return run_helm(self.helm, self.home, *args, *self.common, check=check)

    def install(self, *values: str) -> None:
        # --wait: Helm itself sees the Deployment Available.
        self.helm_run("install", self.name, str(CHART), *self.values, *values,
                      "--wait", "--timeout", "120s")
        self.installed = True

    def upgrade(self, *values: str) -> None:
        self.helm_run("upgrade", self.name, str(CHART), *self.values, *values,
                      "--wait", "--timeout", "120s")

    def uninstall(self) -> None:
        self.helm_run("uninstall", self.name)
        self.installed = False

    def operator(self) -> tuple[str, list[str]]:
        """(ServiceAccount, args) of the Deployment Helm applied, without the local flags."""
        manifest = self.helm_run("get", "manifest", self.name).stdout
        (deployment,) = [d for d in yaml.safe_load_all(manifest)
                         if d and d["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        return pod["serviceAccountName"], [a for a in container["args"]
                                           if not a.startswith(LOCAL_FLAGS)]


@pytest.fixture
def release(control_plane, api, namespace, tmp_path):
    helm = find_helm()
    if helm is None:
        pytest.fail(f"helm not found: {HOW}", pytrace=False)
    rel = Release(helm, control_plane, namespace, tmp_path)
    try:
        yield rel
    finally:
        if rel.installed:
            rel.helm_run("uninstall", rel.name, check=False)
        try:
            api.delete(NAMESPACES, rel.namespace)
        except NotFoundError:
            pass


def _installed(control_plane, api, release: Release) -> None:
    kubectl(control_plane, "wait", "--for", "condition=established", "crd/my.mine.jp",
            "--timeout=60s")
    ns = api.get(NAMESPACES, release.namespace)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deployment = api.get(DEPLOYMENTS, f"{release.prefix}my-controller",
                         namespace=release.namespace)
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    service_account, args = release.operator()
    assert service_account == f"{release.prefix}my-controller" and "--leader-elect" in args


def _converges(api, release: Release, op, name: str, watched: str, holder: str) -> None:
    eventually(lambda: lease_spec(api, release.namespace, "my-controller").get(
        "holderIdentity", "").startswith(holder), timeout=30, interval=0.2,
        message=f"no Lease held in {release.namespace}; log:\n{op.log()[-3000:]}")
    api.create(MY, make_my(name, watched), namespace=watched)
    eventually(lambda: is_available(api, name, watched), timeout=60, interval=0.2,
               message=f"{name} never Available; log:\n{op.log()[-3000:]}")


def _run_local(fleet, control_plane, api, release: Release, name: str, watched: str,
               tmp_path):
    """The operator as a local process with a token of the chart's ServiceAccount."""
    service_account, args = release.operator()
    kubeconfig = control_plane.mint_service_account_kubeconfig(
        release.namespace, service_account, tmp_path / f"{name}.kubeconfig")
    op = fleet.start(name, kubeconfig, *args, "--namespace", watched)
    op.wait_ready()
    _converges(api, release, op, name, watched, op.identity)
    assert op.metric("rest_client_requests_total", code="403") == 0
    op.signal(signal.SIGTERM)
    op.expect_clean_exit(timeout=30)
    return op


def test_helm_install_runs_the_image_under_the_charts_service_account(
        control_plane, api, namespace, image, release, tmp_path):  # noqa: F811
    release.install()
    _installed(control_plane, api, release)
    service_account, args = release.operator()
    sa_dir, _ = service_account_files(control_plane, tmp_path, release.namespace,
                                      service_account)
    metrics_port, probe_port = free_port(), free_port()
    host, _, port = control_plane.server.removeprefix("https://").rpartition(":")
    pod_name = f"{release.prefix}my-controller-0"
    pod = PodSandbox(image, sa_dir, tmp_path / "pod.log", name=pod_name)
    pod.start([*args, f"--metrics-bind-address=127.0.0.1:{metrics_port}",
               f"--health-probe-bind-address=127.0.0.1:{probe_port}", "--namespace", namespace],
              env={"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port})
    try:
        eventually(lambda: http_get(probe_port, "/readyz", timeout=2)[0] == 200, timeout=60,
                   interval=0.2, message=f"never ready; output:\n{pod.log()[-4000:]}")
        _converges(api, release, pod, "from-chart", namespace, pod_name)
        status, text = http_get(metrics_port, "/metrics")
        assert status == 200 and metric_sum(text, "rest_client_requests_total",
                                            code="403") == 0
        pod.signal(signal.SIGTERM)
        code = pod.wait(timeout=35)
        assert code == 0, f"exit {code} on SIGTERM; output:\n{pod.log()[-4000:]}"
    finally:
        pod.kill()


def test_helm_install_upgrade_and_uninstall(control_plane, api, namespace, fleet, release,
                                            tmp_path):
    release.install()
    _installed(control_plane, api, release)
    _run_local(fleet, control_plane, api, release, "web", namespace, tmp_path)

    # -- upgrade: new values reach the Deployment, and the binary takes its new args
    release.upgrade("--set", "replicas=2", "--set", "logLevel=debug", "--set", "workers=2")
    deployment = api.get(DEPLOYMENTS, f"{release.prefix}my-controller",
                         namespace=release.namespace)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["status"].get("readyReplicas") == 2, deployment["status"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"--log-level=debug", "--workers=2"} <= set(container["args"])
    status = yaml.safe_load(release.helm_run("status", release.name, "--output", "yaml").stdout)
    assert status["version"] == 2 and status["info"]["status"] == "deployed"
    op = _run_local(fleet, control_plane, api, release, "api", namespace, tmp_path)
    assert any(r.get("level") == "debug" for r in op.log_records())

    # -- uninstall: the chart's objects go, the CRD (and so the Mys) stay
    release.uninstall()
    for role in ("my-controller", "my-editor", "my-viewer", "my-controller-metrics-reader"):
        with pytest.raises(NotFoundError):
            api.get(CLUSTER_ROLES, release.prefix + role)
    eventually(lambda: _gone_or_terminating(api, release.namespace), timeout=30, interval=0.2,
               message=f"namespace {release.namespace} not deleted by helm uninstall")
    assert api.get(CRDS, "my.mine.jp")["metadata"]["name"] == "my.mine.jp"
    assert is_available(api, "web", namespace) and is_available(api, "api", namespace)
    assert release.helm_run("list", "--short").stdout.strip() == ""


def test_helm_sharded_install_shares_the_work_under_the_charts_service_account(
        control_plane, api, namespace, fleet, release, tmp_path):
    """sharding.enabled with 2 replicas: each runs (locally, under the chart's
    ServiceAccount, POD_NAME its Pod's name) with the member Lease and the
    ring's list and watch its Role allows; together they hold every slot, each
    caches both member Leases, a My converges, nothing is refused."""
    release.install("--set", "sharding.enabled=true", "--set", "replicas=2")
    deployment = api.get(DEPLOYMENTS, f"{release.prefix}my-controller",
                         namespace=release.namespace)
    assert deployment["status"].get("readyReplicas") == 2, deployment["status"]
    service_account, args = release.operator()
    assert "--shards=auto" in args and "--leader-elect" not in args
    kubeconfig = control_plane.mint_service_account_kubeconfig(
        release.namespace, service_account, tmp_path / "sharded.kubeconfig")
    ops = [fleet.start(f"member-{i}", kubeconfig, *args, "--namespace", namespace,
                       env={"POD_NAME": f"{release.prefix}my-controller-{i}"})
           for i in range(2)]
    for op in ops:
        op.wait_ready()
    eventually(lambda: sum(op.metric("k8s_http_shard_slots_held") for op in ops) == 256
               and all(op.metric("k8s_http_shard_slots_held") for op in ops), timeout=30,
               interval=0.2, message="the two replicas do not share the slots")
    for i, op in enumerate(ops):
        # Its member Lease, named after its Pod, held by it; the ring watched.
        member = f"my-controller-member-{release.prefix}my-controller-{i}"
        assert lease_spec(api, release.namespace, member)["holderIdentity"] == op.identity
        assert op.metric("k8s_http_cache_objects", resource="leases.coordination.k8s.io") == 2
    api.create(MY, make_my("sharded", namespace), namespace=namespace)
    eventually(lambda: is_available(api, "sharded", namespace), timeout=60, interval=0.2,
               message="sharded never Available")
    for op in ops:
        assert op.metric("rest_client_requests_total", code="403") == 0
        op.signal(signal.SIGTERM)
    for op in ops:
        op.expect_clean_exit(timeout=30)


def _gone_or_terminating(api, name: str) -> bool:
    try:
        return bool(api.get(NAMESPACES, name)["metadata"].get("deletionTimestamp"))
    except NotFoundError:
        return True
