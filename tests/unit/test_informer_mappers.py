"""Key mappers and the informer's handler fan-out, without a server."""

import pytest

from k8s_http.cache.informer import Informer, KeyMapper, own_key, owner_key
from k8s_http.core.objects import DEPLOYMENTS, ObjectKey
from k8s_http.cache.projection import Projection
from k8s_http.cache.store import Store


def child(ns="ns", owner=None):
    meta = {"name": "c", "namespace": ns, "resourceVersion": "1"}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta}


MY = {"apiVersion": "mine.jp/v1", "kind": "My", "name": "foobar", "uid": "u", "controller": True}


def test_own_key():
    assert own_key(child()) == [ObjectKey("ns", "c")]


def test_owner_key_matches_kind_and_group_of_the_controller_only():
    mapper = owner_key("My", "mine.jp")
    assert mapper(child(owner=MY)) == [ObjectKey("ns", "foobar")]
    assert mapper(child(owner=dict(MY, controller=False))) == []
    assert mapper(child(owner=dict(MY, kind="Other"))) == []
    assert mapper(child(owner=dict(MY, apiVersion="other.io/v1"))) == []
    assert mapper(child()) == []


def test_owner_key_core_group():
    mapper = owner_key("ConfigMap")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "x", "controller": True}
    assert mapper(child(owner=ref)) == [ObjectKey("ns", "cm")]
    assert owner_key("ConfigMap", "apps")(child(owner=ref)) == []


class Queue:
    def __init__(self):
        self.keys = []

    def add(self, key):
        self.keys.append(key)


def test_events_fan_out_to_every_handler_old_and_new_owner_and_a_bad_mapper_is_contained():
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    own, owners = Queue(), Queue()

    def broken(obj):
        raise ValueError("mapper bug")

    inf.add_handler(broken, Queue())
    inf.add_handler(own_key, own)
    inf.add_handler(owner_key("My", "mine.jp"), owners)
    inf._on_event("ADDED", child(owner=MY))
    moved = child(owner=dict(MY, name="other"))
    moved["metadata"]["resourceVersion"] = "2"
    inf._on_event("MODIFIED", moved)
    inf._on_event("DELETED", moved)
    assert own.keys == [ObjectKey("ns", "c")] * 3
    # The update maps both the old and the new owner.
    assert owners.keys[0] == ObjectKey("ns", "foobar")
    assert sorted(owners.keys[1:3]) == [ObjectKey("ns", "foobar"), ObjectKey("ns", "other")]
    assert owners.keys[3:] == [ObjectKey("ns", "other")]
    assert len(inf.store) == 0


def test_sync_replaces_enqueues_everything_and_resync_readds():
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    q = Queue()
    inf.add_handler(own_key, q)
    inf._on_event("ADDED", child())
    q.keys.clear()
    # One way: the relist deletes what vanished and enqueues its key itself.
    assert inf._on_sync("ns", []) is None
    assert len(inf.store) == 0 and q.keys == [ObjectKey("ns", "c")]
    q.keys.clear()
    inf._on_sync("ns", [child()])
    assert q.keys == [ObjectKey("ns", "c")]
    resync = Queue()
    assert inf.resync(resync) == 1 and resync.keys == [ObjectKey("ns", "c")]


