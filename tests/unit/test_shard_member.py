"""k8s_http.control.sharding: the member Lease, the handshake, the fence; and the
informer's reselect (issue 37, docs/SHARDING.md)."""

from __future__ import annotations

import logging
import random
import threading
import uuid

import pytest

from k8s_http.cache.informer import Informer, own_key
from k8s_http.control.leader import LeaderRecord
from k8s_http.control.sharding import (FORGET_SECONDS, REJOIN_GRACE_SECONDS, UNCACHED,
                                       NotOwnerError, SeenLease, ShardMember, current_slot,
                                       decode_slots, encode_slots, expired_leases, live_claims,
                                       plan)
from k8s_http.core import shards
from k8s_http.core.errors import ForbiddenError, NotFoundError
from k8s_http.core.objects import LEASES, ObjectKey
from k8s_http.core.shards import SLOTS, ranges_of_slots, slots_of
from k8s_http.ops.metrics import Metrics
from tests.support.clock import FakeClock
from tests.support.fake_client import InMemoryApiClient
from tests.unit.test_informer_mappers import Queue

ANNOTATION = "sharding.example.com/slots"


def lease(name, holder, slots=(), duration=15):
    return {"metadata": {"name": name, "annotations": {ANNOTATION: encode_slots(slots)}},
            "spec": LeaderRecord(holder, duration).to_spec()}


def test_the_bitmap_round_trips_and_garbage_reads_as_nothing():
    for slots in (set(), {0}, {255}, set(range(0, 256, 3))):
        text = encode_slots(slots)
        assert len(text) == SLOTS // 4
        assert decode_slots(text) == frozenset(slots)
    for garbage in (None, "", "xyz", 12):
        assert decode_slots(garbage) == frozenset()
    with pytest.raises(ValueError):
        encode_slots([256])


def test_live_claims_skip_our_lease_released_leases_and_expired_ones():
    observed: dict[str, SeenLease] = {}
    leases = [lease("me", "me_1", {1}), lease("b", "b_1", {2, 3}), lease("c", "", {4}),
              lease("d", "d_1", {5})]
    members, claims = live_claims(leases, "me", ANNOTATION, observed, now=100.0)
    assert members == {"b_1", "d_1"}                      # "c" was released: no holder
    assert claims == {"b_1": {2, 3}, "d_1": {5}}
    # d renews (its record changes), b does not: 15 s later b is expired, d is not.
    leases[3]["spec"]["renewTime"] = "2026-01-01T00:00:01.000000Z"
    live_claims(leases, "me", ANNOTATION, observed, now=110.0)
    members, claims = live_claims(leases, "me", ANNOTATION, observed, now=115.0)
    assert members == {"d_1"} and claims == {"d_1": {5}}
    # A Lease that disappeared lists what it last listed until it would have
    # expired (d last changed at 110); expired ones that are gone are forgotten
    # FORGET_SECONDS after they were last shown.
    members, claims = live_claims(leases[:1], "me", ANNOTATION, observed, now=116.0)
    assert members == {"d_1"} and claims == {"d_1": {5}}
    members, claims = live_claims(leases[:1], "me", ANNOTATION, observed, now=125.0)
    assert members == set() and set(observed) == {"b", "c", "d"}
    live_claims(leases[:1], "me", ANNOTATION, observed, now=116.0 + FORGET_SECONDS)
    assert observed == {}


def test_an_expired_lease_gone_from_a_list_is_still_expired_in_a_view_behind_it():
    """The member that deleted an expired Lease may plan next on its watch's cache,
    which has not had the deletion yet: the same record must look expired there,
    not new (a member counted live for a duration takes slots from the others)."""
    seen: dict[str, SeenLease] = {}
    dead = lease("b", "b_1", {2, 3})
    dead["metadata"]["resourceVersion"] = "7"
    live_claims([dead], "me", ANNOTATION, seen, now=100.0)
    assert expired_leases(seen, 114.0) == {}
    assert expired_leases(seen, 115.0) == {"b": "7"}
    members, _ = live_claims([], "me", ANNOTATION, seen, now=116.0)     # a list: deleted
    assert members == set() and expired_leases(seen, 116.0) == {}        # nothing to delete
    members, claims = live_claims([dead], "me", ANNOTATION, seen, now=117.0)   # the cache
    assert members == set() and claims == {}
    # Made again (its replica came back under the same name): a new record, live.
    again = lease("b", "b_2", {9})
    again["metadata"]["resourceVersion"] = "12"
    members, claims = live_claims([again], "me", ANNOTATION, seen, now=118.0)
    assert members == {"b_2"} and claims == {"b_2": {9}}


