"""The work queue between event handlers and reconcile workers (client-go's workqueue).

Three layers, each a small class adding one idea to the one below, client-go
style. They are subclasses rather than wrappers so that the three share one
lock and one condition variable, and no timer thread is needed:

- `_Queue`: deduplication and the processing set. A key is queued at most
  once however often it is added, and never handed to two workers at once.
  Keys given a priority (`add_after(..., priority=1)`) wait in a line that
  `get()` serves first; keys added at a negative priority (a list's keys: the
  informer's LISTED_URGENT_PRIORITY for objects awaiting their reconcile,
  LOW_PRIORITY for the others) in a line it serves last, highest priority
  first and FIFO within one, and any add at priority >= 0 of a key waiting
  there moves it up (controller-runtime's priority queue).
- `_DelayingQueue`: `add_after()`. Delayed keys wait in a heap; `get()` moves
  the due ones into the queue, checking against the injected clock, and sleeps
  on the condition at most until the next one is due. A delayed add with a
  priority is dropped once the key is handed out before it is due.
- `WorkQueue`: `add_rate_limited()` / `forget()` / `num_requeues()`: retries
  with per-key exponential backoff under an overall budget.

Time: the injected `clock` decides when delayed keys are due and what the
metrics measure, so a unit test drives time with a fake clock: advance it,
then `get(timeout_seconds=0)` (or `wake()` a blocked getter). The bounds on
real waits (`get(timeout_seconds=)`, `shutdown(timeout_seconds=)`) are
measured on the real monotonic clock, so a fake clock cannot make them hang.

Metrics (controller-runtime v0.24's names, labels ``(name, name)``, and
``priority="0"`` on depth, which counts the keys of every line: controller-runtime
would split the low ones into ``priority="-100"``, and one series keeps the
alerts' and dashboards' queries whole): depth, adds, retries, queue and work duration are
updated as things happen. `workqueue_retries_total` counts what client-go's
delaying queue counts: every `add_after()` (a `requeue_after` result included)
and every `add_rate_limited()` made before shutdown. The two "work in
progress" gauges (unfinished_work_seconds, longest_running_processor_seconds)
are computed when Prometheus scrapes (`Gauge.set_function`), so no thread has
to refresh them and they are never stale.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from typing import Callable, Hashable, Iterable

from ..core.backoff import RateLimiter, default_controller_rate_limiter
from ..ops.metrics import Metrics

__all__ = ["ShutDownError", "WorkQueue"]

logger = logging.getLogger(__name__)

# Real time, for bounding real waits; never used for scheduling or metrics.
_real_monotonic = time.monotonic

# The low line is compacted once its stale entries outnumber its live ones by this.
_LOW_LINE_SLACK = 64


class ShutDownError(Exception):
    """The queue is shut down.

    The queue itself never raises it: adds after `shutdown()` are dropped
    (event handlers keep firing while a manager stops) and `get()` reports the
    end as ``(None, True)``. Callers that prefer an exception raise this one.
    """


class _Queue:
    """Layer 1: a FIFO of keys with deduplication and a processing set."""

    def __init__(self, name: str, *, metrics: Metrics | None, clock: Callable[[], float]):
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        # get() waits on _ready (a key was queued, a delayed key may be due, or
        # shutdown); shutdown(drain=True) waits on _idle (processing emptied).
        self._ready = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)

        # Invariants (all state is guarded by _lock):
        #   key in _queue  <=>  key in _dirty and key not in _processing
        #     so a key is queued at most once, and never while a worker holds it.
        #   key in _processing: handed out by get(), done() not called yet.
        #   key in _dirty and in _processing: added again while being processed;
        #     done() queues it again, so the change is seen by a later reconcile
        #     and still no two workers ever hold the key together.
        #   _added_at: key in _dirty -> clock() of the add that dirtied it.
        #   _started_at: key in _processing -> clock() of the get() that handed it out.
        #   _queued_for: key in _processing -> seconds it waited in the queue.
        #   Three lines, served in order: _first (keys with a priority), _queue,
        #   _low_line; a queued key is in exactly one. _priority: key -> priority
        #   (> 0) promised by add_after(); until the key is next handed out, any add
        #   of it -- the delayed one or an event's -- lines it up in _first
        #   (controller-runtime's priority queue: the highest priority and the
        #   earliest time win).
        #   _low: key -> (-priority, seq), for the keys in _dirty whose every add
        #     since they were dirtied was low (priority < 0; the first add's
        #     priority is kept); lining one up with a _priority drops it from
        #     _low. Such a key, when not processing, is queued in _low_line, a
        #     heap of entries (-priority, seq, key): the highest priority, then
        #     the earliest, on top. An entry is live iff _low.get(key) == its
        #     first two fields. An add at priority >= 0 raises the key in O(1):
        #     it leaves _low (its entry goes stale, skipped when reached) and
        #     joins _queue. _low_line's top is live or the line is empty; only a
        #     raise makes a stale entry, and it compacts the line once they
        #     outnumber the live ones by _LOW_LINE_SLACK; _low_queued counts the
        #     live ones (the depth without a scan).
        self._first: deque[Hashable] = deque()
        self._priority: dict[Hashable, int] = {}
        self._low: dict[Hashable, tuple[int, int]] = {}
        self._low_line: list[tuple[int, int, Hashable]] = []
        self._low_queued = 0
        self._low_seq = itertools.count()
        self._queued_for: dict[Hashable, float] = {}
        self._queue: deque[Hashable] = deque()
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._added_at: dict[Hashable, float] = {}
        self._started_at: dict[Hashable, float] = {}
        self._shutting_down = False

        self.metrics = metrics if metrics is not None else Metrics()
        m, labels = self.metrics, (name, name)
        m.init_workqueue(name)
        self._m_depth = m.workqueue_depth.labels(*labels, "0")
        self._m_adds = m.workqueue_adds_total.labels(*labels)
        self._m_retries = m.workqueue_retries_total.labels(*labels)
        self._m_queue_duration = m.workqueue_queue_duration_seconds.labels(*labels)
        self._m_work_duration = m.workqueue_work_duration_seconds.labels(*labels)
        # A weak reference: the registry outliving the queue must not keep it alive.
        ref = weakref.ref(self)
        m.workqueue_unfinished_work_seconds.labels(*labels).set_function(
            lambda: _unfinished(ref)[0])
        m.workqueue_longest_running_processor_seconds.labels(*labels).set_function(
            lambda: _unfinished(ref)[1])

    # -- public -------------------------------------------------------------

    def add(self, key: Hashable, *, priority: int = 0) -> None:
        """Queue `key` unless it is already queued. Ignored after shutdown().

        `priority` < 0 (low: the informer's LOW_PRIORITY): behind every key
        added at priority >= 0, FIFO among the low ones. Adding a queued low key at priority >= 0 moves
        it to the back of the ordinary line; adding a queued key low changes nothing.
        """
        with self._lock:
            if not self._shutting_down:
                self._add_locked(key, self._clock(), priority=priority)

    def add_many(self, keys: Iterable[Hashable], *, priority: int = 0) -> None:
        """add() each of `keys`, holding the lock once: a relist queues thousands of
        keys at once, and a lock, a depth update and a wake-up per key were most of
        their cost. As many getters are woken as keys were added (a watch event's
        one key wakes one worker, not all of them to find one key); get()'s hand-off
        wakes the next while keys are left."""
        with self._lock:
            if self._shutting_down:
                return
            now = self._clock()
            added = 0
            for key in keys:
                added += self._add_locked(key, now, False, priority)   # positional: a hot loop
            if added:
                self._m_adds.inc(added)
                self._m_depth.set(self._depth_locked())
                self._ready.notify(added)

    def get(self, timeout_seconds: float | None = None) -> tuple[Hashable | None, bool]:
        """Take the next key: ``(key, False)``.

        Blocks until a key is ready, or `timeout_seconds` (real time) passed:
        ``(None, False)``. After shutdown() the keys still queued are handed
        out as usual; once none is left: ``(None, True)``. The caller must call
        done(key) when it has finished with the key.
        """
        deadline = None if timeout_seconds is None else _real_monotonic() + timeout_seconds
        with self._lock:
            while True:
                now = self._clock()
                self._promote_due_locked(now)
                if self._first or self._queue or self._low_line:
                    break
                if self._shutting_down:
                    return None, True
                wait = self._seconds_to_next_due_locked(now)
                if deadline is not None:
                    remaining = deadline - _real_monotonic()
                    if remaining <= 0:
                        return None, False
                    wait = remaining if wait is None else min(wait, remaining)
                self._ready.wait(wait)

            if self._first:
                key = self._first.popleft()
            elif self._queue:
                key = self._queue.popleft()
            else:
                key = heapq.heappop(self._low_line)[2]      # the top is live
                del self._low[key]
                self._low_queued -= 1
                self._drop_stale_low_locked()
            self._priority.pop(key, None)
            self._handed_out_locked(key)
            self._m_depth.set(self._depth_locked())
            self._dirty.discard(key)
            self._processing.add(key)
            waited = max(0.0, now - self._added_at.pop(key, now))
            self._m_queue_duration.observe(waited)
            self._queued_for[key] = waited
            self._started_at[key] = now
            # Hand-off: keys are left, or a delayed key needs a getter watching
            # the clock for it: wake one more getter to look. (Promotion and
            # add_after() notify too; this keeps the "someone watches the
            # heap" invariant whatever order notify() picks waiters in.)
            if self._first or self._queue or self._low_line or self._has_delayed_locked():
                self._ready.notify()
            return key, False

    def queued_seconds(self, key: Hashable) -> float | None:
        """How long `key`, being processed now, waited in the queue; None if not processing."""
        with self._lock:
            return self._queued_for.get(key)

    def done(self, key: Hashable) -> None:
        """The worker has finished with `key`; queue it again if it was added meanwhile."""
        with self._lock:
            if key not in self._processing:
                return          # tolerated, as client-go does: done() twice is a no-op
            self._processing.discard(key)
            self._queued_for.pop(key, None)
            started = self._started_at.pop(key)
            self._m_work_duration.observe(max(0.0, self._clock() - started))
            if key in self._dirty:
                self._line_up_locked(key)
            if not self._processing:
                self._idle.notify_all()

    def shutdown(self, *, drain: bool = True, timeout_seconds: float = 30.0) -> None:
        """Stop accepting keys; make get() return ``(None, True)`` once the queue is empty.

        Keys already queued (or added while being processed) are still handed
        out; delayed keys that are due now are queued first, the ones not due
        yet are dropped. With `drain`, wait (at most `timeout_seconds`, real
        time) until no key is being processed.
        """
        with self._lock:
            self._promote_due_locked(self._clock())
            dropped = self._drop_delayed_locked()
            if dropped:
                logger.debug("work queue %s: shutdown dropped %d delayed keys", self.name, dropped)
            self._shutting_down = True
            self._ready.notify_all()
            if not drain:
                return
            deadline = _real_monotonic() + timeout_seconds
            while self._processing:
                remaining = deadline - _real_monotonic()
                if remaining <= 0:
                    logger.warning("work queue %s: %d keys still processing after %.1f s",
                                   self.name, len(self._processing), timeout_seconds)
                    return
                self._idle.wait(remaining)

    def wake(self) -> None:
        """Make blocked getters look at the clock again (after a fake clock moved)."""
        with self._lock:
            self._ready.notify_all()

    def unfinished_work(self) -> tuple[float, float]:
        """(total, longest) seconds spent so far by the keys being processed now."""
        with self._lock:
            now = self._clock()
            ages = [max(0.0, now - started) for started in self._started_at.values()]
        return sum(ages), max(ages, default=0.0)

    def update_unfinished_metrics(self) -> None:
        """Nothing to do: the in-progress gauges are computed at scrape time.

        Kept so a supervisor written for client-go's periodic refresh can call it.
        """

    def __len__(self) -> int:
        """Keys ready to be handed out (the depth metric); not the delayed ones."""
        with self._lock:
            return self._depth_locked()

    # -- internals ----------------------------------------------------------

    def _add_locked(self, key: Hashable, now: float, wake: bool = True,
                    priority: int = 0) -> bool:
        """Whether `key` was added (not already queued). `wake=False`: the caller
        counts the adds, updates the depth and wakes a getter itself."""
        if key in self._dirty:      # already queued, or queued again at done()
            if priority >= 0 and self._low and key in self._low:
                if key in self._processing:
                    del self._low[key]          # done() lines it up in _queue
                else:
                    self._unlow_locked(key)
                    self._line_up_locked(key, wake=wake)
            return False
        self._dirty.add(key)
        self._added_at[key] = now
        if priority < 0:
            self._low[key] = (-priority, next(self._low_seq))
        if wake:
            self._m_adds.inc()
        if key not in self._processing:     # else done() queues it: never two workers on one key
            self._line_up_locked(key, wake=wake)
        return True

    def _line_up_locked(self, key: Hashable, *, wake: bool = True) -> None:
        if key in self._priority:
            self._low.pop(key, None)
            self._first.append(key)
        elif self._low and key in self._low:
            heapq.heappush(self._low_line, (*self._low[key], key))
            self._low_queued += 1
        else:
            self._queue.append(key)
        if wake:
            self._m_depth.set(self._depth_locked())
            self._ready.notify()

    def _prioritise_locked(self, key: Hashable, priority: int) -> None:
        """Promise `key` a place in the first line until it is next handed out."""
        if priority <= 0:
            return
        self._priority[key] = max(priority, self._priority.get(key, 0))
        if key in self._dirty and key not in self._processing and key not in self._first:
            if key in self._low:
                self._unlow_locked(key)
            else:
                self._queue.remove(key)      # O(depth), only when a queued key gains priority
            self._first.append(key)

    def _unlow_locked(self, key: Hashable) -> None:
        """Take queued `key` out of the low line: its entry goes stale."""
        del self._low[key]
        self._low_queued -= 1
        self._drop_stale_low_locked()
        line = self._low_line
        if len(line) > 2 * self._low_queued + _LOW_LINE_SLACK:     # amortised O(1)
            self._low_line = [e for e in line if self._low.get(e[2]) == e[:2]]
            heapq.heapify(self._low_line)

    def _drop_stale_low_locked(self) -> None:
        line, low = self._low_line, self._low
        while line and low.get(line[0][2]) != line[0][:2]:
            heapq.heappop(line)

    def _depth_locked(self) -> int:
        return len(self._first) + len(self._queue) + self._low_queued

    # Hooks for the delaying layer: this layer has no delayed keys.
    def _handed_out_locked(self, key: Hashable) -> None:
        pass

    def _promote_due_locked(self, now: float) -> None:
        pass

    def _seconds_to_next_due_locked(self, now: float) -> float | None:
        return None

    def _has_delayed_locked(self) -> bool:
        return False

    def _drop_delayed_locked(self) -> int:
        return 0


def _unfinished(ref: "weakref.ref[_Queue]") -> tuple[float, float]:
    queue = ref()
    return (0.0, 0.0) if queue is None else queue.unfinished_work()


class _DelayingQueue(_Queue):
    """Layer 2: `add_after()`, a heap of keys waiting for their due time."""

    def __init__(self, name: str, *, metrics: Metrics | None, clock: Callable[[], float]):
        super().__init__(name, metrics=metrics, clock=clock)
        # Invariants (guarded by _lock):
        #   _waiting: key -> (due, seq) of the key's one live entry in _heap; a
        #     key waits at most once, and a second add_after() keeps the earlier
        #     due time. Entries in _heap whose (due, seq) is not the key's
        #     _waiting value are stale (superseded) and skipped when popped.
        #   A waiting key may also be queued or processing: add() does not
        #     cancel a pending add_after() (client-go semantics). When it comes
        #     due it is an ordinary add(), deduplicated by _dirty.
        #   _promised: the waiting keys whose every pending add_after() came with
        #     a priority. Such a wait is a promise to look at the key again soon;
        #     handing the key out (get()) keeps the promise, so its entry is
        #     dropped then (controller-runtime's priority queue keeps one entry
        #     per key, and an earlier add supersedes a later delayed one). The
        #     reconcile that runs asks again if it still needs to. A delayed add
        #     without priority (a poll, a rate-limited retry) is never dropped.
        #   Whenever _heap is non-empty and getters wait, one of them wakes no
        #     later than _heap[0]'s due time: a new earliest entry notifies one
        #     getter, and every get() that returns with keys still delayed
        #     hands off to another getter (see _Queue.get).
        self._heap: list[tuple[float, int, Hashable]] = []   # seq breaks ties; keys never compared
        self._waiting: dict[Hashable, tuple[float, int]] = {}
        self._promised: set[Hashable] = set()
        self._seq = itertools.count()

    def add_after(self, key: Hashable, delay_seconds: float, *, priority: int = 0) -> None:
        """Add `key` once `delay_seconds` have passed on the clock (at once if <= 0).

        `priority` > 0: from now until the key is next handed out, whichever add
        brings it first -- this one when due, or an earlier add() of an event --
        puts it ahead of the keys queued without priority. And the first of
        them is the only one: once the key is handed out, this delayed add is
        dropped (unless an add_after() without priority is pending for it too).

        Counted in workqueue_retries_total, as client-go's AddAfter counts it.
        """
        with self._lock:
            if not self._shutting_down:
                self._m_retries.inc()
                self._prioritise_locked(key, priority)
                self._add_after_locked(key, delay_seconds, self._clock(), promise=priority > 0)

    def _add_after_locked(self, key: Hashable, delay_seconds: float, now: float, *,
                          promise: bool = False) -> None:
        if delay_seconds <= 0:
            self._add_locked(key, now)
            return
        due = now + delay_seconds
        current = self._waiting.get(key)
        if current is None and promise:
            self._promised.add(key)
        elif not promise:
            self._promised.discard(key)     # a poll merged into this wait: never dropped
        if current is not None and current[0] <= due:
            return
        seq = next(self._seq)
        self._waiting[key] = (due, seq)
        heapq.heappush(self._heap, (due, seq, key))
        if self._heap[0][1] == seq:
            self._ready.notify()        # a new earliest due time: a getter recomputes its wait

    def _handed_out_locked(self, key: Hashable) -> None:
        if key in self._promised:
            # The promise is kept by this hand-out; its heap entry is now stale.
            self._promised.discard(key)
            del self._waiting[key]
            self._drop_stale_heads_locked()

    def _promote_due_locked(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            due, seq, key = heapq.heappop(self._heap)
            if self._waiting.get(key) == (due, seq):
                del self._waiting[key]
                self._promised.discard(key)
                self._add_locked(key, now)

    def _drop_stale_heads_locked(self) -> None:
        # So that no getter sleeps until, and wakes for, an entry dropped by a hand-out.
        # (Stale entries deeper down are skipped when they come due, as superseded ones are.)
        heap, waiting = self._heap, self._waiting
        while heap and waiting.get(heap[0][2]) != heap[0][:2]:
            heapq.heappop(heap)

    def _seconds_to_next_due_locked(self, now: float) -> float | None:
        return self._heap[0][0] - now if self._heap else None

    def _has_delayed_locked(self) -> bool:
        return bool(self._heap)

    def _drop_delayed_locked(self) -> int:
        dropped = len(self._waiting)
        self._heap.clear()
        self._waiting.clear()
        self._promised.clear()
        return dropped


class WorkQueue(_DelayingQueue):
    """Layer 3: rate-limited retries. The queue controllers use.

    `rate_limiter` defaults to controller-runtime's: the slower of per-key
    5 ms * 2^failures (capped at 1000 s) and an overall 10 qps / burst 100.
    """

    def __init__(self, name: str, *, rate_limiter: RateLimiter | None = None,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(name, metrics=metrics, clock=clock)
        self.rate_limiter = (rate_limiter if rate_limiter is not None
                             else default_controller_rate_limiter())
        # key -> clock() time its pending rate-limited retry is due. Set when
        # add_rate_limited() counts a failure; cleared by forget().
        self._retry_due: dict[Hashable, float] = {}

    def add_rate_limited(self, key: Hashable) -> None:
        """Retry `key` after the rate limiter's delay; counts a failure (see below).

        The kubernetes#132805 trap: a key waiting for its retry (due at T) can
        be processed early, because an ordinary add() (a watch event) queued it
        before T. If that early attempt fails too, client-go asks the limiter
        again: the failure count goes up and the backoff doubles, although
        the retry the backoff scheduled has not even run yet. A few events
        arriving while an object is broken then push its retries to the
        1000 s cap far faster than the failures warrant.

        Here a failure counts only when the attempt started at or after the
        due time of the retry scheduled before it. An attempt that started
        early (or a call with the key not being processed while its retry is
        still pending) just keeps the pending retry at T: the limiter is not
        asked, so neither the per-key count nor the overall bucket is charged.
        """
        with self._lock:
            if self._shutting_down:
                return
            now = self._clock()
            self._m_retries.inc()
            due = self._retry_due.get(key)
            attempt_started = self._started_at.get(key, now)
            if due is not None and attempt_started < due:
                delay = due - now            # early attempt: keep the retry already scheduled
            else:
                delay = self.rate_limiter.when(key, now=now)
                self._retry_due[key] = now + delay
            self._add_after_locked(key, delay, now)

    def forget(self, key: Hashable) -> None:
        """`key` succeeded (or is given up on): its next failure starts from the first delay."""
        with self._lock:      # lock order: queue, then limiter (as in add_rate_limited)
            self._retry_due.pop(key, None)
            self.rate_limiter.forget(key)

    def num_requeues(self, key: Hashable) -> int:
        """Failures counted for `key` since it was last forgotten."""
        return self.rate_limiter.num_requeues(key)
