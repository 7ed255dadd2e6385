"""What the apiserver shows, as a watcher sees it, timestamped on arrival.

One list-then-watch thread per resource (My, Deployment, Service; or only
the `kinds` asked for, and only objects matching `label_selector`) in the
benchmark's namespace keeps the latest copy of each object. A `Tracker` waits
for a set of (kind, name) pairs to satisfy a predicate and records, for each,
the monotonic time its watch event arrived: "converged" is measured the way
any client of the apiserver would see it, not by asking the operator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from k8s_http.wire.client import ApiClient
from k8s_http.core.errors import GoneError, K8sHttpError
from k8s_http.core.objects import DEPLOYMENTS, SERVICES, Resource

from .cluster import MY

KINDS: dict[str, Resource] = {"my": MY, "deployment": DEPLOYMENTS, "service": SERVICES}

Predicate = Callable[[str, dict], bool]     # (kind, object) -> satisfied?


class Tracker:
    """Waits until every expected (kind, name) satisfies `predicate`; records when."""

    def __init__(self, expected: Iterable[tuple[str, str]], predicate: Predicate):
        self.predicate = predicate
        self.pending = set(expected)
        self.seen: dict[tuple[str, str], float] = {}
        self._done = threading.Event()
        if not self.pending:
            self._done.set()

    def offer(self, kind: str, obj: dict, at: float) -> None:
        """Called by the observer's threads (under its lock) for every object version."""
        key = (kind, obj["metadata"]["name"])
        if key in self.pending and self.predicate(kind, obj):
            self.pending.discard(key)
            self.seen[key] = at
            if not self.pending:
                self._done.set()

    def expect(self, keys: Iterable[tuple[str, str]]) -> None:
        """Widen the expected set (before the objects can exist)."""
        self.pending.update(k for k in keys if k not in self.seen)
        if self.pending:
            self._done.clear()

    def wait(self, timeout_seconds: float) -> bool:
        return self._done.wait(timeout_seconds)

    def last(self) -> float | None:
        return max(self.seen.values()) if self.seen else None


class Observer:
    def __init__(self, client: ApiClient, namespace: str, *,
                 kinds: Iterable[str] = tuple(KINDS), label_selector: str | None = None):
        self.client = client
        self.namespace = namespace
        self.label_selector = label_selector
        kinds = tuple(kinds)
        self.objects: dict[str, dict[str, dict]] = {kind: {} for kind in kinds}
        self._trackers: list[Tracker] = []
        self.lock = threading.Lock()        # guards objects and the tracker list
        self._stop = threading.Event()
        self._synced = {kind: threading.Event() for kind in kinds}
        self._streams: dict[str, object] = {}
        self._threads = [threading.Thread(target=self._run, args=(kind,), daemon=True,
                                          name=f"observe-{kind}") for kind in kinds]
        self.errors: list[str] = []

    def start(self, timeout_seconds: float = 30.0) -> "Observer":
        for t in self._threads:
            t.start()
        for kind, synced in self._synced.items():
            if not synced.wait(timeout_seconds):
                raise TimeoutError(f"observer: initial list of {kind} took over "
                                   f"{timeout_seconds} s ({self.errors[-1:]})")
        return self

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.close()
        for t in self._threads:
            t.join(timeout=5)

    def track(self, expected: Iterable[tuple[str, str]], predicate: Predicate) -> Tracker:
        """A tracker fed from now on, and at once with what is already cached."""
        return self.listen(Tracker(expected, predicate))

    def listen(self, listener):
        """Any object with Tracker's `offer(kind, obj, at)`: fed every version from now on,
        and at once with what is already cached."""
        now = time.monotonic()
        with self.lock:
            for kind, objs in self.objects.items():
                for obj in objs.values():
                    listener.offer(kind, obj, now)
            self._trackers.append(listener)
        return listener

    def untrack(self, tracker: Tracker) -> None:
        with self.lock:
            if tracker in self._trackers:
                self._trackers.remove(tracker)

    def get(self, kind: str, name: str) -> dict | None:
        with self.lock:
            return self.objects[kind].get(name)

    # -- the watch loops

    def _deliver(self, kind: str, event_type: str, obj: dict) -> None:
        now = time.monotonic()
        name = obj["metadata"]["name"]
        with self.lock:
            if event_type == "DELETED":
                self.objects[kind].pop(name, None)
                return
            self.objects[kind][name] = obj
            for tracker in self._trackers:
                tracker.offer(kind, obj, now)

    def _run(self, kind: str) -> None:
        resource = KINDS[kind]
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    listed = self.client.list(resource, namespace=self.namespace,
                                              label_selector=self.label_selector)
                    with self.lock:
                        self.objects[kind] = {}
                    for obj in listed["items"]:
                        self._deliver(kind, "ADDED", obj)
                    rv = listed["metadata"]["resourceVersion"]
                    self._synced[kind].set()
                stream = self.client.watch(resource, namespace=self.namespace,
                                           label_selector=self.label_selector,
                                           resource_version=rv, timeout_seconds=300)
                with self.lock:
                    self._streams[kind] = stream
                if self._stop.is_set():
                    stream.close()
                for event in stream:
                    if event.type == "BOOKMARK":
                        rv = event.object["metadata"]["resourceVersion"]
                        continue
                    self._deliver(kind, event.type, event.object)
                    rv = event.object["metadata"]["resourceVersion"]
            except GoneError:
                rv = None
            except K8sHttpError as err:
                if self._stop.is_set():
                    return
                self.errors.append(f"{kind}: {err}")
                time.sleep(0.2)
