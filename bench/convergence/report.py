"""Aggregation (median, min, max; ratios to a reference operator in the same run),
goals, markdown."""

from __future__ import annotations

import statistics

# The figures each scenario reports in the tables: (key, heading, format, better).
TABLES = {
    "burst": [("converged_p50_seconds", "per object p50 (s)", "{:.2f}", "lower"),
              ("converged_p99_seconds", "per object p99 (s)", "{:.2f}", "lower"),
              ("converged_max_seconds", "per object max (s)", "{:.2f}", "lower"),
              ("all_converged_seconds", "all converged (s)", "{:.2f}", "lower"),
              ("first_status_p50_seconds", "first status p50 (s)", "{:.2f}", "lower"),
              ("first_status_p99_seconds", "first status p99 (s)", "{:.2f}", "lower"),
              ("deployment_p50_seconds", "Deployment p50 (s)", "{:.2f}", "lower"),
              ("service_p50_seconds", "Service p50 (s)", "{:.2f}", "lower"),
              ("all_service_seconds", "all Services (s)", "{:.2f}", "lower"),
              ("all_steady_seconds", "all steady (s)", "{:.2f}", "lower"),
              ("cpu_seconds", "CPU (s)", "{:.2f}", "lower"),
              ("peak_rss_mib", "peak RSS (MiB)", "{:.0f}", "lower"),
              ("object_writes_per_object", "object writes/My", "{:.2f}", "lower"),
              ("events_per_object", "Events/My", "{:.2f}", "lower"),
              ("control_plane_cpu_seconds", "control plane CPU (s)", "{:.1f}", "lower")],
    "idle": [("writes", "writes", "{:.0f}", "lower"),
             ("cpu_seconds", "CPU (s)", "{:.2f}", "lower"),
             ("cpu_percent", "CPU (%)", "{:.2f}", "lower"),
             ("rss_mib", "RSS (MiB)", "{:.0f}", "lower"),
             ("control_plane_cpu_seconds", "control plane CPU (s)", "{:.1f}", "lower")],
    "latency": [("p50_ms", "Deployment p50 (ms)", "{:.1f}", "lower"),
                ("p99_ms", "Deployment p99 (ms)", "{:.1f}", "lower"),
                ("max_ms", "Deployment max (ms)", "{:.1f}", "lower"),
                ("status_p50_ms", "first status p50 (ms)", "{:.0f}", "lower"),
                ("status_max_ms", "first status max (ms)", "{:.0f}", "lower")],
    "churn": [("converge_seconds", "converged (s)", "{:.2f}", "lower"),
              ("updates_per_second", "updates/s", "{:.0f}", "higher"),
              ("cpu_seconds", "CPU (s)", "{:.2f}", "lower"),
              ("writes_per_object", "writes/update", "{:.2f}", "lower"),
              ("control_plane_cpu_seconds", "control plane CPU (s)", "{:.1f}", "lower")],
    "startup": [("ready_seconds", "ready (s)", "{:.2f}", "lower"),
                ("all_processed_seconds", "all objects processed (s)", "{:.2f}", "lower"),
                ("cpu_seconds_to_all_processed", "CPU to all processed (s)", "{:.2f}",
                 "lower"),
                ("writes", "writes", "{:.0f}", "lower"),
                ("peak_rss_mib", "peak RSS (MiB)", "{:.0f}", "lower")],
}


def table_kind(scenario: str) -> str:
    return scenario.split("_", 1)[0]


def summary(values: list) -> dict | None:
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def aggregate(runs: dict) -> dict:
    """runs[op][scenario] = [per-run dict | {"error": ...}] -> op -> scenario -> figure -> summary."""
    out = {}
    for op, scenarios in runs.items():
        out[op] = {}
        for scenario, results in scenarios.items():
            figures = {}
            keys = {k for r in results if "error" not in r for k, v in r.items()
                    if isinstance(v, (int, float))}
            for key in sorted(keys):
                figures[key] = summary([r.get(key) for r in results if "error" not in r])
            errors = [r["error"] for r in results if "error" in r]
            if errors:
                figures["errors"] = errors
            out[op][scenario] = figures
    return out


def ratios(runs: dict, reference: str = "kopf") -> dict:
    """op / reference per figure, run by run (same run, same conditions); summarised."""
    out = {}
    ref = runs.get(reference)
    if not ref:
        return out
    for op, scenarios in runs.items():
        if op == reference:
            continue
        out[op] = {}
        for scenario, results in scenarios.items():
            theirs = ref.get(scenario) or []
            per_key: dict[str, list] = {}
            for mine, other in zip(results, theirs):
                if "error" in mine or "error" in other:
                    continue
                for key, value in mine.items():
                    other_value = other.get(key)
                    if isinstance(value, (int, float)) and isinstance(other_value, (int, float)) \
                            and other_value:
                        per_key.setdefault(key, []).append(value / other_value)
            out[op][scenario] = {k: summary(v) for k, v in per_key.items()}
    return out


