"""ShardCaches: the sharded informers' parts follow the held slots without
re-listing what is still held (docs/SHARDING.md, section 6)."""

from __future__ import annotations

import random
import uuid

from k8s_http.cache.informer import Informer, own_key, owner_key
from k8s_http.control.shardcaches import ShardCaches
from k8s_http.control.workqueue import WorkQueue
from k8s_http.core import shards
from k8s_http.core.objects import DEPLOYMENTS, ObjectKey, Resource
from tests.support.clock import FakeClock
from tests.unit.test_informer_mappers import _taken as drain

MYS = Resource("mine.jp", "v1", "mys", "My")
LABEL = "sharding.example.com/slot"


def my(name, uid, rv="1"):
    return {"apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv}}


def child(owner, rv="1"):
    meta = owner["metadata"]
    return {"metadata": {"name": meta["name"], "namespace": "ns", "resourceVersion": rv,
                         "labels": {LABEL: str(shards.slot_of(meta["uid"]))},
                         "ownerReferences": [{"apiVersion": "mine.jp/v1", "kind": "My",
                                              "name": meta["name"], "controller": True}]}}


def setup(n=60, on_cached=None):
    clock = FakeClock()
    primary = Informer(None, MYS, namespaces=["ns"])
    children = Informer(None, DEPLOYMENTS, namespaces=["ns"])
    queue = WorkQueue("q")
    primary.add_handler(own_key, queue)
    children.add_handler(owner_key("My", "mine.jp"), queue)
    caches = ShardCaches(LABEL, clock=clock, consolidate_after_seconds=30, on_cached=on_cached)
    caches.add_primary(primary)
    caches.add_children(children, None)
    rng = random.Random(7)
    objs = [my(f"m{i}", str(uuid.UUID(int=rng.getrandbits(128)))) for i in range(n)]
    return clock, primary, children, queue, caches, objs


def slot(obj):
    return shards.slot_of(obj["metadata"]["uid"])


def list_part(informer, part_id, items):
    part = informer._parts[part_id]
    informer._deliver(part, "ns", informer._on_sync, "ns", items, part)


def newest(informer):
    return max(informer.part_ids())


def test_a_gain_adds_a_part_and_holds_back_only_the_gained_slots_until_both_caches_listed():
    clock, primary, children, queue, caches, objs = setup()
    half = frozenset(range(128))
    caches.select(half)
    ours = [o for o in objs if slot(o) in half]
    list_part(primary, newest(primary), objs)
    list_part(children, newest(children), [child(o) for o in ours])
    assert caches.pending_slots() == 0 and primary.has_synced()
    drain(queue)
    first_primary, first_children = primary.part_ids(), children.part_ids()

    caches.select(frozenset(range(256)))            # a member died: the rest is ours
    # The held slots' parts stay; one more part each, for the gained slots alone.
    assert primary.part_ids()[:1] == first_primary and len(primary.part_ids()) == 2
    assert children.part_ids()[:1] == first_children and len(children.part_ids()) == 2
    assert caches.pending_slots() == 128
    gained = next(o for o in objs if slot(o) >= 128)
    held = next(o for o in ours)
    assert caches.defer(slot(gained), queue, ObjectKey("ns", "early"))
    assert not caches.defer(slot(held), queue, ObjectKey("ns", held["metadata"]["name"]))
    # The gained part's list leaves the held part's objects alone.
    list_part(primary, newest(primary), objs)
    assert len(primary.store) == len(objs)
    assert caches.pending_slots() == 128            # the children have not listed yet
    drain(queue)
    list_part(children, newest(children), [child(o) for o in objs if slot(o) >= 128])
    assert caches.pending_slots() == 0
    # The children's list queues their owners; what waited is queued again.
    assert set(drain(queue)) == {"early"} | {o["metadata"]["name"] for o in objs
                                             if slot(o) >= 128}
    assert len(children.store) == len(objs)


def test_a_loss_narrows_at_once_and_a_quiet_while_later_one_part_replaces_them_all():
    clock, primary, children, queue, caches, objs = setup()
    caches.select(frozenset(range(100)))
    list_part(primary, newest(primary), objs)
    list_part(children, newest(children), [child(o) for o in objs if slot(o) < 100])
    caches.select(frozenset(range(200)))
    list_part(primary, newest(primary), objs)
    list_part(children, newest(children), [child(o) for o in objs if 100 <= slot(o) < 200])
    drain(queue)
    caches.select(frozenset(range(50, 200)))        # a member joined: 0-49 go to it
    kept = {o["metadata"]["name"] for o in objs if 50 <= slot(o) < 200}
    assert {k.name for k in primary.store.keys()} == kept
    assert {k.name for k in children.store.keys()} == kept
    assert sorted(drain(queue)) == sorted(o["metadata"]["name"] for o in objs if slot(o) < 50)
    assert not caches.consolidate_if_due()          # not quiet for long enough
    clock.advance(31)
    assert caches.consolidate_if_due()
    assert len(primary.part_ids()) == 3 and primary.has_synced()   # the two serve meanwhile
    merged = newest(primary)
    assert primary._parts[merged].watchers["ns"]._shard == {
        "shard_selector": shards.ranges_of_slots(range(50, 200)).shard_selector()}
    changed = next(o for o in objs if 50 <= slot(o) < 200)
    items = [my(o["metadata"]["name"], o["metadata"]["uid"], rv="2") if o is changed else o
             for o in objs]
    list_part(primary, merged, items)
    list_part(children, newest(children), [child(o) for o in objs if 50 <= slot(o) < 200])
    assert primary.part_ids() == [merged] and len(children.part_ids()) == 1
    assert {k.name for k in primary.store.keys()} == kept
    assert drain(queue) == [changed["metadata"]["name"]]      # only what changed
    assert not caches.consolidate_if_due()
    clock.advance(60)
    assert not caches.consolidate_if_due()          # one part, selecting what is held


def test_slots_lost_while_listing_are_no_longer_pending_and_nothing_held_watches_nothing():
    clock, primary, children, queue, caches, objs = setup()
    caches.select(frozenset(range(10)))
    assert caches.pending_slots() == 10
    caches.select(frozenset(range(5)))
    assert caches.pending_slots() == 5
    caches.select(frozenset())
    assert caches.pending_slots() == 0
    assert primary.part_ids() == [] and children.part_ids() == [] and primary.has_synced()


def test_a_part_losing_slots_before_its_first_list_starts_again_on_what_it_keeps():
    clock, primary, children, queue, caches, objs = setup()
    caches.select(frozenset(range(256)))            # alone for a moment: every slot
    assert caches.defer(3, queue, ObjectKey("ns", "early"))
    caches.select(frozenset(range(80)))             # the others joined before it listed
    (part_id,) = primary.part_ids()
    assert primary._parts[part_id].watchers["ns"]._shard == {
        "shard_selector": shards.ranges_of_slots(range(80)).shard_selector()}
    assert caches.pending_slots() == 80
    list_part(primary, part_id, objs)
    list_part(children, newest(children), [child(o) for o in objs if slot(o) < 80])
    assert caches.pending_slots() == 0
    assert "early" in drain(queue)                  # what waited is carried over
    assert {k.name for k in primary.store.keys()} == {
        o["metadata"]["name"] for o in objs if slot(o) < 80}


def test_keys_held_back_come_back_low_those_awaiting_their_reconcile_first():
    clock, primary, children, queue, caches, objs = setup()
    caches.select(frozenset(range(256)))
    assert caches.defer(1, queue, ObjectKey("ns", "unchanged"))
    assert caches.defer(2, queue, ObjectKey("ns", "new"), urgent=True)
    list_part(primary, newest(primary), [])
    list_part(children, newest(children), [])
    queue.add(ObjectKey("ns", "event"))             # the held slots' events go first
    assert drain(queue) == ["event", "new", "unchanged"]


def test_objects_per_range_names_each_held_range_with_the_objects_cached_in_it():
    clock, primary, children, queue, caches, objs = setup(n=300)
    assert caches.objects_per_range() == []        # nothing held, nothing named
    held = frozenset([*range(0, 40), *range(100, 130), 200])
    caches.select(held)
    list_part(primary, newest(primary), objs)
    list_part(children, newest(children), [child(o) for o in objs if slot(o) in held])
    spans = shards.ranges_of_slots(held).spans
    assert len(spans) == 3

    def expected(gone=()):
        def count(span):
            return sum(1 for o in objs if o not in gone
                       and span[0] <= shards.fnv1a_64(o["metadata"]["uid"]) < span[1])
        return [(str(resource), shards.span_text(span), count(span))
                for resource in (MYS, DEPLOYMENTS) for span in spans]

    assert caches.objects_per_range() == expected()
    assert sum(n for _, _, n in caches.objects_per_range()) == 2 * sum(
        1 for o in objs if slot(o) in held)

    # Counted again only once a cache has changed (an idle scrape hashes nothing).
    reads = []
    real_leaves = primary.store.leaves
    primary.store.leaves = lambda path: reads.append(path) or real_leaves(path)
    caches.objects_per_range()
    assert reads == []
    gone = next(o for o in objs if slot(o) in held)
    primary.store.delete(gone)
    assert caches.objects_per_range()[:3] == expected(gone=[gone])[:3]
    assert len(reads) == 1


def test_a_child_slot_label_names_a_slot_only_when_it_is_one():
    slot_of_label = shards.slot_of_label
    assert [slot_of_label(v) for v in ("0", "17", "255")] == [0, 17, 255]
    assert [slot_of_label(v) for v in ("256", "-1", "0x1", "", " 1", "٣", None, 3)] == \
        [None] * 8


def test_filled_once_every_held_slot_is_cached_and_told_each_time_slots_are():
    """The Manager ends the start-up fill (gctuning.CacheFill) and logs "caches
    synced" only when the share is in: before any claim the caches are empty."""
    told = []
    clock, primary, children, queue, caches, objs = setup(
        on_cached=lambda: told.append(caches.filled()))
    assert not caches.filled()                      # nothing held yet
    caches.select(frozenset())
    assert not caches.filled() and primary.has_synced()   # synced, and empty
    caches.select(frozenset(range(128)))
    list_part(primary, newest(primary), objs)
    assert not caches.filled() and told == []       # the children are still listing
    list_part(children, newest(children), [child(o) for o in objs if slot(o) < 128])
    assert caches.filled() and told == [True]
    caches.select(frozenset(range(256)))
    assert not caches.filled()                      # gained slots listing
    list_part(primary, newest(primary), objs)
    list_part(children, newest(children), [child(o) for o in objs if slot(o) >= 128])
    assert told == [True, True]


def test_serving_once_some_held_slot_is_cached_so_a_first_share_is_not_taken_key_by_key():
    """The Manager's worker gate: while every held slot is still listing there is
    nothing to serve, and keys taken then would each be deferred and queued again,
    list by list. Slots gained later do not close it (their keys are deferred)."""
    clock, primary, children, queue, caches, objs = setup()
    caches.select(frozenset())
    assert not caches.serving()                     # nothing held
    caches.select(frozenset(range(128)))
    assert not caches.serving()                     # all of it listing
    list_part(primary, newest(primary), objs)
    assert not caches.serving()
    list_part(children, newest(children), [child(o) for o in objs if slot(o) < 128])
    assert caches.serving()
    caches.select(frozenset(range(256)))            # more gained: the first share is served
    assert caches.serving()
    caches.select(frozenset(range(128, 256)))       # only the listing ones left
    assert not caches.serving()
