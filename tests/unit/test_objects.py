"""k8s_http.core.objects: metadata helpers and ownerReferences on plain-dict objects."""

import pytest

from k8s_http import (DEPLOYMENTS, Resource, controller_of, is_controlled_by, key_of, meta_of,
                      owner_reference, resource_version_of)
from k8s_http.core.objects import is_older_version


@pytest.mark.parametrize("obj", [None, {}, {"metadata": None}, {"metadata": "x"}, "not a dict"])
def test_meta_of_a_missing_or_broken_object_is_empty(obj):
    assert meta_of(obj) == {}
    assert resource_version_of(obj) is None


def test_resource_version_is_a_string_or_none():
    assert resource_version_of({"metadata": {"resourceVersion": "12"}}) == "12"
    assert resource_version_of({"metadata": {"resourceVersion": 12}}) is None
    assert meta_of({"metadata": {"name": "a"}}) == {"name": "a"}


WEB = Resource("example.com", "v1", "webs", kind="Web")


def test_owner_reference_from_the_object():
    owner = {"apiVersion": "example.com/v1", "kind": "Web",
             "metadata": {"name": "w", "uid": "u1", "namespace": "ns"}}
    ref = owner_reference(owner)
    assert ref == {"apiVersion": "example.com/v1", "kind": "Web", "name": "w", "uid": "u1",
                   "controller": True, "blockOwnerDeletion": True}
    child = {"metadata": {"ownerReferences": [ref]}}
    assert controller_of(child) == ref and is_controlled_by(child, owner)


def test_owner_reference_of_a_cached_object_without_kind_names_the_resource():
    # Items of a list of a built-in type carry no apiVersion / kind.
    cached = {"metadata": {"name": "d", "uid": "u2"}}
    with pytest.raises(KeyError):
        owner_reference(cached)
    assert owner_reference(cached, resource=DEPLOYMENTS, controller=False) == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u2",
        "controller": False, "blockOwnerDeletion": True}
    assert owner_reference(cached, resource=WEB)["apiVersion"] == "example.com/v1"


def test_key_of():
    assert str(key_of({"metadata": {"namespace": "ns", "name": "a"}})) == "ns/a"
    assert str(key_of({"metadata": {"name": "node-1"}})) == "node-1"


def test_resource_versions_compare_as_the_apiserver_writes_them_and_nothing_else():
    """KEP-5504 (GA in 1.35): versions of one resource compare as integers."""
    assert is_older_version("9", "10") and is_older_version("123", "124")
    assert not is_older_version("10", "9") and not is_older_version("7", "7")
    # Not what an apiserver writes: not comparable, so never "older".
    for odd in (None, "", "0", "012", "12a", "١٢", 12):
        assert not is_older_version(odd, "99") and not is_older_version("5", odd)
