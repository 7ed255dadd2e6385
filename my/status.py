"""The status a `My` reports: its Ready condition, replica counts and selector.

One job: from a `My` and its Deployment as last seen, the status the `My`
should have (``desired_status``, docs/SPEC.md §2), and the questions the
reconciler asks of a Deployment's status on the way: is the Deployment
controller about to change it (``is_rollout_pending``), may its Pods say why it
is not ready (``pods_worth_reading``), did anything a reconcile reads change
(``same_inputs`` of a My, ``deployment_update_matters`` of its Deployment), would
a write change anything (``status_changed``).

Invariants: pure (no I/O, no logging; the time of a condition's transition is
passed in as ``now``); the `My` and the Deployment are only read, and fields
of the status we do not own are carried over untouched. Ready is True only
when the Deployment controller has seen the current Deployment spec and rolled
it out to every replica. Imports only ``my.spec``, the standard library and the
``k8s_http`` package root.
"""

from __future__ import annotations

from k8s_http import get_condition, meta_of, set_condition

from my.spec import DEFAULT_REPLICAS, effective_spec, selector_string

CONDITION_READY = "Ready"
# Ready condition reasons (SPEC §2).
AVAILABLE = "Available"
PROGRESSING = "Progressing"
INVALID_SPEC = "InvalidSpec"
CONFLICT = "Conflict"
APPLY_FAILED = "ApplyFailed"
# The workload's own failures, from the Deployment's conditions: its ReplicaSet
# cannot create pods (quota, Pod Security admission, ...), or the rollout made
# no progress within spec.progressDeadlineSeconds.
REPLICA_FAILURE = "ReplicaFailure"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
# Reasons reported with one Warning event when they appear (not at every write).
WARNING_REASONS = (INVALID_SPEC, CONFLICT, REPLICA_FAILURE, PROGRESS_DEADLINE_EXCEEDED)


def _readiness(spec: dict, deployment: dict | None, pod_cause: str | None = None
               ) -> tuple[str, str, str]:
    """(status, reason, message) of the Ready condition from the Deployment, and
    `pod_cause` (what the Pods show, see pod_problem) appended when not ready.

    SPEC: Available when ready >= desired. We also require the Deployment
    controller to have seen the current Deployment spec and to have rolled it
    out to every replica; otherwise the old ReplicaSet's ready pods would make
    an image change look Available before a single new pod runs.
    """
    desired = spec.get("replicas", DEFAULT_REPLICAS)
    if deployment is None:
        return "False", PROGRESSING, "waiting for the Deployment to be created"
    status = deployment.get("status") or {}
    ready = status.get("readyReplicas") or 0
    updated = status.get("updatedReplicas") or 0
    generation = meta_of(deployment).get("generation") or 0
    if (status.get("observedGeneration") or 0) < generation:
        return "False", PROGRESSING, f"{ready}/{desired} replicas ready; Deployment update pending"
    if ready >= desired and updated >= desired:
        return "True", AVAILABLE, f"{ready}/{desired} replicas ready"
    # Not available: say why when the Deployment controller knows. Its
    # ReplicaFailure condition carries the ReplicaSet's refusal (e.g. the Pod
    # Security admission message); Progressing=False/ProgressDeadlineExceeded a
    # stalled rollout. Both go away by themselves when the cause does.
    failure = _workload_failure(status)
    if failure is not None:
        reason, condition = failure
        detail = condition.get("message") or condition.get("reason") or "no message"
        if pod_cause:
            detail = f"{detail}; {pod_cause}"
        return "False", reason, f"{ready}/{desired} replicas ready: {detail}"
    if pod_cause:
        return "False", PROGRESSING, f"{ready}/{desired} replicas ready: {pod_cause}"
    return "False", PROGRESSING, f"{ready}/{desired} replicas ready"


def pods_worth_reading(spec: dict, deployment: dict | None) -> bool:
    """Whether this My's Pods may say why it is not ready: the Deployment controller
    has caught up with the current spec and made Pods, and not all are ready."""
    if deployment is None:
        return False
    status = deployment.get("status") or {}
    if (status.get("observedGeneration") or 0) < (meta_of(deployment).get("generation") or 0):
        return False
    desired = spec.get("replicas", DEFAULT_REPLICAS)
    return (status.get("replicas") or 0) > 0 and (status.get("readyReplicas") or 0) < desired


def _workload_failure(status: dict) -> tuple[str, dict] | None:
    """(reason, the Deployment's condition) when its ReplicaSet cannot create pods
    (ReplicaFailure=True) or its rollout stalled (Progressing=False with
    ProgressDeadlineExceeded); None otherwise."""
    conditions = {c.get("type"): c for c in status.get("conditions") or []
                  if isinstance(c, dict)}
    failure = conditions.get("ReplicaFailure") or {}
    if failure.get("status") == "True":
        return REPLICA_FAILURE, failure
    progressing = conditions.get("Progressing") or {}
    if progressing.get("status") == "False" and \
            progressing.get("reason") == PROGRESS_DEADLINE_EXCEEDED:
        return PROGRESS_DEADLINE_EXCEEDED, progressing
    return None