def goals(agg: dict, rat: dict, *, op: str, size: int, reference: str) -> list[dict]:
    """The goals, for one configuration of ours, with the margin; ratios are to
    `reference` (the controller-runtime peer) in the same run."""
    burst = f"burst_{size}"

    def med(scenario, key, source=agg):
        fig = ((source.get(op) or {}).get(scenario) or {}).get(key)
        return fig["median"] if fig else None

    out = []

    def goal(text, value, target, ok, unit=""):
        if value is None:
            out.append({"goal": text, "value": None, "met": None, "detail": "not measured"})
            return
        out.append({"goal": text, "value": value, "target": target, "met": bool(ok(value)),
                    "unit": unit})

    for key, what in (("converged_p50_seconds", "per-object create -> converged p50"),
                      ("converged_p99_seconds", "per-object create -> converged p99"),
                      ("all_converged_seconds", "all converged")):
        goal(f"{what}, burst of {size}, <= 0.8x {reference}'s", med(burst, key, rat), 0.8,
             lambda v: v <= 0.8, f"x {reference}")
    goal(f"CPU seconds, burst of {size}, <= 0.75x {reference}'s",
         med(burst, "cpu_seconds", rat), 0.75, lambda v: v <= 0.75, f"x {reference}")
    goal(f"object writes per My, burst of {size}, <= 3.3",
         med(burst, "object_writes_per_object"), 3.3, lambda v: v <= 3.3, "")
    status_ms = med("latency", "status_max_ms")
    goal("idle: observedGeneration and a Ready condition within 1 s of the create (max)",
         status_ms / 1000 if status_ms is not None else None, 1.0, lambda v: v <= 1.0, " s")
    goal("zero writes when idle", med("idle", "writes"), 0, lambda v: v == 0, " writes")
    goal("p99 create -> Deployment < 100 ms (idle)", med("latency", "p99_ms"), 100.0,
         lambda v: v < 100.0, " ms")
    goal(f"ready within 1 s of start with {size}+ objects", med("startup", "ready_seconds"), 1.0,
         lambda v: v <= 1.0, " s")
    return out


def _cell(fig: dict | None, fmt: str) -> str:
    if not fig:
        return "–"
    if len(fig["runs"]) == 1 or fig["min"] == fig["max"]:
        return fmt.format(fig["median"])
    return f"{fmt.format(fig['median'])} ({fmt.format(fig['min'])}–{fmt.format(fig['max'])})"


def _ratio_cell(fig: dict | None) -> str:
    if not fig:
        return "–"
    return f"{fig['median']:.2f}" if len(fig["runs"]) == 1 else \
        f"{fig['median']:.2f} ({fig['min']:.2f}–{fig['max']:.2f})"


RATIO_KEYS = ("converged_p50_seconds", "converged_p99_seconds", "all_converged_seconds",
              "converge_seconds", "cpu_seconds", "peak_rss_mib", "p99_ms", "ready_seconds",
              "cpu_seconds_to_all_processed", "object_writes_per_object", "writes_per_object")


def scenario_table(scenario: str, agg: dict, rat: dict, labels: dict,
                   reference: str = "kopf") -> list[str]:
    columns = TABLES[table_kind(scenario)]
    head = ["operator"] + [c[1] for c in columns]
    ratio_keys = [c for c in columns if c[0] in RATIO_KEYS]
    short = labels.get(reference, reference).split(",")[0]
    head += [f"{c[1].split(' (')[0]} ÷ {short}" for c in ratio_keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op, scenarios in agg.items():
        figures = scenarios.get(scenario)
        if figures is None:
            continue
        row = [labels.get(op, op)] + [_cell(figures.get(c[0]), c[2]) for c in columns]
        row += [_ratio_cell(((rat.get(op) or {}).get(scenario) or {}).get(c[0]))
                if op != reference else "1" for c in ratio_keys]
        lines.append("| " + " | ".join(row) + " |")
        for error in figures.get("errors", []):
            lines.append(f"| {labels.get(op, op)}: **failed run**: {error} |" +
                         " |" * (len(head) - 1))
    return lines


def goal_lines(goal_list: list[dict]) -> list[str]:
    """A goals table; with a "floor" column when some goal carries the floor's own
    figure (the best any operator could reach: see floor_operator.py)."""
    floors = any("floor" in g for g in goal_list)
    lines = (["| goal | measured | met? | the floor (no operator) |", "|---|---|---|---|"]
             if floors else ["| goal | measured | met? |", "|---|---|---|"])

    def floor_cell(g) -> str:
        if not floors:
            return ""
        value = g.get("floor")
        return " – |" if value is None else f" {value:.2f}{g.get('unit', '')} |"

    for g in goal_list:
        if g["value"] is None:
            lines.append(f"| {g['goal']} | not measured | – |{floor_cell(g)}")
            continue
        value, target, unit = g["value"], g["target"], g.get("unit", "")
        shown = f"{value:.2f}{unit}" if isinstance(value, float) else f"{value}{unit}"
        if g["met"]:
            verdict = "yes"
        elif unit == "x":
            verdict = f"**no**: {target / value:.1f}x short of the goal" if value else "**no**"
        elif target:
            verdict = f"**no**: {value / target:.1f}x the limit ({value - target:+.2f}{unit})"
        else:
            verdict = f"**no**: {value}{unit}"
        lines.append(f"| {g['goal']} | {shown} | {verdict} |{floor_cell(g)}")
    return lines
