"""Informer: watchers feed one Store, and every change becomes keys in work queues.

One Watcher thread per namespace (or one for all namespaces), all writing to a
shared Store. Handlers are (mapper, queue) pairs: a mapper turns an object into
the keys to reconcile (its own key, or its controlling owner's), and the queue
deduplicates them. Handlers never see event types: reconciles are level-based.

Priority (controller-runtime's priority queue, on by default since v0.23): the
keys of a list's objects the cache already held at the same resourceVersion,
and of the objects out of its view (all of the first list at start; after
reselect(), those the previous selection's `keep` filter did not cover, all of
them without one) go to the queues at LOW_PRIORITY, behind every key of a watch
event and of a changed, new or vanished object. A user's new `My` is then not
served after tens of thousands of no-op reconciles of a start-up, a relist or
a sharding takeover.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable

from ..core.backoff import Backoff
from ..core.objects import ObjectKey, Resource, controller_of, key_of, meta_of
from ..ops.metrics import Metrics
from ..wire.defaults import WATCH_STALL_TIMEOUT_SECONDS
from .store import Fields, StoreList, Store
from .watcher import Watcher
from .watchstep import STALLS_UNHEALTHY

__all__ = ["Informer", "Mapper", "KeyMapper", "LOW_PRIORITY", "own_key", "owner_key"]

log = logging.getLogger(__name__)

# controller-runtime's handler.LowPriority: the priority listed keys are handed
# to a queue's add_many(keys, priority=) with (WorkQueue: served after all others).
LOW_PRIORITY = -100

_KEY_FIELDS = (("metadata", "namespace"), ("metadata", "name"))


def _everything(obj: dict) -> bool:
    return True

Mapper = Callable[[dict], Iterable[ObjectKey]]


class KeyMapper:
    """A mapper that says which fields it reads (`reads`, paths of keys): the
    objects handed to it may hold those fields alone, built without the rest (a
    relist's tens of thousands of objects, and each watch event's old and new).
    Any other callable is a mapper too, and is handed whole objects."""

    __slots__ = ("_map", "reads", "__name__")

    def __init__(self, map_: Mapper, reads: Fields, name: str | None = None):
        if not isinstance(reads, (tuple, list)) or not reads or not all(
                isinstance(path, (tuple, list)) and path
                and all(isinstance(step, str) for step in path) for path in reads):
            raise ValueError(f"reads must be paths of keys, not {reads!r}")
        self._map = map_
        self.reads: Fields = tuple(tuple(path) for path in reads)
        self.__name__ = name or getattr(map_, "__name__", repr(map_))

    def __call__(self, obj: dict) -> Iterable[ObjectKey]:
        return self._map(obj)

    def __repr__(self) -> str:
        return f"<KeyMapper {self.__name__}>"


def _own_key(obj: dict) -> list[ObjectKey]:
    return [key_of(obj)]


# The object's own key: for the controller's primary resource.
own_key = KeyMapper(_own_key, (("metadata", "namespace"), ("metadata", "name")), "own_key")


def owner_key(kind: str, api_group: str = "") -> KeyMapper:
    """A mapper to the key of the controlling owner of `kind` in `api_group` ("" = core).

    The owner is looked up in the child's namespace: a namespaced child can only be
    owned by an object in its own namespace (or a cluster-scoped one, namespace "").
    """
    def mapper(obj: dict) -> list[ObjectKey]:
        ref = controller_of(obj)
        if not ref or ref.get("kind") != kind or not ref.get("name"):
            return []
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        if group != api_group:
            return []
        return [ObjectKey(meta_of(obj).get("namespace") or "", ref["name"])]
    name = f"owner_key[{kind}.{api_group}]" if api_group else f"owner_key[{kind}]"
    return KeyMapper(mapper, (("metadata", "namespace"), ("metadata", "ownerReferences")), name)


class Informer:
    """A cache of one resource kept current by list+watch, fanning changes out to queues.

    Health (`is_healthy`, for /healthz): every watcher thread is alive; each
    watcher's loop has turned within twice its current watch timeout
    (timeoutSeconds, 300-600 s, so 600-1200 s); and no watch has gone
    STALLS_UNHEALTHY (3) stall periods in a row without progress. The loop turns
    on progress (an event, a bookmark, a list, a clean reconnect) and on a
    failure it is about to retry (a drop, a stall, a 403, a refused connection).
    A stall is a watch whose connection succeeded (200 and headers) and that
    then delivered no complete event for the stall timeout; the count is
    cleared only by an event, a bookmark or a successful list
    (`Watching.stalls`), so a watch that reconnects fine and never gets data is
    not kept green by its own retries.

    Why both: liveness is there to catch what a restart cures, a wedged thread
    (a handler that never returns, a read that never times out). A healthy watch
    turns at least every ~60 s (bookmarks) and at the latest at its timeoutSeconds;
    a stalled one every 90 s (the stall timeout reconnects); a failing one at
    least every 60 s (the backoff cap, jittered). What a restart does not cure, an
    apiserver outage or a missing RBAC rule, must not fail liveness: the kubelet
    would throw away the warm cache and the process would not "stay up" as
    docs/SPEC.md asks. Those show up in /readyz (until the first list) and in
    k8s_http_watch_restarts_total. A watch that stalls on every reconnect is
    different: the connection works, the data never comes, and nothing suggests
    it ever will (a wedged apiserver watch cache, a proxy that buffers); a new
    process gets a new connection, perhaps to another apiserver, and the alert
    MyControllerWatchStalled fires on k8s_http_watch_stalls >= 3.
    """

    def __init__(self, client, resource: Resource, *, namespaces: list[str] | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 store: Store | None = None, metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random,
                 stall_timeout_seconds: float = WATCH_STALL_TIMEOUT_SECONDS, page_size: int = 500,
                 backoff_factory: Callable[[], Backoff] | None = None,
                 streaming_list: bool = True):
        self.resource = resource
        # The cache the watchers fill (what it keeps of each object is its own
        # business: Store(transform=...)); a fresh default Store if none is given.
        self.store = store if store is not None else Store()
        self._metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._label = str(resource)
        self._metrics.init_resource(self._label)
        self._cache_objects = self._metrics.cache_objects.labels(self._label)
        self._handlers: list[tuple[Mapper, object]] = []
        self._mapped_fields: Fields | None = None  # see add_handler
        self._sync_listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._started = False
        self._lock = threading.Lock()      # guards _threads (start / restart / stop)

        # None -> one watcher for all namespaces (or a cluster-scoped resource).
        if namespaces is None or not resource.namespaced:
            self._scopes: list[str | None] = [None]
        else:
            self._scopes = list(dict.fromkeys(namespaces))   # de-duplicated, order kept
            if not self._scopes:
                raise ValueError("namespaces must be None (all) or a non-empty list")
        self._watcher_args = dict(
            field_selector=field_selector, metrics=self._metrics, clock=clock, rng=rng,
            stall_timeout_seconds=stall_timeout_seconds, page_size=page_size,
            store=self.store, streaming_list=streaming_list, on_synced=self._notify_synced)
        self._client = client
        self._backoff_factory = backoff_factory
        # Sharding (reselect): the client-side filter every object passes before
        # the store (None: keep all), and the generation of watchers whose
        # deliveries count: a replaced watcher's late ones are dropped.
        self._keep: Callable[[dict], bool] | None = None
        self._generation = 0
        # The scopes (namespaces, None for all) whose watcher of this generation has
        # delivered a list; what the cache had a view of at a first list: None for
        # nothing (start-up), else the previous selection's keep (see _on_sync).
        self._listed: set[str | None] = set()
        self._covered: Callable[[dict], bool] | None = None
        self._deliver_lock = threading.RLock()
        self._dropped = 0       # objects the client-side filter dropped
        # The stop event of the current watchers (reselect replaces it); `_stop` is the informer's.
        self._run_stop = threading.Event()
        self._nothing = False   # reselect(nothing=True): no watch at all, an empty cache
        self._watchers: dict[str | None, Watcher] = self._new_watchers(label_selector, None)
        self._threads: dict[str | None, threading.Thread] = {}
        # Read at scrape time. One informer per resource in practice (the
        # manager keys them by resource and label selector).
        self._metrics.watch_stalls.labels(self._label).set_function(self.stalls)

    def __repr__(self) -> str:
        return f"<Informer {self._label} namespaces={list(self._watchers)}>"

    def _new_watchers(self, label_selector: str | None,
                      shard_selector: str | None) -> dict[str | None, Watcher]:
        generation = self._generation
        return {ns: Watcher(
            self._client, self.resource, namespace=ns, label_selector=label_selector,
            on_sync=lambda items, ns=ns, g=generation: self._deliver(g, self._on_sync, ns, items),
            on_event=lambda type_, obj, g=generation: self._deliver(g, self._on_event, type_, obj),
            backoff=self._backoff_factory() if self._backoff_factory else None,
            shard_selector=shard_selector, **self._watcher_args) for ns in self._scopes}

    def reselect(self, *, label_selector: str | None = None, shard_selector: str | None = None,
                 keep: Callable[[dict], bool] | None = None, nothing: bool = False) -> None:
        """Watch another selection (sharding: the share of this replica changed).

        The watches restart with the new selectors and list afresh; until that
        list is in, `has_synced` is False. `keep`: the client-side filter in
        front of the store (the server may ignore `shard_selector`).
        `nothing`: no watch at all and an empty cache (a replica holding no slot).
        Objects that leave the selection leave the cache as a relist's vanished
        objects do: their keys are enqueued, never reported as deletions (a
        handler only ever sees keys, and a reconcile is level-based).
        """
        with self._deliver_lock:
            self._generation += 1
            listed = not self._nothing and self._listed >= set(self._scopes)
            self._covered = self._keep if listed else None
            self._listed = set()
            self._keep = keep
            self._nothing = nothing
        with self._lock:
            old_watchers, old_stop = self._watchers, self._run_stop
            self._run_stop = threading.Event()
            self._watchers = {} if nothing else self._new_watchers(label_selector, shard_selector)
            old_threads = self._threads
            self._threads = {}
            if self._started and not self._stop.is_set():
                for ns in self._watchers:
                    self._start_thread_locked(ns)
        old_stop.set()
        for watcher in old_watchers.values():
            watcher.stop()
        for thread in old_threads.values():
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)
        if nothing:
            with self._deliver_lock:
                vanished = self.store.replace(self.store.new_list([]))
                self._cache_objects.set(len(self.store))
            self._enqueue(vanished)
            self._notify_synced()

    @property
    def dropped(self) -> int:
        """Objects the client-side filter (reselect's `keep`) has kept out of the cache."""
        return self._dropped

    def _filtered(self, items):
        """A list's items the client-side filter keeps (the same list when it keeps all)."""
        keep = self._keep
        listing = items if isinstance(items, StoreList) else self.store.new_list(items)
        if keep is None:
            return listing
        kept = self.store.new_list([])
        total = 0
        for obj in listing.objects():
            total += 1
            if keep(obj):
                kept.append(obj)
        self._dropped += total - len(kept)
        return kept

    @property
    def watchers(self) -> list[Watcher]:
        return list(self._watchers.values())

    # ---- handlers ----

    def add_handler(self, mapper: Mapper, queue) -> None:
        """Add mapper(obj) to queue on every add, update and delete (vanished objects included).

        Add handlers before start(): the initial list is delivered to the handlers
        present at that time. The queue needs add(key); with add_many(keys, *,
        priority=0) as well (WorkQueue), a list's keys go in one call per priority.
        """
        self._handlers.append((mapper, queue))
        # When every mapper says what it reads (own_key, owner_key are KeyMappers),
        # the objects handed to them are built with those fields alone: for
        # owner_key, a Deployment's namespace and ownerReferences instead of the
        # whole object, ~1 us less a child at a relist (measured offline, 10,000
        # Deployments), and far less than the whole object.
        reads = [m.reads if isinstance(m, KeyMapper) else None for m, _ in self._handlers]
        self._mapped_fields = (tuple(dict.fromkeys(p for r in reads for p in r))
                               if all(reads) else None)

    def add_sync_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (on a watcher's thread) each time a (re)list leaves the
        informer synced: every watcher's list done and delivered to the handlers."""
        self._sync_listeners.append(listener)

    def _notify_synced(self) -> None:
        if self.has_synced():
            for listener in self._sync_listeners:
                listener()

    def resync(self, queue, mapper: Mapper = own_key) -> int:
        """Add the keys of every cached object to `queue`; returns how many keys were added."""
        count = 0
        for obj in self.store.list():
            for key in self._keys(mapper, obj):
                queue.add(key)
                count += 1
        return count

    def _deliver(self, generation: int, handle: Callable, *args) -> None:
        """A watcher's delivery, unless reselect() replaced that watcher since."""
        with self._deliver_lock:
            if generation == self._generation:
                handle(*args)

    def _on_sync(self, namespace: str | None, items: StoreList | list) -> None:
        # One way: the store replaces (deleting what vanished), and the keys of
        # both the listed and the vanished objects go to the queues from here;
        # nothing goes back to the watcher. The watchers fill a StoreList of the
        # store's as a list arrives, so a long list is never held as dicts.
        listing = self._filtered(items)
        # What the cache had a view of: all of it at a relist; at a first list,
        # nothing at start-up, and after reselect() what the previous selection's
        # filter covered (an object it covered but the cache lacks was created while
        # the watches restarted: a user's new `My` in a slot this replica keeps).
        covered = self._covered if namespace not in self._listed else _everything
        self._listed.add(namespace)
        unchanged: set[ObjectKey] | None = None if covered is None else set()
        vanished = self.store.replace(listing, namespace=namespace, unchanged=unchanged)
        self._cache_objects.set(len(self.store))
        # As client-go: a (re)list is delivered whole. What changed while we were
        # not watching is unknown, and the queue deduplicates. The listed objects
        # are built one at a time: all of them at once would be the whole list
        # as dicts again, the peak the packed store exists to avoid.
        # Low: what the cache held as it is, and what was out of its view.
        if covered is None:
            low, changed = listing, self.store.new_list()
        else:
            low, changed = listing.split(
                lambda obj: key_of(obj) in unchanged or not covered(obj),
                fields=_KEY_FIELDS if covered is _everything else None)
        self._enqueue(itertools.chain(changed.objects(fields=self._mapped_fields), vanished))
        self._enqueue(low.objects(fields=self._mapped_fields), priority=LOW_PRIORITY)

    def _on_event(self, type_: str, obj: dict) -> None:
        if self._keep is not None and not self._keep(obj):
            # Never in the cache: the filter depends only on the uid, which never changes.
            self._dropped += 1
            return
        if type_ == "DELETED":
            old = self.store.delete(obj)
            self._cache_objects.set(len(self.store))
            self._enqueue((obj, old) if old is not None else (obj,))
            return
        change = self.store.upsert_if_changed(obj, fields=self._mapped_fields)
        self._cache_objects.set(len(self.store))
        if change is None:
            return      # only the resourceVersion moved: the handlers know this object
        # Map the old object too: when an ownerReference changes, both owners care.
        # The watch's copy of our own write does not bring back the key whose
        # reconcile wrote it (that reconcile has seen its answer); others learn of it.
        # A writer named otherwise than (queue, key) is no handler's: everyone hears.
        writer = change.echo_of
        skip = writer if isinstance(writer, tuple) and len(writer) == 2 else None
        self._enqueue((change.new, change.old) if change.old is not None else (change.new,),
                      skip=skip)

    def _enqueue(self, objs: Iterable[dict], *,
                 skip: tuple[object, ObjectKey] | None = None, priority: int = 0) -> None:
        """The keys the mappers find in `objs` to every handler's queue, each key
        once per queue; a queue with `add_many` (WorkQueue) takes them in one
        call: a relist's tens of thousands of keys cost one lock and one wake-up
        per queue instead of one each. `skip`: (queue, key) not to add.
        `priority` (not 0) goes to add_many(); a queue with add() alone gets plain adds."""
        found: list[list[ObjectKey]] = [[] for _ in self._handlers]
        for obj in objs:
            for (mapper, _), keys in zip(self._handlers, found):
                keys.extend(self._keys(mapper, obj))
        for (_, queue), listed in zip(self._handlers, found):
            keys = dict.fromkeys(listed)
            if skip is not None and skip[0] is queue:
                keys.pop(skip[1], None)
            add_many = getattr(queue, "add_many", None)
            if add_many is None:
                for key in keys:
                    queue.add(key)
            elif keys:
                add_many(keys, priority=priority) if priority else add_many(keys)

    @staticmethod
    def _keys(mapper: Mapper, obj: dict) -> list[ObjectKey]:
        try:
            return list(mapper(obj))
        except Exception:  # one bad mapper must not starve the other handlers
            log.exception("key mapper %s failed", getattr(mapper, "__name__", mapper))
            return []

    # ---- lifecycle ----

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            for ns in self._watchers:
                self._start_thread_locked(ns)

    def stop(self) -> None:
        """Stop every watcher and wait briefly for its thread; idempotent."""
        self._stop.set()
        self._run_stop.set()
        for watcher in self._watchers.values():
            watcher.stop()
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)

    def restart_if_dead(self) -> int:
        """For the supervisor: restart watcher threads that died; returns how many."""
        restarted = 0
        with self._lock:
            if not self._started or self._stop.is_set():
                return 0
            for ns, thread in self._threads.items():
                if not thread.is_alive():
                    log.error("%s: watcher thread %s died; restarting it from %r", self,
                              thread.name, self._watchers[ns].state)
                    self._start_thread_locked(ns)
                    restarted += 1
        return restarted

    def _start_thread_locked(self, ns: str | None) -> None:
        watcher = self._watchers[ns]
        thread = threading.Thread(target=self._run_watcher, args=(watcher, self._run_stop),
                                  name=f"informer-{self._label}-{ns or 'all'}", daemon=True)
        self._threads[ns] = thread
        thread.start()

    def _run_watcher(self, watcher: Watcher, stop: threading.Event) -> None:
        try:
            watcher.run(stop)
        except Exception:
            # The thread ends here; is_healthy() reports it and restart_if_dead()
            # resumes the watcher from its state (no relist).
            log.exception("%s: watcher thread crashed", watcher)

    # ---- health ----

    def has_synced(self) -> bool:
        """Every watcher has finished its initial list."""
        with self._lock:
            watchers = list(self._watchers.values())
        return all(w.has_synced for w in watchers)

    def stalls(self) -> int:
        """The most stall periods in a row, without progress, of any of this informer's watches."""
        with self._lock:
            watchers = list(self._watchers.values())
        return max((w.stalls for w in watchers), default=0)

    def is_healthy(self, *, now: float | None = None) -> tuple[bool, str]:
        now = self._clock() if now is None else now
        if not self._started:
            return False, "not started"
        problems = []
        with self._lock:
            threads = dict(self._threads)
            watchers = dict(self._watchers)
        for ns, watcher in watchers.items():
            where = ns or "all namespaces"
            if ns not in threads or not threads[ns].is_alive():
                problems.append(f"{where}: watcher thread is dead")
                continue
            deadline = 2 * watcher.watch_timeout_seconds
            idle = now - max(watcher.last_progress, watcher.last_retry)
            if idle > deadline:
                problems.append(f"{where}: watch loop stuck: no progress or retry for "
                                f"{idle:.0f} s (limit {deadline:.0f} s)")
            elif watcher.stalls >= STALLS_UNHEALTHY:
                problems.append(f"{where}: watch stalled {watcher.stalls} times in a row "
                                f"(connected, then silent; no event, bookmark or list since)")
        if problems:
            return False, "; ".join(problems)
        return True, "ok"
