"""Memory kept per write: RSS of an operator that created N My's children itself vs one
started over the same converged fleet (issue 17: "nothing kept per write").

    python -m bench write_memory --sizes 1000,5000 [--diagnose] [--out FILE.json]

For each size, on a fresh local control plane with no kube-controller-manager (so no
Deployment controller, no ReplicaSets or Pods; the Deployments' status stays empty):

  1. "created": start controller.py over an empty namespace, wait for /readyz and
     take the idle RSS; create N My; wait until every My's status reports its
     generation and no reconcile has finished for QUIET seconds; take the RSS.
  2. "started": start a new controller.py over the same converged fleet; wait for
     /readyz, N reconciles and QUIET seconds without one; take the RSS.

KB per My = (RSS - idle RSS of the same process) / N, the My and its two children.
With --diagnose the operator runs under this file's `--operator` mode, which on
SIGUSR1 writes to its log: /proc/self/status, glibc's mallinfo2 (heap in use vs
free but not returned), the length of every per-key map the runtime keeps, and
with --tracemalloc the top allocation sites.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_JSON = ROOT / "bench" / "results" / "write_memory.json"
RESULTS_MD = ROOT / "bench" / "RESULTS.write_memory.md"

QUIET = 5.0
KIB = 1024


# ---------------------------------------------------------------------------
# --operator mode: controller.main with a SIGUSR1 report


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo() -> dict:
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"heap_bytes": info.arena + info.hblkhd, "in_use_bytes": info.uordblks + info.hblkhd,
            "free_bytes": info.fordblks, "top_releasable_bytes": info.keepcost}


def _pymalloc() -> dict:
    """sys._debugmallocstats' totals: pymalloc's arenas (small objects) and their use."""
    import tempfile
    with tempfile.TemporaryFile("w+") as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read()
    out = {}
    for line in text.splitlines():
        for key in ("# arenas allocated current", "# bytes in allocated blocks",
                    "# bytes in available blocks", "Total"):
            if line.startswith(key):
                out[key.lstrip("# ")] = int(line.split("=")[-1].replace(",", "").strip())
    return out


def _mappings() -> dict:
    """Anonymous RSS by kind of mapping: the brk heap, 64 MiB thread-arena heaps, the rest."""
    kinds: dict[str, int] = {}
    kind = None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                name = fields[5] if len(fields) > 5 else ""
                size = end - start
                kind = ("[heap]" if name == "[heap]" else "file" if name.startswith("/")
                        else name or ("arena-heaps" if size == 64 << 20 or start % (64 << 20) == 0
                                      else "anon"))
            elif fields[0] == "Rss:":
                kinds[kind] = kinds.get(kind, 0) + int(fields[1])
    return {k: f"{v} kB" for k, v in kinds.items()}


def _trim() -> str:
    libc = ctypes.CDLL(None)
    libc.malloc_trim(0)
    return _status()["VmRSS"]


def _status() -> dict:
    with open("/proc/self/status") as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)
                if k in ("VmRSS", "VmHWM", "RssAnon", "Threads")}


def _maps(reconciler, mgr) -> dict:
    out = {}
    for (resource, _), informer in mgr._informers.items():
        store = informer.store
        out[f"store[{resource}]"] = {"objects": len(store), "written": len(store._written),
                                     "recent": len(store._recent),
                                     "inflight": len(store._inflight)}
    for ctrl in mgr._controllers:
        queue = ctrl.queue
        out[f"queue[{ctrl.name}]"] = {k: len(v) for k, v in vars(queue).items()
                                      if isinstance(v, (dict, set, list))}
        limiter = getattr(queue, "_limiter", None) or getattr(queue, "rate_limiter", None)
        if limiter is not None:
            out[f"limiter[{ctrl.name}]"] = {k: len(v) for k, v in vars(limiter).items()
                                            if isinstance(v, (dict, set, list))}
    out["recorder.state"] = len(reconciler.recorder._state)
    out["reconciler"] = {k: len(v) for k, v in vars(reconciler).items()
                         if isinstance(v, (dict, set, list))}
    return out


def run_operator(argv: list[str], trace: bool) -> int:
    import gc
    import threading
    import tracemalloc

    import controller

    if trace:
        tracemalloc.start(8)
    captured = []          # the reconciler, then the manager (the reconciler no longer holds it)
    original_init = controller.MyReconciler.__init__
    original_manager_init = controller.Manager.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        captured.insert(0, self)

    def manager_init(self, *args, **kwargs):
        original_manager_init(self, *args, **kwargs)
        captured.append(self)

    controller.MyReconciler.__init__ = init
    controller.Manager.__init__ = manager_init

    def report() -> None:
        gc.collect()
        data = {"status": _status(), "malloc": _mallinfo(), "pymalloc": _pymalloc(),
                "mappings": _mappings(), "gc_objects": len(gc.get_objects()),
                "maps": _maps(*captured) if len(captured) == 2 else {}}
        if os.environ.get("WRITE_MEMORY_TRIM"):
            data["rss_after_malloc_trim"] = _trim()
        if trace:
            snapshot = tracemalloc.take_snapshot()
            data["tracemalloc_total"] = sum(s.size for s in snapshot.statistics("filename"))
            data["top"] = [f"{s.size // KIB} KiB {s.count} {s.traceback.format()[-1].strip()}"
                           for s in snapshot.statistics("traceback")[:25]]
        path = os.environ["WRITE_MEMORY_REPORT_DIR"] + f"/{os.getpid()}.json"
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)

    # The handler only wakes a thread: the report takes locks the main thread may hold.
    wake = threading.Event()

    def reporter() -> None:
        while True:
            wake.wait()
            wake.clear()
            report()

    threading.Thread(target=reporter, daemon=True, name="memreport").start()
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    return controller.main(argv)


# ---------------------------------------------------------------------------
# the bench


def _operator_class():
    from bench.convergence.operators import OurOperator

    class Operator(OurOperator):
        def __init__(self, *args, diagnose: bool, trace: bool, **kwargs):
            super().__init__(*args, **kwargs)
            self.diagnose, self.trace = diagnose, trace
            self.reports: list[dict] = []

        def argv(self) -> list[str]:
            argv = super().argv()
            if not self.diagnose:
                return argv
            mode = ["--operator"] + (["--tracemalloc"] if self.trace else [])
            return [self.python, "-m", "bench", "write_memory", *mode, "--", *argv[2:]]

        def memreport(self) -> dict | None:
            if not self.diagnose:
                return None
            path = Path(os.environ["WRITE_MEMORY_REPORT_DIR"]) / f"{self.pid}.json"
            path.unlink(missing_ok=True)
            os.kill(self.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if path.exists():
                    return json.loads(path.read_text())
                time.sleep(0.5)
            return None

    return Operator


def _wait_quiet(op, at_least: int, timeout: float) -> float:
    """Until `at_least` reconciles have finished and none for QUIET seconds."""
    from bench.convergence.operators import reconciles_finished

    t0 = time.monotonic()
    last, since = -1, t0
    while time.monotonic() - t0 < timeout:
        op.check_alive()
        done = reconciles_finished(op.metrics_port)
        now = time.monotonic()
        if done != last:
            last, since = done, now
        elif done >= at_least and now - since >= QUIET:
            return now - t0
        time.sleep(0.5)
    raise TimeoutError(f"{op.label}: {last} reconciles, not quiet within {timeout} s")


def _all_reported(client, my, namespace: str, count: int) -> bool:
    items = client.list(my, namespace=namespace)["items"]
    return len(items) == count and all(
        (i.get("status") or {}).get("observedGeneration") == i["metadata"]["generation"]
        for i in items)


def _write_log_lines(path: Path) -> int:
    """Log lines of writes to the My or its children (JSON log format)."""
    return sum(1 for line in path.read_text(errors="replace").splitlines()
               if any(f'"msg":"{what}' in line for what in ("status of", "updated ", "created ")))


def measure(size: int, args, work: Path) -> dict:
    from bench.convergence.cluster import MY, BenchCluster
    from bench.convergence.scenarios import my_object, names
    from tests.support.controlplane import ControlPlane

    class Cluster(BenchCluster):
        def start(self):
            self.plane = ControlPlane(controller_manager=False)
            self.plane.start()
            self.started_here = True
            from k8s_http.wire.client import ApiClient
            from k8s_http.config.cluster import load_config
            self.client = ApiClient.from_config(load_config(str(self.kubeconfig)),
                                                user_agent="my-controller-bench/memory",
                                                pool_size=32)
            return self

    Operator = _operator_class()
    os.environ["WRITE_MEMORY_REPORT_DIR"] = str(work)     # inherited by the operators
    cluster = Cluster(work).start()
    result: dict = {"size": size}
    try:
        cluster.install_crd(ROOT / "manifests" / "base" / "crd.yaml")
        namespace = f"mem-{size}"
        cluster.create_namespace(namespace)

        def operator(tag: str):
            op = Operator(cluster.kubeconfig, namespace, work, workers=args.workers,
                          python=sys.executable, diagnose=args.diagnose, trace=args.tracemalloc)
            op.start(tag)
            op.wait_ready_for_startup(300)
            return op

        # 1. created: the operator makes every child itself
        op = operator("created")
        time.sleep(QUIET)
        idle = op.rss_bytes()
        result["created_idle_rss"] = idle
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: cluster.client.create(MY, my_object(n, "v1", 1),
                                                          namespace=namespace),
                          names("m", size)))
        deadline = time.monotonic() + args.timeout
        while not _all_reported(cluster.client, MY, namespace, size):
            op.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the fleet never converged")
            time.sleep(2)
        _wait_quiet(op, size, args.timeout)
        result["created_seconds"] = time.monotonic() - t0
        result["created_rss"] = op.rss_bytes()
        result["created_report"] = op.memreport()
        time.sleep(args.linger)
        result["created_rss_later"] = op.rss_bytes()
        result["created_peak_rss"] = op.peak_rss_bytes()
        op.stop()
        result["created_write_log_lines"] = _write_log_lines(op.log_path)

        # 2. started over the converged fleet
        op = operator("started")
        _wait_quiet(op, size, args.timeout)
        result["started_rss"] = op.rss_bytes()
        result["started_report"] = op.memreport()
        result["started_peak_rss"] = op.peak_rss_bytes()
        op.stop()
        # Over a converged fleet nothing is written: a projection that dropped a field
        # the drift check reads would show up here as applies ("updated ...") or
        # status writes ("status of ...").
        result["started_write_log_lines"] = _write_log_lines(op.log_path)
    finally:
        cluster.stop()
    for scenario in ("created", "started"):
        rss = result[f"{scenario}_rss"]
        result[f"{scenario}_kb_per_my"] = (rss - result["created_idle_rss"]) / size / 1000
    result["ratio_created_to_started"] = result["created_rss"] / result["started_rss"]
    return result


# ---------------------------------------------------------------------------
# --cache-only: the caches' own Python heap per My, without a control plane


def _wire_objects(i: int) -> tuple[dict, dict, dict]:
    """A My and its children as the apiserver sends them (shapes copied from a
    local control plane, plus the status and revision annotation that
    kube-controller-manager adds to a Deployment), as fresh JSON as on the wire."""
    from bench.convergence.scenarios import my_object
    from my.render import render_deployment, render_service
    from my.spec import labels_for
    from my.status import desired_status

    name, ns, stamp = f"m-{i:06d}", "team-a", "2026-12-01T17:30:37Z"
    my = my_object(name, "v1", 1)
    my["metadata"].update(namespace=ns, uid=f"0f26fd9d-b73c-4cc8-bb62-{i:012d}",
                          resourceVersion=str(1000 + 3 * i), generation=1,
                          creationTimestamp=stamp)
    managed = [{"manager": "my-controller", "operation": "Apply", "apiVersion": "v1",
                "time": stamp, "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in
                                                         labels_for(name)}},
                             "f:spec": {"f:replicas": {}, "f:selector": {},
                                        "f:template": {"f:spec": {"f:containers": {
                                            'k:{"name":"app"}': {".": {}, "f:image": {}}}}}}}}]
    my["metadata"]["managedFields"] = managed
    my["status"] = desired_status(my, None, now=stamp)
    dep = render_deployment(my)
    dep["metadata"].update(uid=f"d67690bb-2f7f-47df-963c-{i:012d}", generation=1,
                           resourceVersion=str(1001 + 3 * i), creationTimestamp=stamp,
                           managedFields=managed)
    dep["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    pod = dep["spec"]["template"]["spec"]
    dep["spec"].update(strategy={"type": "RollingUpdate", "rollingUpdate": {
        "maxUnavailable": "25%", "maxSurge": "25%"}}, revisionHistoryLimit=10,
        progressDeadlineSeconds=600)
    pod.update(restartPolicy="Always", terminationGracePeriodSeconds=30,
               dnsPolicy="ClusterFirst", securityContext={}, schedulerName="default-scheduler")
    pod["containers"][0].update(terminationMessagePath="/dev/termination-log",
                                terminationMessagePolicy="File", imagePullPolicy="IfNotPresent")
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                     "readyReplicas": 1, "availableReplicas": 1, "conditions": [
                         {"type": "Available", "status": "True", "lastUpdateTime": stamp,
                          "lastTransitionTime": stamp, "reason": "MinimumReplicasAvailable",
                          "message": "Deployment has minimum availability."},
                         {"type": "Progressing", "status": "True", "lastUpdateTime": stamp,
                          "lastTransitionTime": stamp, "reason": "NewReplicaSetAvailable",
                          "message": f'ReplicaSet "{name}-5d8f7c9b4" has successfully '
                                     "progressed."}]}
    svc = render_service(my)
    svc["metadata"].update(uid=f"28ee5399-67ca-4318-95f0-{i:012d}",
                           resourceVersion=str(1002 + 3 * i), creationTimestamp=stamp,
                           managedFields=managed)
    svc["spec"].update(clusterIP=f"10.0.{i // 250}.{i % 250}",
                       clusterIPs=[f"10.0.{i // 250}.{i % 250}"], sessionAffinity="None",
                       ipFamilies=["IPv4"], ipFamilyPolicy="SingleStack",
                       internalTrafficPolicy="Cluster")
    svc["status"] = {"loadBalancer": {}}
    return tuple(json.loads(json.dumps(o)) for o in (my, dep, svc))


def cache_only(size: int) -> dict:
    """tracemalloc's figure for three Stores holding `size` My and their children,
    with the default transform (managedFields stripped) and with the projections."""
    import gc
    import tracemalloc

    import controller
    from k8s_http.core.objects import strip_managed_fields
    from k8s_http.cache.store import Store

    out = {"size": size}
    for label, transforms in (("strip_managed_fields", [strip_managed_fields] * 3),
                              ("projections", [controller.MY_PROJECTION,
                                               controller.DEPLOYMENT_PROJECTION,
                                               controller.SERVICE_PROJECTION])):
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        stores = [Store(transform=t) for t in transforms]
        for i in range(size):
            for store, obj in zip(stores, _wire_objects(i)):
                store.upsert(obj)
        gc.collect()
        out[f"{label}_bytes_per_my"] = (tracemalloc.get_traced_memory()[0] - base) / size
        tracemalloc.stop()
        del stores
    return out


def markdown(data: dict | list) -> str:
    """RESULTS.write_memory.md: a row per run, every figure from `data` (a file --out
    wrote, a list of runs; or {"command", "note", "runs": {label: run}} gathering runs
    of several commits)."""
    if isinstance(data, list):
        data = {"runs": {f"size {r['size']:,}": r for r in data}}
    lines = ["## Memory kept per write (`python -m bench write_memory`)", ""]
    if data.get("command"):
        lines += [f"    {data['command']}", ""]
    if data.get("note"):
        lines += [data["note"], ""]
    lines += ["KB per My = (RSS - the same process's idle RSS) / N, kB = 1000 bytes: the My "
              "and its two children. *created*: the operator that created the children "
              "itself; *started*: a new operator over the same converged fleet.", "",
              "| run | My | created: kB per My | started: kB per My | created ÷ started RSS |",
              "|---|---:|---:|---:|---:|"]
    for label, run in data["runs"].items():
        lines.append(f"| {label} | {run['size']:,} | {run['created_kb_per_my']:.1f} | "
                     f"{run['started_kb_per_my']:.1f} | {run['ratio_created_to_started']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--operator"]:
        rest = argv[1:]
        trace = rest[:1] == ["--tracemalloc"]
        rest = rest[1:] if trace else rest
        return run_operator(rest[1:] if rest[:1] == ["--"] else rest, trace)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--linger", type=float, default=30.0,
                        help="seconds before the second RSS reading of the 'created' process")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--from-json", type=Path, default=None,
                        help=f"only write the markdown (--markdown) from a results file, "
                             f"e.g. {RESULTS_JSON.relative_to(ROOT)}")
    parser.add_argument("--markdown", type=Path, default=RESULTS_MD)
    parser.add_argument("--cache-only", action="store_true",
                        help="only the caches' Python heap per My (tracemalloc), no control plane")
    args = parser.parse_args(argv)
    args.diagnose = args.diagnose or args.tracemalloc
    if args.from_json:
        args.markdown.write_text(markdown(json.loads(args.from_json.read_text())))
        print(f"wrote {args.markdown}", file=sys.stderr)
        return 0
    if args.cache_only:
        for size in [int(s) for s in args.sizes.split(",")]:
            print(json.dumps(cache_only(size)), flush=True)
        return 0
    import tempfile
    results = []
    for size in [int(s) for s in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory(prefix="write-memory-") as work:
            result = measure(size, args, Path(work))
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if not k.endswith("_report")}),
              flush=True)
        for key in ("created_report", "started_report"):
            if result.get(key):
                print(key, json.dumps(result[key], indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0