def test_the_objects_mapped_hold_only_the_fields_every_mapper_says_it_reads():
    seen = []

    def recording_whole(obj):
        seen.append(obj)
        return own_key(obj)

    listed = dict(child(owner=MY), spec={"replicas": 1})
    listed["metadata"]["labels"] = {"app": "x"}
    narrow = {"metadata": {"namespace": "ns", "name": "c", "ownerReferences": [MY]}}
    cases = ((KeyMapper(recording_whole, own_key.reads), narrow),
             # A mapper that says nothing is handed whole objects.
             (recording_whole, listed))
    for recording, want in cases:
        inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
        q = Queue()
        inf.add_handler(recording, q)
        inf.add_handler(owner_key("My", "mine.jp"), Queue())
        seen.clear()
        inf._on_sync("ns", [listed])
        assert seen == [want] and q.keys == [ObjectKey("ns", "c")], recording
        changed = dict(listed, spec={"replicas": 2})       # an event: the old and the new
        changed["metadata"] = dict(listed["metadata"], resourceVersion="2")
        inf._on_event("MODIFIED", changed)
        if want is listed:
            assert sorted(o["spec"]["replicas"] for o in seen[1:]) == [1, 2]
        else:
            assert seen[1:] == [want, want], recording
    # A mapper's reads are paths of keys, or it is refused.
    for reads in ((), "metadata", (("metadata", 1),), (("metadata",), ())):
        with pytest.raises(ValueError):
            KeyMapper(recording_whole, reads)
    # What the two mappers of the package read, and nothing else: each gives the
    # same keys for an object built with those fields alone as for the whole object.
    assert own_key.reads == (("metadata", "namespace"), ("metadata", "name"))
    mapper = owner_key("My", "mine.jp")
    assert mapper.reads == (("metadata", "namespace"), ("metadata", "ownerReferences"))
    whole = dict(listed, metadata=dict(listed["metadata"], namespace="other"))
    for m in (own_key, mapper):
        fields = {"metadata": {path[1]: whole["metadata"][path[1]] for path in m.reads}}
        assert m(fields) == m(whole) != []


def test_not_started_is_unhealthy_and_unsynced():
    inf = Informer(client=None, resource=DEPLOYMENTS)
    assert inf.is_healthy(now=0.0) == (False, "not started")
    assert not inf.has_synced()
    assert inf.restart_if_dead() == 0


def test_an_event_maps_the_object_it_stored_not_a_remembered_write():
    """upsert returns what it stored: no read-back through get, which may answer
    with our own newer write (read-your-writes) instead of what the watch brought."""
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    owners = Queue()
    inf.add_handler(owner_key("My", "mine.jp"), owners)
    inf._on_event("ADDED", child(owner=MY))
    first, second = child(owner=dict(MY, name="other")), child(owner=dict(MY, name="third"))
    first["metadata"]["resourceVersion"], second["metadata"]["resourceVersion"] = "3", "5"
    token = inf.store.begin_write()
    inf.store.end_write(token, first, base=inf.store.get(ObjectKey("ns", "c")))
    token = inf.store.begin_write()
    inf.store.end_write(token, second, base=inf.store.get(ObjectKey("ns", "c")))
    owners.keys.clear()
    # The watch brings the first write, older than the second: the store keeps
    # remembering the second, and get() would answer with it.
    inf._on_event("MODIFIED", first)
    assert inf.store.get(ObjectKey("ns", "c"))["metadata"]["resourceVersion"] == "5"
    assert sorted(owners.keys) == [ObjectKey("ns", "foobar"), ObjectKey("ns", "other")]


def test_an_update_of_nothing_but_the_version_tells_no_handler():
    """The handlers know the object: a new resourceVersion alone (a change in a
    field the transform drops, a replayed version) is nothing to reconcile."""
    drop_annotations = Projection(["metadata.name", "metadata.namespace", "metadata.labels",
                                   "metadata.resourceVersion", "metadata.ownerReferences"])
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"],
                   store=Store(transform=drop_annotations))
    own = Queue()
    inf.add_handler(own_key, own)
    inf._on_event("ADDED", child(owner=MY))
    annotated = child(owner=MY)
    annotated["metadata"].update(resourceVersion="2", annotations={"revision": "1"})
    inf._on_event("MODIFIED", annotated)
    inf._on_event("MODIFIED", annotated)
    assert own.keys == [ObjectKey("ns", "c")]
    assert inf.store.resource_version(ObjectKey("ns", "c")) == "2"
    labelled = child(owner=MY)
    labelled["metadata"].update(resourceVersion="3", labels={"tier": "web"})
    inf._on_event("MODIFIED", labelled)
    assert own.keys == [ObjectKey("ns", "c")] * 2
    inf._on_event("DELETED", labelled)
    assert own.keys == [ObjectKey("ns", "c")] * 3


