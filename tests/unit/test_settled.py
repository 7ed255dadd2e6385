"""SettledVersions: the skip holds while the caches show the versions settled with."""

from __future__ import annotations

from k8s_http import DEPLOYMENTS, SERVICES, ObjectKey, SettledVersions, Store

KEY = ObjectKey("ns", "a")


def obj(kind, rv, name="a"):
    return {"apiVersion": "v1", "kind": kind,
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def stores():
    parents, children = Store(), Store()
    parents.upsert(obj("Parent", "1"))
    return {DEPLOYMENTS: parents, SERVICES: children}


def test_nothing_is_settled_at_first():
    assert not SettledVersions(stores(), (DEPLOYMENTS, SERVICES)).unchanged(KEY)


def test_unchanged_while_the_caches_show_the_versions_settled_with():
    caches = stores()
    settled = SettledVersions(caches, (DEPLOYMENTS, SERVICES))
    settled.settle(KEY, obj("Parent", "1"), None)          # the child is missing
    assert settled.unchanged(KEY) and KEY in settled
    assert not settled.unchanged(ObjectKey("ns", "b"))
    caches[SERVICES].upsert(obj("Child", "7"))             # the child appears
    assert not settled.unchanged(KEY)
    settled.settle(KEY, obj("Parent", "1"), obj("Child", "7"))
    assert settled.unchanged(KEY)
    caches[DEPLOYMENTS].upsert(obj("Parent", "2"))         # a new version of the parent
    assert not settled.unchanged(KEY)


def test_the_order_of_the_objects_is_the_order_of_the_resources():
    caches = stores()
    caches[SERVICES].upsert(obj("Child", "7"))
    settled = SettledVersions(caches, (DEPLOYMENTS, SERVICES))
    settled.settle(KEY, obj("Child", "7"), obj("Parent", "1"))
    assert not settled.unchanged(KEY)


def test_stores_are_looked_up_at_each_call():
    caches = stores()
    settled = SettledVersions(caches, (DEPLOYMENTS, SERVICES))
    settled.settle(KEY, obj("Parent", "1"), None)
    caches[DEPLOYMENTS] = Store()                           # a new, empty cache
    assert not settled.unchanged(KEY)


def test_forget():
    settled = SettledVersions(stores(), (DEPLOYMENTS, SERVICES))
    settled.settle(KEY, obj("Parent", "1"), None)
    settled.forget(KEY)
    settled.forget(KEY)
    assert not settled.unchanged(KEY) and KEY not in settled
