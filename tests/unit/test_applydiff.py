"""k8s_http.core.applydiff: would a server-side apply change the object?

Plain objects here; tests/unit/test_controller.py runs the same test over the
Deployment and Service the controller renders, against a fake apiserver's defaults.
"""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http import config_hash, needs_apply, port_key, with_config_hash
from k8s_http.core.applydiff import covers

DESIRED = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "ns", "labels": {"app": "web"},
                 "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Web",
                                      "name": "web", "uid": "u1", "controller": True}]},
    "spec": {
        "replicas": 2,
        "template": {"spec": {"containers": [{
            "name": "app", "image": "nginx:1",
            "ports": [{"containerPort": 80, "protocol": "TCP"}],
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)"}],
            "resources": {"requests": {"cpu": "1000m", "memory": "1024Mi"},
                          "limits": {"cpu": "2"}},
        }]}},
    },
}


def live_copy():
    """DESIRED as the apiserver returns it: defaults added, quantities canonical."""
    live = copy.deepcopy(DESIRED)
    live["metadata"].update(uid="x", resourceVersion="7", generation=1)
    live["metadata"]["labels"]["team"] = "db"                     # another manager's label
    live["spec"]["strategy"] = {"type": "RollingUpdate"}         # a server default
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["resources"]["requests"] = {"cpu": "1", "memory": "1Gi"}
    live["status"] = {"replicas": 2}
    return live


def container(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]


def test_a_missing_object_needs_an_apply():
    assert needs_apply(DESIRED, None) is True


def test_server_defaults_and_canonical_quantities_are_not_drift():
    assert needs_apply(DESIRED, live_copy()) is False


@pytest.mark.parametrize("edit", [
    lambda d: container(d).update(image="evil:1"),
    lambda d: d["spec"].update(replicas=5),
    lambda d: d["metadata"]["labels"].pop("app"),
    lambda d: d["metadata"].pop("ownerReferences"),
    lambda d: d["metadata"]["ownerReferences"][0].update(controller=1),   # not the boolean
    lambda d: container(d)["env"].reverse(),                # order matters: $(A)
    lambda d: container(d)["env"].pop(),
    lambda d: container(d)["resources"]["requests"].update(cpu="2"),
    lambda d: container(d)["resources"]["limits"].pop("cpu"),
    lambda d: container(d)["ports"][0].update(protocol="UDP"),  # another list-map key
    lambda d: d["spec"].update(template="not a map"),
], ids=["image", "replicas", "label", "ownerref", "bool-vs-int", "env-order", "env-removed",
        "quantity", "limit-removed", "port-protocol", "type"])
def test_drift_in_a_field_sent_needs_an_apply(edit):
    live = live_copy()
    edit(live)
    assert needs_apply(DESIRED, live) is True


def test_items_other_managers_added_to_list_maps_are_not_drift():
    live = live_copy()
    pod = live["spec"]["template"]["spec"]
    pod["containers"].insert(0, {"name": "sidecar", "image": "envoy"})
    ours = pod["containers"][1]
    ours["env"].insert(1, {"name": "INJECTED", "value": "x"})   # between A and B: order kept
    ours["ports"].append({"containerPort": 9090})
    live["metadata"]["ownerReferences"].append({"uid": "other", "kind": "ConfigMap"})
    assert needs_apply(DESIRED, live) is False


def test_a_plain_list_must_match_item_for_item():
    desired = {"spec": {"args": ["a", "b"]}}
    assert covers(desired, {"spec": {"args": ["a", "b"]}})
    assert not covers(desired, {"spec": {"args": ["a", "b", "c"]}})
    assert not covers(desired, {"spec": {"args": ["b", "a"]}})


def test_quantities_compare_by_value_only_under_resources():
    assert covers({"resources": {"limits": {"cpu": "500m"}}},
                  {"resources": {"limits": {"cpu": "0.5"}}})
    assert not covers({"data": {"cpu": "500m"}}, {"data": {"cpu": "0.5"}})