def test_plan_releases_what_is_no_longer_ours_and_claims_only_what_is_free():
    want_alone = slots_of("a", {"a"})
    assert want_alone == frozenset(range(SLOTS))
    step = plan("a", set(), frozenset(), {})
    assert step.claim == want_alone and not step.release
    # b joins, holding nothing yet: a releases b's share and claims nothing.
    step = plan("a", {"b"}, want_alone, {"b": frozenset()})
    assert step.release == slots_of("b", {"a", "b"}) and not step.claim
    # b may claim its share only once a no longer lists it.
    b_share = slots_of("b", {"a", "b"})
    assert plan("b", {"a"}, frozenset(), {"a": want_alone}).claim == frozenset()
    assert plan("b", {"a"}, frozenset(), {"a": want_alone - b_share}).claim == b_share


class Ring:
    """Members on one in-memory apiserver, each with its own clock reading."""

    def __init__(self):
        self.client = InMemoryApiClient()
        self.client.lists = self._list
        self.clock = FakeClock()
        self.changes: dict[str, list[frozenset[int]]] = {}

    def _list(self, resource, *, namespace=None, label_selector=None, **_):
        key, _, value = (label_selector or "").partition("=")
        items = [o for (plural, _k), o in self.client.objects.items() if plural == resource.plural
                 and (not key or (o["metadata"].get("labels") or {}).get(key) == value)]
        return {"metadata": {"resourceVersion": self.client.next_resource_version()},
                "items": [dict(o) for o in items]}

    def ring_leases(self) -> list[dict]:
        return self._list(LEASES, label_selector="sharding.example.com/ring=app")["items"]

    def member(self, name, **kwargs) -> ShardMember:
        self.changes[name] = []
        return ShardMember(self.client, namespace="ns", app="app", member_name=name,
                           identity=f"{name}_x", label_domain="sharding.example.com",
                           on_change=self.changes[name].append, metrics=Metrics(),
                           clock=self.clock, **kwargs)


class WatchedRing:
    """What a member reads of its ring informer, as a stand-in: listed, its store
    the ring's Leases as they are now, or `frozen` (a watch fallen behind)."""

    def __init__(self, ring: Ring):
        self._ring = ring
        self.frozen: list[dict] | None = None
        self.watching = True           # False: the watch is down (backing off)
        self.store = self

    def has_synced(self) -> bool:
        return True

    def is_watching(self) -> bool:
        return self.watching

    def list(self) -> list[dict]:
        return self._ring.ring_leases() if self.frozen is None else self.frozen

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def join(member: ShardMember) -> None:
    assert member.elector.try_acquire_or_renew()


def slots_annotation(ring, name):
    lease = ring.client.get(LEASES, f"app-member-{name}", namespace="ns")
    return decode_slots(lease["metadata"]["annotations"]["sharding.example.com/slots"])


def release(member: ShardMember, slots: frozenset[int]) -> None:
    with member._transition:
        member._release_locked(slots)


def two_members(ring: Ring) -> tuple[ShardMember, ShardMember]:
    a, b = ring.member("a"), ring.member("b")
    join(a), join(b)
    return a, b


def test_members_split_the_slots_without_overlap_and_hand_over_on_leave():
    ring = Ring()
    a, b = ring.member("a"), ring.member("b")
    join(a)
    a.tick()
    assert a.held == frozenset(range(SLOTS)) and a.ready()[0]
    assert ring.changes["a"][-1] == a.held
    lease_a = ring.client.get(LEASES, "app-member-a", namespace="ns")
    assert lease_a["metadata"]["labels"] == {"sharding.example.com/ring": "app"}
    assert decode_slots(lease_a["metadata"]["annotations"]["sharding.example.com/slots"]) \
        == a.held
    join(b)
    b.tick()
    assert b.held == frozenset()          # everything is still listed by a
    a.tick()                              # a sees b, releases b's share, publishes
    b.tick()                              # b claims it
    members = {"a_x", "b_x"}
    assert a.held == slots_of("a_x", members) and b.held == slots_of("b_x", members)
    assert a.held | b.held == frozenset(range(SLOTS)) and not a.held & b.held
    b.leave()                             # SIGTERM: Lease released, nothing listed
    assert b.held == frozenset()
    a.tick()
    assert a.held == frozenset(range(SLOTS))


def test_a_dead_members_slots_move_only_once_its_lease_expired():
    ring = Ring()
    a, b = two_members(ring)
    for m in (a, b, a, b):
        m.tick()
    b_share = b.held
    assert b_share
    ring.clock.advance(14.0)              # b is silent (killed); a renews
    join(a)
    a.tick()
    assert a.held == frozenset(range(SLOTS)) - b_share
    ring.clock.advance(1.0)               # 15 s since b's Lease last changed
    join(a)
    a.tick()
    assert a.held == frozenset(range(SLOTS))


