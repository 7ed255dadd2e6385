"""core/v1 Events about the objects a controller reconciles, rate-limited per object.

Events are for people running `kubectl describe`: what happened and why,
never a log of every reconcile. A failing object must not be able to flood the
apiserver with them, hence the per-object token bucket and de-duplication.
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from typing import Callable

from ..core.errors import is_namespace_terminating
from ..core.objects import EVENTS, ObjectKey, rfc3339_now

__all__ = ["EventRecorder"]

log = logging.getLogger(__name__)


class EventRecorder:
    """Creates core/v1 Events about objects, so that a failing object cannot flood the apiserver.

    Per object (namespace/name): a token bucket of BURST events refilled at one
    per REFILL_SECONDS, and an identical (type, reason, message) is dropped
    within DEDUPE_SECONDS of the last one sent. (client-go's recorder instead
    patches `count` on the existing Event; creating only keeps RBAC at
    `events: create`, and a repeat within 5 minutes tells the reader nothing new.)

    Best effort, as in client-go: a failure to create an Event is logged and
    never fails the reconcile that reported it.

    `asynchronous=True` posts Events from one sender thread, started on the
    first Event, as client-go's broadcaster does from its goroutine: a reconcile
    that reports a change does not wait for the apiserver to store the Event
    (under a burst that was one request in four of a new object's reconcile).
    The outbox holds at most OUTBOX_LIMIT Events; beyond that new ones are
    dropped and counted, never blocking a worker. `close()` sends what is queued
    (bounded by a timeout) and stops the thread. Synchronous by default, so a
    caller sees the Event created when `event()` returns.
    """

    BURST = 5
    REFILL_SECONDS = 30.0
    DEDUPE_SECONDS = 300.0
    # Per-object state idle long enough is forgotten once more than this many
    # objects are tracked (see _admit for when).
    PRUNE_ABOVE = 1024
    MAX_MESSAGE_CHARS = 1024
    OUTBOX_LIMIT = 1000

    def __init__(self, client, *, component: str, instance: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_time: Callable[[], str] = rfc3339_now,
                 time_ns: Callable[[], int] = time.time_ns,
                 asynchronous: bool = False):
        self.client = client
        self.component = component
        self.instance = (instance or socket.gethostname())[:128]
        self._clock = clock
        self._wall_time = wall_time
        self._time_ns = time_ns
        self._lock = threading.Lock()
        # key -> [tokens, last refill time, {(type, reason, message): last sent}]
        self._state: dict[ObjectKey, list] = {}
        # _state is pruned when it grows past this: PRUNE_ABOVE, or twice what
        # the last prune kept. A prune walks every entry, so pruning at every
        # Event above PRUNE_ABOVE made each Event cost O(objects) while all of
        # them were recent (a burst of 1,000 new objects: a tenth of the
        # operator's CPU). Doubling keeps it O(1) per Event on average, and
        # _state at most about twice the objects with recent Events.
        self._prune_above = self.PRUNE_ABOVE
        self.sent = 0
        self.dropped = 0
        self._asynchronous = asynchronous
        # Asynchronous mode: Events waiting for the sender thread, and the thread.
        # Invariant (under _outbox_ready's lock): _busy counts Events taken from the
        # outbox whose request has not finished; the outbox is drained when both are 0.
        self._outbox: collections.deque = collections.deque()
        self._outbox_ready = threading.Condition()
        self._busy = 0
        self._closing = False
        self._sender: threading.Thread | None = None

    def _admit(self, key: ObjectKey, signature: tuple) -> bool:
        now = self._clock()
        with self._lock:
            if len(self._state) > self._prune_above:
                self._prune(now)
                self._prune_above = max(self.PRUNE_ABOVE, 2 * len(self._state))
            state = self._state.setdefault(key, [float(self.BURST), now, {}])
            tokens, last, recent = state
            tokens = min(float(self.BURST), tokens + (now - last) / self.REFILL_SECONDS)
            state[0], state[1] = tokens, now
            for sig, at in list(recent.items()):
                if now - at >= self.DEDUPE_SECONDS:
                    del recent[sig]
            if signature in recent or tokens < 1.0:
                self.dropped += 1
                return False
            state[0] = tokens - 1.0
            recent[signature] = now
            return True

    def _prune(self, now: float) -> None:
        for key, (_, last, recent) in list(self._state.items()):
            if now - last >= self.DEDUPE_SECONDS and not recent:
                del self._state[key]
            elif now - last >= max(self.DEDUPE_SECONDS, self.BURST * self.REFILL_SECONDS):
                del self._state[key]

    def forget(self, key: ObjectKey) -> None:
        with self._lock:
            self._state.pop(key, None)

    def event(self, obj: dict, type_: str, reason: str, message: str) -> bool:
        """Record an event about `obj` (Normal or Warning); True if one was sent
        (asynchronous: queued for sending)."""
        meta = obj.get("metadata") or {}
        key = ObjectKey(meta.get("namespace") or "", meta.get("name") or "")
        message = message[:self.MAX_MESSAGE_CHARS]
        if not self._admit(key, (type_, reason, message)):
            log.debug("event dropped by the rate limit", extra={"reason": reason, "key": str(key)})
            return False
        now = self._wall_time()
        namespace = meta.get("namespace") or "default"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            # client-go's naming: the object's name and the time in hex nanoseconds.
            "metadata": {"name": f"{meta.get('name')}.{self._time_ns():x}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        if self._asynchronous:
            return self._enqueue(event)
        return self._send(event)

    def _send(self, event: dict) -> bool:
        try:
            self.client.create(EVENTS, event, namespace=event["metadata"]["namespace"])
        except Exception as err:  # best effort: never fail a reconcile over an event
            involved = event["involvedObject"]
            if is_namespace_terminating(err):
                # Nothing can be created in a namespace being deleted: futile, not a fault.
                log.info("not recording event %s on %s/%s: namespace %s is being deleted",
                         event["reason"], involved.get("namespace"), involved.get("name"),
                         involved.get("namespace"))
            else:
                log.warning("could not record event %s on %s/%s", event["reason"],
                            involved.get("namespace"), involved.get("name"),
                            extra={"error": str(err)})
            return False
        self.sent += 1
        return True

    # ---- asynchronous sending ------------------------------------------------

    def _enqueue(self, event: dict) -> bool:
        with self._outbox_ready:
            if self._closing or len(self._outbox) >= self.OUTBOX_LIMIT:
                self.dropped += 1
                log.warning("event %s dropped: %s", event["reason"],
                            "the recorder is closed" if self._closing else "too many unsent events")
                return False
            self._outbox.append(event)
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                                name="event-sender")
                self._sender.start()
            self._outbox_ready.notify_all()
            return True

    def _send_loop(self) -> None:
        while True:
            with self._outbox_ready:
                while not self._outbox and not self._closing:
                    self._outbox_ready.wait()
                if not self._outbox:
                    return                          # closing, and everything was sent
                event = self._outbox.popleft()
                self._busy += 1
            try:
                self._send(event)
            finally:
                with self._outbox_ready:
                    self._busy -= 1
                    self._outbox_ready.notify_all()

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Wait until every queued Event was sent (or failed); False on timeout."""
        deadline = time.monotonic() + timeout_seconds
        with self._outbox_ready:
            while self._outbox or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._outbox_ready.wait(left)
            return True

    def close(self, timeout_seconds: float = 5.0) -> None:
        """Send what is queued (for at most `timeout_seconds`), then stop the sender;
        later Events are dropped. What is still queued at the timeout is dropped."""
        drained = self.flush(timeout_seconds)
        with self._outbox_ready:
            self._closing = True
            if not drained:
                self.dropped += len(self._outbox)
                log.warning("%d events not sent at shutdown", len(self._outbox))
                self._outbox.clear()
            self._outbox_ready.notify_all()
            sender = self._sender
        if sender is not None:
            sender.join(timeout=1.0)
