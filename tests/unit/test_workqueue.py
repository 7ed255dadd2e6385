"""WorkQueue: dedup, processing set, delays, rate-limited retries, shutdown, metrics.

Time is a fake clock: tests advance it and call get(timeout_seconds=0) (or
wake() a blocked getter), so nothing here sleeps.
"""

from __future__ import annotations

import itertools
import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from k8s_http.core.backoff import ItemExponentialLimiter, MaxOfLimiter, BucketLimiter
from k8s_http.ops.metrics import Metrics
from k8s_http.cache.informer import LOW_PRIORITY
from k8s_http.control.workqueue import WorkQueue
from tests.support.clock import FakeClock


@pytest.fixture
def clock():
    return FakeClock()


def take(q: WorkQueue):
    """The next key ready now (None if there is none); never blocks."""
    key, shut_down = q.get(timeout_seconds=0)
    assert not shut_down
    return key


def drain(q: WorkQueue) -> list:
    keys = []
    while (key := take(q)) is not None:
        keys.append(key)
        q.done(key)
    return keys


def start_getter(q: WorkQueue, timeout_seconds: float = 10.0):
    """get() on another thread; returns (thread, box) where box gets the result."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(q.get(timeout_seconds)), daemon=True)
    thread.start()
    return thread, box


# -- the basic queue -------------------------------------------------------------

def test_fifo_and_dedup(clock):
    q = WorkQueue("q", clock=clock)
    for key in ["a", "b", "a", "c", "b"]:
        q.add(key)
    assert len(q) == 3
    assert drain(q) == ["a", "b", "c"]
    assert len(q) == 0


def test_get_on_empty_queue_times_out(clock):
    q = WorkQueue("q", clock=clock)
    assert q.get(timeout_seconds=0) == (None, False)
    assert q.get(timeout_seconds=0.01) == (None, False)


def test_add_while_processing_is_requeued_at_done_not_handed_out_twice(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    assert take(q) == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0 and take(q) is None      # never to a second worker meanwhile
    q.done("a")
    assert len(q) == 1
    assert take(q) == "a"
    q.done("a")
    assert take(q) is None


def test_done_without_get_or_twice_is_harmless(clock):
    q = WorkQueue("q", clock=clock)
    q.done("never")
    q.add("a")
    assert take(q) == "a"
    q.done("a")
    q.done("a")
    assert take(q) is None


def test_blocked_get_wakes_on_add(clock):
    q = WorkQueue("q", clock=clock)
    thread, box = start_getter(q)
    q.add("a")
    thread.join(10)
    assert box == [("a", False)]


def test_ten_thousand_adds_while_processing_make_one_more_pass(clock):
    registry = CollectorRegistry()
    q = WorkQueue("q", clock=clock, metrics=Metrics(registry))
    q.add("hot")
    assert take(q) == "hot"
    for _ in range(10_000):
        q.add("hot")
    q.done("hot")
    assert drain(q) == ["hot"]
    assert registry.get_sample_value("workqueue_adds_total",
                                     {"name": "q", "controller": "q"}) == 2


def test_add_many_is_add_of_each_key_in_one_call(clock):
    registry = CollectorRegistry()
    q = WorkQueue("q", clock=clock, metrics=Metrics(registry))
    q.add("b")
    q.add("busy")
    assert take(q) == "b"                       # being processed
    q.add_many(["a", "b", "a", "c", "busy"])    # "busy" is queued already
    assert sample(registry, "workqueue_adds_total") == 5         # busy, b, a, b (again), c
    assert sample(registry, "workqueue_depth") == 3               # busy, a, c; b waits for done
    q.done("b")
    assert drain(q) == ["busy", "a", "c", "b"]
    q.add_many([])
    assert sample(registry, "workqueue_adds_total") == 5


def test_add_many_wakes_every_blocked_getter(clock):
    q = WorkQueue("q", clock=clock)
    getters = [start_getter(q) for _ in range(3)]
    q.add_many(["a", "b", "c"])
    for thread, _ in getters:
        thread.join(10)
    assert sorted(box[0][0] for _, box in getters) == ["a", "b", "c"]


def test_add_many_after_shutdown_is_ignored(clock):
    q = WorkQueue("q", clock=clock)
    q.shutdown(drain=False)
    q.add_many(["a"])
    assert q.get(timeout_seconds=0) == (None, True)


# -- add_after ---------------------------------------------------------------------------

def test_add_after_is_ready_at_its_due_time(clock):
    q = WorkQueue("q", clock=clock)
    q.add_after("a", 5.0)
    assert len(q) == 0 and take(q) is None
    clock.advance(4.999)
    assert take(q) is None
    clock.advance(0.001)
    assert take(q) == "a"


def test_add_after_keeps_the_earliest_due_time(clock):
    q = WorkQueue("q", clock=clock)
    q.add_after("a", 5.0)
    q.add_after("a", 10.0)      # later: ignored
    q.add_after("a", 2.0)       # earlier: replaces
    clock.advance(2.0)
    assert drain(q) == ["a"]
    clock.advance(10.0)
    assert drain(q) == []       # the superseded entries are gone


def test_add_after_zero_or_negative_is_an_add(clock):
    q = WorkQueue("q", clock=clock)
    q.add_after("a", 0)
    q.add_after("b", -3)
    assert drain(q) == ["a", "b"]


def test_due_keys_come_out_in_due_order(clock):
    q = WorkQueue("q", clock=clock)
    q.add_after("late", 3.0)
    q.add_after("early", 1.0)
    q.add_after("middle", 2.0)
    clock.advance(5.0)
    assert drain(q) == ["early", "middle", "late"]


def test_add_does_not_cancel_a_pending_add_after(clock):
    # client-go semantics: the immediate add is processed now, the delayed one
    # still fires at its due time (a scheduled poll is not lost).
    q = WorkQueue("q", clock=clock)
    q.add_after("a", 5.0)
    q.add("a")
    assert drain(q) == ["a"]
    clock.advance(5.0)
    assert drain(q) == ["a"]


def test_blocked_get_sees_a_delayed_key_when_the_fake_clock_moves(clock):
    q = WorkQueue("q", clock=clock)
    thread, box = start_getter(q)
    q.add_after("a", 60.0)
    clock.advance(60.0)
    q.wake()
    thread.join(10)
    assert box == [("a", False)]


def test_getters_hand_off_so_every_due_key_gets_a_waiter():
    # Real clock, real (millisecond) delays: two blocked getters, two delayed
    # keys. After the first getter takes the first key, the second must still
    # be watching the clock for the second key.
    q = WorkQueue("q")
    threads = [start_getter(q, timeout_seconds=10.0) for _ in range(2)]
    q.add_after("a", 0.001)
    q.add_after("b", 0.002)
    results = []
    for thread, box in threads:
        thread.join(10)
        results += box
    assert sorted(results) == [("a", False), ("b", False)]


def test_a_delayed_key_is_picked_up_while_another_getter_takes_an_immediate_key():
    q = WorkQueue("q")
    g1, box1 = start_getter(q, timeout_seconds=10.0)
    q.add_after("a", 0.05)
    g2, box2 = start_getter(q, timeout_seconds=2.0)
    q.add("x")
    g1.join(10)
    g2.join(10)
    assert sorted(box1 + box2) == [("a", False), ("x", False)]


# -- shutdown --------------------------------------------------------------------------------

def test_shutdown_hands_out_what_is_queued_then_reports_the_end(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    q.add("b")
    q.add_after("due", 1.0)
    q.add_after("not-due", 100.0)
    clock.advance(1.0)
    q.shutdown(drain=False)
    q.add("late")               # ignored after shutdown
    q.add_after("late2", 0.5)
    q.add_rate_limited("late3")
    assert q.get(timeout_seconds=0) == ("a", False)
    assert q.get(timeout_seconds=0) == ("b", False)
    assert q.get(timeout_seconds=0) == ("due", False)
    assert q.get(timeout_seconds=0) == (None, True)
    clock.advance(1000.0)
    assert q.get() == (None, True)          # never blocks once shut down and empty


def test_shutdown_requeues_keys_added_while_processing(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    assert take(q) == "a"
    q.add("a")                  # dirty while processing, before shutdown: not lost
    q.shutdown(drain=False)
    q.done("a")
    assert q.get(timeout_seconds=0) == ("a", False)
    q.done("a")
    assert q.get(timeout_seconds=0) == (None, True)


def test_blocked_get_returns_on_shutdown(clock):
    q = WorkQueue("q", clock=clock)
    thread, box = start_getter(q)
    q.shutdown()
    thread.join(10)
    assert box == [(None, True)]


def test_shutdown_with_drain_waits_for_processing_keys(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    assert take(q) == "a"
    returned = threading.Event()
    thread = threading.Thread(target=lambda: (q.shutdown(drain=True), returned.set()), daemon=True)
    thread.start()
    assert not returned.wait(0.05)      # still waiting: "a" is being processed
    q.done("a")
    assert returned.wait(10)


def test_shutdown_drain_is_bounded(clock):
    q = WorkQueue("q", clock=clock)
    q.add("stuck")
    assert take(q) == "stuck"
    q.shutdown(drain=True, timeout_seconds=0.01)    # returns although "stuck" never finishes
    assert q.get(timeout_seconds=0) == (None, True)


# -- rate limiting ----------------------------------------------------------------------------

def test_add_rate_limited_backs_off_per_key_and_forget_resets(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    assert take(q) == "a"
    q.add_rate_limited("a")                 # failure 1: 5 ms
    q.done("a")
    assert take(q) is None
    clock.advance(0.005)
    assert take(q) == "a"
    q.add_rate_limited("a")                 # failure 2: 10 ms
    q.done("a")
    assert q.num_requeues("a") == 2
    clock.advance(0.009)
    assert take(q) is None
    clock.advance(0.001)
    assert take(q) == "a"
    q.forget("a")
    q.done("a")
    assert q.num_requeues("a") == 0
    q.add("a")
    assert take(q) == "a"
    q.add_rate_limited("a")                 # back to 5 ms
    q.done("a")
    clock.advance(0.005)
    assert take(q) == "a"


def test_the_overall_bucket_spreads_many_failing_keys(clock):
    q = WorkQueue("q", clock=clock)
    for i in range(101):
        q.add_rate_limited(f"k{i}")
    clock.advance(0.005)
    assert len(drain(q)) == 100             # the burst
    clock.advance(0.095)
    assert drain(q) == ["k100"]             # then 10 qps


def test_kubernetes_132805_an_early_attempt_does_not_double_the_backoff(clock):
    q = WorkQueue("q", clock=clock, rate_limiter=ItemExponentialLimiter(1.0, 1000.0))
    q.add("k")
    assert take(q) == "k"
    q.add_rate_limited("k")                 # failure 1: retry due in 1 s
    q.done("k")
    assert q.num_requeues("k") == 1

    q.add("k")                              # a watch event before the retry is due
    clock.advance(0.5)
    assert take(q) == "k"                   # an early attempt, at 0.5 s...
    q.add_rate_limited("k")                 # ...fails: not counted, retry stays at 1 s
    q.done("k")
    assert q.num_requeues("k") == 1

    clock.advance(0.5)
    assert take(q) == "k"                   # the retry, on time
    q.add_rate_limited("k")                 # fails: counted, next in 2 s
    q.done("k")
    assert q.num_requeues("k") == 2
    clock.advance(1.999)
    assert take(q) is None
    clock.advance(0.001)
    assert take(q) == "k"


def test_kubernetes_132805_early_attempt_that_outlives_the_due_time(clock):
    q = WorkQueue("q", clock=clock, rate_limiter=ItemExponentialLimiter(1.0, 1000.0))
    q.add_rate_limited("k")                 # failure 1, due in 1 s
    q.add("k")
    assert take(q) == "k"                   # early attempt starts at 0 s
    clock.advance(3.0)                      # ...runs past the due time, fails at 3 s
    assert take(q) is None                  # the due retry waits for done(), never concurrent
    q.add_rate_limited("k")
    q.done("k")
    assert q.num_requeues("k") == 1         # not counted: it started before the retry was due
    assert take(q) == "k"                   # the pending retry runs right away


def test_add_rate_limited_outside_processing_keeps_the_pending_retry(clock):
    q = WorkQueue("q", clock=clock, rate_limiter=ItemExponentialLimiter(1.0, 1000.0))
    q.add_rate_limited("k")
    q.add_rate_limited("k")
    assert q.num_requeues("k") == 1
    clock.advance(1.0)
    assert drain(q) == ["k"]


def test_a_forgotten_key_counts_failures_from_scratch(clock):
    q = WorkQueue("q", clock=clock, rate_limiter=ItemExponentialLimiter(1.0, 1000.0))
    q.add_rate_limited("k")
    q.forget("k")
    q.add("k")
    assert take(q) == "k"
    q.add_rate_limited("k")                 # counted: the old due time was forgotten
    q.done("k")
    assert q.num_requeues("k") == 1


# -- metrics ------------------------------------------------------------------------------------

def sample(registry, name, queue_name="q"):
    labels = {"name": queue_name, "controller": queue_name}
    if name == "workqueue_depth":
        labels["priority"] = "0"
    return registry.get_sample_value(name, labels)


def test_metrics(clock):
    registry = CollectorRegistry()
    q = WorkQueue("q", clock=clock, metrics=Metrics(registry),
                  rate_limiter=ItemExponentialLimiter(1.0, 10.0))
    q.add("a")
    q.add("a")
    q.add("b")
    assert sample(registry, "workqueue_depth") == 2
    assert sample(registry, "workqueue_adds_total") == 2

    clock.advance(2.0)
    assert take(q) == "a"
    assert sample(registry, "workqueue_depth") == 1
    assert sample(registry, "workqueue_queue_duration_seconds_count") == 1
    assert sample(registry, "workqueue_queue_duration_seconds_sum") == pytest.approx(2.0)

    clock.advance(3.0)
    assert take(q) == "b"
    clock.advance(1.0)
    # in flight: "a" for 4 s, "b" for 1 s
    assert sample(registry, "workqueue_unfinished_work_seconds") == pytest.approx(5.0)
    assert sample(registry, "workqueue_longest_running_processor_seconds") == pytest.approx(4.0)

    q.add_rate_limited("a")
    q.done("a")
    q.done("b")
    assert sample(registry, "workqueue_retries_total") == 1
    assert sample(registry, "workqueue_work_duration_seconds_count") == 2
    assert sample(registry, "workqueue_work_duration_seconds_sum") == pytest.approx(5.0)
    assert sample(registry, "workqueue_unfinished_work_seconds") == 0
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 0
    assert sample(registry, "workqueue_depth") == 0         # "a" is delayed, not queued
    clock.advance(1.0)
    assert take(q) == "a"
    assert sample(registry, "workqueue_adds_total") == 3


def test_every_delayed_or_rate_limited_add_is_a_retry(clock):
    # client-go's delaying queue counts a retry on every AddAfter (controller-runtime's
    # requeue_after results included), and AddRateLimited goes through AddAfter.
    registry = CollectorRegistry()
    q = WorkQueue("q", clock=clock, metrics=Metrics(registry))
    q.add("a")
    assert sample(registry, "workqueue_retries_total") == 0
    q.add_after("a", 30.0)
    q.add_after("b", 0)
    q.add_rate_limited("c")
    assert sample(registry, "workqueue_retries_total") == 3
    q.shutdown(drain=False)
    q.add_after("d", 1.0)                   # after shutdown: dropped, not counted
    assert sample(registry, "workqueue_retries_total") == 3


def test_depth_carries_controller_runtimes_priority_label(clock):
    registry = CollectorRegistry()
    q = WorkQueue("q", clock=clock, metrics=Metrics(registry))
    q.add("a")
    # "0", as a controller-runtime v0.24 controller's priority queue writes it
    assert registry.get_sample_value("workqueue_depth", {"name": "q", "controller": "q",
                                                         "priority": "0"}) == 1


def test_metrics_of_a_collected_queue_read_zero(clock):
    import gc

    registry = CollectorRegistry()
    q = WorkQueue("gone", clock=clock, metrics=Metrics(registry))
    q.add("a")
    take(q)
    del q
    gc.collect()
    assert sample(registry, "workqueue_unfinished_work_seconds", "gone") == 0


# -- the property: 16 real threads -------------------------------------------------------------

@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n_keys=st.integers(1, 3000),
       n_ops=st.integers(200, 4000), p_delayed=st.floats(0.0, 0.5),
       p_readd=st.floats(0.0, 0.6))
def test_property_concurrent_workers(seed, n_keys, n_ops, p_delayed, p_readd):
    """16 workers, 4 producers, random add (ordinary or low) / add_after (with or
    without priority) / add_rate_limited / clock moves.

    - no key is ever held by two workers at once;
    - every add of a key is followed by a get() of that key that started after it;
    - nothing is lost at shutdown: queued and re-added keys are all handed out,
      then every worker sees (None, True).
    """
    clock = FakeClock()
    q = WorkQueue("prop", clock=clock,
                  rate_limiter=MaxOfLimiter(ItemExponentialLimiter(0.5, 30.0),
                                            BucketLimiter(10.0, 100)))
    ticks = itertools.count()
    mu = threading.Lock()                   # guards the bookkeeping below
    in_flight: set = set()
    last_add: dict = {}                     # key -> tick just before its last add call
    last_start: dict = {}                   # key -> tick just after its last get()
    violations: list = []
    readd_gate = threading.Lock()
    readd_open = [True]

    def record_add(key):
        with mu:
            last_add[key] = next(ticks)

    def add_somehow(rng, key):
        record_add(key)
        roll = rng.random()
        if roll < p_delayed:
            q.add_after(key, rng.uniform(0.0, 3.0), priority=rng.randrange(2))
        elif roll < p_delayed * 1.5:
            q.add_rate_limited(key)
        else:
            q.add(key, priority=rng.choice((0, -1, LOW_PRIORITY)))

    def producer(index):
        rng = random.Random(seed + index)
        for _ in range(n_ops // 4):
            if rng.random() < 0.05:
                clock.advance(rng.uniform(0.0, 1.0))
                q.wake()
            add_somehow(rng, rng.randrange(n_keys))

    def worker(index):
        rng = random.Random(seed * 31 + index)
        while True:
            key, shut_down = q.get(timeout_seconds=0.05)
            if shut_down:
                return
            if key is None:
                continue
            with mu:
                if key in in_flight:
                    violations.append(f"{key} handed to two workers")
                in_flight.add(key)
                last_start[key] = next(ticks)
            if rng.random() < p_readd:
                with readd_gate:            # no re-adds once the test starts shutting down
                    if readd_open[0]:
                        add_somehow(rng, key)
            with mu:
                in_flight.discard(key)      # before done(): then another worker may take it
            if rng.random() < 0.5:
                q.forget(key)
            q.done(key)

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(16)]
    producers = [threading.Thread(target=producer, args=(i,), daemon=True) for i in range(4)]
    for thread in workers + producers:
        thread.start()
    for thread in producers:
        thread.join(60)
    with readd_gate:
        readd_open[0] = False
    clock.advance(1e6)                      # every delayed key is due
    q.shutdown(drain=True, timeout_seconds=30)
    for thread in workers:
        thread.join(60)
        assert not thread.is_alive()

    assert violations == []
    lost = [key for key, tick in last_add.items() if last_start.get(key, -1) < tick]
    assert lost == []
    assert q.get(timeout_seconds=0) == (None, True)
    assert len(q) == 0


# -- priority ------------------------------------------------------------------------------

def test_a_prioritised_key_goes_ahead_when_it_comes_due(clock):
    q = WorkQueue("q", clock=clock)
    q.add_after("held", 1.0, priority=1)
    for key in ("a", "b", "c"):
        q.add(key)
    clock.advance(1.0)
    assert drain(q) == ["held", "a", "b", "c"]


def test_an_event_for_a_prioritised_key_brings_it_ahead_at_once(clock):
    q = WorkQueue("q", clock=clock)
    for key in ("a", "b"):
        q.add(key)
    q.add_after("held", 30.0, priority=1)
    q.add("held")                          # its awaited event, long before the delay
    assert len(q) == 3
    assert drain(q) == ["held", "a", "b"]
    assert q._seconds_to_next_due_locked(clock()) is None   # no getter wakes for it
    q.add("other")
    clock.advance(30.0)                    # the hand-out kept the promise: no second pass
    assert drain(q) == ["other"]


def test_a_prioritised_delayed_add_is_dropped_once_the_key_is_handed_out(clock):
    # controller-runtime's priority queue: one entry per key, so an event that brings a
    # held key early is the only pass. The reconcile it runs asks again if it must.
    q = WorkQueue("q", clock=clock)
    q.add_after("held", 5.0, priority=1)
    q.add("held")
    assert take(q) == "held"
    q.add_after("held", 10.0, priority=1)  # asked again while processing: a new promise
    q.done("held")
    clock.advance(5.0)
    assert drain(q) == []                  # the first promise was kept by the hand-out
    clock.advance(5.0)
    assert drain(q) == ["held"]
    clock.advance(60.0)
    assert drain(q) == []


def test_a_prioritised_delayed_add_made_while_processing_survives_that_processing(clock):
    q = WorkQueue("q", clock=clock)
    q.add("held")
    assert take(q) == "held"
    q.add_after("held", 5.0, priority=1)   # the running reconcile's requeue_after
    q.done("held")
    assert drain(q) == []
    clock.advance(5.0)
    assert drain(q) == ["held"]


def test_a_poll_merged_with_a_prioritised_delayed_add_is_never_dropped(clock):
    for first, second in ((0, 1), (1, 0)):
        q = WorkQueue("q", clock=clock)
        q.add_after("k", 5.0, priority=first)
        q.add_after("k", 3.0, priority=second)
        q.add("k")
        assert drain(q) == ["k"]
        clock.advance(5.0)
        assert drain(q) == ["k"], (first, second)


def test_a_rate_limited_retry_is_never_dropped_by_a_hand_out(clock):
    q = WorkQueue("q", clock=clock, rate_limiter=ItemExponentialLimiter(1.0, 60.0))
    q.add_after("k", 5.0, priority=1)
    q.add_rate_limited("k")                # due in 1 s, merged into the earlier wait
    q.add("k")
    assert drain(q) == ["k"]
    clock.advance(1.0)
    assert drain(q) == ["k"]


def test_a_queued_key_that_gains_priority_moves_ahead(clock):
    q = WorkQueue("q", clock=clock)
    for key in ("a", "b", "c"):
        q.add(key)
    q.add_after("c", 5.0, priority=1)
    assert drain(q) == ["c", "a", "b"]


def test_priority_lasts_until_the_key_is_handed_out(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    q.add_after("b", 0, priority=1)        # due now: queued with priority
    assert take(q) == "b"
    q.done("b")
    q.add("c")
    q.add("b")                             # an ordinary add after that: back of the line
    assert drain(q) == ["a", "c", "b"]


def test_priority_while_processing_applies_when_it_is_queued_again(clock):
    q = WorkQueue("q", clock=clock)
    q.add("busy")
    assert take(q) == "busy"
    q.add("a")
    q.add_after("busy", 1.0, priority=1)
    q.add("busy")                          # dirty while processing
    q.done("busy")                         # queued again, with its priority
    assert drain(q) == ["busy", "a"]


def test_queued_seconds_is_the_wait_of_the_key_being_processed(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    clock.advance(2.5)
    assert take(q) == "a"
    assert q.queued_seconds("a") == 2.5 and q.queued_seconds("b") is None
    q.done("a")
    assert q.queued_seconds("a") is None


# -- the low line (a relist's keys) -------------------------------------------------------------

def test_low_keys_wait_behind_every_key_of_priority_zero_or_more(clock):
    q = WorkQueue("q", clock=clock)
    q.add_many(["l1", "l2", "l3"], priority=LOW_PRIORITY)
    q.add("a")
    q.add_after("held", 0, priority=1)
    q.add("l4", priority=-1)               # any negative priority is low
    q.add("b")
    assert drain(q) == ["held", "a", "b", "l4", "l1", "l2", "l3"]


def test_the_low_line_serves_the_highest_priority_first_then_the_earliest(clock):
    q = WorkQueue("q", clock=clock)
    q.add_many(["l1", "l2"], priority=LOW_PRIORITY)
    q.add_many(["u1", "u2"], priority=-1)
    q.add("l3", priority=LOW_PRIORITY)
    q.add("u3", priority=-1)
    q.add("m", priority=-50)
    q.add("u1", priority=LOW_PRIORITY)     # a lower add moves nothing down
    assert drain(q) == ["u1", "u2", "u3", "m", "l1", "l2", "l3"]


def test_an_ordinary_add_raises_a_low_key_and_a_low_add_lowers_nothing(clock):
    q = WorkQueue("q", clock=clock)
    q.add_many(["l1", "l2", "l3"], priority=LOW_PRIORITY)
    q.add("a")
    q.add("l2")                            # a watch event for a listed key
    q.add("a", priority=LOW_PRIORITY)      # a relist after the event: stays where it is
    q.add("l2", priority=LOW_PRIORITY)
    assert len(q) == 4
    assert drain(q) == ["a", "l2", "l1", "l3"]


def test_a_low_key_that_gains_a_priority_goes_first(clock):
    q = WorkQueue("q", clock=clock)
    q.add_many(["l1", "l2"], priority=LOW_PRIORITY)
    q.add("a")
    q.add_after("l2", 5.0, priority=1)
    assert drain(q) == ["l2", "a", "l1"]


def test_a_promised_key_added_low_is_lined_up_first(clock):
    q = WorkQueue("q", clock=clock)
    q.add("a")
    q.add_after("k", 5.0, priority=1)
    q.add("k", priority=LOW_PRIORITY)      # the promise wins over the relist's low add
    assert drain(q) == ["k", "a"]


def test_raising_leaves_stale_entries_that_are_skipped_and_bounded(clock):
    q = WorkQueue("q", clock=clock)
    keys = [f"k{i}" for i in range(10_000)]
    q.add_many(keys, priority=LOW_PRIORITY)
    for key in keys[1:]:
        q.add(key)                         # all but the first raised, one at a time
        assert len(q._low_line) <= 2 * q._low_queued + 64
    assert len(q) == 10_000
    assert drain(q) == keys[1:] + keys[:1]
    assert len(q._low_line) == 0 and q._low == {}


def test_low_add_while_processing_is_queued_low_at_done(clock):
    q = WorkQueue("q", clock=clock)
    q.add("k")
    assert take(q) == "k"
    q.add("k", priority=LOW_PRIORITY)      # a relist while its reconcile runs
    q.add("a")
    assert take(q) == "a"                  # never "k" twice at once
    q.done("k")
    q.add("b")
    assert drain(q) == ["b", "k"]


def test_an_ordinary_add_while_processing_raises_a_low_re_add(clock):
    q = WorkQueue("q", clock=clock)
    q.add("k", priority=LOW_PRIORITY)
    q.add("l", priority=LOW_PRIORITY)
    assert take(q) == "k"
    q.add("k", priority=LOW_PRIORITY)
    q.add("k")                             # then an event: done() lines it up ahead of "l"
    q.done("k")
    assert drain(q) == ["k", "l"]


def test_shutdown_hands_out_the_low_keys_too(clock):
    q = WorkQueue("q", clock=clock)
    q.add_many(["l1", "l2"], priority=LOW_PRIORITY)
    q.add("a")
    assert take(q) == "a"
    q.add("a", priority=LOW_PRIORITY)      # dirty while processing
    q.shutdown(drain=False)
    q.add("late", priority=LOW_PRIORITY)   # ignored after shutdown
    assert take(q) == "l1"
    q.done("a")                            # queued again, low
    assert [take(q), take(q)] == ["l2", "a"]
    for key in ("l1", "l2", "a"):
        q.done(key)
    assert q.get(timeout_seconds=0) == (None, True)
    assert len(q) == 0


def test_shutdown_drain_waits_for_a_low_key_being_processed(clock):
    q = WorkQueue("q", clock=clock)
    q.add("l", priority=LOW_PRIORITY)
    assert take(q) == "l"
    stopper = threading.Thread(target=q.shutdown, kwargs={"timeout_seconds": 30}, daemon=True)
    stopper.start()
    stopper.join(0.05)
    assert stopper.is_alive()              # still waiting for "l"
    q.done("l")
    stopper.join(10)
    assert not stopper.is_alive()
    assert q.get(timeout_seconds=0) == (None, True)


def test_depth_and_adds_count_low_keys(clock):
    registry = CollectorRegistry()
    q = WorkQueue("q", clock=clock, metrics=Metrics(registry))
    q.add_many(["l1", "l2", "l3"], priority=LOW_PRIORITY)
    q.add("a")
    assert sample(registry, "workqueue_depth") == 4
    q.add("l2")                            # raised: neither a new add nor a deeper queue
    assert sample(registry, "workqueue_depth") == 4
    assert sample(registry, "workqueue_adds_total") == 4
    assert take(q) == "a" and take(q) == "l2" and take(q) == "l1"
    assert sample(registry, "workqueue_depth") == 1
    assert len(q) == 1
