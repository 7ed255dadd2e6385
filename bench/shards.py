"""Sharded replicas (issue 37 item 5): 1 vs 3 `--shards=auto` replicas over one fleet, gate off and on; a SIGKILL under a creation stream.

    python -m bench shards                      # 30,000 My, both gates, the failover
    python -m bench shards --size 2000          # a small fleet (a few minutes)
    python -m bench shards --size 2000 --gates on --no-failover    # one gate only
    python -m bench shards --from-json bench/results/shards.json   # the markdown only

One local control plane, Pod-less as the scale bench's (bench/scaling/plane.py:
the Deployment and ReplicaSet controllers off, no ReplicaSets or Pods; the
convergence bench's audit log counts every request of the replicas), kube-apiserver
with `--feature-gates=ShardedListAndWatch=<gate>`. In order:

  fleet     --size converged `My` in one namespace, grown once by the scale
            bench's Fleet (bench/scaling/fleet.py: Deployment and Service rendered
            by controller.py as a sharded replica renders them, with the owner's
            slot label; both statuses; headless Services unless
            --cluster-ip-services: the apiserver's ClusterIP allocator slows to
            ~9 My/s towards 30,000).
  converge  one `controller.py --shards=auto` replica over it until every `My` was
            reconciled, no child lacks its slot label and its reconciles stopped;
            then stopped. Its writes are counted: 0 when the fleet is what the
            operator leaves. (Children made without the label, as an unsharded
            operator makes them, cost the replica a 409, a read and an apply
            each: ~10 My/s on 2 shared cores, most of an hour at 30,000.)
  idle      one replica over an empty namespace: what the process costs by itself
            (the "above idle" figures take it off).
  per gate  (off, then on) kube-apiserver restarted on the same etcd data with the
            gate, the bare client's read of the fleet (`python -m bench bare`,
            timed; any first client pays the apiserver's cold caches), then
              single  one replica (it holds all 256 slots);
              three   --replicas replicas spawned together.
            Each replica's /readyz is polled every --poll-seconds. Its start-up is
            spawn -> the first 200 after its last change of share (ready with its
            own slots synced; a replica may be ready first with another share).
            Once every replica is ready, together holding every slot, with no
            change of share for --stable-seconds, and --settle-seconds more: RSS
            (VmRSS), peak RSS (VmHWM), bytes read (rchar of /proc/PID/io from
            spawn), CPU, slots and cached objects (/metrics); the replicas'
            requests from the audit log.
  failover  (gate on, the replicas of "three" kept) new `My` at --stream-rate for
            --stream-seconds, one replica SIGKILLed --kill-at seconds in. Per `My`,
            create -> converged: its first status of its generation (written after
            both children), as the bench's label-selected watch sees it.
  rejoin    (after the failover) a new replica spawned into the survivors' ring, as
            a rolling restart brings one: its start-up to ready with the share the
            survivors hand it, its figures once settled (beside the single
            replica's, per slot held), the writes meanwhile (0 expected).

Bytes read: the operator counts no response bytes, so rchar: every byte the
process got from read(2) and its kin, of any descriptor, but not recv(2). That
is the apiserver's responses as TLS records (OpenSSL reads its sockets with
read(2); ~0.1 % over the plain bytes; uncompressed: the client sends no
Accept-Encoding), plus the Python files it imports at start, its kubeconfig and
certificates; the idle replica shows that part. The bench's plain-HTTP /readyz
and /metrics requests are read with recv(2): not in it.

Goals of issue 37 item 5 (bench/sharded/analysis.py) are checked and printed.
Results: bench/results/shards.json (saved after each phase) and
bench/RESULTS.shards.md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import harness
from bench.convergence.observer import Observer
from bench.convergence.operators import OurOperator, precompile, reconciles_finished
from bench.convergence.perobject import PerObject
from bench.convergence.scenarios import my_object
from bench.scale import run_bare
from bench.scaling.analysis import MIB
from bench.scaling.bare import paged_list
from bench.scaling.fleet import Fleet
from bench.scaling.plane import APISERVER_ARGS, plane_settings
from bench.scaling.report import goal_text
from bench.sharded import analysis, report
from bench.soak import scrape
from k8s_http.control.sharding import decode_slots
from k8s_http.core.errors import ConflictError
from k8s_http.core.objects import DEPLOYMENTS, LEASES, SERVICES
from k8s_http.core.shards import slot_of
from my.spec import MY, SLOT_LABEL

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MARKDOWN = HERE / "RESULTS.shards.md"

NAMESPACE = "shards-fleet"
IDLE_NAMESPACE = "shards-idle"
RING_NAMESPACE = "shards-ring"          # the member Leases
APP = "my-controller"                   # the ring's name: the member Leases' prefix
SLOTS_ANNOTATION = "sharding.mine.jp/slots"
STREAM_LABEL = "bench.mine.jp/stream"
GATES = ("off", "on")
GATE_FLAG = "--feature-gates"

log = harness.logger("shards")


# ---------------------------------------------------------------- replicas

class ShardReplica(OurOperator):
    """`controller.py --shards=auto` as the Pod `pod_name`; each change of its share
    (a "claimed N slots" or "released N slots" log line, logged once the informers
    were told) counts as a processed line, so `last_processed_at` is the last one."""

    def __init__(self, *args, pod_name: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.pod_name = pod_name
        self.key = f"replica-{pod_name}"
        self.label = f"replica {pod_name}"
        self.env = {"POD_NAME": pod_name}
        self.processed_pattern = re.compile(r"(claimed|released) \d+ slots")

    def argv(self) -> list[str]:
        return [*super().argv(), "--shards", "auto",
                "--leader-election-namespace", RING_NAMESPACE]

    def readyz_ok(self) -> bool:
        return self._readyz() == 200

    def slots_held(self) -> float:
        return scrape(self.metrics_port, ("k8s_http_shard_slots_held",), only=True
                      ).get("k8s_http_shard_slots_held", 0.0)


def replica(cluster, work_dir: Path, args, pod_name: str, namespace: str) -> ShardReplica:
    return ShardReplica(cluster.kubeconfig, namespace, work_dir, workers=args.workers,
                        python=harness.bench_python(), pod_name=pod_name)


def stop_all(ops: list[ShardReplica], grace_seconds: float = 30.0) -> None:
    """SIGTERM to every live replica at once (stopped one by one, the others would
    claim and list each leaver's slots), then wait; SIGKILL after the grace period."""
    for op in ops:
        if op.alive():
            op.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for op in ops:
        if op.proc is None:
            continue
        try:
            op.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            op.proc.kill()
            op.proc.wait()
        op.stop()                       # exited: joins its output reader


def object_writes(counts) -> int:
    """Writes to `My` and children in an audit count (Leases and Events apart)."""
    return sum(n for what, n in counts.by_kind.items()
               if not what.endswith((" leases", " events")))


def writes_figures(counts) -> dict:
    """The writes of an audit count by kind, and those to `My` and children."""
    return {"writes_by_kind": dict(sorted(counts.by_kind.items())),
            "object_writes": object_writes(counts)}


CACHE_OBJECTS = re.compile(r'^k8s_http_cache_objects\{.*resource="([^"]+)"')


def _cache_objects(metrics: dict[str, float]) -> dict[str, int]:
    out = {}
    for key, value in metrics.items():
        m = CACHE_OBJECTS.match(key)
        if m:
            out[m.group(1)] = int(value)
    return out


def wait_settled(ops: list[ShardReplica], samples: dict, args, timeout: float) -> float:
    """Poll /readyz (and rchar) of every replica until they are settled
    (analysis.is_settled); seconds it took."""
    t0 = time.monotonic()
    held: list[float] = []
    while True:
        for op in ops:
            op.check_alive()
            ok = op.readyz_ok()
            samples[op.pod_name].append((time.monotonic() - op.started_at, ok, op.read_chars()))
        now = time.monotonic()
        quiet = [now - (op.last_processed_at or op.started_at) for op in ops]
        ready = [samples[op.pod_name][-1][1] for op in ops]
        if all(ready) and min(quiet) >= args.stable_seconds:
            held = [op.slots_held() for op in ops]
            if analysis.is_settled(ready=ready, held=held, quiet_seconds=quiet,
                                   stable_seconds=args.stable_seconds):
                return now - t0
        if now - t0 > timeout:
            raise TimeoutError(f"not settled within {timeout:.0f} s: ready {ready}, "
                               f"slots held {held or '?'}")
        time.sleep(args.poll_seconds)


def replica_figures(op: ShardReplica, samples: list[tuple[float, bool, int]]) -> dict:
    last_change = None if op.last_processed_at is None else op.last_processed_at - op.started_at
    first, ready = analysis.ready_times(((t, ok) for t, ok, _ in samples), last_change)
    metrics = scrape(op.metrics_port)
    return {
        "name": op.pod_name,
        "ready_first_seconds": first, "ready_seconds": ready,
        "share_changes": op.processed_lines,
        "slots": metrics.get("k8s_http_shard_slots_held"),
        "server_filtered": metrics.get("k8s_http_shard_server_filtered"),
        "objects": _cache_objects(metrics),
        "rss_mib": op.rss_bytes() / MIB, "peak_rss_mib": op.peak_rss_bytes() / MIB,
        "read_bytes": op.read_chars(),
        "read_bytes_at_ready": next((c for t, _, c in samples if t == ready), None),
        "cpu_seconds": op.cpu_seconds(),
        "log": str(op.log_path),
    }


def run_group(cluster, work_dir: Path, args, names: list[str], namespace: str, size: int, *,
              keep: bool = False) -> tuple[dict, list[ShardReplica]]:
    """`names` replicas spawned together over `namespace`, measured once settled; stopped
    unless `keep` (then the caller stops them; on a failure they are stopped here)."""
    waited = cluster.wait_quiet(timeout_seconds=120)
    out: dict = {"load_average_at_start": os.getloadavg(), "quiet_wait_seconds": waited,
                 "replicas": []}
    ops = [replica(cluster, work_dir, args, name, namespace) for name in names]
    mark = cluster.counter.mark()
    samples: dict[str, list] = {name: [] for name in names}
    try:
        for op in ops:
            op.start(op.pod_name)
        out["settled_seconds"] = wait_settled(
            ops, samples, args, args.timeout_seconds + size * args.timeout_per_my)
        time.sleep(args.settle_seconds)
        out["replicas"] = [replica_figures(op, samples[op.pod_name]) for op in ops]
    except Exception as err:              # recorded; the run goes on
        log(f"  FAILED: {err}")
        out["error"] = str(err)
        keep = False
    finally:
        if not keep:
            stop_all(ops)
        counts = cluster.counter.since(mark)
        out.update(writes_figures(counts))
        out["reads_by_kind"] = dict(sorted(counts.reads_by_kind.items()))
    return out, ops


# ---------------------------------------------------------------- phases

def converge_fleet(cluster, work_dir: Path, args, size: int) -> dict:
    """One replica over the fleet until every `My` was reconciled, every child carries
    its slot label and its reconciles stopped; then stopped. Its writes: 0 expected."""
    mark = cluster.counter.mark()
    op = replica(cluster, work_dir, args, "converge", NAMESPACE)
    t0 = time.monotonic()
    deadline = t0 + args.timeout_seconds + size * args.converge_seconds_per_my
    unlabelled = f"!{SLOT_LABEL}"
    out: dict = {}
    try:
        op.start("converge")
        last_log = t0
        # Every My reconciled once (cheap to ask: /metrics), then no child left without
        # the label (a list of what is left; asked again until nothing is).
        while True:
            op.check_alive()
            reconciled = reconciles_finished(op.metrics_port)
            if reconciled >= size and not any(
                    paged_list(cluster.client, resource, NAMESPACE, unlabelled)
                    for resource in (DEPLOYMENTS, SERVICES)):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"children still unlabelled after {deadline - t0:.0f} s")
            if time.monotonic() - last_log > 30:
                last_log = time.monotonic()
                log(f"  converge: {reconciled:,} reconciles after {last_log - t0:.0f} s")
            time.sleep(2.0)
        out["reconciled_seconds"] = time.monotonic() - t0
        # Then until no reconcile for a while (the echoes of its own writes).
        count, since = -1, time.monotonic()
        while time.monotonic() - since < 3.0 and time.monotonic() < deadline:
            now_count = reconciles_finished(op.metrics_port)
            if now_count != count:
                count, since = now_count, time.monotonic()
            time.sleep(0.5)
        out["seconds"] = time.monotonic() - t0
        out["reconciles"] = count
    finally:
        stop_all([op])
    counts = cluster.counter.since(mark)
    out.update(writes=counts.writes, failed_writes=counts.failed_writes,
               writes_by_kind=dict(sorted(counts.by_kind.items())))
    return out


