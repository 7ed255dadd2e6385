"""Where Pods run: the status tells the truth down to the Pods (SPEC §2).

The session's plane runs kube-scheduler and kwok (3 fake Nodes; their kubelet
is played by the stages in tests/support/kwok/stages.yaml), so Pods are
scheduled, become Running and Ready, and Deployments Available through the real
Deployment and ReplicaSet controllers. A failure is asked of the fake kubelet
by name through the My's spec (FAKE_KUBELET=..., an unpullable.invalid image,
a key named missing*), and fixed by a spec change, as a user would.

Each test prints, for the record, the time from the change (or the fault) to
the My's Ready condition reflecting it; the assertions only bound it generously.
Node loss needs shortened tolerations, so it has a plane of its own:
tests/e2e/test_node_loss.py.
"""

from __future__ import annotations

import time

import pytest

from k8s_http.core.objects import PODS, REPLICASETS, SECRETS, get_condition
from tests.e2e.test_operator import (  # noqa: F401  (fixtures)
    MY, get_or_none, installed, make_my, operator,
)
from tests.support.wait import eventually

pytestmark = pytest.mark.mys_deleted_first

# Pods run within a second here; a rollout is a few of them, one after another.
TIMEOUT = 60.0
# A Pod's cause is read 5 s after the My is first seen unready, then at 10, 20 s...
CAUSE_TIMEOUT = 90.0


def _ready(api, name, namespace) -> dict:
    my = get_or_none(api, MY, name, namespace)
    return (get_condition(my, "Ready") or {}) if my else {}


def _timed(what: str, predicate, timeout: float = TIMEOUT):
    start = time.monotonic()
    result = eventually(predicate, timeout=timeout, interval=0.05, message=what)
    print(f"\n[pods timing] {what}: {time.monotonic() - start:.2f} s")
    return result


def _available(api, name, namespace, generation=None, replicas=None):
    def check():
        my = get_or_none(api, MY, name, namespace)
        cond = get_condition(my, "Ready") if my else None
        assert cond and cond.get("status") == "True" and cond.get("reason") == "Available", cond
        status = my["status"]
        if generation is not None:
            assert status["observedGeneration"] == generation and \
                cond.get("observedGeneration") == generation, status
        if replicas is not None:
            assert status["readyReplicas"] == replicas, status
        return my
    return check


def _message_has(api, name, namespace, *fragments, reason="Progressing"):
    def check():
        cond = _ready(api, name, namespace)
        assert cond.get("status") == "False" and cond.get("reason") == reason, cond
        assert all(f in (cond.get("message") or "") for f in fragments), cond
        return cond
    return check


