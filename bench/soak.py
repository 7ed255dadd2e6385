"""Soak: 200 `My`s under steady churn, through a fault-injecting proxy, on the local control plane.

    .venv/bin/python -m bench soak                   # 20 minutes, writes RESULTS.soak.md
    .venv/bin/python -m bench soak --minutes 3 --no-markdown    # a quick look
    .venv/bin/python -m bench soak --shards 3 --minutes 60      # 3 sharded replicas: RESULTS.soak_sharded.md

What runs:

- a control plane of the project's own (etcd, kube-apiserver with an audit log,
  kube-controller-manager), started here;
- `controller.py --workers 4` watching one namespace, talking plain HTTP to
  `tests/support/faultproxy.py`, which re-originates to the apiserver over TLS;
- a load generator (straight to the apiserver): `--objects` `My`s, then for the
  whole run `--ops-per-second` operations: spec updates (an env value), a delete
  plus a create, and out-of-band deletes of the Deployment of one of the
  `--stable` `My`s that are never updated (the operator must repair them);
- the faults of `faultproxy.scenario()`, one every `--fault-every` seconds, in
  a cycle (resets, a silent watch, 410 events and answers, 429 with and without
  Retry-After, 503, lost write answers, 30 s of refused connections, an oversized
  line and malformed framing/lines), plus `--kills` SIGKILLs of kube-apiserver
  spread over the run;
- a sampler: the operator's RSS and thread count, /healthz, and whether the
  process is still the one that started (a process that exits is restarted and
  counted).

With `--shards N`, N replicas `controller.py --shards=auto` (each its own Pod
name) share the work through their member Leases, all through the proxy, so the
faults hit the ring's Lease renewals too; `--replica-kills K` restarts one
replica at a time during the run (SIGKILL and SIGTERM in turn, started again at
once under the same Pod name, as a kubelet restarts a container). The samples
add the replicas up; the audit log says which replica wrote what (its
User-Agent ends in `shard/<Pod name>`), so the run also reports the objects two
replicas wrote and the closest two such writes came to each other.

At the end the faults and the load stop, and the run waits (up to
`--settle-seconds`) for every `My` to converge: a Deployment whose env equals
the spec's, a Service, and a status for the current generation. Figures:
`My`s not converged and updates lost (goal 0), RSS and threads over time
(slope after `--warmup-minutes`), relists against injected 410s, operator writes
per repaired Deployment (from the audit log), process restarts (goal 0).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import random
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
from bench.convergence.cluster import (BENCH_USER_AGENT, MY, OPERATOR_USER,
                                       WRITE_VERBS, BenchCluster)
from bench.convergence.operators import OurOperator
from bench.convergence.scenarios import ENV_NAME, env_value as env_of
from bench.scaling.analysis import fit_line
from k8s_http.core.errors import K8sHttpError, NotFoundError
from k8s_http.core.objects import DEPLOYMENTS, SERVICES
from tests.support.faultproxy import FaultProxy, scenario
from bench import harness, soak_alloc

NAMESPACE = "soak"
RESULTS_JSON = HERE / "results" / "soak.json"
RESULTS_MD = HERE / "RESULTS.soak.md"
SHARDED_JSON = HERE / "results" / "soak_sharded.json"      # --shards: a section of its own
SHARDED_MD = HERE / "RESULTS.soak_sharded.md"


def my_object(name: str, value: str, replicas: int = 0) -> dict:
    return {"apiVersion": "mine.jp/v1", "kind": "My", "metadata": {"name": name},
            "spec": {"image": "registry.example.com/team/app:1.0", "replicas": replicas,
                     "port": 8080,
                     "env": [{"name": ENV_NAME, "value": value}]}}


def _retry(fn, *, attempts: int = 60, what: str = "") -> object:
    """The load generator's writes go straight to the apiserver, which is killed twice."""
    for i in range(attempts):
        try:
            return fn()
        except NotFoundError:
            raise
        except (K8sHttpError, OSError) as err:
            if i == attempts - 1:
                raise RuntimeError(f"{what}: {err}") from err
            time.sleep(0.5)


