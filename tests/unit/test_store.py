"""Store: keys, indexes kept on every write, transform, atomic replace."""

import copy
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http.core.objects import ObjectKey, key_of
from k8s_http.cache.store import Store, index_owner_uid

OWNER_INDEX = {"owner_uid": index_owner_uid}


def obj(name, ns="default", rv="1", owner_uid=None, labels=None, managed=False):
    meta = {"name": name, "namespace": ns, "resourceVersion": rv, "uid": f"uid-{ns}-{name}"}
    if owner_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "not-controller"},
            {"apiVersion": "mine.jp/v1", "kind": "My", "name": "o", "uid": owner_uid,
             "controller": True}]
    if labels:
        meta["labels"] = labels
    if managed:
        meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def names(objs):
    return sorted(o["metadata"]["name"] for o in objs)


def test_upsert_get_delete():
    s = Store()
    old, stored = s.upsert(obj("a"))
    assert old is None and stored["metadata"]["resourceVersion"] == "1"
    old, stored = s.upsert(obj("a", rv="2"))
    assert old["metadata"]["resourceVersion"] == "1"
    assert stored == s.get(ObjectKey("default", "a"))
    assert s.get(ObjectKey("default", "a"))["metadata"]["resourceVersion"] == "2"
    assert len(s) == 1 and ObjectKey("default", "a") in s
    assert s.keys() == [ObjectKey("default", "a")]
    removed = s.delete(ObjectKey("default", "a"))
    assert removed["metadata"]["resourceVersion"] == "2"
    assert s.delete(obj("a")) is None
    assert len(s) == 0 and s.get(ObjectKey("default", "a")) is None


def test_delete_by_object():
    s = Store()
    s.upsert(obj("a"))
    assert s.delete(obj("a", rv="9"))["metadata"]["resourceVersion"] == "1"
    assert s.list() == []


def test_cluster_scoped_objects_have_an_empty_namespace():
    s = Store()
    s.upsert({"metadata": {"name": "n1", "resourceVersion": "1"}})
    assert s.get(ObjectKey("", "n1")) is not None
    assert names(s.by_index("namespace", "")) == ["n1"]


def test_default_transform_strips_managed_fields():
    s = Store()
    s.upsert(obj("a", managed=True))
    assert "managedFields" not in s.get(ObjectKey("default", "a"))["metadata"]
    s.replace([obj("b", managed=True)])
    assert "managedFields" not in s.get(ObjectKey("default", "b"))["metadata"]


def test_transform_none_keeps_objects_as_given():
    s = Store(transform=None)
    s.upsert(obj("a", managed=True))
    assert "managedFields" in s.get(ObjectKey("default", "a"))["metadata"]


def test_custom_transform_result_is_stored():
    s = Store(transform=lambda o: {**o, "extra": True})
    s.upsert(obj("a"))
    assert s.get(ObjectKey("default", "a"))["extra"] is True


def test_namespace_index_follows_writes():
    s = Store()
    s.upsert(obj("a", "ns1"))
    s.upsert(obj("b", "ns1"))
    s.upsert(obj("c", "ns2"))
    assert names(s.by_index("namespace", "ns1")) == ["a", "b"]
    s.delete(ObjectKey("ns1", "a"))
    assert names(s.by_index("namespace", "ns1")) == ["b"]
    assert s.by_index("namespace", "nowhere") == []


def test_owner_uid_index_uses_the_controlling_reference_only():
    s = Store(indexers=OWNER_INDEX)
    s.upsert(obj("a", owner_uid="u1"))
    s.upsert(obj("b", owner_uid="u1"))
    s.upsert(obj("c"))
    assert names(s.by_index("owner_uid", "u1")) == ["a", "b"]
    assert s.by_index("owner_uid", "not-controller") == []
    # The owner changes: the object moves in the index.
    s.upsert(obj("a", owner_uid="u2", rv="2"))
    assert names(s.by_index("owner_uid", "u1")) == ["b"]
    assert names(s.by_index("owner_uid", "u2")) == ["a"]
    # The reference goes away.
    s.upsert(obj("b", rv="2"))
    assert s.by_index("owner_uid", "u1") == []


