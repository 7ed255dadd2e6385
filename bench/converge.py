#!/usr/bin/env python3
"""Side by side on the real control plane: my-controller, a controller-runtime peer, kopf.

    python -m bench converge --idle-seconds 30 --no-footprint   # make bench: 13-22 min, 2 cores
    python -m bench converge --quick             # smoke run: 20 objects, 1 run, ~3 minutes
    python -m bench converge --runs 1 --full '' --operators ours-w4,cr-w4
    python -m bench converge --pods-ready        # create -> Ready=True Available, with Pods:
                                                 # 100 one at a time, 200 at 5/s, 400 at 20/s

A local etcd + kube-apiserver + kube-controller-manager is started for the
benchmark (tests/support/controlplane.py, with an apiserver audit log to count
each operator's requests), or attached to with --cluster-dir. The CRD comes
from manifests/base/crd.yaml. Then, for each run, each operator in turn -- ours
(`python controller.py --workers N`), the controller-runtime v0.24 peer
(bench/peers/crpeer, Go, built by bench/peers/build_crpeer.sh into ~/.cache)
and the kopf peer (bench/peers/kopf_operator.py in bench/.venv-kopf, built on
first use from bench/requirements-kopf.txt) -- gets a fresh namespace and a
fresh process, and goes through:

  burst    create N My objects at --rate per second (0: as fast as the apiserver
           takes them); per object, create -> converged (its status first reflects
           its Deployment as it is at that moment), -> first status, -> steady, all
           seen by the bench's own watches (convergence/perobject.py); the operator's
           CPU seconds (/proc/PID/stat), peak RSS (VmHWM) and requests (audit log)
  idle     nothing changes for --idle-seconds: writes, CPU
  latency  one create at a time on the idle operator: create -> Deployment observed,
           create -> first status observed
  churn    one spec update (an env value) per object: time until every
           Deployment carries it
  startup  a new process with the objects present: start -> ready, and -> every
           object processed

The operators take turns within each run (the order reversed every other run),
so the machine's noise hits all of them alike. idle, latency, churn and startup
run at the largest size, for the operators in --full, in the first --full-runs
runs. Each figure is the median of the runs with min and max, and each
operator ÷ the controller-runtime peer within the same run (the headline).
Results: bench/results/converge.json and bench/RESULTS.converge.md.

--pods-ready measures instead what a user waits for on the plane with Pods
(kube-scheduler and kwok's fake Nodes): per object, create -> My Ready=True
Available, split into what the operator adds (create -> Deployment, and
Deployment available -> Ready) and what the plane does, at each of --ready-loads
(one at a time, then paced rates), with the operator's CPU, reconciles and
requests per My and the plane's CPU per My (convergence/ready.py). Results:
bench/results/converge_ready.json and its own section of bench/RESULTS.converge.md,
which the burst report carries over.
"""

from __future__ import annotations

import argparse
import contextlib
import pstats
import re
import subprocess
import time
from pathlib import Path

from bench import harness
from bench.convergence import footprint, ready, ready_report, report, scenarios
from bench.convergence.cluster import KCM_API_BURST, KCM_API_QPS, BenchCluster
from bench.convergence.observer import Observer
from bench.convergence.operators import (
    ControllerRuntimeOperator, KopfOperator, OperatorProcess, OurOperator, precompile,
)
from bench.convergence.floor_operator import FloorOperator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

ALL_OPERATORS = ("ours-w1", "ours-w4", "ours-w16", "cr-w4", "kopf")
# --pods-ready only: no operator, the least writes any operator makes (floor_operator.py).
FLOOR = FloorOperator.key
HEADLINE = "ours-w4"          # the default --workers: the configuration the goals are judged on
REFERENCE = "cr-w4"           # what the ratios are to: controller-runtime, 4 workers like ours
CRPEER_BUILD = HERE / "peers" / "build_crpeer.sh"


log = harness.logger("converge")


# ---------------------------------------------------------------- one operator, one size

