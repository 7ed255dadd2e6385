"""What a user waits for: create -> `My` Ready=True, reason Available (the app up).

On the plane with Pods (kube-scheduler places them on kwok's fake Nodes, which
make them Running and Ready at once), each `My` goes

    created -> Deployment exists -> Deployment available -> My Ready=True Available
              (operator)           (the plane: ReplicaSet,  (operator: reports it)
                                    Pod, schedule, kwok)

and the operator's share of the wait is the first leg plus the last:

    operator-added = (create -> Deployment exists) + (Deployment available -> My Ready)

"Deployment available" is the first version of the Deployment, as the bench's
watch sees it, whose status makes Ready=True by SPEC.md (the Deployment
controller has observed its generation, every desired replica updated and
ready: perobject.expected_ready), i.e. the version the operator reports on. The
two legs are timed from the bench's own watches of Deployments and `My`, two
streams, so the last leg can come out a few ms below zero when the `My` event
overtakes the Deployment's; such values are kept as measured.

Loads (`Load`): one at a time (each create waits for the previous `My` to be
Ready, then 0.2 s), or N creates paced at a rate. Per load and operator, beside
the per-object times: the operator's CPU, reconciles and requests (audit log)
per `My`, the writes from the first create until every `My` is Ready, and the
plane's CPU per `My` by process (from /proc: kube-apiserver + etcd is "plane
CPU"; kube-controller-manager, kube-scheduler and kwok apart), raw and above the
plane's quiet rate measured just before.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

from .cluster import MY, BenchCluster
from .observer import Observer
from .operators import OperatorProcess
from .perobject import _quantile as quantile
from .perobject import expected_ready, ready_condition

PLANE = ("kube-apiserver", "etcd")            # "plane CPU": what every request costs
LEGS = ("ready", "deployment", "available", "available_to_ready", "operator_added")


@dataclass(frozen=True)
class Load:
    count: int
    rate: float | None                # creates per second; None: one at a time

    @property
    def key(self) -> str:
        return f"ready_{self.count}_" + ("serial" if self.rate is None else f"{self.rate:g}ps")

    @property
    def title(self) -> str:
        return f"{self.count} one at a time" if self.rate is None else \
            f"{self.count} at {self.rate:g}/s"


def parse_loads(text: str) -> list[Load]:
    """"100@serial,200@5,400@20" -> loads: COUNT@serial (one at a time) or COUNT@RATE
    (creates per second)."""
    loads = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        count, _, rate = part.partition("@")
        if not count.isdigit() or int(count) < 1 or not rate:
            raise ValueError(f"bad load {part!r}: COUNT@serial or COUNT@RATE")
        loads.append(Load(int(count), None if rate == "serial" else float(rate)))
        if loads[-1].rate is not None and loads[-1].rate <= 0:
            raise ValueError(f"bad load {part!r}: the rate must be > 0")
    if not loads:
        raise ValueError("no load given")
    return loads


def my_ready(my: dict) -> bool:
    """Ready=True, reason Available, at the current generation."""
    cond = ready_condition(my)
    return cond is not None and cond.get("status") == "True" and \
        cond.get("reason") == "Available" and \
        (my.get("status") or {}).get("observedGeneration") == my["metadata"].get("generation")


class ReadyPerObject:
    """An Observer listener: per `My`, when it was created, its Deployment first seen,
    first seen available, and the `My` first seen Ready=True Available."""

    def __init__(self, names):
        self.names = set(names)
        self.created: dict[str, float] = {}
        self.deployment: dict[str, float] = {}
        self.available: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        # Versions of each kind seen, all objects together: what wakes the operators
        # (each Deployment or Service version, each My version they do not filter out).
        self.versions = {"my": 0, "deployment": 0, "service": 0}
        self._changed = threading.Condition()

    def sent(self, name: str, at: float) -> None:
        self.created[name] = at

    def offer(self, kind: str, obj: dict, at: float) -> None:
        name = obj["metadata"]["name"]
        if name not in self.names:
            return
        if kind in self.versions:
            self.versions[kind] += 1
        if kind == "deployment":
            self.deployment.setdefault(name, at)
            if name not in self.available and expected_ready(obj):
                self.available[name] = at
        elif kind == "my" and name not in self.ready and my_ready(obj):
            self.ready[name] = at
            with self._changed:
                self._changed.notify_all()

    def wait_ready(self, names, timeout_seconds: float) -> bool:
        deadline = time.monotonic() + timeout_seconds
        with self._changed:
            while not all(n in self.ready for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))
        return True

    def pending(self) -> list[str]:
        return sorted(self.names - set(self.ready))

    def legs(self) -> dict[str, list[float]]:
        """Seconds per object for each leg, over the objects that got through them all."""
        out: dict[str, list[float]] = {leg: [] for leg in LEGS}
        for n in sorted(self.names):
            if not all(n in d for d in (self.created, self.deployment, self.available,
                                        self.ready)):
                continue
            c, d, a, r = self.created[n], self.deployment[n], self.available[n], self.ready[n]
            out["ready"].append(r - c)
            out["deployment"].append(d - c)
            out["available"].append(a - c)
            out["available_to_ready"].append(r - a)
            out["operator_added"].append((d - c) + (r - a))
        return out

    def figures(self) -> dict:
        out: dict = {}
        for leg, values in self.legs().items():
            if not values:
                continue
            values.sort()
            out[f"{leg}_p50_ms"] = statistics.median(values) * 1e3
            out[f"{leg}_p99_ms"] = quantile(values, 0.99) * 1e3
            out[f"{leg}_max_ms"] = values[-1] * 1e3
        return out


def plane_rate(cluster: BenchCluster, seconds: float = 3.0) -> dict[str, float]:
    """CPU seconds per second of each plane process over `seconds` (the background:
    leases, kwok's Node heartbeats, kube-controller-manager's resyncs)."""
    before, t0 = cluster.process_cpu(), time.monotonic()
    time.sleep(seconds)
    after, wall = cluster.process_cpu(), time.monotonic() - t0
    return {k: (after[k] - before[k]) / wall for k in after if k in before}


def run_load(cluster: BenchCluster, observer: Observer, op: OperatorProcess, namespace: str,
             load: Load, settings, quiet_rate: dict[str, float]) -> dict:
    """Create load.count My (one at a time, or paced at load.rate) and wait until every
    one is Ready=True Available; then let the writes settle. Figures: see the module doc."""
    from .scenarios import _paced, my_object, names, server_ms, settle

    todo = names("my", load.count)
    each = observer.listen(ReadyPerObject(todo))
    mark, cpu0, rec0 = cluster.counter.mark(), op.cpu_seconds(), op.processed_count()
    plane0 = cluster.process_cpu()
    timeout = settings.converge_timeout_seconds

    def create(name: str) -> None:
        each.sent(name, time.monotonic())
        cluster.client.create(MY, my_object(name, "v0", settings.replicas), namespace=namespace)

    t0 = time.monotonic()
    if load.rate is None:
        for name in todo:
            create(name)
            if not each.wait_ready([name], 60.0):
                raise TimeoutError(f"{load.title}: {name} not Ready=True Available in 60 s")
            time.sleep(0.2)
            op.check_alive()
        creates = time.monotonic() - t0
    else:
        creates = _paced(settings.load_threads, load.rate, create, todo)
    if not each.wait_ready(todo, timeout):
        raise TimeoutError(f"{load.title}: {len(each.pending())} My not Ready=True Available "
                           f"after {timeout:.0f} s, e.g. {each.pending()[:3]}")
    all_ready = max(each.ready.values()) - t0
    # The requests and CPU from the first create until every My was Ready (the
    # observer's last Ready event), then the rest until the writes settle.
    to_ready = cluster.counter.since(mark)
    cpu_ready, rec_ready = op.cpu_seconds() - cpu0, op.processed_count() - rec0
    plane_ready, wall_ready = cluster.process_cpu(), time.monotonic() - t0
    settled = settle(cluster, observer, op, mark, settings)
    observer.untrack(each)
    total = cluster.counter.since(mark)
    plane1, wall = cluster.process_cpu(), time.monotonic() - t0
    n = load.count
    events = sum(v for k, v in to_ready.by_kind.items() if k.endswith(" events"))
    used = {k: plane1[k] - plane0[k] for k in plane1 if k in plane0}
    used_ready = {k: plane_ready[k] - plane0[k] for k in plane_ready if k in plane0}
    plane = sum(used.get(k, 0.0) for k in PLANE)
    background = sum(quiet_rate.get(k, 0.0) for k in PLANE) * wall
    return {
        "count": n, "rate": load.rate,
        **each.figures(),
        "creates_seconds": creates,
        "achieved_create_rate": n / creates if creates else None,
        "all_ready_seconds": all_ready,
        "settle_seconds": settled,
        "wall_seconds": wall,
        "cpu_seconds_to_ready": cpu_ready,
        "cpu_seconds": op.cpu_seconds() - cpu0,
        "cpu_ms_per_my": (op.cpu_seconds() - cpu0) / n * 1e3,
        "reconciles_to_ready_per_my": rec_ready / n,
        "reconciles_per_my": (op.processed_count() - rec0) / n,
        "writes_to_ready_per_my": to_ready.writes / n,
        "writes_per_my": total.writes / n,
        # The Deployment, Service and My status writes (Events apart): item 5's writes.
        "object_writes_to_ready_per_my": (to_ready.writes - events) / n,
        "events_per_my": events / n,
        **{f"{kind}_versions_per_my": seen / n for kind, seen in each.versions.items()},
        "failed_writes": total.failed_writes,
        "requests_per_my": (total.writes + total.reads) / n,
        "reads_per_my": total.reads / n,
        "writes_by_kind_to_ready": dict(sorted(to_ready.by_kind.items())),
        "writes_by_kind": dict(sorted(total.by_kind.items())),
        "reads_by_kind": dict(sorted(total.reads_by_kind.items())),
        "server_ms_by_kind": server_ms(total.server_seconds),
        "plane_cpu_seconds": plane,
        "plane_cpu_ms_per_my": plane / n * 1e3,
        "plane_cpu_net_ms_per_my": max(0.0, plane - background) / n * 1e3,
        "plane_quiet_cores": sum(quiet_rate.get(k, 0.0) for k in PLANE),
        # How busy the plane was until every My was Ready, in cores: near 1 per
        # process (or 2 for all of them on this 2-core machine) it is saturated.
        "plane_cores_to_ready": {k: v / wall_ready for k, v in sorted(used_ready.items())},
        "process_cpu_seconds": dict(sorted(used.items())),
    }
