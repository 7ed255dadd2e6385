"""The Manager end to end against the fake apiserver: wiring, probes, metrics, graceful stop."""

import http.client
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry

from k8s_http import CONFIGMAPS, LEASES, SERVICES, Manager, ObjectKey, Projection, Result
from k8s_http.control.manager import GIL_SWITCH_SECONDS
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import eventually

NS = "default"


def _get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


@pytest.fixture
def server():
    with FakeApiServer() as srv:
        yield srv


def _manager(server, **kwargs):
    kwargs.setdefault("graceful_shutdown_timeout_seconds", 5.0)
    return Manager(server.config(), "test", metrics_bind_address="127.0.0.1:0",
                   health_probe_bind_address="127.0.0.1:0", registry=CollectorRegistry(),
                   **kwargs)


def _owned_service(name, owner_name, owner_uid):
    return {"metadata": {"name": name, "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": owner_uid,
         "controller": True}]}, "spec": {}}


def test_reconciles_primary_and_owned_changes_and_serves_probes(server):
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "a"}, "data": {}})
    seen = []
    mgr = _manager(server)

    def reconcile(key):
        cached = mgr.store(CONFIGMAPS).get(key)
        seen.append((key, cached is not None))
        return None

    mgr.add_controller(CONFIGMAPS, reconcile, owns=[SERVICES], workers=2)
    default_switch = sys.getswitchinterval()
    mgr.start()
    try:
        # A worker's request waits for the GIL at most 1 ms behind a list's decoding.
        assert sys.getswitchinterval() == GIL_SWITCH_SECONDS == 0.001
        port = mgr.server_ports[0]
        eventually(lambda: _get(port, "/readyz")[0] == 200, message="readyz never turned 200")
        eventually(lambda: (ObjectKey(NS, "a"), True) in seen)
        status, body = _get(port, "/readyz?verbose")
        assert status == 200 and "[+]shutdown ok" in body and "[+]informer-configmaps" in body
        assert _get(port, "/healthz")[0] == 200

        # An owned object maps to its controlling owner's key.
        uid = server.get_object(CONFIGMAPS.path(NS, "a"))["metadata"]["uid"]
        seen.clear()
        server.create_object(SERVICES.path(NS), _owned_service("svc", "a", uid))
        eventually(lambda: (ObjectKey(NS, "a"), True) in seen)

        status, metrics = _get(port, "/metrics")
        assert status == 200
        assert 'controller_runtime_reconcile_total{controller="configmap",result="success"}' in metrics
        assert "workqueue_adds_total" in metrics and "rest_client_requests_total" in metrics
        assert "_created" not in metrics      # controller-runtime exports no _created series
    finally:
        assert mgr.stop() == 0
        sys.setswitchinterval(default_switch)
    assert mgr.stop() == 0          # idempotent


def test_stop_turns_readyz_503_at_once_and_drains_in_flight_reconciles(server):
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "slow"}, "data": {}})
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    mgr = _manager(server)

    def reconcile(key):
        started.set()
        release.wait(10)
        finished.set()
        return Result()

    mgr.add_controller(CONFIGMAPS, reconcile, workers=1)
    mgr.start()
    port = mgr.server_ports[0]
    assert started.wait(10), "the reconcile never started"
    codes = []
    stopper = threading.Thread(target=lambda: codes.append(mgr.stop()))
    stopper.start()
    # While the reconcile is still in flight, readiness is already withdrawn.
    eventually(lambda: _get(port, "/readyz")[0] == 503)
    assert not finished.is_set()
    release.set()
    stopper.join(10)
    assert finished.is_set() and codes == [0]


def test_graceful_timeout_exceeded_gives_a_non_zero_exit_code(server):
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "stuck"}, "data": {}})
    started, release = threading.Event(), threading.Event()
    mgr = _manager(server, graceful_shutdown_timeout_seconds=0.5)

    def reconcile(key):
        started.set()
        release.wait(10)

    mgr.add_controller(CONFIGMAPS, reconcile, workers=1)
    mgr.start()
    try:
        assert started.wait(10)
        assert mgr.stop() == 1
    finally:
        release.set()


def _leader_lease_writes_on_stop(server, *, stuck: bool):
    """Stop a leader whose one reconcile is `stuck` past the graceful timeout
    (or returns at once): its exit code, the Lease afterwards, the Lease
    writes stop() made, and its identity."""
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "cm"}, "data": {}})
    started, release = threading.Event(), threading.Event()
    mgr = _manager(server, graceful_shutdown_timeout_seconds=0.5, leader_elect=True,
                   leader_election_namespace=NS)

    def reconcile(key):
        started.set()
        if stuck:
            release.wait(30)

    mgr.add_controller(CONFIGMAPS, reconcile, workers=1)
    mgr.start()
    try:
        assert started.wait(10), "the reconcile never started (no lease?)"
        lease_path = LEASES.path(NS, "test")
        server.clear_requests()
        code = mgr.stop()
        writes = [r.json()["spec"] for r in server.requests_for("PUT", lease_path)]
        for thread in mgr._threads:
            thread.join(10)
        assert not any(t.is_alive() for t in mgr._threads), "the elector still runs"
        return code, server.get_object(lease_path)["spec"], writes, mgr._elector.identity
    finally:
        release.set()