def b_silent_for_a_duration() -> tuple[Ring, ShardMember, ShardMember]:
    """a and b share the ring; then 15 s pass in which only a renews."""
    ring = Ring()
    a, b = two_members(ring)
    for m in (a, b, a, b):
        m.tick()
    ring.clock.advance(15.0)
    join(a)
    return ring, a, b


def test_an_expired_lease_is_deleted_once_so_a_later_member_never_counts_it():
    ring, a, _ = b_silent_for_a_duration()      # b was killed
    ring.client.reset()
    a.tick()
    assert a.held == frozenset(range(SLOTS))
    (delete,) = [c for c in ring.client.calls if c[0] == "delete"]
    assert delete[2] == "app-member-b" and delete.kwargs["preconditions"]["resourceVersion"]
    a.tick()                              # gone: not tried again
    assert ring.client.verbs().count("delete") == 1
    # A replica started now sees a ring of one and takes its share at once.
    c = ring.member("c")
    join(c)
    c.tick()
    a.tick()
    c.tick()
    assert c.held == slots_of("c_x", {"a_x", "c_x"})


def test_an_expired_lease_renewed_before_the_delete_is_kept():
    """The delete names the record found expired: a member that renewed in
    between (it was only slow) keeps its Lease, and the 409 is no error."""
    ring, a, b = b_silent_for_a_duration()
    real_delete = ring.client.delete

    def renew_first(*args, **kwargs):
        join(b)                           # lands between a's round and its delete
        return real_delete(*args, **kwargs)
    ring.client.delete = renew_first
    a.tick()
    assert ring.client.get(LEASES, "app-member-b", namespace="ns")
    ring.client.delete = real_delete
    ring.client.reset()
    a.tick()                              # b renewed: live again, nothing deleted
    assert "delete" not in ring.client.verbs()


def test_a_role_without_delete_on_leases_is_said_once_and_the_ring_works_on(caplog):
    ring, a, _ = b_silent_for_a_duration()
    ring.client.fail_on["delete"] = ForbiddenError(403, "leases is forbidden: delete",
                                                   reason="Forbidden")
    with caplog.at_level(logging.WARNING, logger="k8s_http.control.sharding"):
        for _ in range(3):
            a.tick()
            ring.clock.advance(0.5)
    assert a.held == frozenset(range(SLOTS))
    assert ring.client.verbs().count("delete") == 1
    assert [r.message for r in caplog.records].count(
        next(r.message for r in caplog.records if "cannot delete" in r.message)) == 1


def test_live_claims_never_take_a_record_from_a_view_older_than_the_last_one():
    """The watch's cache may lag a list: its older record of a Lease must not
    restart that Lease's clock (a stopped member would never expire)."""
    seen: dict[str, SeenLease] = {}
    old, new = lease("b", "b_1", {2}), lease("b", "b_1", {2, 3})
    old["metadata"]["resourceVersion"], new["metadata"]["resourceVersion"] = "9", "10"
    new["spec"]["renewTime"] = "2026-01-01T00:00:01.000000Z"
    live_claims([new], "me", ANNOTATION, seen, now=100.0)      # from a list
    _, claims = live_claims([old], "me", ANNOTATION, seen, now=101.0)   # the cache, behind
    assert claims == {"b_1": {2, 3}} and seen["b"].observation.observed_at == 100.0
    members, _ = live_claims([old], "me", ANNOTATION, seen, now=115.0)
    assert members == set()                                    # expired on time


def settled(ring: Ring, *names: str) -> list[ShardMember]:
    members = [ring.member(n, ring=WatchedRing(ring)) for n in names]
    for m in members:
        join(m)
    for _ in range(2):
        for m in members:
            m.tick()
    assert frozenset().union(*(m.held for m in members)) == frozenset(range(SLOTS))
    return members


def test_rounds_read_the_watched_ring_and_list_only_before_acting():
    ring = Ring()
    a, b = settled(ring, "a", "b")
    ring.client.reset()
    for second in range(30):              # 30 s of renewals and rounds: nothing to do
        if second % 2 == 0:
            join(a), join(b)
        for _ in range(2):
            a.tick(), b.tick()
            ring.clock.advance(0.5)
    assert "list" not in ring.client.verbs()
    b_share = b.held
    b.leave()                             # the watch shows b's Lease released
    ring.client.reset()
    a.tick()
    assert a.held == frozenset(range(SLOTS)) and b_share
    assert ring.client.verbs().count("list") == 2      # before the claim, and confirming it


