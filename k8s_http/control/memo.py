"""GenerationMemo: what a pure function made of an object, remembered per generation.

A controller validates and renders a parent object at every reconcile, though
its spec changes far less often than its status: with the status subresource
on, the spec cannot change without `metadata.generation`. So a result computed
from the name, namespace, uid and spec can be remembered under
(key, uid, generation); an object without a generation is remembered by its
resourceVersion, and one without either is not remembered.

Bounded: the last `size` versions, least recently used first out, whatever
the number of objects. Results are kept marshalled (a rendered Deployment and
Service take ~1 kB so, ~7 kB as dicts, and load as fast as the dicts are
built), so each hit is a new copy the caller owns. Results must therefore be
made of what `marshal` takes (dicts, lists, tuples, strings, numbers). Thread
safe.
"""

from __future__ import annotations

import collections
import marshal
import threading
from collections.abc import Callable, Hashable
from typing import Any

from ..core.objects import meta_of, resource_version_of

__all__ = ["GenerationMemo"]


class GenerationMemo:
    def __init__(self, size: int = 1024):
        self.size = size
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, obj: dict, compute: Callable[[dict], Any]) -> Any:
        """compute(obj), or a copy of what it gave for this version of `obj`."""
        meta = meta_of(obj)
        generation = meta.get("generation")
        version = (key, meta.get("uid"),
                   generation if isinstance(generation, int) else resource_version_of(obj))
        if version[2] is None:
            return compute(obj)
        with self._lock:
            remembered = self._entries.get(version)
            if remembered is not None:
                self._entries.move_to_end(version)
        if remembered is not None:
            return marshal.loads(remembered)
        value = compute(obj)
        with self._lock:
            self._entries[version] = marshal.dumps(value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)
