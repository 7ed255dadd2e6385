#!/usr/bin/env python3
"""Operators started over an existing, converged fleet: memory, start-up, writes, idle CPU.

    python -m bench scale                               # make bench-scale: 0, 1,000, 10,000 My
    python -m bench scale --sizes 0,1000 --operators ours-w4,cr-w4 --idle-seconds 10   # smoke
    python -m bench scale --sizes 0,1000,10000,30000,100000 --kopf-max-size 1000
    python -m bench scale --from-json bench/results/scale.json   # markdown only
    python -m bench plane up /tmp/scale-plane     # a plane that outlives the run:
    python -m bench scale --cluster-dir /tmp/scale-plane --sizes 30000 ...   # grown once, reused
    python -m bench scale --cluster-dir DIR --sizes 0,1000,10000,30000,100000 --headless-services
                                                        # to 100,000 (a plane whose fleet has
                                                        # ClusterIP Services refuses the flag)

A local control plane (tests/support/controlplane.py through the convergence
bench's BenchCluster: audit log for the writes) with the Deployment and
ReplicaSet controllers off, so no ReplicaSets or Pods exist. The bench grows
one fleet of converged `My` (bench/scaling/fleet.py: children rendered by
controller.py itself, both statuses written) size by size, and at each size:

  bare      a fresh process reads what the informers read at start-up and keeps
            nothing (`python -m bench bare`, bench/scaling/bare.py: one streaming
            list per resource, or --bare-mode paged)
  operators each in turn (the order reversed at every other size), a fresh process
            over the fleet's namespace: ready (ours "caches synced", then /readyz
            200 checked; the controller-runtime peer's "Starting workers", each
            logged once its caches synced; kopf's
            liveness), every key reconciled once (controller_runtime_reconcile_total
            >= N from /metrics; kopf: its "... is processed" log lines), CPU, then
            --settle-seconds untouched and --idle-seconds measured: idle CPU and the
            settled RSS; writes over the whole run from the audit log (0 expected);
            peak RSS (VmHWM).
  new My    with --new-my N, as ours (or a peer) turns ready, the bench creates N
            new `My` and times each create -> converged (its first status of its
            generation, seen by the bench's own watch): what a user who creates a
            `My` while the operator restarts waits for. Their writes count in the
            run's; they are deleted once the operator has stopped.
  pairs     at the largest size, --ready-pairs more back-to-back pairs of the bare
            client and ours started and stopped once ready, who goes first
            alternating: the ready goal is judged on the median ratio (one pair
            moves by +-0.15x with the apiserver's pace on a shared machine).

Per operator, the settled RSS over the sizes (size 0: the idle process) gives
the per-object slope (least squares, KiB per My, its two children included).
Goals of issue 17 are checked on ours and printed. Results:
bench/results/scale.json (saved after each size, so an interrupted run leaves
the sizes it measured) and bench/RESULTS.scale.md; earlier runs are in git's history.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import time
from pathlib import Path

from bench import converge, harness  # converge: its operator factory and peer build
from bench.convergence import footprint
from bench.convergence.cluster import MY, BenchCluster
from bench.convergence.observer import Observer
from bench.convergence.operators import (OperatorProcess, OurOperator, KopfOperator,
                                         precompile, python_env)
from bench.convergence.scenarios import my_object, status_current
from bench.scaling import analysis, report
from bench.scaling import bare as bare_client
from bench.scaling.fleet import Fleet, FleetMismatch
from bench.scaling.plane import APISERVER_ARGS, plane_settings
from k8s_http.core.errors import NotFoundError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

OPERATORS = ("ours-w4", "cr-w4", "kopf")
HEADLINE, REFERENCE = converge.HEADLINE, converge.REFERENCE
NAMESPACE = "scale-fleet"
# kopf keeps its bookkeeping in the objects (annotations on each My) and re-patches the
# children its own way on start-up: over the shared fleet it would leave work for every
# operator after it. It gets its own copy of the fleet, grown alongside up to
# --kopf-max-size.
KOPF_NAMESPACE = "scale-kopf"
RESULTS = HERE / "results"
MARKDOWN = HERE / "RESULTS.scale.md"
NEW_LABEL = "bench.mine.jp/new-at-ready"      # the --new-my objects

log = harness.logger("scale")


# ---------------------------------------------------------------- one operator, one size

def wait_ready(op: OperatorProcess, timeout: float) -> tuple[float, str]:
    """Seconds from spawn to the operator's own "caches are filled" signal, and its name."""
    if isinstance(op, OurOperator):
        return op.wait_ready_for_startup(timeout), '"caches synced" log line, /readyz 200'
    if isinstance(op, KopfOperator):
        return op.wait_started(timeout), "liveness 200"
    # controller-runtime: its /readyz is healthz.Ping (200 before any cache syncs);
    # "Starting workers" is logged once every informer of the controller has synced.
    return op.wait_ready_for_startup(timeout), '"Starting workers" log line'