def test_a_watch_fallen_behind_costs_a_list_per_lease_duration_and_takes_nothing():
    """a's cache stops moving while b renews: when b's cached record looks expired,
    a's round lists, finds b renewed and claims nothing; the list's newer record
    keeps b live until it could have expired again."""
    ring = Ring()
    a, b = settled(ring, "a", "b")
    a_share = a.held
    a.ring.frozen = ring.ring_leases()
    ring.client.reset()
    lists = []
    for tick in range(2 * 31):            # 31 s, a round every 0.5 s
        if tick % 4 == 0:
            join(a), join(b)
        a.tick()
        lists.append(ring.client.verbs().count("list"))
        ring.clock.advance(0.5)
    assert a.held == a_share
    # The first list once b's cached record is 15 s old (30 rounds), the next
    # 15 s after it; none in between.
    assert lists.index(1) == 30 and lists.index(2) == 60 and lists[-1] == 2


def test_rounds_refused_by_rbac_say_so_once_and_hold_nothing(caplog):
    """A Role without `list` on leases: the first round warns (and the probe says
    it failed), the next ones are quiet (debug), and no slot is held."""
    ring = Ring()
    a = ring.member("a")
    join(a)
    ring.client.fail_on["list"] = ForbiddenError(403, 'leases is forbidden: cannot "list"')
    with caplog.at_level(logging.DEBUG, logger="k8s_http.control.sharding"):
        for _ in range(5):
            a.run_round()
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(loud) == 2, loud
    assert loud[0].startswith("shardSelector probe failed")
    assert loud[1].startswith("shard ring round failed")
    assert a.held == frozenset() and not a.ready()[0]


def test_a_claim_that_loses_the_race_is_withdrawn():
    ring = Ring()
    a, b = two_members(ring)
    # b claims between a's first list and a's confirming list.
    real = ring._list
    calls = []

    def list_then_b_claims(resource, **kw):
        calls.append(1)
        if len(calls) == 2:
            b._published = frozenset({7})
            join(b)
        return real(resource, **kw)
    ring.client.lists = list_then_b_claims
    a._members = set()
    a.tick()
    assert 7 not in a.held
    lease_a = ring.client.get(LEASES, "app-member-a", namespace="ns")
    assert 7 not in decode_slots(lease_a["metadata"]["annotations"]["sharding.example.com/slots"])


def test_the_fence_refuses_writes_outside_held_slots_and_without_the_lease():
    ring = Ring()
    a = ring.member("a")
    with pytest.raises(NotOwnerError):
        a.check()                         # no Lease yet
    join(a)
    a.tick()
    a.check()                             # outside a reconcile: the Lease is enough
    with a.working(3) as mine:
        assert mine and current_slot() == 3
        a.check()
    assert current_slot() is None
    release(a, frozenset({3}))
    with a.working(3) as mine:
        assert not mine
    with a.working(4) as mine:
        assert mine
    ring.clock.advance(10.0)              # past the renew deadline
    with pytest.raises(NotOwnerError):
        a.check()


def test_a_release_waits_for_the_slots_reconciles_in_flight_and_lets_them_finish():
    """No new reconcile of a released slot starts; one in flight finishes, its
    writes allowed (half a reconcile refused would leave half-made children and
    an error): the slot stays published until it returns, so nobody else writes."""
    ring = Ring()
    a = ring.member("a")
    join(a)
    a.tick()
    entered, leave = threading.Event(), threading.Event()
    wrote = []

    def reconcile():
        with a.working(5):
            entered.set()
            leave.wait(5)
            a.check()                     # after the release began: still allowed
            wrote.append(5)
    worker = threading.Thread(target=reconcile)
    worker.start()
    entered.wait(5)
    releaser = threading.Thread(target=release, args=(a, frozenset({5})))
    releaser.start()
    releaser.join(0.2)
    assert releaser.is_alive() and ring.changes["a"][-1] == frozenset(range(SLOTS))
    assert 5 in slots_annotation(ring, "a")
    with a.working(5) as mine:
        assert not mine                   # no new one
    leave.set()
    releaser.join(5)
    worker.join(5)
    assert wrote == [5]
    assert ring.changes["a"][-1] == frozenset(range(SLOTS)) - {5}
    assert 5 not in slots_annotation(ring, "a")


def my(name, uid):
    return {"apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"}}


