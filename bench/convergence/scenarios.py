"""The five scenarios, each a function of (context, operator) -> figures.

All times are monotonic seconds measured by the bench; "observed" means a
watch event carrying the awaited state reached the bench's Observer.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .cluster import MY, BenchCluster
from .observer import Observer
from .operators import OperatorProcess
from .perobject import PerObject

MIB = 1024 * 1024
ENV_NAME = "FOO"


@dataclass
class Settings:
    replicas: int = 1
    load_threads: int = 16
    create_rate: float = 0.0               # My creates per second in a burst; 0: as fast as possible
    idle_seconds: float = 120.0
    latency_count: int = 50
    settle_quiet_seconds: float = 3.0     # no operator write for this long = settled
    settle_max_seconds: float = 180.0
    converge_timeout_seconds: float = 900.0


def my_object(name: str, env_value: str, replicas: int) -> dict:
    return {
        "apiVersion": "mine.jp/v1", "kind": "My",
        "metadata": {"name": name},
        "spec": {
            "image": "registry.example.com/team/app:1.0",
            "replicas": replicas,
            "port": 8080,
            "serviceType": "ClusterIP",
            "env": [{"name": ENV_NAME, "value": env_value}],
            "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "64Mi"}},
        },
    }


def names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:04d}" for i in range(count)]


# -- predicates over what the observer sees

def status_current(obj: dict) -> bool:
    status = obj.get("status") or {}
    return status.get("observedGeneration") == obj["metadata"].get("generation") and any(
        c.get("type") == "Ready" for c in status.get("conditions") or [])


def converged(kind: str, obj: dict) -> bool:
    """Deployment and Service exist; the My's status speaks of its current generation."""
    return kind != "my" or status_current(obj)


def env_value(deployment: dict) -> str | None:
    for container in deployment["spec"]["template"]["spec"].get("containers") or []:
        for item in container.get("env") or []:
            if item.get("name") == ENV_NAME:
                return item.get("value")
    return None


# -- helpers

def _parallel(threads: int, fn, items) -> float:
    """Run fn over items on a thread pool; seconds taken. Any failure is raised."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(fn, items):
            pass
    return time.monotonic() - t0


def kcm_done(deployment: dict) -> bool:
    """kube-controller-manager has seen this Deployment's spec and written its status."""
    return (deployment.get("status") or {}).get("observedGeneration") == \
        deployment["metadata"].get("generation")


def steady(observer: Observer) -> bool:
    """Nothing left for anyone to do: every Deployment's status is current, and every
    My's status is current and repeats its Deployment's replica counts."""
    with observer.lock:
        deployments = dict(observer.objects["deployment"])
        mys = list(observer.objects["my"].values())
    if not all(kcm_done(d) for d in deployments.values()):
        return False
    for my in mys:
        deployment = deployments.get(my["metadata"]["name"])
        status, counts = my.get("status") or {}, (deployment or {}).get("status") or {}
        if deployment is None or not status_current(my) or \
                status.get("replicas", 0) != counts.get("replicas", 0) or \
                status.get("readyReplicas", 0) != counts.get("readyReplicas", 0):
            return False
    return True


def settle(cluster: BenchCluster, observer: Observer, op: OperatorProcess, mark,
           settings: Settings) -> float:
    """Wait until all is steady and the operator has made no write for
    settle_quiet_seconds (bounded by settle_max_seconds): the follow-up status
    writes, as kube-controller-manager fills in the Deployments' status, belong
    to the phase that caused them, and the next phase starts quiet."""
    t0 = time.monotonic()
    last_writes, last_change = -1, t0
    while time.monotonic() - t0 < settings.settle_max_seconds:
        op.check_alive()
        writes = cluster.counter.since(mark).writes
        now = time.monotonic()
        if writes != last_writes:
            last_writes, last_change = writes, now
        elif now - last_change >= settings.settle_quiet_seconds and steady(observer):
            break
        time.sleep(0.5)
    return time.monotonic() - t0


def _counts(cluster, mark, objects: int) -> dict:
    counts = cluster.counter.since(mark)
    events = sum(n for what, n in counts.by_kind.items() if what.endswith(" events"))
    return {"writes": counts.writes, "writes_per_object": counts.writes / max(objects, 1),
            # Writes to the My and its children (Deployment, Service, status), Events apart.
            "object_writes_per_object": (counts.writes - events) / max(objects, 1),
            "events_per_object": events / max(objects, 1),
            "reads": counts.reads, "failed_writes": counts.failed_writes,
            "writes_by_kind": dict(sorted(counts.by_kind.items())),
            "server_ms_by_kind": server_ms(counts.server_seconds)}


def server_ms(seconds_by_kind: dict) -> dict:
    """{kind: {"p50": ms, "mean": ms}}: the apiserver's time for each kind of write."""
    out = {}
    for kind, seconds in sorted(seconds_by_kind.items()):
        if seconds:
            out[kind] = {"p50": round(statistics.median(seconds) * 1e3, 1),
                         "mean": round(statistics.fmean(seconds) * 1e3, 1)}
    return out


