#!/usr/bin/env python3
"""Start-up list: streaming (WatchList) against paged, for one informer over N objects.

    python -m bench startup_list --objects 20000 --repeat 2 --write

Starts a local control plane (etcd + kube-apiserver, no controller manager;
or uses --kubeconfig), creates N ConfigMaps of ~1 KiB in one namespace if they
are not there yet, then, taking turns, runs in a fresh process per run:

  bare       bench/scaling/bare.py's measure(): the time to receive every object
             by one streaming list (and by a paged list), keeping nothing
  informer   an Informer over the namespace, streaming_list True / False: time
             to has_synced, RSS after sync, peak RSS, and the Python heap
             traced by tracemalloc (live after sync, peak during it) in a
             second run of its own (tracing slows the process down)

Prints JSON per run and a markdown table; --write also writes
bench/results/startup_list.json and bench/RESULTS.startup_list.md (then run
`python -m bench collect_results`). Absolute times move with the machine's load;
compare modes within one run, and CPU seconds more than wall seconds (the
apiserver shares the machine: the wall time of one run moves 2-3x with load).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

NAMESPACE = "bench-startup-list"

READING = """
Reading: the streaming list is what the apiserver serves fastest and with the
least CPU on our side (bare client), and it takes one request instead of one per
500 objects. The informer's wall time moves with the load of the shared machine
(compare its CPU seconds). Its cache is larger after a streaming list: each
watch event is decoded on its own, and json's key memo lives for one decode
call, so every streamed object carries its own copy of each dict key, where a
paged list shares them within a 500-item page (about 0.75 KiB per ConfigMap
here). Objects that arrive by later watch events are in the same state on
either path, so the paged figure holds only until the fleet changes. Rebuilding
each object with interned keys costs more CPU than parsing it (1.7x the parse
time in a quick micro-benchmark, not kept); the per-informer projections of
issue 17 build new dicts with the projection's own constant keys, which should
remove the difference at no extra cost (not measured here). The peak stays one
object above the kept set on both paths (never a whole parsed list or page).
"""

# One run in a fresh process; argv: kubeconfig namespace mode kind
_CHILD = r"""
import gc, json, sys, time, tracemalloc
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import load_config
from k8s_http.cache.informer import Informer
from k8s_http.core.objects import CONFIGMAPS
from bench.scaling import bare
kubeconfig, namespace, mode, kind = sys.argv[1:5]
client = ApiClient.from_config(load_config(kubeconfig))
def status_kib(field):
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would report the
    # parent's size if that was larger.
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))
def rss_kib():
    return status_kib("VmRSS")
out = {"mode": mode, "kind": kind}
cpu0 = time.process_time()
if kind == "bare":
    if mode == "streaming":
        out.update(bare.measure(client, CONFIGMAPS, namespace))
    else:
        started = time.perf_counter()
        out.update(objects=bare.paged_list(client, CONFIGMAPS, namespace),
                   seconds=round(time.perf_counter() - started, 3))
else:
    traced = kind == "informer-traced"
    if traced:
        tracemalloc.start()
    before = rss_kib()
    informer = Informer(client, CONFIGMAPS, namespaces=[namespace],
                        streaming_list=mode == "streaming")
    started = time.perf_counter()
    informer.start()
    while not informer.has_synced():
        time.sleep(0.005)
    out["seconds"] = round(time.perf_counter() - started, 3)
    out["sync_cpu_seconds"] = round(time.process_time() - cpu0, 3)
    out["objects"] = len(informer.store)
    gc.collect()
    if traced:
        live, peak = tracemalloc.get_traced_memory()
        out.update(heap_live_mib=round(live / 2**20, 1), heap_peak_mib=round(peak / 2**20, 1))
    else:
        out.update(rss_before_mib=round(before / 1024, 1), rss_after_mib=round(rss_kib() / 1024, 1),
                   rss_peak_mib=round(status_kib("VmHWM") / 1024, 1))
    informer.stop()
