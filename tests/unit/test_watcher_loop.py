"""The Watcher loop against a scripted in-memory client: no sockets, no sleeps.

The stop signal is a fake whose wait() records the backoff and returns at once;
the client stops the loop when its script runs out.
"""

from prometheus_client import CollectorRegistry

from k8s_http.core.errors import (ApiConnectionError, ForbiddenError, GoneError, InvalidError,
                                  ProtocolError)
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import DEPLOYMENTS
from k8s_http.cache.store import StoreList
from k8s_http.cache.watcher import Watcher
from k8s_http.cache.watchstep import Watching
from k8s_http.wire.watchproto import WatchEvent
from tests.support.clock import FakeStopEvent
from tests.support.fake_client import InMemoryApiClient, ScriptedWatchStream


def obj(name, rv):
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def listing(rv, *names):
    return {"metadata": {"resourceVersion": rv}, "items": [obj(n, rv) for n in names]}


def scripted_client(stop, script):
    """`script` is a list of ("list", result-or-exception) / ("watch", [events]-or-exception);
    the loop is stopped when it runs out."""
    client = InMemoryApiClient()
    client.play(script, then=stop.set)
    return client


def run(script, *, on_event=None, on_sync=None, streaming_list=False):
    stop = FakeStopEvent()
    client = scripted_client(stop, script)
    events, syncs = [], []
    metrics = Metrics(CollectorRegistry())

    def default_sync(items):
        syncs.append([o["metadata"]["name"] for o in items])
        return []

    w = Watcher(client, DEPLOYMENTS, namespace="ns",
                on_sync=on_sync or default_sync,
                on_event=on_event or (lambda t, o: events.append((t, o["metadata"]["name"]))),
                metrics=metrics, rng=lambda: 0.5, streaming_list=streaming_list)
    w.run(stop)
    return w, client, events, syncs, stop, metrics


def calls(client):
    return [(call[0], call.kwargs.get("resource_version")) for call in client.calls]


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels) or 0


def test_list_then_watch_from_its_rv_with_bookmarks_and_a_random_timeout():
    w, client, events, syncs, _, metrics = run([
        ("list", listing("10", "a", "b")),
        ("watch", [WatchEvent("ADDED", obj("c", "11")),
                   WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "15"}}),
                   WatchEvent("MODIFIED", obj("a", "16"))]),
    ])
    assert syncs == [["a", "b"]] and w.has_synced
    assert events == [("ADDED", "c"), ("MODIFIED", "a")]
    verb, kw = client.calls[1][0], client.calls[1].kwargs
    assert verb == "watch" and kw["resource_version"] == "10"
    assert kw["allow_bookmarks"] is True and kw["timeout_seconds"] == 450
    assert kw["stall_timeout_seconds"] == 90.0
    # The first list is a consistent read: no resourceVersion.
    assert client.calls[0].kwargs["resource_version"] is None
    # After the stream ended cleanly it re-watched from the bookmark's successor.
    assert calls(client)[2] == ("watch", "16")
    assert sample(metrics, "k8s_http_watch_events_total", resource="deployments.apps",
                  type="BOOKMARK") == 1
    assert sample(metrics, "k8s_http_watch_restarts_total", resource="deployments.apps",
                  reason="timeout") == 1
    assert sample(metrics, "k8s_http_informer_relists_total", resource="deployments.apps") == 1


def test_drop_rewatches_from_last_rv_without_relisting():
    w, client, events, syncs, stop, _ = run([
        ("list", listing("10", "a")),
        ("watch", [WatchEvent("ADDED", obj("b", "11")), ApiConnectionError("reset")]),
        ("watch", [ApiConnectionError("refused")]),
        ("watch", [WatchEvent("MODIFIED", obj("b", "12"))]),
    ])
    assert calls(client)[:4] == [("list", None), ("watch", "10"), ("watch", "11"), ("watch", "11")]
    assert client.verbs().count("list") == 1
    # First drop after progress: at once; the second failure in a row backs off.
    assert len(stop.waits) == 1
    assert events == [("ADDED", "b"), ("MODIFIED", "b")]


def test_gone_relists_and_hands_the_new_list_to_on_sync_only():
    syncs = []
    events = []
    w, client, _, _, _, _ = run([
        ("list", listing("10", "a", "b")),
        ("watch", [GoneError(410, "expired")]),
        ("list", GoneError(410, "expired")),
        ("list", listing("30", "b")),
    ], on_sync=lambda items: syncs.append(sorted(o["metadata"]["name"] for o in items)),
        on_event=lambda t, o: events.append((t, o["metadata"]["name"])))
    assert calls(client)[:4] == [("list", None), ("watch", "10"), ("list", "10"), ("list", None)]
    # Consistent lists are paged; a relist from an RV is one unpaged "not older than" read.
    assert [c.kwargs["limit"] for c in client.calls if c[0] == "list"] == [500, None, 500]
    # One-way: the relist goes to on_sync, which deletes what vanished itself;
    # nothing comes back through on_event.
    assert syncs == [["a", "b"], ["b"]]
    assert events == []
    assert calls(client)[4] == ("watch", "30")