def is_rollout_pending(deployment: dict | None) -> bool:
    """The Deployment controller is about to change what this Deployment's status
    says: it has not observed the current generation, or has not yet brought the
    pod counts (replicas, updatedReplicas) to spec.replicas. Readiness is not
    waited for: pods may take minutes to become ready, and each change of
    readyReplicas is reported as it comes."""
    if deployment is None:
        return False
    status = deployment.get("status") or {}
    if (status.get("observedGeneration") or 0) < (meta_of(deployment).get("generation") or 0):
        return True
    if _workload_failure(status) is not None:
        return False        # an answer already: the counts will not reach spec.replicas soon
    desired = (deployment.get("spec") or {}).get("replicas", DEFAULT_REPLICAS)
    return (status.get("replicas") or 0) != desired or \
        (status.get("updatedReplicas") or 0) != desired


def desired_status(my: dict, deployment: dict | None, *,
                   condition: tuple[str, str] | None = None, now: str | None = None,
                   pod_cause: str | None = None) -> dict:
    """The status `my` should have.

    `deployment`: our Deployment as last seen (None when missing or not ours);
    its status gives the replica counts. `condition`: (reason, message) for a
    failure (InvalidSpec, Conflict, ApplyFailed), which makes Ready False;
    None computes Available / Progressing from the Deployment, with `pod_cause`
    (why its Pods are not ready) in the message when not Available.

    Fields of the status we do not own (other conditions, say) are kept.
    `lastTransitionTime` moves only when the Ready status flips (set_condition).
    """
    old = my.get("status") or {}
    generation = meta_of(my).get("generation")
    if condition is None:
        cond_status, reason, message = _readiness(effective_spec(my.get("spec")), deployment,
                                                  pod_cause)
    else:
        cond_status, (reason, message) = "False", condition
    counts = (deployment or {}).get("status") or {}
    # A shallow copy: every key this sets is replaced, not changed in place (set_condition
    # copies the conditions), and the rest is carried over as it is, never modified.
    new = dict(old)
    new.update({
        "observedGeneration": generation,
        "replicas": counts.get("replicas") or 0,
        "readyReplicas": counts.get("readyReplicas") or 0,
        "selector": selector_string(meta_of(my).get("name") or ""),
        "conditions": set_condition(old.get("conditions"), {
            "type": CONDITION_READY, "status": cond_status, "reason": reason,
            "message": message, "observedGeneration": generation,
        }, now=now),
    })
    return new


def same_inputs(a: dict | None, b: dict | None) -> bool:
    """Whether two versions of a My agree on everything a reconcile reads but its status."""
    if a is None or b is None:
        return a is b
    meta_a, meta_b = meta_of(a), meta_of(b)
    return (a.get("spec") == b.get("spec") and
            all(meta_a.get(f) == meta_b.get(f)
                for f in ("uid", "generation", "deletionTimestamp", "name", "namespace")))


def deployment_update_matters(old: dict, new: dict) -> bool:
    """Whether the reconcile of the My owning a Deployment could act otherwise on
    `new` than on `old`, two versions of it as the cache keeps them (the
    Deployment informer's update filter: an update this is False of does not
    queue the My). Everything but the status counts (needs_apply and the
    foreign-entries patch read the spec and the metadata), and of the status,
    what this module reads: observedGeneration, the counts, a workload failure.
    Not the other conditions: the Deployment controller's first answer to a new
    Deployment adds Progressing=True alone, and its last turns Progressing's
    reason to NewReplicaSetAvailable, neither of which any status reports.
    tests/unit/test_deployment_updates.py checks that versions this calls alike
    give every function here the same answer."""
    return _all_but_status(old) != _all_but_status(new) or _status_read(old) != _status_read(new)


def _all_but_status(deployment: dict) -> tuple[dict, dict]:
    meta = {k: v for k, v in meta_of(deployment).items() if k != "resourceVersion"}
    return meta, {k: v for k, v in deployment.items() if k not in ("metadata", "status")}


def _status_read(deployment: dict) -> tuple:
    status = deployment.get("status") or {}
    return (status.get("observedGeneration"), status.get("replicas"),
            status.get("readyReplicas"), status.get("updatedReplicas"),
            _workload_failure(status))


def status_changed(old: dict | None, new: dict) -> bool:
    """Whether writing `new` would change what the status reports."""
    old = old or {}
    return any(old.get(key) != value for key, value in new.items())


def ready_summary(status: dict | None) -> tuple | None:
    cond = get_condition({"status": status or {}}, CONDITION_READY)
    return (cond.get("status"), cond.get("reason"), cond.get("message")) if cond else None

