"""SettledVersions: skip a reconcile when nothing it reads has changed since one finished.

A level-based reconciler is woken by resyncs and by the watch's copies of its
own writes as well as by real changes. When it reads nothing but cached
objects (say a parent and its children, all named by the key), the same
resourceVersions in the caches give the same answer, so it may remember the
versions it finished with and skip the next call while the caches still show
them: a few `Store.resource_version` reads, nothing built.

Per key it keeps one hash of the versions, not the strings: one int per key
at scale; a false match needs a 64-bit collision for the same key. Whoever
settles passes the versions the reconcile worked from or wrote, never a fresh
cache read: a version the watch brought meanwhile has not been reconciled yet.
One worker at a time per key (the work queue's promise): each entry has one
writer, and dict operations are atomic under the GIL.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from ..core.objects import resource_version_of

__all__ = ["SettledVersions"]


class SettledVersions:
    def __init__(self, stores: Mapping, resources: Sequence):
        """`stores`: the caches a reconcile reads by resource (each `Store`, or
        anything with `resource_version(key)`, looked up at each call);
        `resources`: those holding an object named by the key, in the order of
        the objects later given to `settle`."""
        self._stores = stores
        self._resources = tuple(resources)
        self._settled: dict[Hashable, int] = {}

    def unchanged(self, key: Hashable) -> bool:
        """The caches show the versions `key` was last settled with."""
        settled = self._settled.get(key)
        return settled is not None and settled == hash(tuple(
            self._stores[resource].resource_version(key) for resource in self._resources))

    def settle(self, key: Hashable, *objs: dict | None) -> None:
        """A reconcile of `key` finished with `objs` (None for a missing one),
        one per store, in the stores' order."""
        self._settled[key] = hash(tuple(resource_version_of(obj) for obj in objs))

    def forget(self, key: Hashable) -> None:
        """Reconcile `key` next time whatever the caches show."""
        self._settled.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._settled