def set_gate(cluster, gate: str) -> dict:
    """kube-apiserver restarted (SIGTERM, same port and etcd data) with the gate; then the
    plane left to quiet down."""
    plane = cluster.plane
    t0 = time.monotonic()
    plane.kill_apiserver(signal.SIGTERM)
    plane.set_apiserver_flag(GATE_FLAG, f"ShardedListAndWatch={'true' if gate == 'on' else 'false'}")
    plane.start_apiserver()
    started = time.monotonic() - t0
    return {"apiserver_restart_seconds": started,
            "quiet_wait_seconds": cluster.wait_quiet(timeout_seconds=180)}


def lease_slots(cluster, pod_name: str) -> frozenset[int]:
    lease = cluster.client.get(LEASES, f"{APP}-member-{pod_name}", namespace=RING_NAMESPACE)
    return decode_slots(((lease.get("metadata") or {}).get("annotations") or {})
                        .get(SLOTS_ANNOTATION))


def failover(cluster, ops: list[ShardReplica], args) -> dict:
    """The creation stream with a SIGKILL of ops[0] in the middle (see the module doc)."""
    count = round(args.stream_rate * args.stream_seconds)
    names = [f"stream-{i:05d}" for i in range(count)]
    observer = Observer(cluster.client, NAMESPACE, kinds=("my",),
                        label_selector=f"{STREAM_LABEL}=true").start()
    per = PerObject(names)
    observer.listen(per)
    slots: dict[str, int] = {}
    failures: list[str] = []
    victim, survivors = ops[0], ops[1:]
    mark = cluster.counter.mark()

    def create(index: int, name: str) -> None:
        delay = t0 + index / args.stream_rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = my_object(name, "stream", replicas=1)
        body["metadata"]["labels"] = {STREAM_LABEL: "true"}
        per.sent(name, time.monotonic())
        try:
            made = cluster.client.create(MY, body, namespace=NAMESPACE)
        except ConflictError:
            return
        except Exception as err:           # counted; the stream goes on
            failures.append(f"{name}: {err}")
            return
        slots[name] = slot_of(made["metadata"]["uid"])

    def converged() -> bool:
        # Converged = its first status of its generation (`first_status`): the bench
        # watches only the stream's `My`, not their Deployments.
        return all(f.done() for f in futures) and len(per.first_status) >= len(slots)

    t0 = time.monotonic()
    with ThreadPoolExecutor(args.load_threads) as pool:
        futures = [pool.submit(create, i, name) for i, name in enumerate(names)]
        time.sleep(max(0.0, t0 + args.kill_at - time.monotonic()))
        dead_slots = lease_slots(cluster, victim.pod_name)
        victim.proc.kill()
        killed = time.monotonic()
        wall_at_kill = time.time()
        log(f"  SIGKILL {victim.pod_name} ({len(dead_slots)} slots) at {killed - t0:.1f} s")
        samples = follow(cluster, survivors, killed, converged, max(args.poll_seconds, 0.25),
                         t0 + args.stream_seconds + args.stream_timeout_seconds)
    observer.stop()
    victim.stop()
    counts = cluster.counter.since(mark)
    changed = [op.last_processed_at for op in survivors if op.last_processed_at is not None]
    recovery = analysis.recovery(samples, max(changed) - killed if changed else None)
    log(f"  survivors: {recovery}")
    recovered = (None if recovery["recovered_after_kill"] is None
                 else killed + recovery["recovered_after_kill"])
    figures = analysis.failover_figures(per.created, per.first_status, slots, dead_slots,
                                        killed, recovered, slow_factor=args.slow_factor)
    owners = {slot: op.pod_name for op in survivors
              for slot in lease_slots(cluster, op.pod_name)}
    timeline = stream_timeline(per, slots, owners, dead_slots, killed,
                               cluster.counter.first_writes(mark, set(slots)), wall_at_kill)
    figures["by_creation"] = analysis.waits_by_creation(timeline, figures.get("threshold_seconds"))
    return {"created": count - len(failures), "create_failures": failures[:10],
            "victim": victim.pod_name, "victim_slots": len(dead_slots),
            "killed_at": killed - t0, "recovery": recovery,
            "not_converged": len(set(slots) - set(per.first_status)),
            "object_writes": object_writes(counts),
            "survivors_samples": samples, "timeline": timeline, **figures}


