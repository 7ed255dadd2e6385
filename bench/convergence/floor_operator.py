"""The least any operator could ask of the plane for a `My` to become Ready.

`--pods-ready` measures each operator against the controller-runtime peer. The
goals on plane CPU and operator-added latency (issue 33, item 5) are ratios to
the peer. Part of both figures is the plane's own work, and no operator can go
below it. `FloorOperator` measures that work. It stands in for an operator
process and makes only the writes that cannot be avoided:

- the Deployment and the Service, once the `My` is seen (our own render
  functions, create-only applies);
- the `My`'s status, once, when its Deployment is seen available (our own
  `desired_status`).

Three writes per `My`, and no watch, read, Event or retry of its own. It sees
the objects through the bench's observer, whose watches every operator's run
pays for alike. Its requests go out with the operator's credentials under
their own user agent, so the audit log counts them as an operator's.

Its operator-added time is one watch delivery and one write per leg. Its plane
CPU is that of the objects' lifecycle alone. An operator's figure divided by
the floor's shows what the operator adds; the floor divided by the peer's
shows the best ratio any operator could reach on this plane.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from k8s_http.config.cluster import load_config
from k8s_http.core.errors import ApiError
from k8s_http.core.objects import DEPLOYMENTS, SERVICES, rfc3339_now
from k8s_http.wire.client import ApiClient
from my.render import render_deployment, render_service
from my.status import desired_status

from .cluster import MY
from .perobject import expected_ready

FLOOR_USER_AGENT = "my-controller-bench/floor"
FIELD_MANAGER = "bench-floor"


def make_children(client: ApiClient, my: dict, namespace: str) -> None:
    """The Deployment and Service our controller would make for `my` (its own render
    functions), by create-only applies: what any operator must write first."""
    for resource, render in ((DEPLOYMENTS, render_deployment), (SERVICES, render_service)):
        client.apply(resource, render(my), field_manager=FIELD_MANAGER, force=True,
                     namespace=namespace, create_only=True)


class FloorOperator:
    """An OperatorProcess look-alike with no process (see the module doc). Feed it
    the run's observer with `watch_through` before `start`."""

    key = "floor"
    label = "floor (the bench writes the children and one status, no operator)"

    def __init__(self, kubeconfig: Path, namespace: str, workers: int = 4):
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.workers = workers
        self._observer = None
        self._client: ApiClient | None = None
        self._todo: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._made: set[str] = set()          # My whose children were asked for
        self._reported: set[str] = set()      # My whose status was asked for
        self._done = 0                        # creates and status writes finished
        self.errors: list[str] = []

    def watch_through(self, observer) -> None:
        self._observer = observer

    # -- what the bench calls on an operator

    def start(self, tag: str) -> None:
        if self._observer is None:
            raise RuntimeError("FloorOperator: watch_through(observer) first")
        self._client = ApiClient.from_config(load_config(str(self.kubeconfig)),
                                             user_agent=FLOOR_USER_AGENT,
                                             pool_size=self.workers)
        self._threads = [threading.Thread(target=self._work, daemon=True,
                                          name=f"floor-{i}") for i in range(self.workers)]
        for thread in self._threads:
            thread.start()
        self._observer.listen(self)

    def wait_started(self, timeout_seconds: float) -> float:
        return 0.0

    def check_alive(self) -> None:
        if self.errors:
            raise RuntimeError(f"{self.label}: {self.errors[0]}")

    def cpu_seconds(self) -> float:
        return 0.0        # it runs in the bench's process: its CPU is not a figure here

    def processed_count(self) -> int:
        with self._lock:
            return self._done

    def stop(self) -> int:
        if self._observer is not None:
            self._observer.untrack(self)
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        if self._client is not None:
            self._client.close()
        return 1 if self.errors else 0

    # -- the observer's threads (under its lock: nothing slow here)

    def offer(self, kind: str, obj: dict, at: float) -> None:
        name = obj["metadata"]["name"]
        if kind == "my" and name not in self._made:
            self._made.add(name)
            self._todo.put(("children", obj))
        elif kind == "deployment" and name not in self._reported and expected_ready(obj):
            self._reported.add(name)
            self._todo.put(("status", obj))

    # -- the workers

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            what, obj = item
            try:
                if what == "children":
                    make_children(self._client, obj, self.namespace)
                else:
                    self._report_available(obj)
            except (ApiError, OSError, RuntimeError) as err:
                self.errors.append(f"{what} of {obj['metadata']['name']}: {err}")
                continue
            with self._lock:
                self._done += 1

    def _report_available(self, deployment: dict) -> None:
        name = deployment["metadata"]["name"]
        my = self._observer.get("my", name)
        if my is None:
            raise RuntimeError(f"My {name} not in the observer's cache")
        status = desired_status(my, deployment, now=rfc3339_now())
        self._client.patch_status(MY, name, {"status": status}, namespace=self.namespace)
