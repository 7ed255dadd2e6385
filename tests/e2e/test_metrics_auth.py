"""`--metrics-secure` on the real control plane: HTTPS, TokenReview and SubjectAccessReview.

Two operator processes run as the controller's ServiceAccount with the RBAC of
manifests/base/rbac.yaml (which lets it create TokenReviews and
SubjectAccessReviews), with a certificate from `--metrics-cert-dir`, and with
leader election, so that one of them is a standby: a standby must answer
scrapes too (its reviews go through a client without the leader write guard).

Scrapers are ServiceAccounts of the test's namespace: `scraper`, bound to the
shipped `my-controller-metrics-reader` ClusterRole, and `stranger`, bound to
nothing. No token is 401, a token the apiserver does not know is 401,
`stranger` is 403, `scraper` is 200 with Prometheus text.
"""

from __future__ import annotations

import shutil
import signal
import ssl

import pytest
from prometheus_client.parser import text_string_to_metric_families

from k8s_http.core.errors import NotFoundError
from k8s_http.core.objects import SERVICEACCOUNTS, Resource
from tests.e2e.operator_process import (SA, SYSTEM_NS, close_fleet_and_delete_lease, http_get,
                                        install_manifests, kubeconfig_token)
from tests.support.certs import test_pki
from tests.support.wait import eventually

CLUSTERROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings",
                               False, "ClusterRoleBinding")
READER_ROLE = "my-controller-metrics-reader"

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def scrapers(control_plane, api, namespace, tmp_path):
    """{"scraper": token, "stranger": token}; scraper may GET /metrics (ClusterRoleBinding)."""
    tokens = {}
    for name in ("scraper", "stranger"):
        api.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                     "metadata": {"name": name}}, namespace=namespace)
        path = control_plane.mint_service_account_kubeconfig(namespace, name,
                                                             tmp_path / f"{name}.kubeconfig")
        tokens[name] = kubeconfig_token(path)
    binding = f"{namespace}-metrics-reader"
    api.create(CLUSTERROLEBINDINGS, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding, "labels": {"e2e.my-controller/test": "1"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": READER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}]})
    try:
        yield tokens
    finally:
        try:
            api.delete(CLUSTERROLEBINDINGS, binding)
        except NotFoundError:
            pass


@pytest.fixture
def cert_dir(tmp_path):
    """tls.crt / tls.key as a mounted kubernetes.io/tls Secret would lay them out."""
    pki = test_pki()
    directory = tmp_path / "metrics-certs"
    directory.mkdir()
    shutil.copy(pki.server.cert, directory / "tls.crt")
    shutil.copy(pki.server.key, directory / "tls.key")
    return directory


def test_metrics_need_a_token_allowed_to_get_metrics(control_plane, api, namespace, fleet,
                                                     scrapers, cert_dir, tmp_path):
    install_manifests(control_plane)
    kubeconfig = control_plane.mint_service_account_kubeconfig(SYSTEM_NS, SA,
                                                               tmp_path / "sa.kubeconfig")
    # The scraper verifies the serving certificate against the CA that issued it.
    tls = ssl.create_default_context(cafile=test_pki().ca_cert)
    lease = f"e2e-metrics-{namespace[-5:]}"
    ops = [fleet.start(name, kubeconfig, "--namespace", namespace, "--metrics-secure",
                       "--metrics-cert-dir", str(cert_dir), "--leader-elect",
                       "--leader-election-namespace", SYSTEM_NS, "--leader-election-id", lease,
                       metrics_tls=tls, metrics_token=scrapers["scraper"])
           for name in ("a", "b")]
    try:
        for op in ops:
            op.wait_ready()       # the probes stay plain HTTP, for the kubelet
        eventually(lambda: sorted(op.is_leader() for op in ops) == [False, True], timeout=30,
                   interval=0.2, message="no single leader")

        for op in ops:                       # the leader and the standby alike
            status, body = op.scrape()
            assert status == 401, (op, status, body)
            assert op.scrape("not-a-token")[0] == 401
            status, body = op.scrape(scrapers["stranger"])
            assert status == 403, (op, status, body)
            assert f"system:serviceaccount:{namespace}:stranger" in body
            status, body = op.scrape(scrapers["scraper"])
            assert status == 200, (op, status, body)
            families = {f.name for f in text_string_to_metric_families(body)}
            assert {"leader_election_master_status", "rest_client_requests",
                    "controller_runtime_reconcile"} <= families, sorted(families)
            # HTTPS only: a plain-HTTP scrape gets no answer at all.
            assert http_get(op.metrics_port, "/metrics", timeout=3)[0] == 0

        for op in ops:
            # The reviews were allowed by the shipped RBAC, on the standby too.
            assert op.metric("rest_client_requests_total", code="403") == 0
            assert op.metric("rest_client_requests_total", method="POST", code="201") >= 2
            assert "authorization is unavailable" not in op.log()
            assert "metrics authorization failed" not in op.log()
        for op in ops:
            op.signal(signal.SIGTERM)
        for op in ops:
            op.expect_clean_exit(timeout=30)
    finally:
        close_fleet_and_delete_lease(fleet, api, lease)
