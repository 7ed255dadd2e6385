"""The streaming list against the real kube-apiserver (1.36: WatchList on by default).

What the fake apiserver cannot vouch for: that the real one answers our
parameters with initial events ended by the k8s.io/initial-events-end bookmark,
that a fleet of objects arrives whole that way, and that a relist after 410
streams too. The informer's client records what it sent, so the test proves
the streaming request was used and no list request was made.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

from k8s_http.core.objects import CONFIGMAPS, ObjectKey
from k8s_http.cache.watchstep import Watching
from tests.e2e.test_k8s_http import InformerHarness, configmap
from tests.support.faultproxy import FaultProxy
from tests.support.wait import eventually

FLEET = 2000


class Recording:
    """Wraps the transport of the harness's client: every GET it sends, in order."""

    def __init__(self, transport):
        self._lock = threading.Lock()
        self.sent: list[tuple[str, dict]] = []          # ("list" | "watch", query)
        request, stream = transport.request, transport.stream

        def recording_request(method, path, *, query=None, **kwargs):
            if method == "GET" and path.endswith("/configmaps"):
                self._add("list", query)
            return request(method, path, query=query, **kwargs)

        def recording_stream(path, *, query=None, **kwargs):
            self._add("watch", query)
            return stream(path, query=query, **kwargs)

        transport.request, transport.stream = recording_request, recording_stream

    def _add(self, kind, query):
        with self._lock:
            self.sent.append((kind, {k: v for k, v in (query or {}).items() if v is not None}))

    def of(self, kind):
        with self._lock:
            return [q for k, q in self.sent if k == kind]


def test_a_fleet_arrives_whole_by_one_streaming_request_and_a_relist_streams_too(
        control_plane, admin_kubeconfig, api, namespace, tmp_path):
    # ~1 KiB of data each, and a value per object to check it arrived intact.
    payload = "x" * 1024
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: api.create(CONFIGMAPS, configmap(f"cm-{i:05d}", i=str(i),
                                                                 pad=payload),
                                           namespace=namespace), range(FLEET)))
    # Through the fault proxy: it counts requests on the wire, and can expire the watch.
    with FaultProxy(control_plane.server, control_plane.admin_ssl_context()) as proxy:
        harness = InformerHarness(str(proxy.write_kubeconfig(tmp_path / "kc", namespace)),
                                  namespace)
        sent = Recording(harness.client.transport)
        with harness as h:
            cached = h.informer.store.list()
            assert len(cached) == FLEET
            for obj in cached:
                name = obj["metadata"]["name"]
                assert obj["data"] == {"i": str(int(name[3:])), "pad": payload}, name
            assert h.queue.seen() == {ObjectKey(namespace, f"cm-{i:05d}") for i in range(FLEET)}

            # One request, a streaming list; no list request at all.
            (stream,) = sent.of("watch")
            assert stream["sendInitialEvents"] == "true"
            assert stream["resourceVersionMatch"] == "NotOlderThan"
            assert stream["allowWatchBookmarks"] == "true"
            assert "resourceVersion" not in stream                # the current state
            assert sent.of("list") == []
            assert proxy.requests["GET configmaps watch"] == 1
            assert proxy.requests["GET configmaps"] == 0
            # It ended with the apiserver's initial-events-end bookmark: the watcher
            # is watching on that stream, and will relist by streaming.
            watcher = h.informer.watchers[0]
            assert isinstance(watcher.state, Watching) and watcher.state.stream
            assert h.relists() == 1

            # The watch goes on on the same stream.
            api.create(CONFIGMAPS, configmap("live", v="1"), namespace=namespace)
            api.delete(CONFIGMAPS, "cm-00000", namespace=namespace)
            eventually(lambda: h.informer.store.get(ObjectKey(namespace, "live")) and
                       h.informer.store.get(ObjectKey(namespace, "cm-00000")) is None,
                       timeout=10, message="the create and delete after the initial events")
            assert len(sent.of("watch")) == 1

            # A 410 on the watch: the relist streams "not older than" the last RV the
            # watcher saw, which is the last line relayed before the 410 (the apiserver's
            # periodic bookmarks may move it on after any moment the test could sample).
            proxy.arm("gone_event", resource="configmaps")
            eventually(lambda: h.relists() == 2, timeout=30, message="no relist after the 410")
            eventually(lambda: isinstance(watcher.state, Watching), timeout=30,
                       message="the relist by streaming never ended")
            last_seen = json.loads(proxy.last_before_fault["configmaps"])
            last_rv = last_seen["object"]["metadata"]["resourceVersion"]
            relist = sent.of("watch")[1]
            assert relist["sendInitialEvents"] == "true" and relist["resourceVersion"] == last_rv
            assert watcher.state.stream and sent.of("list") == []
            assert {o["metadata"]["name"] for o in h.informer.store.list()} == (
                {f"cm-{i:05d}" for i in range(1, FLEET)} | {"live"})