def test_the_echo_of_a_write_skips_only_the_writers_key_in_the_writers_queue():
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    mine, theirs = Queue(), Queue()
    inf.add_handler(owner_key("My", "mine.jp"), mine)
    inf.add_handler(owner_key("My", "mine.jp"), theirs)
    inf._on_event("ADDED", child(owner=MY))
    mine.keys.clear()
    theirs.keys.clear()
    written = child(owner=dict(MY, name="other"))
    written["metadata"]["resourceVersion"] = "2"
    token = inf.store.begin_write()
    inf.store.end_write(token, written, base=inf.store.get(ObjectKey("ns", "c")),
                        writer=(mine, ObjectKey("ns", "other")))
    inf._on_event("MODIFIED", written)
    # The old owner was not the writer: it learns that it lost the child.
    assert mine.keys == [ObjectKey("ns", "foobar")]
    assert sorted(theirs.keys) == [ObjectKey("ns", "foobar"), ObjectKey("ns", "other")]


def test_a_write_without_a_writer_or_a_later_version_tells_every_handler():
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    own = Queue()
    inf.add_handler(own_key, own)
    inf._on_event("ADDED", child(owner=MY))
    written = child(owner=dict(MY, name="other"))
    written["metadata"]["resourceVersion"] = "2"
    token = inf.store.begin_write()
    inf.store.end_write(token, written, base=inf.store.get(ObjectKey("ns", "c")))
    inf._on_event("MODIFIED", written)                 # no writer given: everyone hears
    assert own.keys == [ObjectKey("ns", "c")] * 2
    ours = child(owner=dict(MY, name="third"))
    ours["metadata"]["resourceVersion"] = "4"
    token = inf.store.begin_write()
    inf.store.end_write(token, ours, base=inf.store.get(ObjectKey("ns", "c")),
                        writer=(own, ObjectKey("ns", "c")))
    later = child(owner=dict(MY, name="fourth"))
    later["metadata"]["resourceVersion"] = "9"         # not our write's version
    inf._on_event("MODIFIED", later)
    assert own.keys == [ObjectKey("ns", "c")] * 3
    # A writer that is not (queue, key) names no handler's key: everyone hears.
    for writer in (7, "me", (own,)):
        mine = child(owner=dict(MY, name=f"w{len(own.keys)}"))
        mine["metadata"]["resourceVersion"] = str(20 + len(own.keys))
        token = inf.store.begin_write()
        inf.store.end_write(token, mine, base=inf.store.get(ObjectKey("ns", "c")), writer=writer)
        before = len(own.keys)
        inf._on_event("MODIFIED", mine)
        assert own.keys[before:] == [ObjectKey("ns", "c")]


