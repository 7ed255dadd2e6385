"""The fake clock and stop signal: what every time-injected class takes in unit tests.

Tests move time with `advance(seconds)` or by setting `now`; nothing sleeps.
Thread-safe, because the queue and runner tests read it from worker threads.
"""

from __future__ import annotations

import threading


class FakeClock:
    """A monotonic clock that moves only when told.

    `tick`: every reading moves it on by that much afterwards (a clock that runs
    at one step per reading, e.g. to keep rate limits out of a test's way).
    """

    def __init__(self, now: float = 1000.0, *, tick: float = 0.0):
        self._now = now
        self._tick = tick
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            now = self._now
            self._now += self._tick
            return now

    @property
    def now(self) -> float:
        with self._lock:
            return self._now

    @now.setter
    def now(self, value: float) -> None:
        with self._lock:
            self._now = value

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class FakeStopEvent:
    """A `threading.Event` look-alike for loops that wait between attempts.

    wait(t) returns at once, records t in `waits` and, given a clock, moves the
    clock on by t (the time the wait would have taken). The event is set by
    set(), or once the clock reaches `stop_at`. A wait without a timeout fails
    the test: in the real loop it would block until stopped.
    """

    def __init__(self, clock: FakeClock | None = None, stop_at: float | None = None):
        self.clock = clock
        self.stop_at = stop_at
        self.waits: list[float] = []
        self._set = False

    def is_set(self) -> bool:
        return self._set or (self.stop_at is not None and self.clock.now >= self.stop_at)

    def set(self) -> None:
        self._set = True

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None, "a wait without timeout would block forever in a fake"
        self.waits.append(timeout)
        if self.clock is not None:
            self.clock.advance(timeout)
        return self.is_set()
