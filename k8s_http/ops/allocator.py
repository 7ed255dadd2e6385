"""The C allocator under CPython: fewer per-thread arenas, free pages given back.

Why: a burst of writes parses thousands of answers and events in worker and
watcher threads. glibc gives each thread its own arena (up to 8 per core) and
keeps the memory freed there: the RSS stays at the burst's peak. Two calls
fix most of it (measured in bench/write_memory.py):

  * `limit_arenas(n)` (mallopt M_ARENA_MAX) before the threads start: threads
    share n arenas, so freed memory is reused across them;
  * `release_free_memory()` (malloc_trim(0)) once a burst is over: returns
    the free pages inside every arena to the kernel.

Both are no-ops where the C library is not glibc (musl, macOS) or ctypes is
missing; they never raise.
"""

from __future__ import annotations

import logging
from typing import Callable

__all__ = ["limit_arenas", "release_free_memory", "TrimAfterBursts"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8        # glibc's mallopt parameter number (malloc.h)


def _libc():
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.mallopt          # glibc only  # noqa: B018
        libc.malloc_trim      # noqa: B018
        return libc
    except (ImportError, OSError, AttributeError):
        return None


_LIBC = _libc()


def limit_arenas(count: int) -> bool:
    """At most `count` malloc arenas from now on; True if the C library took it."""
    if _LIBC is None or count < 1:
        return False
    try:
        return bool(_LIBC.mallopt(_M_ARENA_MAX, int(count)))
    except Exception:           # a foreign libc with other signatures: leave it alone
        log.debug("mallopt(M_ARENA_MAX) failed", exc_info=True)
        return False


def release_free_memory() -> bool:
    """Give the free pages of every malloc arena back to the kernel; True if any were."""
    if _LIBC is None:
        return False
    try:
        return bool(_LIBC.malloc_trim(0))
    except Exception:
        log.debug("malloc_trim failed", exc_info=True)
        return False


class TrimAfterBursts:
    """Calls `release` when work stops: the first `tick()` that finds `busy()` false
    after one that found it true, at most once per `min_interval_seconds`.

    The Manager's supervisor ticks it every second, with busy = a queue holds a
    key or a reconcile is in flight. A burst that begins and ends between two
    ticks is not seen; the next one that is releases its memory too.
    """

    def __init__(self, busy: Callable[[], bool], *,
                 release: Callable[[], bool] = release_free_memory,
                 clock: Callable[[], float], min_interval_seconds: float = 10.0):
        self._busy = busy
        self._release = release
        self._clock = clock
        self._min_interval = min_interval_seconds
        self._was_busy = True          # the start-up (the initial lists) counts as a burst
        self._last = float("-inf")
        self.releases = 0

    def tick(self) -> None:
        if self._busy():
            self._was_busy = True
            return
        now = self._clock()
        if self._was_busy and now - self._last >= self._min_interval:
            self._was_busy = False
            self._last = now
            self._release()
            self.releases += 1