class Bench:
    def __init__(self, args, cluster: BenchCluster, work_dir: Path):
        self.args = args
        self.cluster = cluster
        self.work_dir = work_dir
        self.settings = scenarios.Settings(
            replicas=args.replicas, idle_seconds=args.idle_seconds,
            latency_count=args.latency_count, create_rate=args.rate)
        self.python = harness.bench_python()
        self.kopf_venv = footprint.KOPF_VENV
        self._crpeer: Path | None = None

    def crpeer(self) -> Path:
        """The controller-runtime peer's binary, built on first use (cached by version)."""
        if self._crpeer is None:
            out = subprocess.run([str(CRPEER_BUILD)], check=True, capture_output=True,
                                 text=True).stdout.strip()
            self._crpeer = Path(out.splitlines()[-1])
        return self._crpeer

    def make_operator(self, key: str, namespace: str, profile_to: Path | None = None
                      ) -> OperatorProcess:
        common = dict(kubeconfig=self.cluster.kubeconfig, namespace=namespace,
                      log_dir=self.work_dir)
        if key == "kopf":
            return KopfOperator(venv=self.kopf_venv, **common)
        if key == FLOOR:
            return FloorOperator(self.cluster.kubeconfig, namespace)
        if key.startswith("cr-w"):
            return ControllerRuntimeOperator(workers=int(key.split("-w")[1]),
                                             binary=self.crpeer(), **common)
        return OurOperator(workers=int(key.split("-w")[1]), python=self.python,
                           profile_to=profile_to, **common)

    def run_size(self, key: str, size: int, run: int, *, full: bool,
                 profile_to: Path | None = None) -> dict:
        """A fresh namespace and process: burst, then (full) idle, latency, churn, startup."""
        namespace = f"cv-r{run}-{key}-{size}" + ("-prof" if profile_to else "")
        waited = self.cluster.wait_quiet()      # done with the last run's namespace
        if waited > 3.5:
            log(f"  waited {waited:.0f} s for the control plane to be quiet")
        self.cluster.create_namespace(namespace)
        observer = Observer(self.cluster.client, namespace).start()
        op = self.make_operator(key, namespace, profile_to)
        results: dict[str, dict] = {}
        interrupted = True                    # until the try block ends one way or another
        try:
            op.start(f"r{run}-{size}")
            op.wait_started(120.0)
            time.sleep(1.0)                   # let its watches open
            log(f"  {op.label}: burst of {size}")
            results[f"burst_{size}"] = scenarios.burst(self.cluster, observer, op, namespace,
                                                       size, self.settings)
            if full:
                log(f"  {op.label}: idle {self.settings.idle_seconds:.0f} s")
                results["idle"] = scenarios.idle(self.cluster, op, self.settings)
                log(f"  {op.label}: latency x{self.settings.latency_count}")
                results["latency"] = scenarios.latency(self.cluster, observer, op, namespace,
                                                       self.settings)
                log(f"  {op.label}: churn of {size}")
                results["churn"] = scenarios.churn(self.cluster, observer, op, namespace, size,
                                                   f"r{run}", self.settings)
                op.stop()
                log(f"  {op.label}: start-up with {size + self.settings.latency_count} objects")
                results["startup"] = scenarios.startup(
                    self.cluster, observer, op, size + self.settings.latency_count, self.settings,
                    f"r{run}-{size}-restart")
            interrupted = False
        except Exception:
            interrupted = False               # a failed scenario: clean up as usual
            raise
        finally:
            code = op.stop()
            observer.stop()
            # A namespace left behind is not idle: its Deployments never finish
            # rolling out (no scheduler, no kubelet), so ten minutes after their last
            # progress (progressDeadlineSeconds) kube-controller-manager rewrites every
            # one's status (ProgressDeadlineExceeded), a wave of ~1,000 writes that
            # lands in whichever later burst is running then -- in the fixed order of
            # the runs, the same operator's each time. So each namespace is deleted,
            # and the next operator starts on a plane that is done with it.
            # Interrupted (Ctrl-C): do not sit through the namespace's deletion.
            try:
                seconds = self.cluster.delete_namespace(namespace, wait=not interrupted)
            except TimeoutError as err:       # reported; the next run waits for quiet anyway
                log(f"  {op.label}: stopped (exit {code}); {err}")
            else:
                log(f"  {op.label}: stopped (exit {code}); namespace deleted in {seconds:.0f} s")
        return results


    def run_ready(self, key: str, load: "ready.Load", run: int) -> dict:
        """A fresh namespace and process: `load` creates, each until Ready=True Available."""
        namespace = f"rd-r{run}-{key}-{load.count}-" + ("serial" if load.rate is None
                                                         else f"{load.rate:g}ps".replace(".", "-"))
        waited = self.cluster.wait_quiet()
        if waited > 3.5:
            log(f"  waited {waited:.0f} s for the control plane to be quiet")
        quiet = ready.plane_rate(self.cluster)
        self.cluster.create_namespace(namespace)
        observer = Observer(self.cluster.client, namespace).start()
        profile = self.args.ready_profile
        op = self.make_operator(key, namespace, profile_to=(
            profile.with_name(f"{profile.stem}-r{run}-{load.key}{profile.suffix}")
            if profile is not None and key == HEADLINE else None))
        if isinstance(op, FloorOperator):
            op.watch_through(observer)
        interrupted = True
        try:
            op.start(f"r{run}-{load.key}")
            op.wait_started(120.0)
            time.sleep(1.0)                   # let its watches open
            log(f"  {op.label}: {load.title}, until each My is Ready=True Available")
            figures = ready.run_load(self.cluster, observer, op, namespace, load,
                                     self.settings, quiet)
            interrupted = False
            return figures
        except Exception:
            interrupted = False
            raise
        finally:
            code = op.stop()
            observer.stop()
            try:                              # see run_size
                seconds = self.cluster.delete_namespace(namespace, wait=not interrupted)
            except TimeoutError as err:
                log(f"  {op.label}: stopped (exit {code}); {err}")
            else:
                log(f"  {op.label}: stopped (exit {code}); namespace deleted in {seconds:.0f} s")

    def run_floor(self, size: int, run: int) -> dict:
        namespace = f"cv-floor{run}-{size}"
        self.cluster.create_namespace(namespace)
        observer = Observer(self.cluster.client, namespace).start()
        try:
            return scenarios.floor(self.cluster, observer, namespace, size, self.settings)
        finally:
            observer.stop()
            self.cluster.delete_namespace(namespace)      # see run_size