def test_a_relist_hands_a_work_queue_all_its_keys_in_one_add_many():
    from k8s_http.control.workqueue import WorkQueue

    class CountingQueue(WorkQueue):
        def __init__(self):
            super().__init__("q")
            self.calls = []

        def add(self, key):
            self.calls.append("add")
            super().add(key)

        def add_many(self, keys, **priority):
            self.calls.append("add_many")
            super().add_many(keys, **priority)

    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    own, owners, plain = CountingQueue(), CountingQueue(), Queue()
    inf.add_handler(own_key, own)
    inf.add_handler(owner_key("My", "mine.jp"), owners)
    inf.add_handler(owner_key("My", "mine.jp"), plain)          # add() only: one call per key
    inf._on_event("ADDED", dict(child(owner=dict(MY, name="gone")),
                                metadata={"name": "old", "namespace": "ns",
                                          "resourceVersion": "1",
                                          "ownerReferences": [dict(MY, name="gone")]}))
    for queue in (own, owners):             # the event's key, handed out and done
        queue.done(queue.get(0)[0])
        queue.calls.clear()
    plain.keys.clear()
    listed = [child(owner=dict(MY, name=f"o{i}")) for i in range(3)]
    for i, obj in enumerate(listed):
        obj["metadata"]["name"] = f"c{i}"
    inf._on_sync("ns", listed)
    # One call per priority: the vanished object's key, then the first list's, low.
    assert own.calls == ["add_many"] * 2 and owners.calls == ["add_many"] * 2
    taken = [own.get(0)[0] for _ in range(4)]
    assert taken == [ObjectKey("ns", "old")] + [ObjectKey("ns", f"c{i}") for i in range(3)]
    assert [owners.get(0)[0] for _ in range(4)] == \
        [ObjectKey("ns", "gone")] + [ObjectKey("ns", f"o{i}") for i in range(3)]
    assert plain.keys == [ObjectKey("ns", "gone")] + [ObjectKey("ns", f"o{i}") for i in range(3)]


def test_a_relist_for_own_key_handlers_builds_only_the_keys():
    from k8s_http.control.workqueue import WorkQueue
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"],
                   store=Store(transform=Projection(["metadata.name", "spec"])))
    one, two = WorkQueue("one"), WorkQueue("two")
    inf.add_handler(own_key, one)
    inf.add_handler(own_key, two)
    inf._on_event("ADDED", dict(child(), metadata={"name": "gone", "namespace": "ns",
                                                   "resourceVersion": "1"}))
    for queue in (one, two):
        queue.done(queue.get(0)[0])
    seen = []
    real = own_key._map
    own_key._map = lambda obj: seen.append(obj) or real(obj)
    try:
        listed = [dict(child(), metadata={"name": f"c{i}", "namespace": "ns",
                                          "resourceVersion": "2"}, spec={"replicas": i})
                  for i in range(3)]
        inf._on_sync("ns", listed + ["not an object"])
    finally:
        own_key._map = real
    expected = [ObjectKey("ns", "gone")] + [ObjectKey("ns", f"c{i}") for i in range(3)]
    for queue in (one, two):
        assert [queue.get(0)[0] for _ in range(4)] == expected
    # Built with the namespace and name alone (the vanished object, mapped first, whole).
    assert seen[2:] == [{"metadata": {"name": f"c{i}", "namespace": "ns"}}
                        for i in (0, 0, 1, 1, 2, 2)]


# -- priority: a list's keys behind the watch's ------------------------------------------------

def _named(name, rv="1", ns="ns"):
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}, "spec": rv}


def _taken(queue):
    keys = []
    while (key := queue.get(0)[0]) is not None:
        keys.append(key.name)
        queue.done(key)
    return keys


def test_a_first_list_is_queued_behind_the_events_that_follow_it():
    from k8s_http.control.workqueue import WorkQueue
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    q = WorkQueue("q")
    inf.add_handler(own_key, q)
    inf._on_sync("ns", [_named(f"old{i}") for i in range(3)])     # start-up: all low
    inf._on_event("ADDED", _named("new"))                          # a user's create
    inf._on_event("MODIFIED", _named("old2", rv="2"))              # raises a listed key
    assert _taken(q) == ["new", "old2", "old0", "old1"]


def test_a_relist_queues_low_only_what_the_cache_held_unchanged():
    from k8s_http.control.workqueue import WorkQueue
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    q = WorkQueue("q")
    inf.add_handler(own_key, q)
    inf._on_sync("ns", [_named("same"), _named("changed"), _named("gone")])
    _taken(q)
    # After a 410: "changed" moved on, "gone" was deleted, "created" is new.
    inf._on_sync("ns", [_named("same"), _named("changed", rv="5"), _named("created")])
    assert _taken(q) == ["changed", "created", "gone", "same"]


