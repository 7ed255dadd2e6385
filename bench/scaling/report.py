"""bench/RESULTS.scale.md from bench/scale.py's results (a dict, as in its JSON file)."""

from __future__ import annotations

from pathlib import Path

REFERENCE = "cr-w4"
HEADLINE = "ours-w4"


def _num(value, spec: str, unit: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{unit}"


def _ratio(value, reference) -> str:
    if value is None or not reference:
        return ""
    return f" · {value / reference:.2f}×"


def one_line(run: dict) -> str:
    """A run's figures on one log line."""
    if "error" in run:
        return f"error: {run['error']} (writes {run.get('writes')})"
    return (f"ready {_num(run.get('ready_seconds'), '.2f')} s, all reconciled "
            f"{_num(run.get('all_reconciled_seconds'), '.2f')} s ({run.get('reconciles')}), "
            f"CPU {_num(run.get('cpu_seconds'), '.2f')} s, "
            f"peak {_num(run.get('peak_rss_mib'), '.1f')} MiB, "
            f"settled {_num(run.get('settled_rss_mib'), '.1f')} MiB, "
            f"idle {_num(run.get('idle_cpu_percent'), '.2f')} %, writes {run.get('writes')}"
            + (f", new My at ready -> converged {run['new_my_seconds']} s"
               if "new_my_seconds" in run else ""))


def goal_text(goal: dict) -> str:
    met = {True: "met", False: "MISSED", None: "not measured"}[goal["met"]]
    by = f" (by {goal['by']})" if goal.get("by") else ""
    return f"goal {goal['goal']}: {goal['measured']} vs {goal['target']}: {met}{by}"


ROWS = (   # (label, key, format, unit, ratio to the peer?)
    ("ready (spawn → caches filled)", "ready_seconds", ".2f", " s", True),
    ("every key reconciled once", "all_reconciled_seconds", ".2f", " s", True),
    ("CPU to every key reconciled (utime+stime)", "cpu_seconds_to_all_reconciled", ".2f", " s",
     True),
    ("peak RSS (VmHWM)", "peak_rss_mib", ".1f", " MiB", True),
    ("RSS after settling", "settled_rss_mib", ".1f", " MiB", True),
    ("idle CPU, % of a core", "idle_cpu_percent", ".2f", " %", False),
    ("writes (audit log)", "writes", "d", "", False),
)


def _size_table(size: str, runs: dict, operators: list[str], bare: dict) -> list[str]:
    present = [k for k in operators if k in runs]
    ref = runs.get(REFERENCE, {})
    lines = [f"| {int(size):,} `My` | " + " | ".join(runs[k].get("label", k) for k in present)
             + " |", "|---" * (len(present) + 1) + "|"]
    for label, key, fmt, unit, with_ratio in ROWS:
        cells = []
        for k in present:
            value = runs[k].get(key)
            cell = _num(value, fmt, unit)
            if with_ratio and k != REFERENCE:
                cell += _ratio(value, ref.get(key))
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if bare.get("seconds"):
        cells = [_num(None if runs[k].get("ready_seconds") is None
                      else runs[k]["ready_seconds"] / bare["seconds"], ".2f", "×")
                 for k in present]
        lines.append("| ready ÷ bare client | " + " | ".join(cells) + " |")
    errors = [f"{k}: {runs[k]['error']}" for k in present if "error" in runs[k]]
    kinds = [f"{runs[k].get('label', k)}: " + ", ".join(f"{n} {what}" for what, n in
                                                         runs[k]["writes_by_kind"].items())
             + (f" ({runs[k]['failed_writes']} of them refused)"
                if runs[k].get("failed_writes") else "")
             for k in present if runs[k].get("writes_by_kind")]
    lines.append("")
    if kinds:
        lines.append("Writes by kind: " + "; ".join(kinds) + ".")
    if errors:
        lines.append("Failures: " + "; ".join(errors) + ".")
    return lines + [""]


def _slope_cell(slope: dict | None) -> str:
    if not slope or slope.get("kib_per_my") is None:
        return "–"
    return f"{slope['kib_per_my']:.2f} KiB/My (idle {slope['intercept_mib']:.1f} MiB)"


def provenance(meta: dict) -> str:
    """Date, commit, load, machine, Python and versions of a run, in one sentence."""
    machine = meta.get("machine", {})
    load = ", ".join(f"{x:.1f}" for x in machine.get("load_average_at_start", []))
    versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()
                         if k != "binaries")
    return (f"{meta.get('date', '?')}, git {meta.get('git', '?')}, load average at the start "
            f"{load} ({machine.get('cpus', '?')} CPUs, {machine.get('memory_gib', '?')} GiB), "
            f"Python {meta.get('python', '?')}, {versions}.")