def test_custom_indexers_add_to_the_defaults():
    s = Store(indexers={"app": lambda o: [(o["metadata"].get("labels") or {}).get("app", "")]})
    s.upsert(obj("a", labels={"app": "web"}))
    s.upsert(obj("b", labels={"app": "db"}))
    assert names(s.by_index("app", "web")) == ["a"]
    assert names(s.by_index("namespace", "default")) == ["a", "b"]


def test_unknown_index_is_a_key_error():
    s = Store()
    try:
        s.by_index("nope", "x")
    except KeyError:
        pass
    else:
        raise AssertionError("expected KeyError")


def test_failing_indexer_leaves_the_store_unchanged():
    def bad(o):
        if o["metadata"]["name"] == "boom":
            raise ValueError("bad object")
        return ["x"]
    s = Store(indexers={"bad": bad})
    s.upsert(obj("a"))
    try:
        s.upsert(obj("boom"))
    except ValueError:
        pass
    assert s.keys() == [ObjectKey("default", "a")]
    assert names(s.by_index("bad", "x")) == ["a"]


def test_replace_returns_vanished_and_reindexes():
    s = Store(indexers=OWNER_INDEX)
    s.upsert(obj("a", owner_uid="u1"))
    s.upsert(obj("b", owner_uid="u1"))
    s.upsert(obj("c", "other"))
    vanished = s.replace([obj("b", owner_uid="u2", rv="5"), obj("d")])
    assert names(vanished) == ["a", "c"]
    assert names(s.list()) == ["b", "d"]
    assert s.by_index("owner_uid", "u1") == []
    assert names(s.by_index("owner_uid", "u2")) == ["b"]
    assert s.by_index("namespace", "other") == []
    assert s.get(ObjectKey("default", "b"))["metadata"]["resourceVersion"] == "5"


def test_replace_scoped_to_a_namespace_keeps_the_others():
    s = Store()
    s.upsert(obj("a", "ns1"))
    s.upsert(obj("b", "ns1"))
    s.upsert(obj("x", "ns2"))
    vanished = s.replace([obj("b", "ns1", rv="2"), obj("c", "ns1")], namespace="ns1")
    assert names(vanished) == ["a"]
    assert names(s.list()) == ["b", "c", "x"]
    assert names(s.by_index("namespace", "ns1")) == ["b", "c"]
    assert names(s.by_index("namespace", "ns2")) == ["x"]


def test_replace_tells_which_listed_objects_it_held_at_the_same_version():
    for namespace in (None, "default"):
        s = Store()
        for name in ("same", "moved", "gone"):
            s.upsert(obj(name))
        unversioned = obj("unversioned")
        del unversioned["metadata"]["resourceVersion"]
        s.upsert(unversioned)
        unchanged = set()
        s.replace([obj("same"), obj("moved", rv="2"), obj("new"), copy.deepcopy(unversioned)],
                  namespace=namespace, unchanged=unchanged)
        assert unchanged == {ObjectKey("default", "same")}, namespace
        listing = s.new_list([obj("same"), obj("moved"), obj("new")])
        inside, outside = listing.split(lambda o: key_of(o) in unchanged,
                                        fields=(("metadata", "namespace"), ("metadata", "name")))
        assert names(inside) == ["same"] and names(outside) == ["moved", "new"]


def test_replace_with_nothing_empties_the_store():
    s = Store()
    s.upsert(obj("a"))
    assert names(s.replace([])) == ["a"]
    assert len(s) == 0 and s.by_index("namespace", "default") == []


