"""A Node goes away, and the real controllers bring the Pods back elsewhere (SPEC §2).

A plane of its own, because the times are shortened: Pods tolerate an
unreachable or not-ready Node for 2 s instead of 300 s (the apiserver's
DefaultTolerationSeconds), and the node-lifecycle controller calls a Node
unreachable 16 s after its Lease was last renewed instead of 50 s. kwok renews
each fake Node's Lease every 5 s (tests/support/kwok/kwok.yaml).

  * NotReady: kwok stops playing the Node's kubelet (its label removed: it
    manages only Nodes labelled type=kwok), so its Lease expires; the
    node-lifecycle controller marks it and its Pods not ready and taints it;
    taint-eviction evicts the Pods; the ReplicaSet makes new ones, which the
    scheduler puts on the other Nodes.
  * Deleted: the Node object goes; Pod GC deletes its Pods; the same follows.

Both end with the My Available again, and print the time from the fault to the
My reporting it and to the My being back.

And the operator restarted while Pods run writes nothing.
"""

from __future__ import annotations

import time

import pytest

from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import load_config
from k8s_http.core.objects import NAMESPACES, PODS, Resource, get_condition
from tests.e2e.operator_process import install_manifests
from tests.e2e.test_operator import MY, get_or_none, make_my
from tests.support.controlplane import ControlPlane, ControlPlaneError
from tests.support.wait import eventually

NODES = Resource("", "v1", "nodes", False, "Node")
NODE_GRACE_SECONDS = 16
TOLERATION_SECONDS = 2
TIMEOUT = 180.0

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def plane():
    plane = ControlPlane(
        apiserver_args=[f"--default-not-ready-toleration-seconds={TOLERATION_SECONDS}",
                        f"--default-unreachable-toleration-seconds={TOLERATION_SECONDS}"],
        controller_manager_args=[f"--node-monitor-grace-period={NODE_GRACE_SECONDS}s",
                                 "--node-monitor-period=1s"])
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the node-loss control plane did not start: {exc}", pytrace=False)
    try:
        install_manifests(plane)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def api(plane):
    client = ApiClient.from_config(load_config(str(plane.admin_kubeconfig)))
    try:
        yield client
    finally:
        client.transport.close()


@pytest.fixture
def ns(api, request):
    name = f"nodes-{request.node.name[5:30].replace('_', '-').rstrip('-')}"
    api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


@pytest.fixture
def running(plane, fleet, ns):
    """The operator for this test's namespace, ready."""
    op = fleet.start("nodes", plane.admin_kubeconfig, "--namespace", ns, "--workers", "2")
    op.wait_ready()
    return op


def _ready_pods(api, namespace) -> list[dict]:
    return [p for p in api.list(PODS, namespace=namespace)["items"]
            if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (p.get("status") or {}).get("conditions") or [])]


def _condition(api, name, namespace) -> dict:
    my = get_or_none(api, MY, name, namespace)
    return (get_condition(my, "Ready") or {}) if my else {}


def _available_on(api, namespace, replicas, nodes):
    def check():
        cond = _condition(api, "web", namespace)
        assert cond.get("reason") == "Available", cond
        pods = _ready_pods(api, namespace)
        assert len(pods) == replicas and {p["spec"]["nodeName"] for p in pods} <= set(nodes), \
            [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in pods]
        return True
    return check


def _lose_node(api, plane, namespace, fault, what, *, unready_seen=True):
    api.create(MY, make_my("web", namespace, replicas=3))
    eventually(_available_on(api, namespace, 3, plane.node_names), timeout=TIMEOUT)
    victim = _ready_pods(api, namespace)[0]["spec"]["nodeName"]
    others = [n for n in plane.node_names if n != victim]
    start = time.monotonic()
    fault(victim)
    seen = "-"
    if unready_seen:
        eventually(lambda: _condition(api, "web", namespace).get("status") == "False",
                   timeout=TIMEOUT, interval=0.1, message=f"{what}: the My never showed it")
        seen = f"{time.monotonic() - start:.2f} s"
    eventually(_available_on(api, namespace, 3, others), timeout=TIMEOUT, interval=0.1,
               message=f"{what}: the Pods never came back on the other Nodes")
    print(f"\n[pods timing] {what}: Ready=False after {seen}, Available again on "
          f"the other Nodes after {time.monotonic() - start:.2f} s")
    return victim


def test_a_node_gone_not_ready_has_its_pods_replaced_elsewhere(plane, api, ns, running):
    def stop_kubelet(node):
        api.patch(NODES, node, {"metadata": {"labels": {"type": None}}})
    victim = _lose_node(api, plane, ns, stop_kubelet, "Node NotReady (kubelet gone)")
    node = api.get(NODES, victim)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"][0]
    assert ready["status"] == "Unknown", ready
    # The kubelet comes back: the Node is Ready again and takes Pods.
    api.patch(NODES, victim, {"metadata": {"labels": {"type": "kwok"}}})
    eventually(lambda: plane._nodes_schedulable([victim]), timeout=TIMEOUT,
               message="the Node never came back")


def test_a_deleted_node_has_its_pods_replaced_elsewhere(plane, api, ns, running):
    # Its Pods stay Ready in the API (no kubelet is left to say otherwise) until Pod GC
    # deletes them, 40 s later; their replacements are Ready at once, so the My may
    # never be seen unready: what counts is that it ends Available on the other Nodes.
    victim = _lose_node(api, plane, ns, lambda node: api.delete(NODES, node), "Node deleted",
                        unready_seen=False)
    plane.node_names.remove(victim)
    plane.add_node(victim)                          # for the tests after this one
    plane.node_names.append(victim)
    eventually(lambda: plane._nodes_schedulable([victim]), timeout=TIMEOUT,
               message="the re-added Node never became Ready")


def test_an_operator_restarted_while_pods_run_writes_nothing(plane, api, ns, fleet):
    first = fleet.start("before", plane.admin_kubeconfig, "--namespace", ns)
    first.wait_ready()
    for i in range(5):
        api.create(MY, make_my(f"app{i}", ns, replicas=2))
    for i in range(5):
        eventually(lambda i=i: _condition(api, f"app{i}", ns).get("reason") == "Available",
                   timeout=TIMEOUT, message=f"app{i} never Available")
    first.signal(15)
    first.expect_clean_exit()
    second = fleet.start("after", plane.admin_kubeconfig, "--namespace", ns)
    second.wait_ready()
    # Every key is reconciled after the initial list; give them time to be.
    eventually(lambda: second.metric("controller_runtime_reconcile_total") >= 5, timeout=30,
               message="the restarted operator never reconciled its Mys")
    time.sleep(3)
    writes = {m: second.metric("rest_client_requests_total", method=m)
              for m in ("POST", "PATCH", "PUT", "DELETE")}
    print(f"\n[pods timing] restart with 5 My x 2 Pods running: writes {writes}")
    assert writes == {"POST": 0, "PATCH": 0, "PUT": 0, "DELETE": 0}, second.log()[-3000:]