def _paced(threads: int, rate: float, fn, items) -> float:
    """fn(item) for item i at t0 + i / rate (all at once when rate is 0), on a thread
    pool so a slow answer does not delay the next create; seconds taken."""
    if not rate:
        return _parallel(threads, fn, items)
    t0 = time.monotonic()

    def at_its_time(indexed):
        index, item = indexed
        delay = t0 + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        fn(item)
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(at_its_time, enumerate(items)):
            pass
    return time.monotonic() - t0


# -- the scenarios

def burst(cluster: BenchCluster, observer: Observer, op: OperatorProcess, namespace: str,
          count: int, settings: Settings) -> dict:
    """Create `count` My objects (at settings.create_rate per second, or as fast as the
    apiserver takes them); time to all converged, overall and per object (perobject.py)."""
    todo = names("my", count)
    tracker = observer.track([(kind, n) for n in todo for kind in ("my", "deployment", "service")],
                             converged)
    each = observer.listen(PerObject(todo))
    mark, cpu0, plane0 = cluster.counter.mark(), op.cpu_seconds(), cluster.control_plane_cpu()

    def create(name: str) -> None:
        each.sent(name, time.monotonic())
        cluster.client.create(MY, my_object(name, "v0", settings.replicas), namespace=namespace)

    t0 = time.monotonic()
    creates = _paced(settings.load_threads, settings.create_rate, create, todo)
    if not tracker.wait(settings.converge_timeout_seconds) or \
            not each.wait_all_converged(settings.converge_timeout_seconds):
        raise TimeoutError(f"burst {count}: {len(tracker.pending)} of {3 * count} not "
                           f"observed, {len(each.pending())} statuses not converged after "
                           f"{settings.converge_timeout_seconds:.0f} s, e.g. "
                           f"{sorted(tracker.pending)[:3]} {each.pending()[:3]}")
    converge = tracker.last() - t0
    cpu_converged = op.cpu_seconds() - cpu0
    observer.untrack(tracker)
    settled = settle(cluster, observer, op, mark, settings)
    observer.untrack(each)
    by_kind = {kind: max(t for (k, _), t in tracker.seen.items() if k == kind) - t0
               for kind in ("deployment", "service", "my")}
    return {
        "converge_seconds": converge,
        "objects_per_second": count / converge,
        **each.figures(t0),
        "creates_seconds": creates,
        "last_deployment_seconds": by_kind["deployment"],
        "last_service_seconds": by_kind["service"],
        "last_status_seconds": by_kind["my"],
        "cpu_seconds_to_converge": cpu_converged,
        "cpu_seconds": op.cpu_seconds() - cpu0,          # including the settling writes
        "settle_seconds": settled,
        "peak_rss_mib": op.peak_rss_bytes() / MIB,
        "control_plane_cpu_seconds": cluster.control_plane_cpu() - plane0,
        **_counts(cluster, mark, count),
    }


def floor(cluster: BenchCluster, observer: Observer, namespace: str, count: int,
          settings: Settings) -> dict:
    """No operator: the bench itself creates each My and, at once, the Deployment and
    Service our controller would make (its own render functions, create-only applies,
    load_threads at a time). The time until kube-controller-manager has seen every
    Deployment is the earliest any operator could report the Mys' status on this
    machine: what no operator can go below, and what bounds the ratio to kopf."""
    from .floor_operator import make_children       # it imports my.render: the bench runs from ROOT

    todo = names("my", count)
    tracker = observer.track([("deployment", n) for n in todo],
                             lambda kind, obj: kind == "deployment" and kcm_done(obj))

    def make(name: str) -> None:
        my = cluster.client.create(MY, my_object(name, "v0", settings.replicas),
                                   namespace=namespace)
        make_children(cluster.client, my, namespace)

    plane0 = cluster.control_plane_cpu()
    t0 = time.monotonic()
    creates = _parallel(settings.load_threads, make, todo)
    if not tracker.wait(settings.converge_timeout_seconds):
        raise TimeoutError(f"floor {count}: {len(tracker.pending)} Deployments not seen by "
                           "kube-controller-manager in time")
    observer.untrack(tracker)
    return {"converge_seconds": tracker.last() - t0, "creates_seconds": creates,
            "objects_per_second": count / (tracker.last() - t0),
            "control_plane_cpu_seconds": cluster.control_plane_cpu() - plane0}