def _pods(api, name, namespace) -> list[dict]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/name=my"
    return [p for p in api.list(PODS, namespace=namespace, label_selector=selector)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def _set_spec(api, name, namespace, **spec) -> int:
    return api.patch(MY, name, {"spec": spec}, namespace=namespace)["metadata"]["generation"]


def test_a_my_becomes_available_with_its_pods_running_on_fake_nodes(operator, api, namespace,
                                                                     control_plane):
    api.create(MY, make_my("web", namespace, replicas=2))
    my = _timed("create -> Ready=True Available (2 Pods)",
                _available(api, "web", namespace, generation=1, replicas=2))
    assert get_condition(my, "Ready")["message"] == "2/2 replicas ready"
    pods = _pods(api, "web", namespace)
    assert len(pods) == 2
    assert all(p["status"]["phase"] == "Running" for p in pods), pods
    assert {p["spec"]["nodeName"] for p in pods} <= set(control_plane.node_names)


def test_a_new_image_rolls_out_and_the_old_replicaset_ends_at_zero(operator, api, namespace):
    api.create(MY, make_my("app", namespace, replicas=2, image="nginx:1.27"))
    eventually(_available(api, "app", namespace, generation=1, replicas=2), timeout=TIMEOUT)
    generation = _set_spec(api, "app", namespace, image="nginx:1.28")
    _timed("image change -> Ready=True at the new generation",
           _available(api, "app", namespace, generation=generation, replicas=2))

    def rolled_out():
        sets = api.list(REPLICASETS, namespace=namespace)["items"]
        by_image = {rs["spec"]["template"]["spec"]["containers"][0]["image"]:
                    (rs["spec"]["replicas"], (rs.get("status") or {}).get("replicas", 0))
                    for rs in sets}
        assert by_image == {"nginx:1.27": (0, 0), "nginx:1.28": (2, 2)}, by_image
        return True
    eventually(rolled_out, timeout=TIMEOUT, message="the old ReplicaSet never reached 0")
    assert {p["spec"]["containers"][0]["image"] for p in _pods(api, "app", namespace)} == \
        {"nginx:1.28"}


def test_scale_up_and_down_is_reported_as_the_pods_come_and_go(operator, api, namespace):
    api.create(MY, make_my("scaled", namespace, replicas=1))
    eventually(_available(api, "scaled", namespace, replicas=1), timeout=TIMEOUT)
    up = _set_spec(api, "scaled", namespace, replicas=3)
    _timed("scale 1 -> 3: Ready=True with 3 ready",
           _available(api, "scaled", namespace, generation=up, replicas=3))
    down = _set_spec(api, "scaled", namespace, replicas=1)
    _timed("scale 3 -> 1: Ready=True with 1 ready",
           _available(api, "scaled", namespace, generation=down, replicas=1))
    eventually(lambda: len(_pods(api, "scaled", namespace)) == 1, timeout=TIMEOUT)


def test_a_pod_that_never_becomes_ready_ends_in_progress_deadline_exceeded_then_is_fixed(
        operator, api, namespace):
    api.create(MY, make_my("stuck", namespace, replicas=1, progressDeadlineSeconds=5,
                           env=[{"name": "FAKE_KUBELET", "value": "never-ready"}]))
    _timed("never-ready Pod -> Ready=False ProgressDeadlineExceeded",
           _message_has(api, "stuck", namespace, "0/1 replicas ready",
                        reason="ProgressDeadlineExceeded"), timeout=CAUSE_TIMEOUT)
    generation = _set_spec(api, "stuck", namespace, env=[{"name": "MODE", "value": "fixed"}])
    _timed("spec fixed -> Ready=True",
           _available(api, "stuck", namespace, generation=generation, replicas=1))


def test_a_crash_loop_is_named_with_its_restart_count_rising_then_fixed(operator, api, namespace):
    api.create(MY, make_my("crashy", namespace, replicas=1,
                           env=[{"name": "FAKE_KUBELET", "value": "crash-loop"}]))
    first = _timed("crash loop -> named in Ready's message",
                   _message_has(api, "crashy", namespace, "CrashLoopBackOff (restarted",
                                "last exit Error"), timeout=CAUSE_TIMEOUT)

    def restarts(message: str) -> int:
        return int(message.split("(restarted ", 1)[1].split(" ", 1)[0])
    count = restarts(first["message"])
    _timed("the restart count in the message rises",
           lambda: restarts(_ready(api, "crashy", namespace).get("message", "(restarted 0 ")) >
           count, timeout=CAUSE_TIMEOUT)
    generation = _set_spec(api, "crashy", namespace, env=[])
    _timed("spec fixed -> Ready=True",
           _available(api, "crashy", namespace, generation=generation, replicas=1))


def test_an_oom_killed_container_is_named(operator, api, namespace):
    api.create(MY, make_my("hungry", namespace, replicas=1,
                           env=[{"name": "FAKE_KUBELET", "value": "oom-killed"}]))
    _timed("OOMKilled -> named in Ready's message",
           _message_has(api, "hungry", namespace, "CrashLoopBackOff", "last exit OOMKilled"),
           timeout=CAUSE_TIMEOUT)


def test_an_image_that_cannot_be_pulled_is_named_then_fixed(operator, api, namespace):
    api.create(MY, make_my("pull", namespace, replicas=1, image="unpullable.invalid/app:1"))
    _timed("unpullable image -> ImagePullBackOff in Ready's message",
           _message_has(api, "pull", namespace, "ImagePullBackOff",
                        'Back-off pulling image "unpullable.invalid/app:1"'),
           timeout=CAUSE_TIMEOUT)
    generation = _set_spec(api, "pull", namespace, image="nginx:1.27")
    _timed("image fixed -> Ready=True",
           _available(api, "pull", namespace, generation=generation, replicas=1))


def test_a_missing_secret_key_is_named_then_fixed(operator, api, namespace):
    api.create(SECRETS, {"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": "db", "namespace": namespace},
                         "stringData": {"password": "s3cret"}}, namespace=namespace)
    api.create(MY, make_my("db", namespace, replicas=1, env=[
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "missing-key"}}}]))
    _timed("missing Secret key -> CreateContainerConfigError in Ready's message",
           _message_has(api, "db", namespace, "CreateContainerConfigError",
                        f"couldn't find key missing-key in Secret {namespace}/db"),
           timeout=CAUSE_TIMEOUT)
    generation = _set_spec(api, "db", namespace, env=[
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}])
    _timed("key fixed -> Ready=True",
           _available(api, "db", namespace, generation=generation, replicas=1))
    (pod,) = _pods(api, "db", namespace)
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]


def test_a_pod_no_node_can_hold_is_unschedulable_then_fixed(operator, api, namespace):
    # The fake Nodes have 1000 CPUs each.
    api.create(MY, make_my("huge", namespace, replicas=1,
                           resources={"requests": {"cpu": "2000"}}))
    _timed("too large for any Node -> Unschedulable in Ready's message",
           _message_has(api, "huge", namespace, "Unschedulable", "Insufficient cpu"),
           timeout=CAUSE_TIMEOUT)
    generation = _set_spec(api, "huge", namespace, resources={"requests": {"cpu": "1"}})
    _timed("request fixed -> Ready=True",
           _available(api, "huge", namespace, generation=generation, replicas=1))
