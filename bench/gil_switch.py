"""GIL switch interval: a worker's request time beside a thread packing a list, at CPython's 5 ms and the Manager's 1 ms.

    python -m bench gil_switch            # ~1 min; bench/RESULTS.gil_switch.md

Why (k8s_http/control/manager.py, GIL_SWITCH_SECONDS): while a watcher decodes
a large list (start-up, slots taken over, a relist) it runs Python without a
pause, and each time a worker's request wakes up (its answer has come) the
worker waits for the GIL, up to the switch interval. Here, in one process per
setting: 4 threads make GET requests in a loop to a local HTTP server (another
process) that answers after --delay-ms, as a reconcile's requests to a busy
apiserver; beside them one thread decodes and packs Deployments into a Store
with the operator's own projection, over and over. Measured per setting: the
requests' time on the client's clock (p50, p90, mean) and the objects packed
per second; and, apart, the packing thread alone (its rate must not depend on
the interval: with one thread running, nothing switches). Settings alternate,
--rounds times, so a drift of the shared host hits each alike.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

from bench import harness

HERE = Path(__file__).resolve().parent
RESULTS_JSON = HERE / "results" / "gil_switch.json"
RESULTS_MD = HERE / "RESULTS.gil_switch.md"
INTERVALS_MS = (5.0, 1.0)       # CPython's default, the Manager's
REQUEST_THREADS = 4

log = harness.logger("gil_switch")


def _serve(port: int, delay_seconds: float, ready) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True      # else delayed ACKs add 40 ms to each answer
        body = json.dumps({"kind": "Deployment", "pad": "x" * 3000}).encode()

        def do_GET(self):
            time.sleep(delay_seconds)
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.set()
    server.serve_forever()


def _deployments(count: int) -> list[bytes]:
    """Raw watch-like items: what a list's decoding starts from."""
    return [json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"d{i}", "namespace": "ns", "uid": f"00000000-0000-0000-0000-{i:012d}",
                     "resourceVersion": str(1000 + i), "generation": 1,
                     "labels": {"app.kubernetes.io/instance": f"d{i}",
                                "app.kubernetes.io/managed-by": "my-controller"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/instance": f"d{i}"}},
                 "template": {"metadata": {"labels": {"app.kubernetes.io/instance": f"d{i}"}},
                              "spec": {"containers": [{"name": "app", "image": "postgres:16",
                                                       "env": [{"name": "A", "value": "1"}]}]}}},
        "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1}}).encode()
        for i in range(count)]


def _one_setting(interval_ms: float, port: int, seconds: float, requests: bool,
                 packing: bool, out) -> None:
    """A child process: the setting's threads for `seconds`; its figures put on `out`."""
    sys.setswitchinterval(interval_ms / 1e3)
    from k8s_http.cache.store import Store
    import controller
    store = Store(transform=controller.DEPLOYMENT_PROJECTION)
    raw = _deployments(20000)
    stop = threading.Event()
    times: list[float] = []
    packed = [0]

    def pack() -> None:
        while not stop.is_set():
            for item in raw:
                if stop.is_set():
                    break
                store.upsert(json.loads(item))
                packed[0] += 1

    def request() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        while not stop.is_set():
            started = time.perf_counter()
            conn.request("GET", "/")
            conn.getresponse().read()
            times.append(time.perf_counter() - started)

    threads = ([threading.Thread(target=pack)] if packing else []) + \
        ([threading.Thread(target=request) for _ in range(REQUEST_THREADS)] if requests else [])
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    times.sort()
    out.put({"interval_ms": interval_ms, "requests": requests, "packing": packing,
             "seconds": seconds, "packed_per_second": round(packed[0] / seconds),
             "request_count": len(times),
             "request_p50_ms": round(statistics.median(times) * 1e3, 2) if times else None,
             "request_p90_ms": round(times[int(len(times) * 0.9)] * 1e3, 2) if times else None,
             "request_mean_ms": round(statistics.mean(times) * 1e3, 2) if times else None})


def measure(args, argv: list[str]) -> tuple[dict, Path]:
    ctx = multiprocessing.get_context("spawn")     # each setting in a fresh interpreter
    ready, out = ctx.Event(), ctx.Queue()
    server = ctx.Process(target=_serve, args=(args.port, args.delay_ms / 1e3, ready), daemon=True)
    server.start()
    if not ready.wait(10):
        raise RuntimeError("the local HTTP server did not start")
    data = {"meta": harness.brief_metadata("gil_switch", argv),
            "settings": {"seconds": args.seconds, "rounds": args.rounds,
                         "delay_ms": args.delay_ms, "request_threads": REQUEST_THREADS},
            "runs": []}
    cases = [(None, True, False)] + [(ms, True, True) for ms in INTERVALS_MS] + \
        [(ms, False, True) for ms in INTERVALS_MS]
    try:
        for round_ in range(args.rounds):
            for interval, requests, packing in cases:
                ms = INTERVALS_MS[0] if interval is None else interval
                child = ctx.Process(target=_one_setting,
                                    args=(ms, args.port, args.seconds, requests, packing, out))
                child.start()
                child.join()
                run = out.get(timeout=10)
                run["round"] = round_ + 1
                data["runs"].append(run)
                log(f"  round {round_ + 1}: {_label(run)}: {_figures(run)}")
    finally:
        server.terminate()
    return data, args.out or RESULTS_JSON