class Load:
    """Steady churn on the `My`s of one namespace, straight to the apiserver."""

    def __init__(self, client, objects: int, stable: int, ops_per_second: float, seed: int,
                 replicas: int = 0):
        self.client = client
        self.replicas = replicas
        self.rng = random.Random(seed)
        self.stable = [f"stable-{i:03d}" for i in range(stable)]
        self.churned = [f"my-{i:05d}" for i in range(objects - stable)]
        self.next_id = len(self.churned)
        self.ops_per_second = ops_per_second
        self.counts: collections.Counter = collections.Counter()
        self.repairs: list[tuple[float, str]] = []      # (time, stable name) of child deletes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def create_all(self) -> None:
        for name in self.stable + self.churned:
            _retry(lambda n=name: self.client.create(MY, my_object(n, "v0", self.replicas),
                                                      namespace=NAMESPACE),
                   what=f"create {name}")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def _run(self) -> None:
        period = 1.0 / self.ops_per_second
        while not self._stop.wait(period):
            roll = self.rng.random()
            try:
                if roll < 0.6:
                    self._update()
                elif roll < 0.9:
                    self._replace()
                else:
                    self._repair()
            except RuntimeError as err:      # the apiserver was down for 30 s: note, go on
                self.counts["failed"] += 1
                print(f"soak: load: {err}", flush=True)

    def _update(self) -> None:
        name = self.rng.choice(self.churned)
        value = f"v{self.counts['update'] + 1}"
        patch = {"spec": {"env": [{"name": ENV_NAME, "value": value}]}}
        try:
            _retry(lambda: self.client.patch(MY, name, patch, namespace=NAMESPACE),
                   what=f"update {name}")
            self.counts["update"] += 1
        except NotFoundError:
            pass

    def _replace(self) -> None:
        old = self.churned.pop(self.rng.randrange(len(self.churned)))
        try:
            _retry(lambda: self.client.delete(MY, old, namespace=NAMESPACE), what=f"delete {old}")
        except NotFoundError:
            pass
        self.counts["delete"] += 1
        new = f"my-{self.next_id:05d}"
        self.next_id += 1
        _retry(lambda: self.client.create(MY, my_object(new, "v0", self.replicas),
                                                      namespace=NAMESPACE),
               what=f"create {new}")
        self.churned.append(new)
        self.counts["create"] += 1

    def _repair(self) -> None:
        name = self.rng.choice(self.stable)
        try:
            _retry(lambda: self.client.delete(DEPLOYMENTS, name, namespace=NAMESPACE),
                   what=f"delete deployment {name}")
        except NotFoundError:
            return                           # not re-created yet since the last time
        self.repairs.append((time.monotonic(), name))
        self.counts["child_delete"] += 1


