"""Watch lines decoded without managedFields (watchproto.cut_managed_fields).

The contract: with `skip_managed_fields`, a decoded object is the object as
sent, less metadata.managedFields when the cut is safe, and the object as sent
otherwise; never anything else, and malformed lines fail exactly as before.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http.wire.watchproto import LineDecoder, WatchDecodeError, cut_managed_fields

APPLY = {"manager": "my-controller", "operation": "Apply", "apiVersion": "apps/v1",
         "time": "2026-12-02T10:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}},
                      "f:spec": {"f:template": {"f:spec": {"f:containers": {
                          'k:{"name":"app"}': {".": {}, "f:image": {}, "f:name": {}}}}}}}}
STATUS = {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
          "time": "2026-12-02T10:00:01Z", "fieldsType": "FieldsV1",
          "fieldsV1": {"f:status": {"f:replicas": {}, "f:conditions": {".": {}}}},
          "subresource": "status"}


def deployment(managed=(APPLY, STATUS)) -> dict:
    """A Deployment in the apiserver's order: managedFields last in metadata."""
    return {"kind": "Deployment", "apiVersion": "apps/v1",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1",
                         "resourceVersion": "42", "generation": 3,
                         "labels": {"app": "web"}, "managedFields": list(managed)},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "app", "image": "nginx:1.27", "args": ["a]b", "]},\"c"]}]}}},
            "status": {"observedGeneration": 3, "conditions": [{"type": "Available"}]}}


def custom_resource() -> dict:
    """A custom resource: the apiserver writes its keys sorted."""
    return {"apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"creationTimestamp": "2026-12-02T10:00:00Z", "generation": 1,
                         "managedFields": [APPLY], "name": "a", "namespace": "ns",
                         "resourceVersion": "7", "uid": "u-2"},
            "spec": {"image": "nginx"}}


def line_of(obj: dict, event_type: str = "ADDED") -> bytes:
    # The apiserver's compact form, UTF-8 as is.
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":"),
                      ensure_ascii=False).encode() + b"\n"


def without_managed_fields(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("managedFields", None)
    return obj


def decoded(data: bytes, *, skip: bool = True) -> dict:
    decoder = LineDecoder(skip_managed_fields=skip)
    decoder.feed(data)
    events = list(decoder.events())
    assert len(events) == 1
    return events[0].object


@pytest.mark.parametrize("obj", [deployment(), custom_resource()], ids=["typed", "custom"])
def test_the_apiservers_orders_are_cut(obj):
    data = line_of(obj)
    assert cut_managed_fields(data) is not None
    assert decoded(data) == without_managed_fields(obj)
    assert decoded(data, skip=False) == obj


def test_managed_fields_as_the_first_key_of_metadata():
    for rest in ({"name": "a"}, {}):
        obj = {"metadata": {"managedFields": [APPLY], **rest}, "spec": {"x": 1}}
        assert decoded(line_of(obj)) == without_managed_fields(obj)


@pytest.mark.parametrize("manager", [
    'a]},"spec":{', 'a],"name":"b', "a]", '"]},"', "\\", '\\"]},"x', "ü]},\"",
])
def test_a_hostile_manager_name_never_changes_the_object(manager):
    entry = dict(APPLY, manager=manager)
    obj = deployment(managed=(entry, STATUS))
    got = decoded(line_of(obj))
    assert got in (obj, without_managed_fields(obj))


def test_an_entry_with_a_list_is_decoded_whole():
    # Not what an apiserver writes today: the cut would end inside the array,
    # so the rest does not parse and the whole line is decoded instead.
    entry = dict(APPLY, extra=["x"])
    obj = deployment(managed=(entry, STATUS))
    assert decoded(line_of(obj)) == obj


def test_objects_without_managed_fields_are_untouched():
    obj = without_managed_fields(deployment())
    data = line_of(obj)
    assert cut_managed_fields(data) is None
    assert decoded(data) == obj


def test_malformed_lines_still_fail_as_before():
    good = line_of(deployment())
    for bad in (good[:-2] + b"\n",                       # truncated JSON
                good.replace(b'"web"', b'"w\xffb"', 1),     # not UTF-8 outside the cut
                b'[1, 2]\n'):                               # not an object
        for skip in (True, False):
            decoder = LineDecoder(skip_managed_fields=skip)
            decoder.feed(bad)
            with pytest.raises(WatchDecodeError):
                list(decoder.events())


_text = st.text(alphabet=st.sampled_from(list('ab]}[{,":\\ü ')), max_size=12)
_fields = st.recursive(st.just({}), lambda inner: st.dictionaries(_text, inner, max_size=3),
                       max_leaves=8)
_entries = st.lists(st.fixed_dictionaries(
    {"manager": _text, "operation": st.sampled_from(["Apply", "Update"]), "fieldsV1": _fields},
    optional={"subresource": _text}), max_size=3)
_values = st.recursive(st.none() | st.integers() | _text,
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_text, inner, max_size=3), max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(before=st.dictionaries(st.sampled_from(["name", "uid", "labels", "finalizers"]),
                              _values, max_size=3),
       after=st.dictionaries(st.sampled_from(["namespace", "resourceVersion", "ownerReferences"]),
                             _values, max_size=3),
       managed=_entries, spec=_values)
def test_any_object_decodes_to_itself_less_at_most_its_managed_fields(before, after, managed,
                                                                      spec):
    obj = {"metadata": {**before, "managedFields": managed, **after}, "spec": spec}
    got = decoded(line_of(obj))
    assert got in (obj, without_managed_fields(obj))
    if not after and all(']' not in json.dumps(e) for e in managed):
        # managedFields last in metadata, no "]" in them: the typed order, cut.
        assert got == without_managed_fields(obj)
