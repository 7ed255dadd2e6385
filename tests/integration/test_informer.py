"""Informer against the fake apiserver: real sockets, scripted faults.

Each test owns its server. What the informer did on the wire is asserted from
the server's request log (a re-watch must not relist, a relist after 410 must
carry the last RV, ...).
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from k8s_http.core.backoff import Backoff
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import CONFIGMAPS, DEPLOYMENTS, ObjectKey
from k8s_http.cache.informer import Informer, own_key, owner_key
from tests.support.fake_apiserver import (FakeApiServer, chunk, http_head, raw, status,
                                          status_body, watch_line)
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(60)

NS = "default"
PATH = DEPLOYMENTS.path(NS)
RESOURCE = str(DEPLOYMENTS)


class Recorder:
    """A queue stand-in that remembers every key it was given."""

    def __init__(self):
        self.keys: list[ObjectKey] = []
        self._lock = threading.Lock()

    def add(self, key):
        with self._lock:
            self.keys.append(key)

    def count(self, key):
        with self._lock:
            return self.keys.count(key)

    def clear(self):
        with self._lock:
            self.keys.clear()


def deployment(name, ns=NS, **extra):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"replicas": 1}, **extra}


def is_watch(req):
    return req.method == "GET" and req.query.get("watch") in ("1", "true")


def is_list(req):
    return req.method == "GET" and not is_watch(req) and req.path.endswith("/deployments")


def lists(server):
    return [r for r in server.requests if is_list(r)]


def watches(server):
    return [r for r in server.requests if is_watch(r)]


def fast_backoff():
    return Backoff(initial_seconds=0.01, max_seconds=0.05)


@contextlib.contextmanager
def running(server, *, namespaces=(NS,), mapper=own_key, **kwargs):
    """An informer on `server`, started, with a Recorder handler; stopped on exit."""
    metrics = Metrics(CollectorRegistry())
    client = ApiClient.from_config(ClusterConfig(server=server.url))
    kwargs.setdefault("backoff_factory", fast_backoff)
    # This file tests the paged list + watch (an apiserver without streaming
    # lists); test_streaming_list.py tests the streaming list.
    kwargs.setdefault("streaming_list", False)
    informer = Informer(client, DEPLOYMENTS,
                        namespaces=list(namespaces) if namespaces is not None else None,
                        metrics=metrics, **kwargs)
    recorder = Recorder()
    informer.add_handler(mapper, recorder)
    informer.start()
    try:
        yield informer, recorder, metrics
    finally:
        informer.stop()
        client.transport.close()


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, {"resource": RESOURCE, **labels}) or 0


def rv_of(store, name, ns=NS):
    obj = store.get(ObjectKey(ns, name))
    return obj and obj["metadata"]["resourceVersion"]


def synced(informer):
    eventually(informer.has_synced, message="informer never synced")


# ---------------------------------------------------------------------------


def test_sync_then_follow_creates_updates_deletes():
    with FakeApiServer() as server:
        for name in ("a", "b"):
            server.create_object(PATH, deployment(name))
        with running(server) as (informer, rec, metrics):
            synced(informer)
            assert sorted(k.name for k in informer.store.keys()) == ["a", "b"]
            assert {k.name for k in rec.keys} == {"a", "b"}
            # The cache drops managedFields.
            assert "managedFields" not in informer.store.get(ObjectKey(NS, "a"))["metadata"]

            # Wire: a consistent first list, then a watch from its RV with bookmarks.
            (first_list,) = lists(server)
            assert not first_list.query.get("resourceVersion")
            watch = eventually(lambda: watches(server))[0]
            assert watch.query["resourceVersion"] == server.resource_version
            assert watch.query["allowWatchBookmarks"] == "true"
            assert 300 <= int(watch.query["timeoutSeconds"]) <= 600

            created = server.create_object(PATH, deployment("c"))
            eventually(lambda: rv_of(informer.store, "c") == created["metadata"]["resourceVersion"])
            updated = dict(created, spec={"replicas": 3})
            updated = server.update_object(PATH, updated)
            eventually(lambda: rv_of(informer.store, "c") == updated["metadata"]["resourceVersion"])
            server.delete_object(DEPLOYMENTS.path(NS, "a"))
            eventually(lambda: ObjectKey(NS, "a") not in informer.store)
            eventually(lambda: rec.count(ObjectKey(NS, "a")) == 2)   # listed, then deleted
            assert rec.count(ObjectKey(NS, "c")) == 2                 # added, modified
            assert sample(metrics, "k8s_http_watch_events_total", type="ADDED") == 1
            assert sample(metrics, "k8s_http_watch_events_total", type="DELETED") == 1
            assert sample(metrics, "k8s_http_cache_objects") == 2
            assert informer.watchers[0].resource_version == server.resource_version
            assert len(lists(server)) == 1
            ok, detail = informer.is_healthy(now=time.monotonic())
            assert ok, detail


def test_clean_end_rewatches_at_once_without_relisting():
    with FakeApiServer() as server:
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            server.create_object(PATH, deployment("a"))
            eventually(lambda: ObjectKey(NS, "a") in informer.store)
            server.end_watches()
            eventually(lambda: len(watches(server)) == 2 and server.active_watches == 1)
            assert watches(server)[1].query["resourceVersion"] == rv_of(informer.store, "a")
            assert len(lists(server)) == 1
            assert sample(metrics, "k8s_http_watch_restarts_total", reason="timeout") == 1


def test_dropped_watch_resumes_from_last_rv_without_relisting():
    with FakeApiServer() as server:
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            a = server.create_object(PATH, deployment("a"))
            eventually(lambda: ObjectKey(NS, "a") in informer.store)
            server.drop_watches()                       # no last chunk: a broken stream
            eventually(lambda: len(watches(server)) == 2)
            b = server.create_object(PATH, deployment("b"))
            eventually(lambda: ObjectKey(NS, "b") in informer.store)
            assert watches(server)[1].query["resourceVersion"] == a["metadata"]["resourceVersion"]
            assert len(lists(server)) == 1, "a dropped watch must not relist"
            assert rec.count(ObjectKey(NS, "a")) == 1 and rec.count(ObjectKey(NS, "b")) == 1
            assert sample(metrics, "k8s_http_watch_restarts_total", reason="disconnect") == 1
            assert rv_of(informer.store, "b") == b["metadata"]["resourceVersion"]


def test_gone_mid_stream_relists_from_last_rv_and_delivers_vanished_as_deletes():
    with FakeApiServer() as server:
        for name in ("a", "b"):
            server.create_object(PATH, deployment(name))
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            last_rv = informer.watchers[0].resource_version
            # While the watcher is away relisting, "b" is deleted: the watch never
            # carries that DELETED, so only the relist can reveal it.
            rule = server.script(
                lambda ex: (server.delete_object(DEPLOYMENTS.path(NS, "b")), False)[1],
                match=is_list, times=1)
            rec.clear()
            server.inject_watch_event({"type": "ERROR", "object": status_body(
                410, "Expired", "too old resource version: 1 (5)")})
            eventually(lambda: ObjectKey(NS, "b") not in informer.store)
            assert rule.hits == 1
            relist = lists(server)[1]
            assert relist.query.get("resourceVersion") == last_rv
            # Unpaged: with no `limit`, RV=X means "not older than X" (with a limit it
            # would mean "exactly X"), served from the apiserver's watch cache.
            assert "limit" not in relist.query and "continue" not in relist.query
            assert lists(server)[0].query.get("limit") == "500"
            # The vanished object reached the handler (as a DELETED), "a" was re-delivered.
            eventually(lambda: rec.count(ObjectKey(NS, "b")) == 1)
            assert rec.count(ObjectKey(NS, "a")) == 1
            assert sample(metrics, "k8s_http_watch_restarts_total", reason="gone") == 1
            assert sample(metrics, "k8s_http_informer_relists_total") == 2
            # And it watches on from the relist.
            eventually(lambda: len(watches(server)) == 2)
            server.create_object(PATH, deployment("c"))
            eventually(lambda: ObjectKey(NS, "c") in informer.store)


def test_gone_on_the_relist_relists_with_empty_rv():
    with FakeApiServer() as server:
        server.create_object(PATH, deployment("a"))
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            server.script(status(410, "Expired", "too old resource version"),
                          match=lambda r: is_list(r) and r.query.get("resourceVersion"), times=1)
            # History moves on elsewhere and is compacted past our RV: the re-watch
            # gets an ERROR 410, the relist from our RV a 410 too (scripted).
            server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "elsewhere"}})
            server.compact()
            server.drop_watches()
            eventually(lambda: len(lists(server)) == 3)
            first, from_rv, consistent = lists(server)
            assert not first.query.get("resourceVersion")
            assert from_rv.query.get("resourceVersion")
            assert not consistent.query.get("resourceVersion")
            eventually(lambda: server.active_watches == 1)
            server.create_object(PATH, deployment("b"))
            eventually(lambda: ObjectKey(NS, "b") in informer.store)
            assert ObjectKey(NS, "a") in informer.store


def test_stall_reconnects_without_relisting():
    with FakeApiServer() as server:
        with running(server, stall_timeout_seconds=0.5) as (informer, rec, metrics):
            rv = eventually(lambda: watches(server))[0].query["resourceVersion"]
            assert rv == informer.watchers[0].resource_version == server.resource_version
            # A quiet watch with no bookmarks: no complete event for 0.5 s -> reopened.
            eventually(lambda: len(watches(server)) >= 2, timeout=10)
            assert all(w.query["resourceVersion"] == rv for w in watches(server))
            assert len(lists(server)) == 1
            assert sample(metrics, "k8s_http_watch_restarts_total", reason="stall") >= 1


def test_bookmarks_move_the_rv_and_enqueue_nothing():
    with FakeApiServer() as server:
        server.create_object(PATH, deployment("a"))
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            rec.clear()
            # The RV moves on elsewhere (another collection); this watch only hears bookmarks.
            for i in range(3):
                server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": f"cm{i}"}})
            before = informer.watchers[0].last_progress
            server.bookmark()
            eventually(lambda: informer.watchers[0].resource_version == server.resource_version)
            assert informer.watchers[0].last_progress > before
            assert rec.keys == []
            assert len(informer.store) == 1
            assert sample(metrics, "k8s_http_watch_events_total", type="BOOKMARK") == 1
            server.drop_watches()
            eventually(lambda: len(watches(server)) == 2)
            assert watches(server)[1].query["resourceVersion"] == server.resource_version


def test_forbidden_backs_off_and_keeps_trying_until_allowed():
    with FakeApiServer() as server:
        server.create_object(PATH, deployment("a"))
        denied = server.script(status(403, "Forbidden", 'deployments.apps is forbidden: User '
                                      '"x" cannot list resource "deployments"'),
                               match=is_list, times=2)
        denied_watch = server.script(status(403, "Forbidden", "cannot watch"), match=is_watch,
                                     times=1)
        with running(server) as (informer, rec, metrics):
            assert not informer.has_synced() or denied.hits == 2
            synced(informer)
            assert denied.hits == 2 and len(lists(server)) == 3
            # Retrying failures keep the loop alive for liveness (a restart cures no 403).
            assert informer.watchers[0].last_retry > float("-inf")
            eventually(lambda: denied_watch.hits == 1 and server.active_watches == 1)
            assert len(watches(server)) == 2
            assert sample(metrics, "k8s_http_watch_restarts_total", reason="error") == 1
            assert rec.count(ObjectKey(NS, "a")) == 1


def test_malformed_line_reconnects_without_advancing_the_rv():
    with FakeApiServer() as server:
        server.create_object(PATH, deployment("a"))
        list_rv = server.resource_version
        bogus = {"metadata": {"name": "ghost", "namespace": NS, "resourceVersion": ""}}
        server.script(raw(http_head(200, chunked=True),
                          chunk(watch_line("ADDED", bogus)),      # no RV: skipped
                          chunk(b'{"type": "ADDED", "object": \n')),  # not JSON: abandon
                      match=is_watch, times=1)
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: len(watches(server)) == 2)
            assert [w.query["resourceVersion"] for w in watches(server)] == [list_rv, list_rv]
            assert ObjectKey(NS, "ghost") not in informer.store
            assert sample(metrics, "k8s_http_watch_restarts_total", reason="protocol") == 1
            assert metrics.registry.get_sample_value(
                "k8s_http_watch_decode_errors_total",
                {"resource": RESOURCE, "kind": "no_resource_version"}) == 1
            assert len(lists(server)) == 1
            # And it keeps working.
            server.create_object(PATH, deployment("b"))
            eventually(lambda: ObjectKey(NS, "b") in informer.store)


def test_one_watcher_per_namespace_sharing_one_store():
    with FakeApiServer() as server:
        server.create_object(DEPLOYMENTS.path("ns1"), deployment("a", "ns1"))
        server.create_object(DEPLOYMENTS.path("ns2"), deployment("b", "ns2"))
        server.create_object(DEPLOYMENTS.path("ns3"), deployment("c", "ns3"))
        with running(server, namespaces=["ns1", "ns2", "ns1"]) as (informer, rec, metrics):
            synced(informer)
            names = {t.name for t in threading.enumerate()}
            assert {"informer-deployments.apps-ns1", "informer-deployments.apps-ns2"} <= names
            assert sorted(str(k) for k in informer.store.keys()) == ["ns1/a", "ns2/b"]
            # A relist of ns1 (after a 410) must not wipe ns2 from the shared store.
            eventually(lambda: server.active_watches == 2)
            server.inject_watch_event({"type": "ERROR", "object": status_body(410, "Expired")})
            eventually(lambda: sample(metrics, "k8s_http_informer_relists_total") == 4)
            eventually(lambda: len(watches(server)) == 4)
            assert sorted(str(k) for k in informer.store.keys()) == ["ns1/a", "ns2/b"]


def test_all_namespaces_and_owner_mapping():
    owner = {"apiVersion": "mine.jp/v1", "kind": "My", "name": "foobar", "uid": "u-1",
             "controller": True, "blockOwnerDeletion": True}
    with FakeApiServer() as server:
        child = deployment("foobar", "x")
        child["metadata"]["ownerReferences"] = [owner]
        server.create_object(DEPLOYMENTS.path("x"), child)
        server.create_object(DEPLOYMENTS.path("y"), deployment("orphan", "y"))
        with running(server, namespaces=None, mapper=owner_key("My", "mine.jp")) \
                as (informer, rec, metrics):
            synced(informer)
            assert (lists(server)[0].path == DEPLOYMENTS.path())
            assert rec.keys == [ObjectKey("x", "foobar")]
            assert [o["metadata"]["name"] for o in informer.store.list()] == ["foobar", "orphan"]
            assert any(t.name == "informer-deployments.apps-all" for t in threading.enumerate())


def test_health_and_restart_of_a_dead_watcher_thread():
    with FakeApiServer() as server:
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            now = time.monotonic()
            assert informer.is_healthy(now=now)[0]
            limit = 2 * informer.watchers[0].watch_timeout_seconds
            ok, detail = informer.is_healthy(now=now + limit + 1)
            assert not ok and "stuck" in detail
            # Kill the thread the hard way: make the loop itself crash once, on its
            # first read of the second watch. The thread may not have reached its
            # first read yet, so the crash is keyed to the server having seen the
            # second watch, not to when it is armed.
            watcher = informer.watchers[0]
            original = watcher._read

            def boom():
                if len(watches(server)) < 2:
                    return original()
                watcher._read = original
                raise RuntimeError("bug in the loop")
            watcher._read = boom
            server.end_watches()      # wakes the loop: Closed -> Watch -> _read -> boom
            eventually(lambda: not informer.is_healthy(now=time.monotonic())[0])
            assert "dead" in informer.is_healthy(now=time.monotonic())[1]
            assert informer.restart_if_dead() == 1
            eventually(lambda: informer.is_healthy(now=time.monotonic())[0])
            # It resumed watching (initial watch, the one open when it crashed, the
            # resumed one); it did not relist.
            eventually(lambda: len(watches(server)) == 3)
            assert len(lists(server)) == 1
            server.create_object(PATH, deployment("z"))
            eventually(lambda: ObjectKey(NS, "z") in informer.store)


def test_stop_is_prompt_even_with_a_quiet_watch_open():
    with FakeApiServer() as server:
        with running(server) as (informer, rec, metrics):
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            started = time.monotonic()
        assert time.monotonic() - started < 3
        assert not any(t.name.startswith("informer-") and t.is_alive()
                       for t in threading.enumerate())


def test_a_burst_of_10000_events_on_one_object_is_reconciled_a_handful_of_times():
    from k8s_http.control.runner import Runner
    from k8s_http.control.workqueue import WorkQueue

    with FakeApiServer() as server:
        obj = server.create_object(PATH, deployment("hot"))
        metrics = Metrics(CollectorRegistry())
        client = ApiClient.from_config(ClusterConfig(server=server.url))
        informer = Informer(client, DEPLOYMENTS, namespaces=[NS], metrics=metrics,
                            backoff_factory=fast_backoff, streaming_list=False)
        queue = WorkQueue("burst", metrics=metrics)
        informer.add_handler(own_key, queue)
        seen: list[str] = []

        def reconcile(key):
            seen.append(rv_of(informer.store, key.name))
            time.sleep(0.2)           # a slow reconcile (talking to the apiserver)

        runner = Runner("burst", queue, reconcile, workers=2, metrics=metrics,
                        can_start=informer.has_synced)
        informer.start()
        runner.start()
        try:
            synced(informer)
            for i in range(10_000):
                obj["spec"]["replicas"] = i
                obj = server.update_object(PATH, obj)
            final = obj["metadata"]["resourceVersion"]
            eventually(lambda: rv_of(informer.store, "hot") == final, timeout=30)
            eventually(lambda: seen and seen[-1] == final and len(queue) == 0, timeout=10)
            assert runner.wait_idle(5)
            assert sample(metrics, "k8s_http_watch_events_total", type="MODIFIED") == 10_000
            # The queue holds the key once however many events arrive: a handful of
            # reconciles (at most one per 200 ms of burst), not 10,000.
            assert 1 <= len(seen) <= 50, len(seen)
            assert len(lists(server)) == 1
        finally:
            runner.stop()
            queue.shutdown(drain=False)
            informer.stop()
            client.transport.close()


def test_sync_listeners_hear_once_every_watcher_has_listed_and_delivered():
    with FakeApiServer() as server:
        server.create_object(DEPLOYMENTS.path("ns1"), deployment("a", "ns1"))
        server.create_object(DEPLOYMENTS.path("ns2"), deployment("b", "ns2"))
        client = ApiClient.from_config(ClusterConfig(server=server.url))
        informer = Informer(client, DEPLOYMENTS, namespaces=["ns1", "ns2"],
                            metrics=Metrics(CollectorRegistry()), backoff_factory=fast_backoff,
                            streaming_list=False)
        rec = Recorder()
        informer.add_handler(own_key, rec)
        heard = []
        informer.add_sync_listener(
            lambda: heard.append((informer.has_synced(), sorted(str(k) for k in rec.keys))))
        informer.start()
        try:
            synced(informer)
            eventually(lambda: heard)
            # Once, after both namespaces' lists, with their keys already handed out.
            assert heard == [(True, ["ns1/a", "ns2/b"])]
            eventually(lambda: server.active_watches == 2)
            server.inject_watch_event({"type": "ERROR", "object": status_body(410, "Expired")})
            eventually(lambda: len(heard) >= 2, message="a relist was not heard")
            assert all(synced_ for synced_, _ in heard)
        finally:
            informer.stop()
            client.transport.close()


def test_listed_keys_wait_behind_the_watch_at_start_up_and_after_a_relist():
    from k8s_http.control.workqueue import WorkQueue

    with FakeApiServer() as server:
        for i in range(5):
            server.create_object(PATH, deployment(f"d{i}"))
        client = ApiClient.from_config(ClusterConfig(server=server.url))
        informer = Informer(client, DEPLOYMENTS, namespaces=[NS],
                            metrics=Metrics(CollectorRegistry()), backoff_factory=fast_backoff,
                            streaming_list=False)
        queue = WorkQueue("q")
        informer.add_handler(own_key, queue)
        informer.start()

        def taken():
            keys = []
            while (key := queue.get(0)[0]) is not None:
                keys.append(key.name)
                queue.done(key)
            return keys

        try:
            synced(informer)
            eventually(lambda: server.active_watches == 1)
            server.create_object(PATH, deployment("new"))       # created right after start
            eventually(lambda: len(queue) == 6)
            assert taken() == ["new", "d0", "d1", "d2", "d3", "d4"]
            # A relist after 410 finds everything as the cache holds it: all low.
            server.inject_watch_event({"type": "ERROR", "object": status_body(410, "Expired")})
            eventually(lambda: len(lists(server)) == 2 and len(queue) == 6)
            eventually(lambda: server.active_watches == 1)
            server.create_object(PATH, deployment("newer"))
            eventually(lambda: len(queue) == 7)
            assert taken() == ["newer", "d0", "d1", "d2", "d3", "d4", "new"]
        finally:
            queue.shutdown(drain=False)
            informer.stop()
            client.transport.close()