def stream_timeline(per: PerObject, slots: dict[str, int], owners: dict[int, str],
                    dead_slots: frozenset[int], killed: float,
                    writes: dict[str, dict[str, tuple]], wall_at_kill: float) -> list[dict]:
    """One row per `My` of the stream, times in seconds since the kill: its create sent,
    the operator's first apply of its Deployment as the apiserver received it (the
    reconcile had started: before it, watch delivery and the queue), its first status
    write done (apiserver), and that status seen by the bench's watch; `apply_server`:
    the apiserver's own time on that apply (received -> response complete), which
    tells a slow server from a slow operator. `owner`: the survivor holding its slot
    at the end; `dead`: in the killed replica's slots."""
    def rel(wall):
        return None if wall is None else round(wall - wall_at_kill, 3)
    rows = []
    for name, slot in sorted(slots.items(), key=lambda item: per.created[item[0]]):
        first = writes.get(name, {})
        applied = first.get("patch deployments") or (None, None)
        status = per.first_status.get(name)
        rows.append({
            "name": name, "slot": slot, "dead": slot in dead_slots, "owner": owners.get(slot),
            "created": round(per.created[name] - killed, 3),
            "deployment_applied": rel(applied[0]),
            "apply_server": None if applied[0] is None else round(applied[1] - applied[0], 4),
            "status_written": rel((first.get("patch my/status") or (None, None))[1]),
            "seen": None if status is None else round(status - killed, 3)})
    return rows