def _label(run: dict) -> str:
    if not run["packing"]:
        return "requests alone"
    what = "requests beside packing" if run["requests"] else "packing alone"
    return f"{what}, switch {run['interval_ms']:g} ms"


def _figures(run: dict) -> str:
    parts = []
    if run["requests"]:
        parts.append(f"requests p50 {run['request_p50_ms']} ms, p90 {run['request_p90_ms']} ms, "
                     f"mean {run['request_mean_ms']} ms ({run['request_count']})")
    if run["packing"]:
        parts.append(f"{run['packed_per_second']:,} objects packed/s")
    return "; ".join(parts)


def summarise(runs: list[dict]) -> list[dict]:
    """One row per case: the median of its rounds' figures."""
    rows: dict[str, list[dict]] = {}
    for run in runs:
        rows.setdefault(_label(run), []).append(run)
    out = []
    for label, same in rows.items():
        row = {"case": label}
        for key in ("request_p50_ms", "request_p90_ms", "request_mean_ms", "packed_per_second"):
            values = [r[key] for r in same if r.get(key) is not None and
                      (key != "packed_per_second" or r["packing"])]
            row[key] = statistics.median(values) if values else None
            if key == "packed_per_second" and row[key] is not None:
                row[key] = round(row[key])
        out.append(row)
    return out


def render(args, data: dict) -> None:
    meta, settings = data["meta"], data["settings"]
    rows = summarise(data["runs"])

    def cell(value, unit=""):
        return "–" if value is None else f"{value:,.1f}{unit}" if isinstance(value, float) \
            else f"{value:,}{unit}"
    lines = ["## GIL switch interval: requests beside a thread packing a list", "",
             f"    {meta['command']}", "",
             f"{meta['date']}, git {meta['git']}, {meta['machine']}, Python {meta['python']}, "
             f"load average at the start {', '.join(f'{x:.1f}' for x in meta['loadavg'])}.", "",
             f"{settings['request_threads']} threads make requests to a local server answering "
             f"after {settings['delay_ms']:g} ms; one thread decodes and packs Deployments "
             "into a Store with the operator's projection. Each case in a fresh process for "
             f"{settings['seconds']:g} s, {settings['rounds']} rounds alternating; medians of "
             "the rounds.", "",
             "| case | request p50 | p90 | mean | objects packed / s |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['case']} | {cell(row['request_p50_ms'], ' ms')} | "
                     f"{cell(row['request_p90_ms'], ' ms')} | {cell(row['request_mean_ms'], ' ms')} | "
                     f"{cell(row['packed_per_second'])} |")
    by_case = {row["case"]: row for row in rows}

    def ratio(key: str, case: str) -> str:
        slow, fast = (by_case.get(f"{case}, switch {ms:g} ms", {}).get(key) for ms in INTERVALS_MS)
        return "–" if not slow or not fast else f"{fast / slow:.2f}×"
    lines += ["", "1 ms ÷ 5 ms: requests beside packing, p50 "
              f"{ratio('request_p50_ms', 'requests beside packing')}, p90 "
              f"{ratio('request_p90_ms', 'requests beside packing')}; objects packed meanwhile "
              f"{ratio('packed_per_second', 'requests beside packing')} (the requests get more "
              "turns and make more requests); packing alone "
              f"{ratio('packed_per_second', 'packing alone')} (nothing switches when one thread "
              "runs: the host's noise).", "",
              "Why the Manager sets 1 ms (k8s_http/control/manager.py, GIL_SWITCH_SECONDS): "
              "beside a thread that never pauses, each of a request's wake-ups waits for the "
              "GIL up to the interval."]
    args.markdown.write_text("\n".join(lines) + "\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="per case and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--delay-ms", type=float, default=5.0, help="the server's answer time")
    p.add_argument("--port", type=int, default=18765)
    p.add_argument("--out", type=Path, default=None, help="default bench/results/gil_switch.json")
    p.add_argument("--markdown", type=Path, default=RESULTS_MD)
    p.add_argument("--from-json", type=Path, default=None,
                   help="only write the markdown report from an earlier results file")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        p.error("--seconds > 0 and --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main(argv, parse_args, measure=measure, render=render, log=log)
