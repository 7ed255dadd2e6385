"""my.status.deployment_update_matters: the Deployment informer's update filter.

An update it calls nothing must be nothing to every question the reconcile asks
of a Deployment's status; and the Deployment controller's answers that change
no answer (Progressing=True alone, then its reason) queue no reconcile."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from my.status import (deployment_update_matters, desired_status, is_rollout_pending,
                       pods_worth_reading)

NOW = "2026-12-07T00:00:00Z"

counts = st.one_of(st.none(), st.integers(0, 3))
conditions = st.lists(st.fixed_dictionaries({
    "type": st.sampled_from(["Progressing", "Available", "ReplicaFailure"]),
    "status": st.sampled_from(["True", "False"]),
    "reason": st.sampled_from(["NewReplicaSetCreated", "ReplicaSetUpdated",
                               "NewReplicaSetAvailable", "ProgressDeadlineExceeded",
                               "MinimumReplicasUnavailable", "FailedCreate"]),
    "message": st.sampled_from(["one", "two"]),
}), max_size=3)
statuses = st.fixed_dictionaries({}, optional={
    "observedGeneration": counts, "replicas": counts, "readyReplicas": counts,
    "updatedReplicas": counts, "conditions": conditions})


def deployment(generation: int, replicas: int, status: dict, rv: str = "1") -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "generation": generation,
                         "resourceVersion": rv,
                         "ownerReferences": [{"kind": "My", "name": "web", "uid": "u",
                                              "controller": True}]},
            "spec": {"replicas": replicas}, "status": status}


def my(replicas: int | None) -> dict:
    spec = {"image": "nginx:1"} if replicas is None else {"image": "nginx:1",
                                                          "replicas": replicas}
    return {"metadata": {"name": "web", "namespace": "ns", "generation": 2, "uid": "u"},
            "spec": spec, "status": {}}


def answers(d: dict) -> list:
    out = []
    for replicas in (None, 0, 1, 2, 3):
        m = my(replicas)
        spec = m["spec"]
        for cause in (None, "CrashLoopBackOff (3 restarts)"):
            out.append(desired_status(m, d, now=NOW, pod_cause=cause))
        out.append(pods_worth_reading(spec, d))
    out.append(is_rollout_pending(d))
    return out


@settings(max_examples=400, deadline=None)
@given(generation=st.integers(1, 3), replicas=st.integers(0, 3), old=statuses, new=statuses)
def test_an_update_it_calls_nothing_changes_no_answer(generation, replicas, old, new):
    a = deployment(generation, replicas, old, rv="1")
    b = deployment(generation, replicas, new, rv="2")
    if not deployment_update_matters(a, b):
        assert answers(a) == answers(b)


def test_the_deployment_controllers_answers_that_change_nothing_are_filtered():
    created = deployment(1, 1, {})
    progressing = copy.deepcopy(created)            # its first answer: a condition alone
    progressing["metadata"]["resourceVersion"] = "2"
    progressing["status"]["conditions"] = [{"type": "Progressing", "status": "True",
                                            "reason": "NewReplicaSetCreated", "message": "a"}]
    assert not deployment_update_matters(created, progressing)
    observed = copy.deepcopy(progressing)
    observed["status"].update(observedGeneration=1)
    assert deployment_update_matters(progressing, observed)
    ready = copy.deepcopy(observed)
    ready["status"].update(replicas=1, updatedReplicas=1, readyReplicas=1)
    assert deployment_update_matters(observed, ready)
    settled = copy.deepcopy(ready)
    settled["status"]["conditions"][0].update(reason="NewReplicaSetAvailable", message="b")
    assert not deployment_update_matters(ready, settled)


def test_drift_and_workload_failures_always_matter():
    base = deployment(1, 1, {"observedGeneration": 1, "replicas": 1})
    for change in (lambda d: d["spec"].update(replicas=3),
                   lambda d: d["metadata"].update(generation=2),
                   lambda d: d["metadata"].update(labels={"app": "x"}),
                   lambda d: d["metadata"].update(annotations={"a": "b"}),
                   lambda d: d["metadata"]["ownerReferences"][0].update(uid="other"),
                   lambda d: d["status"].update(conditions=[{
                       "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                       "message": "forbidden"}]),
                   lambda d: d["status"].update(conditions=[{
                       "type": "Progressing", "status": "False",
                       "reason": "ProgressDeadlineExceeded", "message": "stalled"}])):
        changed = copy.deepcopy(base)
        change(changed)
        assert deployment_update_matters(base, changed), changed
    bumped = copy.deepcopy(base)
    bumped["metadata"]["resourceVersion"] = "9"
    assert not deployment_update_matters(base, bumped)
