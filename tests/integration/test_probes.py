"""ProbeServer over real sockets on 127.0.0.1:0: /metrics, /healthz, /readyz."""

import http.client
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from k8s_http.ops.probes import HealthChecks, ProbeServer, parse_bind_address, ping


class Check:
    """A switchable check."""

    def __init__(self, ok=True, detail="ok"):
        self.ok, self.detail = ok, detail

    def __call__(self):
        return self.ok, self.detail


def boom():
    raise RuntimeError("secret detail that must not be served")


@pytest.fixture
def registry():
    registry = CollectorRegistry()
    Counter("demo_requests_total", "Demo counter", ["code"], registry=registry).labels("200").inc(3)
    Gauge("demo_up", "Demo gauge", registry=registry).set(1)
    return registry


@pytest.fixture
def checks():
    informer, workers = Check(), Check()
    healthz, readyz = HealthChecks(), HealthChecks()
    healthz.add("ping", ping)
    healthz.add("workers-my", workers)
    readyz.add("informer-my", informer)
    readyz.add("informer-deployments.apps[app.kubernetes.io/managed-by=my]", Check())
    return healthz, readyz, informer, workers


@pytest.fixture
def server(registry, checks):
    healthz, readyz, _, _ = checks
    server = ProbeServer("127.0.0.1:0", registry=registry, healthz=healthz, readyz=readyz)
    server.start()
    yield server
    server.stop()