def wait_reconciled(op: OperatorProcess, size: int, timeout: float,
                    poll: float) -> tuple[float | None, int]:
    """Seconds from spawn until `size` reconciles were counted (None: timed out)."""
    deadline = op.started_at + timeout
    while True:
        count = op.processed_count()
        if count >= size:
            return time.monotonic() - op.started_at, count
        if time.monotonic() > deadline:
            return None, count
        op.check_alive()
        time.sleep(poll)


def run_operator(bench: converge.Bench, cluster: BenchCluster, key: str, size: int,
                 args) -> dict:
    """A fresh process over the fleet at `size`: ready, all reconciled, idle, writes, RSS."""
    namespace = KOPF_NAMESPACE if key == "kopf" else NAMESPACE
    op = bench.make_operator(key, namespace)
    timeout = args.timeout_seconds + size * args.timeout_per_my
    new = [f"new-at-ready-{int(time.time())}-{i}" for i in range(args.new_my)]
    observer = Observer(cluster.client, namespace, kinds=("my",),
                        label_selector=f"{NEW_LABEL}=true").start() if new else None
    mark = cluster.counter.mark()
    plane_cpu0 = cluster.control_plane_cpu()
    op.start(f"scale-{size}")
    out: dict = {"label": op.label}
    try:
        out["ready_seconds"], out["ready_signal"] = wait_ready(op, timeout)
        if new:
            out["new_my_seconds"] = new_at_ready(cluster, observer, namespace, new, timeout)
        out["all_reconciled_seconds"], out["reconciles"] = wait_reconciled(
            op, size, timeout, args.poll_seconds)
        out["reconciled_signal"] = ("kopf log lines 'is processed'" if isinstance(op, KopfOperator)
                                    else "controller_runtime_reconcile_total >= N")
        out["cpu_seconds_to_all_reconciled"] = op.cpu_seconds()
        out["peak_rss_mib_to_all_reconciled"] = op.peak_rss_bytes() / analysis.MIB
        time.sleep(args.settle_seconds)
        cpu0, t0 = op.cpu_seconds(), time.monotonic()
        time.sleep(args.idle_seconds)
        op.check_alive()
        window = time.monotonic() - t0
        out["idle_seconds"] = window
        out["idle_cpu_percent"] = 100.0 * (op.cpu_seconds() - cpu0) / window
        out["settled_rss_mib"] = op.rss_bytes() / analysis.MIB
        out["peak_rss_mib"] = op.peak_rss_bytes() / analysis.MIB
        out["cpu_seconds"] = op.cpu_seconds()
    except Exception as err:              # recorded; the other operators and sizes go on
        log(f"  {key} at {size}: FAILED: {err}")
        out["error"] = str(err)
    finally:
        out["exit_code"] = op.stop()
        if observer is not None:
            observer.stop()
            for name in new:
                with contextlib.suppress(NotFoundError):
                    cluster.client.delete(MY, name, namespace=namespace)
        counts = cluster.counter.since(mark)
        out["writes"] = counts.writes
        out["writes_by_kind"] = dict(sorted(counts.by_kind.items()))
        out["failed_writes"] = counts.failed_writes     # refused (409 on a create, ...)
        out["reads"] = counts.reads
        out["control_plane_cpu_seconds"] = cluster.control_plane_cpu() - plane_cpu0
        out["log"] = str(op.log_path)
    return out


