"""CPython's cyclic garbage collector while the caches fill, and once they have.

Why: at start-up the informers decode, pack and keep tens of thousands of
objects. The collector runs on allocation counts and, as the kept objects pile
up, its full collections walk every one of them: over a fleet of 30,000 My
(90,000 cached objects) three full collections took 0.24 s of a 5.3 s start-up
and the younger ones another 0.11 s (measured with gc.callbacks).

`CacheFill.begin()` raises the youngest generation's threshold while the
caches fill: what is allocated then is either freed at once by reference
counting (a decoded event, once packed) or kept for good (the cache), so
collecting young objects finds next to nothing. The collector still runs,
only rarely, so a fill that never ends (an apiserver down at start-up) cannot
pile up cyclic garbage without bound.

`end()` puts the thresholds back and freezes what is alive (gc.freeze): the
filled caches move to the permanent generation, which no later collection
walks. Frozen objects are still freed by reference counting as usual; only a
reference cycle among them would never be collected, and the caches hold none
(packed objects are flat tuples of leaves).

Process-wide, like allocator.py: the Manager, which owns the process, calls it.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["CacheFill"]

# Net allocations of container objects between two young collections while the
# caches fill (CPython's default is 700): ~2 per cached object stay, so a fill of
# 90,000 objects runs a couple of young collections and no full one.
FILL_THRESHOLD = 100_000


class CacheFill:
    """begin() when the informers start, end() once every cache has synced (both once)."""

    def __init__(self, threshold: int = FILL_THRESHOLD):
        self._threshold = threshold
        self._saved: tuple[int, ...] | None = None
        self._lock = threading.Lock()
        self._done = False

    def begin(self) -> None:
        with self._lock:
            if self._saved is not None or self._done:
                return
            self._saved = gc.get_threshold()
            if self._saved[0] and self._saved[0] < self._threshold:   # 0: collection is off
                gc.set_threshold(self._threshold, *self._saved[1:])

    def end(self, *, freeze: bool = True) -> None:
        """Thresholds back; with `freeze`, what is alive now is never walked again.
        (Without: a manager stopped before its caches synced just restores them.)"""
        with self._lock:
            if self._done:
                return
            self._done = True
            saved, self._saved = self._saved, None
        if saved is not None:
            gc.set_threshold(*saved)
        if freeze:
            gc.freeze()
