"""A converged fleet of `My`, made by the bench itself, grown size by size.

Each `My` gets exactly what a converged operator leaves behind, so an operator
started over the fleet has nothing to write:

- the `My` (the convergence bench's object: image, env, resources);
- its Deployment and Service, rendered by controller.py's own
  `render_deployment` / `render_service` (config hash included) and written by
  server-side apply under the operator's field manager, as the operator
  writes them (same managedFields);
- the Deployment's status as the Deployment controller reports a finished
  rollout (the bench runs with that controller off: no ReplicaSets, no Pods);
- the `My`'s status, `my.status.desired_status` of that Deployment.

The controller-runtime peer renders the same children and hashes them the
same way (bench/peers/crpeer), so it too finds nothing to apply. kopf keeps its
own bookkeeping in annotations the bench cannot forge: it writes (reported).

Headless Services (`headless=True`, scale.py's --headless-services): the same
Service with `clusterIP: None`. Why: kube-apiserver 1.36 allocates a ClusterIP
under one lock and lists every IPAddress object on each allocation, so a fleet
of ClusterIP Services grows at ~15 My/s at 30,000 and 100,000 is hours away.
A headless Service allocates nothing. Neither operator reads spec.clusterIP
(ours' projection drops it, the peer compares the config hash), so to them the
fleet is just as converged; the objects differ by an address string.

Children for `--shards=auto` replicas (`slot_label=`, bench/shards.py): each child
carries its owner's slot in that label, with the config hash stamped over it, by
controller.py's own `with_slot_label`, as a sharded replica renders them; a child
without it would be relabelled by the replica (a 409, a read and an apply each).

Requests go through k8s_http's client from a thread pool (its connection pool
is the parallelism); five requests per `My`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.convergence.cluster import MY
from bench.convergence.scenarios import my_object
from controller import with_slot_label
from k8s_http.wire.client import ApiClient
from k8s_http.core.errors import AlreadyExistsError, NotFoundError
from k8s_http.core.objects import DEPLOYMENTS, SERVICES, rfc3339_now
from my.render import render_deployment, render_service
from my.spec import FIELD_MANAGER
from my.status import desired_status

REQUESTS_PER_MY = 5          # create My, apply Deployment, its status, apply Service, My status
OBJECTS_PER_MY = 3           # My, Deployment, Service
ENV_VALUE = "scale"


def fleet_name(index: int) -> str:
    # Fixed width: names sort in creation order, and every name has the same length.
    return f"s-{index:06d}"


def finished_rollout_status(deployment: dict, now: str) -> dict:
    """The Deployment's status once the Deployment controller has rolled it out
    and every replica is ready (what `kubectl get deploy` shows as 1/1)."""
    replicas = deployment["spec"].get("replicas", 1)
    generation = deployment["metadata"].get("generation", 1)

    def condition(kind: str, reason: str, message: str) -> dict:
        return {"type": kind, "status": "True", "reason": reason, "message": message,
                "lastUpdateTime": now, "lastTransitionTime": now}

    name = deployment["metadata"]["name"]
    return {
        "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
        "readyReplicas": replicas, "availableReplicas": replicas,
        "conditions": [
            condition("Available", "MinimumReplicasAvailable",
                      "Deployment has minimum availability."),
            condition("Progressing", "NewReplicaSetAvailable",
                      f'ReplicaSet "{name}-7d9c8b6f5d" has successfully progressed.'),
        ],
    }


def fleet_service(my: dict, *, headless: bool = False, slot_label: str | None = None) -> dict:
    """The Service the operator renders for `my` (sharded: with `slot_label`); headless:
    with `clusterIP: None`."""
    service = fleet_child(my, render_service, slot_label=slot_label)
    if headless:
        service["spec"]["clusterIP"] = "None"
    return service


def fleet_child(my: dict, render, *, slot_label: str | None = None) -> dict:
    """The child `render` (my.render's) gives for `my`, as the operator applies it;
    a sharded one's (`--shards=auto`) with `slot_label`."""
    child = render(my)
    return child if slot_label is None else with_slot_label(my, child, slot_label)


def make_converged(client: ApiClient, namespace: str, name: str, *,
                   headless: bool = False, slot_label: str | None = None) -> None:
    """One `My` with its children and both statuses, as a converged operator leaves them."""
    body = my_object(name, ENV_VALUE, replicas=1)
    try:
        my = client.create(MY, body, namespace=namespace)
    except AlreadyExistsError:          # a fleet grown again after an interrupted run
        my = client.get(MY, name, namespace=namespace)
    now = rfc3339_now()
    manager = FIELD_MANAGER
    deployment = client.apply(DEPLOYMENTS,
                              fleet_child(my, render_deployment, slot_label=slot_label),
                              field_manager=manager, force=True)
    deployment = client.patch_status(
        DEPLOYMENTS, name, {"status": finished_rollout_status(deployment, now)},
        namespace=namespace)
    client.apply(SERVICES, fleet_service(my, headless=headless, slot_label=slot_label),
                 field_manager=manager, force=True)
    client.patch_status(MY, name, {"status": desired_status(my, deployment, now=now)},
                        namespace=namespace)


class FleetMismatch(Exception):
    """The fleet found in a namespace was grown with other Services than asked for."""


@dataclass
class Growth:
    """One growth step: how many `My` were made and how fast."""
    created: int
    seconds: float

    def as_dict(self) -> dict:
        rate = self.created / self.seconds if self.seconds > 0 else 0.0
        return {"created_my": self.created, "seconds": round(self.seconds, 1),
                "my_per_second": round(rate, 1),
                "objects_per_second": round(rate * OBJECTS_PER_MY, 1),
                "requests_per_second": round(rate * REQUESTS_PER_MY, 1)}


class Fleet:
    """The fleet in one namespace; `grow_to(n)` makes the missing `My` [size, n)."""

    def __init__(self, client: ApiClient, namespace: str, *, threads: int = 16,
                 headless: bool = False, slot_label: str | None = None, progress=None):
        self.client = client
        self.namespace = namespace
        self.threads = threads
        self.headless = headless
        self.slot_label = slot_label
        self.size = 0
        self.progress = progress or (lambda message: None)

    def discover(self) -> int:
        """Take over the fleet an earlier run left in the namespace (a plane that
        outlives runs: bench/scaling/plane.py); returns its size. The last `threads`
        `My` may have been cut short by an interrupted run: they are made again
        (each step of make_converged is idempotent) by the next grow_to.

        FleetMismatch when its first Service is headless and this Fleet's are not,
        or the reverse: growing it would mix the two, which a report would not say.
        """
        names = {item["metadata"]["name"]
                 for item in self.client.list(MY, namespace=self.namespace)["items"]}
        size = 0
        while fleet_name(size) in names:
            size += 1
        if size:
            self._check_services_are_alike()
        self.size = max(0, size - self.threads)
        return size

    def _check_services_are_alike(self) -> None:
        try:
            first = self.client.get(SERVICES, fleet_name(0), namespace=self.namespace)
        except NotFoundError:
            return                  # cut short before its Service: made again by grow_to
        headless = (first.get("spec") or {}).get("clusterIP") == "None"
        if headless != self.headless:
            found, asked = ("headless", "ClusterIP") if headless else ("ClusterIP", "headless")
            flag = "with" if headless else "without"
            raise FleetMismatch(
                f"the fleet in namespace {self.namespace} has {found} Services and this run "
                f"asks for {asked} ones: run {flag} --headless-services, or on an empty plane")

    def grow_to(self, target: int) -> Growth:
        if target <= self.size:
            return Growth(0, 0.0)
        start, t0 = self.size, time.monotonic()
        done = 0
        pool = ThreadPoolExecutor(self.threads)
        try:
            work = pool.map(lambda i: make_converged(self.client, self.namespace, fleet_name(i),
                                                     headless=self.headless,
                                                     slot_label=self.slot_label),
                            range(start, target))
            for _ in work:                    # raises the first failure
                done += 1
                if done % 5000 == 0:
                    rate = done / (time.monotonic() - t0)
                    self.progress(f"fleet {start + done}/{target} ({rate:.0f} My/s)")
        finally:
            # On a failure or Ctrl-C, drop the queued creates rather than wait for them all.
            pool.shutdown(wait=True, cancel_futures=True)
        self.size = target
        return Growth(target - start, time.monotonic() - t0)
