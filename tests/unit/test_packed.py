"""Packed objects: leaves in a tuple, the structure shared; unpacking builds new containers."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http.cache import packed
from k8s_http.cache.packed import leaf, pack, unpack

json_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_unpack_gives_back_an_equal_value_with_the_same_key_order(value):
    got = unpack(pack(value))
    assert got == value
    assert json.dumps(got) == json.dumps(value)     # key order and types too


def test_objects_of_one_shape_share_their_layout_and_keep_only_leaves():
    a = pack({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": [1, 2]})
    b = pack({"metadata": {"name": "b", "labels": {"x": "2"}}, "spec": [3, 4]})
    assert a[0] is b[0]
    assert a[1:] == ("a", "1", 1, 2) and b[1:] == ("b", "2", 3, 4)
    other = pack({"metadata": {"name": "c"}})
    assert other[0] is not a[0]


def test_a_maps_leaf_has_no_token_of_its_own_and_an_explicit_one_reads_the_same():
    implicit = (packed.MAP, "a", "b", packed.MAP, "c", packed.END, "d", packed.DIGITS, packed.END)
    explicit = (packed.MAP, "a", packed.LEAF, "b", packed.MAP, "c", packed.LEAF, packed.END,
                "d", packed.DIGITS, packed.END)
    shape = ("{", ("a", "b", "d"), (None, ("{", ("c",), (None,)), packed.DIGITS_SHAPE))
    assert packed.nest(implicit) == packed.nest(explicit) == shape
    leaves, signature = [], []
    packed.pack_into({"a": 1, "b": {"c": "x"}, "l": [2]}, leaves, signature)
    assert signature == [packed.MAP, "a", "b", packed.MAP, "c", packed.END,
                         "l", packed.LIST, packed.LEAF, packed.END, packed.END]


def test_every_unpack_builds_new_containers():
    p = pack({"a": {"b": [1, {"c": 2}]}})
    first, second = unpack(p), unpack(p)
    first["a"]["b"][1]["c"] = 99
    first["a"]["b"].append(3)
    assert second == {"a": {"b": [1, {"c": 2}]}} and unpack(p) == second


def test_keys_that_look_like_code_are_only_data():
    value = {"k[0]": 1, "}, 'x': v[0]": 2, "__import__('os')": {"": [None, True]}}
    assert unpack(pack(value)) == value


def test_a_leaf_is_read_without_unpacking():
    p = pack({"metadata": {"name": "a", "labels": {"x": "1"}, "resourceVersion": "5"}})
    assert leaf(p, ("metadata", "resourceVersion")) == "5"
    assert leaf(p, ("metadata", "name")) == "a"
    assert leaf(p, ("metadata", "labels")) is None          # a map, not a leaf
    assert leaf(p, ("metadata", "uid")) is None
    assert leaf(p, ("spec", "x")) is None


def fields_of(value, paths):
    """What Layout.fields_builder(paths) must build, read off the value itself."""
    if any(not path for path in paths):
        return value
    found = {}
    for path in paths:
        node = value
        for step in path:
            node = node.get(step, KeyError) if isinstance(node, dict) else KeyError
        if node is not KeyError:
            found[path] = node
    out: dict = {}
    for path, node in found.items():
        if any(path[:n] in found for n in range(1, len(path))):
            continue                                    # inside a path kept whole
        target = out
        for step in path[:-1]:
            target = target.setdefault(step, {})
        target[path[-1]] = node
    return out


def test_fields_are_built_alone_by_their_layout():
    value = {"a": 1, "metadata": {"name": "x", "refs": [{"k": "My"}], "e": {}}, "z": [1, {"q": 2}]}
    p = pack(value)
    layout = p[0]
    build = layout.fields_builder((("metadata", "refs"), ("a",), ("nope",), ("a", "b")))
    got = build(p)
    assert got == {"metadata": {"refs": [{"k": "My"}]}, "a": 1}
    assert got["metadata"]["refs"] is not value["metadata"]["refs"]     # new copies
    assert layout.fields_builder((("metadata",), ("metadata", "name")))(p) == \
        {"metadata": value["metadata"]}                 # the inner path adds nothing
    assert layout.fields_builder((("metadata", "name"), ()))(p) == value   # () = whole
    digits = packed.seal([packed.MAP, "rv", packed.DIGITS, packed.END], [12])
    assert digits[0].fields_builder((("rv",),))(digits) == {"rv": "12"}
    assert pack([1, 2])[0].fields_builder((("a",),))(pack([1, 2])) == {}  # no fields


few_keys = st.sampled_from(["a", "b", "metadata", "name", ""])
paths_in = st.lists(st.lists(few_keys, max_size=3).map(tuple), max_size=4).map(tuple)
objects_of_few_keys = st.dictionaries(few_keys, st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(few_keys, inner, max_size=4),
    max_leaves=20), max_size=4)


@settings(max_examples=500, deadline=None)
@given(objects_of_few_keys, paths_in)
def test_fields_builder_builds_what_the_paths_name_and_nothing_else(value, paths):
    p = pack(value)
    assert p[0].fields_builder(paths)(p) == fields_of(value, paths)


def test_fields_of_shapes_too_large_to_compile_are_built_by_a_walk():
    wide = {"m": {f"k{i}": i for i in range(packed._MAX_COMPILED_NODES + 1)}, "n": "x"}
    p = pack(wide)
    assert p[0].fields_builder((("m",), ("n",)))(p) == wide
    assert p[0].fields_builder((("m", "k7"), ("n",)))(p) == {"m": {"k7": 7}, "n": "x"}


def test_same_apart_from_ignores_one_leaf_only():
    def meta(rv, name="a", labels=None):
        return pack({"metadata": {"name": name, "resourceVersion": rv, **(labels or {})}})
    path = ("metadata", "resourceVersion")
    assert packed.same_apart_from(meta("1"), meta("2"), path)
    assert not packed.same_apart_from(meta("1"), meta("2", name="b"), path)
    assert not packed.same_apart_from(meta("1"), meta("1", labels={"x": "1"}), path)  # layouts
    assert packed.same_apart_from(pack({"a": 1}), pack({"a": 1}), path)    # no such leaf
    assert not packed.same_apart_from(pack({"a": 1}), pack({"a": 2}), path)


def test_shapes_too_large_or_too_deep_to_compile_are_built_by_a_walk():
    wide = {f"k{i}": i for i in range(packed._MAX_COMPILED_NODES + 1)}
    keys_only = {f"k{i}": {} for i in range(packed._MAX_COMPILED_NODES + 1)}   # no leaves
    deep: object = "leaf"
    for _ in range(packed._MAX_COMPILED_DEPTH + 5):
        deep = {"d": [deep]}
    for value in (wide, keys_only, deep):
        assert unpack(pack(value)) == value


def test_the_layout_table_is_bounded_and_old_objects_keep_theirs():
    table = packed._LayoutTable(max_entries=2)
    layouts = [table.layout((packed.LIST,) + (packed.LEAF,) * n + (packed.END,), n)
               for n in range(1, 6)]
    assert len(table) <= 2
    assert [layout.leaves for layout in layouts] == [1, 2, 3, 4, 5]


def test_a_digits_leaf_is_built_as_its_string_by_both_builders():
    signature = [packed.MAP, "rv", packed.DIGITS, "n", packed.LEAF, packed.END]
    compiled = packed.seal(list(signature), [42, 7])
    assert unpack(compiled) == {"rv": "42", "n": 7}
    assert leaf(compiled, ("rv",)) == "42" and leaf(compiled, ("n",)) == 7
    shape = compiled[0].shape
    assert packed._build_walk(shape, iter([42, 7]).__next__) == {"rv": "42", "n": 7}


@settings(max_examples=300, deadline=None)
@given(objects_of_few_keys, paths_in)
def test_leaves_getter_answers_what_leaf_answers_for_each_path(value, paths):
    p = pack(value)
    assert p[0].leaves_getter(paths)(p) == tuple(leaf(p, path) for path in paths)


def test_leaves_getter_turns_digits_back_and_reads_a_value_packed_whole():
    digits = packed.seal([packed.MAP, "rv", packed.DIGITS, "n", packed.LEAF, packed.END], [12, 3])
    assert digits[0].leaves_getter((("rv",), ("n",)))(digits) == ("12", 3)
    whole = packed.seal([packed.LEAF], [{"metadata": {"name": "a", "namespace": "n"}}])
    paths = (("metadata", "namespace"), ("metadata", "name"))
    assert whole[0].leaves_getter(paths)(whole) == ("n", "a")
