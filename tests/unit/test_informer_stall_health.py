"""/healthz and a watch that stalls on every reconnect, on a fake clock.

A scripted client hands the informer's watcher one outcome per watch request
(a stream that goes silent for the stall timeout, a refused connection, a 5xx,
a 403, an event, ...) and the test reads the informer's health between them.
The rule (docs/SPEC.md §4 and "Faults"): three stall periods in a row
without an event, bookmark or list fail liveness; an apiserver that refuses
connections or answers 5xx/403 never does, however long it lasts.
"""

from __future__ import annotations

import pathlib
import queue
import re
import threading

import pytest
import yaml
from prometheus_client import CollectorRegistry

from k8s_http.core.backoff import Backoff
from k8s_http.core.errors import (ApiConnectionError, ApiTimeoutError, ForbiddenError, ServerError)
from k8s_http.cache.informer import Informer, own_key
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import DEPLOYMENTS
from k8s_http.cache.watchstep import STALLS_UNHEALTHY
from k8s_http.wire.defaults import WATCH_STALL_TIMEOUT_SECONDS
from k8s_http.wire.watchproto import WatchEvent
from tests.support.clock import FakeClock
from tests.support.fake_client import InMemoryApiClient, ScriptedWatchStream
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(60)

RESOURCE = str(DEPLOYMENTS)


def blocking_client():
    """Lists succeed at once (nothing stored); each watch() blocks until the test gives it
    an outcome on `client.outcomes`. `client.waiting` counts the watch() calls that asked."""
    client = InMemoryApiClient()
    client.outcomes = queue.Queue()
    client.waiting = 0
    lock = threading.Lock()

    def next_outcome(resource, **kwargs):
        with lock:
            client.waiting += 1
        outcome = client.outcomes.get()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    client.watches = next_outcome
    return client


@pytest.fixture
def fleet():
    clock = FakeClock()
    client = blocking_client()
    metrics = Metrics(CollectorRegistry())
    informer = Informer(client, DEPLOYMENTS, namespaces=None, metrics=metrics, clock=clock,
                        streaming_list=False,
                        backoff_factory=lambda: Backoff(initial_seconds=0.001, max_seconds=0.002,
                                                        clock=clock))
    informer.add_handler(own_key, queue.SimpleQueue())   # any object with .add would do
    informer.start()

    def give(*outcomes):
        """Hand the watcher each outcome in turn; return once it is back asking for the next."""
        for outcome in outcomes:
            asked = client.waiting
            client.outcomes.put(outcome)
            eventually(lambda: client.waiting == asked + 1, message="the watcher never came back")

    def health():
        return informer.is_healthy(now=clock())

    def gauge():
        return metrics.registry.get_sample_value("k8s_http_watch_stalls", {"resource": RESOURCE})

    eventually(lambda: client.waiting == 1 and informer.has_synced())
    try:
        yield clock, give, health, gauge
    finally:
        informer._stop.set()
        client.outcomes.put(ApiConnectionError("test over"))
        informer.stop()


def stalled(clock):
    """200 and headers, then nothing: the stream gives up after the stall timeout."""
    return ScriptedWatchStream([ApiTimeoutError("no complete event for 90s")], clock=clock,
                               silent_for=WATCH_STALL_TIMEOUT_SECONDS)


def dropped_after(clock, *events):
    return ScriptedWatchStream([*events, ApiConnectionError("reset")])


def test_three_stalls_in_a_row_fail_liveness_and_progress_clears_them(fleet):
    clock, give, health, gauge = fleet
    assert health() == (True, "ok") and gauge() == 0
    give(stalled(clock), stalled(clock))
    assert health()[0] and gauge() == 2          # two periods: still within the rule
    give(stalled(clock))
    ok, detail = health()
    assert not ok and "stalled 3 times in a row" in detail, detail
    assert gauge() == 3
    give(stalled(clock))
    assert not health()[0] and gauge() == 4
    # One event is progress: green again, the count starts over.
    obj = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7"}}
    give(dropped_after(clock, WatchEvent("ADDED", obj)))
    assert health() == (True, "ok") and gauge() == 0


def test_a_bookmark_is_progress(fleet):
    clock, give, health, gauge = fleet
    give(stalled(clock), stalled(clock), stalled(clock))
    assert not health()[0]
    give(dropped_after(clock, WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "9"}})))
    assert health()[0] and gauge() == 0


def test_refusals_and_errors_between_stalls_do_not_hide_them(fleet):
    clock, give, health, gauge = fleet
    refused = ApiConnectionError("cannot connect to apiserver: Connection refused")
    give(stalled(clock), stalled(clock), refused, ServerError(503, "unavailable"),
         ScriptedWatchStream(), refused)          # closed at once, no events
    assert health()[0] and gauge() == 2
    give(stalled(clock))
    assert not health()[0] and gauge() == 3


def test_an_apiserver_that_refuses_or_fails_never_fails_liveness(fleet):
    clock, give, health, gauge = fleet
    outcomes = [
        ApiConnectionError("cannot connect to apiserver: Connection refused"),
        ServerError(500, "etcdserver: leader changed"),
        ServerError(503, "unavailable"),
        ForbiddenError(403, 'deployments.apps is forbidden: cannot "watch"'),
        # No connection or no response headers in time: unreachable, not stalled.
        ApiTimeoutError("connecting to apiserver timed out after 30s"),
    ]
    for _ in range(10):
        for outcome in outcomes:
            clock.advance(WATCH_STALL_TIMEOUT_SECONDS)  # far longer than three stall periods in all
            give(outcome)
            assert health() == (True, "ok")
    assert gauge() == 0


def test_the_alert_fires_on_the_signal_healthz_fails_on():
    path = (pathlib.Path(__file__).parents[2]
            / "manifests/components/monitoring/alerts/prometheusrule.yaml")
    rule = yaml.safe_load(path.read_text())
    [alert] = [r for g in rule["spec"]["groups"] for r in g["rules"]
               if r.get("alert") == "MyControllerWatchStalled"]
    # Scoped or not (`... and on (job, namespace, instance) ...) >= 3`), the threshold is ours.
    found = re.search(r"k8s_http_watch_stalls\[\d+m\]\).*?\)\s*>=\s*(\d+)", alert["expr"], re.S)
    assert found and found.group(1) == str(STALLS_UNHEALTHY), alert["expr"]
