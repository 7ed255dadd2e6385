"""k8s_http.projection: what a cache keeps, strings stored once, the guard for tests."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http import DroppedFieldRead, Projection, shapes
from k8s_http.packed import unpack
from k8s_http.projection import Interner
from k8s_http.store import Store


def deployment(name="web", rv="7", image="registry.example/app:1.2"):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "name": name, "namespace": "team-a", "uid": f"uid-{name}", "resourceVersion": rv,
            "generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": name, "tier": "web"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}",
                            "mine.jp/config-hash": "abc"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "replicas": 3, "revisionHistoryLimit": 10,
            "template": {"spec": {"containers": [
                {"name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                 "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"x": 1}}]},
                {"name": "sidecar", "image": "proxy:2", "args": ["--verbose"]},
            ]}},
        },
        "status": {"replicas": 3, "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "message": f"Deployment {name} has minimum availability.",
             "lastUpdateTime": "2026-01-01T00:00:01Z"}]},
    }


PROJECTION = Projection([
    "apiVersion", "kind", "metadata.name", "metadata.namespace", "metadata.resourceVersion",
    "metadata.labels", ("metadata", "annotations", "mine.jp/config-hash"),
    "spec.replicas", "spec.template.spec.containers[].name",
    "spec.template.spec.containers[].image", "spec.template.spec.containers[].env[].name",
    "status.conditions[].type", "status.conditions[].reason", "status.conditions[].message",
], distinct=["metadata.resourceVersion"], repeated=["status.conditions[].message"],
    interner=Interner())


def test_keeps_the_declared_paths_and_nothing_else():
    assert PROJECTION(deployment()) == {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a", "resourceVersion": "7",
                     "labels": {"app": "web", "tier": "web"},
                     "annotations": {"mine.jp/config-hash": "abc"}},
        "spec": {"replicas": 3, "template": {"spec": {"containers": [
            {"name": "app", "image": "registry.example/app:1.2",
             "env": [{"name": "A"}, {"name": "B"}]},
            {"name": "sidecar", "image": "proxy:2"},
        ]}}},
        "status": {"conditions": [{"type": "Available", "reason": "MinimumReplicasAvailable",
                                   "message": "Deployment web has minimum availability."}]},
    }


def test_the_input_is_not_mutated_and_the_projection_is_idempotent():
    obj = deployment()
    before = copy.deepcopy(obj)
    once = PROJECTION(obj)
    assert obj == before
    assert PROJECTION(once) == once      # the watcher projects pages, the Store again


def test_a_value_of_unexpected_shape_is_kept_whole():
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"] = "not a list"
    obj["metadata"]["labels"] = ["odd"]
    out = PROJECTION(obj)
    assert out["spec"]["template"]["spec"]["containers"] == "not a list"
    assert out["metadata"]["labels"] == ["odd"]


def test_star_and_a_whole_ancestor():
    projection = Projection(["metadata.labels.*", "metadata", "metadata.labels.x"],
                            interner=Interner())
    obj = deployment()
    assert projection(obj)["metadata"] == {k: v for k, v in obj["metadata"].items()}


def test_keeps_answers_for_declared_paths_their_ancestors_and_descendants():
    projection = Projection(["metadata.labels", "spec.template.spec.containers[].image"],
                            interner=Interner())
    for path in ("metadata", "metadata.labels", "metadata.labels.app", "spec.template",
                 "spec.template.spec.containers.image", "metadata.name"):   # name: implicit
        assert projection.keeps(path), path
    for path in ("metadata.managedFields", "status", "spec.replicas",
                 "spec.template.spec.containers.name"):
        assert not projection.keeps(path), path


def test_a_store_skips_managed_fields_only_when_its_transform_cannot_keep_them():
    assert Store().drops_managed_fields
    assert Store(transform=Projection(["spec"])).drops_managed_fields
    for transform in (Projection(["metadata"]), Projection(["metadata.managedFields"]),
                      None, lambda obj: obj):
        assert not Store(transform=transform).drops_managed_fields


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError):
        Projection(["metadata..name"])
    with pytest.raises(ValueError):
        Projection(["metadata.name"], distinct=["metadata.uid"])


def test_repeated_strings_are_stored_once_distinct_ones_are_not_shared():
    a = PROJECTION(deployment("one", rv="".join(["1", "2"]), image="".join(["img", ":1"])))
    b = PROJECTION(deployment("two", rv="".join(["1", "2"]), image="".join(["img", ":1"])))
    image = lambda o: o["spec"]["template"]["spec"]["containers"][0]["image"]  # noqa: E731
    assert image(a) is image(b)
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    key_a = next(k for k in a["metadata"]["annotations"])
    key_b = next(k for k in b["metadata"]["annotations"])
    assert key_a is key_b
    # resourceVersions are unique and short-lived: not put in the table
    assert a["metadata"]["resourceVersion"] == b["metadata"]["resourceVersion"]
    assert a["metadata"]["resourceVersion"] is not b["metadata"]["resourceVersion"]


def test_the_intern_table_is_bounded():
    table = Interner(max_entries=3)
    for i in range(10):
        table(f"s{i}")
        assert len(table) <= 3
    first = table("".join(["x", "y"]))
    assert table("".join(["x", "y"])) is first


def test_guarded_raises_on_dropped_fields_only():
    obj = PROJECTION.guarded(deployment())
    assert obj["metadata"]["name"] == "web"
    assert obj["metadata"].get("deletionTimestamp") is None     # absent, not dropped
    assert obj.get("metadata") or {}                            # truthiness still works
    for read in (lambda: obj["metadata"]["uid"], lambda: obj["metadata"].get("managedFields"),
                 lambda: "revisionHistoryLimit" in obj["spec"],
                 lambda: obj["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
                 lambda: obj["status"]["conditions"][0].get("status"),
                 lambda: list(obj["metadata"]), lambda: obj["spec"].items(),
                 lambda: copy.deepcopy(obj)):
        with pytest.raises(DroppedFieldRead):
            read()
    # a whole-kept map is a plain dict
    assert dict(obj["metadata"]["labels"]) == {"app": "web", "tier": "web"}


def test_the_store_projects_lists_events_and_our_own_write_answers():
    store = Store(transform=PROJECTION)
    store.replace([deployment("a")])
    store.upsert(deployment("b"))
    token = store.begin_write()
    store.end_write(token, deployment("c"))
    for name in "abc":
        cached = store.get(type(store.keys()[0])("team-a", name))
        assert "managedFields" not in cached["metadata"] and "uid" not in cached["metadata"]


def test_a_projection_interns_through_the_tables_setdefault_and_keeps_the_bound():
    from k8s_http.projection import Interner, Projection
    interner = Interner(max_entries=100)
    keep = Projection(["metadata.name", "metadata.labels"], interner=interner)
    first = keep({"metadata": {"name": "a" * 3, "labels": {"k": "v"}}})
    again = keep({"metadata": {"name": "".join(["a"] * 3), "labels": {"k": "v"}}})
    assert again["metadata"]["name"] is first["metadata"]["name"]      # shared
    small = Interner(max_entries=8)
    keep = Projection(["metadata.name"], interner=small)
    for i in range(50):                     # the bound is checked once per object
        keep({"metadata": {"name": f"n{i}"}})
    assert len(small) <= 8 + 3


def _odd_shapes():
    odd = deployment("odd")
    odd["spec"]["template"]["spec"]["containers"] = "not a list"
    odd["metadata"]["labels"] = ["odd"]
    odd["status"]["conditions"].append("not a map")
    return odd


@pytest.mark.parametrize("obj", [deployment(), deployment("b", rv="8"), _odd_shapes(),
                                 {"metadata": {"name": "bare"}}, {}],
                         ids=["deployment", "another", "odd-shapes", "bare", "empty"])
def test_packing_projects_exactly_as_the_projection_does(obj):
    from k8s_http.packed import unpack
    packed = PROJECTION.pack(copy.deepcopy(obj))
    assert unpack(packed) == PROJECTION(copy.deepcopy(obj))
    assert list(unpack(packed)) == list(PROJECTION(copy.deepcopy(obj)))   # key order


def test_packed_leaves_are_interned_like_the_projections():
    from k8s_http.packed import unpack
    a = unpack(PROJECTION.pack(deployment("one", image="".join(["img", ":1"]))))
    b = unpack(PROJECTION.pack(deployment("two", image="".join(["img", ":1"]))))
    image = lambda o: o["spec"]["template"]["spec"]["containers"][0]["image"]  # noqa: E731
    assert image(a) is image(b)


def test_the_stores_identity_fields_are_kept_even_when_not_declared():
    projection = Projection(["spec.replicas"], interner=Interner())
    kept = projection(deployment(rv="".join(["4", "2"])))
    assert kept == {"metadata": {"name": "web", "namespace": "team-a", "resourceVersion": "42"},
                    "spec": {"replicas": 3}}
    assert projection.paths == (("spec", "replicas"),)     # the declaration as written


@pytest.mark.parametrize("rv", ["12", "0", "987654321012345678", "007", "1" * 19, "12a", "",
                                "\u0661\u0662", "-3"])
def test_a_distinct_string_of_digits_is_packed_as_an_int_and_read_back_as_the_string(rv):
    from k8s_http.packed import leaf, unpack
    packed = PROJECTION.pack(deployment(rv=rv))
    got = unpack(packed)["metadata"]["resourceVersion"]
    assert got == rv and got.__class__ is str
    assert leaf(packed, ("metadata", "resourceVersion")) == rv
    as_int = rv in ("12", "0", "987654321012345678")    # str(int(rv)) == rv, at most 18 digits
    assert any(v.__class__ is int and str(v) == rv for v in packed[1:]) == as_int
    store = Store(transform=PROJECTION)
    store.upsert(deployment(rv=rv))
    (key,) = store.keys()
    assert store.resource_version(key) == rv and store.get(key) == unpack(packed)


def test_a_repeated_string_is_shared_from_its_second_sighting_only():
    interner = Interner(window=4)
    projection = Projection(["metadata.name", "status.conditions[].message"],
                            repeated=["status.conditions[].message"], interner=interner)

    def message(packed):
        return next(v for v in packed[1:] if isinstance(v, str) and v.startswith("msg"))

    def with_message(text):
        return {"metadata": {"name": "a"}, "status": {"conditions": [{"message": text}]}}

    first = message(projection.pack(with_message("".join(["msg", " constant"]))))
    assert "msg constant" not in interner._table                 # once: not shared
    second = message(projection.pack(with_message("".join(["msg", " constant"]))))
    assert second is first and interner._table.get("msg constant") is first
    third = message(projection.pack(with_message("".join(["msg", " constant"]))))
    assert third is first
    for i in range(20):                                         # unique ones never enter the table
        projection.pack(with_message(f"msg {i}"))
    assert not any(k.startswith("msg ") and k != "msg constant" for k in interner._table)
    assert len(interner._first_seen) <= 4                       # the window is bounded


def test_integers_are_stored_once_too():
    from k8s_http.packed import unpack
    interner = Interner()
    projection = Projection(["metadata.name", "spec.replicas"], interner=interner)
    a = projection.pack({"metadata": {"name": "a"}, "spec": {"replicas": int("70000")}})
    b = projection.pack({"metadata": {"name": "b"}, "spec": {"replicas": int("70000")}})
    assert a[-1] is b[-1] and unpack(a)["spec"]["replicas"] == 70000
    flag = projection.pack({"metadata": {"name": "c"}, "spec": {"replicas": True}})
    assert unpack(flag)["spec"]["replicas"] is True             # a bool stays a bool


def test_a_distinct_string_is_never_shared_even_when_seen_again():
    interner = Interner()
    projection = Projection(["metadata.name", "metadata.hash"], distinct=["metadata.hash"],
                            interner=interner)
    seen = [projection.pack({"metadata": {"name": "a", "hash": "".join(["9f", "c3"])}})[-1]
            for _ in range(3)]
    assert seen[0] == seen[1] == seen[2] == "9fc3"
    assert seen[0] is not seen[1] and seen[1] is not seen[2]
    assert "9fc3" not in interner._table


# ---- the compiled packing walk (k8s_http.packcode) against the generic one

def _walked(projection: Projection, obj: dict) -> tuple[list, list]:
    leaves: list = []
    signature: list = []
    projection._pack_node(obj, projection._tree, projection._bound_intern(),
                          projection._repeated_intern(), leaves.append, signature.append)
    return leaves, signature


def _compiled(projection: Projection, obj: dict) -> tuple[list, list]:
    leaves: list = []
    signature: list = []
    projection._packer(obj, projection._bound_intern(), projection._repeated_intern(),
                       leaves.append, signature.append)
    return leaves, signature


# Values shaped like a Deployment under PROJECTION and WILD, with the wrong shape
# now and then: a list where a map was declared, a map where a list was, a string,
# a dict subclass, keys the declaration does not name.
_NAMES = st.sampled_from(["metadata", "name", "labels", "spec", "template", "containers",
                          "image", "env", "status", "conditions", "message", "type",
                          "annotations", "mine.jp/config-hash", "resourceVersion", "x"])


class _Sub(dict):
    pass


_LEAVES = st.none() | st.booleans() | st.integers() | st.text(max_size=3) | \
    st.sampled_from(["12", "007", "msg a", "msg a"])
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAMES, inner, max_size=5)
    | st.dictionaries(_NAMES, inner, max_size=3).map(_Sub),
    max_leaves=30)
WILD = Projection(["metadata.labels.*", "spec.*.containers[].image", "spec.x[].x[].name",
                   "status.conditions[].message", "metadata.resourceVersion"],
                  distinct=["metadata.resourceVersion"],
                  repeated=["status.conditions[].message"], interner=Interner())


def _same_compact_same_shape(projection: Projection, objs: list) -> None:
    """The compiled walk appends the generic walk's leaves; objects whose compact
    signatures are equal have equal generic signatures (so may share a layout);
    and each object packs to its projection, in layouts shared as they come."""
    from k8s_http.packed import unpack
    generic_of: dict = {}
    for obj in objs:
        leaves, compact = _compiled(projection, obj)
        walked, generic = _walked(projection, obj)
        assert leaves == walked
        assert generic_of.setdefault(tuple(compact), tuple(generic)) == tuple(generic)
        assert unpack(projection.pack(obj)) == projection(obj)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_NAMES, _VALUES, max_size=6), max_size=6))
def test_the_compiled_walk_packs_as_the_generic_walk_with_a_signature_that_fixes_the_shape(objs):
    for projection in (PROJECTION, WILD):
        assert projection._packer is not None
        _same_compact_same_shape(projection, objs)


def _variants() -> list[dict]:
    """A Deployment and the same with one place changed: a key gone, a list
    longer or shorter, a value of another kind, a key not declared."""
    made = [deployment(), _odd_shapes(), {}, {"metadata": {}}, []]
    changes = [
        lambda d: d["metadata"].pop("labels"),
        lambda d: d["metadata"].pop("resourceVersion"),
        lambda d: d["metadata"].update(resourceVersion="x1"),
        lambda d: d["metadata"].update(labels="flat"),
        lambda d: d["metadata"].update(labels={}),
        lambda d: d["metadata"].update(name=None),
        lambda d: d["metadata"].update(name=["a"]),
        lambda d: d["metadata"]["annotations"].pop("mine.jp/config-hash"),
        lambda d: d["metadata"].update(extra="undeclared"),
        lambda d: d["spec"]["template"]["spec"]["containers"].pop(),
        lambda d: d["spec"]["template"]["spec"]["containers"].append({"name": "third"}),
        lambda d: d["spec"]["template"]["spec"]["containers"].append("not a map"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("env"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["env"].pop(),
        lambda d: d["spec"]["template"]["spec"].update(containers={"name": "a map"}),
        lambda d: d["spec"].update(template=[1]),
        lambda d: d["status"]["conditions"][0].update(message={"not": "text"}),
        lambda d: d["status"].update(conditions=[]),
        lambda d: d.pop("status"),
    ]
    for change in changes:
        obj = deployment()
        change(obj)
        made.append(obj)
    return made


def test_each_change_of_shape_changes_the_compact_signature():
    variants = _variants()
    _same_compact_same_shape(PROJECTION, variants)
    generic = {tuple(_walked(PROJECTION, obj)[1]) for obj in variants}
    compact = {tuple(_compiled(PROJECTION, obj)[1]) for obj in variants}
    assert len(compact) >= len(generic) > 20     # finer where a leaf is not a str or int


def test_the_compact_signature_of_a_deployment_is_short():
    # Left: the maps kept whole (labels), the lists' lengths, the hash that is not digits.
    compact, generic = _compiled(PROJECTION, deployment())[1], _walked(PROJECTION, deployment())[1]
    assert len(compact) * 5 < len(generic)


def test_a_declaration_too_deep_to_compile_is_packed_by_the_generic_walk():
    from k8s_http import packcode
    from k8s_http.packed import unpack
    deep = ".".join(f"k{i}" for i in range(packcode.MAX_DEPTH + 3))
    projection = Projection([deep], interner=Interner())
    assert projection._packer is None
    obj: dict = {}
    node = obj
    for i in range(packcode.MAX_DEPTH + 3):
        node = node.setdefault(f"k{i}", {})
    assert unpack(projection.pack(obj)) == projection(obj)


# ---- packing by shape (k8s_http.shapes): an object of a learned shape is packed
# by its extractor exactly as the walk packs it; one of any other shape is left to the walk.

def projection() -> Projection:
    """A Deployment-like declaration with every kind of place: declared maps and
    lists, leaves, values kept whole (labels), distinct and repeated strings."""
    return Projection([
        "apiVersion", "kind", "metadata.name", "metadata.namespace", "metadata.resourceVersion",
        "metadata.labels", ("metadata", "annotations", "mine.jp/config-hash"),
        "spec.replicas", "spec.template.spec.containers[].name",
        "spec.template.spec.containers[].image", "spec.template.spec.containers[].env",
        "status.conditions[].type", "status.conditions[].reason",
        "status.conditions[].message",
    ], distinct=["metadata.resourceVersion", ("metadata", "annotations", "mine.jp/config-hash")],
        repeated=["status.conditions[].message"], interner=Interner())


def walked(p: Projection, obj: dict) -> tuple:
    """`obj` packed by the compiled walk alone, as Projection.pack does without shapes."""
    return p._walk_pack(obj, p._bound_intern(), p._repeated_intern())


def extracted(p: Projection, obj: dict) -> list:
    """What each learned extractor answers for `obj` (None: not its shape)."""
    return [extract(obj, p._bound_intern(), p._repeated_intern()) for extract in p._shapes.known]


def test_a_shape_is_learned_on_its_second_sighting_and_then_packs_as_the_walk():
    p = projection()
    p.pack(deployment("a", rv="7"))
    assert p._shapes.known == ()
    p.pack(deployment("b", rv="8"))
    assert len(p._shapes.known) == 1
    third = deployment("c", rv="9", image="other:3")
    hits = p._shapes.hits
    packed = p.pack(copy.deepcopy(third))
    assert p._shapes.hits == hits + 1
    assert packed == walked(p, third)             # the same layout, the same leaves
    assert unpack(packed) == p(third)
    assert list(unpack(packed)["metadata"]) == list(p(third)["metadata"])


def _parent(obj: dict, path: tuple) -> dict:
    for step in path[:-1]:
        obj = obj[step]
    return obj


def _set(path: tuple, value: object):
    return lambda obj: _parent(obj, path).__setitem__(path[-1], value)


def _drop(path: tuple):
    return lambda obj: _parent(obj, path).__delitem__(path[-1])


CONTAINERS = ("spec", "template", "spec", "containers")
SHAPE_CHANGES = {
    "declared key gone": _drop(("metadata", "namespace")),
    "declared map gone": _drop(("status",)),
    "leaf of another class": _set(("spec", "replicas"), "3"),
    "leaf turned bool": _set(("spec", "replicas"), True),
    "leaf turned map": _set(("metadata", "name"), {"a": "b"}),
    "declared map turned list": _set(("metadata",), []),
    "declared list turned map": _set(CONTAINERS, {"name": "x"}),
    "declared list longer": lambda d: d["spec"]["template"]["spec"]["containers"].append(
        {"name": "third"}),
    "declared list item not a map": lambda d: d["status"]["conditions"].append("text"),
    "whole map keys in another order": _set(("metadata", "labels"), {"tier": "web", "app": "x"}),
    "whole map with another key": _set(("metadata", "labels"), {"app": "x", "zone": "web"}),
    "whole map leaf of another class": _set(("metadata", "labels"), {"app": "x", "tier": 1}),
    "whole list shorter": lambda d: d["spec"]["template"]["spec"]["containers"][0]["env"].pop(),
    "whole list item of another class": lambda d: d["spec"]["template"]["spec"]["containers"][0]
    ["env"].__setitem__(0, None),
    "whole value a dict subclass": _set(("metadata", "labels"), type("Sub", (dict,), {})(
        app="x", tier="web")),
    "distinct digits turned text": _set(("metadata", "resourceVersion"), "v8"),
    "distinct text turned digits": _set(("metadata", "annotations", "mine.jp/config-hash"), "12"),
    "distinct not a string": _set(("metadata", "resourceVersion"), 8),
    "repeated not a string": lambda d: d["status"]["conditions"][0].update(message=None),
    "a str subclass leaf": _set(("metadata", "name"), type("S", (str,), {})("web")),
}


@pytest.mark.parametrize("change", list(SHAPE_CHANGES.values()), ids=list(SHAPE_CHANGES))
def test_an_object_of_another_shape_is_refused_and_packed_by_the_walk(change):
    p = projection()
    p.pack(deployment("a"))
    p.pack(deployment("b"))
    assert len(p._shapes.known) == 1
    obj = deployment("c")
    change(obj)
    assert extracted(p, obj) == [None]
    assert p.pack(copy.deepcopy(obj)) == walked(p, obj)


def test_keys_the_declaration_does_not_read_do_not_change_the_shape():
    p = projection()
    p.pack(deployment("a"))
    p.pack(deployment("b"))
    obj = deployment("c")
    obj["metadata"]["finalizers"] = ["x"]
    obj["spec"]["paused"] = True
    del obj["metadata"]["creationTimestamp"]
    assert extracted(p, obj) == [walked(p, obj)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_NAMES, _VALUES, max_size=6), max_size=8))
def test_every_extractor_answers_as_the_walk_or_not_at_all(objs):
    p = projection()
    for obj in objs * 2:                 # each shape seen twice: learned
        assert unpack(p.pack(obj)) == p(obj)
    for obj in objs:
        want = walked(p, obj)
        assert p.pack(obj) == want
        for answer in extracted(p, obj):
            assert answer is None or answer == want


def test_a_shape_of_an_unlearnable_object_is_none():
    p = projection()
    markers = {"distinct_marker": "\0distinct", "repeated_marker": "\0repeated",
               "digits": lambda s: None}
    assert shapes.shape_under([], p._tree, p._list_nodes, **markers) is None
    big = deployment()
    big["metadata"]["labels"] = {f"k{i}": "v" for i in range(shapes.MAX_NODES)}
    assert shapes.shape_under(big, p._tree, p._list_nodes, **markers) is None
    star = Projection(["metadata.labels.*"], interner=Interner())
    assert shapes.shape_under(deployment(), star._tree, star._list_nodes, **markers) is None


def test_learning_slows_down_where_shapes_keep_changing():
    learned = shapes.LearnedShapes()
    misses = shapes.LEARN_FREELY + 10 * shapes.LEARN_EVERY
    looked = sum(learned.should_learn() for _ in range(misses))
    assert looked == shapes.LEARN_FREELY + 10
    learned.hits = 2 * learned.misses             # shapes that match: learn freely again
    assert all(learned.should_learn() for _ in range(5))


def test_a_shape_is_forgotten_once_newer_ones_fill_the_table():
    learned = shapes.LearnedShapes()
    for n in range(shapes.MAX_SHAPES + 2):
        learned.learn(n)
    assert learned.known == tuple(range(shapes.MAX_SHAPES + 1, 1, -1))


def test_an_extractor_whose_leaf_count_differs_from_the_walks_is_not_learned(monkeypatch):
    from k8s_http import projection as projection_module
    real = projection_module.compile_extractor
    monkeypatch.setattr(projection_module, "compile_extractor",
                        lambda *args, **kw: (real(*args, **kw)[0], -1))
    p = projection()
    for name in "abc":
        assert unpack(p.pack(deployment(name))) == p(deployment(name))
    assert p._shapes.known == ()
