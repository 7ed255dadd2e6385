"""write_through: the store answers with the write until its watch brings it."""

from __future__ import annotations

import pytest

from k8s_http import ConflictError, ObjectKey, Store, write_through

KEY = ObjectKey("ns", "a")


def obj(rv, replicas=1):
    return {"apiVersion": "v1", "kind": "X", "spec": {"replicas": replicas},
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": rv}}


def test_the_store_answers_with_the_write_until_the_watch_brings_it():
    store = Store()
    store.upsert(obj("1"))
    written = write_through(store, lambda: obj("2", replicas=3), base=store.get(KEY))
    assert written["metadata"]["resourceVersion"] == "2"
    assert store.get(KEY)["spec"]["replicas"] == 3
    assert store.resource_version(KEY) == "2"


def test_a_failed_write_is_remembered_as_nothing_and_raises():
    store = Store()
    store.upsert(obj("1"))

    def refused():
        raise ConflictError(409, "taken")
    with pytest.raises(ConflictError):
        write_through(store, refused, base=store.get(KEY))
    assert store.resource_version(KEY) == "1"
    write_through(store, lambda: obj("5"))                # later writes still work
    assert store.resource_version(KEY) == "5"
