"""The caches of a sharded manager, kept in step with the slots it holds.

Each sharded informer watches the held slots as parts (informer.add_part), one
per batch of slots gained together (docs/SHARDING.md, section 6):

- Gaining slots adds a part for them alone to every sharded informer. The held
  slots' watches go on, and so do the reconciles of their objects, while the
  new part lists. The keys of a gained slot are deferred until its part has
  listed in every informer (a `My` is never reconciled before its children
  are cached), then queued as a first list's keys are: low, the objects the
  controller's urgent test picks (a `My` awaiting its reconcile) ahead of the
  others, all behind the held slots' watch events.
- Losing slots narrows the parts' filters at once: their objects leave the
  caches. Their watches still select the lost slots on the server. A part
  still making its first list starts again on the slots it keeps.
- Consolidation: once nothing is pending, and the parts are more than one or
  select more than is held, for CONSOLIDATE_AFTER_SECONDS, one part for all
  the held slots replaces them. It lists in the background while they serve,
  then takes their objects over; only what changed meanwhile is enqueued.

Before this, a change of the held slots restarted every watch and re-listed
the whole share, and until that list was in no reconcile ran: at 30,000 `My`
the survivors of a SIGKILL served nothing for 80 s.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from ..cache.informer import LISTED_URGENT_PRIORITY, LOW_PRIORITY, Informer
from ..core import shards
from ..core.objects import ObjectKey, meta_of

__all__ = ["ShardCaches", "CONSOLIDATE_AFTER_SECONDS"]

log = logging.getLogger(__name__)

# How long the held slots stay unchanged, with nothing pending, before the
# parts are merged into one: long enough that a rolling update's joins and
# leaves (seconds apart) are merged once, not once per replica.
CONSOLIDATE_AFTER_SECONDS = 30.0

_UID = ("metadata", "uid")


class _SlotPart:
    """Slots watched together: a part in each sharded informer.

    `slots` is what its filters keep (held slots only); `selected` what its
    selectors ask the server for (a superset once slots were lost); `ids` its
    part in each informer; `waiting` the informers whose part has not listed
    yet; `deferred` the (queue, key) pairs held back until none is waiting;
    `replaces` the parts it takes over (a consolidation)."""

    __slots__ = ("slots", "selected", "ids", "waiting", "deferred", "replaces", "since")

    def __init__(self, slots: frozenset[int], replaces: list[_SlotPart], since: float):
        self.slots = slots
        self.selected = slots
        self.ids: dict[Informer, int] = {}
        self.waiting: set[Informer] = set()
        self.deferred: list[tuple[object, ObjectKey, bool]] = []    # (queue, key, urgent)
        self.replaces = replaces
        self.since = since


class ShardCaches:
    """The sharded informers' parts, and which slots are still listing.

    `select(held)` is called by one thread at a time (the shard member's);
    `defer` by the workers, `_listed` by watcher threads. `_lock` guards
    `_parts`, `_pending` and each part's `waiting` and `deferred`; it is never
    held while calling into an informer (a part's removal joins its watcher
    threads, which may be waiting for this lock in `_listed`)."""

    def __init__(self, slot_label: str, *, clock: Callable[[], float] = time.monotonic,
                 consolidate_after_seconds: float = CONSOLIDATE_AFTER_SECONDS,
                 on_cached: Callable[[], None] | None = None):
        """`on_cached()`: called (on a watcher's thread) each time gained slots
        have listed in every sharded informer; `filled()` then says whether
        every held slot is cached."""
        self.slot_label = slot_label
        self._clock = clock
        self._on_cached = on_cached
        self._consolidate_after = consolidate_after_seconds
        self._primaries: list[Informer] = []
        self._children: list[tuple[Informer, str | None]] = []
        self._lock = threading.Lock()
        self._parts: list[_SlotPart] = []
        self._pending: dict[int, _SlotPart] = {}   # slot -> its part, until listed everywhere
        self._held: frozenset[int] = frozenset()
        self._changed_at = clock()
        self._took_over = False     # the informers' own first parts are gone
        # select() and consolidate_if_due() one at a time (they add and drop parts).
        self._changing = threading.Lock()
        # informer -> (its store's version, its objects per slot then), and a
        # primary's uid -> slot of the objects it held then: see _per_slot.
        self._counted: dict[Informer, tuple[int, Counter]] = {}
        self._uid_slots: dict[Informer, dict[str, int]] = {}

    def add_primary(self, informer: Informer) -> None:
        self._primaries.append(informer)

    def add_children(self, informer: Informer, label_selector: str | None) -> None:
        """Children, selected by the slot label (and `label_selector`, their base)."""
        self._children.append((informer, label_selector))

    def informers(self) -> list[Informer]:
        return [*self._primaries, *(i for i, _ in self._children)]

    # ---- the held slots change (the member's thread) ----

    def select(self, held: frozenset[int]) -> None:
        """Watch `held`: a part for what was gained, narrowed parts for what was lost."""
        with self._changing:
            if not self._took_over:
                # The informers' own first parts (all of the resource) go: only
                # held slots are watched, and nothing is held yet.
                self._took_over = True
                for informer in self.informers():
                    for part_id in informer.part_ids():
                        informer.remove_part(part_id)
            lost, gained = self._held - held, held - self._held
            self._held = held
            self._changed_at = self._clock()
            if lost:
                self._drop(lost)
            if gained:
                self._add(gained, replaces=[])

    def _drop(self, lost: frozenset[int]) -> None:
        with self._lock:
            touched = [p for p in self._parts if p.slots & lost]
            for part in touched:
                part.slots = part.slots - lost
            for slot in lost:
                self._pending.pop(slot, None)
            # A part still making its first list starts again on what it keeps:
            # nothing of it is served yet, and the server then sends only that
            # (a replica that claimed every slot at start-up, alone for a moment,
            # would otherwise list them all before it may serve its share).
            again = [p for p in touched if p.slots and p.waiting and not p.replaces]
            self._parts = [p for p in self._parts if p.slots and p not in again]
        for part in touched:
            for informer, part_id in part.ids.items():
                if part.slots and part not in again:
                    informer.narrow_part(part_id, self._keep(informer, part.slots))
                else:
                    informer.remove_part(part_id)
        for part in again:
            self._add(part.slots, replaces=[], carried=part)

    def _add(self, slots: frozenset[int], replaces: list[_SlotPart],
             carried: _SlotPart | None = None) -> None:
        """A part for `slots` in every sharded informer; `carried`: the part it
        starts again, whose deferred keys become its own."""
        part = _SlotPart(slots, replaces, self._clock())
        informers = self.informers()
        with self._lock:
            part.waiting = set(informers)
            if carried is not None:
                part.deferred, carried.deferred = carried.deferred, []
                part.since = carried.since
            if not replaces:
                for slot in slots:
                    self._pending[slot] = part
            self._parts.append(part)
        for informer in informers:
            part.ids[informer] = informer.add_part(
                **self._selectors(informer, slots), keep=self._keep(informer, slots),
                replaces=[p.ids[informer] for p in replaces if informer in p.ids],
                on_synced=functools.partial(self._listed, part, informer))

    def _selectors(self, informer: Informer, slots: Iterable[int]) -> dict[str, str]:
        if informer in self._primaries:
            return {"shard_selector": shards.ranges_of_slots(slots).shard_selector()}
        base = dict(self._children)[informer]
        selector = shards.slot_label_selector(self.slot_label, slots)
        return {"label_selector": f"{base},{selector}" if base else selector}

    def _keep(self, informer: Informer, slots: Iterable[int]) -> Callable[[dict], bool]:
        """The client-side filter: a primary by its uid's hash (the server may
        ignore shardSelector), a child by its slot label."""
        if informer in self._primaries:
            ranges = shards.ranges_of_slots(slots)
            return lambda obj: shards.keeps(obj, ranges)
        values = frozenset(shards.slot_label_value(s) for s in slots)
        label = self.slot_label
        return lambda obj: (meta_of(obj).get("labels") or {}).get(label) in values

    # ---- a part has listed (a watcher's thread) ----

    def _listed(self, part: _SlotPart, informer: Informer) -> None:
        with self._lock:
            part.waiting.discard(informer)
            if part.waiting:
                return
            for slot in part.slots:
                if self._pending.get(slot) is part:
                    del self._pending[slot]
            deferred, part.deferred = part.deferred, []
            if part.replaces:
                self._parts = [p for p in self._parts if p not in part.replaces]
                part.replaces = []
        log.info("cached %d slots in %.3f s (%d keys were waiting for them)", len(part.slots),
                 self._clock() - part.since, len(deferred))
        if self._on_cached is not None:
            self._on_cached()
        by_queue: dict[tuple[int, int], tuple[object, int, list[ObjectKey]]] = {}
        for queue, key, urgent in deferred:
            priority = LISTED_URGENT_PRIORITY if urgent else LOW_PRIORITY
            by_queue.setdefault((id(queue), priority), (queue, priority, []))[2].append(key)
        for queue, priority, keys in by_queue.values():
            queue.add_many(dict.fromkeys(keys), priority=priority)

    # ---- the workers ----

    def defer(self, slot: int, queue, key: ObjectKey, *, urgent: bool = False) -> bool:
        """True if `slot`'s part is still listing: `key` is held back and queued
        again once it has (the caller skips this reconcile), low unless `urgent`
        (its object awaits its reconcile: see informer.add_handler)."""
        with self._lock:
            part = self._pending.get(slot)
            if part is None:
                return False
            part.deferred.append((queue, key, urgent))
            return True

    def serving(self) -> bool:
        """Some held slot is cached: there is work to do. While every held slot is
        still listing (a replica's first share), the workers wait (the Manager's
        gate): the keys each list queues then meet in the queue once per object,
        where taken at once they would each be deferred and queued again, list
        by list (75,467 reconciles for 30,000 `My` at one start, measured)."""
        with self._lock:
            return len(self._pending) < len(self._held)     # _pending is within _held

    def pending_slots(self) -> int:
        with self._lock:
            return len(self._pending)

    def filled(self) -> bool:
        """Slots are held and every one of them is cached: the replica's share
        is in (until then its caches hold nothing, or part of it)."""
        with self._lock:
            return bool(self._held) and not self._pending

    # ---- what the caches hold, per range (a scrape's thread) ----

    def objects_per_range(self) -> list[tuple[str, str, int]]:
        """(resource, range, objects cached in it) for each sharded informer and
        each contiguous hash range [start, end) the held slots make up (named by
        shards.span_text): the ranges this replica serves, and how full each is.
        Empty while nothing is held."""
        spans = shards.ranges_of_slots(self._held).spans
        rows = []
        for informer in self.informers():
            per_slot = self._per_slot(informer)
            resource = str(informer.resource)
            for start, end in spans:
                slots = range(shards.slot_of_hash(start), shards.slot_of_hash(end - 1) + 1)
                rows.append((resource, shards.span_text((start, end)),
                             sum(per_slot[s] for s in slots)))
        return rows

    def _per_slot(self, informer: Informer) -> Counter:
        """The informer's cached objects per slot: a primary's by its uid's hash,
        a child's by its slot label; read from one leaf of each object (nothing is
        built). Counts are kept until the store changes (an idle replica's scrapes
        count nothing), and each uid is hashed once (~9 us each, ~90 ms for
        10,000): its slot is remembered while its object is cached (~30 bytes a
        uid, the strings are the cache's own), so a recount takes ~1 us an object."""
        store = informer.store
        version = store.version
        counted = self._counted.get(informer)
        if counted is not None and counted[0] == version:
            return counted[1]
        if informer in self._primaries:
            known = self._uid_slots.get(informer, {})
            slots = {}
            for uid in store.leaves(_UID):
                if isinstance(uid, str):
                    slot = known.get(uid)
                    slots[uid] = shards.slot_of(uid) if slot is None else slot
            self._uid_slots[informer] = slots       # the uids gone are forgotten
            per_slot = Counter(slots.values())
        else:
            # Counted by label value first (in C), then the 256-odd values read.
            per_slot = Counter()
            for value, count in Counter(
                    store.leaves(("metadata", "labels", self.slot_label))).items():
                per_slot[shards.slot_of_label(value)] += count
        self._counted[informer] = (version, per_slot)
        return per_slot

    # ---- consolidation (the supervisor's thread) ----

    def consolidate_if_due(self) -> bool:
        """Merge the parts into one for the held slots, when due (see the module
        docstring); True if a consolidation was started."""
        with self._changing:
            with self._lock:
                parts = list(self._parts)
                busy = bool(self._pending) or any(p.waiting for p in parts)
            if busy or not parts or not self._held:
                return False
            if len(parts) == 1 and parts[0].selected == parts[0].slots:
                return False
            if self._clock() - self._changed_at < self._consolidate_after:
                return False
            log.info("merging %d cache parts into one for %d slots", len(parts), len(self._held))
            self._add(self._held, replaces=parts)
            return True