def test_a_part_filters_client_side_and_what_leaves_goes_without_a_deletion():
    from k8s_http.core.objects import Resource
    resource = Resource("mine.jp", "v1", "mys", "My")
    inf = Informer(client=None, resource=resource, namespaces=["ns"])
    queue = Queue()
    inf.add_handler(own_key, queue)
    rng = random.Random(37)     # uids spread; similar strings would not (docs/SHARDING.md)
    objs = [my(f"m{i}", str(uuid.UUID(int=rng.getrandbits(128)))) for i in range(40)]
    low, lower = ranges_of_slots(range(128)), ranges_of_slots(range(64))
    (first,) = inf.part_ids()
    inf.remove_part(first)
    part_id = inf.add_part(shard_selector=low.shard_selector(),
                           keep=lambda o: shards.keeps(o, low))
    part = inf._parts[part_id]
    (watcher,) = inf.watchers
    assert watcher._shard == {"shard_selector": low.shard_selector()}
    # The list: the server may ignore the selector; the filter keeps our share.
    inf._deliver(part, "ns", inf._on_sync, "ns", objs, part)
    kept = {o["metadata"]["name"] for o in objs if shards.keeps(o, low)}
    assert 0 < len(kept) < 40
    assert {k.name for k in inf.store.keys()} == kept
    assert inf.dropped == 40 - len(kept) and inf.has_synced()
    # Narrowed: what left is enqueued like a relist's vanished objects (keys only).
    queue.keys.clear()
    inf.narrow_part(part_id, lambda o: shards.keeps(o, lower))
    still = {o["metadata"]["name"] for o in objs if shards.keeps(o, lower)}
    assert 0 < len(still) < len(kept)
    assert {k.name for k in inf.store.keys()} == still
    assert {k.name for k in queue.keys} == kept - still
    # Its watch still selects the old range: events outside the narrowed filter are dropped.
    outside = next(o for o in objs if o["metadata"]["name"] in kept - still)
    inf._deliver(part, "ns", inf._on_event, "MODIFIED", outside, part)
    assert ObjectKey("ns", outside["metadata"]["name"]) not in set(inf.store.keys())
    # A removed part's late deliveries are ignored, and its objects are gone.
    inf.remove_part(part_id)
    inf._deliver(part, "ns", inf._on_event, "ADDED", objs[0], part)
    assert len(inf.store) == 0 and inf.watchers == [] and inf.has_synced()


# ---------------------------------------------------------------------------
# The Manager's wiring (not started: no I/O)

def sharded_manager(monkeypatch, **kw):
    from k8s_http import ClusterConfig, Manager
    monkeypatch.setenv("POD_NAME", "pod-0")
    return Manager(ClusterConfig(server="http://127.0.0.1:9", namespace="sys"), "app",
                   metrics_bind_address="0", health_probe_bind_address="0", shards=True,
                   shard_label="sharding.example.com/slot", **kw)


def test_sharding_excludes_leader_election_and_needs_a_label_with_a_domain(monkeypatch):
    from k8s_http import ConfigError
    with pytest.raises(ConfigError, match="exclude each other"):
        sharded_manager(monkeypatch, leader_elect=True)
    from k8s_http import ClusterConfig, Manager
    with pytest.raises(ConfigError, match="domain"):
        Manager(ClusterConfig(server="http://127.0.0.1:9"), "app", shards=True,
                shard_label="slot", metrics_bind_address="0", health_probe_bind_address="0")


def test_the_manager_runs_only_reconciles_of_held_slots_fenced_and_reselects(monkeypatch):
    from k8s_http.core.objects import DEPLOYMENTS, Resource
    mgr = sharded_manager(monkeypatch, namespaces=["ns"])
    member = mgr._member
    assert member.lease_name == "app-member-pod-0" and member.namespace == "sys"
    assert mgr.client.transport.user_agent.endswith(" shard/pod-0")
    assert mgr.client.write_guard == member.check
    resource = Resource("mine.jp", "v1", "mys", "My")
    seen, refused = [], []

    def reconcile(key):
        seen.append((key, current_slot()))
        try:
            member.check()
        except NotOwnerError:
            refused.append(key)
    mgr.add_controller(resource, reconcile, owns=[DEPLOYMENTS], owns_label_selector="a=b")
    runner = mgr._controllers[0].runner
    primary = mgr._controllers[0].primary
    rng = random.Random(5)
    objs = [my(f"m{i}", str(uuid.UUID(int=rng.getrandbits(128)))) for i in range(20)]
    primary._on_sync("ns", objs)
    slots = {o["metadata"]["name"]: shards.slot_of(o["metadata"]["uid"]) for o in objs}
    ours = frozenset(list(slots.values())[:5])
    member.elector._renewed_at = member.elector._clock()     # the Lease is held
    with member._cond:
        member._held = ours
    for name in slots:
        assert runner._reconcile(ObjectKey("ns", name)) is None
    assert {k.name for k, _ in seen} == {n for n, s in slots.items() if s in ours}
    assert all(slot == slots[k.name] for k, slot in seen)
    seen.clear()
    assert not refused
    runner._reconcile(ObjectKey("ns", "not-cached"))     # no slot: run to "gone", no writes
    assert seen == [(ObjectKey("ns", "not-cached"), UNCACHED)]
    assert refused == [ObjectKey("ns", "not-cached")]

    caches = mgr._shard_caches
    caches.select(ours)
    (watcher,) = primary.watchers
    assert watcher._shard == {"shard_selector": ranges_of_slots(ours).shard_selector()}
    (child,) = [i for i in caches.informers() if i is not primary]
    (child_watcher,) = child.watchers
    assert child_watcher._label_selector == "a=b," + shards.slot_label_selector(
        "sharding.example.com/slot", ours)
    # Until both caches have listed the gained slots, their keys wait (not run).
    (p_part,), (c_part,) = primary._parts.values(), child._parts.values()
    primary._deliver(p_part, "ns", primary._on_sync, "ns", objs, p_part)
    queue = mgr._controllers[0].queue
    while (key := queue.get(0)[0]) is not None:     # drain what the list queued
        queue.done(key)
    mine = next(n for n, s in slots.items() if s in ours)
    seen.clear()
    assert runner._reconcile(ObjectKey("ns", mine)) is None and seen == []
    assert caches.pending_slots() == len(ours)
    child._deliver(c_part, "ns", child._on_sync, "ns", [], c_part)
    assert caches.pending_slots() == 0
    assert queue.get(0)[0] == ObjectKey("ns", mine)      # queued again once listed
    runner._reconcile(ObjectKey("ns", mine))
    assert [k.name for k, _ in seen] == [mine]
    caches.select(frozenset())
    assert primary.watchers == [] and len(primary.store) == 0 and primary.has_synced()


