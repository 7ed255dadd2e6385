"""bench/RESULTS.shards.md from bench/shards.py's results (a dict, as in its JSON file),
and the one-line summaries it logs."""

from __future__ import annotations

from pathlib import Path

from bench.scaling.report import provenance
from bench.sharded import analysis

MIB = 1024 * 1024


def _num(value, spec: str, unit: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{unit}"


def _mib(value) -> str:
    return "–" if value is None else f"{value / MIB:.1f} MiB"


def _objects(replica: dict) -> str:
    """The `My` and children it caches, from k8s_http_cache_objects."""
    objects = replica.get("objects") or {}
    return " / ".join(f"{int(n):,}" for _, n in sorted(objects.items())) or "–"


def group_line(group: dict) -> str:
    if "error" in group:
        return f"error: {group['error']}"
    cells = [f"{r['name']}: ready {_num(r.get('ready_seconds'), '.2f')} s "
             f"(first {_num(r.get('ready_first_seconds'), '.2f')} s), "
             f"{_num(r.get('slots'), '.0f')} slots, RSS {r['rss_mib']:.1f} MiB, "
             f"read {_mib(r.get('read_bytes'))}" for r in group.get("replicas", [])]
    return "; ".join(cells) + f"; object writes {group.get('object_writes')}"


def converge_line(converge: dict) -> str:
    return (f"reconciled in {_num(converge.get('reconciled_seconds'), '.0f')} s, quiet after "
            f"{_num(converge.get('seconds'), '.0f')} s, {converge.get('writes')} writes "
            f"({converge.get('failed_writes')} refused)")


def failover_line(failover: dict) -> str:
    if "error" in failover:
        return f"error: {failover['error']}"
    before, rest = failover["before"], failover["rest"]
    return (f"waited {failover['waited']} of {failover['around']['created']} around the kill "
            f"(threshold {failover['threshold_seconds']:.2f} s); p50/p99 before "
            f"{_num(before['p50'], '.2f')}/{_num(before['p99'], '.2f')} s, rest "
            f"{_num(rest['p50'], '.2f')}/{_num(rest['p99'], '.2f')} s")


ROWS = (   # (label, key, format)
    ("slots held", "slots", lambda v: _num(v, ".0f")),
    ("objects cached (by resource)", None, None),
    ("start-up: spawn → ready with its share", "ready_seconds", lambda v: _num(v, ".2f", " s")),
    ("spawn → first /readyz 200", "ready_first_seconds", lambda v: _num(v, ".2f", " s")),
    ("changes of share", "share_changes", lambda v: _num(v, "d")),
    ("steady RSS (VmRSS)", "rss_mib", lambda v: _num(v, ".1f", " MiB")),
    ("peak RSS (VmHWM)", "peak_rss_mib", lambda v: _num(v, ".1f", " MiB")),
    ("bytes read, spawn → steady (rchar)", "read_bytes", _mib),
    ("bytes read, spawn → ready", "read_bytes_at_ready", _mib),
    ("CPU, spawn → steady", "cpu_seconds", lambda v: _num(v, ".1f", " s")),
)
COMPARED = {"ready_seconds", "rss_mib", "peak_rss_mib", "read_bytes", "cpu_seconds"}


def _gate_table(gate: str, run: dict) -> list[str]:
    single = (run.get("single") or {}).get("replicas") or []
    three = (run.get("three") or {}).get("replicas") or []
    comparison = run.get("comparison") or {}
    out = [f"### Gate {gate}", ""]
    bare = run.get("bare") or {}
    restart = run.get("apiserver") or {}
    out.append(f"kube-apiserver restarted in {_num(restart.get('apiserver_restart_seconds'), '.1f')}"
               f" s; the bare client's read of the fleet after it: "
               + (bare.get("error") or f"{_num(bare.get('seconds'), '.2f')} s") + ".")
    for what in ("single", "three"):
        group = run.get(what) or {}
        if group.get("error"):
            out.append(f"**{what} failed**: {group['error']}")
    out.append("")
    if not single and not three:
        return out
    heads = [r["name"] for r in single] + [r["name"] for r in three]
    out += ["| | " + " | ".join(heads) + " | largest of the replicas ÷ single |",
            "|---" * (len(heads) + 2) + "|"]
    for label, key, fmt in ROWS:
        if key is None:
            cells = [_objects(r) for r in single + three]
            out.append(f"| {label} | " + " | ".join(cells) + " | |")
            continue
        cells = [fmt(r.get(key)) for r in single + three]
        worst = (comparison.get(key) or {}).get("max_ratio") if key in COMPARED else None
        out.append(f"| {label} | " + " | ".join(cells) + f" | {_num(worst, '.2f', '×')} |")
    above = run.get("comparison_above_idle") or {}
    for key, label in (("rss_mib", "steady RSS above the idle replica"),
                       ("read_bytes", "bytes read above the idle replica")):
        c = above.get(key) or {}
        if c.get("single") is None:
            continue
        fmt = (lambda v: _num(v, ".1f", " MiB")) if key == "rss_mib" else _mib
        cells = [fmt(c["single"])] + [fmt(v) for v in c.get("values", [])]
        out.append(f"| {label} | " + " | ".join(cells) + f" | {_num(c.get('max_ratio'), '.2f', '×')} |")
    writes = [f"{what}: {run[what].get('object_writes')}" for what in ("single", "three")
              if what in run]
    loads = [f"{what}: " + ", ".join(f"{x:.1f}" for x in run[what].get("load_average_at_start", []))
             for what in ("single", "three") if what in run]
    out += ["", f"Writes to `My` and children over the runs (audit log; Leases apart): "
            f"{'; '.join(writes)}. Load average at each start: {'; '.join(loads)}.", ""]
    return out


def _failover_table(failover: dict, settings: dict) -> list[str]:
    out = ["### SIGKILL of one replica under a creation stream (gate on)", ""]
    if "error" in failover:
        return out + [f"Failed: {failover['error']}", ""]
    r = failover.get("recovery") or {}
    out += [f"{failover['created']} `My` created at {settings.get('stream_rate', '?'):g}/s over "
            f"{settings.get('stream_seconds', '?'):g} s; {failover['victim']} "
            f"({failover['victim_slots']} of 256 slots) SIGKILLed "
            f"{_num(failover.get('killed_at'), '.1f')} s in. After the kill: its slots held by "
            f"the survivors at {_num(r.get('claimed_after_kill'), '.1f')} s, their caches "
            f"synced with the new share (`/readyz` 200) at "
            f"{_num(r.get('recovered_after_kill'), '.1f')} s; their work queues "
            f"peaked at {_num(r.get('queue_peak'), '.0f')} keys at "
            f"{_num(r.get('queue_peak_after_kill'), '.1f')} s and were down to a tenth of that "
            f"at {_num(r.get('queue_drained_after_kill'), '.1f')} s (the list of the slots "
            "taken over queues their keys). Converged: the `My`'s first "
            f"status of its generation, written after both children. *Waited*: create → "
            f"converged above {failover['threshold_seconds']:.2f} s "
            f"({settings.get('slow_factor', analysis.SLOW_FACTOR):g}× the undisturbed p99). "
            f"Not converged in the end: {failover.get('not_converged')}; writes to `My` and "
            f"children: {failover.get('object_writes')}.", "",
            "| `My` created | count | create → converged p50 | p99 | max | never converged |",
            "|---|---|---|---|---|---|"]
    rows = (("undisturbed: converged before the kill", "before"),
            ("around the kill: created up to the survivors' recovery", "around"),
            ("… those that did not wait (the rest)", "rest"),
            ("… in the killed replica's slots", "around_in_killed_slots"),
            ("… in the survivors' slots", "around_in_survivors_slots"),
            ("after the recovery", "after"))
    for label, key in rows:
        f = failover.get(key) or {}
        out.append(f"| {label} | {f.get('created', f.get('count', 0))} | "
                   f"{_num(f.get('p50'), '.2f', ' s')} | {_num(f.get('p99'), '.2f', ' s')} | "
                   f"{_num(f.get('max'), '.2f', ' s')} | {f.get('never_converged', 0)} |")
    out += ["", f"Waited: {failover['waited']} of {failover['around']['created']} around the "
            f"kill, {failover.get('waited_in_survivors_slots', 0)} of them in the survivors' "
            "slots."]
    out += _waits_table(failover)
    trend = failover.get("before_trend")
    if trend is not None and trend > analysis.BACKLOG_TREND:
        out.append(f"**The replicas were falling behind the stream before the kill** (the "
                   f"undisturbed p50 grew {trend:.1f}× from its first quarter to its last): "
                   "the figures around the kill measure a backlog as much as the failover.")
    out.append("")
    return out


def _rejoin_table(rejoin: dict, data: dict) -> list[str]:
    out = ["### A replica joining the running ring (gate on, after the failover)", ""]
    if "error" in rejoin:
        return out + [f"Failed: {rejoin['error']}", ""]
    joiner = (rejoin.get("replicas") or [{}])[0]
    run = (data.get("gates") or {}).get("on") or {}
    single = ((run.get("single") or {}).get("replicas") or [{}])[0]
    three = (run.get("three") or {}).get("replicas") or []
    c = rejoin.get("comparison") or {}
    slots = lambda held: " + ".join(f"{h:.0f}" for h in held or []) or "–"
    out += [f"{joiner.get('name', '?')} spawned while the survivors served the fleet and the "
            f"stream's `My` (load average {', '.join(f'{x:.1f}' for x in rejoin.get('load_average_at_start', []))}); "
            f"their slots {slots(rejoin.get('survivors_slots_before'))} before, "
            f"{slots(rejoin.get('survivors_slots_after'))} after; the ring settled "
            f"{_num(rejoin.get('settled_seconds'), '.1f')} s after the spawn. Writes to `My` and "
            f"children meanwhile: {rejoin.get('object_writes')}. This is the start-up a rolling "
            "restart or a rescheduled Pod has; the goal above is judged on the replicas "
            "spawned together.", "",
            "| | single (on-solo) | joiner | joiner ÷ single |", "|---|---|---|---|"]
    for label, key, fmt in ROWS:
        if key is None:
            out.append(f"| {label} | {_objects(single)} | {_objects(joiner)} | |")
            continue
        ratio = c.get(key) if key in COMPARED else None
        out.append(f"| {label} | {fmt(single.get(key))} | {fmt(joiner.get(key))} | "
                   f"{_num(ratio, '.2f', '×')} |")
    per_slot = c.get("cpu_per_slot") or {}
    together = [r["cpu_seconds"] / r["slots"] for r in three
                if r.get("cpu_seconds") is not None and r.get("slots")]
    out.append(f"| CPU per slot held, spawn → steady | {_num(per_slot.get('single'), '.3f', ' s')} | "
               f"{_num(per_slot.get('joiner'), '.3f', ' s')} | "
               f"{_num(per_slot.get('ratio'), '.2f', '×')} |")
    if together and per_slot.get("single"):
        out += ["", "CPU per slot of the replicas spawned together, for comparison: "
                + ", ".join(f"{t:.3f} s ({t / per_slot['single']:.2f}×)" for t in together) + "."]
    out.append("")
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _each_ms(values) -> str:
    return " + ".join("–" if v is None else f"{v:.0f} ms" for v in values or []) or "–"


def _waits_table(failover: dict) -> list[str]:
    """The survivors' own `My` by creation time, each wait split where it went, beside
    the cores used meanwhile (runs before this table was added have no timeline)."""
    windows = failover.get("by_creation")
    if not windows:
        return []
    by_window = analysis.survivors_by_window(failover.get("survivors_samples") or [])
    out = ["", "The survivors' own `My` by creation time (seconds since the kill). Of those "
           "that waited, the p50 of each part: *queue* = create → the first apply of its "
           "Deployment received by the apiserver (watch delivery, work queue, a free worker); "
           "*write* = that apply → its first status write done (the reconcile's requests); "
           "*seen* = that write → the bench's watch shows it (audit log times, one clock). "
           "*Server* = over all of them, the p50 of the apiserver's own time on that first "
           "apply (audit: received → response complete). "
           "Beside it, over the same window: the cores used by each survivor and by kube-apiserver "
           "and etcd, and each survivor's mean work-queue wait and request time (its own "
           "metrics; a key queued low counts too).", "",
           "| created | count | waited | p50 | waited: queue | write | seen | server "
           "| survivors' cores | apiserver | etcd | survivors' queue wait | request |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in windows:
        used = by_window.get(w["from"]) or {}
        out.append(f"| {w['from']:g}–{w['to']:g} s | {w['created']} | {w['waited']} | "
                   f"{_num(w['p50'], '.2f', ' s')} | {_num(w['waited_queue_p50'], '.2f', ' s')} | "
                   f"{_num(w['waited_write_p50'], '.2f', ' s')} | "
                   f"{_num(w['waited_seen_p50'], '.2f', ' s')} | "
                   f"{_num(_ms(w.get('apply_server_p50')), '.0f', ' ms')} | "
                   f"{' + '.join(f'{c:.2f}' for c in used.get('survivors', [])) or '–'} | "
                   f"{_num(used.get('kube-apiserver'), '.2f')} | {_num(used.get('etcd'), '.2f')} | "
                   f"{_each_ms(used.get('queue_ms'))} | {_each_ms(used.get('request_ms'))} |")
    return out


def write_markdown(path: Path, data: dict) -> None:
    meta, settings = data.get("meta", {}), data["settings"]
    size = settings.get("size", 0)
    out = [f"## Sharded replicas: 1 vs {settings.get('replicas', 3)} at {size:,} `My`, "
           "apiserver gate off and on (issue 37 item 5)", "",
           f"    {meta.get('command', 'python -m bench shards')}", "",
           provenance(meta) + (f" Whole run: {meta['wall_seconds'] / 60:.1f} min."
                               if meta.get("wall_seconds") else ""), ""]
    out += ["Method: one local control plane, Pod-less (Deployment and ReplicaSet controllers "
            "off); a fleet of converged `My` (Deployment, "
            + ("ClusterIP" if settings.get("cluster_ip_services") else "headless")
            + " Service, both statuses; each child labelled with its owner's slot, as a "
            "`--shards=auto` replica renders it) made once, then one replica run over it "
            "until every `My` was reconciled (writes counted: 0 expected). Per gate, kube-apiserver is restarted on the "
            "same etcd data with `--feature-gates=ShardedListAndWatch=<gate>`, then one replica "
            f"and then {settings.get('replicas', 3)} replicas (spawned together), all "
            "`controller.py --shards=auto --workers "
            f"{settings.get('workers', 4)}`, are started over the fleet. *Start-up*: spawn → "
            "the first `/readyz` 200 after the replica's last change of share (its own slots "
            f"synced; polled every {settings.get('poll_seconds', 0.1):g} s). *Steady*: every "
            "replica ready, all 256 slots held, no change of share for "
            f"{settings.get('stable_seconds', 3):g} s, then "
            f"{settings.get('settle_seconds', 10):g} s more. *Bytes read*: `rchar` of "
            "/proc/PID/io from spawn (the operator counts no response bytes): the apiserver's "
            "answers as TLS records (OpenSSL reads with read(2)), uncompressed, plus the Python "
            "files imported at start (not the probes' plain HTTP, read with recv(2)); the idle "
            "replica (over an empty namespace) shows that fixed part. "
            "Ratios: each replica's figure ÷ the single replica's, the largest of the replicas "
            "judged.", ""]

    if data.get("goals"):
        out += ["### Goals", "", "| goal | target | measured | met? |", "|---|---|---|---|"]
        for g in data["goals"]:
            met = {True: "yes", False: f"**no**, by {g['by']}", None: "not measured"}[g["met"]]
            out.append(f"| {g['goal']} | {g['target']} | {g['measured']} | {met} |")
        out.append("")

    for gate, run in data.get("gates", {}).items():
        out += _gate_table(gate, run)
    if data.get("failover"):
        out += _failover_table(data["failover"], settings)
    if data.get("rejoin"):
        out += _rejoin_table(data["rejoin"], data)

    fleet, converge = data.get("fleet") or {}, data.get("converge") or {}
    idle = ((data.get("idle") or {}).get("replicas") or [{}])[0]
    out += ["### The fleet, the converge pass and the idle replica", ""]
    if fleet:
        out.append(f"Fleet: {fleet.get('created_my', 0):,} `My` made in "
                   f"{fleet.get('seconds', 0):.0f} s ({fleet.get('my_per_second', 0):.0f} `My`/s).")
    if converge:
        kinds = ", ".join(f"{n} {what}" for what, n in converge.get("writes_by_kind", {}).items())
        out.append(f"Converge pass (one replica over the fleet): {converge_line(converge)}"
                   + (f": {kinds}" if kinds else "") + ".")
    if idle:
        out.append(f"Idle replica: ready {_num(idle.get('ready_seconds'), '.2f')} s, RSS "
                   f"{_num(idle.get('rss_mib'), '.1f')} MiB, bytes read "
                   f"{_mib(idle.get('read_bytes'))}.")
    path.write_text("\n".join(out).rstrip() + "\n")
