"""/healthz over HTTP against the fake apiserver when a watch stalls on every reconnect.

Real sockets and the real client: the apiserver answers each watch with 200
and chunked headers, then nothing. The stall timeout is shortened to 0.3 s so
three stall periods pass quickly; the rule is the same as at 90 s. The other
side: an apiserver that refuses connections, or answers every watch with 5xx
or 403, for far more than three stall periods, leaves /healthz green.
"""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from k8s_http.core.backoff import Backoff
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.cache.informer import Informer, own_key
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import DEPLOYMENTS
from k8s_http.ops.probes import HealthChecks, ProbeServer
from tests.support.fake_apiserver import (FakeApiServer, http_head, raw, sequence, stall,
                                          status)
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(60)

NS = "default"
RESOURCE = str(DEPLOYMENTS)
STALL_SECONDS = 0.3


def is_watch(req):
    return req.method == "GET" and req.query.get("watch") in ("1", "true")


def is_plain_watch(req):
    """A watch that is not a streaming list: what follows the initial sync."""
    return is_watch(req) and req.query.get("sendInitialEvents") != "true"


class _Keys:
    def add(self, key):
        pass


@contextlib.contextmanager
def probed_informer(server):
    """An informer on `server` whose health is served on /healthz, as the Manager wires it."""
    metrics = Metrics(CollectorRegistry())
    client = ApiClient.from_config(ClusterConfig(server=server.url))
    informer = Informer(client, DEPLOYMENTS, namespaces=[NS], metrics=metrics,
                        stall_timeout_seconds=STALL_SECONDS,
                        backoff_factory=lambda: Backoff(initial_seconds=0.05, max_seconds=0.2))
    informer.add_handler(own_key, _Keys())
    checks = HealthChecks()
    checks.add(f"informer-{RESOURCE}", informer.is_healthy)
    probes = ProbeServer("127.0.0.1:0", registry=metrics.registry, healthz=checks)
    probes.start()
    informer.start()
    try:
        eventually(informer.has_synced, message="informer never synced")
        yield informer, metrics, lambda path: _get(probes.port, path)
    finally:
        informer.stop()
        probes.stop()
        client.transport.close()


def _get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:       # 500 is an answer here, not a failure
        return err.code, err.read().decode()


def restarts(metrics, reason):
    return metrics.registry.get_sample_value(
        "k8s_http_watch_restarts_total", {"resource": RESOURCE, "reason": reason}) or 0


def test_headers_then_silence_on_every_reconnect_turns_healthz_red():
    with FakeApiServer() as server:
        silent = server.script(sequence(raw(http_head(200, chunked=True), close_after=False),
                                        stall(None)), match=is_plain_watch, times=None)
        with probed_informer(server) as (informer, metrics, get):
            eventually(lambda: silent.hits >= 1)
            eventually(lambda: get("/healthz")[0] == 500, message="/healthz never turned red")
            status_code, body = get("/healthz")
            assert status_code == 500
            assert f"[-]informer-{RESOURCE} failed" in body and "stalled 3 times in a row" in body
            assert restarts(metrics, "stall") >= 3
            assert metrics.registry.get_sample_value(
                "k8s_http_watch_stalls", {"resource": RESOURCE}) >= 3
            # The apiserver recovers: the next watch gets an event, and liveness is green again.
            server.clear_scripts()
            server.create_object(DEPLOYMENTS.path(NS), {"metadata": {"name": "a"}})
            eventually(lambda: get("/healthz")[0] == 200, message="/healthz never recovered")
            assert informer.watchers[0].stalls == 0


@pytest.mark.parametrize("fault", ["refused", "500", "503", "403"])
def test_an_apiserver_that_refuses_or_fails_keeps_healthz_green(fault):
    server = FakeApiServer().start()
    try:
        with probed_informer(server) as (informer, metrics, get):
            if fault == "refused":
                server.stop()       # the port is closed: every reconnect is refused
                reason = "disconnect"
            else:
                code = int(fault)
                server.script(status(code, "Forbidden" if code == 403 else "ServiceUnavailable",
                                     "no"), match=is_watch, times=None)
                server.drop_watches()
                reason = "error"
            # Twelve failed reconnects, 0.05-0.2 s apart: well over three stall periods.
            eventually(lambda: restarts(metrics, reason) >= 12, timeout=30)
            assert get("/healthz") == (200, "ok")
            assert restarts(metrics, "stall") == 0 and informer.watchers[0].stalls == 0
    finally:
        server.stop()