class Sampler:
    """RSS, threads and /healthz of the operators every `interval` s (added up, /healthz
    the first that is not 200); restarts one that exits. `lock`: held by whoever
    restarts an operator on purpose, so that its restart is not counted as an exit."""

    def __init__(self, operators: list[OurOperator], interval: float,
                 lock: threading.Lock | None = None):
        self.operators = operators
        self.interval = interval
        self.lock = lock or threading.Lock()
        self.samples: list[dict] = []
        self.restarts = 0
        self.healthz_failures = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No more samples or restarts. The thread itself lives on until release():
        an operator it restarted is tied to it (PR_SET_PDEATHSIG fires when the thread
        that forked the child ends), and must outlive it until the run is done with it."""
        self._stop.set()

    def release(self) -> None:
        self._stop.set()
        self._released.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            self._sample()
        finally:
            self._released.wait()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            with self.lock:
                sample = self._sample_all()
            if sample is not None:
                self.samples.append({"t": round(time.monotonic() - self._t0, 1), **sample})

    def _sample_all(self) -> dict | None:
        total: collections.Counter = collections.Counter()
        healthz = 200
        for op in self.operators:
            if not op.alive():
                self.restarts += 1
                print(f"soak: {op.label} exited ({op.proc.returncode}); restarting it",
                      flush=True)
                op.start(f"restart{self.restarts}")
                op.wait_started(120)
                return None
            try:
                total.update(soak_alloc.handles(op.pid))
            except OSError:
                return None
            answer = _http_status(f"http://127.0.0.1:{op.probe_port}/healthz")
            if answer != 200 and healthz == 200:
                healthz = answer
        if healthz != 200:
            self.healthz_failures += 1
        return {**total, "healthz": healthz}


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def slope_per_hour(samples: list[dict], key: str, after: float) -> float | None:
    """Least-squares slope of samples[key] over time (per hour), for samples after `after` s."""
    points = [(s["t"], s[key]) for s in samples if s["t"] >= after]
    if len(points) < 3:
        return None
    line = fit_line(points)
    return line.slope * 3600 if line else None


SCRAPED = ("k8s_http_", "controller_runtime_reconcile_total",
           "controller_runtime_reconcile_errors_total", "rest_client_requests_total")


def scrape(port: int, prefixes: tuple[str, ...] = SCRAPED, *, only: bool = False
           ) -> dict[str, float]:
    """The samples of /metrics whose names start with one of `prefixes`: "name{labels}" -> value.
    `only`: `prefixes` are whole sample names, and the operator is asked for those
    alone (`?name[]=`), so a frequent sample costs it no more than they do."""
    query = ("?" + "&".join(f"name[]={name}" for name in prefixes)) if only else ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics{query}", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefixes):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def check(client, namespace: str = NAMESPACE) -> dict:
    """Every My converged? (Deployment env == spec env, a Service, status of this generation)."""
    mys = client.list(MY, namespace=namespace)["items"]
    deployments = {d["metadata"]["name"]: d
                   for d in client.list(DEPLOYMENTS, namespace=namespace)["items"]}
    services = {s["metadata"]["name"] for s in client.list(SERVICES, namespace=namespace)["items"]}
    not_converged, lost, missing = [], [], []
    for my in mys:
        name = my["metadata"]["name"]
        want = my["spec"]["env"][0]["value"]
        deployment = deployments.get(name)
        status = my.get("status") or {}
        if deployment is None or name not in services:
            missing.append(name)
        elif env_of(deployment) != want:
            lost.append(name)
        if deployment is None or name not in services or env_of(deployment) != want or \
                status.get("observedGeneration") != my["metadata"].get("generation"):
            not_converged.append(name)
    names = {my["metadata"]["name"] for my in mys}
    orphans = sorted(set(deployments) - names) + sorted(services - names)
    return {"my": len(mys), "not_converged": sorted(not_converged), "updates_lost": sorted(lost),
            "children_missing": sorted(missing), "orphans": orphans}


def audit_events(audit_path: Path) -> Iterator[dict]:
    """The audit log's events, one per line (a line cut short by the apiserver's
    kill is skipped)."""
    with open(audit_path, "rb") as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue


def audit_figures(audit_path: Path, stable: list[str], repairs: int) -> dict:
    """Operator writes from the apiserver's audit log (the operator's requests carry its own
    User-Agent through the proxy; the load generator's carry BENCH_USER_AGENT).

    - writes per repair: every write on the Deployments of the stable `My`s
      (never updated by the load) beyond their first creation, per out-of-band delete;
    - writes on the children of a `My` after the load deleted that `My`: a stale
      cache fighting the garbage collector (the issue's "vanished child" loop).
    """
    stable_set = set(stable)
    stable_writes: collections.Counter = collections.Counter()
    my_deleted_at: dict[str, str] = {}
    child_writes: list[tuple[str, str, str]] = []     # (time, name, "verb resource")
    for event in audit_events(audit_path):
        if (event.get("user") or {}).get("username") != OPERATOR_USER:
            continue
        ref = event.get("objectRef") or {}
        verb, name, resource = event.get("verb"), ref.get("name"), ref.get("resource")
        if verb not in WRITE_VERBS or ref.get("subresource") or not name:
            continue
        at = event.get("requestReceivedTimestamp", "")
        if (event.get("userAgent") or "").startswith(BENCH_USER_AGENT):
            if resource == "my" and verb == "delete":
                my_deleted_at.setdefault(name, at)
            continue
        if resource == "deployments" and name in stable_set:
            stable_writes[verb] += 1
        if resource in ("deployments", "services"):
            child_writes.append((at, name, f"{verb} {resource}"))
    after_delete = collections.Counter()
    owners = set()
    for at, name, what in child_writes:
        # RFC 3339 timestamps of one clock, same format: they compare as strings.
        if name in my_deleted_at and at > my_deleted_at[name]:
            after_delete[what] += 1
            owners.add(name)
    return {
        "stable_deployment_writes": dict(stable_writes),
        # Each stable My's Deployment was created once; every other write is repair work.
        "writes_per_repair": ((sum(stable_writes.values()) - len(stable)) / repairs
                              if repairs else None),
        "writes_after_owner_deleted": dict(after_delete),
        "mys_with_writes_after_delete": len(owners),
        "mys_deleted": len(my_deleted_at),
    }


def restart_replica(operators: list, index: int, lock: threading.Lock,
                    at_s: int) -> dict:
    """The `index`th planned restart: SIGKILL (even) or SIGTERM (odd) of one replica
    in turn, started again at once under the same Pod name. Its new process joins the
    ring once the old process's member Lease is free: at once after SIGTERM (released),
    one Lease duration after SIGKILL."""
    op = operators[index % len(operators)]
    how = "SIGKILL" if index % 2 == 0 else "SIGTERM"
    with lock:                  # the sampler must not count (or restart) it meanwhile
        if how == "SIGKILL":
            op.proc.kill()
            op.proc.wait()
            op.stop()
        else:
            op.stop()
        op.start(f"restart{index + 1}")
    t0 = time.monotonic()
    op.wait_started(120)
    ready = time.monotonic() - t0
    print(f"soak: {at_s:5d} s  {how} {op.pod_name}: ready again after {ready:.1f} s", flush=True)
    return {"at_s": at_s, "replica": op.pod_name, "signal": how, "ready_after_s": round(ready, 1)}


SHARD_AGENT = re.compile(r"shard/([^\s/]+)")


def writers_figures(audit_path: Path) -> dict:
    """Which replica wrote each `My` and child (from the audit log: the User-Agent of a
    sharded replica ends in `shard/<Pod name>`): how many objects more than one replica
    wrote (slots move on every restart: expected), and the two writes by different
    replicas to one object that came closest in time (a handover waits for the old
    owner's in-flight reconciles, then the new owner lists before it writes)."""
    writes: dict[tuple[str, str], list[tuple[float, str]]] = collections.defaultdict(list)
    for event in audit_events(audit_path):
        ref = event.get("objectRef") or {}
        agent = SHARD_AGENT.search(event.get("userAgent") or "")
        if agent is None or event.get("verb") not in WRITE_VERBS or \
                ref.get("resource") not in ("my", "deployments", "services"):
            continue
        at = dt.datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
        writes[(ref["resource"], ref.get("name") or "")].append((at, agent.group(1)))
    closest = None
    shared = 0
    for key, seq in writes.items():
        seq.sort()
        if len({who for _, who in seq}) > 1:
            shared += 1
        for (t1, a), (t2, b) in zip(seq, seq[1:]):
            if a != b and (closest is None or t2 - t1 < closest[0]):
                closest = (t2 - t1, "/".join(key), a, b)
    return {"objects_written": len(writes), "objects_written_by_two_replicas": shared,
            "closest_writes_by_two_replicas": None if closest is None else {
                "seconds": round(closest[0], 3), "object": closest[1],
                "first": closest[2], "then": closest[3]}}


def proxied_namespace(cluster: BenchCluster, namespace: str, work: Path
                      ) -> tuple[FaultProxy, Path]:
    """The CRD and `namespace` on the cluster, and a fault proxy in front of its apiserver
    with a kubeconfig for the operator (work/operator.kubeconfig)."""
    cluster.install_crd(ROOT / "manifests" / "base" / "crd.yaml")
    cluster.create_namespace(namespace)
    proxy = FaultProxy(cluster.plane.server, cluster.plane.admin_ssl_context()).start()
    return proxy, proxy.write_kubeconfig(work / "operator.kubeconfig", namespace)


def run(args: argparse.Namespace) -> dict:
    # at the start: the code that ran, not what HEAD is at the end
    meta = harness.brief_metadata("soak", sys.argv[1:])
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="my-controller-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"soak: audit log, operator log and kubeconfig in {work}", flush=True)
    # bench.shards imports this module's scrape(): imported here, not at the top.
    from bench.shards import RING_NAMESPACE, ShardReplica, stop_all
    cluster = BenchCluster(work).start()
    proxy = None
    operators: list[OurOperator] = []
    sampler = None
    load = None
    try:
        plane = cluster.plane
        proxy, kubeconfig = proxied_namespace(cluster, NAMESPACE, work)
        traces = work / "tracemalloc"
        if args.shards:
            cluster.create_namespace(RING_NAMESPACE)
            operators = [ShardReplica(kubeconfig, NAMESPACE, work, workers=args.workers,
                                      python=sys.executable, pod_name=f"soak-{chr(97 + i)}")
                         for i in range(args.shards)]
        else:
            operators = [OurOperator(kubeconfig, NAMESPACE, work, workers=args.workers,
                                     python=sys.executable,
                                     trace_to=traces if args.snapshot_minutes else None)]
        operator = operators[0]
        for op in operators:
            op.start("soak")
        for op in operators:
            op.wait_started(120)
        load = Load(cluster.client, args.objects, args.stable, args.ops_per_second, args.seed,
                    args.replicas)
        t_create = time.monotonic()
        load.create_all()
        print(f"soak: {args.objects} My created in {time.monotonic() - t_create:.0f} s; "
              f"running {args.minutes:g} min", flush=True)
        restarting = threading.Lock()
        sampler = Sampler(operators, args.sample_seconds, restarting)
        sampler.start()
        load.start()

        steps = scenario(refuse_seconds=args.refuse_seconds)
        duration = args.minutes * 60
        kill_at = [duration * (i + 1) / (args.kills + 1) for i in range(args.kills)]
        kills = []
        # Replica restarts evenly spread, the first half a spacing in (apart from the
        # apiserver's kills, which fall on whole spacings of their own).
        restart_at = [duration * (i + 0.5) / (args.replica_kills + 0.5)
                      for i in range(args.replica_kills if args.shards else 0)]
        restarts: list[dict] = []
        t0 = time.monotonic()
        next_fault, index, applied = t0 + args.fault_every, 0, []
        intervals: list[dict] = []
        snapshot_every = args.snapshot_minutes * 60
        next_snapshot = t0 if snapshot_every else float("inf")

        def snapshot(at: float) -> None:
            pid = operator.pid
            taken = sum(1 for i in intervals if i["pid"] == pid)
            path = soak_alloc.take(pid, traces, taken)
            if path is None:
                print("soak: no tracemalloc snapshot within 120 s", flush=True)
                return
            now = soak_alloc.handles(pid)
            intervals.append({"t": round(at - sampler._t0, 1), "pid": pid,
                              "snapshot": str(path), **now})
            print(f"soak: {at - t0:5.0f} s  snapshot: {now}", flush=True)

        while (now := time.monotonic()) - t0 < duration:
            if now >= next_snapshot:
                snapshot(now)
                next_snapshot += snapshot_every
            elif restart_at and now - t0 >= restart_at[0]:
                restart_at.pop(0)
                restarts.append(restart_replica(operators, len(restarts), restarting,
                                                round(now - t0)))
            elif kill_at and now - t0 >= kill_at[0]:
                kill_at.pop(0)
                took = plane.restart_apiserver()
                kills.append({"at_s": round(now - t0), "back_after_s": round(took, 1)})
                print(f"soak: kube-apiserver killed at {now - t0:.0f} s, back after {took:.1f} s",
                      flush=True)
            elif now >= next_fault:
                what, apply = steps[index % len(steps)]
                apply(proxy)
                applied.append({"at_s": round(now - t0), "fault": what})
                print(f"soak: {now - t0:5.0f} s  {what}", flush=True)
                index += 1
                next_fault = now + args.fault_every
            time.sleep(0.5)

        if snapshot_every:
            snapshot(time.monotonic())
        load.stop()
        proxy.disarm()
        t_end = time.monotonic()
        result = check(cluster.client)
        while (result["not_converged"] or result["orphans"]) and \
                time.monotonic() - t_end < args.settle_seconds:
            time.sleep(5)
            result = check(cluster.client)
        settle = time.monotonic() - t_end
        sampler.stop()
        per_replica = [scrape(op.metrics_port) for op in operators]
        metrics: dict[str, float] = {}     # added up over the replicas, zeros kept
        for sample in per_replica:
            for key, value in sample.items():
                metrics[key] = metrics.get(key, 0.0) + value
        stop_all(operators)
        exit_code = operator.proc.returncode if len(operators) == 1 else \
            [op.proc.returncode for op in operators]
        sampler.release()
        repairs = len(load.repairs)
        last_pid = intervals[-1]["pid"] if intervals else None
        allocation = soak_alloc.allocation_report(
            [i for i in intervals if i["pid"] == last_pid],
            args.warmup_minutes * 60) if intervals else {}
        relists = {k: v for k, v in metrics.items() if k.startswith("k8s_http_informer_relists")}
        injected_410 = {r: proxy.injected_on[("gone_event", r)] + proxy.injected_on[("gone_watch", r)]
                        for r in ("my", "deployments", "services")}
        return {
            "meta": meta,
            "settings": {k: str(v) if isinstance(v, Path) else v
                         for k, v in vars(args).items() if k not in ("markdown",)},
            "load": dict(load.counts),
            "faults_applied": applied,
            "injected": dict(proxy.injected),
            "injected_410_by_resource": injected_410,
            "apiserver_kills": kills,
            **({"replica_restarts": restarts,
                "slots_held_at_end": {op.pod_name: m.get("k8s_http_shard_slots_held")
                                      for op, m in zip(operators, per_replica)},
                **writers_figures(work / "audit.log")} if args.shards else {}),
            "end": {**result, "settle_seconds": round(settle, 1)},
            "process": {"restarts": sampler.restarts, "exit_code_on_sigterm": exit_code,
                        "healthz_not_200_samples": sampler.healthz_failures},
            "samples": sampler.samples,
            "intervals": intervals,
            "allocation": allocation,
            "rss_slope_mib_per_hour": slope_per_hour(sampler.samples, "rss_mib",
                                                     args.warmup_minutes * 60),
            "threads_slope_per_hour": slope_per_hour(sampler.samples, "threads",
                                                     args.warmup_minutes * 60),
            "relists": relists,
            "metrics": metrics,
            "repairs": repairs,
            "audit_log": str(work / "audit.log"),
            **audit_figures(work / "audit.log", load.stable, repairs),
            "proxy_requests": dict(proxy.requests),
        }
    finally:
        if load is not None:
            load.stop()
        if sampler is not None:
            sampler.stop()
        if any(op.alive() for op in operators):
            stop_all(operators)
        if sampler is not None:
            sampler.release()
        if proxy is not None:
            proxy.stop()
        cluster.stop()


def _labels(key: str) -> dict[str, str]:
    """'name{a="x",b="y"}' -> {"a": "x", "b": "y"}."""
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', key))


def _shard_rows(data: dict) -> list[str]:
    """The sharded soak's own rows (--shards)."""
    if "replica_restarts" not in data:
        return []
    closest = data["closest_writes_by_two_replicas"]
    restarts = data["replica_restarts"]
    return [
        f"| replicas (`--shards=auto`), planned restarts | {data['settings']['shards']}, "
        f"{len(restarts)}: " + ", ".join(f"{r['signal']} {r['replica']} at {r['at_s']} s "
                                         f"(ready again after {r['ready_after_s']} s)"
                                         for r in restarts) + " | |",
        f"| slots held at the end | {data['slots_held_at_end']} | 256 in all |",
        f"| objects written by two replicas (of {data['objects_written']}) | "
        f"{data['objects_written_by_two_replicas']} | slots move at each restart |",
        "| the closest two writes by two replicas to one object | "
        + ("none" if closest is None else
           f"{closest['seconds']:.3f} s ({closest['object']}: {closest['first']}, then "
           f"{closest['then']})") + " | not at once |",
    ]


def markdown(data: dict) -> str:
    meta, end, proc = data["meta"], data["end"], data["process"]
    samples = data["samples"]
    warm = data["settings"]["warmup_minutes"] * 60
    after = [s for s in samples if s["t"] >= warm]
    rss_slope, thr_slope = data["rss_slope_mib_per_hour"], data["threads_slope_per_hour"]

    def fmt(x, unit=""):
        return "n/a" if x is None else f"{x:+.1f}{unit}"

    relists = data["relists"]
    relist_total = sum(relists.values())
    restarts, decode = collections.Counter(), collections.Counter()
    for key, value in data["metrics"].items():
        labels = _labels(key)
        if key.startswith("k8s_http_watch_restarts_total{"):
            restarts[labels["reason"]] += value
        elif key.startswith("k8s_http_watch_decode_errors_total{"):
            decode[labels["kind"]] += value
    injected = data["injected"]
    n410 = injected.get("gone_event", 0) + injected.get("gone_watch", 0)
    per_res = ", ".join(f"{r}: {n}" for r, n in data["injected_410_by_resource"].items())
    relist_by_res = ", ".join(f"{_labels(k)['resource']}: {v:g}"
                              for k, v in sorted(relists.items()))
    timeline = [samples[0]] if samples else []
    step = max(1, len(samples) // 10)
    timeline += samples[step::step]
    lines = [
        f"## Soak: {data['settings']['objects']} `My`s under churn through a fault-injecting "
        "proxy" + (f", {data['settings']['shards']} sharded replicas"
                   if data["settings"].get("shards") else ""),
        "",
        f"Generated by `{meta['command']}` on {meta['date']} (git {meta['git']}); "
        f"{meta['machine']}, Python {meta['python']}, load average at start "
        f"{meta['loadavg'][0]:.1f}. The machine was shared with other agents' work.",
        "",
        f"{data['settings']['objects']} `My`s ({data['settings']['stable']} of them never "
        f"updated, for out-of-band child deletes) in one namespace, "
        + (f"{data['settings']['shards']} replicas `controller.py --shards=auto --workers "
           f"{data['settings']['workers']}`" if data["settings"].get("shards") else
           f"`controller.py --workers {data['settings']['workers']}`") + " through "
        "`tests/support/faultproxy.py`, "
        f"{data['settings']['minutes']:g} minutes at {data['settings']['ops_per_second']:g} "
        f"operations/s: {data['load'].get('update', 0)} spec updates, "
        f"{data['load'].get('delete', 0)} deletes + {data['load'].get('create', 0)} creates, "
        f"{data['load'].get('child_delete', 0)} Deployments deleted out of band "
        f"({data['load'].get('failed', 0)} load operations failed against the killed "
        "apiserver). One fault every "
        f"{data['settings']['fault_every']:g} s from `faultproxy.scenario()` in a cycle "
        f"({len(data['faults_applied'])} applied), plus {len(data['apiserver_kills'])} "
        "SIGKILLs of kube-apiserver.",
        "",
        "| figure | result | goal |",
        "|---|---|---|",
        f"| `My`s not converged at the end (of {end['my']}) | **{len(end['not_converged'])}** "
        f"(settled {end['settle_seconds']:.0f} s after the load stopped) | 0 |",
        f"| updates lost (Deployment env ≠ spec at the end) | **{len(end['updates_lost'])}** | 0 |",
        f"| children missing / orphans at the end | {len(end['children_missing'])} / "
        f"{len(end['orphans'])} | 0 / 0 |",
        f"| process restarts (exits) | **{proc['restarts']}** | 0 |",
        f"| /healthz not 200 (samples every {data['settings']['sample_seconds']:g} s) | "
        f"{proc['healthz_not_200_samples']} of {len(samples)} | 0 |",
        f"| RSS after warm-up ({data['settings']['warmup_minutes']:g} min), min / max | "
        + (f"{min(s['rss_mib'] for s in after):.1f} / {max(s['rss_mib'] for s in after):.1f} MiB"
           if after else "n/a") + " | flat |",
        f"| RSS slope after warm-up; over the second half only | {fmt(rss_slope, ' MiB/h')}; "
        f"**{fmt(slope_per_hour(samples, 'rss_mib', samples[-1]['t'] / 2) if samples else None, ' MiB/h')}**"
        " | ≤ 1 MiB/h over the last hour of 2 h |",
        f"| threads after warm-up, min / max; slope | "
        + (f"{min(s['threads'] for s in after)} / {max(s['threads'] for s in after)}; "
           if after else "n/a; ") + f"{fmt(thr_slope, '/h')} | flat |",
        *([f"| open fds / sockets after warm-up, min / max | "
           f"{min(s['fds'] for s in after)} / {max(s['fds'] for s in after)}; "
           f"{min(s['sockets'] for s in after)} / {max(s['sockets'] for s in after)} | flat |"]
          if after and "fds" in after[0] else []),
        f"| relists (initial lists included) vs injected 410s | {relist_total:g} "
        f"({relist_by_res}) vs {n410} ({per_res}) | initial + 410s (+ kills) |",
        f"| operator writes per repaired Deployment | "
        + ("n/a" if data["writes_per_repair"] is None else f"**{data['writes_per_repair']:.2f}**")
        + f" ({data['repairs']} repairs; writes on those Deployments: "
        f"{data['stable_deployment_writes']}) | 1 |",
        f"| operator writes on the children of a `My` after it was deleted (stale cache vs "
        f"the garbage collector) | **{sum(data.get('writes_after_owner_deleted', {}).values())}**"
        f" on {data.get('mys_with_writes_after_delete', 'n/a')} of "
        f"{data.get('mys_deleted', 'n/a')} deleted `My`s "
        f"({data.get('writes_after_owner_deleted', {})}) | 0 |",
        f"| exit code on SIGTERM at the end | {proc['exit_code_on_sigterm']} | 0 |",
        *_shard_rows(data),
        "",
        "Faults applied by the proxy (times): "
        + ", ".join(f"{k} {v}" for k, v in sorted(injected.items())) + ". From the "
        "operator's /metrics at the end, watch restarts by reason (all resources): "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(restarts.items()) if v)
        + "; decode errors by kind: "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(decode.items()) if v) + ".",
        "",
        *([] if not data.get("audit_recomputed") else [
            "The audit-log figures were recomputed after the run, from its audit log, by "
            "`bench/soak.py --from-json bench/results/soak.json --audit-log AUDIT_LOG` "
            "(the writes-after-delete figure was added to the script after this run started).",
            ""]),
        *([] if not sum(data.get("writes_after_owner_deleted", {}).values()) else [
            "Writes on the children of a deleted `My`: the stale-cache loop of issue 15 item 3 "
            "(while the `My` watch is down or silent, a `My` deleted meanwhile is still cached, "
            "and each child the garbage collector removes would be re-created about once a "
            "second). The controller re-creates a vanished child only after a live read shows "
            "its `My` with the same uid; what remains is the race of a `My` deleted right "
            "after that read (the run before the guard, at git c6cf108, counted 25,354 such "
            "writes on 295 of 599 deleted `My`s).",
            ""]),
        "apiserver kills: " + ", ".join(f"at {k['at_s']} s (back after {k['back_after_s']} s)"
                                        for k in data["apiserver_kills"]) + ".",
        "",
        "RSS and threads over time:",
        "",
        "| t (s) | RSS (MiB) | threads | /healthz |",
        "|---|---|---|---|",
        *[f"| {s['t']:.0f} | {s['rss_mib']:.1f} | {s['threads']} | {s['healthz']} |"
          for s in timeline],
        "",
        *soak_alloc.markdown(data),
        *[line for note in data.get("notes") or [] for line in (note, "")],
        "Raw data: `bench/results/"
        + ("soak_sharded.json" if data["settings"].get("shards") else "soak.json") + "`.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="duration of the churn")
    p.add_argument("--snapshot-minutes", type=float, default=10.0,
                   help="a tracemalloc snapshot of the operator every N minutes (0: none, "
                        "and the operator runs without tracemalloc; none with --shards)")
    p.add_argument("--replicas", type=int, default=1,
                   help="spec.replicas of each My (1: Pods, on the plane with kwok)")
    p.add_argument("--objects", type=int, default=200)
    p.add_argument("--stable", type=int, default=20,
                   help="My never updated; their Deployments are deleted out of band")
    p.add_argument("--ops-per-second", type=float, default=2.0)
    p.add_argument("--fault-every", type=float, default=25.0, help="seconds between faults")
    p.add_argument("--refuse-seconds", type=float, default=30.0)
    p.add_argument("--kills", type=int, default=2, help="kube-apiserver SIGKILLs")
    p.add_argument("--shards", type=int, default=0,
                   help="N replicas with --shards=auto instead of one operator (0: one)")
    p.add_argument("--replica-kills", type=int, default=3,
                   help="with --shards: replica restarts (SIGKILL, SIGTERM in turn)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--warmup-minutes", type=float, default=5.0)
    p.add_argument("--settle-seconds", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--work-dir", default=None, help="default: a new temporary directory")
    p.add_argument("--out", type=Path, default=None,
                   help=f"default {RESULTS_JSON.name} ({SHARDED_JSON.name} with --shards)")
    p.add_argument("--no-markdown", dest="markdown", action="store_false",
                   help=f"do not write {RESULTS_MD.name} ({SHARDED_MD.name} with --shards)")
    p.add_argument("--note", action="append", default=[],
                   help="a paragraph for the section (kept in the JSON)")
    p.add_argument("--from-json", type=Path, default=None,
                   help="only write the markdown from an earlier run's JSON")
    p.add_argument("--audit-log", type=Path, default=None,
                   help="with --from-json: recompute the audit-log figures from this file")
    args = p.parse_args(argv)
    if args.shards:
        args.snapshot_minutes = 0
    args.out = args.out or (SHARDED_JSON if args.shards else RESULTS_JSON)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        if args.audit_log:
            stable = [f"stable-{i:03d}" for i in range(data["settings"]["stable"])]
            data.update(audit_figures(args.audit_log, stable, data["repairs"]),
                        audit_log=str(args.audit_log))
            data["audit_recomputed"] = True
        if args.note:
            data["notes"] = args.note
        if args.audit_log or args.note:
            args.from_json.write_text(json.dumps(data, indent=1) + "\n")
    else:
        data = run(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"soak: wrote {args.out}", flush=True)
    if data.get("intervals"):
        for path in soak_alloc.write_svgs(data, args.out.parent):
            print(f"soak: wrote {path}", flush=True)
    text = markdown(data)
    print(text)
    if args.markdown:
        path = SHARDED_MD if data["settings"].get("shards") else RESULTS_MD
        path.write_text(text)
        print(f"soak: wrote {path}")
    end = data["end"]
    ok = not end["not_converged"] and not end["updates_lost"] and not data["process"]["restarts"]
    return 0 if ok else 1
