"""DeletionWatches against the fake apiserver: one narrow watch per name, one notice."""

from __future__ import annotations

import threading

import pytest

from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.control.deletionwatch import DeletionWatches
from k8s_http.core.objects import DEPLOYMENTS, ObjectKey
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(60)

NS = "default"
SQUATTER = ObjectKey(NS, "taken")
OWNER = ObjectKey(NS, "my-taken")


def deployment(name):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS}, "spec": {"replicas": 1}}


class Notices:
    def __init__(self):
        self.keys: list[ObjectKey] = []
        self.lock = threading.Lock()

    def __call__(self, key):
        with self.lock:
            self.keys.append(key)


@pytest.fixture
def server():
    with FakeApiServer() as server:
        server.create_object(DEPLOYMENTS.path(NS), deployment("taken"))
        server.create_object(DEPLOYMENTS.path(NS), deployment("bystander"))
        yield server


@pytest.fixture
def client(server):
    client = ApiClient.from_config(ClusterConfig(server=server.url))
    yield client
    client.transport.close()


def test_the_owner_is_told_once_when_the_name_is_deleted(server, client):
    notices = Notices()
    watches = DeletionWatches(client, notices)
    try:
        assert watches.watch(DEPLOYMENTS, SQUATTER, OWNER)
        assert watches.watch(DEPLOYMENTS, SQUATTER, OWNER)          # idempotent
        eventually(lambda: server.active_watches == 1)
        # only that name is asked for: nothing of the rest of the namespace
        asked = [r for r in server.requests if r.path.endswith("/deployments")]
        assert asked and all(r.query.get("fieldSelector") == "metadata.name=taken"
                             for r in asked)
        other = server.get_object(DEPLOYMENTS.path(NS, "bystander"))
        server.update_object(DEPLOYMENTS.path(NS), {**other, "spec": {"replicas": 2}})
        squatter = server.get_object(DEPLOYMENTS.path(NS, "taken"))
        server.update_object(DEPLOYMENTS.path(NS), {**squatter, "spec": {"replicas": 3}})
        server.delete_object(DEPLOYMENTS.path(NS, "taken"))
        eventually(lambda: notices.keys == [OWNER], message="no notice of the deletion")
        eventually(lambda: len(watches) == 0 and server.active_watches == 0,
                   message="the watch outlived its notice")
    finally:
        watches.stop()
    assert notices.keys == [OWNER]


def test_a_name_already_gone_is_reported_at_once(server, client):
    notices = Notices()
    watches = DeletionWatches(client, notices)
    try:
        watches.watch(DEPLOYMENTS, ObjectKey(NS, "never-was"), OWNER)
        eventually(lambda: notices.keys == [OWNER])
    finally:
        watches.stop()


def test_cancel_and_the_limit(server, client):
    notices = Notices()
    watches = DeletionWatches(client, notices, max_watches=1)
    try:
        assert watches.watch(DEPLOYMENTS, SQUATTER, OWNER)
        assert not watches.watch(DEPLOYMENTS, ObjectKey(NS, "bystander"), ObjectKey(NS, "x"))
        eventually(lambda: server.active_watches == 1)
        watches.cancel(OWNER)
        eventually(lambda: server.active_watches == 0)
        server.delete_object(DEPLOYMENTS.path(NS, "taken"))
        assert len(watches) == 0 and notices.keys == []
    finally:
        watches.stop()
    assert not watches.watch(DEPLOYMENTS, SQUATTER, OWNER)           # stopped: refused
