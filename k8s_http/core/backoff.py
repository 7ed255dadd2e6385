"""Backoff and rate limiting: pure arithmetic, no threads, no sleeping.

Time is always passed in (`now=`) or injected (`clock=`), so every number here
can be tested with a fake clock. Nothing here waits: each class answers "how
long should the caller wait", and the caller decides how to wait.

- `Backoff`: how long a watch waits before reconnecting after a failure.
- `ItemExponentialLimiter`, `BucketLimiter`, `MaxOfLimiter`: the work queue's
  retry limiters (`WorkQueue.add_rate_limited`), client-go's defaults.
- `TokenBucket`: a qps/burst budget, for the transport's client-side limit and
  for `BucketLimiter`.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Callable, Hashable, Protocol

__all__ = [
    "Backoff",
    "RateLimiter",
    "ItemExponentialLimiter",
    "BucketLimiter",
    "MaxOfLimiter",
    "TokenBucket",
    "default_controller_rate_limiter",
]


class Backoff:
    """Reconnect backoff for a watch (client-go's reflector backoff manager).

    Delays double from `initial_seconds` up to `max_seconds`; each delay is
    then stretched by a random factor in [1, 1 + jitter), as client-go's
    `wait.Jitter` does. With the defaults a watch waits 0.8-1.6 s, 1.6-3.2 s,
    ... and finally 30-60 s between attempts: 0.8 s -> 30 s, about 0.02-0.03
    QPS per watch while the apiserver is down, so a restarting apiserver is
    not hammered by its clients. The jitter spreads clients that all lost the
    apiserver at the same moment, also at the cap, where it matters most.

    The backoff resets by itself when `reset_after_seconds` (2 minutes) have
    passed since the last delay was handed out: a watch that has been healthy
    that long starts again from 0.8 s on its next failure. `reset()` does it
    at once.
    """

    def __init__(self, *, initial_seconds: float = 0.8, max_seconds: float = 30.0,
                 factor: float = 2.0, jitter: float = 1.0, reset_after_seconds: float = 120.0,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random):
        if initial_seconds <= 0 or max_seconds < initial_seconds or factor < 1.0 or jitter < 0:
            raise ValueError("Backoff needs 0 < initial_seconds <= max_seconds, factor >= 1, "
                             "jitter >= 0")
        self.initial_seconds = initial_seconds
        self.max_seconds = max_seconds
        self.factor = factor
        self.jitter = jitter
        self.reset_after_seconds = reset_after_seconds
        self._clock = clock
        self._rng = rng
        self._base = initial_seconds          # the un-jittered delay the next failure gets
        self._last_delay_at: float | None = None   # clock() of the last next_delay()

    def next_delay(self) -> float:
        """The delay before the next attempt; counts one failure."""
        now = self._clock()
        if self._last_delay_at is not None and now - self._last_delay_at > self.reset_after_seconds:
            self._base = self.initial_seconds
        self._last_delay_at = now
        delay = self._base
        self._base = min(self._base * self.factor, self.max_seconds)
        return delay * (1.0 + self.jitter * self._rng())

    def reset(self) -> None:
        """Forget past failures: the next delay is `initial_seconds` again (jittered)."""
        self._base = self.initial_seconds
        self._last_delay_at = None


class RateLimiter(Protocol):
    """What `WorkQueue` asks of a retry limiter (client-go's RateLimiter)."""

    def when(self, key: Hashable, *, now: float) -> float:
        """Seconds `key` should wait before its retry; records one more failure."""

    def forget(self, key: Hashable) -> None:
        """`key` succeeded (or was given up): drop its failure history."""

    def num_requeues(self, key: Hashable) -> int:
        """Failures recorded for `key` since it was last forgotten."""


class ItemExponentialLimiter:
    """Per-key exponential backoff: base * 2^failures, capped.

    With client-go's defaults (5 ms, 1000 s) a key that keeps failing is retried
    after 5 ms, 10 ms, 20 ms, ... reaching the 1000 s (about 17 min) cap at the
    19th failure, about 22 minutes after the first one. Fast enough that a
    transient conflict costs milliseconds; slow enough that a permanently broken
    object costs one reconcile every ~17 minutes.

    Thread-safe: a limiter may be shared by queues fed from many threads.
    """

    def __init__(self, base_seconds: float = 0.005, max_seconds: float = 1000.0):
        self.base_seconds = base_seconds
        self.max_seconds = max_seconds
        self._lock = threading.Lock()
        self._failures: dict[Hashable, int] = {}   # key -> failures since its last forget()

    def when(self, key: Hashable, *, now: float) -> float:
        with self._lock:
            exponent = self._failures.get(key, 0)
            self._failures[key] = exponent + 1
        # 2.0 ** exponent overflows a float only past 1023; the cap is hit long before.
        if exponent > 64:
            return self.max_seconds
        return min(self.base_seconds * 2.0 ** exponent, self.max_seconds)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def num_requeues(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class TokenBucket:
    """A token bucket: `qps` tokens a second, at most `burst` saved up.

    `reserve()` always takes a token and returns how long the caller must wait
    before using it (0 when one was in the bucket). Tokens may go negative: each
    reservation queues behind the ones before it, like Go's `rate.Limiter.Reserve`,
    so concurrent callers are spread out at `qps` instead of all waking together.
    `qps <= 0` means unlimited. Thread-safe.
    """

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.qps = float(qps)
        self.burst = max(1, int(burst))     # a bucket that holds no token would never send
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(self.burst)    # starts full: the first `burst` calls go at once
        self._last: float | None = None     # clock() when _tokens was last brought up to date

    def reserve(self, *, now: float | None = None) -> float:
        """Take one token; return the seconds to wait before acting on it."""
        if self.qps <= 0:
            return 0.0
        if now is None:
            now = self._clock()
        with self._lock:
            if self._last is not None and now > self._last:
                self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            if self._last is None or now > self._last:
                self._last = now           # a clock that steps back never refills twice
            self._tokens -= 1.0
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self.qps


class BucketLimiter:
    """An overall retry budget shared by every key (client-go: 10 qps, burst 100).

    It caps the retry storm when many keys fail at once (say the apiserver is
    down and every reconcile errors): after a burst of 100 retries they are
    spread out at 10 a second, whatever their per-key backoff says.
    """

    def __init__(self, qps: float = 10.0, burst: int = 100):
        self._bucket = TokenBucket(qps, burst)

    def when(self, key: Hashable, *, now: float) -> float:
        return self._bucket.reserve(now=now)

    def forget(self, key: Hashable) -> None:
        pass

    def num_requeues(self, key: Hashable) -> int:
        return 0


class MaxOfLimiter:
    """Asks every limiter and obeys the slowest (controller-runtime's default shape).

    Every limiter is asked on every `when()`, so each one records the failure
    (and the bucket spends a token) even when another one's answer wins.
    """

    def __init__(self, *limiters: RateLimiter):
        if not limiters:
            raise ValueError("MaxOfLimiter needs at least one limiter")
        self.limiters = limiters

    def when(self, key: Hashable, *, now: float) -> float:
        return max([limiter.when(key, now=now) for limiter in self.limiters])

    def forget(self, key: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(key)

    def num_requeues(self, key: Hashable) -> int:
        return max(limiter.num_requeues(key) for limiter in self.limiters)


def default_controller_rate_limiter() -> MaxOfLimiter:
    """controller-runtime's default: max(per key 5 ms -> 1000 s, overall 10 qps / burst 100)."""
    return MaxOfLimiter(ItemExponentialLimiter(0.005, 1000.0), BucketLimiter(10.0, 100))