def rejoin(cluster, work_dir: Path, args, survivors: list[ShardReplica], name: str,
           size: int) -> dict:
    """A new replica spawned into the running ring after the failover, as a rolling
    restart or a rescheduled Pod brings one: the survivors, holding every slot, hand
    it its share through the drain handshake while they keep serving. Its start-up
    (spawn -> ready with that share) and figures once the ring has settled, and the
    writes to `My` and children meanwhile (0 expected). Alone of the phases, the
    replica measured starts while no other replica starts: what it costs per slot
    is not inflated by two others listing beside it on the same cores."""
    joiner = replica(cluster, work_dir, args, name, NAMESPACE)
    ops = [*survivors, joiner]
    samples: dict[str, list] = {op.pod_name: [] for op in ops}
    out: dict = {"load_average_at_start": os.getloadavg(),
                 "survivors_slots_before": [op.slots_held() for op in survivors]}
    mark = cluster.counter.mark()
    try:
        joiner.start(name)
        out["settled_seconds"] = wait_settled(
            ops, samples, args, args.timeout_seconds + size * args.timeout_per_my)
        time.sleep(args.settle_seconds)
        out["replicas"] = [replica_figures(joiner, samples[name])]
        out["survivors_slots_after"] = [op.slots_held() for op in survivors]
    except Exception as err:              # recorded; the run goes on
        log(f"  FAILED: {err}")
        out["error"] = str(err)
    finally:
        stop_all([joiner])
        out.update(writes_figures(cluster.counter.since(mark)))
    return out