def test_a_leader_stopped_with_a_reconcile_still_running_leaves_its_lease_to_expire(server):
    """The stuck reconcile may still write: handing the Lease back would let the
    next leader start beside it. Nothing is written; the Lease expires."""
    code, spec, writes, me = _leader_lease_writes_on_stop(server, stuck=True)
    assert code == 1
    assert spec["holderIdentity"] == me
    assert all(w["holderIdentity"] == me for w in writes), writes


def test_a_leader_stopped_idle_hands_its_lease_back(server):
    code, spec, writes, me = _leader_lease_writes_on_stop(server, stuck=False)
    assert code == 0
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert writes[-1]["holderIdentity"] == ""


def test_resync_re_enqueues_every_primary_key(server):
    for name in ("x", "y"):
        server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": name}, "data": {}})
    counts = {}
    mgr = _manager(server)

    def reconcile(key):
        counts[key.name] = counts.get(key.name, 0) + 1

    mgr.add_controller(CONFIGMAPS, reconcile, workers=1)
    mgr.start()
    try:
        eventually(lambda: counts.get("x") == 1 and counts.get("y") == 1)
        mgr.resync()
        eventually(lambda: counts.get("x") == 2 and counts.get("y") == 2)
    finally:
        mgr.stop()


def test_a_resync_waits_behind_the_keys_of_watch_events(server):
    for name in ("x", "y"):
        server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": name}, "data": {}})
    order, busy, release = [], threading.Event(), threading.Event()
    mgr = _manager(server)

    def reconcile(key):
        order.append(key.name)
        if key.name == "busy" and not release.is_set():
            busy.set()
            release.wait(10)

    mgr.add_controller(CONFIGMAPS, reconcile, workers=1)
    mgr.start()
    try:
        eventually(lambda: sorted(order) == ["x", "y"])
        server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "busy"}, "data": {}})
        assert busy.wait(10)                    # the one worker is held
        mgr.resync()                            # x, y low; busy too, once it is done
        server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "new"}, "data": {}})
        queue = mgr._controllers[0].queue
        eventually(lambda: len(queue) == 3)     # x, y and the new one's event
        release.set()
        eventually(lambda: len(order) == 7)
        assert order[3:] == ["new", "x", "y", "busy"]
    finally:
        release.set()
        mgr.stop()


def test_a_dead_worker_thread_is_restarted_by_the_supervisor(server):
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "k"}, "data": {}})
    calls = []
    mgr = _manager(server)

    def reconcile(key):
        calls.append(key)
        if len(calls) == 1:
            raise SystemExit("kills the worker thread, not the process")

    mgr.add_controller(CONFIGMAPS, reconcile, workers=1)
    mgr.start()
    try:
        # The key is retried on a restarted worker.
        eventually(lambda: len(calls) >= 2, timeout=15)
        assert _get(mgr.server_ports[0], "/healthz")[0] == 200
    finally:
        mgr.stop()


def test_events_are_posted_from_their_own_thread_and_flushed_on_stop(server):
    from k8s_http.core.objects import EVENTS
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "a"}, "data": {}})
    mgr = _manager(server)
    recorder = mgr.event_recorder()
    posted_from = []

    def reconcile(key):
        obj = mgr.store(CONFIGMAPS).get(key)
        for reason in ("Created", "Updated", "Deleted"):
            recorder.event(obj, "Normal", reason, f"{reason} {key.name}")
        posted_from.append(threading.current_thread().name)
        return None

    mgr.add_controller(CONFIGMAPS, reconcile, workers=1)
    mgr.start()
    eventually(lambda: posted_from)
    assert mgr.stop() == 0
    # Whatever the sender had not posted yet went out during stop(), not lost.
    events = server.objects(EVENTS.path(NS))
    assert sorted(e["reason"] for e in events) == ["Created", "Deleted", "Updated"]
    assert all(e["source"]["component"] == "test" for e in events)
    assert recorder._sender is not None and recorder._sender.name == "event-sender"
    assert recorder.event(events[0], "Normal", "Late", "after stop") is False


def test_a_reconciler_gets_its_caches_before_it_is_registered(server):
    """store_for() makes the cache before add_controller; the controller's own watches
    (primary, and owned kinds under the same selector) share it: one informer each."""
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "a"}, "data": {}})
    uid = server.get_object(CONFIGMAPS.path(NS, "a"))["metadata"]["uid"]
    svc = _owned_service("svc", "a", uid)
    svc["metadata"]["labels"] = {"mine": "yes"}
    server.create_object(SERVICES.path(NS), svc)
    mgr = _manager(server)
    configmaps, services = mgr.store_for(CONFIGMAPS), mgr.store_for(SERVICES, "mine=yes")
    seen = []

    def reconcile(key):
        seen.append((configmaps.get(key) is not None,
                     services.get(ObjectKey(NS, "svc")) is not None))

    mgr.add_controller(CONFIGMAPS, reconcile, owns=[SERVICES], owns_label_selector="mine=yes",
                       workers=1)
    assert mgr.store(CONFIGMAPS) is configmaps and mgr.store(SERVICES, "mine=yes") is services
    assert len(mgr._informers) == 2
    mgr.start()
    try:
        eventually(lambda: (True, True) in seen, message=f"the reconcile saw {seen}")
        with pytest.raises(RuntimeError, match="after start"):
            mgr.store_for(CONFIGMAPS)
    finally:
        assert mgr.stop() == 0