def new_at_ready(cluster: BenchCluster, observer: Observer, namespace: str, names: list[str],
                 timeout: float) -> list[float | None]:
    """Create `names` now; each one's seconds from its create to its first status of
    its generation (None: not within `timeout`)."""
    tracker = observer.track([("my", name) for name in names],
                             lambda kind, obj: status_current(obj))
    sent = {}
    for name in names:
        body = my_object(name, "new", replicas=1)
        body["metadata"]["labels"] = {NEW_LABEL: "true"}
        sent[name] = time.monotonic()
        cluster.client.create(MY, body, namespace=namespace)
    tracker.wait(timeout)
    return [round(tracker.seen[("my", name)] - sent[name], 3) if ("my", name) in tracker.seen
            else None for name in names]


def run_bare(cluster: BenchCluster, size: int, mode: str, namespace: str = NAMESPACE) -> dict:
    """`python -m bench bare` as a fresh process: spawn-to-exit and in-process seconds."""
    t0 = time.monotonic()
    proc = subprocess.run([harness.bench_python(), "-m", "bench", "bare",
                           "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace,
                           "--mode", mode], capture_output=True, text=True, check=False,
                          env=python_env(), cwd=ROOT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:], "mode": mode}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    items = sum(result["items"].values())
    if items != 3 * size:
        return {"error": f"read {items} items, expected {3 * size}", **result}
    return {"mode": mode, "items": result["items"], "seconds_in_process": result["seconds"],
            "seconds": wall}


def ready_pairs(bench: converge.Bench, cluster: BenchCluster, size: int, count: int,
                mode: str, timeout: float) -> list[dict]:
    """`count` more (bare client, ours to ready) pairs over the same fleet, back to
    back: ours is stopped once ready (the run before it measured the rest). Who goes
    first alternates: the apiserver's garbage from one read (its collector runs
    when it will) must not fall on the same side of every pair."""
    pairs = []
    for number in range(count):
        bare_first = number % 2 == 0
        if bare_first:
            bare = run_bare(cluster, size, mode)
        ready = ready_once(bench, size, timeout)
        if not bare_first:
            bare = run_bare(cluster, size, mode)
        pair = {"bare_seconds": bare.get("seconds"), "ready_seconds": ready,
                "ratio": analysis.ratio(ready, bare.get("seconds")),
                "first": "bare" if bare_first else HEADLINE}
        log(f"  ready pair: {pair}")
        pairs.append(pair)
    return pairs


def ready_once(bench: converge.Bench, size: int, timeout: float) -> float | None:
    """Seconds from spawn to ready of a fresh operator (stopped then); None if it failed."""
    op = bench.make_operator(HEADLINE, NAMESPACE)
    op.start(f"scale-{size}-ready")
    try:
        return wait_ready(op, timeout)[0]
    except Exception as err:          # recorded; the run's other figures stand
        log(f"  {HEADLINE} to ready: FAILED: {err}")
        return None
    finally:
        op.stop()


# ---------------------------------------------------------------- the whole run