# Histograms of each survivor sampled by follow() (their _sum and _count, every label
# set added up): its work queue's wait, its reconciles' time, its requests' time.
TIMINGS = {"queue": "workqueue_queue_duration_seconds", "work": "workqueue_work_duration_seconds",
           "request": "rest_client_request_duration_seconds"}


def follow(cluster, survivors: list[ShardReplica], killed: float, done, poll: float,
           deadline: float) -> list[dict]:
    """The survivors after the kill, every `poll` seconds until `done()` (or the
    deadline): /readyz, slots held, work queue depth, CPU seconds and the TIMINGS
    histograms' sums and counts of each (analysis.recovery and
    analysis.survivors_by_window read them), and the plane's processes' CPU
    seconds. Less often than at start-up: each sample reads their /metrics while
    they serve the stream."""
    wanted = ("k8s_http_shard_slots_held", "workqueue_depth",
              *(f"{name}_{part}" for name in TIMINGS.values() for part in ("sum", "count")))
    samples = []
    while not done() and time.monotonic() < deadline:
        ready, held, queued, timings = [], [], [], []
        for op in survivors:
            metrics = scrape(op.metrics_port, wanted, only=True)
            held.append(metrics.get("k8s_http_shard_slots_held", 0.0))
            queued.append(sum(v for k, v in metrics.items() if k.startswith("workqueue_depth")))
            timings.append({what: [sum(v for k, v in metrics.items()
                                       if k.startswith(f"{name}_{part}")) for part in ("sum", "count")]
                            for what, name in TIMINGS.items()})
            ready.append(op.readyz_ok())
        cpu = [round(op.cpu_seconds(), 2) for op in survivors]
        plane = cluster.process_cpu()
        samples.append({"t": round(time.monotonic() - killed, 2), "ready": ready,
                        "held": held, "queued": queued, "cpu": cpu, "timings": timings,
                        "plane_cpu": {k: round(v, 2) for k, v in plane.items()}})
        time.sleep(poll)
    return samples