def request(server, path, *, method="GET", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read().decode()
    finally:
        conn.close()


def test_port_is_known_after_start(server):
    assert isinstance(server.port, int) and server.port > 0


def test_metrics_text_format(server):
    status, ctype, body = request(server, "/metrics")
    assert status == 200
    assert ctype.startswith("text/plain; version=0.0.4")
    assert 'demo_requests_total{code="200"} 3.0' in body
    assert "demo_up 1.0" in body
    assert "# EOF" not in body


def test_metrics_openmetrics_when_asked(server):
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, ctype, body = request(server, "/metrics", headers={"Accept": accept})
    assert status == 200
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert 'demo_requests_total{code="200"} 3.0' in body
    assert body.endswith("# EOF\n")


def test_metrics_name_filter(server):
    _, _, body = request(server, "/metrics?name[]=demo_up")
    assert "demo_up 1.0" in body and "demo_requests_total" not in body


def test_metrics_garbage_accept_header_falls_back_to_text(server):
    status, ctype, _ = request(server, "/metrics", headers={
        "Accept": "application/openmetrics-text; version=banana"})
    assert status == 200 and ctype


def test_healthy_is_terse_ok(server):
    for path in ("/healthz", "/readyz"):
        status, ctype, body = request(server, path)
        assert (status, body) == (200, "ok"), path
        assert ctype == "text/plain; charset=utf-8"


def test_verbose_lists_each_check(server):
    status, _, body = request(server, "/readyz?verbose")
    assert status == 200
    assert body == ("[+]informer-my ok\n"
                    "[+]informer-deployments.apps[app.kubernetes.io/managed-by=my] ok\n"
                    "readyz check passed\n")


def test_failing_readiness_is_503_and_always_verbose(server, checks):
    _, _, informer, _ = checks
    informer.ok, informer.detail = False, "initial list not finished"
    status, _, body = request(server, "/readyz")
    assert status == 503
    assert body.splitlines() == [
        "[-]informer-my failed: initial list not finished",
        "[+]informer-deployments.apps[app.kubernetes.io/managed-by=my] ok",
        "readyz check failed"]
    # Liveness is a separate set of checks: still fine.
    assert request(server, "/healthz")[0] == 200


def test_failing_liveness_is_500(server, checks):
    _, _, _, workers = checks
    workers.ok, workers.detail = False, "1 of 4 worker threads dead"
    status, _, body = request(server, "/healthz?verbose")
    assert status == 500
    assert body == ("[+]ping ok\n[-]workers-my failed: 1 of 4 worker threads dead\n"
                    "healthz check failed\n")


def test_recovery_is_seen_on_the_next_probe(server, checks):
    _, _, informer, _ = checks
    informer.ok = False
    assert request(server, "/readyz")[0] == 503
    informer.ok = True
    assert request(server, "/readyz")[0] == 200


def test_exclude_skips_a_check(server, checks):
    _, _, informer, _ = checks
    informer.ok = False
    status, _, body = request(server, "/readyz?exclude=informer-my")
    assert (status, body) == (200, "ok")


def test_single_check_path(server, checks):
    _, _, informer, _ = checks
    assert request(server, "/readyz/informer-my")[::2] == (200, "ok")
    informer.ok, informer.detail = False, "not synced"
    assert request(server, "/readyz/informer-my")[::2] == (503, "[-]informer-my failed: not synced\n")
    # Names with "/" work, escaped or not.
    name = "informer-deployments.apps[app.kubernetes.io/managed-by=my]"
    assert request(server, f"/readyz/{name}")[0] == 200
    assert request(server, "/readyz/" + name.replace("/", "%2F"))[0] == 200
    assert request(server, "/readyz/no-such-check")[0] == 404
    assert request(server, "/healthz/informer-my")[0] == 404   # a readyz check, not healthz


def test_a_raising_check_fails_with_its_type_only(registry):
    checks = HealthChecks()
    checks.add("ping", ping)
    checks.add("broken", boom)
    server = ProbeServer("127.0.0.1:0", registry=registry, healthz=checks, readyz=checks)
    server.start()
    try:
        status, _, body = request(server, "/healthz")
        assert status == 500
        assert "[-]broken failed: check raised RuntimeError" in body
        assert "secret detail" not in body
        assert request(server, "/readyz/broken")[0] == 503
        # The server survived.
        assert request(server, "/metrics")[0] == 200
    finally:
        server.stop()


def test_head_has_status_and_headers_but_no_body(server, checks):
    status, ctype, body = request(server, "/metrics", method="HEAD")
    assert status == 200 and ctype.startswith("text/plain") and body == ""
    _, _, informer, _ = checks
    informer.ok = False
    assert request(server, "/readyz", method="HEAD")[::2] == (503, "")


def test_unknown_path_and_method(server):
    assert request(server, "/")[0] == 404
    assert request(server, "/metricsx")[0] == 404
    assert request(server, "/metrics", method="POST")[0] == 405


def test_only_what_was_given_is_served(registry, checks):
    healthz, readyz, _, _ = checks
    metrics_only = ProbeServer("127.0.0.1:0", registry=registry)
    probes_only = ProbeServer("127.0.0.1:0", healthz=healthz, readyz=readyz)
    metrics_only.start()
    probes_only.start()
    try:
        assert request(metrics_only, "/metrics")[0] == 200
        assert request(metrics_only, "/healthz")[0] == 404
        assert request(probes_only, "/metrics")[0] == 404
        assert request(probes_only, "/readyz")[0] == 200
    finally:
        metrics_only.stop()
        probes_only.stop()


def test_checks_added_after_start_are_served(server, checks):
    healthz, _, _, _ = checks
    healthz.add("supervisor", Check(False, "dead"))
    status, _, body = request(server, "/healthz")
    assert status == 500 and "[-]supervisor failed: dead" in body


def test_bind_zero_disables():
    for address in ("0", ""):
        server = ProbeServer(address, registry=CollectorRegistry())
        assert not server.enabled
        server.start()                 # a no-op
        assert server.port is None
        server.stop()


def test_port_in_use_is_a_clear_error(server):
    other = ProbeServer(f"127.0.0.1:{server.port}")
    with pytest.raises(OSError, match=f"cannot listen on '127.0.0.1:{server.port}'"):
        other.start()


def test_stop_is_idempotent_and_closes_the_port(registry):
    server = ProbeServer("127.0.0.1:0", registry=registry)
    server.start()
    port = server.port
    server.stop()
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.mark.parametrize("text, parsed", [
    (":8080", ("", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9090", ("::1", 9090)),
    ("localhost:8081", ("localhost", 8081)), ("0", None), ("", None)])
def test_parse_bind_address(text, parsed):
    assert parse_bind_address(text) == parsed


@pytest.mark.parametrize("text", ["8080", "::1:8080", ":http", ":70000", "host:"])
def test_parse_bind_address_rejects(text):
    with pytest.raises(ValueError, match="bind address"):
        parse_bind_address(text)


def test_duplicate_check_names_are_refused():
    checks = HealthChecks()
    checks.add("a", ping)
    with pytest.raises(ValueError, match="already registered"):
        checks.add("a", ping)
    with pytest.raises(ValueError):
        checks.add("", ping)


@pytest.mark.parametrize("kwargs, expected", [({}, "k8s_http"),
                                              ({"server_name": "demo-operator"}, "demo-operator")])
def test_the_server_header_names_the_application(checks, kwargs, expected):
    healthz, _, _, _ = checks
    server = ProbeServer("127.0.0.1:0", healthz=healthz, **kwargs)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        resp.read()
        conn.close()
    finally:
        server.stop()
    assert resp.getheader("Server").split()[0] == expected
