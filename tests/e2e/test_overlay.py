"""A platform team's install: an overlay of manifests/ into a namespace of its own.

The overlay is what the README's "Deploying" shows: `namespace:` and
`namePrefix:` over `manifests/overlays/secure-metrics` (so the secure-metrics
component is exercised too), plus the transformer that derives the one name a
move changes inside a string (the ServiceMonitor's TLS server name). It is rendered with `kubectl kustomize`
and applied with `kubectl apply -k`, as a user would. The operator then runs
as a local process (no kubelet here) with the rendered Deployment's args,
under a token of the overlay's own ServiceAccount, whose kubeconfig names the
overlay's namespace as a Pod's service-account files would. It must lead (the
Lease in the overlay's namespace, leader_election_master_status 1, read over
HTTPS by a scraper bound to the overlay's metrics-reader role), reconcile a
My, get no 403 anywhere, and stop cleanly.
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import uuid

import pytest
import yaml

from k8s_http.core.errors import NotFoundError
from k8s_http.core.objects import NAMESPACES, SERVICEACCOUNTS, Resource
from tests.e2e.operator_process import (MANIFESTS, delete_mys_and_wait, is_available,
                                        kubeconfig_token, kubectl, lease_spec, make_my)
from tests.support.certs import test_pki
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(240)

MY = Resource("mine.jp", "v1", "my", True, "My")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False,
                "CustomResourceDefinition")
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
# The Prometheus Operator's CRD, reduced to what an apiserver needs to store a
# ServiceMonitor: the overlay ships one, as kubebuilder's does.
SERVICEMONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com",
                 "labels": {"e2e.my-controller/test": "1"}},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList",
                       "plural": "servicemonitors", "singular": "servicemonitor"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {
                               "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def write_overlay(directory, namespace: str) -> None:
    base = os.path.relpath(MANIFESTS / "overlays" / "secure-metrics", directory)
    server_name = os.path.relpath(MANIFESTS / "transformers" / "metrics-server-name", directory)
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace, "namePrefix": f"{namespace}-", "resources": [base],
        "transformers": [server_name]}))


@pytest.fixture
def overlay(control_plane, api, tmp_path):
    """Render and apply the overlay; yield (namespace, rendered docs); remove what it made."""
    namespace = f"platform-ops-{uuid.uuid4().hex[:6]}"
    made_crd = False
    try:
        api.get(CRDS, SERVICEMONITOR_CRD["metadata"]["name"])
    except NotFoundError:
        api.create(CRDS, SERVICEMONITOR_CRD)
        made_crd = True
    kubectl(control_plane, "wait", "--for", "condition=established",
            "crd/servicemonitors.monitoring.coreos.com", "--timeout=60s")
    directory = tmp_path / "platform-ops"
    write_overlay(directory, namespace)
    rendered = kubectl(control_plane, "kustomize", str(directory)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    try:
        kubectl(control_plane, "apply", "-k", str(directory))
        kubectl(control_plane, "wait", "--for", "condition=established", "crd/my.mine.jp",
                "--timeout=60s")
        yield namespace, docs
    finally:
        # Not `kubectl delete -k`: that would delete the CRD every install shares.
        for doc in docs:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                kubectl(control_plane, "delete", doc["kind"].lower(), doc["metadata"]["name"],
                        "--ignore-not-found", check=False)
        try:
            api.delete(NAMESPACES, namespace)
        except NotFoundError:
            pass
        if made_crd:
            api.delete(CRDS, SERVICEMONITOR_CRD["metadata"]["name"])


def _one(docs, kind):
    (doc,) = [d for d in docs if d["kind"] == kind and "my-controller" in d["metadata"]["name"]
              and not d["metadata"]["name"].endswith(("metrics-reader", "metrics-auth"))]
    return doc


def test_an_overlay_in_another_namespace_leads_and_reconciles(control_plane, api, namespace,
                                                               fleet, overlay, tmp_path):
    ns, docs = overlay
    prefix = f"{ns}-"

    # -- what kustomize made of it
    for doc in docs:
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == ns
        elif doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == ns, doc["metadata"]
    for doc in docs:
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert doc["roleRef"]["name"].startswith(prefix)
            assert [(s["name"], s["namespace"]) for s in doc["subjects"]] == [
                (f"{prefix}my-controller", ns)], doc["metadata"]["name"]
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert not any("my-controller-system" in arg for arg in container["args"])
    assert "--metrics-secure" in container["args"]
    service_account = pod["serviceAccountName"]
    assert service_account == f"{prefix}my-controller"
    roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
    assert {f"{prefix}my-editor", f"{prefix}my-viewer", f"{prefix}my-controller-metrics-reader"} \
        <= roles

    # -- a scraper allowed by the overlay's metrics-reader role
    api.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "prometheus"}}, namespace=namespace)
    kubectl(control_plane, "create", "clusterrolebinding", f"{prefix}scraper",
            f"--clusterrole={prefix}my-controller-metrics-reader",
            f"--serviceaccount={namespace}:prometheus")
    try:
        scraper = kubeconfig_token(control_plane.mint_service_account_kubeconfig(
            namespace, "prometheus", tmp_path / "prometheus.kubeconfig"))

        # -- the operator, as the Pod would run it
        kubeconfig = control_plane.mint_service_account_kubeconfig(
            ns, service_account, tmp_path / "operator.kubeconfig")
        cert_dir = tmp_path / "metrics-certs"          # what the Secret volume would hold
        cert_dir.mkdir()
        shutil.copy(test_pki().server.cert, cert_dir / "tls.crt")
        shutil.copy(test_pki().server.key, cert_dir / "tls.key")
        args = [a for a in container["args"]
                if not a.startswith(("--metrics-bind-address", "--health-probe-bind-address",
                                     "--metrics-cert-dir"))]
        op = fleet.start("platform-ops", kubeconfig, *args, "--metrics-cert-dir", str(cert_dir),
                         "--namespace", namespace,
                         metrics_tls=ssl.create_default_context(cafile=test_pki().ca_cert),
                         metrics_token=scraper)
        op.wait_ready()
        eventually(lambda: lease_spec(api, ns, "my-controller").get("holderIdentity")
                   == op.identity, timeout=30, interval=0.2,
                   message=f"no Lease held in {ns}; log:\n{op.log()[-3000:]}")
        assert op.metric("leader_election_master_status", name="my-controller") == 1

        api.create(MY, make_my("web", namespace), namespace=namespace)
        eventually(lambda: is_available(api, "web", namespace), timeout=60, interval=0.2,
                   message=f"web never Available; log:\n{op.log()[-3000:]}")
        assert op.metric("controller_runtime_reconcile_total", controller="my",
                         result="success") >= 1
        # least privilege holds under the overlay's names: nothing refused
        assert op.metric("rest_client_requests_total", code="403") == 0

        mark = op.log_mark()
        op.signal(signal.SIGTERM)
        op.expect_clean_exit(timeout=30)
        loud = [r for r in op.log_records(mark) if r.get("level") not in ("debug", "info")]
        assert loud == [], loud
        assert lease_spec(api, ns, "my-controller").get("holderIdentity") == ""   # handed back
    finally:
        fleet.close()
        kubectl(control_plane, "delete", "clusterrolebinding", f"{prefix}scraper",
                "--ignore-not-found", check=False)
        delete_mys_and_wait(api, namespace)


def test_kubectl_renders_every_overlay(control_plane):
    """Every kustomization in manifests/ builds (components are built through an overlay)."""
    for path in sorted(MANIFESTS.rglob("kustomization.yaml")):
        if "components" in path.parts:
            continue
        proc = kubectl(control_plane, "kustomize", str(path.parent), check=False)
        assert proc.returncode == 0, f"{path}: {proc.stderr}"
        assert yaml.safe_load_all(proc.stdout)
    rendered = kubectl(control_plane, "kustomize", str(MANIFESTS)).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(rendered) if d]
    assert "My" not in kinds and "ServiceMonitor" not in kinds       # the default stays plain