# ---------------------------------------------------------------- the profile

# C functions in which a thread waits rather than works (cProfile counts the wait as
# their own time): lock and queue waits, sleeps, socket and pipe I/O, select/poll.
BLOCKING = {"acquire", "wait", "select", "poll", "sleep", "recv", "recv_into", "accept",
            "read", "readinto", "readline", "join", "do_handshake", "connect", "send",
            "sendall", "write", "getaddrinfo"}
_C_FUNCTION = re.compile(r"^<(?:method|built-in method|function) '?([\w.]+)'?")


def _is_blocking(filename: str, func: str) -> bool:
    match = _C_FUNCTION.match(func) if filename == "~" else None
    return bool(match) and match.group(1).rsplit(".", 1)[-1] in BLOCKING


def summarise_profile(path: Path, top: int = 15) -> dict:
    """Top functions by own time, the blocking calls (threads waiting) set apart."""
    stats = pstats.Stats(str(path))
    rows = []
    for (filename, line, func), (cc, nc, tt, ct, _) in stats.stats.items():
        short = filename.replace(str(ROOT) + "/", "")
        if "site-packages/" in short:
            short = short.split("site-packages/", 1)[1]
        elif "/lib/python3" in short:
            short = "stdlib:" + short.split("/lib/python3", 1)[1].split("/", 1)[1]
        rows.append({"function": f"{short}:{line}({func})", "calls": nc,
                     "own_seconds": tt, "cumulative_seconds": ct,
                     "blocking": _is_blocking(filename, func)})
    busy = [r for r in rows if not r["blocking"]]
    busy_total = sum(r["own_seconds"] for r in busy)
    areas: dict[str, float] = {}
    for r in busy:
        fn = r["function"]
        if fn.startswith(("k8s_http/", "my/")):
            area = fn.split(":", 1)[0]
        elif fn.startswith("controller.py"):
            area = "controller.py"
        elif fn.startswith("stdlib:"):
            area = "stdlib " + fn[len("stdlib:"):].split("/", 1)[0].split(".py", 1)[0]
        elif fn.startswith("~:"):
            match = _C_FUNCTION.match(fn[len("~:0("):])
            area = "C: " + (match.group(1) if match else fn)
        else:                                   # a third-party package: its name
            area = fn.split(":", 1)[0].split("/", 1)[0]
        areas[area] = areas.get(area, 0.0) + r["own_seconds"]
    return {
        "busy_seconds": busy_total,
        "top_own": sorted(busy, key=lambda r: -r["own_seconds"])[:top],
        # Our own code only: where the time under each of our functions goes.
        # (Thread loops, called a handful of times, are left out: their time is waiting.)
        "top_cumulative": sorted((r for r in rows if r["function"].startswith(
                                     ("controller.py", "k8s_http/", "my/")) and r["calls"] >= 20),
                                 key=lambda r: -r["cumulative_seconds"])[:top],
        "areas": sorted(({"area": a, "own_seconds": s, "share": s / busy_total if busy_total
                          else 0.0} for a, s in areas.items()),
                        key=lambda a: -a["own_seconds"])[:top],
    }


# ---------------------------------------------------------------- metadata and output