def summarise(data: dict) -> None:
    """Slopes per operator, ratios to the peer, goals: added to `data` in place."""
    sizes = sorted(int(s) for s in data["runs"])
    largest = max(sizes)
    slopes = {}
    for key in data["settings"]["operators"]:
        points = [(size, data["runs"][str(size)][key]["settled_rss_mib"] * analysis.MIB)
                  for size in sizes
                  if "settled_rss_mib" in data["runs"][str(size)].get(key, {})]
        line = analysis.fit_line(points)
        idle = next((y for x, y in points if x == 0), None)
        slopes[key] = {
            "kib_per_my": None if line is None else line.slope / analysis.KIB,
            "intercept_mib": None if line is None else line.intercept / analysis.MIB,
            "points": len(points),
            "per_size_kib_per_my": {str(x): analysis.per_object_kib(y, idle, x)
                                    for x, y in points if x and idle is not None},
        }
    data["slopes"] = slopes
    ours = data["runs"][str(largest)].get(HEADLINE, {})
    bare = data["bare"].get(str(largest), {})
    data["goals"] = [g.as_dict() for g in analysis.goals(
        slope_kib=slopes.get(HEADLINE, {}).get("kib_per_my"),
        peer_slope_kib=slopes.get(REFERENCE, {}).get("kib_per_my"),
        ready_seconds=ours.get("ready_seconds"), bare_seconds=bare.get("seconds"),
        writes_by_size={int(s): r[HEADLINE]["writes"] for s, r in data["runs"].items()
                        if "writes" in r.get(HEADLINE, {})},
        idle_percent=ours.get("idle_cpu_percent"), largest_size=largest,
        ready_pairs=[(p["ready_seconds"], p["bare_seconds"])
                     for p in data.get("ready_pairs", {}).get(str(largest), [])
                     if p.get("ready_seconds") and p.get("bare_seconds")])]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0,1000,10000",
                   help="fleet sizes in growing order; 0 = the idle process (default %(default)s)")
    p.add_argument("--operators", default=",".join(OPERATORS),
                   help="any of ours-wN, cr-wN, kopf (default %(default)s)")
    p.add_argument("--kopf-max-size", type=int, default=1000,
                   help="kopf only up to this size (default %(default)s)")
    p.add_argument("--bare-mode", default=bare_client.DEFAULT_MODE,
                   choices=sorted(bare_client.LISTERS),
                   help="`python -m bench bare`'s --mode (default %(default)s)")
    p.add_argument("--threads", type=int, default=16, help="fleet-creating threads")
    p.add_argument("--headless-services", action="store_true",
                   help="grow the fleet with headless Services (clusterIP None): no ClusterIP "
                        "allocation, which the apiserver makes one at a time at a cost that "
                        "grows with the fleet; needed beyond ~30,000 (bench/scaling/fleet.py)")
    p.add_argument("--ready-pairs", type=int, default=4, metavar="N",
                   help="at the largest size, N more back-to-back pairs of the bare client and "
                        f"{HEADLINE} to ready; the ready goal takes the median ratio "
                        "(default %(default)s)")
    p.add_argument("--new-my", type=int, default=0, metavar="N",
                   help="N new My created as each operator turns ready: create -> converged "
                        "(default %(default)s)")
    p.add_argument("--settle-seconds", type=float, default=10.0)
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--poll-seconds", type=float, default=0.25,
                   help="how often /metrics is read while waiting for the reconciles")
    p.add_argument("--timeout-seconds", type=float, default=180.0)
    p.add_argument("--timeout-per-my", type=float, default=0.02)
    p.add_argument("--compare-to", type=Path, default=None,
                   help="an earlier results file (git show REV:bench/results/scale.json): its "
                        "slopes beside this run's (before/after)")
    harness.add_output_arguments(p, out_help="default bench/results/scale.json",
                                 markdown=MARKDOWN)
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: comma-separated integers, not {args.sizes!r}")
    if args.sizes != sorted(set(args.sizes)) or args.sizes[0] < 0:
        p.error("--sizes: distinct, growing, >= 0 (the fleet only grows)")
    args.operators = [o for o in args.operators.split(",") if o]
    bad = [o for o in args.operators if not (o == "kopf" or o.startswith(("ours-w", "cr-w")))]
    if bad:
        p.error(f"--operators: unknown {', '.join(bad)}")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main(argv, parse_args, measure=measure, render=render, log=log)