def test_replace_is_atomic_for_readers():
    """A reader never sees a half-replaced store: always all of set A or all of set B."""
    s = Store()
    set_a = [obj(f"a{i}") for i in range(300)]
    set_b = [obj(f"b{i}") for i in range(200)]
    s.replace(set_a)
    stop = threading.Event()
    bad = []

    def reader():
        while not stop.is_set():
            n = len(s.list())
            m = len(s.by_index("namespace", "default"))
            if n not in (300, 200) or m not in (300, 200):
                bad.append((n, m))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(100):
        s.replace([dict(o) for o in (set_b if i % 2 == 0 else set_a)])
    stop.set()
    t.join()
    assert not bad


# ---- property: indexes always agree with the objects ------------------------------

_ops = st.lists(st.tuples(
    st.sampled_from(["upsert", "watch", "delete", "replace", "replace_ns"]),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["n1", "n2"]),
    st.sampled_from([None, "u1", "u2"]),
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["n1", "n2"])),
             max_size=4),
), max_size=25)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_indexes_match_a_model(ops):
    s = Store(indexers=OWNER_INDEX)
    model: dict[ObjectKey, dict] = {}
    for op, name, ns, owner, batch in ops:
        if op == "upsert":
            o = obj(name, ns, owner_uid=owner)
            s.upsert(o)
            model[ObjectKey(ns, name)] = o
        elif op == "watch":         # an event: a new version, maybe of the same content
            o = obj(name, ns, rv=str(len(batch) + 2), owner_uid=owner)
            change = s.upsert_if_changed(o)
            before = model.get(ObjectKey(ns, name))
            same = before is not None and {**before["metadata"], "resourceVersion": ""} == \
                {**o["metadata"], "resourceVersion": ""}
            assert (change is None) == same
            if change is not None:
                assert change.old == before and change.new == o and change.echo_of is None
            model[ObjectKey(ns, name)] = o
        elif op == "delete":
            s.delete(ObjectKey(ns, name))
            model.pop(ObjectKey(ns, name), None)
        else:
            scope = ns if op == "replace_ns" else None
            new = {ObjectKey(bns if scope is None else scope, bn):
                   obj(bn, bns if scope is None else scope, owner_uid=owner) for bn, bns in batch}
            vanished = s.replace(list(new.values()), namespace=scope)
            expect_gone = {k for k in model if (scope is None or k.namespace == scope)
                           and k not in new}
            assert {ObjectKey(o["metadata"]["namespace"], o["metadata"]["name"])
                    for o in vanished} == expect_gone
            model = {k: v for k, v in model.items() if k not in expect_gone}
            model.update(new)
        assert set(s.keys()) == set(model) and len(s) == len(model)
        for ns_, name_ in [(n, m) for n in ("n1", "n2") for m in ("a", "b", "c")]:
            key = ObjectKey(ns_, name_)
            assert (key in s) == (key in model)
            assert s.get(key) == model.get(key)
        for ns_ in ("n1", "n2"):
            assert {(o["metadata"]["name"]) for o in s.by_index("namespace", ns_)} == \
                {k.name for k in model if k.namespace == ns_}
        for uid in ("u1", "u2"):
            want = {k for k, v in model.items()
                    if any(r.get("controller") and r["uid"] == uid
                           for r in v["metadata"].get("ownerReferences", []))}
            got = {ObjectKey(o["metadata"]["namespace"], o["metadata"]["name"])
                   for o in s.by_index("owner_uid", uid)}
            assert got == want


# ---- read-your-writes -------------------------------------------------------

def write(store, written, base=None):
    store.end_write(store.begin_write(), written, base=base)


def get_rv(store, name, ns="default"):
    got = store.get(ObjectKey(ns, name))
    return got["metadata"]["resourceVersion"] if got else None


def test_a_write_not_yet_observed_is_what_get_returns():
    store = Store()
    write(store, obj("a", rv="5"))              # created: the watch has not brought it
    assert get_rv(store, "a") == "5"
    assert len(store) == 0                      # only reads bridge the gap; the cache is the watch's
    store.upsert(obj("a", rv="5"))              # the watch catches up
    store.upsert(obj("a", rv="7"))              # and someone else writes
    assert get_rv(store, "a") == "7"


