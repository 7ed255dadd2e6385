"""The soak's fault-injecting proxy does what it says, against the fake apiserver over TLS.

The soak's figures mean something only if each fault reaches the client as the
fault it is named after: checked here with the project's own client, through
the proxy (plain HTTP) to a TLS apiserver that wants a client certificate.
"""

from __future__ import annotations

import ssl
import time

import pytest

from k8s_http.core import errors
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import CONFIGMAPS
from k8s_http.wire.watchproto import ChunkedFramingError, WatchDecodeError
from tests.support.fake_apiserver import FakeApiServer
from tests.support.faultproxy import FaultProxy, scenario
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(60)
NS = "default"


@pytest.fixture
def server(pki):
    with FakeApiServer(pki=pki, client_cert_auth=True) as srv:
        yield srv


@pytest.fixture
def proxy(server, pki):
    ctx = ssl.create_default_context(cafile=pki.ca_cert)
    ctx.load_cert_chain(pki.client.cert, pki.client.key)
    with FaultProxy(server.url, ctx) as p:
        yield p


@pytest.fixture
def client(proxy):
    sleeps = []
    with ApiClient.from_config(ClusterConfig(server=proxy.url), metrics=Metrics(),
                               sleep=sleeps.append) as c:
        c.sleeps = sleeps
        yield c


def cm(name):
    return {"metadata": {"name": name, "namespace": NS}, "data": {"k": "v"}}


def open_watch(client, server, **kwargs):
    watch = client.watch(CONFIGMAPS, namespace=NS, resource_version=server.resource_version,
                         **kwargs)
    return watch, iter(watch)


def test_requests_and_watches_pass_through(server, proxy, client):
    client.create(CONFIGMAPS, cm("a"))
    assert client.get(CONFIGMAPS, "a", namespace=NS)["data"] == {"k": "v"}
    assert server.requests[-1].path.endswith("/configmaps/a")
    watch, events = open_watch(client, server)
    client.create(CONFIGMAPS, cm("b"))
    assert next(events).object["metadata"]["name"] == "b"
    watch.close()
    assert not proxy.injected


def test_429_with_retry_after_is_retried_and_without_it_is_an_error(proxy, client):
    proxy.arm("429_retry_after", 2)
    client.create(CONFIGMAPS, cm("a"))
    assert client.sleeps == [1.0, 1.0]
    proxy.arm("429")
    with pytest.raises(errors.TooManyRequestsError):
        client.get(CONFIGMAPS, "a", namespace=NS)
    proxy.arm("503")
    with pytest.raises(errors.ServerError):
        client.get(CONFIGMAPS, "a", namespace=NS)
    assert proxy.injected == {"429_retry_after": 2, "429": 1, "503": 1}


def test_a_lost_answer_is_a_lost_connection_but_the_write_was_done(server, proxy, client):
    proxy.arm("lost_answer")
    with pytest.raises(errors.ApiConnectionError):
        client.create(CONFIGMAPS, cm("a"))
    assert server.get_object(CONFIGMAPS.path(NS, "a")) is not None


@pytest.mark.parametrize("fault,error", [
    ("reset", errors.ApiConnectionError),
    ("gone_event", errors.GoneError),
    ("oversize", WatchDecodeError),
    ("not_json", WatchDecodeError),
    ("not_object", WatchDecodeError),
    ("bad_utf8", WatchDecodeError),
    ("nested", WatchDecodeError),
    ("bad_chunk", ChunkedFramingError),
    ("silent", errors.ApiTimeoutError),
])
def test_stream_faults_reach_the_client_as_what_they_are(server, proxy, client, fault, error):
    # The stall timeout bounds the whole 17 MiB line too: generous, on a loaded machine.
    watch, events = open_watch(client, server, stall_timeout_seconds=5.0)
    eventually(lambda: proxy.open_watches["configmaps"] == 1)
    proxy.arm(fault, resource="configmaps", silent_seconds=30)
    with pytest.raises(error):
        next(events)
    assert proxy.injected == {fault: 1}


def test_a_watch_request_can_be_answered_410(server, proxy, client):
    proxy.arm("gone_watch", resource="configmaps")
    with pytest.raises(errors.GoneError):
        client.watch(CONFIGMAPS, namespace=NS, resource_version="1")


def test_refused_connections_for_a_while(proxy, client):
    client.create(CONFIGMAPS, cm("a"))
    proxy.refuse(1.0)
    with pytest.raises(errors.ApiConnectionError):
        client.get(CONFIGMAPS, "a", namespace=NS)
    t0 = time.monotonic()
    eventually(lambda: _get_ok(client))
    assert time.monotonic() - t0 > 0.3     # it did refuse for a while, then came back


def _get_ok(client):
    try:
        return client.get(CONFIGMAPS, "a", namespace=NS)
    except errors.ApiConnectionError:
        return None


def test_the_scenario_names_only_known_faults(proxy):
    for what, apply in scenario(refuse_seconds=0.01):
        apply(proxy)
    assert proxy.pending() > 0 and proxy.injected["refuse"] == 1