def test_each_cache_keeps_what_its_transform_keeps(server):
    # transforms= reaches the informers: the listed object, the watched change and
    # the object in the store are all projected; another controller may not
    # share the cache with another projection.
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "a", "labels": {"x": "1"}},
                                               "data": {"big": "x" * 1000, "k": "v"}})
    keep = Projection(["metadata.name", "metadata.namespace", "metadata.resourceVersion",
                       "data.k"])
    mgr = _manager(server)
    seen = []
    mgr.add_controller(CONFIGMAPS, lambda key: seen.append(mgr.store(CONFIGMAPS).get(key)),
                       workers=1, transforms={CONFIGMAPS: keep})
    with pytest.raises(ValueError):
        mgr.add_controller(CONFIGMAPS, lambda key: None, name="other",
                           transforms={CONFIGMAPS: Projection(["metadata"])})
    assert mgr.store(CONFIGMAPS).transform is keep      # the refused one changed nothing
    mgr.start()
    try:
        eventually(lambda: seen and seen[-1] is not None)
        assert seen[-1]["data"] == {"k": "v"} and "labels" not in seen[-1]["metadata"]
        obj = server.get_object(CONFIGMAPS.path(NS, "a"))
        obj["data"]["k"] = "w"
        server.update_object(CONFIGMAPS.path(NS), obj)
        eventually(lambda: seen[-1] is not None and seen[-1]["data"] == {"k": "w"})
        assert set(seen[-1]["metadata"]) == {"name", "namespace", "resourceVersion"}
    finally:
        assert mgr.stop() == 0


def test_store_for_takes_a_transform_and_refuses_another_for_the_same_cache(server):
    keep = Projection(["metadata.name", "metadata.namespace", "metadata.resourceVersion"])
    mgr = _manager(server)
    store = mgr.store_for(CONFIGMAPS, transform=keep)
    assert store.transform is keep and mgr.store_for(CONFIGMAPS, transform=keep) is store
    with pytest.raises(ValueError, match="another transform"):
        mgr.store_for(CONFIGMAPS, transform=Projection(["metadata"]))
    mgr.add_controller(CONFIGMAPS, lambda key: None, transforms={CONFIGMAPS: keep})
    assert mgr.store(CONFIGMAPS) is store


def test_caches_synced_is_logged_once_when_the_last_cache_has_synced(server, caplog):
    import logging
    caplog.set_level(logging.INFO, logger="k8s_http")
    server.create_object(CONFIGMAPS.path(NS), {"metadata": {"name": "a"}, "data": {}})
    mgr = _manager(server)
    mgr.add_controller(CONFIGMAPS, lambda key: None, owns=[SERVICES], workers=1)
    mgr.start()
    try:
        port = mgr.server_ports[0]
        eventually(lambda: any("caches synced" in r.getMessage() for r in caplog.records),
                   message="no 'caches synced' line")
        (line,) = [r for r in caplog.records if "caches synced" in r.getMessage()]
        assert line.objects == {str(CONFIGMAPS): 1, str(SERVICES): 0}
        assert line.seconds_since_start >= 0
        # Logged when /readyz turns 200, not before.
        assert _get(port, "/readyz")[0] == 200
    finally:
        assert mgr.stop() == 0


def test_start_and_stop_lines_are_controller_runtimes(server, caplog):
    """The messages and keys of controller-runtime's controller.go, which log
    pipelines and saved searches look for."""
    import logging
    caplog.set_level(logging.INFO, logger="k8s_http")
    mgr = _manager(server)
    mgr.add_controller(CONFIGMAPS, lambda key: None, workers=3)
    mgr.start()
    try:
        eventually(lambda: any(r.getMessage() == "Starting workers" for r in caplog.records),
                   message="no 'Starting workers' line")
    finally:
        assert mgr.stop() == 0
    lines = [r for r in caplog.records if r.getMessage() in (
        "Starting Controller", "Starting workers",
        "Shutdown signal received, waiting for all workers to finish", "All workers finished")]
    assert [r.getMessage() for r in lines] == [
        "Starting Controller", "Starting workers",
        "Shutdown signal received, waiting for all workers to finish", "All workers finished"]
    for r in lines:
        assert (r.controller, r.controllerGroup, r.controllerKind) == \
            ("configmap", "", "ConfigMap"), r.getMessage()
    assert getattr(lines[1], "worker count") == 3