def idle(cluster: BenchCluster, op: OperatorProcess, settings: Settings) -> dict:
    """Nothing changes for idle_seconds: what does the operator write, and burn?"""
    mark, cpu0, plane0 = cluster.counter.mark(), op.cpu_seconds(), cluster.control_plane_cpu()
    deadline = time.monotonic() + settings.idle_seconds
    while time.monotonic() < deadline:
        op.check_alive()
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    counts = cluster.counter.since(mark)
    cpu = op.cpu_seconds() - cpu0
    return {"seconds": settings.idle_seconds, "writes": counts.writes, "reads": counts.reads,
            "writes_by_kind": dict(sorted(counts.by_kind.items())),
            "cpu_seconds": cpu, "cpu_percent": 100.0 * cpu / settings.idle_seconds,
            "rss_mib": op.rss_bytes() / MIB,
            "control_plane_cpu_seconds": cluster.control_plane_cpu() - plane0}


def latency(cluster: BenchCluster, observer: Observer, op: OperatorProcess, namespace: str,
            settings: Settings) -> dict:
    """One create at a time on an idle operator: create -> Deployment observed."""
    samples, status_samples = [], []
    for name in names("lat", settings.latency_count):
        deployment = observer.track([("deployment", name)], converged)
        status = observer.track([("my", name)], converged)
        t0 = time.monotonic()
        cluster.client.create(MY, my_object(name, "v0", settings.replicas), namespace=namespace)
        if not deployment.wait(30.0):
            raise TimeoutError(f"latency: Deployment {name} not observed within 30 s")
        samples.append(deployment.last() - t0)
        # create -> observedGeneration and a Ready condition; also lets it finish, so
        # the next create finds the operator idle
        if status.wait(30.0):
            status_samples.append(status.last() - t0)
        observer.untrack(deployment)
        observer.untrack(status)
        time.sleep(0.2)
        op.check_alive()
    ms = sorted(s * 1000.0 for s in samples)
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    status_ms = sorted(s * 1000.0 for s in status_samples)
    return {"count": len(ms), "p50_ms": statistics.median(ms), "p90_ms": cuts[89],
            "p99_ms": cuts[98], "min_ms": ms[0], "max_ms": ms[-1],
            "status_count": len(status_ms),
            "status_p50_ms": statistics.median(status_ms) if status_ms else None,
            "status_max_ms": status_ms[-1] if status_ms else None}


def churn(cluster: BenchCluster, observer: Observer, op: OperatorProcess, namespace: str,
          count: int, tag: str, settings: Settings) -> dict:
    """One spec update (an env value) to each of the first `count` objects."""
    todo = names("my", count)
    value = f"churn-{tag}"
    deployments = observer.track([("deployment", n) for n in todo],
                                 lambda kind, obj: env_value(obj) == value)
    statuses = observer.track([("my", n) for n in todo], lambda kind, obj: (
        obj["spec"]["env"][0].get("value") == value and status_current(obj)))
    mark, cpu0, plane0 = cluster.counter.mark(), op.cpu_seconds(), cluster.control_plane_cpu()
    t0 = time.monotonic()
    patch = {"spec": {"env": [{"name": ENV_NAME, "value": value}]}}
    updates = _parallel(settings.load_threads, lambda n: cluster.client.patch(
        MY, n, patch, namespace=namespace), todo)
    if not deployments.wait(settings.converge_timeout_seconds):
        raise TimeoutError(f"churn: {len(deployments.pending)} Deployments not updated after "
                           f"{settings.converge_timeout_seconds:.0f} s")
    converge = deployments.last() - t0
    statuses.wait(60.0)
    status_seconds = (statuses.last() - t0) if not statuses.pending else None
    observer.untrack(deployments)
    observer.untrack(statuses)
    settle(cluster, observer, op, mark, settings)
    return {"converge_seconds": converge, "updates_per_second": count / converge,
            "updates_seconds": updates, "status_seconds": status_seconds,
            "cpu_seconds": op.cpu_seconds() - cpu0,
            "control_plane_cpu_seconds": cluster.control_plane_cpu() - plane0,
            **_counts(cluster, mark, count)}


def startup(cluster: BenchCluster, observer: Observer, op: OperatorProcess,
            total_objects: int, settings: Settings, tag: str) -> dict:
    """A fresh process with `total_objects` My objects (and children) already there."""
    mark = cluster.counter.mark()
    op.start(tag)
    ready = op.wait_ready_for_startup(120.0)
    deadline = time.monotonic() + settings.converge_timeout_seconds
    while op.processed_count() < total_objects and time.monotonic() < deadline:
        op.check_alive()
        time.sleep(0.05)
    processed = op.processed_count()
    all_done = time.monotonic() - op.started_at if processed >= total_objects else None
    cpu = op.cpu_seconds()
    settle(cluster, observer, op, mark, settings)
    counts = cluster.counter.since(mark)
    return {"ready_seconds": ready, "all_processed_seconds": all_done,
            "processed": processed, "cpu_seconds_to_all_processed": cpu,
            "writes": counts.writes, "writes_by_kind": dict(sorted(counts.by_kind.items())),
            "peak_rss_mib": op.peak_rss_bytes() / MIB}