# ---------------------------------------------------------------- the whole run

def summarise(data: dict) -> None:
    """Ratios per gate and the goals, added to `data` in place."""
    idle = (data.get("idle") or {}).get("replicas") or [{}]
    for run in data["gates"].values():
        single = ((run.get("single") or {}).get("replicas") or [None])[0]
        three = (run.get("three") or {}).get("replicas") or []
        run["comparison"] = {key: analysis.compare(single, three, key)
                             for key in ("rss_mib", "read_bytes", "ready_seconds",
                                         "peak_rss_mib", "cpu_seconds")}
        run["comparison_above_idle"] = {
            key: analysis.compare(single, three, key, baseline=idle[0].get(key))
            for key in ("rss_mib", "read_bytes")}
    rejoined = (data.get("rejoin") or {}).get("replicas")
    single = (((data["gates"].get("on") or {}).get("single") or {}).get("replicas") or [None])[0]
    if rejoined:
        data["rejoin"]["comparison"] = analysis.compare_joiner(single, rejoined[0])
    data["goals"] = [g.as_dict() for g in analysis.goals(data["gates"], data.get("failover"))]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=30000, help="`My` in the fleet (default %(default)s)")
    p.add_argument("--gates", default=",".join(GATES),
                   help="ShardedListAndWatch settings to measure, run off first "
                        "(default %(default)s)")
    p.add_argument("--replicas", type=int, default=3, help="replicas of the sharded run")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--threads", type=int, default=16, help="fleet-creating threads")
    p.add_argument("--cluster-ip-services", action="store_true",
                   help="the fleet's Services get ClusterIPs (default headless: see the doc)")
    p.add_argument("--poll-seconds", type=float, default=0.1, help="/readyz polling")
    p.add_argument("--stable-seconds", type=float, default=3.0,
                   help="no change of share for this long = settled")
    p.add_argument("--settle-seconds", type=float, default=10.0,
                   help="after settled, before RSS and bytes are read")
    p.add_argument("--timeout-seconds", type=float, default=180.0)
    p.add_argument("--timeout-per-my", type=float, default=0.02)
    p.add_argument("--converge-seconds-per-my", type=float, default=0.1,
                   help="time allowed to the converge phase per My, beyond --timeout-seconds")
    p.add_argument("--no-failover", dest="failover", action="store_false",
                   help="skip the SIGKILL under a creation stream")
    p.add_argument("--stream-rate", type=float, default=20.0, help="new My per second")
    p.add_argument("--stream-seconds", type=float, default=60.0)
    p.add_argument("--kill-at", type=float, default=30.0, help="seconds into the stream")
    p.add_argument("--stream-timeout-seconds", type=float, default=300.0,
                   help="after the last create, how long the stream may take to converge")
    p.add_argument("--slow-factor", type=float, default=analysis.SLOW_FACTOR,
                   help="waited = create -> converged above this times the undisturbed p99")
    p.add_argument("--load-threads", type=int, default=8)
    harness.add_output_arguments(p, out_help="default bench/results/shards.json",
                                 markdown=MARKDOWN)
    args = p.parse_args(argv)
    if args.cluster_dir is not None:
        p.error("--cluster-dir: this bench restarts kube-apiserver with other flags, which an "
                "attached plane's supervisor does not allow; it starts its own plane")
    gates = [g for g in args.gates.split(",") if g]
    if not gates or set(gates) - set(GATES):
        p.error(f"--gates: any of {', '.join(GATES)}, not {args.gates!r}")
    args.gates = [g for g in GATES if g in gates]        # off first: the failover ends gate on
    if args.failover and "on" not in args.gates:
        p.error("the failover runs with the gate on: add it to --gates, or --no-failover")
    if args.replicas < 2 or args.size < 1:
        p.error("--replicas: at least 2; --size: at least 1")
    if not 0 < args.kill_at < args.stream_seconds:
        p.error("--kill-at: inside the stream")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main(argv, parse_args, measure=measure, render=render, log=log)