def test_rv_advances_only_after_delivery_and_handler_errors_do_not_kill_the_loop():
    seen_rv = []

    def on_event(t, o):
        seen_rv.append(w_ref[0].resource_version)
        if o["metadata"]["name"] == "boom":
            raise RuntimeError("handler bug")

    w_ref = []
    stop = FakeStopEvent()
    client = scripted_client(stop, [
        ("list", listing("10")),
        ("watch", [WatchEvent("ADDED", obj("boom", "11")), WatchEvent("ADDED", obj("ok", "12")),
                   ProtocolError("bad line")]),
    ])
    w = Watcher(client, DEPLOYMENTS, on_sync=lambda items: None, on_event=on_event,
                streaming_list=False)
    w_ref.append(w)
    w.run(stop)
    # While an event is being handled, the RV is still the previous one.
    assert seen_rv == ["10", "11"]
    assert w.handler_errors == 1
    # The malformed line did not move the RV: re-watch from 12.
    assert calls(client)[2] == ("watch", "12")


def test_forbidden_backs_off_and_keeps_trying():
    w, client, events, syncs, stop, _ = run([
        ("list", ForbiddenError(403, "forbidden")),
        ("list", ForbiddenError(403, "forbidden")),
        ("list", listing("5", "a")),
        ("watch", ForbiddenError(403, "forbidden")),
        ("watch", [WatchEvent("ADDED", obj("b", "6"))]),
    ])
    assert calls(client)[:5] == [("list", None), ("list", None), ("list", None),
                                 ("watch", "5"), ("watch", "5")]
    assert len(stop.waits) == 3 and all(d > 0 for d in stop.waits)
    assert syncs == [["a"]]


def test_malformed_list_is_retried_not_watched():
    w, client, _, syncs, stop, _ = run([
        ("list", {"metadata": {}, "items": []}),
        ("list", {"items": "nope"}),
        ("list", listing("3")),
    ])
    assert calls(client)[:4] == [("list", None), ("list", None), ("list", None), ("watch", "3")]
    assert syncs == [[]] and len(stop.waits) >= 2


def test_stop_closes_the_open_stream():
    stop = FakeStopEvent()
    client = scripted_client(stop, [])
    w = Watcher(client, DEPLOYMENTS, on_sync=lambda items: None, on_event=lambda t, o: None,
                streaming_list=False)
    stream = ScriptedWatchStream([])
    w._stream = stream             # as if a watch were open
    w.stop()
    assert stream.closed


def test_a_rerun_resumes_from_its_state():
    stop = FakeStopEvent()
    client = scripted_client(stop, [("list", listing("7")), ("watch", [WatchEvent("ADDED", obj("a", "8"))])])
    w = Watcher(client, DEPLOYMENTS, on_sync=lambda items: None, on_event=lambda t, o: None,
                streaming_list=False)
    w.run(stop)
    assert w.state == Watching("8", 0, False) or w.state.resource_version == "8"
    stop2 = FakeStopEvent()
    client.play([("watch", [])], then=stop2.set)
    client.calls.clear()
    w.run(stop2)
    assert calls(client)[0] == ("watch", "8")   # no relist after a restart
    assert not isinstance(w.state, StoreList)


# ---- streaming list --------------------------------------------------------------

def end_bookmark(rv):
    return WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": rv,
                                        "annotations": {"k8s.io/initial-events-end": "true"}}})


def streamed(client):
    """The watch calls that asked for a streaming list."""
    return [c.kwargs for c in client.calls if c[0] == "watch" and c.kwargs.get("send_initial_events")]


def test_streaming_list_fills_the_cache_at_the_end_bookmark_and_the_same_stream_goes_on():
    seen_synced = []

    def on_sync(items):
        seen_synced.append(sorted(o["metadata"]["name"] for o in items))

    w, client, events, _, _, metrics = run([
        ("watch", [WatchEvent("ADDED", obj("a", "3")), WatchEvent("ADDED", obj("b", "4")), end_bookmark("10"),
                   WatchEvent("MODIFIED", obj("a", "11"))]),
    ], on_sync=on_sync, streaming_list=True)
    # One request: a streaming list from the current state (no RV), with bookmarks.
    (first,) = streamed(client)
    assert first["resource_version"] is None and first["allow_bookmarks"] is True
    assert client.calls[0][0] == "watch"
    assert seen_synced == [["a", "b"]] and w.has_synced
    # Initial objects reach the cache through on_sync only; after the bookmark,
    # events are delivered as on any watch.
    assert events == [("MODIFIED", "a")]
    # The stream then ended cleanly: a plain watch from the last RV, not a relist.
    assert calls(client)[1] == ("watch", "11") and not client.calls[1].kwargs.get(
        "send_initial_events")
    assert sample(metrics, "k8s_http_informer_relists_total", resource="deployments.apps") == 1


