"""StatusHold: when to hold back a status write for an answer that is on its way.

A reconciler that reports on a child another controller is working on (our
Deployment, while the Deployment controller rolls it out) would write its
status twice: now, and again when that controller's status update arrives a
moment later. Holding the write back for a short window lets one write report
both. The policy, per key:

  * nothing is held while the other controller is not at work (`pending`
    False), nor for a status that is not about it (`pending` None: a failure);
  * a window opens when a status change is first held: `coalesce_seconds`, or
    as long as the key has just waited in the work queue if that was longer
    (under a burst the user already waits that long, and the other controller
    is about as far behind), never longer than `cap_seconds`. The held status
    is written when the answer comes or, at the window's end, as it stands; a
    change after that opens another window, so a long rollout is reported at
    most once per window;
  * an *episode* runs from the key first seen with the other controller at
    work to its answer, and is judged once, by its first window: a *hit* when
    the answer reached us within it (its arrival is the answer's reconcile
    less what that reconcile waited in our queue: an answer whose event
    waited behind a long queue was still on time), a *miss* when the window
    ended first. Episodes that were not held are judged too, by the window
    they would have had, so a controller that starts answering again is
    noticed;
  * holding pays only when the answer is likely to come within the window, so
    a window is held only while the running share of hits (exponentially
    weighted, `weight` for the newest) is at least `min_hit_rate`. A
    controller that does not answer at all (it is down, or the cluster has
    none) stops the holds after a few windows, whatever their length. (A mean
    of answer times did not: a window stretched by the queue's delay taught it
    only that the answer takes about as long as the window, and every status
    change of a backlog waited out its whole window.)

The caller comes back with priority (Result.priority) when `wait` says so, so
the other controller's update goes ahead of the queue. Time is injected; one
worker at a time per key (the work queue's promise), so each key's entries
have one writer. The share is updated without a lock: a lost judgement only
makes it a little staler.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

__all__ = ["StatusHold"]


class StatusHold:
    def __init__(self, *, coalesce_seconds: float = 0.5, cap_seconds: float = 10.0,
                 weight: float = 0.2, min_hit_rate: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 queued_seconds: Callable[[], float | None] = lambda: None):
        self.coalesce_seconds = coalesce_seconds
        self.cap_seconds = cap_seconds
        self.weight = weight
        self.min_hit_rate = min_hit_rate
        self._clock = clock
        self._queued_seconds = queued_seconds      # how long this key waited in the queue
        # key -> clock() its episode's first window ends; None once the episode is
        # judged. An entry exists while the other controller is at work on the key.
        self._episodes: dict[Hashable, float | None] = {}
        self._held_until: dict[Hashable, float] = {}   # key -> clock() its hold ends
        self.hit_rate = 1.0     # the running share of episodes answered within their window

    def wait(self, key: Hashable, pending: bool | None) -> float:
        """Seconds to hold back a status change of `key`; 0 means write it now.
        `pending`: whether the other controller is at work; None: not about it."""
        if pending is None:
            return 0.0
        now = self._clock()
        if not pending:                   # the answer is in: no hold is left
            self._held_until.pop(key, None)
            first_end = self._episodes.pop(key, None)
            if first_end is not None:
                self._judge(now - (self._queued_seconds() or 0.0) <= first_end)
            return 0.0
        window = min(max(self.coalesce_seconds, self._queued_seconds() or 0.0),
                     self.cap_seconds)
        first_end = self._episodes.setdefault(key, now + window)
        if first_end is not None and first_end <= now:
            self._episodes[key] = None    # the first window ended unanswered
            self._judge(False)
        until = self._held_until.get(key)
        if until is None:
            if self.hit_rate < self.min_hit_rate:
                return 0.0
            until = self._held_until[key] = now + window
        elif until <= now:
            # The window is over and the answer has not come: write it as it
            # stands (release() after the write is then a no-op).
            del self._held_until[key]
            return 0.0
        return until - now

    def _judge(self, hit: bool) -> None:
        self.hit_rate += self.weight * ((1.0 if hit else 0.0) - self.hit_rate)

    def held_until(self, key: Hashable) -> float | None:
        """clock() at which `key`'s hold ends; None when it is not held."""
        return self._held_until.get(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._held_until

    def release(self, key: Hashable) -> None:
        """The status was written, or needs no write: the hold is over (the
        episode goes on, to be judged by its answer)."""
        self._held_until.pop(key, None)

    def forget(self, key: Hashable) -> None:
        """The object is gone."""
        self._held_until.pop(key, None)
        self._episodes.pop(key, None)