def render(args, data: dict) -> None:
    """RESULTS.shards.md from `data`: ratios and goals worked out again (an interrupted
    run's partial file has none yet)."""
    summarise(data)
    report.write_markdown(args.markdown, data)


def measure(args, argv: list[str]) -> tuple[dict, Path]:
    plane_settings()
    precompile(harness.bench_python())
    out = args.out or RESULTS / "shards.json"
    data: dict = {"settings": {k: (str(v) if isinstance(v, Path) else v)
                               for k, v in vars(args).items()},
                  "gates": {}}
    first_gate = f"{GATE_FLAG}=ShardedListAndWatch={'true' if args.gates[0] == 'on' else 'false'}"
    with harness.control_plane("shards", args, log, pods=False,
                               apiserver_args=(*APISERVER_ARGS, first_gate),
                               what="the control plane (Pod-less)") as (cluster, work_dir):
        for namespace in (NAMESPACE, IDLE_NAMESPACE, RING_NAMESPACE):
            cluster.create_namespace(namespace)
        data["meta"] = harness.metadata("shards", argv, cluster)
        names = [chr(ord("a") + i) for i in range(args.replicas)]

        log(f"fleet: growing to {args.size:,} My")
        fleet = Fleet(cluster.client, NAMESPACE, threads=args.threads,
                      headless=not args.cluster_ip_services, slot_label=SLOT_LABEL,
                      progress=log)
        data["fleet"] = fleet.grow_to(args.size).as_dict()
        log(f"  {data['fleet']}")
        harness.save(out, data)

        log("converge: one replica over the fleet (nothing to write, expected)")
        data["converge"] = converge_fleet(cluster, work_dir, args, args.size)
        log(f"  {report.converge_line(data['converge'])}")
        harness.save(out, data)

        log("idle: one replica over an empty namespace")
        data["idle"], _ = run_group(cluster, work_dir, args, ["idle"], IDLE_NAMESPACE, 0)
        log("  " + report.group_line(data["idle"]))

        for gate in args.gates:
            run = data["gates"][gate] = {}
            log(f"gate {gate}: restarting kube-apiserver with ShardedListAndWatch "
                f"{'on' if gate == 'on' else 'off'}")
            run["apiserver"] = set_gate(cluster, gate)
            run["bare"] = run_bare(cluster, args.size, "stream", namespace=NAMESPACE)
            log(f"  bare client read: {run['bare']}")
            log(f"  1 replica over {args.size:,} My")
            run["single"], _ = run_group(cluster, work_dir, args, [f"{gate}-solo"], NAMESPACE,
                                         args.size)
            log("    " + report.group_line(run["single"]))
            keep = args.failover and gate == "on"
            log(f"  {args.replicas} replicas over {args.size:,} My")
            run["three"], ops = run_group(cluster, work_dir, args,
                                          [f"{gate}-{n}" for n in names], NAMESPACE, args.size,
                                          keep=keep)
            log("    " + report.group_line(run["three"]))
            harness.save(out, data)
            if keep and "error" not in run["three"]:
                log(f"failover: {args.stream_rate:g} new My/s for {args.stream_seconds:g} s, "
                    f"SIGKILL of one replica at {args.kill_at:g} s")
                try:
                    data["failover"] = failover(cluster, ops, args)
                    log("  " + report.failover_line(data["failover"]))
                    harness.save(out, data)
                    joiner = f"{gate}-{chr(ord('a') + args.replicas)}"
                    log(f"rejoin: {joiner} spawned into the ring of the survivors")
                    data["rejoin"] = rejoin(cluster, work_dir, args, ops[1:], joiner,
                                            args.size)
                    log("    " + report.group_line(data["rejoin"]))
                finally:
                    stop_all(ops)
                harness.save(out, data)
    summarise(data)
    for goal in data["goals"]:
        log(goal_text(goal))
    return data, out
