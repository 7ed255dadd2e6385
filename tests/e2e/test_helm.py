"""The Helm chart on a real apiserver: install, run, upgrade, uninstall.

`helm install --wait` puts the chart into a namespace it makes (namespace.name),
under a name prefix (namePrefix) so its cluster-scoped roles stand beside the
other tests' `kubectl apply -k manifests/`, and sees its Deployment Available
(kwok's Pods, admitted under the restricted Pod Security level the Namespace
enforces). The operator then runs as a local process (kwok runs no image) with
the args of the Deployment Helm applied, under a token of the chart's
ServiceAccount, watching the test's namespace: it must lead (the Lease in the
chart's namespace), bring a My to Available, and get no 403. `helm upgrade`
changes the Deployment and the operator runs again with its new args; `helm
uninstall` removes what the chart made but the CRD (Helm never deletes
crds/), so the My survives it.
"""

from __future__ import annotations

import signal
import uuid

import pytest
import yaml

from k8s_http.errors import NotFoundError
from k8s_http.objects import DEPLOYMENTS, NAMESPACES, Resource
from tests.e2e.operator_process import MY, is_available, kubectl, lease_spec, make_my
from tests.support.helm import CHART, HOW, find_helm, run_helm
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(300)

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False,
                "CustomResourceDefinition")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", False, "ClusterRole")
# The operator process picks its own local ports.
LOCAL_FLAGS = ("--metrics-bind-address", "--health-probe-bind-address")


def _operator_args(manifest: str) -> tuple[str, list[str]]:
    """(ServiceAccount, args) of the Deployment in `helm get manifest` output."""
    (deployment,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod["serviceAccountName"], [a for a in container["args"]
                                       if not a.startswith(LOCAL_FLAGS)]


def _run_operator(fleet, control_plane, api, name, install_ns, manifest, watched, tmp_path):
    """Run the operator as the chart's Deployment would; bring My `name` to Available."""
    service_account, args = _operator_args(manifest)
    kubeconfig = control_plane.mint_service_account_kubeconfig(
        install_ns, service_account, tmp_path / f"{name}.kubeconfig")
    op = fleet.start(name, kubeconfig, *args, "--namespace", watched)
    op.wait_ready()
    eventually(lambda: lease_spec(api, install_ns, "my-controller").get("holderIdentity")
               == op.identity, timeout=30, interval=0.2,
               message=f"no Lease held in {install_ns}; log:\n{op.log()[-3000:]}")
    api.create(MY, make_my(name, watched), namespace=watched)
    eventually(lambda: is_available(api, name, watched), timeout=60, interval=0.2,
               message=f"{name} never Available; log:\n{op.log()[-3000:]}")
    assert op.metric("rest_client_requests_total", code="403") == 0
    op.signal(signal.SIGTERM)
    op.expect_clean_exit(timeout=30)
    return op


def test_helm_install_runs_upgrades_and_uninstalls(control_plane, api, namespace, fleet,
                                                    tmp_path):
    helm = find_helm()
    if helm is None:
        pytest.fail(f"helm not found: {HOW}", pytrace=False)
    suffix = uuid.uuid4().hex[:6]
    install_ns, prefix, release = f"helm-{suffix}", f"helm-{suffix}-", f"mc-{suffix}"
    home = tmp_path / "helm-home"
    common = ["--namespace", namespace, "--kubeconfig", str(control_plane.admin_kubeconfig)]
    values = ["--set", f"namespace.name={install_ns}", "--set", f"namePrefix={prefix}"]
    installed = False
    try:
        # --wait: Helm itself sees the Deployment Available. Its Pod (kwok's, on a fake
        # Node) is admitted by the restricted Pod Security level the chart's Namespace enforces.
        run_helm(helm, home, "install", release, str(CHART), *common, *values,
                 "--wait", "--timeout", "120s")
        installed = True
        deployment = api.get(DEPLOYMENTS, f"{prefix}my-controller", namespace=install_ns)
        assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
        kubectl(control_plane, "wait", "--for", "condition=established", "crd/my.mine.jp",
                "--timeout=60s")
        ns = api.get(NAMESPACES, install_ns)
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        manifest = run_helm(helm, home, "get", "manifest", release, *common).stdout
        service_account, args = _operator_args(manifest)
        assert service_account == f"{prefix}my-controller" and "--leader-elect" in args

        _run_operator(fleet, control_plane, api, "web", install_ns, manifest, namespace,
                      tmp_path)

        # -- upgrade: new values reach the Deployment, and the binary takes its new args
        run_helm(helm, home, "upgrade", release, str(CHART), *common, *values,
                 "--set", "replicas=2", "--set", "logLevel=debug", "--set", "workers=2",
                 "--wait", "--timeout", "120s")
        deployment = api.get(DEPLOYMENTS, f"{prefix}my-controller", namespace=install_ns)
        assert deployment["spec"]["replicas"] == 2
        assert deployment["status"].get("readyReplicas") == 2, deployment["status"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {"--log-level=debug", "--workers=2"} <= set(container["args"])
        status = yaml.safe_load(run_helm(helm, home, "status", release, *common,
                                         "--output", "yaml").stdout)
        assert status["version"] == 2 and status["info"]["status"] == "deployed"
        manifest = run_helm(helm, home, "get", "manifest", release, *common).stdout
        op = _run_operator(fleet, control_plane, api, "api", install_ns, manifest, namespace,
                           tmp_path)
        assert any(r.get("level") == "debug" for r in op.log_records())

        # -- uninstall: the chart's objects go, the CRD (and so the Mys) stay
        run_helm(helm, home, "uninstall", release, *common)
        installed = False
        for role in ("my-controller", "my-editor", "my-viewer", "my-controller-metrics-reader"):
            with pytest.raises(NotFoundError):
                api.get(CLUSTER_ROLES, prefix + role)
        eventually(lambda: _gone_or_terminating(api, install_ns), timeout=30, interval=0.2,
                   message=f"namespace {install_ns} not deleted by helm uninstall")
        assert api.get(CRDS, "my.mine.jp")["metadata"]["name"] == "my.mine.jp"
        assert is_available(api, "web", namespace)
        assert run_helm(helm, home, "list", *common, "--short").stdout.strip() == ""
    finally:
        fleet.close()
        if installed:
            run_helm(helm, home, "uninstall", release, *common, check=False)
        try:
            api.delete(NAMESPACES, install_ns)
        except NotFoundError:
            pass


def _gone_or_terminating(api, name: str) -> bool:
    try:
        return bool(api.get(NAMESPACES, name)["metadata"].get("deletionTimestamp"))
    except NotFoundError:
        return True