def test_older_versions_do_not_hide_our_write_and_chained_writes_keep_them():
    store = Store()
    v1 = obj("a", rv="1")
    store.upsert(v1)
    write(store, obj("a", rv="2"), base=v1)
    write(store, obj("a", rv="3"), base=store.get(ObjectKey("default", "a")))
    store.upsert(obj("a", rv="1"))              # a late event of the version we started from
    assert get_rv(store, "a") == "3"
    store.upsert(obj("a", rv="2"))              # our own first write: still behind
    assert get_rv(store, "a") == "3"
    store.upsert(obj("a", rv="9"))              # anything else: the watch speaks again
    assert get_rv(store, "a") == "9"


def test_upsert_if_changed_is_none_when_only_the_version_moved():
    store = Store()
    first = store.upsert_if_changed(obj("a", rv="1"))
    assert first.old is None and first.new["metadata"]["resourceVersion"] == "1"
    assert store.upsert_if_changed(obj("a", rv="1")) is None      # replayed
    assert store.upsert_if_changed(obj("a", rv="2")) is None      # a new version of the same
    assert get_rv(store, "a") == "2"
    changed = obj("a", rv="3")
    changed["spec"] = {"replicas": 2}
    change = store.upsert_if_changed(changed)
    assert change.old["metadata"]["resourceVersion"] == "2" and change.new == changed
    assert change.echo_of is None


def test_the_watchs_copy_of_our_write_names_its_writer():
    store = Store()
    store.upsert(obj("a", rv="1"))
    written = obj("a", rv="4")
    written["spec"] = {"replicas": 2}
    store.end_write(store.begin_write(), written, base=obj("a", rv="1"), writer="me")
    older = obj("a", rv="1")
    older["spec"] = {"replicas": 3}            # a replayed base, as the watch had it
    assert store.upsert_if_changed(older).echo_of is None
    assert get_rv(store, "a") == "4"
    assert store.upsert_if_changed(written).echo_of == "me"
    again = obj("a", rv="6")
    again["spec"] = {"replicas": 5}
    assert store.upsert_if_changed(again).echo_of is None     # the watch speaks again


def test_the_watchs_copy_of_our_write_is_not_prepared_again():
    store = Store()
    store.upsert(obj("a", rv="1"))
    written = obj("a", rv="4")
    written["spec"] = {"replicas": 2}
    store.end_write(store.begin_write(), written, base=obj("a", rv="1"), writer="me")
    prepared = []
    real = store._prepare
    store._prepare = lambda o: prepared.append(o) or real(o)
    change = store.upsert_if_changed(copy.deepcopy(written))
    assert change.echo_of == "me" and change.new == written and prepared == []
    assert store.get(ObjectKey("default", "a")) == written
    other = obj("a", rv="5")
    assert store.upsert_if_changed(other).new == other and prepared == [other]


def test_a_delete_or_a_relist_drops_an_unobserved_write():
    # created then deleted (the garbage collector, say) before the next read:
    # the store must not keep answering with an object that is gone.
    store = Store()
    write(store, obj("a", rv="5"))
    store.upsert(obj("a", rv="5"))
    store.delete(ObjectKey("default", "a"))
    assert store.get(ObjectKey("default", "a")) is None
    write(store, obj("b", rv="6"))
    store.replace([])                           # a relist that does not have it
    assert store.get(ObjectKey("default", "b")) is None
    write(store, obj("c", rv="8", ns="other"))
    store.replace([], namespace="default")      # another namespace's relist says nothing of it
    assert get_rv(store, "c", "other") == "8"


