"""k8s_http.cache.projection: what a cache keeps, strings stored once, the guard for tests."""

from __future__ import annotations

import copy
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http import DroppedFieldRead, Projection
from k8s_http.cache import packcode
from k8s_http.cache.packed import unpack
from k8s_http.cache.projection import Interner
from k8s_http.cache.store import Store


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
    from k8s_http.cache.projection import Interner, Projection
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
    from k8s_http.cache.packed import unpack
    packed = PROJECTION.pack(copy.deepcopy(obj))
    assert unpack(packed) == PROJECTION(copy.deepcopy(obj))
    assert list(unpack(packed)) == list(PROJECTION(copy.deepcopy(obj)))   # key order


def test_packed_leaves_are_interned_like_the_projections():
    from k8s_http.cache.packed import unpack
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
    from k8s_http.cache.packed import leaf, unpack
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
    from k8s_http.cache.packed import unpack
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


# ---- the compiled packing walk (k8s_http.cache.packcode) against the generic one

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
    from k8s_http.cache.packed import unpack
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
    from k8s_http.cache import packcode
    from k8s_http.cache.packed import unpack
    deep = ".".join(f"k{i}" for i in range(packcode.MAX_DEPTH + 3))
    projection = Projection([deep], interner=Interner())
    assert projection._packer is None
    obj: dict = {}
    node = obj
    for i in range(packcode.MAX_DEPTH + 3):
        node = node.setdefault(f"k{i}", {})
    assert unpack(projection.pack(obj)) == projection(obj)


# ---- the one code generator (k8s_http.cache.packcode): readable, and never fed the data


def test_generated_source_is_registered_and_shows_in_a_traceback():
    import traceback
    from k8s_http.cache.packed import pack
    p = Projection(["metadata.name", "spec.replicas"], interner=Interner())
    text = packcode.generated_source(p._packer)
    assert text.startswith("def make(") and "def pack(value" in text
    built = pack({"a": {"b": 1}})
    assert "return {k[0]: {k[1]: v[1]}}" in packcode.generated_source(built[0].build)
    try:
        p._packer(None, None, None, None, None)          # token(None) is not callable
    except TypeError as err:
        frames = traceback.extract_tb(err.__traceback__)
        generated = [f for f in frames if f.filename.startswith("<k8s_http generated")]
        assert generated and generated[-1].line, frames
        assert "projection packer" in generated[-1].filename
    else:
        raise AssertionError("the packer accepted a token function of None")


def test_registered_sources_are_bounded(monkeypatch):
    import linecache
    from k8s_http.cache.packed import pack
    monkeypatch.setattr(packcode, "MAX_REGISTERED", 3)
    made = [pack({f"k{i}": {"x": i}})[0].build for i in range(6)]
    kept = [f for f in (m.__code__.co_filename for m in made) if f in linecache.cache]
    assert len(kept) <= 3 and packcode.generated_source(made[-1])
    assert all(m(pack({f"k{i}": {"x": i}})) == {f"k{i}": {"x": i}} for i, m in enumerate(made))


def test_no_generated_source_holds_anything_from_the_objects(monkeypatch):
    """Keys, values and declarations that look like code are data: every source
    the generator compiles is made of local names, integer literals and operators,
    whatever the objects and the declaration hold. The only exec in the package
    is the generator's own."""
    import re
    from k8s_http.cache.packed import pack, unpack
    sources = []
    real = packcode._compile
    monkeypatch.setattr(packcode, "_compile",
                        lambda text, kind, builtins: sources.append(text) or
                        real(text, kind, builtins))
    hostile = "__import__('os').system('x')"
    obj = {"metadata": {"name": hostile, "namespace": "n", "labels": {hostile: hostile}},
           hostile: {"k\n'\"": [hostile, 1]}, "spec": {"replicas": hostile}}
    p = Projection(["metadata.name", "metadata.labels", ("spec", "replicas"),
                    (hostile, "k\n'\"")], interner=Interner())
    assert unpack(p.pack(obj)) == p(obj)
    assert unpack(pack(obj)) == obj
    assert sources
    for text in sources:
        assert hostile not in text and "os" not in re.findall(r"[A-Za-z_]+", text)
        assert not re.search(r"['\"]", text), text           # no string literal at all
    package = pathlib.Path(packcode.__file__).parents[1]       # k8s_http, every wing
    callers = sorted(f.name for f in package.rglob("*.py")
                     if re.search(r"\b(exec|eval)\(", f.read_text()))
    assert callers == ["packcode.py"]


def _churn(store, projection_interner, rounds: int, per_round: int) -> list[int]:
    """Objects created and deleted in rounds, each with strings of its own (a
    name, a uid, an env value, a condition's time), as an operator sees under
    churn; the table's size after each round."""
    sizes = []
    for r in range(rounds):
        objs = [{"metadata": {"name": f"web-{r}-{i}", "namespace": "team-a",
                              "uid": f"uid-{r}-{i}"},
                 "spec": {"env": [{"name": "V", "value": f"value-{r}-{i}"}]},
                 "status": {"conditions": [{"type": "Ready",
                                            "lastTransitionTime": f"t-{r}-{i}"}]}}
                for i in range(per_round)]
        for obj in objs:
            store.upsert(obj)
        del objs
        for key in store.keys():
            store.delete(key)
        sizes.append(len(projection_interner))
    return sizes


def test_strings_no_cached_object_holds_leave_the_intern_table():
    # The soak of issue 36 saw strings decoded from watch lines (watchproto's
    # JSON scan) grow in every interval: names, uids and values of objects
    # deleted long ago, pinned by this table until it filled at max_entries.
    interner = Interner(sweep_floor=64)
    store = Store(transform=Projection(["metadata", "spec", "status"], interner=interner))
    sizes = _churn(store, interner, rounds=40, per_round=100)
    # 100 live objects hold ~5 strings each of their own, plus the shared keys.
    assert max(sizes) < 2 * (64 + 100 * 5 + 20), sizes


def test_a_sweep_keeps_every_string_an_object_still_holds_and_sharing_goes_on():
    interner = Interner(sweep_floor=8)
    held = [interner("".join(["kept", str(i)])) for i in range(50)]
    for i in range(500):
        interner("".join(["gone", str(i)]))
    assert len(interner) < 50 + 2 * 8 + 50          # the unheld ones were swept
    for i, s in enumerate(held):
        assert interner("".join(["kept", str(i)])) is s     # still shared
    small_ints = interner(7)
    assert small_ints == 7


def test_a_live_set_beyond_half_the_bound_still_empties_the_table():
    interner = Interner(max_entries=100, sweep_floor=8)
    held = [interner(f"h{i}") for i in range(300)]
    assert len(interner) <= 100
    assert held[-1] == "h299"