def render(args, data: dict) -> None:
    """RESULTS.scale.md from `data`, with --compare-to's slopes as the "before" row."""
    if "goals" not in data:               # an interrupted run's partial file
        summarise(data)
    before = json.loads(args.compare_to.read_text()) if args.compare_to else None
    report.write_markdown(args.markdown, data, before)


def measure(args, argv: list[str]) -> tuple[dict, Path]:
    """The fleet grown size by size; at each, the bare client and each operator over it."""
    plane_settings()
    precompile(harness.bench_python())
    if "kopf" in args.operators:
        footprint.ensure_kopf_venv()
    out = args.out or RESULTS / "scale.json"
    data: dict = {"settings": {k: (str(v) if isinstance(v, Path) else v)
                               for k, v in vars(args).items()},
                  "fleet": [], "bare": {}, "runs": {}}
    # Pod-less by choice (as `python -m bench plane`): the fleet's Pods are not what is measured.
    with harness.control_plane("scale", args, log, pods=False, apiserver_args=APISERVER_ARGS,
                               what="the control plane (Deployment controller off)"
                               ) as (cluster, work_dir):
        cluster.create_namespace(NAMESPACE)
        cluster.create_namespace(KOPF_NAMESPACE)
        data["meta"] = harness.metadata("scale", argv, cluster)
        bench = converge.Bench(argparse.Namespace(replicas=1, idle_seconds=args.idle_seconds,
                                                  latency_count=0, rate=0.0),
                               cluster, work_dir)
        fleet, kopf_fleet = (Fleet(cluster.client, namespace, threads=args.threads,
                                   headless=args.headless_services, progress=log)
                             for namespace in (NAMESPACE, KOPF_NAMESPACE))
        if args.cluster_dir is not None:       # a fleet an earlier run grew there is reused
            for each in (fleet, kopf_fleet):
                try:
                    log(f"fleet in {each.namespace}: {each.discover():,} My found")
                except FleetMismatch as err:
                    raise SystemExit(f"--cluster-dir: {err}") from None
            if fleet.size > args.sizes[0]:
                raise SystemExit(f"--sizes: the fleet in {args.cluster_dir} already has "
                                 f"{fleet.size:,} My, more than {args.sizes[0]:,} (it only grows)")
        for turn, size in enumerate(args.sizes):
            log(f"fleet: growing to {size:,} My")
            growth = fleet.grow_to(size)
            data["fleet"].append({"size": size, **growth.as_dict(),
                                  "control_plane_rss_mib": _plane_rss(cluster)})
            log(f"  {growth.as_dict()}")
            if "kopf" in args.operators and size <= args.kopf_max_size:
                kopf_fleet.grow_to(size)
            if size:
                data["bare"][str(size)] = run_bare(cluster, size, args.bare_mode)
                log(f"  bare client: {data['bare'][str(size)]}")
            runs = data["runs"][str(size)] = {}
            order = [k for k in args.operators if k != "kopf" or size <= args.kopf_max_size]
            for key in (order if turn % 2 == 0 else order[::-1]):
                log(f"  {key} over {size:,} My")
                runs[key] = run_operator(bench, cluster, key, size, args)
                log("    " + report.one_line(runs[key]))
            if size == args.sizes[-1] and size and args.ready_pairs and HEADLINE in runs:
                log(f"  {args.ready_pairs} more pairs of the bare client and {HEADLINE} to ready")
                data.setdefault("ready_pairs", {})[str(size)] = ready_pairs(
                    bench, cluster, size, args.ready_pairs, args.bare_mode,
                    args.timeout_seconds + size * args.timeout_per_my)
            data["fleet"][-1]["control_plane_rss_mib_after_operators"] = _plane_rss(cluster)
            harness.save(out, data)           # a partial file survives an interrupted run
    summarise(data)
    for goal in data["goals"]:
        log(report.goal_text(goal))
    return data, out


def _plane_rss(cluster: BenchCluster) -> dict:
    return {name: (rss or 0) / analysis.MIB for name, rss in cluster.plane.rss_bytes().items()}
