"""The status tells the truth, and drift always heals (SPEC §2), with the real
Deployment and ReplicaSet controllers, Pod Security admission and garbage collector.

Pods run on the plane's fake Nodes (kwok); a Pod that must never become ready
asks the fake kubelet for it (env FAKE_KUBELET=never-ready, see
tests/support/kwok/stages.yaml). That is enough to see a Pod Security refusal, a
stalled rollout and every drift case. Each test prints how long the operator took, for the
record (the closing note of issue 12); the assertions only bound it generously.
"""

from __future__ import annotations

import time

import pytest

from k8s_http.core.objects import DEPLOYMENTS, NAMESPACES, PODS, SERVICES, get_condition
from tests.e2e.test_operator import (  # noqa: F401  (fixtures)
    MY, TIMEOUT, events_for, get_or_none, installed, kubectl, make_my, operator,
    wait_reason,
)
from tests.support.wait import eventually

# test_operator's operator runs throughout this module too.
pytestmark = pytest.mark.mys_deleted_first

RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 1000,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_APP = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _restrict(api, namespace):
    api.patch(NAMESPACES, namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}})


def _reason_is(api, name, namespace, reason):
    my = get_or_none(api, MY, name, namespace)
    cond = get_condition(my, "Ready") if my else None
    assert cond and cond.get("reason") == reason, cond
    return my


def _warnings(api, name, namespace, reason):
    return [e for e in events_for(api, name, namespace)
            if e["type"] == "Warning" and e["reason"] == reason]


def _timed(what, fn, timeout=TIMEOUT):
    start = time.monotonic()
    result = eventually(fn, timeout=timeout, interval=0.05, message=what)
    print(f"\n[issue-12 timing] {what}: {time.monotonic() - start:.2f} s")
    return result