def test_port_key_is_the_port_and_its_defaulted_protocol():
    assert port_key({"containerPort": 80}) == port_key({"containerPort": 80, "protocol": "TCP"})
    assert port_key({"port": 80, "targetPort": 8080}) == (80, "TCP")
    assert port_key({"port": 53, "protocol": "UDP"}) != port_key({"port": 53})


def test_the_config_hash_makes_a_field_no_longer_sent_visible():
    ann = "example.com/config-hash"
    before = with_config_hash(copy.deepcopy(DESIRED), ann)
    live = live_copy()
    live["metadata"]["annotations"] = dict(before["metadata"]["annotations"])
    assert needs_apply(before, live) is False
    after = copy.deepcopy(DESIRED)
    container(after)["env"].pop()                     # B no longer sent: desired ⊆ live ...
    assert needs_apply(after, live) is False
    after = with_config_hash(after, ann)              # ... but its hash differs
    assert needs_apply(after, live) is True
    assert config_hash(after, ann) != config_hash(before, ann)
    assert config_hash(with_config_hash(copy.deepcopy(DESIRED), ann), ann) == \
        config_hash(before, ann)                      # the same configuration, the same hash
    assert config_hash(None, ann) is None and config_hash({"metadata": {}}, ann) is None


# ---- covers against its definition, on random objects

class _Str(str):
    """A string that covers() cannot take its fast path for (it tests the exact class)."""


class _Int(int):
    """The same for an integer."""


def _map_leaves(value, change):
    """`value` with every leaf (not a map, not a list) replaced by change(leaf)."""
    if isinstance(value, dict):
        return {k: _map_leaves(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_leaves(v, change) for v in value]
    return change(value)


def _slow_leaf(value):
    if value.__class__ is str:
        return _Str(value)
    if value.__class__ is int:
        return _Int(value)
    return value


def reference_covers(desired, live):
    """covers() with every string and integer field going through its general
    case, one call per value (the rules the fast path must follow)."""
    return covers(_map_leaves(desired, _slow_leaf), live)


_KEYS = st.sampled_from(["name", "image", "resources", "requests", "limits", "cpu",
                         "containers", "ports", "env", "port", "value", "uid"])
_LEAVES = st.one_of(st.sampled_from(["a", "1", "1000m", "1Gi", "1024Mi", ""]),
                    st.integers(-1, 2), st.booleans(), st.just(1.0), st.none())
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(desired=st.dictionaries(_KEYS, _VALUES, max_size=4),
       live=st.dictionaries(_KEYS, _VALUES, max_size=4), data=st.data())
def test_covers_answers_as_its_definition_on_random_objects(desired, live, data):
    def answer(function, want, have):
        # A list-map item that is not a map, or a key that is not hashable, is
        # outside what an apply configuration holds: both fail on it, the same way.
        try:
            return function(want, have)
        except (AttributeError, TypeError) as error:
            return type(error)

    assert answer(covers, desired, live) == answer(reference_covers, desired, live)
    # Against a live object grown from a copy of the desired one, so that
    # "covered" answers are common too.
    grown = copy.deepcopy(desired)
    grown.update(data.draw(st.dictionaries(_KEYS, _VALUES, max_size=2)))
    assert answer(covers, desired, grown) == answer(reference_covers, desired, grown)
    # ... and one where some of the copy's leaves were swapped for others
    # (1 for True, "1" for 1, 1.0 for 1, ...).
    swapped = _map_leaves(desired, lambda leaf: data.draw(_LEAVES) if data.draw(st.booleans())
                          else leaf)
    assert answer(covers, desired, swapped) == answer(reference_covers, desired, swapped)


@pytest.mark.parametrize("want, have, covered", [
    (1, True, False), (True, 1, False), (0, False, False), (True, True, True),
    (1, 1.0, True), ("1", 1, False), (1, "1", False), ("a", "a", True), ("a", None, False),
])
def test_a_field_is_covered_by_an_equal_json_value_and_an_int_never_by_a_bool(want, have,
                                                                              covered):
    assert covers({"spec": {"field": want}}, {"spec": {"field": have}}) is covered
    assert reference_covers({"spec": {"field": want}}, {"spec": {"field": have}}) is covered
