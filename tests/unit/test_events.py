"""EventRecorder: core/v1 Events, rate-limited and de-duplicated per object."""

import threading

from k8s_http import EVENTS, EventRecorder
from tests.support.clock import FakeClock
from tests.support.fake_client import InMemoryApiClient


def events_client():
    """The one ApiClient call the recorder makes: create an Event (anything else fails)."""
    return InMemoryApiClient(creatable={EVENTS})


def make_my(name="foobar"):
    return {"apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"name": name, "namespace": "default", "uid": "u-" + name,
                         "resourceVersion": "7"}}


def test_events_are_rate_limited_per_object():
    client, clock = events_client(), FakeClock(0.0)
    rec = EventRecorder(client, component="my-controller", instance="t", clock=clock)
    my = make_my()
    sent = [rec.event(my, "Warning", "ReconcileError", f"attempt {i}") for i in range(8)]
    assert sent == [True] * 5 + [False] * 3          # burst of 5
    other = make_my(name="other")
    assert rec.event(other, "Warning", "ReconcileError", "x")   # buckets are per object
    clock.now += 30
    assert rec.event(my, "Warning", "ReconcileError", "attempt 9")      # one token per 30 s
    assert not rec.event(my, "Warning", "ReconcileError", "attempt 10")
    assert len(client.events) == 7


def test_identical_events_are_deduplicated_for_five_minutes():
    client, clock = events_client(), FakeClock(0.0)
    rec = EventRecorder(client, component="my-controller", instance="t", clock=clock)
    my = make_my()
    assert rec.event(my, "Warning", "Conflict", "same")
    clock.now += 299
    assert not rec.event(my, "Warning", "Conflict", "same")
    assert rec.event(my, "Warning", "Conflict", "different")
    clock.now += 2
    assert rec.event(my, "Warning", "Conflict", "same")


def test_event_failures_never_raise():
    broken = events_client()
    broken.fail = RuntimeError("apiserver down")
    rec = EventRecorder(broken, component="my-controller", instance="t")
    assert rec.event(make_my(), "Normal", "Created", "x") is False


def test_event_shape_and_long_messages():
    client = events_client()
    rec = EventRecorder(client, component="my-controller", instance="pod-1", wall_time=lambda: "2026-01-01T00:00:00Z",
                        time_ns=lambda: 255)
    rec.event(make_my(), "Warning", "ReconcileError", "x" * 5000)
    (event,) = client.events
    assert event["metadata"]["name"] == "foobar.ff"
    assert len(event["message"]) == 1024
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-01-01T00:00:00Z"
    assert event["reportingInstance"] == "pod-1" and event["type"] == "Warning"


def test_involved_object_names_the_object():
    client = events_client()
    EventRecorder(client, component="c").event(make_my(), "Normal", "Created", "m")
    (event,) = client.events
    assert event["involvedObject"] == {"apiVersion": "mine.jp/v1", "kind": "My", "name": "foobar",
                                       "namespace": "default", "uid": "u-foobar",
                                       "resourceVersion": "7"}
    assert event["source"] == {"component": "c"} and event["reportingComponent"] == "c"


class BlockingClient(InMemoryApiClient):
    """Holds every create until `release` is set, so a test sees what waits."""

    def __init__(self):
        super().__init__(creatable={EVENTS})
        self.release = threading.Event()
        self.entered = threading.Event()

    def create(self, resource, obj, *, namespace=None, **kw):
        self.entered.set()
        self.release.wait(5)
        return super().create(resource, obj, namespace=namespace, **kw)


def test_asynchronous_events_do_not_wait_for_the_apiserver():
    client = BlockingClient()
    rec = EventRecorder(client, component="c", instance="t", asynchronous=True)
    try:
        assert rec.event(make_my(), "Normal", "Created", "m")      # returns while create blocks
        assert client.entered.wait(5)
        assert client.events == [] and rec.sent == 0
        client.release.set()
        assert rec.flush(5)
        assert [e["reason"] for e in client.events] == ["Created"] and rec.sent == 1
    finally:
        client.release.set()
        rec.close()
    assert rec._sender is not None and not rec._sender.is_alive()