def test_a_pod_security_refusal_is_replica_failure_until_the_spec_complies(
        operator, api, namespace, control_plane):
    _restrict(api, namespace)
    api.create(MY, make_my("refused", namespace, replicas=1))
    my = _timed("create -> Ready=ReplicaFailure",
                lambda: _reason_is(api, "refused", namespace, "ReplicaFailure"))
    cond = get_condition(my, "Ready")
    assert cond["status"] == "False" and "PodSecurity" in cond["message"], cond
    eventually(lambda: len(_warnings(api, "refused", namespace, "ReplicaFailure")) == 1,
               timeout=TIMEOUT, message="one ReplicaFailure Warning event")
    # printer columns: the reason, and the message with -o wide
    table = kubectl(control_plane, "get", "my", "refused", "-n", namespace, "-o", "wide").stdout
    assert "ReplicaFailure" in table and "PodSecurity" in table, table

    # A compliant spec. The old ReplicaSet keeps failing until the new one's pod
    # is ready (a rolling update keeps it), and with no kubelet it never is: the
    # Deployment still reports its failure, and so do we. With nothing to create
    # (0 replicas) the failure is gone; then the compliant pod is made.
    api.patch(MY, "refused", {"spec": {"podSecurityContext": RESTRICTED_POD,
                                       "securityContext": RESTRICTED_APP, "replicas": 0}},
              namespace=namespace)
    _timed("cause gone (compliant, 0 replicas) -> Ready=Available",
           lambda: _reason_is(api, "refused", namespace, "Available"), timeout=60)
    api.patch(MY, "refused", {"spec": {"replicas": 1}}, namespace=namespace)
    _timed("compliant, 1 replica -> Ready=Available (its Pod runs)",
           lambda: _reason_is(api, "refused", namespace, "Available")["status"][
               "readyReplicas"] == 1, timeout=60)
    pods = eventually(lambda: api.list(PODS, namespace=namespace,
                                       label_selector="app.kubernetes.io/instance=refused")["items"],
                      timeout=TIMEOUT, message="no pod was created under the restricted policy")
    assert pods[0]["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert len(_warnings(api, "refused", namespace, "ReplicaFailure")) == 1


def test_a_stalled_rollout_is_progress_deadline_exceeded(operator, api, namespace):
    # The pod never becomes ready (the fake kubelet is told so), so a 1 s deadline is exceeded.
    api.create(MY, make_my("stalled", namespace, replicas=1, progressDeadlineSeconds=1,
                           env=[{"name": "FAKE_KUBELET", "value": "never-ready"}]))
    dep = eventually(lambda: get_or_none(api, DEPLOYMENTS, "stalled", namespace), timeout=TIMEOUT)
    assert dep["spec"]["progressDeadlineSeconds"] == 1
    my = _timed("create -> Ready=ProgressDeadlineExceeded",
                lambda: _reason_is(api, "stalled", namespace, "ProgressDeadlineExceeded"), timeout=60)
    assert "progressing" in get_condition(my, "Ready")["message"]
    eventually(lambda: len(_warnings(api, "stalled", namespace, "ProgressDeadlineExceeded")) == 1,
               timeout=TIMEOUT)
    # the cause goes: nothing to roll out any more
    api.patch(MY, "stalled", {"spec": {"replicas": 0}}, namespace=namespace)
    _timed("replicas 0 -> Ready=Available",
           lambda: _reason_is(api, "stalled", namespace, "Available"))


def _service_ports(api, name, namespace):
    return api.get(SERVICES, name, namespace=namespace)["spec"]["ports"]


def test_a_foreign_port_edit_is_undone_without_a_retry_loop(operator, api, namespace,
                                                           control_plane):
    api.create(MY, make_my("ported", namespace))
    wait_reason(api, "ported", namespace, "Available")
    applies_before = operator.metric("rest_client_requests_total", method="PATCH")
    invalid_before = operator.metric("rest_client_requests_total", code="422")
    errors_before = operator.metric("controller_runtime_reconcile_errors_total")
    # Another field manager replaces the list entry (a JSON merge patch replaces
    # lists whole; a strategic one would add a second unnamed port, which the
    # apiserver refuses). A forced apply of ours would now merge both: a 422.
    kubectl(control_plane, "patch", "svc", "ported", "-n", namespace, "--type=merge",
            "-p", '{"spec":{"ports":[{"port":9999,"targetPort":9999}]}}')

    def restored():
        ports = _service_ports(api, "ported", namespace)
        assert [(p["port"], p.get("targetPort"), p.get("protocol")) for p in ports] == \
            [(8080, 8080, "TCP")], ports
        return True
    _timed("foreign Service port edit -> restored", restored)
    time.sleep(2)            # would-be retries show themselves
    assert operator.metric("controller_runtime_reconcile_errors_total") == errors_before
    assert operator.metric("rest_client_requests_total", method="PATCH") - applies_before <= 3
    assert operator.metric("rest_client_requests_total", code="422") == invalid_before


def test_foreign_entries_in_decided_fields_go_and_the_rest_stays(operator, api, namespace):
    api.create(MY, make_my("decided", namespace, env=[{"name": "MINE", "value": "1"}]))
    wait_reason(api, "decided", namespace, "Available")
    # Another manager adds an env var and a port to our container, a sidecar, an
    # annotation and a label: the first two are ours to decide, the rest is theirs.
    api.patch(DEPLOYMENTS, "decided", {
        "metadata": {"annotations": {"team/owner": "db"}, "labels": {"team": "db"}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "app", "env": [{"name": "FOREIGN", "value": "x"}],
             "ports": [{"containerPort": 9090, "protocol": "TCP"}]},
            {"name": "sidecar", "image": "proxy:1"}]}}}},
        namespace=namespace, patch_type="strategic", field_manager="intruder")
    # ... and a named Service port beside ours (naming ours too, as two ports need names)
    api.patch(SERVICES, "decided", {"spec": {"ports": [
        {"port": 8080, "name": "web"},
        {"port": 9999, "targetPort": 9999, "name": "extra", "protocol": "TCP"}]}},
        namespace=namespace, patch_type="strategic", field_manager="intruder")

    def healed():
        dep = api.get(DEPLOYMENTS, "decided", namespace=namespace)
        containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
        assert containers["app"]["env"] == [{"name": "MINE", "value": "1"}], containers["app"]
        assert containers["app"]["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
        assert "sidecar" in containers, "an injected container was removed"
        assert dep["metadata"]["annotations"]["team/owner"] == "db"
        assert dep["metadata"]["labels"]["team"] == "db"
        ports = _service_ports(api, "decided", namespace)
        assert [p["port"] for p in ports] == [8080], ports
        return True
    _timed("foreign env, container port and Service port -> removed", healed)


def test_a_squatters_deletion_is_noticed_at_once(operator, api, namespace):
    foreign = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "squat"},
               "spec": {"ports": [{"port": 80}], "selector": {"app": "theirs"}}}
    api.create(SERVICES, foreign, namespace=namespace)
    api.create(MY, make_my("squat", namespace))
    wait_reason(api, "squat", namespace, "Conflict")
    time.sleep(1)                  # the name watch is in place
    api.delete(SERVICES, "squat", namespace=namespace)
    svc = _timed("squatter deleted -> our Service exists", lambda: (
        (s := get_or_none(api, SERVICES, "squat", namespace)) is not None
        and s["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") == "my-controller"
        and s), timeout=10)
    assert svc["metadata"]["ownerReferences"][0]["kind"] == "My"
    _timed("squatter deleted -> Ready=Available",
           lambda: _reason_is(api, "squat", namespace, "Available"))




def test_a_burst_has_no_write_refused_by_our_own_cache_lag(operator, api, namespace):
    """Each new My: two child creates, none refused (409) because our own cache
    had not yet seen a child we had just made."""
    refused_before = operator.metric("rest_client_requests_total", code="409")
    names = [f"burst-{i}" for i in range(30)]
    for name in names:
        api.create(MY, make_my(name, namespace))
    for name in names:
        wait_reason(api, name, namespace, "Available", timeout=60)
    time.sleep(2)
    assert operator.metric("rest_client_requests_total", code="409") == refused_before
