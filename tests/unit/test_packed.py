"""Packed objects: leaves in a tuple, the structure shared; unpacking builds new containers."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http import packed
from k8s_http.packed import leaf, pack, unpack

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


def test_a_part_is_built_alone_by_its_layout():
    value = {"a": 1, "metadata": {"name": "x", "refs": [{"k": "My"}], "e": {}}, "z": [1, {"q": 2}]}
    p = pack(value)
    layout = p[0]
    for path in (("metadata",), ("metadata", "refs"), ("z",), ("a",), ("metadata", "e")):
        want = value
        for step in path:
            want = want[step]
        got = layout.part_builder(path)(p)
        assert got == want
        if isinstance(got, (dict, list)):
            assert got is not want                      # a new copy
    assert layout.part_builder(("nope",)) is None and layout.part_builder(("a", "b")) is None
    digits = packed.seal([packed.MAP, "rv", packed.DIGITS, packed.END], [12])
    assert digits[0].part_builder(("rv",))(digits) == "12"


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
