"""write_through: a write whose answer the cache shows at once (read-your-writes).

A reconciler reads its caches, and a write's answer reaches them only when the
watch brings it, a moment later: read before then, the cache shows the object
as it was, and the reconciler would act on it again. `write_through` sends the
write between `Store.begin_write` and `Store.end_write`, so the store answers
with the written object until the watch brings it (or a newer one), and names
the reconcile that wrote (`current_work()`): the watch's copy, arriving after
the answer, does not bring that key back, since that reconcile has seen it.
"""

from __future__ import annotations

from collections.abc import Callable

from .runner import current_work

__all__ = ["write_through"]


def write_through(store, send: Callable[[], dict], *, base: dict | None = None) -> dict:
    """send() (a create, apply, patch ... of one object in `store`'s resource),
    remembered by `store` until its watch brings it. `base`: the object the
    write was computed from, when there is one (see Store.end_write). A write
    that raises is remembered as nothing, and the error goes on."""
    token = store.begin_write()
    written = None
    try:
        written = send()
        return written
    finally:
        store.end_write(token, written, base=base, writer=current_work())
