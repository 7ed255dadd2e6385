"""Worker threads that reconcile keys from a WorkQueue (controller-runtime's policy).

The whole user contract: a reconcile function gets a key and returns a
`Result` (or None), or raises. What happens next:

| reconcile                          | queue                         | reconcile_total{result} |
|------------------------------------|-------------------------------|-------------------------|
| returns None or Result()           | forget                        | success                 |
| Result(requeue_after_seconds=x>0)  | forget, add_after(x, priority)| requeue_after           |
| Result(requeue=True)               | add_rate_limited              | requeue                 |
| raises TerminalError               | forget (no retry)             | error                   |
| raises TerminalError(quiet=True)   | forget (no retry), debug log  | error                   |
| raises anything else               | add_rate_limited (backoff)    | error                   |

Errors also count in reconcile_errors_total (terminal ones in
terminal_reconcile_errors_total as well, as controller-runtime does). Every
error is logged with its traceback and the key (a quiet TerminalError, one the
reconcile has already reported, at debug level only); the worker thread survives it.

What is a panic. Go separates `return err` (an error the reconcile reports)
from a panic (the runtime catching a bug: nil dereference, index out of range,
failed type assertion, division by zero, an explicit panic). controller-runtime
recovers a panic, counts it in reconcile_panics_total, and then handles it as
an error. Python raises for both, so the line is drawn by exception type:
`PANIC_TYPES` below are the exceptions Python raises where Go would panic
(AttributeError on None, TypeError, KeyError/IndexError, ZeroDivisionError,
AssertionError, RecursionError, NameError, NotImplementedError). Anything else
(an ApiError, an OSError, a ValueError from a parser, a user's own exception
class) is an error the reconcile reports: counted as an error, not a panic.

Timeouts. With `reconcile_timeout_seconds`, a reconcile that fails after
running longer than that counts in reconcile_timeouts_total, as
controller-runtime counts an error returned once the reconcile's context
deadline has passed. A Python thread cannot be cancelled, so the timeout is
measured, not enforced; None (the default, like controller-runtime's) counts
nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Hashable

from ..ops.log import new_reconcile_id
from ..ops.metrics import Metrics
from .workqueue import WorkQueue

__all__ = ["Result", "TerminalError", "Runner", "PANIC_TYPES", "is_panic", "queued_seconds",
           "current_work"]

# Set by the worker for the reconcile it runs (each thread has its own context).
_queued_seconds: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "queued_seconds", default=None)
_current_work: contextvars.ContextVar[tuple[WorkQueue, Hashable] | None] = \
    contextvars.ContextVar("current_work", default=None)


def queued_seconds() -> float | None:
    """How long the key being reconciled on this thread waited in its work queue
    before this reconcile started (the queue's own delay); None outside a reconcile."""
    return _queued_seconds.get()


def current_work() -> tuple[WorkQueue, Hashable] | None:
    """(the work queue, the key) of the reconcile running on this thread; None
    outside a reconcile. A write recorded with it (`Store.end_write(...,
    writer=current_work())`) does not bring this key back when its watch event
    arrives after the write's answer: the reconcile that wrote has seen it. (One
    that arrives before the answer does bring it back: see Store.end_write.)"""
    return _current_work.get()

logger = logging.getLogger(__name__)

# How long an idle worker blocks on an empty queue before it looks at the stop
# flag again. Short waits are not free: each wake-up of an idle worker costs
# ~40-90 us of CPU (four workers every 0.2 s were 0.17 % of a core; every 2 s,
# 0.019 %, a fifth of an idle operator's). A stop does not wait for it:
# Manager.stop shuts the queues down, which wakes every blocked worker at once.
IDLE_WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next. None, or Result(), means: converged, forget the key."""

    requeue_after_seconds: float | None = None   # reconcile again after this long (a poll)
    requeue: bool = False                        # reconcile again soon, with backoff
    # With requeue_after: > 0 puts the key ahead of the keys waiting without
    # priority, when it is due or when an event brings it earlier (a reconcile
    # that waits for something specific comes back as soon as it happens). That
    # early pass is then the only one: the delayed add is dropped when the key is
    # handed out, so a reconcile still waiting must say so again.
    priority: int = 0


class TerminalError(Exception):
    """Retrying cannot help (say, a spec the controller cannot use): counted, logged, not retried.

    Wrap the cause: ``raise TerminalError("spec.port out of range") from err``.

    `quiet=True`: a failure the reconcile has already reported (the same cause as
    last time): still counted as an error, as controller-runtime counts every
    reconcile that returns one, but logged at debug level, so a failure that
    persists is one error line when it appears, not one per reconcile.
    """

    def __init__(self, *args: object, quiet: bool = False):
        super().__init__(*args)
        self.quiet = quiet


# The exceptions Python raises where Go's runtime would panic (see the module
# docstring). RecursionError and NotImplementedError are RuntimeErrors; plain
# RuntimeError is not listed: libraries raise it for states, not bugs.
PANIC_TYPES: tuple[type[BaseException], ...] = (
    AttributeError, TypeError, LookupError, ArithmeticError, AssertionError,
    RecursionError, NameError, NotImplementedError)


def is_panic(err: BaseException) -> bool:
    """True for an exception that Go would have been a panic (a bug), not a reported error."""
    return isinstance(err, PANIC_TYPES)


LogContext = Callable[[str, Hashable, str], ContextManager[object]]


def _no_log_context(controller: str, key: Hashable, reconcile_id: str) -> ContextManager[object]:
    return contextlib.nullcontext()


class Runner:
    """`workers` daemon threads, named ``<name>-worker-<i>``, reconciling keys from `queue`.

    `can_start()` is asked before each reconcile starts (the leader-election
    gate). While it says no, workers leave the queue alone and re-ask every
    `poll_seconds`; a key taken just before the gate closed is put back. An
    idle worker blocks on the empty queue for `idle_seconds` at a time: stop()
    alone is noticed within that, stop() and a queue shutdown at once.
    `log_context(controller, key, reconcile_id)` returns a context manager each
    reconcile runs in (see log.py); the default does nothing.
    """

    def __init__(self, name: str, queue: WorkQueue,
                 reconcile: Callable[[Hashable], Result | None], *, workers: int = 1,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic,
                 can_start: Callable[[], bool] = lambda: True,
                 log_context: LogContext | None = None, poll_seconds: float = 0.2,
                 idle_seconds: float = IDLE_WAIT_SECONDS,
                 reconcile_timeout_seconds: float | None = None):
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.name = name
        self.queue = queue
        self.workers = workers
        self._reconcile = reconcile
        self._clock = clock
        self._can_start = can_start
        self._log_context = log_context or _no_log_context
        # How long a gated worker waits before it asks can_start() again (the wait
        # is on _stopping, so stop() ends it at once), and how long an idle one
        # blocks on the queue before it looks at the stop flag again.
        self._poll_seconds = poll_seconds
        self._idle_seconds = idle_seconds
        self.reconcile_timeout_seconds = reconcile_timeout_seconds

        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []      # index i runs as <name>-worker-<i>
        # _in_flight: reconciles between taking a key and done(key); wait_idle() waits for 0.
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)

        self.metrics = metrics if metrics is not None else Metrics()
        m = self.metrics
        m.init_controller(name, workers)
        self._m_total = {result: m.reconcile_total.labels(name, result)
                         for result in ("success", "error", "requeue", "requeue_after")}
        self._m_errors = m.reconcile_errors_total.labels(name)
        self._m_terminal = m.terminal_reconcile_errors_total.labels(name)
        self._m_panics = m.reconcile_panics_total.labels(name)
        self._m_timeouts = m.reconcile_timeouts_total.labels(name)
        self._m_time = m.reconcile_time_seconds.labels(name)
        self._m_active = m.active_workers.labels(name)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Start the worker threads (once; later calls do nothing)."""
        with self._lock:
            if self._threads or self._stopping.is_set():
                return
            self._threads = [self._new_thread(i) for i in range(self.workers)]
            threads = list(self._threads)
        for thread in threads:
            thread.start()

    def stop(self) -> None:
        """Take no new keys. Reconciles in flight finish; see wait_idle()."""
        self._stopping.set()

    def wait_idle(self, timeout_seconds: float) -> bool:
        """Wait (real time) until no reconcile is in flight; False if one still is."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout_seconds)

    def join(self, timeout_seconds: float) -> bool:
        """After stop(): wait (real time) for the worker threads to exit; False if one has not."""
        deadline = time.monotonic() + timeout_seconds
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def threads_alive(self) -> bool:
        """True when started and every worker thread is alive (a liveness check)."""
        with self._lock:
            return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def restart_dead_threads(self) -> int:
        """Replace worker threads that died; returns how many were restarted (for a supervisor)."""
        restarted = []
        with self._lock:
            if self._stopping.is_set():
                return 0
            for i, thread in enumerate(self._threads):
                if not thread.is_alive():
                    self._threads[i] = self._new_thread(i)
                    restarted.append(self._threads[i])
        for thread in restarted:
            logger.warning("controller %s: restarting dead worker thread %s",
                           self.name, thread.name)
            thread.start()
        return len(restarted)

    def _new_thread(self, index: int) -> threading.Thread:
        return threading.Thread(target=self._worker, name=f"{self.name}-worker-{index}",
                                daemon=True)

    # -- the worker ---------------------------------------------------------

    def _worker(self) -> None:
        try:
            self._work_until_stopped()
        except BaseException:
            # Only something that is not an Exception (SystemExit, ...) gets
            # here. The thread ends; threads_alive() turns False and the
            # supervisor's restart_dead_threads() replaces it.
            logger.exception("controller %s: worker thread %s died", self.name,
                             threading.current_thread().name)

    def _work_until_stopped(self) -> None:
        while not self._stopping.is_set():
            if not self._can_start():
                self._stopping.wait(self._poll_seconds)
                continue
            key, shut_down = self.queue.get(timeout_seconds=self._idle_seconds)
            if shut_down:
                return
            if key is None:
                continue
            if self._stopping.is_set() or not self._can_start():
                # The gate closed (lease lost) or stop() came while we waited:
                # put the key back untouched. add() marks it dirty, done() requeues it.
                self.queue.add(key)
                self.queue.done(key)
                continue
            self._process(key)

    def _process(self, key: Hashable) -> None:
        reconcile_id = new_reconcile_id()        # a UUID, cheap (see there)
        with self._lock:
            self._in_flight += 1
        self._m_active.inc()
        started = self._clock()
        handled = False
        token = _queued_seconds.set(self.queue.queued_seconds(key))
        work = _current_work.set((self.queue, key))
        try:
            with self._log_context(self.name, key, reconcile_id):
                try:
                    result = self._reconcile(key)
                    if result is not None and not isinstance(result, Result):
                        raise TypeError(f"reconcile returned {type(result).__name__}, "
                                        "not Result or None")
                except Exception as err:
                    self._count_timeout(started)
                    self._apply_error(key, err, reconcile_id)
                else:
                    self._apply_result(key, result)
                handled = True
        except Exception as err:
            if handled:             # the log context failed on exit; the policy was applied
                logger.exception("controller %s: log context failed for %s", self.name, key)
            else:                   # it failed on entry, or applying the result failed
                self._apply_error(key, err, reconcile_id)
        except BaseException:
            if not handled:         # this thread is going down: its successor retries the key
                self.queue.add_rate_limited(key)
            raise
        finally:
            _queued_seconds.reset(token)
            _current_work.reset(work)
            self._m_time.observe(max(0.0, self._clock() - started))
            self._m_active.dec()
            self.queue.done(key)
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.notify_all()

    def _apply_result(self, key: Hashable, result: Result | None) -> None:
        # controller-runtime's order: requeue_after wins over requeue; 0 means unset.
        if result is not None and result.requeue_after_seconds and result.requeue_after_seconds > 0:
            self.queue.forget(key)
            self.queue.add_after(key, result.requeue_after_seconds, priority=result.priority)
            self._m_total["requeue_after"].inc()
        elif result is not None and result.requeue:
            self.queue.add_rate_limited(key)
            self._m_total["requeue"].inc()
        else:
            self.queue.forget(key)
            self._m_total["success"].inc()

    def _count_timeout(self, started: float) -> None:
        timeout = self.reconcile_timeout_seconds
        if timeout is not None and self._clock() - started > timeout:
            self._m_timeouts.inc()

    def _apply_error(self, key: Hashable, err: Exception, reconcile_id: str) -> None:
        self._m_errors.inc()
        self._m_total["error"].inc()
        if isinstance(err, TerminalError):
            self._m_terminal.inc()
            self.queue.forget(key)
            # controller-runtime's message and keys: the reconcile context
            # (controller, namespace, name, reconcileID) is on the line, the
            # exception is in `error` and `stacktrace`.
            # No traceback: a terminal error is a verdict on the object (an unusable
            # spec, a name taken), not a fault in the code; its message says it all.
            (logger.debug if err.quiet else logger.error)(
                "Reconciler error",
                extra={"error": str(err) or type(err).__name__, "retry": False,
                       "reconcileID": reconcile_id})
            return
        if is_panic(err):
            self._m_panics.inc()
        self.queue.add_rate_limited(key)
        logger.error("Reconciler error", exc_info=err,
                     extra={"retry": True, "reconcileID": reconcile_id})
