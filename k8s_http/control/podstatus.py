"""Why a workload's Pods are not ready, in one line, as `kubectl describe` would say it.

`pod_problem(pods)` reads the Pods' own status (what the kubelet and the
scheduler wrote) and names the first cause it finds, newest Pod first (during a
rollout the new Pods are the ones a user waits for):

  * a container waiting for a reason other than the normal start-up ones
    (ImagePullBackOff, ErrImagePull, CrashLoopBackOff with its restart count
    and the last exit's reason, such as OOMKilled; CreateContainerConfigError
    for a missing Secret or ConfigMap key ...);
  * a container that terminated with a reason (OOMKilled, Error) and has not
    been restarted yet;
  * the scheduler's refusal (the PodScheduled condition False, Unschedulable).

Pure: the caller lists the Pods (a bounded, label-selected read) and decides
when that is worth a request. `PodCheckSchedule` is one such decision: a first
read some seconds after a workload was first seen unready (so the seconds Pods
take to start cost no read), then reads at doubling intervals up to a maximum
while it stays unready (a crash loop's restart count moves), and the cause the
last read found in between (so a message does not flap).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable

__all__ = ["pod_problem", "MAX_PROBLEM_CHARS", "PodCheckSchedule"]

# A Ready condition's message is shown by `kubectl get` and kept in etcd: a
# kubelet message (an image pull error can carry a registry's whole answer) is
# cut to this.
MAX_PROBLEM_CHARS = 300

# Waiting reasons every Pod goes through on its way to running: not a problem.
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})


def pod_problem(pods: Iterable[dict]) -> str | None:
    """The first reason the given Pods show for not running ready, or None."""
    live = [p for p in pods if isinstance(p, dict)
            and not (p.get("metadata") or {}).get("deletionTimestamp")]
    live.sort(key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "",
              reverse=True)
    for pod in live:
        problem = _container_problem(pod) or _scheduling_problem(pod)
        if problem is not None:
            name = (pod.get("metadata") or {}).get("name") or "?"
            return _cut(f"Pod {name}: {problem}")
    return None


def _container_problem(pod: dict) -> str | None:
    status = pod.get("status") or {}
    for field in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(field) or ():
            if isinstance(container, dict):
                problem = _state_problem(container)
                if problem is not None:
                    return problem
    return None


def _state_problem(container: dict) -> str | None:
    state = container.get("state") or {}
    name = container.get("name") or "?"
    waiting, terminated = state.get("waiting"), state.get("terminated")
    if isinstance(waiting, dict) and waiting.get("reason") and \
            waiting["reason"] not in _STARTING:
        text = f"container {name} {waiting['reason']}"
        restarts = container.get("restartCount") or 0
        last = ((container.get("lastState") or {}).get("terminated") or {}).get("reason")
        if restarts:
            text += f" (restarted {restarts} time{'s' if restarts != 1 else ''}"
            text += f", last exit {last})" if last else ")"
        return _with_message(text, waiting.get("message"))
    if isinstance(terminated, dict) and terminated.get("reason") and \
            terminated["reason"] != "Completed":
        text = f"container {name} terminated: {terminated['reason']}"
        if terminated.get("exitCode") is not None:
            text += f" (exit code {terminated['exitCode']})"
        return _with_message(text, terminated.get("message"))
    return None


def _scheduling_problem(pod: dict) -> str | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled" and \
                condition.get("status") == "False":
            return _with_message(condition.get("reason") or "not scheduled",
                                 condition.get("message"))
    return None


def _with_message(text: str, message: object) -> str:
    return f"{text}: {message}" if isinstance(message, str) and message else text


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS - 3] + "..."


class PodCheckSchedule:
    """When to read a workload's Pods again, per key, and what the last read found.

    Time is injected. One worker at a time per key (the work queue's promise):
    each key's entries have one writer.
    """

    def __init__(self, *, first_seconds: float = 5.0, max_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.first_seconds = first_seconds
        self.max_seconds = max_seconds
        self._clock = clock
        self._checks: dict[Hashable, tuple[float, float]] = {}   # key -> (due, interval)
        self._found: dict[Hashable, str | None] = {}             # key -> the last read's cause

    def check(self, key: Hashable, read: Callable[[str | None], str | None]
              ) -> tuple[str | None, float]:
        """(the cause to report, seconds until the next read) while `key` is unready.

        The first call starts the schedule and reads nothing; a call once the read
        is due calls `read(last cause)` for the new cause (a read that fails
        returns the last one) and doubles the interval, up to `max_seconds`."""
        now = self._clock()
        check = self._checks.get(key)
        if check is None:
            self._checks[key] = (now + self.first_seconds, self.first_seconds)
            return None, self.first_seconds
        due, interval = check
        if now < due:
            return self._found.get(key), due - now
        self._found[key] = read(self._found.get(key))
        interval = min(2 * interval, self.max_seconds)
        self._checks[key] = (now + interval, interval)
        return self._found.get(key), interval

    def due_at(self, key: Hashable) -> float | None:
        """clock() of `key`'s next read; None when it has no schedule."""
        check = self._checks.get(key)
        return None if check is None else check[0]

    def stop(self, key: Hashable) -> None:
        """`key` is ready, or gone: no more reads, and nothing to report."""
        self._checks.pop(key, None)
        self._found.pop(key, None)