def test_children_carry_their_owners_slot_only_when_sharding():
    import controller
    from k8s_http import Store
    from my.spec import MY, SLOT_LABEL
    from k8s_http.core.objects import DEPLOYMENTS, SERVICES
    stores = {MY: Store(), DEPLOYMENTS: Store(), SERVICES: Store()}
    body = dict(my("web", "5f2b9c1e-0d7a-4c59-a0e4-3f1a2b3c4d5e"),
                spec={"image": "nginx:1.27", "replicas": 1, "port": 8080})
    kwargs = dict(watch_for_deletion=lambda *a: True, cancel_deletion_watches=lambda o: None)
    plain = controller.MyReconciler(None, stores, **kwargs)._validate_and_render(body)[1]
    sharded = controller.MyReconciler(None, stores, slot_label=SLOT_LABEL,
                                      **kwargs)._validate_and_render(body)[1]
    slot = str(shards.slot_of(body["metadata"]["uid"]))
    for a, b in zip(plain, sharded):
        assert SLOT_LABEL not in a["metadata"]["labels"]
        assert b["metadata"]["labels"][SLOT_LABEL] == slot
        # The config hash covers the label (a child without it is applied again).
        assert a["metadata"]["annotations"] != b["metadata"]["annotations"]
    assert ("metadata", "labels", SLOT_LABEL) in controller._CHILD_META


# ---------------------------------------------------------------------------
# Review of issue 37's phase 1: each test below failed before its fix.

def test_a_write_from_the_reconcile_of_an_uncached_key_is_refused(monkeypatch):
    """A key whose object is not cached has no slot to fence by: if its object
    lands in the cache while the reconcile runs (the watch of a slot just
    released still delivering), the reconcile must not write for it."""
    from k8s_http.core.objects import Resource
    mgr = sharded_manager(monkeypatch, namespaces=["ns"])
    member = mgr._member
    resource = Resource("mine.jp", "v1", "mys", "My")
    primary_box = []
    late = my("late", "5f2b9c1e-0d7a-4c59-a0e4-3f1a2b3c4d5e")
    refused = []

    def reconcile(key):
        primary_box[0].store.upsert_if_changed(late)      # delivered meanwhile
        try:
            member.check()
        except NotOwnerError:
            refused.append(key)
    mgr.add_controller(resource, reconcile)
    primary_box.append(mgr._controllers[0].primary)
    member.elector._renewed_at = member.elector._clock()     # the Lease is held
    with member._cond:
        member._held = frozenset(range(SLOTS)) - {shards.slot_of(late["metadata"]["uid"])}
    mgr._controllers[0].runner._reconcile(ObjectKey("ns", "late"))
    assert refused == [ObjectKey("ns", "late")]


def test_slots_whose_reconciles_outlive_the_drain_stay_published_until_they_return():
    ring = Ring()
    a = ring.member("a", drain_timeout_seconds=0.05)
    join(a)
    a.tick()
    b_share = slots_of("b_x", {"a_x", "b_x"})
    stuck = min(b_share)
    entered, leave = threading.Event(), threading.Event()

    def reconcile():
        with a.working(stuck):
            entered.set()
            leave.wait(10)
    worker = threading.Thread(target=reconcile)
    worker.start()
    assert entered.wait(5)
    try:
        b = ring.member("b")
        join(b)
        a.tick()                      # a releases b's share; one reconcile outlives the drain
        assert stuck not in a.held
        assert slots_annotation(ring, "a") & b_share == {stuck}
        b.tick()
        assert b.held == b_share - {stuck}      # never the slot still being worked on
    finally:
        leave.set()
        worker.join(5)
    a.tick()                          # it returned: now the slot is let go
    assert slots_annotation(ring, "a") == a.held
    b.tick()
    assert b.held == b_share


