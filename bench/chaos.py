"""Chaos in a burst: one fault in the middle of a 1,000-`My` burst at 50/s (issue 36 item 2).

    .venv/bin/python -m bench chaos                       # all runs, writes RESULTS.chaos.md
    .venv/bin/python -m bench chaos --faults none,etcd --count 200 --no-markdown   # a quick look

Each run starts its own control plane (`--pods`: with kwok Pods; default Pod-less),
`controller.py --workers 4` talking to it through `tests/support/faultproxy.py`, and
the bench's watches (`bench/convergence/observer.py`). The bench creates `--count`
`My`s at `--rate` per second; at `--fault-at` seconds into the burst one fault is
applied, and at that moment the bench also patches the spec (an env value) of
`--updates` `My`s created before it, retrying until the apiserver takes them:

- none       the undisturbed burst, the reference for writes per `My`;
- etcd       etcd SIGKILLed, restarted on its data dir after `--down-seconds`;
- apiserver  kube-apiserver SIGKILLed, restarted after `--down-seconds`;
- operator   the operator SIGKILLed, a new process started at once;
- leader     two operators with --leader-elect; the leader SIGKILLed, the warm
             standby takes the Lease when it expires;
- partition  the proxy relays nothing either way for `--partition-seconds`.

"Recovered" is when the faulty part serves again (etcd healthy, apiserver /readyz,
the new operator's /readyz, the standby's "became leader" log line, the partition's
end). "All converged" is when the bench's watches first show every `My` with a
Deployment whose env is the `My`'s current spec, a Service, and a status of the
current generation. Then the run waits for the operator to stop writing (`settle`),
counts the operator's writes in the apiserver's audit log, and checks by listing:
not converged, updates lost (Deployment env != spec), children missing, and
duplicates (more than one Deployment or Service owned by one `My`).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
from bench.convergence.cluster import MY, BenchCluster
from bench.convergence.observer import Observer
from bench.convergence.operators import OurOperator, python_env  # noqa: F401
from bench.convergence.scenarios import Settings, env_value, settle, status_current
from bench import harness
from bench.soak import _retry, check, my_object, proxied_namespace
from k8s_http.core.errors import ConflictError
from k8s_http.core.objects import DEPLOYMENTS, SERVICES

NAMESPACE = "chaos"
FAULTS = ("none", "etcd", "apiserver", "operator", "leader", "partition")
RESULTS_JSON = HERE / "results" / "chaos.json"
RESULTS_MD = HERE / "RESULTS.chaos.md"


class ElectedOperator(OurOperator):
    """controller.py --leader-elect; `leading_at` is when it logged "became leader"."""

    def __init__(self, *args, identity: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.key = f"ours-w{self.workers}-{identity}"
        self.processed_pattern = re.compile(r"became leader")

    def argv(self) -> list[str]:
        return [*super().argv(), "--leader-elect", "--leader-election-namespace", NAMESPACE]

    @property
    def leading_at(self) -> float | None:
        return self.last_processed_at


def all_converged(observer: Observer, names: list[str]) -> bool:
    with observer.lock:
        mys, deps, svcs = (observer.objects[k] for k in ("my", "deployment", "service"))
        for name in names:
            my, dep = mys.get(name), deps.get(name)
            if my is None or dep is None or name not in svcs or not status_current(my) or \
                    env_value(dep) != my["spec"]["env"][0]["value"]:
                return False
    return True


def duplicates(client) -> dict:
    """`My`s owning more than one Deployment or Service (by ownerReference uid)."""
    out = {}
    for kind, resource in (("deployments", DEPLOYMENTS), ("services", SERVICES)):
        owners = collections.Counter(
            ref["uid"] for obj in client.list(resource, namespace=NAMESPACE)["items"]
            for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("kind") == "My")
        out[kind] = sum(1 for n in owners.values() if n > 1)
    return out


def _wait_until(predicate, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def run_one(fault: str, args, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    cluster = BenchCluster(work, pods=args.pods).start()
    proxy = observer = None
    ops: list[OurOperator] = []
    try:
        plane = cluster.plane
        proxy, kubeconfig = proxied_namespace(cluster, NAMESPACE, work)

        def operator(identity: str | None) -> OurOperator:
            kw = dict(workers=args.workers, python=sys.executable)
            if identity is None:
                return OurOperator(kubeconfig, NAMESPACE, work, **kw)
            return ElectedOperator(kubeconfig, NAMESPACE, work, identity=identity, **kw)

        if fault == "leader":
            ops = [operator("a"), operator("b")]
            ops[0].start("leader")
            ops[0].wait_started(120)
            if not _wait_until(lambda: ops[0].leading_at is not None, 60):
                raise RuntimeError("the first operator never became leader")
            ops[1].start("standby")
            ops[1].wait_started(120)
        else:
            ops = [operator(None)]
            ops[0].start("first")
            ops[0].wait_started(120)
        observer = Observer(cluster.client, NAMESPACE).start()
        names = [f"my-{i:04d}" for i in range(args.count)]
        updated = names[:args.updates]
        mark = cluster.counter.mark()
        timeline: dict[str, float] = {}
        patched: list[str] = []

        def create(indexed) -> None:
            index, name = indexed
            delay = t0 + index / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            def once() -> None:
                try:
                    cluster.client.create(MY, my_object(name, "v0"), namespace=NAMESPACE)
                except ConflictError:
                    pass          # an earlier try was done before its answer was lost
            _retry(once, attempts=240, what=f"create {name}")

        def update(name: str) -> None:
            patch = {"spec": {"env": [{"name": "FOO", "value": "during-fault"}]}}
            _retry(lambda: cluster.client.patch(MY, name, patch, namespace=NAMESPACE),
                   attempts=240, what=f"update {name}")
            patched.append(name)

        run_over = threading.Event()

        def inject() -> None:
            try:
                inject_fault()
            except BaseException as err:       # raised in the main thread below
                timeline["inject_error"] = err
            finally:
                # An operator started here is tied to this thread (PR_SET_PDEATHSIG
                # fires when the thread that forked it ends): keep it until the run ends.
                run_over.wait()

        def inject_fault() -> None:
            time.sleep(max(0.0, t0 + args.fault_at - time.monotonic()))
            timeline["fault"] = time.monotonic()
            updates = threading.Thread(target=lambda: list(ThreadPoolExecutor(8).map(
                update, updated)), daemon=True)
            if fault == "etcd":
                plane.kill_process("etcd")
                updates.start()
                time.sleep(args.down_seconds)
                plane.start_process("etcd")
            elif fault == "apiserver":
                plane.kill_apiserver()
                updates.start()
                time.sleep(args.down_seconds)
                plane.start_apiserver()
            elif fault == "operator":
                ops[0].proc.kill()
                ops[0].proc.wait()
                updates.start()
                ops.append(operator(None))
                ops[-1].start("restarted")
                ops[-1].wait_started(120)
            elif fault == "leader":
                ops[0].proc.kill()
                ops[0].proc.wait()
                updates.start()
                if not _wait_until(lambda: ops[1].leading_at is not None, 120):
                    raise RuntimeError("the standby never became leader")
                timeline["recovered"] = ops[1].leading_at
            elif fault == "partition":
                proxy.partition(args.partition_seconds)
                updates.start()
                time.sleep(args.partition_seconds)
            else:
                updates.start()
            timeline.setdefault("recovered", time.monotonic())
            updates.join()
            timeline["updates_done"] = time.monotonic()

        t0 = time.monotonic()
        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
        with ThreadPoolExecutor(args.load_threads) as pool:
            list(pool.map(create, enumerate(names)))
        timeline["creates_done"] = time.monotonic()
        while "updates_done" not in timeline and "inject_error" not in timeline:
            time.sleep(0.1)
        if "inject_error" in timeline:
            raise RuntimeError(f"{fault}: the fault failed") from timeline["inject_error"]
        converged = _wait_until(lambda: all_converged(observer, names), args.timeout, 0.5)
        timeline["all_converged"] = time.monotonic()
        live = [op for op in ops if op.alive()]
        settle(cluster, observer, live[-1], mark, Settings(settle_max_seconds=120.0))
        counts = cluster.counter.since(mark)
        end = check(cluster.client, NAMESPACE)
        dups = duplicates(cluster.client)
        object_writes = sum(n for what, n in counts.by_kind.items()
                            if not what.endswith((" events", " leases")))
        rel = {k: round(v - t0, 1) for k, v in timeline.items()}
        result = {
            "fault": fault, "count": args.count, "timeline_s": rel,
            "converged": converged,
            "recovery_to_all_converged_s": round(timeline["all_converged"]
                                                 - timeline["recovered"], 1),
            "burst_start_to_all_converged_s": rel["all_converged"],
            "writes": counts.writes, "writes_per_my": counts.writes / args.count,
            "object_writes_per_my": object_writes / args.count,
            "failed_writes": counts.failed_writes,
            "writes_by_kind": dict(sorted(counts.by_kind.items())),
            "updates_made": len(patched),
            "not_converged": len(end["not_converged"]), "updates_lost": len(end["updates_lost"]),
            "children_missing": len(end["children_missing"]), "orphans": len(end["orphans"]),
            "duplicates": dups, "mys": end["my"],
            "operator_exits": [op.proc.returncode for op in ops if not op.alive()],
            "examples": {k: end[k][:5] for k in ("not_converged", "updates_lost",
                                                  "children_missing")},
        }
        print(f"chaos: {fault}: {json.dumps({k: result[k] for k in list(result)[:15]})}",
              flush=True)
        return result
    finally:
        if "run_over" in locals():
            run_over.set()
        if observer is not None:
            observer.stop()
        for op in ops:
            if op.alive():
                op.stop()
        if proxy is not None:
            proxy.stop()
        cluster.stop()


def markdown(data: dict) -> str:
    meta, runs = data["meta"], data["runs"]
    base = next((r for r in runs if r["fault"] == "none"), None)
    s = data["settings"]
    lines = [
        "## Chaos in a burst: one fault in the middle of 1,000 `My` at 50/s",
        "",
        f"Generated by `{meta['command']}` on {meta['date']} (git {meta['git']}); "
        f"{meta['machine']}, Python {meta['python']}, load average at start "
        f"{meta['loadavg'][0]:.1f}. The machine was shared with other agents' work.",
        "",
        *([f"Runs merged from {len(data['invocations'])} invocations (`--merge`): "
           + "; ".join(f"`{m['command']}` at {m['date']} (git {m['git']}, load {m['loadavg'][0]:.1f})"
                       for m in data["invocations"]) + ".", ""] if data.get("invocations") else []),
        f"Each run: a fresh control plane ({'with kwok Pods' if s['pods'] else 'Pod-less: no scheduler, kwok or Nodes; `replicas: 0`'}), "
        f"`controller.py --workers {s['workers']}` through `tests/support/faultproxy.py`, "
        f"{s['count']} `My`s created at {s['rate']:g}/s; the fault at {s['fault_at']:g} s into "
        f"the burst, and at that moment {s['updates']} spec updates (env value) to `My`s "
        f"already created, retried until the apiserver takes them. etcd and kube-apiserver stay "
        f"down {s['down_seconds']:g} s; the partition lasts {s['partition_seconds']:g} s.",
        "",
        "| fault | recovered at (s into burst) | recovery → all converged | burst start → all "
        "converged | writes / `My` (vs undisturbed) | object writes / `My`, no Events or Leases "
        "(vs undisturbed) | lost updates | "
        "duplicates (Deployments / Services) | not converged / missing / orphans |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        ratio = (f" ({r['writes_per_my'] / base['writes_per_my']:.2f}×)"
                 if base and base["writes_per_my"] else "")
        object_ratio = (f" ({r['object_writes_per_my'] / base['object_writes_per_my']:.2f}×)"
                        if base and base["object_writes_per_my"] else "")
        lines.append(
            f"| {r['fault']} | {r['timeline_s'].get('recovered', '')} | "
            f"**{r['recovery_to_all_converged_s']} s** | {r['burst_start_to_all_converged_s']} s | "
            f"{r['writes_per_my']:.2f}{ratio} | {r['object_writes_per_my']:.2f}{object_ratio} | "
            f"**{r['updates_lost']}** of {r['updates_made']} | "
            f"{r['duplicates']['deployments']} / {r['duplicates']['services']} | "
            f"{r['not_converged']} / {r['children_missing']} / {r['orphans']} |")
    lines += ["", "Writes are the operator's, from the apiserver's audit log, from the burst's "
              "start until it stopped writing; the Lease renewals of the leader run are both "
              "operators'. Writes by kind per run:", ""]
    for r in runs:
        lines.append(f"- {r['fault']}: {r['writes_by_kind']}; failed {r['failed_writes']}; "
                     f"timeline (s) {r['timeline_s']}")
    for note in data.get("notes") or []:
        lines += ["", note]
    lines += ["", f"Raw data: `{RESULTS_JSON.relative_to(ROOT)}`.", ""]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--fault-at", type=float, default=10.0)
    p.add_argument("--updates", type=int, default=100)
    p.add_argument("--down-seconds", type=float, default=5.0)
    p.add_argument("--partition-seconds", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--load-threads", type=int, default=16)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--pods", action="store_true", help="the plane with kwok Pods")
    p.add_argument("--work-dir", default=None)
    p.add_argument("--out", type=Path, default=RESULTS_JSON)
    p.add_argument("--no-markdown", dest="markdown", action="store_false")
    p.add_argument("--merge", type=Path, nargs="+", default=None,
                   help="no run: write --out and the markdown from the runs of these files "
                        "(e.g. the faults of one invocation and those re-run in another)")
    p.add_argument("--note", action="append", default=[], help="a paragraph for the section")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    meta = harness.brief_metadata("chaos", sys.argv[1:])
    if args.merge:
        parts = [json.loads(path.read_text()) for path in args.merge]
        data = {"meta": parts[0]["meta"], "settings": parts[0]["settings"],
                "invocations": [p["meta"] for p in parts],
                "runs": [r for p in parts for r in p["runs"]], "notes": args.note}
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        text = markdown(data)
        print(text)
        if args.markdown:
            RESULTS_MD.write_text(text)
        return 0
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="my-controller-chaos-"))
    runs = []
    for fault in args.faults.split(","):
        if fault not in FAULTS:
            raise SystemExit(f"unknown fault {fault!r}; one of {FAULTS}")
        print(f"chaos: run {fault} in {work / fault}", flush=True)
        runs.append(run_one(fault, args, work / fault))
        data = {"meta": meta, "settings": {k: str(v) if isinstance(v, Path) else v
                                           for k, v in vars(args).items()}, "runs": runs}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    text = markdown(data)
    print(text)
    if args.markdown:
        RESULTS_MD.write_text(text)
    bad = [r["fault"] for r in runs if not r["converged"] or r["updates_lost"] or r["not_converged"]
           or any(r["duplicates"].values())]
    return 1 if bad else 0