def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def metadata(args, cluster: BenchCluster, argv: list[str]) -> dict:
    pins = dict(line.split("==", 1) for line in
                footprint.KOPF_REQUIREMENTS.read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    meta = harness.metadata("converge", argv, cluster, **{
        "kopf": pins.get("kopf"), "kubernetes (python client)": pins.get("kubernetes"),
        "client-go (peer)": harness.go_requirement("k8s.io/client-go"),
        "go": _run(["go", "env", "GOVERSION"])})
    meta["settings"] = {
        "sizes": args.sizes, "runs": args.runs, "operators": args.operators,
        "create_rate": args.rate, "full_runs": args.full_runs,
        "full_scenarios_for": args.full, "sweep_runs": args.sweep_runs,
        "floor_runs": args.floor_runs,
        "idle_seconds": args.idle_seconds, "latency_count": args.latency_count,
        "replicas_per_object": args.replicas,
        "load_threads": scenarios.Settings.load_threads,
        "write_counting": cluster.counter.source}
    return meta


def write_markdown(path: Path, data: dict) -> None:
    meta, agg, rat = data["meta"], data["operators"], data["ratios"]
    reference = data["reference"]
    labels = {k: v["label"] for k, v in data["labels"].items()}
    largest = max(meta["settings"]["sizes"])
    rate = meta["settings"].get("create_rate")
    out = [
        "# Convergence: my-controller, a controller-runtime peer and kopf on a real control "
        "plane",
        "",
        f"Generated by `bench/converge.py` on {meta['date']} (git {meta['git']}).",
        "",
        f"    {meta['command']}",
        "",
        f"Machine: {meta['machine']['cpus']} CPUs, {meta['machine']['memory_gib']} GiB, "
        f"{meta['machine']['platform']}, Python {meta['python']}; load average at start "
        f"{', '.join(f'{x:.2f}' for x in meta['machine']['load_average_at_start'])}. "
        "Everything -- etcd, kube-apiserver, kube-controller-manager, the operator and the "
        "bench's load generator and watchers -- shares these cores.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
        f"Settings: sizes {meta['settings']['sizes']} created at "
        f"{f'{rate:.0f}/s' if rate else 'once'}, {meta['settings']['runs']} run(s) of "
        f"{', '.join(meta['settings']['operators'])} taking turns (bursts); idle, latency, "
        f"churn and start-up in the first {meta['settings'].get('full_runs', 1)} run(s) for "
        f"{', '.join(meta['settings'].get('full_scenarios_for', [])) or 'none'}; "
        f"idle {meta['settings']['idle_seconds']:.0f} s, {meta['settings']['latency_count']} "
        f"latency samples, {meta['settings']['replicas_per_object']} replica(s) per My "
        "(kube-controller-manager makes the ReplicaSets and Pods; no kubelet runs them), "
        f"requests counted from {meta['settings']['write_counting']}.",
        "",
        f"Cells: median (min–max) over the runs. `÷ {labels.get(reference, reference).split(',')[0]}`: "
        f"the operator's figure divided by {labels.get(reference, reference)}'s from the same "
        "run (median and range of those ratios); below 1 is better.",
        "",
    ]
    if data.get("goals"):
        out += [f"## Goals ({labels.get(HEADLINE, HEADLINE)})", ""]
        out += report.goal_lines(data["goals"]) + [""]
    titles = {"burst": "Burst: create N objects" + (f" at {rate:.0f}/s" if rate else
                                                     " at once") + ", per object and overall",
              "idle": "Idle: after convergence, nothing changes",
              "latency": "Latency: one create at a time on an idle operator, create -> "
                         "Deployment observed",
              "churn": "Churn: one spec update per object, until every Deployment carries it",
              "startup": "Start-up with the objects present (ours: \"caches synced\", /readyz 200; kopf: first "
                         "handler run)"}
    scenario_names = []
    for figures in agg.values():
        for s in figures:
            if s not in scenario_names:
                scenario_names.append(s)
    order = sorted(scenario_names, key=lambda s: (list(titles).index(report.table_kind(s)),
                                                  int(s.split("_")[1]) if s.startswith("burst_")
                                                  else 0))
    for scenario in order:
        kind = report.table_kind(scenario)
        title = titles[kind] + (f" (N = {scenario.split('_')[1]})" if kind == "burst" else "")
        out += [f"## {title}", ""] + report.scenario_table(scenario, agg, rat, labels,
                                                           reference) + [""]
        if kind in ("burst", "churn", "idle", "startup"):
            out += _writes_breakdown(data["raw"], scenario, labels) + [""]
    if data.get("floor"):
        out += ["## Floor: the same objects made by the bench itself, no operator", "",
                "The bench creates each My, then at once its Deployment and Service (rendered "
                "by controller.py, create-only applies, "
                f"{meta['settings']['load_threads']} threads); the clock stops when "
                "kube-controller-manager has seen every Deployment -- the earliest any "
                "operator could write the statuses.", "",
                "| N | converged (s) | creates (s) | control plane CPU (s) |", "|---|---|---|---|"]
        for scenario, figs in data["floor"].items():
            cells = [f"{figs[k]['median']:.1f} ({figs[k]['min']:.1f}–{figs[k]['max']:.1f})"
                     if figs.get(k) else "–" for k in
                     ("converge_seconds", "creates_seconds", "control_plane_cpu_seconds")]
            out.append(f"| {scenario.split('_')[1]} | " + " | ".join(cells) + " |")
        out.append("")
    if data.get("footprint"):
        out += ["## Install footprint (clean virtualenv, pip/setuptools/wheel not counted)", "",
                "| contender | installed | site-packages (MiB) | distributions |",
                "|---|---|---|---|"]
        for key, fp in data["footprint"].items():
            out.append(f"| {key} | {fp['installed']} | {fp['site_packages_mib']:.1f} | "
                       f"{fp['distributions']} ({', '.join(fp['names'])}) |")
        out.append("")
    if data.get("profile"):
        out += _profile_section(data["profile"], largest)
    out += _analysis(data, largest, labels)
    if data.get("notes"):                     # added by hand to a results file, kept here
        out += ["## Notes", ""] + [f"- {note}" for note in data["notes"]] + [""]
    out += ["## Method notes", "",
            "- Times are measured by the bench: from just before each create (or update) "
            "to the arrival of the awaited watch event at the bench's own watchers.",
            "- Per object (bench/convergence/perobject.py): *converged* is the first moment "
            "the My's status reflects its Deployment as the Deployment is at that moment "
            "(status.observedGeneration == generation; replicas, readyReplicas and the Ready "
            "condition as the Deployment's current status says; a Deployment the Deployment "
            "controller has not looked at yet counts as 0 replicas, not rolled out). "
            "*First status*: the first version with observedGeneration == generation and a "
            "Ready condition. *Steady*: the last moment the status went from disagreeing to "
            "agreeing, i.e. once it shows the Deployment controller's final counts. "
            "*All converged*: first create -> the last My converged.",
            "- Requests: the apiserver's audit log, one line per request made with the admin "
            "credentials (which the operators use) and not by the bench's client. "
            "kube-controller-manager is not counted. Writes = create, update, patch, delete; "
            "a failed write (e.g. a create answered 409) counts. *Object writes* leave "
            "Events out: the Deployment, Service and My status writes.",
            "- CPU seconds: utime + stime of the operator process over the phase, "
            "including the settling writes that follow convergence (status updates as "
            "kube-controller-manager fills in the Deployments' status). Peak RSS: VmHWM.",
            "- Each size runs in a fresh process and namespace, deleted after the run; the "
            "next run starts once the control plane is quiet again (a namespace left behind "
            "is not idle: ten minutes after their last progress kube-controller-manager "
            "rewrites its Deployments' status, ProgressDeadlineExceeded, a wave of writes in "
            "a later burst). Every operator watches only its own namespace. The order of "
            "the operators is reversed every other run.",
            f"- kube-controller-manager runs with --kube-api-qps={KCM_API_QPS} "
            f"--kube-api-burst={KCM_API_BURST} (default 20/30, which leaves minutes of backlog "
            "after a 1000-object burst); otherwise the project's control plane as tests "
            "use it.",
            "- The controller-runtime peer (bench/peers/crpeer/main.go) is written as a "
            "controller-runtime user would: For(My) with GenerationChangedPredicate, "
            "Owns(Deployment, Service), MaxConcurrentReconciles 4, the children cached by "
            "the managed-by label, server-side apply (skipped when the cached child carries "
            "the hash of what it would apply) and a /status merge patch whenever the status "
            "it computes differs, from the Deployment as the apply answered or the cache "
            "shows it; client-side rate limiting off (controller-runtime's default).",
            "- kopf runs with its defaults except for progress storage in annotations, which "
            "the CRD's structural status schema requires; its handlers post the same Events "
            "as ours with `kopf.info()` (kopf no longer posts log lines as Events by default).",
            ""]
    kept = ready_report.kept_block(path)      # the --pods-ready section, carried over
    path.write_text("\n".join(out) + ("\n" + kept + "\n" if kept else ""))


def _first_runs(raw: dict, scenario: str, key: str) -> list[tuple[str, dict]]:
    """(operator, its first run's `key`) for each operator with a run that has it."""
    found = []
    for op, scenarios_ in raw.items():
        results = [r for r in scenarios_.get(scenario, []) if key in r]
        if results:
            found.append((op, results[0][key]))
    return found


def _writes_breakdown(raw: dict, scenario: str, labels: dict) -> list[str]:
    parts = [f"{labels.get(op, op)}: " + (", ".join(f"{k} {v}" for k, v in writes.items())
                                          or "none")
             for op, writes in _first_runs(raw, scenario, "writes_by_kind")]
    out = ["Writes in the first run, by verb and resource: " + "; ".join(parts) + "."] \
        if parts else []
    return out + _server_time(raw, scenario, labels)


def _server_time(raw: dict, scenario: str, labels: dict) -> list[str]:
    """The apiserver's own time per kind of write (audit: received -> response complete),
    p50 / mean over the first run: a write that waits on the apiserver shows here, not
    in the operator's CPU."""
    parts = [f"{labels.get(op, op)}: " + ", ".join(f"{kind} {ms['p50']:.0f} / {ms['mean']:.0f}"
                                                   for kind, ms in by_kind.items())
             for op, by_kind in _first_runs(raw, scenario, "server_ms_by_kind") if by_kind]
    return ["", "The apiserver's time per write in the first run, p50 / mean ms (audit log: "
            "received -> response complete): " + "; ".join(parts) + "."] if parts else []


def _profile_section(profile: dict, size: int) -> list[str]:
    out = [f"## Where our time goes: cProfile of the {size}-object burst "
           f"({profile['label']})", "",
           f"Every thread profiled (bench/convergence/profiled.py); {profile['busy_seconds']:.1f} "
           "s of own time outside blocking calls (lock waits, socket reads, sleeps). "
           f"Under the profiler the burst converged in {profile['converge_seconds']:.1f} s"
           + (f" on {profile['cpu_seconds']:.1f} CPU seconds" if "cpu_seconds" in profile
              else "") + ". cProfile charges a C function that releases the GIL (os.urandom, "
           "socket calls) with the time its thread then waits to get the GIL back, so with "
           "several threads busy the own times add up to more than the CPU time and those "
           "functions look heavier than they are; likewise the wait in a `with lock:` block "
           "is charged to the function that holds the block (a function of ours with a "
           "high own time per call is waiting, not computing). Read the shares as "
           "indicative.", "",
           "By area (own time, blocking calls excluded):", "",
           "| area | own (s) | share |", "|---|---|---|"]
    for a in profile["areas"][:12]:
        out.append(f"| {a['area']} | {a['own_seconds']:.2f} | {100 * a['share']:.0f}% |")
    out += ["", "Top functions by own time:", "",
            "| function | calls | own (s) | cumulative (s) |", "|---|---|---|---|"]
    for r in profile["top_own"]:
        out.append(f"| `{r['function']}` | {r['calls']} | {r['own_seconds']:.2f} | "
                   f"{r['cumulative_seconds']:.2f} |")
    out += ["", "Our functions by cumulative time (waits inside them included):", "",
            "| function | calls | cumulative (s) |", "|---|---|---|"]
    for r in profile["top_cumulative"]:
        out.append(f"| `{r['function']}` | {r['calls']} | {r['cumulative_seconds']:.2f} |")
    return out + [""]


def _analysis(data: dict, size: int, labels: dict) -> list[str]:
    """A short, data-driven reading of the burst figures against the reference."""
    agg, rat, reference = data["operators"], data["ratios"], data["reference"]
    burst = f"burst_{size}"

    def med(op, key, source=agg):
        fig = ((source.get(op) or {}).get(burst) or {}).get(key)
        return fig["median"] if fig else None

    out = ["## Analysis", ""]
    ref_label = labels.get(reference, reference)
    for op in agg:
        if op == reference:
            continue
        p50, p99, all_, cpu = (med(op, k, rat) for k in (
            "converged_p50_seconds", "converged_p99_seconds", "all_converged_seconds",
            "cpu_seconds"))
        if p50 and p99 and all_ and cpu:
            out.append(f"- {labels.get(op, op)} against {ref_label}: per-object converged "
                       f"p50 {p50:.2f}x, p99 {p99:.2f}x, all converged {all_:.2f}x, "
                       f"CPU {cpu:.2f}x (medians of the per-run ratios).")
    for op in agg:
        first = next(iter(data["raw"].get(op, {}).get(burst, [])), {})
        kinds = first.get("writes_by_kind") or {}
        statuses = sum(n for what, n in kinds.items() if what.endswith("my/status"))
        if kinds:
            out.append(f"- {labels.get(op, op)}: {statuses / size:.2f} status writes per My "
                       f"in the first run ({', '.join(f'{k} {v}' for k, v in kinds.items())}).")
    steady = {op: med(op, "all_steady_seconds") for op in agg}
    if all(steady.values()) and steady:
        out.append("- All steady (every status showing the Deployment controller's final "
                   "counts): " + ", ".join(f"{labels.get(op, op)} {t:.0f} s"
                                           for op, t in steady.items()) +
                   ": the end of kube-controller-manager's work, plus each operator's "
                   "last reaction to it.")
    return out + [""]


# ---------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="`make bench` runs it with --idle-seconds 30 --no-footprint (13-22 minutes "
               "on 2 cores); --quick is a smoke run.")
    parser.add_argument("--sizes", default="1000",
                        help="burst sizes, comma-separated; idle, latency, churn and start-up "
                             "run at the largest (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=None,
                        help="runs per figure, the operators taking turns (default: 2; "
                             "--pods-ready: 1)")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="My creates per second in a burst; 0: as fast as the apiserver "
                             "takes them (default: %(default)s)")
    parser.add_argument("--operators", default=None,
                        help="which of %s (default: ours-w4,cr-w4,kopf; --pods-ready: "
                             "ours-w4,cr-w4,%s: with --pods-ready only, %s is no operator "
                             "but the least writes any operator makes)"
                             % (", ".join(ALL_OPERATORS), FLOOR, FLOOR))
    parser.add_argument("--pods-ready", action="store_true",
                        help="instead of the bursts: per object, create -> My Ready=True "
                             "Available on the plane with Pods, split into what the operator "
                             "adds and what the plane does, at each of --ready-loads")
    parser.add_argument("--ready-loads", default="100@serial,200@5,400@20",
                        help="--pods-ready loads: COUNT@serial (one at a time) or COUNT@RATE "
                             "(creates per second), comma-separated (default: %(default)s)")
    parser.add_argument("--full-runs", type=int, default=1,
                        help="runs in which the --full operators also go through idle, "
                             "latency, churn and start-up (default: %(default)s)")
    parser.add_argument("--full", default="ours-w4,cr-w4,kopf",
                        help="the operators that, besides the bursts, go through idle, "
                             "latency, churn and start-up at the largest size (default: "
                             "%(default)s; the worker counts matter for bursts and churn)")
    parser.add_argument("--sweep-runs", type=int, default=1,
                        help="runs that include ours with other than 4 workers (their "
                             "bursts show how the worker count matters; default: "
                             "%(default)s)")
    parser.add_argument("--idle-seconds", type=float, default=120.0,
                        help="quiet period after convergence (default: 120)")
    parser.add_argument("--latency-count", type=int, default=50,
                        help="sequential creates for the latency figure (default: 50)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="spec.replicas of every My (default: 1)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: --sizes 20 --runs 1 --idle-seconds 5 --latency-count "
                             "10, no profile, no footprint")
    parser.add_argument("--floor-runs", type=int, default=0,
                        help="runs of the no-operator floor at the largest size (default: "
                             "%(default)s; 0 skips it)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    parser.add_argument("--ready-profile", type=Path, metavar="FILE",
                        help="--pods-ready: run ours under cProfile, every thread, one pstats "
                             "file per run and load (FILE's name + -rRUN-LOAD); with "
                             "BENCH_PROFILE_CPU=1 in the environment, CPU time instead of "
                             "wall time (bench/convergence/profiled.py). The profiler slows "
                             "ours: its figures are then not for comparing")
    parser.add_argument("--no-footprint", action="store_true",
                        help="skip the install footprint (it builds three venvs)")
    harness.add_output_arguments(
        parser, markdown=HERE / "RESULTS.converge.md",
        out_help="results JSON (default: bench/results/converge.json; --pods-ready: "
                 "bench/results/converge_ready.json)")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.pods_ready else 2
    if args.operators is None:
        args.operators = f"ours-w4,cr-w4,{FLOOR}" if args.pods_ready else "ours-w4,cr-w4,kopf"
    if args.out is None:
        args.out = HERE / "results" / ("converge_ready.json" if args.pods_ready
                                       else "converge.json")
    try:
        args.ready_loads = ready.parse_loads(args.ready_loads)
    except ValueError as err:
        parser.error(str(err))
    if args.quick:
        args.sizes, args.runs, args.idle_seconds, args.latency_count = "20", 1, 5.0, 10
        args.sweep_runs, args.floor_runs = 1, 0
        args.no_profile = args.no_footprint = True
    args.sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    args.operators = [o.strip() for o in args.operators.split(",") if o.strip()]
    args.full = [o.strip() for o in args.full.split(",") if o.strip()]
    unknown = [o for o in args.operators if o not in ALL_OPERATORS and
               not (o == FLOOR and args.pods_ready) and
               not (o.startswith(("ours-w", "cr-w")) and o.split("-w")[1].isdigit())]
    if unknown or not args.sizes or args.runs < 1 or min(args.sizes) < 1:
        parser.error(f"bad --operators {unknown} / --sizes / --runs")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main(argv, parse_args, measure=measure, render=render, log=log)


