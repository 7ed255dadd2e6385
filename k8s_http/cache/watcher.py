"""List-watch's I/O loop: `Watcher` runs the rules of `watchstep` against the apiserver.

`watchstep.step(state, input) -> (actions, state)` decides; `Watcher` carries
out the actions (list, watch, deliver, sleep), turns what happens on the wire
into inputs, and feeds them back, one transition at a time, on its own thread.

Invariants:

* The state changes only to what `step` returned, and only once that
  transition's effects are done: an event's RV becomes the watcher's after the
  event has been handled, so a crash in between replays the event rather than
  losing it. Before any wait or I/O the state moves, and a list starts from an
  empty fresh set.
* One loop thread per Watcher runs `run()`; `stop()` may be called from any
  thread and only closes the open stream (`_stream_lock` guards it) and sets
  the stop event. Everything else is the loop thread's alone.
* A handler's exception (`on_event`, `on_sync`, `on_synced`) is logged with its
  traceback and counted in `handler_errors`; the loop goes on. Every list or
  watch failure is an input (`watchstep.failure`), never an exception out of
  `run()`.
* Liveness: `last_progress` moves on an event, a bookmark, a list or a clean
  reconnect; `last_retry` on a failure about to be retried; `stalls` is the
  state's count (see `watchstep`, and informer.py for /healthz).
* A watch asks for a random timeoutSeconds in [MIN_WATCH_TIMEOUT_SECONDS,
  MAX_WATCH_TIMEOUT_SECONDS), and is presumed dead after
  `stall_timeout_seconds` without a complete event (the client enforces it).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core.backoff import Backoff
from ..core.errors import ApiConnectionError, ApiError, K8sHttpError, ProtocolError
from ..core.objects import Resource
from ..ops.metrics import WATCH_EVENT_TYPES, Metrics
from ..wire.defaults import WATCH_STALL_TIMEOUT_SECONDS
from .store import Store, StoreList
from .watchstep import (INITIAL, INITIAL_STREAMING, Action, Closed, Collect, Deliver, Event,
                        Failed, FallBack, Input, List, Listed, ListError, Progress, Replace,
                        ReplaceCollected, Restart, Skip, Sleep, State, Streaming, StreamList,
                        Watch, Watching, failure, is_watching, resume, step)

if TYPE_CHECKING:
    from ..wire.client import ApiClient

__all__ = ["Watcher", "MIN_WATCH_TIMEOUT_SECONDS", "MAX_WATCH_TIMEOUT_SECONDS"]

log = logging.getLogger(__name__)

# client-go's reflector: a random watch timeout in [5, 10) minutes spreads the
# reconnects of many clients so they do not hit the apiserver together.
MIN_WATCH_TIMEOUT_SECONDS = 300
MAX_WATCH_TIMEOUT_SECONDS = 600


class Watcher:
    """Runs the state machine against the apiserver for one resource (and namespace).

    `on_sync(items)` is called after every (re)list with the whole fresh set: it
    replaces the cache, and what vanished from it is its business (nothing comes
    back to the watcher); `on_event(type, obj)` gets ADDED / MODIFIED / DELETED.
    `store`: the Store the lists are for. A list's items go into a StoreList of
    it one by one as they arrive (Store.new_list), so a long list is never held
    as dicts, and a store that drops managedFields gets watch events decoded
    without them. Without one, the fresh set is a plain list of dicts.
    Both run on the watcher's thread; an exception in either is logged with its
    traceback, counted in `handler_errors`, and the loop goes on.

    `streaming_list`: list by streaming (see watchstep's docstring) until the
    apiserver shows it does not offer it; False: paged lists only.
    `on_synced()` is called after each (re)list once `has_synced` is True.
    """

    def __init__(self, client: ApiClient, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 on_sync: Callable[[list], list], on_event: Callable[[str, dict], None],
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random,
                 stall_timeout_seconds: float = WATCH_STALL_TIMEOUT_SECONDS, page_size: int = 500,
                 backoff: Backoff | None = None,
                 store: Store | None = None,
                 streaming_list: bool = True,
                 on_synced: Callable[[], None] | None = None,
                 shard_selector: str | None = None):
        self._client = client
        # KEP-5866's shardSelector, on lists and watches alike (sharding.py).
        self._shard = {"shard_selector": shard_selector} if shard_selector else {}
        # Watches ask for objects without managedFields when the store drops them.
        self._skip_managed_fields = store is not None and store.drops_managed_fields
        self._on_synced = on_synced
        # A fresh set for a list: filled page by page or event by event.
        self._new_list: Callable[[], StoreList | list] = \
            store.new_list if store is not None else list
        self._resource = resource
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._on_sync = on_sync
        self._on_event = on_event
        self._metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._rng = rng
        self._stall_timeout_seconds = stall_timeout_seconds
        self._page_size = page_size
        self._backoff = backoff if backoff is not None else Backoff(clock=clock, rng=rng)
        # Its series are pre-set once per resource by the Informer, which owns the
        # label for all of its watchers (one per namespace).
        self._label = str(resource)

        self._state: State = INITIAL_STREAMING if streaming_list else INITIAL
        # The initial objects of the streaming list in progress (in the store's
        # form as they arrive); meaningful only while the state is Streaming,
        # emptied when it is swapped into the cache or abandoned.
        self._collected = self._new_list()
        # This watcher's counts of watch_events_total by event type; only this
        # watcher's loop adds to it (see metrics.TalliedCounter).
        self._event_counts = self._metrics.watch_events_total.tally(
            self._label, keys=WATCH_EVENT_TYPES)
        self.has_synced = False
        # Liveness: last_progress moves on an event, a bookmark, a list or a clean
        # reconnect; last_retry on a failure the loop is about to retry.
        self.last_progress = clock()          # a fresh watcher gets a full deadline
        self.last_retry = float("-inf")       # clock() of the last failure being retried
        self.watch_timeout_seconds = MAX_WATCH_TIMEOUT_SECONDS   # of the current watch
        self.handler_errors = 0

        # The open stream, shared with stop() on another thread.
        self._stream_lock = threading.Lock()
        self._stream = None                   # guarded by _stream_lock
        self._events = None                   # iterator over _stream; loop thread only
        self._stop_event: threading.Event | None = None
        self._stopping = False                # guarded by _stream_lock

    @property
    def resource_version(self) -> str:
        """The RV of the last fully processed event (or list); "" before the first list."""
        return self._state.resource_version

    @property
    def state(self) -> State:
        return self._state

    @property
    def is_watching(self) -> bool:
        """watchstep.is_watching of the current state."""
        return is_watching(self._state)

    @property
    def stalls(self) -> int:
        """Stall periods in a row without progress (0 while listing: a list clears it)."""
        state = self._state
        return state.stalls if isinstance(state, (Watching, Streaming)) else 0

    def __repr__(self) -> str:
        where = self._namespace or "all namespaces"
        return f"<Watcher {self._label} in {where} {self._state!r}>"

    # ---- running ----

    def run(self, stop: threading.Event) -> None:
        """List, then watch, until `stop` is set. Resumes from the current state."""
        with self._stream_lock:
            self._stop_event = stop
            self._stopping = False
        try:
            actions = resume(self._state)
            next_state = self._state
            while True:
                inp = self._perform(actions, next_state, stop)
                # Drop the transition (and the error a Restart carries) before
                # blocking on the wire: an exception keeps its traceback's frames
                # and their buffers alive, here for the whole next watch.
                actions = None
                if stop.is_set():
                    return
                if inp is None:
                    inp = self._read()
                    if stop.is_set():
                        return
                actions, next_state = step(self._state, inp)
        finally:
            self._close_stream()

    def stop(self) -> None:
        """Make run() return soon; safe from any thread. Closes the open stream.

        A list in flight is not interrupted: it ends within the transport's
        request deadline, and run() returns right after it.
        """
        with self._stream_lock:
            self._stopping = True
            if self._stop_event is not None:
                self._stop_event.set()
            stream = self._stream
        if stream is not None:
            _close_quietly(stream)

    def _perform(self, actions: list[Action], next_state: State,
                 stop: threading.Event) -> Input | None:
        """Carry out one transition's actions, adopting `next_state` once its effects are done.

        Returns the input an I/O action produced. The state moves only after the
        deliveries: the RV an event carries becomes ours once the event has been
        handled, so a crash in between replays the event rather than losing it.
        Effects come first in every action list, then Sleep, then the I/O.
        """
        for action in actions:
            # The state moves before any wait or I/O (Sleep, List, Watch, StreamList),
            # and a list starts afresh: a partial set is dropped before it.
            # The cases of every event come first: they are nearly all of them.
            match action:
                case Collect(object=obj):
                    self._collected.append(obj)
                    self.last_progress = self._clock()
                case Progress():
                    self.last_progress = self._clock()
                case Deliver(type=type_, object=obj):
                    self._deliver(type_, obj)
                case Replace(items=items):
                    self._replace(items)
                case ReplaceCollected():
                    items, self._collected = self._collected, self._new_list()
                    self._replace(items)
                case FallBack(reason=reason, error=error):
                    self._collected = self._new_list()
                    self._fell_back(reason, error)
                case Restart(reason=reason, error=error):
                    if reason != "timeout":
                        self.last_retry = self._clock()
                    self._restarted(reason, error)
                case ListError(reason=reason, error=error):
                    self.last_retry = self._clock()
                    self._list_failed(reason, error)
                case Skip(kind=kind):
                    self._metrics.watch_decode_errors_total.labels(self._label, kind).inc()
                case Sleep():
                    self._state, self._collected = next_state, self._new_list()
                    delay = self._backoff.next_delay()
                    log.debug("%s: backing off %.1f s", self, delay)
                    stop.wait(delay)
                case List(resource_version=rv):
                    self._state, self._collected = next_state, self._new_list()
                    return None if stop.is_set() else self._list(rv)
                case Watch(resource_version=rv):
                    self._state = next_state
                    return None if stop.is_set() else self._open_watch(rv)
                case StreamList(resource_version=rv):
                    self._state, self._collected = next_state, self._new_list()
                    if stop.is_set():
                        return None
                    self._metrics.informer_relists_total.labels(self._label).inc()
                    return self._open_watch(rv, send_initial_events=True)
        self._state = next_state
        return None

    # ---- I/O ----

    def _list(self, rv: str) -> Input:
        self._close_stream()
        self._metrics.informer_relists_total.labels(self._label).inc()
        # RV "": a paged consistent read from etcd. Any other RV: one unpaged request,
        # as client-go's reflector does. Without `limit` a non-zero RV means "not older
        # than" (with `limit` it would mean "exactly", and 410 far more often), and the
        # apiserver serves it from its watch cache instead of etcd: a herd of clients
        # relisting after an apiserver restart does not land on etcd.
        try:
            result = self._client.list(
                self._resource, namespace=self._namespace, label_selector=self._label_selector,
                field_selector=self._field_selector,
                limit=self._page_size if not rv else None, resource_version=rv or None,
                into=self._new_list, **self._shard)
        except Exception as err:  # every failure is an input; the table decides
            return failure(err)
        meta = result.get("metadata") if isinstance(result, dict) else None
        items = result.get("items") if isinstance(result, dict) else None
        if not isinstance(items, (list, StoreList)) or not isinstance(meta, dict):
            return Failed("protocol", ProtocolError("list response is not a list"))
        return Listed(items, meta.get("resourceVersion"))

    def _open_watch(self, rv: str, *, send_initial_events: bool = False) -> Input | None:
        """Open a watch from `rv` (with `send_initial_events`: a streaming list, RV
        "" meaning the current state); None once it is open, else the failure."""
        self._close_stream()
        span = MAX_WATCH_TIMEOUT_SECONDS - MIN_WATCH_TIMEOUT_SECONDS
        self.watch_timeout_seconds = MIN_WATCH_TIMEOUT_SECONDS + int(self._rng() * span)
        try:
            stream = self._client.watch(
                self._resource, namespace=self._namespace, label_selector=self._label_selector,
                field_selector=self._field_selector, resource_version=rv or None,
                allow_bookmarks=True, timeout_seconds=self.watch_timeout_seconds,
                stall_timeout_seconds=self._stall_timeout_seconds,
                **({"send_initial_events": True} if send_initial_events else {}),
                **({"skip_managed_fields": True} if self._skip_managed_fields else {}),
                **self._shard)
        except Exception as err:
            inp = failure(err)
            if inp.reason == "stall":
                # No connection or no response headers in time: an apiserver we
                # cannot reach, which a restart does not cure. "stall" is kept for
                # an open watch that goes silent (the only kind that counts toward
                # liveness).
                inp = Failed("disconnect", err)
            return inp
        with self._stream_lock:
            self._stream = stream
            stopping = self._stopping
        if stopping:                       # stop() ran while we were connecting
            self._close_stream()
            return None
        try:
            self._events = iter(stream)
        except Exception as err:
            self._close_stream()
            return failure(err)
        return None

    def _read(self) -> Input:
        """The next input from the open watch."""
        if self._events is None:
            return Failed("disconnect", ApiConnectionError("no open watch"))
        try:
            event = next(self._events)
        except StopIteration:
            self._close_stream()
            return Closed()
        except Exception as err:
            if isinstance(err, ApiError):      # an ERROR event, raised by the stream
                self._event_counts["ERROR"] += 1
            self._close_stream()
            return failure(err)
        if type(event) is not Event:     # not from our decoder: a test's or a wrapper's stream
            event = Event(str(getattr(event, "type", None)), getattr(event, "object", None))
        counts = self._event_counts
        type_ = event.type
        if type_ in counts:
            counts[type_] += 1
        else:                            # an unknown type: counted under its name, as before
            counts[type_] = 1
        return event

    def _close_stream(self) -> None:
        with self._stream_lock:
            stream, self._stream = self._stream, None
        self._events = None
        if stream is not None:
            skipped = getattr(stream, "skipped", 0)
            if isinstance(skipped, int) and skipped > 0:
                self._metrics.watch_decode_errors_total.labels(self._label, "skipped").inc(skipped)
            _close_quietly(stream)

    # ---- effects ----

    def _deliver(self, type_: str, obj: dict) -> None:
        try:
            self._on_event(type_, obj)
        except Exception:
            self.handler_errors += 1
            log.exception("%s: event handler failed on %s %s; going on", self, type_,
                          _name_of(obj))

    def _replace(self, items: list) -> None:
        try:
            self._on_sync(items)
        except Exception:
            self.handler_errors += 1
            log.exception("%s: sync handler failed on a list of %d; going on", self, len(items))
        self.has_synced = True
        log.debug("%s: listed %d objects", self, len(items))
        if self._on_synced is not None:
            try:
                self._on_synced()
            except Exception:
                self.handler_errors += 1
                log.exception("%s: synced handler failed; going on", self)

    def _fell_back(self, reason: str, error: BaseException | None) -> None:
        self.last_retry = self._clock()
        log.warning("%s: the apiserver does not offer streaming lists (%s%s); listing page "
                    "by page from now on", self, reason, f": {error}" if error else "")

    def _restarted(self, reason: str, error: BaseException | None) -> None:
        self._metrics.watch_restarts_total.labels(self._label, reason).inc()
        if reason == "protocol" and error is not None:
            kind = getattr(error, "kind", None) or "framing"
            self._metrics.watch_decode_errors_total.labels(self._label, kind).inc()
        if reason == "timeout":
            log.debug("%s: watch ended at its timeout; re-watching", self)
        elif error is not None and not isinstance(error, K8sHttpError):
            log.warning("%s: watch failed unexpectedly (%s); re-watching", self, reason,
                        exc_info=error)
        elif reason in ("gone", "too_large_rv"):
            log.info("%s: watch expired (%s: %s); relisting", self, reason, error)
        elif reason == "disconnect":
            log.info("%s: watch dropped (%s); re-watching", self, error)
        else:
            log.warning("%s: watch restarting (%s: %s)", self, reason, error)

    def _list_failed(self, reason: str, error: BaseException | None) -> None:
        if error is not None and not isinstance(error, K8sHttpError):
            log.warning("%s: list failed unexpectedly", self, exc_info=error)
        else:
            log.warning("%s: list failed (%s: %s)", self, reason, error)


def _close_quietly(stream) -> None:
    try:
        stream.close()
    except Exception:
        log.debug("closing a watch stream failed", exc_info=True)


def _name_of(obj: object) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "?"
    ns, name = meta.get("namespace"), meta.get("name")
    return f"{ns}/{name}" if ns else str(name)
