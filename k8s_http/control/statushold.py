"""StatusHold: when to hold back a status write for an answer that is on its way.

A reconciler that reports on a child another controller is working on (our
Deployment, while the Deployment controller rolls it out) would write its
status twice: now, and again when that controller's status update arrives a
moment later. Holding the write back for a short window lets one write report
both. The policy, per key:

  * nothing is held while the other controller is not at work (`pending`
    False), nor for a status that is not about it (`pending` None: a failure);
  * a window is fixed when the key is first held: `coalesce_seconds`, or as
    long as the key has just waited in the work queue if that was longer
    (under a burst the user already waits that long, and the other controller
    is about as far behind), never longer than `cap_seconds`. At its end the
    status is written as it stands;
  * holding pays only when the answer is likely to come within the window, so
    it is skipped while the other controller's recent answers took longer: a
    running mean (exponentially weighted, `weight` for the newest sample) of
    the time from "at work" to "done", less what the answer's own reconcile
    waited in our queue (an answer whose event waited behind a long queue
    says nothing about that controller, and counting it would keep keys from
    being held after a burst, so every spec change cost two writes);
  * a window that ends before the answer came is a sample too: the answer
    takes at least that long (from "at work" to the window's end, less the
    same queue wait). Without it, a controller that does not answer at all (it
    is down, or the cluster has none) would never be learnt of, and every
    status change would wait out its whole window, however long the queue
    had made it.

The caller comes back with priority (Result.priority) when `wait` says so, so
the other controller's update goes ahead of the queue. Time is injected; one
worker at a time per key (the work queue's promise), so each key's entries
have one writer. The mean is updated without a lock: a lost sample only makes
it a little staler.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

__all__ = ["StatusHold"]


class StatusHold:
    def __init__(self, *, coalesce_seconds: float = 0.5, cap_seconds: float = 10.0,
                 weight: float = 0.2, clock: Callable[[], float] = time.monotonic,
                 queued_seconds: Callable[[], float | None] = lambda: None):
        self.coalesce_seconds = coalesce_seconds
        self.cap_seconds = cap_seconds
        self.weight = weight
        self._clock = clock
        self._queued_seconds = queued_seconds      # how long this key waited in the queue
        self._held_until: dict[Hashable, float] = {}   # key -> clock() the hold ends
        self._pending_since: dict[Hashable, float] = {}  # key -> first seen at work
        self.answer_seconds = 0.0       # the running mean of the other controller's answers

    def wait(self, key: Hashable, pending: bool | None) -> float:
        """Seconds to hold back a status change of `key`; 0 means write it now.
        `pending`: whether the other controller is at work; None: not about it."""
        if pending is None:
            return 0.0
        now = self._clock()
        if not pending:
            self._held_until.pop(key, None)         # the answer is in: no hold is left
            since = self._pending_since.pop(key, None)
            if since is not None:
                self._learn(now - since)
            return 0.0
        since = self._pending_since.setdefault(key, now)
        until = self._held_until.get(key)
        if until is None:
            window = min(max(self.coalesce_seconds, self._queued_seconds() or 0.0),
                         self.cap_seconds)
            if self.answer_seconds > window:
                return 0.0
            until = self._held_until[key] = now + window
        elif until <= now:
            # The window is over and the answer has not come: it takes at least
            # this long. The hold ends here (release() after the write is then a no-op).
            del self._held_until[key]
            self._learn(now - since)
            return 0.0
        return until - now

    def _learn(self, seconds: float) -> None:
        """A sample of the answer time: `seconds` since "at work", less what the
        key being reconciled now waited in our queue."""
        sample = max(0.0, seconds - (self._queued_seconds() or 0.0))
        self.answer_seconds += self.weight * (sample - self.answer_seconds)

    def held_until(self, key: Hashable) -> float | None:
        """clock() at which `key`'s hold ends; None when it is not held."""
        return self._held_until.get(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._held_until

    def release(self, key: Hashable) -> None:
        """The status was written, or needs no write: the hold is over."""
        self._held_until.pop(key, None)

    def forget(self, key: Hashable) -> None:
        """The object is gone."""
        self._held_until.pop(key, None)
        self._pending_since.pop(key, None)
