"""Per object: when did each My's status first reflect its Deployment?

Fed by the bench's Observer (its watches, not the operator's logs) with every
version of every My and Deployment as it arrives. For each My it records

- created:      monotonic time just before the bench sent the create;
- first_status: the first version of the My whose status speaks of its current
                generation (observedGeneration == generation and a Ready condition);
- converged:    the first moment the My's status reflects its Deployment *as it
                is at that moment* (`agrees`): the generation is observed, and
                replicas, readyReplicas and the Ready condition say what the
                Deployment's current status says. A Deployment the Deployment
                controller has not looked at yet has zero counts and is not
                rolled out, so an early "Progressing, 0 replicas" status agrees
                with it until the Deployment controller writes its counts;
- steady:       the last moment it went from disagreeing to agreeing -- once the
                operator has reported the Deployment controller's final counts.

`converged` is what a user waits for after a create: a status that is true when
they read it. `steady` shows how long the status kept up with what followed.
"""

from __future__ import annotations

import math
import statistics
import threading


def expected_ready(deployment: dict) -> bool:
    """Ready=True as SPEC.md defines it: the Deployment controller has seen the current
    spec and every desired replica is updated and ready."""
    status = deployment.get("status") or {}
    desired = (deployment.get("spec") or {}).get("replicas", 1)
    return (status.get("observedGeneration") or 0) >= \
        (deployment["metadata"].get("generation") or 0) and \
        (status.get("readyReplicas") or 0) >= desired and \
        (status.get("updatedReplicas") or 0) >= desired


def ready_condition(my: dict) -> dict | None:
    return next((c for c in (my.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready"), None)


def status_current(my: dict) -> bool:
    status = my.get("status") or {}
    return status.get("observedGeneration") == my["metadata"].get("generation") and \
        ready_condition(my) is not None


def agrees(my: dict, deployment: dict | None) -> bool:
    """The My's status reflects `deployment` as it is now."""
    if deployment is None or not status_current(my):
        return False
    status, counts = my.get("status") or {}, deployment.get("status") or {}
    cond = ready_condition(my)
    ready = expected_ready(deployment)
    return (status.get("replicas") or 0) == (counts.get("replicas") or 0) and \
        (status.get("readyReplicas") or 0) == (counts.get("readyReplicas") or 0) and \
        cond.get("status") == ("True" if ready else "False") and \
        (cond.get("reason") == "Available") == ready


class PerObject:
    """A listener for Observer.listen(): per-My timestamps, see the module doc."""

    def __init__(self, names):
        self.names = set(names)
        self.created: dict[str, float] = {}
        self.first_status: dict[str, float] = {}
        self.converged: dict[str, float] = {}
        self.steady: dict[str, float] = {}
        self.first_deployment: dict[str, float] = {}
        self.first_service: dict[str, float] = {}
        self._agreeing: set[str] = set()
        self._mys: dict[str, dict] = {}
        self._deployments: dict[str, dict] = {}
        self._all_converged = threading.Event()

    def sent(self, name: str, at: float) -> None:
        self.created[name] = at

    def offer(self, kind: str, obj: dict, at: float) -> None:
        """Called by the Observer's threads, under its lock, for every object version."""
        name = obj["metadata"]["name"]
        if name not in self.names:
            return
        if kind == "my":
            self._mys[name] = obj
            if name not in self.first_status and status_current(obj):
                self.first_status[name] = at
        elif kind == "deployment":
            self._deployments[name] = obj
            self.first_deployment.setdefault(name, at)
        elif kind == "service":
            # Not part of converged (the status reports on the Deployment), but a user
            # who wants to reach the workload waits for it: reported beside it.
            self.first_service.setdefault(name, at)
            return
        else:
            return
        my = self._mys.get(name)
        now_agrees = my is not None and agrees(my, self._deployments.get(name))
        if now_agrees and name not in self._agreeing:
            self._agreeing.add(name)
            self.converged.setdefault(name, at)
            self.steady[name] = at
            if len(self.converged) == len(self.names):
                self._all_converged.set()
        elif not now_agrees:
            self._agreeing.discard(name)

    def wait_all_converged(self, timeout_seconds: float) -> bool:
        return self._all_converged.wait(timeout_seconds)

    def pending(self) -> list[str]:
        return sorted(self.names - set(self.converged))

    def all_agree(self) -> bool:
        return self._agreeing == self.names

    def figures(self, t0: float) -> dict:
        """Seconds: per-object p50/p99/max of create -> X, and the first create -> last X."""
        out: dict = {}
        for what, times in (("converged", self.converged), ("first_status", self.first_status),
                            ("steady", self.steady), ("deployment", self.first_deployment),
                            ("service", self.first_service)):
            waits = sorted(times[n] - self.created[n] for n in times if n in self.created)
            if not waits:
                continue
            out[f"{what}_p50_seconds"] = statistics.median(waits)
            out[f"{what}_p99_seconds"] = _quantile(waits, 0.99)
            out[f"{what}_max_seconds"] = waits[-1]
            # Seconds from the first create until each object got there. The pace
            # through the burst (raw results only): when a quarter, half, three
            # quarters of the objects had; two operators with the same last one can
            # reach it differently.
            done = sorted(t - t0 for t in times.values())
            out[f"all_{what}_seconds"] = done[-1]
            for share in (25, 50, 75):
                out[f"{what}_{share}pct_done_seconds"] = _quantile(done, share / 100)
        return out


def _quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile: a value that was measured."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]
