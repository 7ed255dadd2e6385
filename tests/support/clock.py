"""A fake monotonic clock: what every time-injected class takes in unit tests.

Tests move time with `advance(seconds)` or by setting `now`; nothing sleeps.
Thread-safe, because the queue and runner tests read it from worker threads.
"""

from __future__ import annotations

import threading


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self._now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    @property
    def now(self) -> float:
        return self()

    @now.setter
    def now(self, value: float) -> None:
        with self._lock:
            self._now = value

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