def test_an_answer_slower_than_the_watch_is_not_kept():
    """The watch brought our write and a later change before our answer came back:
    resourceVersions cannot be ordered, so the cache wins."""
    store = Store()
    token = store.begin_write()
    store.upsert(obj("a", rv="5"))              # our create, through the watch
    store.upsert(obj("a", rv="6"))              # the Deployment controller's status update
    store.end_write(token, obj("a", rv="5"))
    assert get_rv(store, "a") == "6"
    token = store.begin_write()                 # created and deleted before the answer
    store.upsert(obj("b", rv="7"))
    store.delete(ObjectKey("default", "b"))
    store.end_write(token, obj("b", rv="7"))
    assert store.get(ObjectKey("default", "b")) is None
    token = store.begin_write()                 # a relist in between speaks for everything
    store.replace([obj("c", rv="9")])
    store.end_write(token, obj("c", rv="8"))
    assert get_rv(store, "c") == "9"


def test_a_failed_write_leaves_nothing_and_bookkeeping_empties():
    store = Store()
    t1 = store.begin_write()
    t2 = store.begin_write()
    store.upsert(obj("a", rv="1"))
    store.end_write(t1)                         # failed
    store.end_write(t2, obj("z", rv="2"))
    assert store.get(ObjectKey("default", "a"))["metadata"]["resourceVersion"] == "1"
    assert store._inflight == {} and store._recent == {}


def test_a_listing_transforms_each_object_as_it_is_appended_and_replace_takes_it_whole():
    calls = []

    def transform(obj):
        calls.append(obj["metadata"]["name"])
        return obj
    store = Store(transform=transform)
    objs = [{"metadata": {"name": n, "namespace": "ns", "resourceVersion": "1"}} for n in "ab"]
    store.replace(objs)
    assert calls == ["a", "b"]
    listing = store.new_list()
    for o in objs:                                    # an informer's watcher, as a list arrives
        listing.append(o)
    assert calls == ["a", "b"] * 2 and len(listing) == 2
    store.replace(listing)
    assert calls == ["a", "b"] * 2 and len(store) == 2
    assert store.get(ObjectKey("ns", "b")) == objs[1]
    # Another store's listing is taken as objects: this store's transform runs on them.
    other = Store(transform=transform)
    other.replace(listing)
    assert calls == ["a", "b"] * 3 and other.keys() == store.keys()


def test_every_read_is_the_readers_own_copy():
    # Objects are kept packed: each read builds new dicts, so a reader that
    # edits what it got cannot change the cache or what another reader sees.
    s = Store()
    s.upsert(obj("a", labels={"app": "web"}))
    key = ObjectKey("default", "a")
    got = s.get(key)
    got["metadata"]["labels"]["app"] = "edited"
    got["metadata"]["name"] = "zzz"
    assert s.get(key)["metadata"]["labels"] == {"app": "web"}
    assert s.get(key) is not s.get(key)
    assert s.list()[0]["metadata"]["name"] == "a"


def test_resource_version_without_building_the_object():
    s = Store()
    s.upsert(obj("a", rv="7"))
    assert s.resource_version(ObjectKey("default", "a")) == "7"
    assert s.resource_version(ObjectKey("default", "nope")) is None
    token = s.begin_write()
    s.end_write(token, obj("a", rv="8"), base=obj("a", rv="7"))
    assert s.resource_version(ObjectKey("default", "a")) == "8"   # our write, not yet watched
    s.upsert({"metadata": {"name": "b", "namespace": "default", "resourceVersion": 9}})
    assert s.resource_version(ObjectKey("default", "b")) is None  # not a string: none


def test_replace_skips_list_items_that_are_not_objects():
    # A malformed item in a list has no key: a listing leaves it out.
    s = Store()
    listing = s.new_list([obj("a"), "garbage", 7, None])
    assert len(listing) == 1
    s.replace(listing)
    assert s.keys() == [ObjectKey("default", "a")]
    s.replace([obj("b"), ["x"]])
    assert s.keys() == [ObjectKey("default", "b")]