def test_a_claim_whose_confirmation_failed_is_not_left_published():
    """The claiming write landed, the confirming list failed: the claim is
    withdrawn, or a member joining later would wait for those slots forever."""
    from k8s_http.core.errors import ServerError
    ring = Ring()
    a, b = two_members(ring)
    for m in (a, b, a, b):
        m.tick()
    b_share = b.held
    ring.clock.advance(15.0)          # b is silent (killed); a renews and claims b's share
    join(a)
    real, calls = ring._list, []

    def confirm_fails(resource, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise ServerError(500, "etcdserver: request timed out")
        return real(resource, **kw)
    ring.client.lists = confirm_fails
    with pytest.raises(ServerError):
        a.tick()
    ring.client.lists = real
    assert a.held == frozenset(range(SLOTS)) - b_share
    b = ring.member("b")              # b comes back (its identity unchanged) and rejoins
    join(b)
    a.tick()                          # b is live again: a wants exactly what it holds
    join(a)                           # a renewal publishes what a works on
    b.tick()
    assert b.held == b_share


def test_a_lapse_of_the_lease_is_never_overtaken_by_a_claim():
    """The lease thread drops every slot when the Lease lapses; a claim that
    checked membership just before must not add slots after that drop."""
    ring = Ring()
    a = ring.member("a")
    join(a)
    lapse = threading.Thread(target=a._on_not_member)
    real_is_leader = a.elector.is_leader

    def is_leader_then_lapse():
        answer = real_is_leader()
        if answer and slots_annotation(ring, "a") and not lapse.is_alive() \
                and lapse.ident is None:
            # The claim's write landed and it checks membership: the Lease lapses now.
            lapse.start()
            lapse.join(0.2)
        return answer
    a.elector.is_leader = is_leader_then_lapse
    a.tick()
    lapse.join(5)
    assert a.held == frozenset()


def test_not_ready_before_it_holds_the_slots_assigned_to_it():
    ring = Ring()
    a = ring.member("a")
    join(a)
    a.tick()
    assert a.ready()[0]
    b = ring.member("b")
    join(b)
    b.tick()                          # b's share is still a's
    ready, why = b.ready()
    assert not ready and "slots" in why
    a.tick()
    b.tick()
    assert b.ready()[0] and a.ready()[0]


def test_a_failed_probe_of_server_side_filtering_is_tried_again():
    from k8s_http.core.errors import ApiTimeoutError
    ring = Ring()
    real, probes = ring._list, []

    def gate_on(resource, **kw):
        if kw.get("shard_selector"):
            probes.append(1)
            if len(probes) == 1:
                raise ApiTimeoutError("timed out")
            return {"metadata": {"shardInfo": {"selector": kw["shard_selector"]}}, "items": []}
        return real(resource, **kw)
    ring.client.lists = gate_on
    a = ring.member("a")
    join(a)
    a.tick()
    a.tick()
    assert len(probes) == 2
    assert a.metrics.shard_server_filtered._value.get() == 1


def test_a_deleted_member_lease_keeps_its_slots_until_it_would_have_expired():
    """Its member works on until its renew deadline: a Lease that vanished
    (deleted by hand, say) frees nothing before it would have expired."""
    ring = Ring()
    a, b = two_members(ring)
    for m in (a, b, a, b):
        m.tick()
    b_share = b.held
    ring.client.objects = {k: v for k, v in ring.client.objects.items()
                           if v["metadata"]["name"] != "app-member-b"}
    a.tick()
    assert a.held == frozenset(range(SLOTS)) - b_share
    ring.clock.advance(14.0)
    join(a)
    a.tick()
    assert a.held == frozenset(range(SLOTS)) - b_share
    ring.clock.advance(1.0)
    join(a)
    a.tick()
    assert a.held == frozenset(range(SLOTS))


def test_stopping_with_reconciles_still_running_leaves_the_lease_to_expire(monkeypatch):
    mgr = sharded_manager(monkeypatch)
    left = []
    monkeypatch.setattr(mgr._member, "leave", lambda **kw: left.append(kw))
    monkeypatch.setattr(mgr, "_wait_idle", lambda timeout_seconds: False)
    assert mgr.stop() == 1
    assert left == [{"release": False}]


def test_a_failing_round_keeps_the_held_slots_and_the_ring_thread_going(caplog):
    from k8s_http.core.errors import ApiTimeoutError, ServerError
    ring = Ring()
    a = ring.member("a")
    join(a)
    a.run_round()
    held = a.held
    assert held == frozenset(range(SLOTS))
    failures = [ServerError(500, "etcdserver: leader changed"), ApiTimeoutError("timed out"),
                RuntimeError("a bug")]

    def failing(resource, **kw):
        raise failures.pop(0)
    ring.client.lists = failing
    with caplog.at_level("DEBUG", logger="k8s_http.control.sharding"):
        for _ in range(3):
            a.run_round()                 # never raises
        assert a.held == held and a.ready()[0]
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1         # the first of a series; the next at debug
        ring.client.lists = ring._list
        a.run_round()
    assert "shard ring rounds work again" in caplog.text


def test_a_claim_after_waiting_for_the_previous_owner_is_a_handover_in_the_histogram():
    ring = Ring()
    a = ring.member("a")
    join(a)
    a.tick()
    b = ring.member("b")
    join(b)
    b.tick()                              # b wants its share; a still lists it
    ring.clock.advance(0.5)
    a.tick()
    ring.clock.advance(0.25)
    b.tick()
    hist = {s.name: s.value for m in b.metrics.shard_handover_seconds.collect()
            for s in m.samples}
    assert hist["k8s_http_shard_handover_seconds_count"] == 1
    assert hist["k8s_http_shard_handover_seconds_sum"] == 0.75


def test_reconciles_that_outlive_a_release_end_the_process(monkeypatch):
    exits = []
    mgr = sharded_manager(monkeypatch, exit_process=exits.append)
    mgr._member._on_drain_timeout(frozenset({1, 2}))
    assert exits == [1]
    mgr._stop.set()                       # stopping anyway: stop() decides the exit code
    mgr._member._on_drain_timeout(frozenset({1}))
    assert exits == [1]


def test_a_member_whose_ring_watch_is_down_lists_and_hands_a_new_member_its_share():
    """After an outage a's ring watch backs off while b joins: a's cache still
    shows a alone, with nothing to do. Trusted, it would keep b's share from b
    until the watch came back; with the watch down, a's round lists, sees b, and
    releases b's share, which b claims in its next round."""
    ring = Ring()
    (a,) = settled(ring, "a")
    a.ring.frozen, a.ring.watching = ring.ring_leases(), False
    b = ring.member("b", ring=WatchedRing(ring))
    join(b)
    b.tick()
    assert b.held == frozenset()              # a still lists every slot
    a.tick()
    b_share = slots_of("b_x", {"a_x", "b_x"})
    assert a.held == frozenset(range(SLOTS)) - b_share
    b.tick()
    assert b.held == b_share


def lapse(member: ShardMember) -> None:
    """The lease thread's part when the renew deadline passed unrenewed."""
    assert not member.elector.is_leader()
    member._on_not_member()
    assert member.held == frozenset()


def rejoin(member: ShardMember) -> None:
    join(member)
    member._on_member()


def test_after_an_outage_the_first_member_back_takes_only_its_share_while_the_others_rejoin():
    """30 s without the apiserver: every Lease lapsed, and each looks unchanged
    to the others for longer than its duration. The first member back counts
    nobody out for REJOIN_GRACE_SECONDS: it claims its own share, deletes no
    Lease, and each other member takes its share as it re-joins. One that never
    comes back is counted out after the grace, its share taken and its Lease
    deleted."""
    ring = Ring()
    members = settled(ring, "a", "b", "c")
    a, b, c = members
    shares = {m: m.held for m in members}
    ring.clock.advance(30.0)
    for m in members:
        lapse(m)
    ring.client.reset()
    rejoin(a)
    a.tick()
    assert a.held == shares[a]
    assert "delete" not in ring.client.verbs()
    ring.clock.advance(1.0)
    rejoin(b)
    b.tick()
    assert b.held == shares[b]
    # c never comes back: once the grace has passed since a and b re-joined.
    ring.clock.advance(REJOIN_GRACE_SECONDS)
    join(a), join(b)
    for m in (a, b, a, b):
        m.tick()
    assert a.held | b.held == frozenset(range(SLOTS)) and not a.held & b.held
    assert a.held == slots_of("a_x", {"a_x", "b_x"})
    with pytest.raises(NotFoundError):
        ring.client.get(LEASES, "app-member-c", namespace="ns")


def test_a_member_counts_nobody_out_between_its_lapse_and_its_return():
    """Between the lapse and the new term's start (the lease thread's callback),
    a round that sees the Lease held again plans with every Lease live."""
    ring = Ring()
    a, b = settled(ring, "a", "b")
    ring.clock.advance(30.0)
    lapse(a), lapse(b)
    join(a)                               # held again; _on_member has not run yet
    a.tick()
    assert a.held == slots_of("a_x", {"a_x", "b_x"})
    a._on_member()
    ring.clock.advance(REJOIN_GRACE_SECONDS)
    join(a)
    a.tick()
    assert a.held == frozenset(range(SLOTS))