def write_markdown(path: Path, data: dict, before: dict | None = None) -> None:
    meta, settings = data.get("meta", {}), data["settings"]
    operators = settings["operators"]
    sizes = sorted(data["runs"], key=int)
    largest = sizes[-1] if sizes else "0"
    slopes = data.get("slopes", {})
    out = ["## Scale: operators started over an existing, converged fleet", "",
           f"    {meta.get('command', 'python -m bench scale')}", "", provenance(meta), ""]
    planned = [str(s) for s in settings.get("sizes", [])]
    if planned and planned != sizes:
        out += [f"**Stopped early**: sizes measured {', '.join(f'{int(s):,}' for s in sizes)} "
                f"of the planned {', '.join(f'{int(s):,}' for s in planned)} (the file was "
                "saved after each size; the figures below are from the sizes measured).", ""]
    out += [
           "Method: one local control plane with the Deployment and ReplicaSet controllers "
           "off (no ReplicaSets, no Pods); the bench grows one fleet of converged `My` "
           "(children rendered by controller.py's own render functions and applied under its "
           "field manager, the Deployment's status as a finished rollout, the `My`'s status "
           "as the operator computes it), and at each size starts each operator in turn "
           "(order reversed every other size) as a fresh process over it. *Ready*: ours "
           "its \"caches synced\" log line (then `/readyz` 200 checked; 859dd30 and "
           "earlier: `/readyz` polled every 10 ms); the controller-runtime peer's \"Starting "
           "workers\" (logged once its "
           "caches synced; its `/readyz` is a ping, 200 from the start); kopf's liveness "
           "endpoint. *Every key reconciled once*: `controller_runtime_reconcile_total` "
           "summed over /metrics reaching N (ours and the peer; a key reconciled twice early "
           "could make this a little optimistic); kopf: its \"... is processed\" log lines. "
           f"*Idle*: {settings.get('settle_seconds', '?'):g} s untouched, then "
           f"{settings.get('idle_seconds', '?'):g} s measured. *Writes*: the operator's "
           "requests in the apiserver's audit log over the whole run. *Slope*: least squares "
           "of the settled RSS over the sizes (size 0 = the idle process); ratios are to the "
           "controller-runtime peer. The *bare client* is bench/scaling/bare.py, a fresh "
           f"process reading the same three lists at once and keeping nothing, mode "
           f"`{settings.get('bare_mode', 'paged')}`"
           + (" (paged, 500 per page)" if settings.get("bare_mode", "paged") == "paged" else
              " (one streaming list per resource, or a paged "
              "list where the apiserver refuses to stream)") + "."
           + (" The fleet's Services are headless (`clusterIP: None`, --headless-services): "
              "the apiserver allocates ClusterIPs one at a time at a cost that grows with "
              "the fleet; neither operator reads the address." if settings.get(
                  "headless_services") else ""), ""]

    out += ["### Per-object memory (slope of the settled RSS over the sizes)", "",
            "| | " + " | ".join(operators) + " |", "|---" * (len(operators) + 1) + "|",
            "| slope | " + " | ".join(_slope_cell(slopes.get(k)) for k in operators) + " |"]
    for size in sizes:
        if size == "0":
            continue
        cells = []
        for k in operators:
            v = (slopes.get(k) or {}).get("per_size_kib_per_my", {}).get(size)
            cells.append(_num(v, ".2f", " KiB/My"))
        out.append(f"| above idle ÷ N at {int(size):,} | " + " | ".join(cells) + " |")
    if before and before.get("slopes"):
        cells = [_slope_cell(before["slopes"].get(k)) for k in operators]
        out.append(f"| before ({before.get('meta', {}).get('git', '?')}) | "
                   + " | ".join(cells) + " |")
    out.append("")

    if data.get("goals"):
        out += [f"### Goals of issue 17 ({HEADLINE}, largest size {int(largest):,})", "",
                "| goal | target | measured | met? |", "|---|---|---|---|"]
        for g in data["goals"]:
            met = {True: "yes", False: f"**no**, by {g['by']}", None: "not measured"}[g["met"]]
            out.append(f"| {g['goal']} | {g['target']} | {g['measured']} | {met} |")
        out.append("")

    out += ["### Per size", ""]
    for size in sizes:
        out += _size_table(size, data["runs"][size], operators, data["bare"].get(size, {}))

    pairs = data.get("ready_pairs", {})
    if pairs:
        out += ["### Ready ÷ bare client, more pairs at the largest size", "",
                f"Each pair: the bare client and {HEADLINE} started and stopped once ready, "
                "back to back (who goes first is given; runs before 2026-12-03 11:19 UTC "
                "always ran the bare client first); the ready goal takes the median of "
                "these ratios and the run's own.", "",
                "| size | first | bare client | ours: ready | ready ÷ bare |",
                "|---|---|---|---|---|"]
        for size, rows in pairs.items():
            for row in rows:
                out.append(f"| {int(size):,} | {row.get('first', 'bare')} | "
                           f"{_num(row.get('bare_seconds'), '.2f', ' s')} | "
                           f"{_num(row.get('ready_seconds'), '.2f', ' s')} | "
                           f"{_num(row.get('ratio'), '.2f', '×')} |")
        out.append("")

    out += ["### The fleet and the bare client", "",
            "| size | `My` made | seconds | `My`/s | objects/s | requests/s | "
            "kube-apiserver RSS | etcd RSS | bare client read (in process) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for f in data.get("fleet", []):
        rss = f.get("control_plane_rss_mib_after_operators") or f.get("control_plane_rss_mib", {})
        bare = data["bare"].get(str(f["size"]), {})
        bare_cell = ("–" if not bare else bare.get("error") or
                     f"{bare['seconds']:.2f} s ({bare['seconds_in_process']:.2f} s)")
        out.append(f"| {f['size']:,} | {f['created_my']:,} | {f['seconds']:.0f} | "
                   f"{f['my_per_second']:.0f} | {f['objects_per_second']:.0f} | "
                   f"{f['requests_per_second']:.0f} | {rss.get('kube-apiserver', 0):.0f} MiB | "
                   f"{rss.get('etcd', 0):.0f} MiB | {bare_cell} |")
    out.append("")
    if meta.get("wall_seconds"):
        out.append(f"Whole run: {meta['wall_seconds'] / 60:.1f} min.")
    path.write_text("\n".join(out).rstrip() + "\n")