def render(args, data: dict) -> None:
    if "loads" in data:                       # a --pods-ready results file
        ready_report.splice(args.markdown, ready_report.section(data))
    else:
        write_markdown(args.markdown, data)


def measure(args, argv: list[str]) -> tuple[dict, Path]:
    """The bursts (and the full scenarios, the floor, the profile, the footprint)."""
    if args.pods_ready:
        return measure_ready(args, argv)
    with session(args, argv, "converge") as (cluster, bench, data):
        raw: dict[str, dict[str, list]] = {op: {} for op in args.operators}
        labels = {}
        largest = max(args.sizes)
        for run in range(1, args.runs + 1):
            # Every other run in reverse order, so no operator always goes first;
            # the worker sweep (ours with other than 4 workers) only in the first
            # --sweep-runs runs.
            order = [k for k in args.operators
                     if not (k.startswith("ours-w") and k != HEADLINE) or run <= args.sweep_runs]
            for key in (order if run % 2 else order[::-1]):
                for size in args.sizes:
                    log(f"run {run}/{args.runs}: {key}, {size} objects")
                    try:
                        results = bench.run_size(key, size, run,
                                                 full=size == largest and key in args.full
                                                 and run <= args.full_runs)
                    except Exception as err:          # recorded; the other runs go on
                        log(f"  FAILED: {err}")
                        results = {f"burst_{size}": {"error": str(err)}}
                    for scenario, figures in results.items():
                        raw[key].setdefault(scenario, []).append(figures)
                labels[key] = bench.make_operator(key, "x").label
        data["labels"] = {k: {"label": v} for k, v in labels.items()}
        data["raw"] = raw
        data["operators"] = report.aggregate(raw)
        reference = REFERENCE if REFERENCE in raw else "kopf"
        data["reference"] = reference
        data["ratios"] = report.ratios(raw, reference=reference)
        if HEADLINE in raw and reference in raw:
            data["goals"] = report.goals(data["operators"], data["ratios"],
                                         op=HEADLINE, size=largest, reference=reference)
        if args.floor_runs:
            floors = []
            for run in range(1, args.floor_runs + 1):
                log(f"floor {run}/{args.floor_runs}: {largest} objects made by the bench")
                floors.append(bench.run_floor(largest, run))
            data["floor"] = report.aggregate({"floor": {f"burst_{largest}": floors}})["floor"]
        if not args.no_profile and any(o.startswith("ours") for o in args.operators):
            prof = bench.work_dir / "controller.prof"
            log(f"profile: {HEADLINE}, burst of {largest}, under cProfile")
            results = bench.run_size(HEADLINE, largest, 0, full=False, profile_to=prof)
            data["profile"] = {"label": labels.get(HEADLINE, HEADLINE) + " under cProfile",
                               "converge_seconds":
                                   results[f"burst_{largest}"]["converge_seconds"],
                               "cpu_seconds": results[f"burst_{largest}"]["cpu_seconds"],
                               **summarise_profile(prof)}
        if not args.no_footprint:
            log("install footprint")
            data["footprint"] = footprint.footprints()
        return data, args.out