def test_not_synced_until_the_end_bookmark():
    syncs = []
    w, client, _, _, _, _ = run([
        ("watch", [WatchEvent("ADDED", obj("a", "3")), WatchEvent("ADDED", obj("b", "4"))]),
    ], on_sync=syncs.append, streaming_list=True)
    # The stream dropped (script exhausted) before the end bookmark: nothing swapped in.
    assert syncs == [] and not w.has_synced


def test_a_drop_during_the_initial_stream_streams_again_from_scratch():
    syncs = []
    w, client, _, _, stop, _ = run([
        ("watch", [WatchEvent("ADDED", obj("a", "3")), ApiConnectionError("reset")]),
        ("watch", [WatchEvent("ADDED", obj("b", "4")), end_bookmark("10")]),
    ], on_sync=lambda items: syncs.append(sorted(o["metadata"]["name"] for o in items)),
        streaming_list=True)
    assert [kw["resource_version"] for kw in streamed(client)] == [None, None]
    # The half set of the first attempt was dropped: only b.
    assert syncs == [["b"]] and w.has_synced
    assert stop.waits == []            # the first drop streams again at once


def test_collected_objects_go_into_the_stores_listing_one_by_one():
    from k8s_http.cache.store import StoreList, Store
    stop = FakeStopEvent()
    client = scripted_client(stop, [("watch", [WatchEvent("ADDED", dict(obj("a", "3"), junk="x" * 100)),
                                          end_bookmark("10")])])
    store = Store(transform=lambda o: {k: v for k, v in o.items() if k != "junk"})
    appended = []

    class Watched(StoreList):
        __slots__ = ()

        def append(self, item):
            appended.append(len(self))
            super().append(item)
    store.new_list = lambda: Watched(store)
    got = []
    w = Watcher(client, DEPLOYMENTS, on_sync=got.append, on_event=lambda t, o: None,
                store=store)
    w.run(stop)
    (listing,) = got
    assert isinstance(listing, Watched) and appended == [0]
    assert list(listing.objects()) == [obj("a", "3")]


def test_a_refusing_apiserver_costs_one_refused_request_then_lists_page_by_page():
    refused = InvalidError(422, "sendInitialEvents is forbidden for watch unless the WatchList "
                           "feature gate is enabled", reason="Invalid")
    syncs = []
    w, client, _, _, stop, _ = run([
        ("watch", refused),
        ("list", listing("10", "a")),
        ("watch", [GoneError(410, "expired")]),
        ("list", listing("20", "a", "b")),
        ("watch", [WatchEvent("ADDED", obj("c", "21"))]),
    ], on_sync=lambda items: syncs.append(len(items)), streaming_list=True)
    assert [c[0] for c in client.calls][:5] == ["watch", "list", "watch", "list", "watch"]
    assert len(streamed(client)) == 1
    # The fallback list is at once (no backoff), and consistent (no RV).
    assert client.calls[1].kwargs["resource_version"] is None and \
        client.calls[1].kwargs["limit"] == 500
    assert syncs == [1, 2] and stop.waits == []
    assert isinstance(w.state, Watching) and not w.state.stream


def test_an_apiserver_that_ignores_the_parameters_is_detected_by_its_plain_bookmark():
    syncs = []
    w, client, events, _, stop, _ = run([
        # An old apiserver: a plain watch from "now", which sends the state as ADDED
        # too, then its periodic bookmark, which has no initial-events-end annotation.
        ("watch", [WatchEvent("ADDED", obj("a", "3")), WatchEvent("BOOKMARK", {"metadata": {
            "resourceVersion": "9"}})]),
        ("list", listing("9", "a")),
        ("watch", []),
    ], on_sync=lambda items: syncs.append(len(items)), streaming_list=True)
    assert [c[0] for c in client.calls][:3] == ["watch", "list", "watch"]
    assert syncs == [1] and events == []
    assert stop.is_set()


def test_watches_skip_managed_fields_exactly_when_the_informers_store_drops_them():
    from k8s_http.cache.informer import Informer
    from k8s_http.cache.projection import Projection
    from k8s_http.cache.store import Store
    for transform, skipped in (("default", True), (Projection(["spec"]), True),
                               (Projection(["metadata"]), False), (None, False),
                               (lambda o: o, False)):
        stop = FakeStopEvent()
        client = scripted_client(stop, [("list", listing("10", "a")), ("watch", [])])
        store = Store() if transform == "default" else Store(transform=transform)
        informer = Informer(client, DEPLOYMENTS, namespaces=["ns"], streaming_list=False,
                            metrics=Metrics(CollectorRegistry()), rng=lambda: 0.5, store=store)
        informer.watchers[0].run(stop)
        watch = next(call for call in client.calls if call[0] == "watch")
        assert watch.kwargs.get("skip_managed_fields", False) is skipped, transform