def test_a_plain_queue_gets_a_relists_changed_keys_first():
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    q = Queue()
    inf.add_handler(own_key, q)
    inf._on_sync("ns", [_named("same"), _named("changed")])
    q.keys.clear()
    inf._on_sync("ns", [_named("same"), _named("changed", rv="2")])
    assert [k.name for k in q.keys] == ["changed", "same"]


def _starts(prefix):
    return lambda obj: obj["metadata"]["name"].startswith(prefix)


def test_each_namespace_watchers_first_list_is_low_and_a_new_parts_too():
    from k8s_http.control.workqueue import WorkQueue
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["a", "b"])
    q = WorkQueue("q")
    inf.add_handler(own_key, q)
    inf._on_sync("a", [_named("a1", ns="a")])
    inf._on_sync("b", [_named("b1", ns="b")])            # b's first list: low too
    inf._on_event("ADDED", _named("a2", ns="a"))
    assert _taken(q) == ["a2", "a1", "b1"]
    inf._on_sync("a", [_named("a1", ns="a", rv="2"), _named("a2", ns="a")])
    assert _taken(q) == ["a1", "a2"]                     # a relist: changed first
    # A new part (say slots taken over): the cache had no view of its objects, so
    # all its first list is low; its lists leave the other part's objects alone.
    (first,) = inf.part_ids()
    inf.narrow_part(first, _starts("a"))
    assert _taken(q) == ["b1"]                           # it left the cache, as if vanished
    new = inf.add_part(keep=_starts("x"))
    part = inf._parts[new]
    inf._on_sync("a", [_named("x1", ns="a", rv="3"), _named("a9", ns="a")], part)  # a9 not its
    inf._on_event("ADDED", _named("a4", ns="a"), inf._parts[first])
    assert _taken(q) == ["a4", "x1"]
    assert inf.dropped == 1
    inf._on_sync("a", [_named("x1", ns="a", rv="4"), _named("x2", ns="a")], part)
    assert _taken(q) == ["x1", "x2"]                     # its relist: as a relist's
    assert sorted(k.name for k in inf.store.keys()) == ["a1", "a2", "a4", "x1", "x2"]
    assert not inf.has_synced()                          # the new part has not listed "b"
    inf._on_sync("a", [_named("x2", ns="a")], part)
    assert _taken(q) == ["x1", "x2"]                     # x1 vanished, x2 unchanged: low
    assert sorted(k.name for k in inf.store.keys()) == ["a1", "a2", "a4", "x2"]


def test_a_part_replacing_others_takes_their_objects_and_enqueues_only_what_changed():
    from k8s_http.control.workqueue import WorkQueue
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    q = WorkQueue("q")
    inf.add_handler(own_key, q)
    (first,) = inf.part_ids()
    inf.narrow_part(first, _starts("a"))
    b = inf.add_part(keep=_starts("b"))
    inf._on_sync("ns", [_named("a1"), _named("a2")], inf._parts[first])
    inf._on_sync("ns", [_named("b0"), _named("b1")], inf._parts[b])
    _taken(q)
    listened = []
    merged = inf.add_part(keep=lambda o: True, replaces=[first, b],
                          on_synced=lambda: listened.append(True))
    assert inf.has_synced()         # the replaced parts serve while it lists
    old = inf._parts[first]
    inf._deliver(inf._parts[merged], "ns", inf._on_sync, "ns",
                 [_named("a1"), _named("a2", rv="2"), _named("a3"), _named("b1")],
                 inf._parts[merged])
    # a2 changed, a3 is new, b0 vanished; a1 and b1 were watched all along: not queued.
    assert _taken(q) == ["a2", "a3", "b0"]
    assert inf.part_ids() == [merged] and listened == [True]
    inf._deliver(old, "ns", inf._on_event, "ADDED", _named("a7"), old)   # late: dropped
    assert sorted(k.name for k in inf.store.keys()) == ["a1", "a2", "a3", "b1"]