@contextlib.contextmanager
def session(args, argv: list[str], name: str):
    """The control plane (with Pods, started here or attached to), the CRD, the bench and
    the run's metadata; the plane stopped and the work dir removed at the end."""
    if "kopf" in args.operators:
        footprint.ensure_kopf_venv()
    with harness.control_plane(name, args, log, pods=True) as (cluster, work_dir):
        bench = Bench(args, cluster, work_dir)
        precompile(bench.python)
        yield cluster, bench, {"meta": metadata(args, cluster, argv)}


def measure_ready(args, argv: list[str]) -> tuple[dict, Path]:
    """--pods-ready: each load for each operator, taking turns, run after run."""
    with session(args, argv, "ready") as (cluster, bench, data):
        data["meta"]["settings"]["ready_loads"] = [l.key for l in args.ready_loads]
        data["meta"]["settings"]["fake_nodes"] = len(getattr(cluster.plane, "node_names", []))
        raw: dict[str, dict[str, list]] = {op: {} for op in args.operators}
        labels = {}
        for run in range(1, args.runs + 1):
            for load in args.ready_loads:
                order = args.operators if (run + args.ready_loads.index(load)) % 2 \
                    else args.operators[::-1]
                for key in order:
                    log(f"run {run}/{args.runs}: {key}, {load.title}")
                    try:
                        figures = bench.run_ready(key, load, run)
                    except Exception as err:          # recorded; the other runs go on
                        log(f"  FAILED: {err}")
                        figures = {"error": str(err)}
                    raw[key].setdefault(load.key, []).append(figures)
                    labels[key] = bench.make_operator(key, "x").label
        data["labels"] = {k: {"label": v} for k, v in labels.items()}
        data["loads"] = [{"key": l.key, "title": l.title, "count": l.count, "rate": l.rate}
                         for l in args.ready_loads]
        data["raw"] = raw
        data["operators"] = report.aggregate(raw)
        reference = REFERENCE if REFERENCE in raw else args.operators[-1]
        data["reference"], data["headline"] = reference, HEADLINE
        data["ratios"] = report.ratios(raw, reference=reference)
        if HEADLINE in raw and reference in raw and HEADLINE != reference:
            data["goals"] = ready_report.goals(data, op=HEADLINE, reference=reference,
                                               floor=FLOOR if FLOOR in raw else None)
        return data, args.out
