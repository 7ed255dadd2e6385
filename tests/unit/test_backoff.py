"""Backoff and rate limiters: pure arithmetic on an injected clock, no sleeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http.core.backoff import (Backoff, BucketLimiter, ItemExponentialLimiter, MaxOfLimiter,
                                   TokenBucket, default_controller_rate_limiter)
from tests.support.clock import FakeClock


# -- Backoff ---------------------------------------------------------------------

def test_backoff_doubles_from_0_8_to_30_seconds_without_jitter_noise():
    backoff = Backoff(clock=FakeClock(), rng=lambda: 0.0)
    delays = [backoff.next_delay() for _ in range(9)]
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0])


def test_backoff_jitter_stretches_each_delay_up_to_twice():
    backoff = Backoff(clock=FakeClock(), rng=lambda: 0.5)
    assert [backoff.next_delay() for _ in range(3)] == pytest.approx([1.2, 2.4, 4.8])
    capped = Backoff(clock=FakeClock(), rng=lambda: 0.999999)
    for _ in range(20):
        delay = capped.next_delay()
    assert 59.9 < delay < 60.0          # jitter survives at the cap: [30, 60)


@settings(max_examples=200, deadline=None)
@given(draws=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=30),
       jitter=st.floats(0.0, 2.0))
def test_backoff_delay_is_within_base_and_base_times_one_plus_jitter(draws, jitter):
    values = iter(draws)
    backoff = Backoff(clock=FakeClock(), jitter=jitter, rng=lambda: next(values))
    base = 0.8
    for _ in draws:
        delay = backoff.next_delay()
        assert base <= delay <= base * (1 + jitter) + 1e-9
        base = min(base * 2, 30.0)


def test_backoff_resets_after_two_minutes_without_failures():
    clock = FakeClock()
    backoff = Backoff(clock=clock, rng=lambda: 0.0)
    for _ in range(5):
        backoff.next_delay()
    clock.advance(119.0)                # not healthy long enough: keeps growing
    assert backoff.next_delay() == pytest.approx(25.6)
    clock.advance(120.5)
    assert backoff.next_delay() == pytest.approx(0.8)
    assert backoff.next_delay() == pytest.approx(1.6)


def test_backoff_reset_now():
    backoff = Backoff(clock=FakeClock(), rng=lambda: 0.0)
    for _ in range(4):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.8)


@pytest.mark.parametrize("kwargs", [{"initial_seconds": 0}, {"max_seconds": 0.1},
                                    {"factor": 0.5}, {"jitter": -1}])
def test_backoff_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)


# -- ItemExponentialLimiter --------------------------------------------------------

def test_item_exponential_5ms_doubling_per_key_capped_at_1000s():
    limiter = ItemExponentialLimiter()
    assert [limiter.when("a", now=0) for _ in range(4)] == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert limiter.when("b", now=0) == pytest.approx(0.005)     # keys are independent
    assert limiter.num_requeues("a") == 4
    delays = [limiter.when("a", now=0) for _ in range(3000)]    # far past float overflow
    assert max(delays) == 1000.0 and delays[-1] == 1000.0
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a", now=0) == pytest.approx(0.005)
    assert limiter.num_requeues("b") == 1


def test_item_exponential_reaches_the_cap_at_the_19th_failure():
    limiter = ItemExponentialLimiter()
    delays = [limiter.when("k", now=0) for _ in range(19)]
    assert delays[17] < 1000.0 and delays[18] == 1000.0


# -- TokenBucket / BucketLimiter ----------------------------------------------------------

def test_token_bucket_burst_then_qps():
    bucket = TokenBucket(10.0, 100)
    assert all(bucket.reserve(now=0.0) == 0.0 for _ in range(100))
    assert bucket.reserve(now=0.0) == pytest.approx(0.1)
    assert bucket.reserve(now=0.0) == pytest.approx(0.2)    # reservations queue up
    # 1 s later 10 tokens came back and 2 were owed: 8 go at once, the 9th waits 0.1 s
    waits = [bucket.reserve(now=1.0) for _ in range(9)]
    assert waits == pytest.approx([0.0] * 8 + [0.1])


def test_token_bucket_refills_only_up_to_burst():
    bucket = TokenBucket(10.0, 5)
    for _ in range(5):
        bucket.reserve(now=0.0)
    # an hour idle refills 5 tokens, not 36000
    assert [bucket.reserve(now=3600.0) for _ in range(6)] == pytest.approx([0, 0, 0, 0, 0, 0.1])


def test_token_bucket_clock_going_back_does_not_mint_tokens():
    bucket = TokenBucket(1.0, 1)
    assert bucket.reserve(now=10.0) == 0.0
    assert bucket.reserve(now=5.0) == pytest.approx(1.0)
    assert bucket.reserve(now=10.0) == pytest.approx(2.0)


def test_token_bucket_unlimited_when_qps_is_zero_or_negative():
    for qps in (0.0, -1.0):
        bucket = TokenBucket(qps, 0)
        assert all(bucket.reserve(now=0.0) == 0.0 for _ in range(10_000))


def test_token_bucket_uses_its_clock_when_now_is_omitted():
    clock = FakeClock(0.0)
    bucket = TokenBucket(2.0, 1, clock)
    assert bucket.reserve() == 0.0
    assert bucket.reserve() == pytest.approx(0.5)
    clock.advance(1.0)
    assert bucket.reserve() == pytest.approx(0.0)


def test_bucket_limiter_is_shared_by_all_keys():
    limiter = BucketLimiter(10.0, 100)
    assert all(limiter.when(f"k{i}", now=0.0) == 0.0 for i in range(100))
    assert limiter.when("other", now=0.0) == pytest.approx(0.1)
    limiter.forget("other")
    assert limiter.num_requeues("other") == 0


# -- MaxOfLimiter / default ------------------------------------------------------------------

def test_max_of_limiter_obeys_the_slowest_and_charges_all():
    item, bucket = ItemExponentialLimiter(1.0, 100.0), BucketLimiter(1.0, 1)
    limiter = MaxOfLimiter(item, bucket)
    assert limiter.when("a", now=0.0) == pytest.approx(1.0)     # item: 1 s; bucket: 0
    assert limiter.when("b", now=0.0) == pytest.approx(1.0)     # item: 1 s; bucket: 1 s
    assert limiter.when("a", now=0.0) == pytest.approx(2.0)     # item: 2 s; bucket: 2 s
    assert limiter.num_requeues("a") == 2
    limiter.forget("a")
    assert item.num_requeues("a") == 0 and limiter.num_requeues("b") == 1
    with pytest.raises(ValueError):
        MaxOfLimiter()


def test_default_controller_rate_limiter():
    limiter = default_controller_rate_limiter()
    # 100 keys failing at once: each waits its own 5 ms...
    assert all(limiter.when(f"k{i}", now=0.0) == pytest.approx(0.005) for i in range(100))
    # ...then the overall 10 qps budget takes over
    assert limiter.when("k100", now=0.0) == pytest.approx(0.1)
    # one key failing alone backs off to the 1000 s cap
    for _ in range(40):
        delay = limiter.when("lonely", now=1e9)
    assert delay == 1000.0
