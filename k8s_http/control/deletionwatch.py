"""DeletionWatches: be told when one named object outside every cache goes away.

A controller that finds a name taken by an object it does not own (a
"squatter") must not touch it, and wants to act the moment it is deleted.
Its caches cannot tell: they are label-selected, so they never held the
squatter. Polling every such name is slow and costs requests for ever;
caching every Deployment of the cluster costs memory for objects that are
none of our business.

Instead: one Informer per blocked name, narrowed by the field selector
`metadata.name=<name>` in its namespace. The apiserver sends only that
object's events, so memory and traffic are bounded by the number of blocked
names, and the informer brings list+watch, resume, 410 relists and backoff
for free. When the object is gone (a DELETED event, or absent from a relist)
the owner's key is handed to `notify` once, and the watch ends: if the
reconcile finds a new squatter, it asks again.

At most `max_watches` names are watched at once (each is a thread and a
connection); `watch` returns False beyond that, and the caller falls back to
looking again later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..core.objects import ObjectKey, Resource
from ..ops.metrics import Metrics
from ..cache.informer import Informer

__all__ = ["DeletionWatches"]

log = logging.getLogger(__name__)

# Each watched name is a thread and a long-lived connection: enough for the
# conflicts a cluster has at a time, small enough not to be a resource leak.
MAX_WATCHES = 100


class DeletionWatches:
    """`watch(resource, key, owner)`: call `notify(owner)` once `key` is deleted."""

    def __init__(self, client, notify: Callable[[ObjectKey], None], *,
                 max_watches: int = MAX_WATCHES):
        self._client = client
        self._notify = notify
        self._max = max_watches
        # The per-name informers count into a registry of their own: sharing the
        # manager's would overwrite k8s_http_cache_objects of the real caches
        # (same resource label) with these one-object stores.
        self._metrics = Metrics()
        self._lock = threading.Lock()
        # Invariant (under _lock): (resource, key) in _watches iff its informer
        # was started and its deletion has not been reported yet.
        self._watches: dict[tuple[Resource, ObjectKey], tuple[Informer, ObjectKey]] = {}
        self._stopped = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._watches)

    def watch(self, resource: Resource, key: ObjectKey, owner: ObjectKey) -> bool:
        """Watch `key` until it is deleted, then notify `owner`; idempotent.

        False when it cannot be watched (the limit is reached, or stopped).
        """
        with self._lock:
            if (resource, key) in self._watches:
                return True
            if self._stopped or len(self._watches) >= self._max:
                return False
            informer = _NameInformer(
                self._client, resource, key,
                on_gone=lambda inf: self._gone(resource, key, inf), metrics=self._metrics)
            self._watches[(resource, key)] = (informer, owner)
        informer.start()
        log.debug("watching %s %s until it is deleted (for %s)", resource.kind, key, owner)
        return True

    def watching(self, resource: Resource, key: ObjectKey) -> bool:
        """Whether `key` is being watched: taken when last seen, its deletion not reported."""
        with self._lock:
            return (resource, key) in self._watches

    def cancel(self, owner: ObjectKey) -> None:
        """Stop every watch made for `owner` (it was deleted, say)."""
        with self._lock:
            done = [(k, inf) for k, (inf, o) in self._watches.items() if o == owner]
            for k, _ in done:
                del self._watches[k]
        for _, informer in done:
            informer.stop()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            informers = [inf for inf, _ in self._watches.values()]
            self._watches.clear()
        for informer in informers:
            informer.stop()

    def _gone(self, resource: Resource, key: ObjectKey, informer: Informer) -> None:
        with self._lock:
            entry = self._watches.get((resource, key))
            if entry is None or entry[0] is not informer:
                return                  # cancelled, or already reported
            del self._watches[(resource, key)]
        owner = entry[1]
        log.info("%s %s is gone; looking at %s again", resource.kind, key, owner)
        # Stopped from another thread: this one is the informer's own watcher,
        # which stop() would wait for.
        threading.Thread(target=informer.stop, name=f"stop-deletion-watch-{key.name}",
                         daemon=True).start()
        self._notify(owner)


class _NameInformer(Informer):
    """An informer of one name that reports when its store no longer holds it.

    The Informer updates its store before anything else, so an empty store
    after a list or an event means the object is gone: deleted, or absent
    from the list (already gone before the watch began).
    """

    def __init__(self, client, resource: Resource, key: ObjectKey, *,
                 on_gone: Callable[[Informer], None], metrics: Metrics):
        super().__init__(client, resource,
                         namespaces=[key.namespace] if resource.namespaced else None,
                         field_selector=f"metadata.name={key.name}", metrics=metrics)
        self._key = key
        self._on_gone = on_gone

    # The Informer's handlers, then the check (their arguments are the Informer's).
    def _on_sync(self, *args) -> None:
        super()._on_sync(*args)
        self._check()

    def _on_event(self, *args) -> None:
        super()._on_event(*args)
        self._check()

    def _check(self) -> None:
        if self.store.get(self._key) is None:
            self._on_gone(self)