def test_a_lists_objects_awaiting_their_reconcile_go_ahead_of_its_others_behind_events():
    from k8s_http.control.workqueue import WorkQueue
    from k8s_http.core.objects import AWAITS_RECONCILE_READS, awaits_reconcile
    seen = []

    def urgent(obj):
        seen.append(obj)
        return awaits_reconcile(obj)
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    q = WorkQueue("q")
    inf.add_handler(own_key, q, urgent=urgent, urgent_reads=AWAITS_RECONCILE_READS)

    def obj(name, generation, observed=None, rv="1"):
        o = dict(_named(name, rv=rv), status={"replicas": 1})
        o["metadata"]["generation"] = generation
        if observed is not None:
            o["status"]["observedGeneration"] = observed
        return o
    done, new, changed = obj("done", 1, 1), obj("new", 1), obj("changed", 2, 1)
    inf._on_sync("ns", [done, new, changed])           # a first list: low, those less so
    inf._on_event("ADDED", _named("event"))
    assert _taken(q) == ["event", "new", "changed", "done"]
    # Built with the mapper's and the test's fields alone.
    assert seen[0] == {"metadata": {"name": "done", "namespace": "ns", "generation": 1},
                       "status": {"observedGeneration": 1}}
    inf._on_sync("ns", [done, new, obj("changed", 2, 2, rv="2")])   # a relist
    assert _taken(q) == ["changed", "event", "new", "done"]  # event vanished; new still awaits


def test_awaits_reconcile_reads_the_status_observed_generation():
    from k8s_http.core.objects import awaits_reconcile
    assert awaits_reconcile({"metadata": {"generation": 1}})
    assert awaits_reconcile({"metadata": {"generation": 2}, "status": {"observedGeneration": 1}})
    assert not awaits_reconcile({"metadata": {"generation": 2},
                                 "status": {"observedGeneration": 2}})
    assert not awaits_reconcile({"metadata": {}, "status": {}})     # no generation: cannot say


def test_an_update_filter_keeps_its_handler_deaf_to_updates_it_says_nothing_of():
    """A handler's update filter sees the old and the new object whole (as the
    cache keeps them, even when the mappers read two fields) and decides for
    its own queue alone; adds and deletes always queue, and a filter that
    raises queues (an update is never lost to a bug)."""
    inf = Informer(client=None, resource=DEPLOYMENTS, namespaces=["ns"])
    filtered, plain = Queue(), Queue()
    seen = []

    def replicas_changed(old, new):
        seen.append((old, new))
        if new["spec"].get("replicas") == "boom":
            raise ValueError("filter bug")
        return old["spec"].get("replicas") != new["spec"].get("replicas")

    inf.add_handler(owner_key("My", "mine.jp"), filtered, update_filter=replicas_changed)
    inf.add_handler(owner_key("My", "mine.jp"), plain)
    owner = [ObjectKey("ns", "foobar")]

    def version(rv, **spec):
        obj = child(owner=MY)
        obj["metadata"]["resourceVersion"] = str(rv)
        obj["spec"] = spec
        return obj
    inf._on_event("ADDED", version(1, replicas=1))
    assert filtered.keys == plain.keys == owner and not seen
    inf._on_event("MODIFIED", version(2, replicas=1, paused=True))
    assert filtered.keys == owner and plain.keys == owner * 2
    old, new = seen[-1]
    assert old["spec"] == {"replicas": 1} and new["spec"] == {"replicas": 1, "paused": True}
    assert old["metadata"]["resourceVersion"] == "1" and new["metadata"]["ownerReferences"]
    inf._on_event("MODIFIED", version(3, replicas=2))
    assert filtered.keys == owner * 2 and plain.keys == owner * 3
    inf._on_event("MODIFIED", version(4, replicas="boom"))
    assert filtered.keys == owner * 3 and plain.keys == owner * 4
    inf._on_event("DELETED", version(5, replicas="boom"))
    assert filtered.keys == owner * 4 and plain.keys == owner * 5
