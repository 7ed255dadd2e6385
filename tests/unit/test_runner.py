"""Runner: the result policy, error handling, the leader gate, thread supervision.

Real worker threads, a fake clock for everything the queue schedules; tests
wait on conditions the reconcile functions signal, never on sleeps.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid

import pytest
from prometheus_client import CollectorRegistry

from k8s_http.core.backoff import ItemExponentialLimiter
from k8s_http.core.errors import ConflictError
from k8s_http.ops.metrics import Metrics
from k8s_http.control.runner import Result, Runner, TerminalError
from k8s_http.control.workqueue import WorkQueue
from tests.support.clock import FakeClock

WAIT = 10.0     # seconds: only ever reached when a test is about to fail


class Reconciler:
    """A reconcile function scripted per key; records every call."""

    def __init__(self, behaviour=None):
        self.behaviour = behaviour or (lambda key, attempt: None)
        self.calls: list = []
        self.cond = threading.Condition()

    def __call__(self, key):
        with self.cond:
            attempt = sum(1 for k in self.calls if k == key)
        try:
            return self.behaviour(key, attempt)
        finally:
            with self.cond:
                self.calls.append(key)
                self.cond.notify_all()

    def count(self, key) -> int:
        with self.cond:
            return self.calls.count(key)

    def wait_for(self, key, times: int = 1) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.calls.count(key) >= times, WAIT), \
                f"{key} reconciled {self.calls.count(key)} times, wanted {times}"


class Harness:
    def __init__(self):
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.runners: list[Runner] = []

    def make(self, reconcile, *, workers=1, limiter=None, **kwargs) -> Runner:
        queue = WorkQueue("ctl", clock=self.clock, metrics=self.metrics,
                          rate_limiter=limiter or ItemExponentialLimiter(1.0, 100.0))
        runner = Runner("ctl", queue, reconcile, workers=workers, metrics=self.metrics,
                        clock=self.clock, poll_seconds=0.01, idle_seconds=0.01, **kwargs)
        self.runners.append(runner)
        return runner

    def advance(self, runner: Runner, seconds: float) -> None:
        self.clock.advance(seconds)
        runner.queue.wake()

    def value(self, name, **labels):
        labels.setdefault("controller", "ctl")
        return self.registry.get_sample_value(name, labels) or 0.0

    def total(self, result):
        return self.value("controller_runtime_reconcile_total", result=result)

    def close(self):
        for runner in self.runners:
            runner.stop()
        for runner in self.runners:
            assert runner.join(WAIT)


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def idle(runner: Runner) -> None:
    assert runner.wait_idle(WAIT)


def nothing_pending(h: Harness, runner: Runner) -> bool:
    """Stop the runner, then check no key is queued or scheduled, however far ahead."""
    runner.stop()
    assert runner.join(WAIT)
    h.clock.advance(1e6)
    return runner.queue.get(timeout_seconds=0) == (None, False)


# -- the result policy ------------------------------------------------------------------

@pytest.mark.parametrize("returned", [None, Result()])
def test_success_forgets_the_key(h, returned):
    reconcile = Reconciler(lambda key, attempt: returned)
    runner = h.make(reconcile)
    runner.queue.rate_limiter.when("a", now=0)      # a failure from earlier
    runner.queue.add("a")
    runner.start()
    reconcile.wait_for("a")
    idle(runner)
    assert runner.queue.num_requeues("a") == 0
    assert h.total("success") == 1 and h.total("error") == 0
    assert h.value("controller_runtime_reconcile_time_seconds_count") == 1
    assert nothing_pending(h, runner)


def test_requeue_after_forgets_and_comes_back_after_the_delay(h):
    reconcile = Reconciler(lambda key, attempt: Result(requeue_after_seconds=30) if attempt == 0
                           else None)
    runner = h.make(reconcile)
    runner.queue.rate_limiter.when("a", now=0)
    runner.queue.add("a")
    runner.start()
    reconcile.wait_for("a")
    idle(runner)
    assert h.total("requeue_after") == 1
    assert runner.queue.num_requeues("a") == 0
    h.advance(runner, 29.0)
    assert reconcile.count("a") == 1
    h.advance(runner, 1.0)
    reconcile.wait_for("a", 2)
    idle(runner)
    assert h.total("success") == 1


def test_requeue_true_is_rate_limited(h):
    reconcile = Reconciler(lambda key, attempt: Result(requeue=True) if attempt < 2 else None)
    runner = h.make(reconcile)
    runner.queue.add("a")
    runner.start()
    reconcile.wait_for("a")
    idle(runner)
    assert h.total("requeue") == 1 and runner.queue.num_requeues("a") == 1
    h.advance(runner, 1.0)          # first backoff: 1 s
    reconcile.wait_for("a", 2)
    idle(runner)
    assert runner.queue.num_requeues("a") == 2
    h.advance(runner, 2.0)          # then 2 s
    reconcile.wait_for("a", 3)
    idle(runner)
    assert h.total("requeue") == 2 and h.total("success") == 1
    assert runner.queue.num_requeues("a") == 0


def test_requeue_after_wins_over_requeue(h):
    reconcile = Reconciler(lambda key, attempt: Result(requeue_after_seconds=5, requeue=True))
    runner = h.make(reconcile)
    runner.queue.add("a")
    runner.start()
    reconcile.wait_for("a")
    idle(runner)
    assert h.total("requeue_after") == 1 and h.total("requeue") == 0


# -- errors --------------------------------------------------------------------------------

def test_a_failing_key_is_retried_with_backoff_while_others_flow(h, caplog):
    def behaviour(key, attempt):
        if key == "bad":
            raise ValueError("boom")

    reconcile = Reconciler(behaviour)
    runner = h.make(reconcile, workers=2)
    runner.queue.add("bad")
    for i in range(20):
        runner.queue.add(f"good{i}")
    with caplog.at_level(logging.ERROR, logger="k8s_http.control.runner"):
        runner.start()
        for i in range(20):
            reconcile.wait_for(f"good{i}")
        reconcile.wait_for("bad")
        idle(runner)
        assert reconcile.count("bad") == 1          # the retry waits for its backoff
        h.advance(runner, 1.0)
        reconcile.wait_for("bad", 2)
        idle(runner)
    assert runner.queue.num_requeues("bad") == 2
    assert h.total("success") == 20 and h.total("error") == 2
    assert h.value("controller_runtime_reconcile_errors_total") == 2
    assert h.value("controller_runtime_reconcile_panics_total") == 0    # an error, not a bug
    assert runner.threads_alive()                                        # the workers survived
    failures = [r for r in caplog.records if r.getMessage() == "Reconciler error"]
    assert len(failures) == 2
    assert failures[0].exc_info and failures[0].exc_info[0] is ValueError
    assert "Traceback" in caplog.text and "boom" in caplog.text


def run_keys(h: Harness, behaviour, keys=("a",), **kwargs) -> tuple[Reconciler, Runner]:
    """Reconcile `keys` once each with `behaviour`, and wait until the runner is idle."""
    reconcile = Reconciler(behaviour)
    runner = h.make(reconcile, **kwargs)
    for key in keys:
        runner.queue.add(key)
    runner.start()
    for key in keys:
        reconcile.wait_for(key)
    idle(runner)
    return reconcile, runner


def test_terminal_error_is_counted_and_not_retried(h, caplog):
    def behaviour(key, attempt):
        raise TerminalError("spec.port out of range")

    reconcile = Reconciler(behaviour)
    runner = h.make(reconcile)
    runner.queue.rate_limiter.when("a", now=0)
    runner.queue.add("a")
    with caplog.at_level(logging.ERROR, logger="k8s_http.control.runner"):
        runner.start()
        reconcile.wait_for("a")
        idle(runner)
    assert h.value("controller_runtime_terminal_reconcile_errors_total") == 1
    assert h.value("controller_runtime_reconcile_errors_total") == 1
    assert h.value("controller_runtime_reconcile_panics_total") == 0
    assert h.total("error") == 1
    assert runner.queue.num_requeues("a") == 0      # forgotten
    (record,) = [r for r in caplog.records if r.getMessage() == "Reconciler error"]
    assert record.error == "spec.port out of range" and record.exc_info is None  # no traceback
    assert nothing_pending(h, runner)
    assert reconcile.count("a") == 1


def test_a_quiet_terminal_error_is_counted_alike_but_logged_at_debug_only(h, caplog):
    def behaviour(key, attempt):
        raise TerminalError("Conflict: Service a is not ours", quiet=True)

    reconcile = Reconciler(behaviour)
    runner = h.make(reconcile)
    runner.queue.add("a")
    with caplog.at_level(logging.DEBUG, logger="k8s_http.control.runner"):
        runner.start()
        reconcile.wait_for("a")
        idle(runner)
    assert h.value("controller_runtime_terminal_reconcile_errors_total") == 1
    assert h.value("controller_runtime_reconcile_errors_total") == 1
    assert h.total("error") == 1
    assert runner.queue.num_requeues("a") == 0
    records = [r for r in caplog.records if "Reconciler error" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.DEBUG]


class _OwnError(Exception):
    pass


# What Python raises where Go would panic is a panic; what a reconcile reports is an error.
@pytest.mark.parametrize("raised, panic", [
    (AttributeError("'NoneType' object has no attribute 'get'"), True),   # nil dereference
    (KeyError("spec"), True), (IndexError("list index out of range"), True),
    (TypeError("unsupported operand"), True),                            # type assertion
    (ZeroDivisionError("division by zero"), True), (AssertionError("invariant"), True),
    (RecursionError("maximum recursion depth exceeded"), True),          # stack overflow
    (NameError("name 'x' is not defined"), True), (NotImplementedError(), True),
    (ValueError("not a quantity"), False), (OSError("connection reset"), False),
    (RuntimeError("a state, not a bug"), False), (_OwnError("reported"), False),
    (ConflictError(409, "stale"), False), (TerminalError("bad spec"), False),
])
def test_panics_are_bugs_not_reported_errors(h, raised, panic):
    def behaviour(key, attempt):
        if attempt == 0:
            raise raised

    reconcile, runner = run_keys(h, behaviour)
    assert h.value("controller_runtime_reconcile_errors_total") == 1
    assert h.value("controller_runtime_reconcile_panics_total") == (1 if panic else 0)
    if not isinstance(raised, TerminalError):       # either way retried, with backoff
        h.advance(runner, 1.0)
        reconcile.wait_for("a", 2)
        idle(runner)
        assert h.total("success") == 1


def test_a_failure_past_the_reconcile_timeout_counts_as_a_timeout(h):
    def behaviour(key, attempt):
        if attempt > 0:
            return None                 # the retries (due as the clock moved) succeed at once
        h.clock.advance({"slow-fail": 6.0, "fast-fail": 1.0, "slow-ok": 6.0}[key])
        if key.endswith("fail"):
            raise OSError("deadline")

    run_keys(h, behaviour, ("slow-fail", "fast-fail", "slow-ok"), reconcile_timeout_seconds=5.0)
    # controller-runtime counts an error returned after the deadline; a slow success is not one
    assert h.value("controller_runtime_reconcile_timeouts_total") == 1
    assert h.value("controller_runtime_reconcile_errors_total") == 2


def test_no_reconcile_timeout_counts_nothing(h):
    def behaviour(key, attempt):
        h.clock.advance(1e6)
        raise OSError("slow")

    run_keys(h, behaviour)
    assert h.registry.get_sample_value("controller_runtime_reconcile_timeouts_total",
                                       {"controller": "ctl"}) == 0


def test_a_reconcile_returning_something_else_is_a_bug(h):
    reconcile = Reconciler(lambda key, attempt: "done" if attempt == 0 else None)
    runner = h.make(reconcile)
    runner.queue.add("a")
    runner.start()
    reconcile.wait_for("a")
    idle(runner)
    assert h.value("controller_runtime_reconcile_panics_total") == 1
    h.advance(runner, 1.0)
    reconcile.wait_for("a", 2)


# -- threads ---------------------------------------------------------------------------------

class _ThreadKiller(BaseException):
    """Not an Exception: the runner cannot handle it, and its thread dies."""


def test_a_dead_worker_is_restarted_and_its_key_retried(h):
    dying: list[threading.Thread] = []

    def behaviour(key, attempt):
        if key == "die" and attempt == 0:
            dying.append(threading.current_thread())
            raise _ThreadKiller()

    reconcile = Reconciler(behaviour)
    runner = h.make(reconcile, workers=2)
    runner.start()
    assert runner.threads_alive()
    runner.queue.add("die")
    reconcile.wait_for("die")
    dying[0].join(WAIT)
    assert not runner.threads_alive()
    assert runner.restart_dead_threads() == 1
    assert runner.threads_alive()
    assert runner.restart_dead_threads() == 0
    workers = [t for t in threading.enumerate() if t.name.startswith("ctl-worker-")]
    assert sorted(t.name for t in workers) == ["ctl-worker-0", "ctl-worker-1"]
    assert dying[0] not in workers and all(t.daemon for t in workers)
    h.advance(runner, 1.0)                          # the key was put back, with backoff
    reconcile.wait_for("die", 2)
    runner.queue.add("after")
    reconcile.wait_for("after")


def test_workers_are_daemon_threads_named_after_the_controller(h):
    runner = h.make(Reconciler(), workers=3)
    runner.start()
    runner.start()                                  # idempotent
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("ctl-worker-"))
    assert names == ["ctl-worker-0", "ctl-worker-1", "ctl-worker-2"]
    assert h.value("controller_runtime_max_concurrent_reconciles") == 3


def test_stop_takes_no_new_keys(h):
    reconcile = Reconciler()
    runner = h.make(reconcile, workers=2)
    runner.start()
    runner.stop()
    assert runner.join(WAIT)
    assert not runner.threads_alive()
    assert runner.restart_dead_threads() == 0       # stopped: nothing to supervise
    runner.queue.add("a")
    assert reconcile.count("a") == 0
    assert len(runner.queue) == 1


def test_wait_idle_and_active_workers(h):
    release = threading.Event()
    entered = threading.Event()

    def behaviour(key, attempt):
        entered.set()
        h.clock.advance(2.5)                        # the reconcile "takes" 2.5 s
        assert release.wait(WAIT)

    runner = h.make(Reconciler(behaviour), workers=2)
    runner.queue.add("a")
    runner.start()
    assert entered.wait(WAIT)
    assert h.value("controller_runtime_active_workers") == 1
    assert not runner.wait_idle(0.01)
    release.set()
    assert runner.wait_idle(WAIT)
    assert h.value("controller_runtime_active_workers") == 0
    assert h.value("controller_runtime_reconcile_time_seconds_sum") == pytest.approx(2.5)


def test_ten_thousand_adds_while_reconciling_cost_a_handful_of_reconciles(h):
    release = threading.Event()
    entered = threading.Event()

    def behaviour(key, attempt):
        if attempt == 0:
            entered.set()
            assert release.wait(WAIT)

    reconcile = Reconciler(behaviour)
    runner = h.make(reconcile, workers=4)
    runner.queue.add("hot")
    runner.start()
    assert entered.wait(WAIT)
    for _ in range(10_000):
        runner.queue.add("hot")
    release.set()
    reconcile.wait_for("hot", 2)
    idle(runner)
    assert nothing_pending(h, runner)
    assert reconcile.count("hot") == 2


def test_log_context_wraps_each_reconcile(h):
    seen = []
    inside = []

    @contextlib.contextmanager
    def log_context(controller, key, reconcile_id):
        seen.append((controller, key, reconcile_id))
        inside.append(True)
        yield
        inside.pop()

    reconcile = Reconciler(lambda key, attempt: inside.copy())
    runner = h.make(reconcile, log_context=log_context)
    runner.queue.add("a")
    runner.queue.add("b")
    runner.start()
    reconcile.wait_for("b")
    idle(runner)
    assert [(c, k) for c, k, _ in seen] == [("ctl", "a"), ("ctl", "b")]
    ids = [rid for _, _, rid in seen]
    # controller-runtime's reconcileID: a UUID
    assert len(set(ids)) == 2 and all(uuid.UUID(rid).version == 4 for rid in ids)


def test_a_broken_log_context_does_not_kill_the_worker(h):
    called = threading.Event()

    def log_context(controller, key, reconcile_id):
        called.set()
        raise TypeError("bad formatter")

    reconcile = Reconciler()
    runner = h.make(reconcile, log_context=log_context)
    runner.queue.add("a")
    runner.start()
    assert called.wait(WAIT)
    idle(runner)
    assert runner.threads_alive()
    assert reconcile.count("a") == 0
    assert h.value("controller_runtime_reconcile_panics_total") == 1
    assert runner.queue.num_requeues("a") == 1      # retried once the context works again


# -- the leader gate -------------------------------------------------------------------------

class Gate:
    def __init__(self, answers=None, default=False):
        self.answers = list(answers or [])
        self.default = default
        self.calls = 0
        self.cond = threading.Condition()

    def __call__(self) -> bool:
        with self.cond:
            self.calls += 1
            self.cond.notify_all()
            return self.answers.pop(0) if self.answers else self.default

    def wait_calls(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.calls >= n, WAIT)

    def open(self) -> None:
        with self.cond:
            self.default = True


def test_no_reconcile_starts_while_can_start_says_no(h):
    gate = Gate()
    reconcile = Reconciler()
    runner = h.make(reconcile, workers=2, can_start=gate)
    runner.queue.add("a")
    runner.start()
    gate.wait_calls(6)                  # the workers kept asking, without taking the key
    assert reconcile.count("a") == 0
    assert len(runner.queue) == 1
    gate.open()
    reconcile.wait_for("a")


def test_a_key_taken_just_before_the_gate_closed_is_put_back(h):
    gate = Gate(answers=[True])         # open for the first check only: lease lost during get()
    reconcile = Reconciler()
    runner = h.make(reconcile, can_start=gate)
    runner.queue.add("a")
    runner.start()
    gate.wait_calls(4)
    assert reconcile.count("a") == 0
    assert len(runner.queue) == 1       # back in the queue, not lost
    gate.open()
    reconcile.wait_for("a")
    idle(runner)
    assert reconcile.count("a") == 1


def test_a_reconcile_knows_its_queue_and_key():
    from k8s_http.control.runner import current_work
    queue = WorkQueue("work")
    seen = []
    runner = Runner("work", queue, lambda key: seen.append(current_work()), workers=1)
    queue.add("k")
    runner._process(queue.get(timeout_seconds=0)[0])
    assert seen == [(queue, "k")] and current_work() is None


def test_a_reconcile_knows_how_long_its_key_waited_and_can_ask_for_priority():
    from k8s_http.control.runner import queued_seconds
    from tests.support.clock import FakeClock
    clock = FakeClock(0.0)
    queue = WorkQueue("prio", clock=clock)
    seen = []

    def reconcile(key):
        seen.append((key, queued_seconds()))
        return Result(requeue_after_seconds=10.0, priority=1) if key == "held" else None

    runner = Runner("prio", queue, reconcile, workers=1, clock=clock)
    queue.add("held")
    clock.advance(3.0)
    runner._process(queue.get(timeout_seconds=0)[0])
    assert seen == [("held", 3.0)] and queued_seconds() is None
    queue.add("a")
    queue.add("held")                      # an event before the 10 s: ahead of "a"
    assert queue.get(timeout_seconds=0)[0] == "held"


def test_an_idle_worker_blocks_on_the_queue_until_a_key_or_the_shutdown():
    # Waking idle workers to look at the stop flag costs CPU for nothing (four
    # workers every 0.2 s were most of an idle operator's CPU): each one blocks
    # once, and the stop (runner.stop, then the queue's shutdown, as Manager.stop
    # does) wakes it without waiting out its idle wait.
    queue = WorkQueue("idle")
    waits = []
    both_waiting = threading.Event()
    real_get = queue.get

    def counting_get(timeout_seconds=None):
        waits.append(timeout_seconds)
        if len(waits) == 2:
            both_waiting.set()
        return real_get(timeout_seconds)
    queue.get = counting_get
    reconciled = threading.Event()
    runner = Runner("idle", queue, lambda key: reconciled.set(), workers=2, idle_seconds=60.0)
    runner.start()
    assert both_waiting.wait(5)
    assert waits == [60.0, 60.0]
    queue.add("k")                         # a key wakes a blocked worker at once
    assert reconciled.wait(5)
    runner.stop()
    queue.shutdown(drain=False)
    assert runner.join(5)
