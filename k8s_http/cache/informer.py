"""Informer: watchers feed one Store, and every change becomes keys in work queues.

One Watcher thread per namespace (or one for all namespaces), all writing to a
shared Store. Handlers are (mapper, queue) pairs: a mapper turns an object into
the keys to reconcile (its own key, or its controlling owner's), and the queue
deduplicates them. Handlers never see event types: reconciles are level-based.

What it watches is one or more parts (selections: a label selector or a
shardSelector, and a client-side filter), each with watchers of its own; one
part for all of the resource unless a caller (sharding) adds others.

Priority (controller-runtime's priority queue, on by default since v0.23): the
keys of a list's objects the cache already held at the same resourceVersion,
and all of a new part's first list (the cache had no view of its objects: at
start-up, or slots taken over) go to the queues at LOW_PRIORITY, behind every
key of a watch event and of a changed, new or vanished object. A user's new
`My` is then not served after tens of thousands of no-op reconciles of a
start-up, a relist or a sharding takeover. The listed objects a handler's
`urgent` test picks (awaiting their reconcile) go at LISTED_URGENT_PRIORITY:
ahead of the other listed keys, still behind the watch's. After a takeover the
survivor's own live objects are then served first, and the taken-over share's
backlog (its objects have waited for the Lease already) in the time left.
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
from .store import Fields, StoreList, Store, nothing_cached
from .watcher import Watcher
from .watchstep import STALLS_UNHEALTHY

__all__ = ["Informer", "Mapper", "KeyMapper", "UpdateFilter", "LOW_PRIORITY",
           "LISTED_URGENT_PRIORITY", "own_key", "owner_key"]

log = logging.getLogger(__name__)

# controller-runtime's handler.LowPriority: the priority listed keys are handed
# to a queue's add_many(keys, priority=) with (WorkQueue: served after all others).
LOW_PRIORITY = -100
# The listed objects a handler's `urgent` test is true of: before LOW_PRIORITY's,
# after every key at priority >= 0 (WorkQueue serves its low line by priority).
LISTED_URGENT_PRIORITY = -1

# How often a part waiting for the list gate looks whether it was stopped.
_GATE_POLL_SECONDS = 0.5

_KEY_FIELDS = (("metadata", "namespace"), ("metadata", "name"))
_UNFILTERED = object()      # _on_sync: a list no filter has seen yet


Mapper = Callable[[dict], Iterable[ObjectKey]]
# (old, new) of a watch's update -> whether a handler queues it (add_handler).
UpdateFilter = Callable[[dict, dict], bool]


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


class _Part:
    """One selection an informer watches into its cache: a watcher per scope
    (namespace, None for all), their threads and stop event, and the filter
    (`keep`, None: all) every delivery of theirs passes before the store.

    Invariants (the informer's locks guard them): the parts' filters are
    disjoint, so each cached object is exactly one part's; `listed` holds the
    scopes whose first list is in; `replaced` holds the parts this one takes
    over once it has listed every scope (then it is emptied and they are gone);
    `superseded` holds the scopes a replacing part has listed already, whose
    deliveries from this part are dropped (that part speaks for them)."""

    __slots__ = ("id", "keep", "replaced", "on_synced", "watchers", "threads", "stop",
                 "listed", "superseded", "gated", "gate_held")

    def __init__(self, id_: int, keep: Callable[[dict], bool] | None, replaced: list[_Part],
                 on_synced: Callable[[], None] | None, gated: bool = False):
        self.id = id_
        self.keep = keep
        self.replaced = replaced
        self.on_synced = on_synced
        self.watchers: dict[str | None, Watcher] = {}
        self.threads: dict[str | None, threading.Thread] = {}
        self.stop = threading.Event()
        self.listed: set[str | None] = set()
        self.superseded: set[str | None] = set()
        # Added after the informer started: each scope's first list waits for the
        # list gate; gate_held: the scopes whose watcher thread holds it.
        self.gated = gated
        self.gate_held: set[str | None] = set()


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
                 streaming_list: bool = True, list_gate: threading.Lock | None = None):
        self.resource = resource
        # Shared by the informers of one manager: a part added after start (slots
        # taken over, a merge) lists while holding it, so such lists reach the
        # apiserver one at a time. Several large lists served at once slowed the
        # apiserver's answers to the replica's own writes from ~6 ms to 150-370 ms
        # (p50, server side) for as long as they lasted; one at a time, its new
        # `My` were served as fast as before (docs/SHARDING.md, section 10).
        self._list_gate = list_gate
        # The cache the watchers fill (what it keeps of each object is its own
        # business: Store(transform=...)); a fresh default Store if none is given.
        self.store = store if store is not None else Store()
        self._metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._label = str(resource)
        self._metrics.init_resource(self._label)
        self._cache_objects = self._metrics.cache_objects.labels(self._label)
        # (mapper, queue, urgent test, update filter) per handler: see add_handler.
        self._handlers: list[tuple[Mapper, object, Callable[[dict], bool] | None,
                                   UpdateFilter | None]] = []
        self._mapped_fields: Fields | None = None  # see add_handler
        # What a watch's update builds its objects with: the mappers' fields, or
        # whole objects when a handler's update filter reads them.
        self._update_fields: Fields | None = None
        # What the handlers' urgent tests read, all together (None: not said,
        # objects are built whole; () without tests), and with the mappers'
        # reads, the fields a list's low objects are built with (see add_handler).
        self._urgent_reads: Fields | None = ()
        self._listed_fields: Fields | None = None
        self._sync_listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._started = False
        # Guards _parts and their threads; changing _parts takes _deliver_lock too.
        self._lock = threading.Lock()

        # None -> one watcher for all namespaces (or a cluster-scoped resource).
        if namespaces is None or not resource.namespaced:
            self._scopes: list[str | None] = [None]
        else:
            self._scopes = list(dict.fromkeys(namespaces))   # de-duplicated, order kept
            if not self._scopes:
                raise ValueError("namespaces must be None (all) or a non-empty list")
        self._scope_set = frozenset(self._scopes)     # what a part lists before it is synced
        self._watcher_args = dict(
            field_selector=field_selector, metrics=self._metrics, clock=clock, rng=rng,
            stall_timeout_seconds=stall_timeout_seconds, page_size=page_size,
            store=self.store, streaming_list=streaming_list, on_synced=self._notify_synced)
        self._client = client
        self._backoff_factory = backoff_factory
        # The selections watched (see _Part); a delivery counts only while its
        # part is here. Parts are added and removed under both locks.
        self._parts: dict[int, _Part] = {}
        self._part_ids = itertools.count()
        self._deliver_lock = threading.RLock()     # one delivery (or part change) at a time
        self._dropped = 0       # objects the client-side filters dropped
        self.add_part(label_selector=label_selector)
        # Read at scrape time. One informer per resource in practice (the
        # manager keys them by resource and label selector).
        self._metrics.watch_stalls.labels(self._label).set_function(self.stalls)

    def __repr__(self) -> str:
        return f"<Informer {self._label} namespaces={self._scopes} parts={len(self._parts)}>"

    # ---- selections (parts) ----

    def add_part(self, *, label_selector: str | None = None, shard_selector: str | None = None,
                 keep: Callable[[dict], bool] | None = None, replaces: Iterable[int] = (),
                 on_synced: Callable[[], None] | None = None) -> int:
        """Watch one more selection into the cache; returns its id.

        `keep`: the client-side filter its objects pass (the server may ignore
        `shard_selector`); the filters of the parts must be disjoint, so every
        cached object is one part's, and a part's list replaces its own objects
        alone. `replaces`: parts whose objects this one takes over (its filter
        covers theirs): they keep serving until this part has listed every
        namespace, then go, their objects kept. `on_synced()`: once, after that
        first complete list (on a watcher's thread, no lock of ours held).
        A new part's first list is queued low (the cache had no view of its
        objects), but for what a handler's `urgent` test picks; a part that
        replaces others enqueues only what changed since they cached it
        (docs/SHARDING.md, section 10).
        """
        with self._deliver_lock, self._lock:
            replaced = [self._parts[i] for i in replaces if i in self._parts]
            part = _Part(next(self._part_ids), keep, replaced, on_synced,
                         gated=self._list_gate is not None and self._started)
            part.watchers = {ns: self._new_watcher(part, ns, label_selector, shard_selector)
                             for ns in self._scopes}
            self._parts[part.id] = part
            if self._started and not self._stop.is_set():
                for ns in part.watchers:
                    self._start_thread_locked(part, ns)
        return part.id

    def remove_part(self, part_id: int) -> None:
        """Stop watching a part and drop its objects from the cache; their keys
        are enqueued, as a relist's vanished objects' are, never reported as
        deletions (a handler only ever sees keys, and a reconcile is level-based)."""
        with self._deliver_lock:
            with self._lock:
                part = self._parts.pop(part_id, None)
            if part is None:
                return
            vanished = self.store.remove_where(self._owned_by(part))
            self._cache_objects.set(len(self.store))
        self._stop_part(part)
        self._enqueue(vanished)
        self._notify_synced()

    def narrow_part(self, part_id: int, keep: Callable[[dict], bool]) -> None:
        """A part's filter takes less (`keep` only objects the old one took):
        what it no longer takes leaves the cache at once, as in remove_part. Its
        watches go on unchanged, with the server selecting more than it keeps,
        until the caller replaces it with a narrower part."""
        with self._deliver_lock:
            part = self._parts.get(part_id)
            if part is None:
                return
            owned = self._owned_by(part)
            part.keep = keep
            vanished = self.store.remove_where(lambda obj: owned(obj) and not keep(obj))
            self._cache_objects.set(len(self.store))
        self._enqueue(vanished)

    def part_ids(self) -> list[int]:
        with self._lock:
            return list(self._parts)

    def _owned_by(self, part: _Part) -> Callable[[dict], bool]:
        """Whether a cached object is `part`'s: its filter's, or with none, no
        other part's (deliver lock held)."""
        if part.keep is not None:
            return part.keep
        others = [p.keep for p in self._parts.values()
                  if p is not part and p not in part.replaced and p.keep is not None]
        return lambda obj: not any(keep(obj) for keep in others)

    def _new_watcher(self, part: _Part, ns: str | None, label_selector: str | None,
                     shard_selector: str | None) -> Watcher:
        return Watcher(
            self._client, self.resource, namespace=ns, label_selector=label_selector,
            on_sync=lambda items: self._deliver_list(part, ns, items),
            on_event=lambda type_, obj: self._deliver(part, ns, self._on_event, type_, obj, part),
            backoff=self._backoff_factory() if self._backoff_factory else None,
            shard_selector=shard_selector, **self._watcher_args)

    def _stop_part(self, part: _Part) -> None:
        part.stop.set()
        for watcher in part.watchers.values():
            watcher.stop()
        for thread in list(part.threads.values()):
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)

    @property
    def dropped(self) -> int:
        """Objects the client-side filters (the parts' `keep`) have kept out of the cache."""
        return self._dropped

    def _filtered(self, keep: Callable[[dict], bool] | None, items) -> tuple[StoreList, int]:
        """(a list's items `keep` keeps, how many it dropped); the same list
        when it keeps all. The objects stay as the watcher stored them."""
        listing = items if isinstance(items, StoreList) else self.store.new_list(items)
        if keep is None:
            return listing, 0
        kept, dropped = listing.split(keep)
        return kept, len(dropped)

    @property
    def watchers(self) -> list[Watcher]:
        with self._lock:
            return [w for part in self._parts.values() for w in part.watchers.values()]

    # ---- handlers ----

    def add_handler(self, mapper: Mapper, queue, *, urgent: Callable[[dict], bool] | None = None,
                    urgent_reads: Fields | None = None,
                    update_filter: UpdateFilter | None = None) -> None:
        """Add mapper(obj) to queue on every add, update and delete (vanished objects included).

        Add handlers before start(): the initial list is delivered to the handlers
        present at that time. The queue needs add(key); with add_many(keys, *,
        priority=0) as well (WorkQueue), a list's keys go in one call per priority.
        `urgent`: a list's objects it is true of are queued at
        LISTED_URGENT_PRIORITY where the list's others go at LOW_PRIORITY (e.g.
        objects.awaits_reconcile: a `My` created while no replica watched its
        slot is not served after the unchanged ones, nor before the watch's
        events); `urgent_reads`: the fields it reads (else objects are built whole).
        `update_filter(old, new)`: for a watch's update of a cached object (both as
        the cache keeps them), whether this handler queues its keys: False when
        nothing it acts on changed (controller-runtime's update predicate). Adds,
        deletes and lists always queue; a filter that raises queues too.
        """
        self._handlers.append((mapper, queue, urgent, update_filter))
        if urgent is not None:
            self._urgent_reads = (None if not urgent_reads or self._urgent_reads is None else
                                  (*self._urgent_reads, *(tuple(p) for p in urgent_reads)))
        # When every mapper says what it reads (own_key, owner_key are KeyMappers),
        # the objects handed to them are built with those fields alone: for
        # owner_key, a Deployment's namespace and ownerReferences instead of the
        # whole object, ~1 us less a child at a relist (measured offline, 10,000
        # Deployments), and far less than the whole object.
        reads = [m.reads if isinstance(m, KeyMapper) else None for m, _, _, _ in self._handlers]
        self._mapped_fields = (tuple(dict.fromkeys(p for r in reads for p in r))
                               if all(reads) else None)
        filtered = any(f is not None for *_, f in self._handlers)
        self._update_fields = None if filtered else self._mapped_fields
        self._listed_fields = (None if self._mapped_fields is None or self._urgent_reads is None
                               else tuple(dict.fromkeys((*self._mapped_fields,
                                                         *self._urgent_reads))))

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

    def _deliver(self, part: _Part, scope: str | None, handle: Callable, *args) -> None:
        """A watcher's delivery, unless its part is gone or a part replacing it
        has listed this scope (that part speaks for it from then on)."""
        with self._deliver_lock:
            if self._parts.get(part.id) is not part or scope in part.superseded:
                return
            listed_before = part.listed >= self._scope_set
            handle(*args)
            first_complete = not listed_before and part.listed >= self._scope_set
        if first_complete:
            self._part_listed(part)

    def _deliver_list(self, part: _Part, scope: str | None, items: StoreList) -> None:
        """A watcher's list: filtered by its part's `keep` first, outside the
        delivery lock (the slow part of a large list: the other parts' events
        are not held back meanwhile), then delivered."""
        try:
            keep = part.keep
            kept, dropped = self._filtered(keep, items)
            self._deliver(part, scope, self._on_sync, scope, kept, part, (keep, dropped))
        finally:
            self._give_list_gate(part, scope)       # its first list is in: the next may go

    def _sole_part(self) -> _Part:
        (part,) = self._parts.values()
        return part

    def _on_sync(self, namespace: str | None, items: StoreList | list,
                 part: _Part | None = None,
                 filtered: tuple[Callable[[dict], bool] | None, int] | None = None) -> None:
        """A list of `part` (default: the only part) for `namespace`.
        `filtered`: (the filter `items` passed already, how many it dropped);
        if the part's filter changed since, they are filtered again."""
        # One way: the store replaces (deleting what vanished), and the keys of
        # both the listed and the vanished objects go to the queues from here;
        # nothing goes back to the watcher. The watchers fill a StoreList of the
        # store's as a list arrives, so a long list is never held as dicts.
        part = part or self._sole_part()
        passed, dropped = filtered if filtered is not None else (_UNFILTERED, 0)
        listing = items
        if passed is not part.keep:
            listing, more = self._filtered(part.keep, items)
            dropped += more
        self._dropped += dropped
        # What the cache had a view of: all of it at a relist; at a first list,
        # nothing for a new part (start-up, slots taken over), and all of it for
        # a part that replaces others (what they cached is judged as a relist judges).
        first = namespace not in part.listed
        try:
            self._apply_list(part, namespace, listing, first)
        finally:
            # Synced (has_synced) once the list is in the store and its keys in
            # the queues, even if a handler failed on it, as a watcher is.
            part.listed.add(namespace)

    def _apply_list(self, part: _Part, namespace: str | None, listing: StoreList,
                    first: bool) -> None:
        out_of_view = first and not part.replaced
        unchanged: set[ObjectKey] | None = None if out_of_view else set()
        # A part's list speaks for its own objects alone: those of the parts it
        # replaces are its own too; the others' are not in scope.
        # A new part's first list: nothing cached is its own (no filter took
        # its objects before it), so there is nothing to compare or remove.
        alone = all(p is part or p in part.replaced for p in self._parts.values())
        within = None if alone else nothing_cached if out_of_view else self._owned_by(part)
        vanished = self.store.replace(listing, namespace=namespace, unchanged=unchanged,
                                      within=within)
        for old in part.replaced:
            old.superseded.add(namespace)
        self._cache_objects.set(len(self.store))
        # As client-go: a (re)list is delivered whole. What changed while we were
        # not watching is unknown, and the queue deduplicates. The listed objects
        # are built one at a time: all of them at once would be the whole list
        # as dicts again, the peak the packed store exists to avoid.
        # Low: what the cache held as it is, and what was out of its view.
        if out_of_view:
            low, changed = listing, self.store.new_list()
        else:
            low, changed = listing.split(lambda obj: key_of(obj) in unchanged,
                                         fields=_KEY_FIELDS)
            if first:
                # Replacing parts that watched all along: nothing unchanged was missed.
                low = self.store.new_list()
        self._enqueue(itertools.chain(changed.objects(fields=self._mapped_fields), vanished))
        self._enqueue(low.objects(fields=self._listed_fields), priority=LOW_PRIORITY, listed=True)

    def _part_listed(self, part: _Part) -> None:
        """`part` has listed every namespace once: the parts it replaces go
        (their objects are its own now), and its listener is told."""
        with self._deliver_lock:
            with self._lock:
                replaced = [p for p in part.replaced if self._parts.get(p.id) is p]
                for old in replaced:
                    del self._parts[old.id]
            part.replaced = []
        for old in replaced:
            self._stop_part(old)
        if part.on_synced is not None:
            try:
                part.on_synced()
            except Exception:
                log.exception("%s: a part's sync listener failed", self)

    def _on_event(self, type_: str, obj: dict, part: _Part | None = None) -> None:
        part = part or self._sole_part()
        if part.keep is not None and not part.keep(obj):
            # Never in the cache: the filters depend only on the uid or the slot
            # label, which never change.
            self._dropped += 1
            return
        if type_ == "DELETED":
            old = self.store.delete(obj)
            self._cache_objects.set(len(self.store))
            self._enqueue((obj, old) if old is not None else (obj,))
            return
        change = self.store.upsert_if_changed(obj, fields=self._update_fields)
        self._cache_objects.set(len(self.store))
        if change is None:
            return      # only the resourceVersion moved: the handlers know this object
        # Map the old object too: when an ownerReference changes, both owners care.
        # The watch's copy of our own write does not bring back the key whose
        # reconcile wrote it (that reconcile has seen its answer); others learn of it.
        # A writer named otherwise than (queue, key) is no handler's: everyone hears.
        writer = change.echo_of
        skip = writer if isinstance(writer, tuple) and len(writer) == 2 else None
        if change.old is None:
            self._enqueue((change.new,), skip=skip)
        else:
            self._enqueue((change.new, change.old), skip=skip,
                          deaf=self._filtered_out(change.old, change.new))

    def _filtered_out(self, old: dict, new: dict) -> list[bool]:
        """Per handler: True when its update filter says this update is nothing to it."""
        deaf = []
        for *_, update_filter in self._handlers:
            try:
                deaf.append(update_filter is not None and not update_filter(old, new))
            except Exception:  # a broken filter must not lose the update: queue it
                log.exception("update filter %s failed",
                              getattr(update_filter, "__name__", update_filter))
                deaf.append(False)
        return deaf

    def _enqueue(self, objs: Iterable[dict], *, skip: tuple[object, ObjectKey] | None = None,
                 priority: int = 0, listed: bool = False,
                 deaf: list[bool] | None = None) -> None:
        """The keys the mappers find in `objs` to every handler's queue, each key
        once per queue; a queue with `add_many` (WorkQueue) takes them in one
        call: a relist's tens of thousands of keys cost one lock and one wake-up
        per queue instead of one each. `skip`: (queue, key) not to add.
        `priority` (not 0) goes to add_many(); a queue with add() alone gets plain adds.
        `listed`: a list's low keys, raised to LISTED_URGENT_PRIORITY for the
        objects a handler's `urgent` test is true of. `deaf`: per handler, True
        to queue nothing (its update filter said so)."""
        found: list[list[ObjectKey]] = [[] for _ in self._handlers]
        raised: list[list[ObjectKey]] = [[] for _ in self._handlers]
        deaf = deaf or [False] * len(self._handlers)
        for obj in objs:
            for (mapper, _, urgent, _), keys, up, off in zip(self._handlers, found, raised,
                                                              deaf):
                if off:
                    continue
                into = up if listed and urgent is not None and urgent(obj) else keys
                into.extend(self._keys(mapper, obj))
        for (_, queue, _, _), listed_keys, up in zip(self._handlers, found, raised):
            self._add_keys(queue, up, LISTED_URGENT_PRIORITY, None)
            self._add_keys(queue, listed_keys, priority, skip)

    @staticmethod
    def _add_keys(queue, listed: list[ObjectKey], priority: int,
                  skip: tuple[object, ObjectKey] | None) -> None:
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
            for part in self._parts.values():
                for ns in part.watchers:
                    self._start_thread_locked(part, ns)

    def stop(self) -> None:
        """Stop every watcher and wait briefly for its thread; idempotent."""
        self._stop.set()
        with self._lock:
            parts = list(self._parts.values())
        for part in parts:
            self._stop_part(part)

    def restart_if_dead(self) -> int:
        """For the supervisor: restart watcher threads that died; returns how many."""
        restarted = 0
        with self._lock:
            if not self._started or self._stop.is_set():
                return 0
            for part in self._parts.values():
                for ns, thread in part.threads.items():
                    if not thread.is_alive():
                        log.error("%s: watcher thread %s died; restarting it from %r", self,
                                  thread.name, part.watchers[ns].state)
                        self._start_thread_locked(part, ns)
                        restarted += 1
        return restarted

    def _start_thread_locked(self, part: _Part, ns: str | None) -> None:
        watcher = part.watchers[ns]
        name = f"informer-{self._label}-{ns or 'all'}" + (f"-{part.id}" if part.id else "")
        thread = threading.Thread(target=self._run_watcher, args=(part, ns),
                                  name=name, daemon=True)
        part.threads[ns] = thread
        thread.start()

    def _run_watcher(self, part: _Part, ns: str | None) -> None:
        watcher = part.watchers[ns]
        try:
            if part.gated and ns not in part.listed and not self._take_list_gate(part, ns):
                return                  # the part was stopped while it waited
            watcher.run(part.stop)
        except Exception:
            # The thread ends here; is_healthy() reports it and restart_if_dead()
            # resumes the watcher from its state (no relist).
            log.exception("%s: watcher thread crashed", watcher)
        finally:
            self._give_list_gate(part, ns)

    def _take_list_gate(self, part: _Part, ns: str | None) -> bool:
        """Wait for the list gate (False if `part` is stopped first). Only the
        watcher thread of (part, ns) takes or gives it for that pair."""
        assert self._list_gate is not None
        while not self._list_gate.acquire(timeout=_GATE_POLL_SECONDS):
            if part.stop.is_set():
                return False
        part.gate_held.add(ns)
        return True

    def _give_list_gate(self, part: _Part, ns: str | None) -> None:
        """After (part, ns)'s first list is delivered, or its thread ends."""
        if ns in part.gate_held:
            part.gate_held.discard(ns)
            assert self._list_gate is not None
            self._list_gate.release()

    # ---- health ----

    def has_synced(self) -> bool:
        """Every part has finished its first list (a part replacing others lists in
        the background: those it replaces are synced)."""
        with self._lock:
            parts = [part for part in self._parts.values() if not part.replaced]
        return all(part.listed >= self._scope_set for part in parts)

    def is_watching(self) -> bool:
        """Every watch is open (Watcher.is_watching): what the cache shows is at
        most the watch's delay behind the server. Synced is not enough: a cache
        whose watch is backing off after an outage shows the world as it was."""
        return all(w.is_watching for w in self.watchers)

    def stalls(self) -> int:
        """The most stall periods in a row, without progress, of any of this informer's watches."""
        return max((w.stalls for w in self.watchers), default=0)

    def is_healthy(self, *, now: float | None = None) -> tuple[bool, str]:
        now = self._clock() if now is None else now
        if not self._started:
            return False, "not started"
        problems = []
        with self._lock:
            watching = [(ns, part.threads.get(ns), watcher) for part in self._parts.values()
                        for ns, watcher in part.watchers.items()]
        for ns, thread, watcher in watching:
            where = ns or "all namespaces"
            if thread is None or not thread.is_alive():
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
