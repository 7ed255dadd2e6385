"""The only place tests poll.

    from tests.support.wait import eventually
    eventually(lambda: len(server.requests) == 2, message="second request never arrived")
    obj = eventually(lambda: store.get(key))          # returns the first truthy value

The predicate may also raise AssertionError while the condition does not hold
yet; the last such error is re-raised (with its message) when time runs out.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

__all__ = ["eventually"]

T = TypeVar("T")


def eventually(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               message: str | None = None) -> T:
    """Call `predicate` until it returns a truthy value (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last_error: AssertionError | None = None
    while True:
        try:
            result = predicate()
        except AssertionError as e:
            last_error = e
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            text = message or getattr(predicate, "__name__", "condition")
            if last_error is not None:
                raise AssertionError(f"{text} (not true after {timeout}s): {last_error}") \
                    from last_error
            raise AssertionError(f"{text} (not true after {timeout}s)")
        time.sleep(interval)