out["cpu_seconds"] = round(time.process_time() - cpu0, 3)
client.close()
print(json.dumps(out))
"""


def ensure_fleet(kubeconfig: str, n: int) -> None:
    from k8s_http.wire.client import ApiClient
    from k8s_http.config.cluster import load_config
    from k8s_http.core.errors import AlreadyExistsError
    from k8s_http.core.objects import CONFIGMAPS, NAMESPACES
    client = ApiClient.from_config(load_config(kubeconfig))
    try:
        try:
            client.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        except AlreadyExistsError:
            pass
        have = {o["metadata"]["name"]
                for o in client.list(CONFIGMAPS, namespace=NAMESPACE)["items"]}
        missing = [i for i in range(n) if f"cm-{i:06d}" not in have]

        def create(i: int) -> None:
            client.create(CONFIGMAPS, {"metadata": {"name": f"cm-{i:06d}",
                                                    "labels": {"app": "bench", "i": str(i)}},
                                       "data": {"i": str(i), "pad": "x" * 1024}},
                          namespace=NAMESPACE)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, missing))
        print(f"# fleet: {n} ConfigMaps in {NAMESPACE} ({len(missing)} created)", file=sys.stderr)
    finally:
        client.close()


def run_child(kubeconfig: str, mode: str, kind: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _CHILD, kubeconfig, NAMESPACE, mode, kind],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {mode} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best(runs: list[dict], mode: str, kind: str, key: str) -> float | None:
    values = [r[key] for r in runs if r["mode"] == mode and r["kind"] == kind and key in r]
    return min(values) if values else None


def table(runs: list[dict], n: int) -> str:
    rows = [("bare client, time to receive all (s)", "bare", "seconds"),
            ("bare client, CPU (s)", "bare", "cpu_seconds"),
            ("informer, time to synced (s)", "informer", "seconds"),
            ("informer, CPU to synced (s, all threads)", "informer", "sync_cpu_seconds"),
            ("informer, RSS after sync (MiB)", "informer", "rss_after_mib"),
            ("informer, peak RSS (MiB)", "informer", "rss_peak_mib"),
            ("informer, Python heap live after sync (MiB, tracemalloc)", "informer-traced",
             "heap_live_mib"),
            ("informer, Python heap peak during sync (MiB, tracemalloc)", "informer-traced",
             "heap_peak_mib")]
    lines = [f"| {n:,} ConfigMaps (~1 KiB), best of runs | streaming | paged | streaming/paged |",
             "|---|---:|---:|---:|"]
    for label, kind, key in rows:
        s, p = best(runs, "streaming", kind, key), best(runs, "paged", kind, key)
        ratio = f"{s / p:.2f}x" if s and p else "-"
        lines.append(f"| {label} | {s} | {p} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", help="default: start a local control plane")
    parser.add_argument("--objects", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else argv

    plane = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        from tests.support.controlplane import ControlPlane
        plane = ControlPlane(controller_manager=False).start()
        kubeconfig = str(plane.admin_kubeconfig)
    try:
        ensure_fleet(kubeconfig, args.objects)
        runs = []
        for _ in range(args.repeat):
            for kind in ("bare", "informer", "informer-traced"):
                for mode in ("streaming", "paged"):
                    result = run_child(kubeconfig, mode, kind)
                    print(json.dumps(result))
                    runs.append(result)
    finally:
        if plane is not None:
            plane.stop()
    md = table(runs, args.objects)
    print(md)
    if args.write:
        from tests.support import controlplane
        meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "command": "python -m bench startup_list " + " ".join(
                    shlex.quote(a) for a in argv_used),
                "python": platform.python_version(), "kubernetes": controlplane.K8S_VERSION,
                "load_average_at_end": os.getloadavg()}
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "startup_list.json").write_text(
            json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
        (HERE / "RESULTS.startup_list.md").write_text(
            "## Start-up list: streaming against paged (issue 17)\n\n"
            f"    {meta['command']}\n\n"
            f"{meta['date']}, Kubernetes {meta['kubernetes']}, CPython {meta['python']}, "
            f"load average at the end {meta['load_average_at_end'][0]:.1f} on "
            f"{os.cpu_count()} CPUs. Each figure is the best of {args.repeat} runs, each in a "
            "fresh process, modes taking turns.\n\n" + md + "\n" + READING)
    return 0
