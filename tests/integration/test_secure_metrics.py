"""Secure metrics end to end: HTTPS ProbeServer -> MetricsAuthorizer -> ApiClient -> fake apiserver.

The fake apiserver plays the authenticator and the authorizer: TokenReviews
and SubjectAccessReviews are answered by a scripted action (the `apiserver`
fixture of tests/integration/conftest.py, tokens in tests/support/reviews.py).
"""

from __future__ import annotations

import http.client
import shutil
import ssl

import pytest
from prometheus_client import CollectorRegistry, Gauge

from k8s_http.ops.authn import MetricsAuthorizer, self_signed_cert, server_tls_context
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.ops.probes import HealthChecks, ProbeServer, ping
from tests.support.certs import test_pki

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def secure_server(apiserver):
    pki = test_pki()
    registry = CollectorRegistry()
    Gauge("demo_up", "Demo gauge", registry=registry).set(1)
    checks = HealthChecks()
    checks.add("ping", ping)
    client = ApiClient.from_config(ClusterConfig(server=apiserver.url))
    server = ProbeServer("127.0.0.1:0", registry=registry, healthz=checks, readyz=checks,
                         tls=server_tls_context(pki.server.cert, pki.server.key),
                         metrics_auth=MetricsAuthorizer(client).check)
    server.start()
    yield server
    server.stop()
    client.transport.close()


def https_get(port, path, token=None, *, cafile=None):
    context = ssl.create_default_context(cafile=cafile or test_pki().ca_cert)
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def test_authorized_scrape(secure_server, apiserver):
    status, _, body = https_get(secure_server.port, "/metrics", "prom-token")
    assert status == 200 and "demo_up 1.0" in body
    # A second scrape is answered from the caches.
    reviews = len(apiserver.requests)
    assert https_get(secure_server.port, "/metrics", "prom-token")[0] == 200
    assert len(apiserver.requests) == reviews


def test_no_token_is_401(secure_server, apiserver):
    status, headers, body = https_get(secure_server.port, "/metrics")
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert "demo_up" not in body
    assert apiserver.requests == []


def test_unknown_token_is_401_and_unauthorized_user_403(secure_server):
    assert https_get(secure_server.port, "/metrics", "forged")[0] == 401
    status, _, body = https_get(secure_server.port, "/metrics", "alice-token")
    assert status == 403 and "'alice' may not get /metrics" in body


def test_health_paths_need_no_token(secure_server):
    assert https_get(secure_server.port, "/healthz")[:1] == (200,)
    assert https_get(secure_server.port, "/readyz?verbose")[2].endswith("readyz check passed\n")


def test_plain_http_to_the_tls_port_is_refused_and_the_server_survives(secure_server):
    conn = http.client.HTTPConnection("127.0.0.1", secure_server.port, timeout=5)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        conn.request("GET", "/metrics")
        conn.getresponse().read()
    conn.close()
    assert https_get(secure_server.port, "/healthz")[0] == 200


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command")
def test_self_signed_certificate_for_development(tmp_path):
    cert, key = self_signed_cert(str(tmp_path), ("localhost", "127.0.0.1"))
    checks = HealthChecks()
    checks.add("ping", ping)
    server = ProbeServer("127.0.0.1:0", healthz=checks, tls=server_tls_context(cert, key))
    server.start()
    try:
        assert https_get(server.port, "/healthz", cafile=cert)[0] == 200
    finally:
        server.stop()