def test_the_namespace_index_is_answered_from_the_keys_after_every_kind_of_write():
    s = Store()
    s.upsert(obj("a", "n1"))
    s.replace(s.new_list([obj("b", "n2"), obj("c", "n1")]), namespace=None)
    s.upsert(obj("d", "n2"))
    s.delete(ObjectKey("n2", "b"))
    assert names(s.by_index("namespace", "n1")) == ["c"]
    assert names(s.by_index("namespace", "n2")) == ["d"]


def test_an_object_too_deep_to_pack_is_kept_whole():
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["d"] = {}
        node = node["d"]
    s = Store()
    o = obj("a")
    o["spec"] = deep
    s.upsert(o)
    got = s.get(ObjectKey("default", "a"))
    assert got["metadata"]["name"] == "a" and got["spec"] is deep
    assert s.resource_version(ObjectKey("default", "a")) == "1"
    s.replace(s.new_list([o]))
    assert s.keys() == [ObjectKey("default", "a")]


def test_a_listing_builds_its_objects_one_at_a_time():
    s = Store()
    built = s.new_list([obj("a"), "garbage", obj("b")]).objects()
    assert next(built)["metadata"]["name"] == "a"
    assert [o["metadata"]["name"] for o in built] == ["b"]


def test_some_fields_can_be_built_alone():
    s = Store()
    full = obj("a", owner_uid="u1", labels={"x": "1"})
    full["spec"] = {"replicas": 2}
    listing = s.new_list([full, {"spec": {}}])
    got = list(listing.objects(fields=(("metadata",),)))
    assert got == [{"metadata": full["metadata"]}, {}]
    got[0]["metadata"]["labels"]["x"] = "2"                 # a new copy, the reader's to edit
    assert next(listing.objects())["metadata"]["labels"] == {"x": "1"}
    # Nested fields, a map and a leaf among them; a field absent is left out; a
    # path through a leaf or a list leads nowhere; a path and its prefix agree.
    fields = (("metadata", "labels"), ("metadata", "name"), ("spec", "replicas"),
              ("status", "x"), ("metadata", "name", "deeper"),
              ("metadata", "ownerReferences", "0"))
    assert list(listing.objects(fields=fields)) == [
        {"metadata": {"labels": {"x": "1"}, "name": "a"}, "spec": {"replicas": 2}}, {}]
    one = s.new_list([full])
    for fields in ((("metadata",), ("metadata", "name")), (("metadata", "name"), ("metadata",))):
        assert list(one.objects(fields=fields)) == [{"metadata": full["metadata"]}]
    # A watch event's Change is built the same way.
    s.upsert(full)
    changed = dict(full, spec={"replicas": 3})
    change = s.upsert_if_changed(changed, fields=(("spec",),))
    assert change.old == {"spec": {"replicas": 2}} and change.new == {"spec": {"replicas": 3}}
    # An object nested too deeply to pack is kept whole (one leaf): built whole.
    deep: dict = {"x": 1}
    for _ in range(3000):
        deep = {"d": deep}
    nested = dict(obj("deep"), spec=deep)
    (whole,) = s.new_list([nested]).objects(fields=(("metadata", "name"),))
    assert whole["metadata"]["name"] == "deep"


def test_an_upserted_object_is_filed_under_its_own_interned_name():
    from k8s_http import Projection
    from k8s_http.cache.projection import Interner
    interner = Interner()
    store = Store(transform=Projection(["metadata.name", "metadata.namespace"],
                                       interner=interner))
    shared = interner("".join(["a", "pi"])), interner("".join(["te", "am"]))  # seen before
    store.upsert(obj("".join(["a", "pi"]), "".join(["te", "am"])))      # a fresh decode's strings
    (key,) = store.keys()
    assert key.name is shared[0] and key.namespace is shared[1]
    # A transform that renames: filed under the event's key, as before.
    renaming = Store(transform=lambda o: {"metadata": {"name": "other", "namespace": "x"}})
    renaming.upsert(obj("mine", "ns"))
    assert renaming.keys() == [ObjectKey("ns", "mine")]