def test_asynchronous_outbox_is_bounded_and_never_blocks():
    client = BlockingClient()
    rec = EventRecorder(client, component="c", instance="t", asynchronous=True)
    rec.OUTBOX_LIMIT = 3
    try:
        sent = [rec.event(make_my(f"o{i}"), "Normal", "Created", "m") for i in range(6)]
        assert client.entered.wait(5)
        # one taken by the sender (blocked), three queued, the rest dropped
        assert sent.count(True) in (3, 4) and rec.dropped == sent.count(False)
        client.release.set()
        assert rec.flush(5)
        assert len(client.events) == sent.count(True)
    finally:
        client.release.set()
        rec.close()


def test_close_sends_what_is_queued_then_drops_later_events():
    client = events_client()
    rec = EventRecorder(client, component="c", instance="t", asynchronous=True)
    for i in range(5):
        rec.event(make_my(f"o{i}"), "Normal", "Created", "m")
    rec.close(timeout_seconds=5)
    assert len(client.events) == 5
    assert rec.event(make_my("late"), "Normal", "Created", "m") is False
    assert len(client.events) == 5


def test_close_gives_up_after_its_timeout():
    client = BlockingClient()
    rec = EventRecorder(client, component="c", instance="t", asynchronous=True)
    rec.event(make_my("a"), "Normal", "Created", "m")
    rec.event(make_my("b"), "Normal", "Created", "m")
    assert client.entered.wait(5)
    rec.close(timeout_seconds=0.05)                # "a" is stuck in create: "b" is dropped
    assert rec.dropped == 1
    client.release.set()


def test_idle_state_is_forgotten_but_not_walked_at_every_event(monkeypatch):
    # Above PRUNE_ABOVE objects the per-object state is pruned, but a prune that
    # keeps everything (all Events recent: a burst) must not be repeated at the
    # next Event, or each Event walks every object.
    monkeypatch.setattr(EventRecorder, "PRUNE_ABOVE", 10)
    client, clock = events_client(), FakeClock(0.0)
    rec = EventRecorder(client, component="my-controller", instance="t", clock=clock)
    walks = []
    real_prune = EventRecorder._prune
    monkeypatch.setattr(EventRecorder, "_prune",
                        lambda self, now: (walks.append(len(self._state)), real_prune(self, now)))
    for i in range(30):
        assert rec.event(make_my(f"a{i}"), "Normal", "Created", "x")
    # Pruned when the state passed 10 (all kept), then not before it passed 22.
    assert walks == [11, 23]
    assert len(rec._state) == 30
    # Once idle past the de-duplication window, the next growth forgets them.
    clock.now += EventRecorder.DEDUPE_SECONDS + EventRecorder.BURST * EventRecorder.REFILL_SECONDS
    for i in range(20):
        rec.event(make_my(f"b{i}"), "Normal", "Created", "x")
    assert walks == [11, 23, 47]
    assert {key.name for key in rec._state} == {f"b{i}" for i in range(20)}


def test_an_event_refused_because_its_namespace_is_going_is_dropped_quietly(caplog):
    """The apiserver refuses every create in a namespace being deleted (403 with the
    cause NamespaceTerminating): the Event is futile, not a fault worth a warning,
    and it is said in the same words as the children the reconciler gives up on."""
    from k8s_http.core.errors import from_status
    refused = events_client()
    refused.fail = from_status(403, {
        "kind": "Status", "code": 403, "reason": "Forbidden",
        "message": 'events "foobar.1" is forbidden: unable to create new content in '
                   'namespace default because it is being terminated',
        "details": {"name": "foobar.1", "kind": "events",
                    "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                                "message": "namespace default is being terminated"}]}})
    rec = EventRecorder(refused, component="my-controller", instance="t")
    with caplog.at_level("DEBUG", logger="k8s_http"):
        assert rec.event(make_my(), "Normal", "Created", "x") is False
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert any("namespace default is being deleted" in r.getMessage() for r in caplog.records)
