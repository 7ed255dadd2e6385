"""The soak's allocation tracking (issue 36 item 1): tracemalloc snapshots of the
operator every `--snapshot-minutes`, what grew between them, and the plots.

The operator runs under `bench/convergence/traced.py` (tracemalloc on from the
start; SIGUSR2 writes a snapshot). At each interval the soak asks for a snapshot
and records RSS, threads, open fds and sockets of the process at that moment.
At the end `allocation_report` compares consecutive snapshots by source line:
the sites that grew in each interval, the size of the largest growers in every
snapshot, and the sites that grew in every interval (goal: none).

    python -m bench soak_alloc bench/results/soak.json     # redraw the SVGs from a run
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import signal
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
from bench.convergence.traced import snapshot_path

MIB = 1024 * 1024
# Allocations of the snapshot machinery itself, and of imports, are not the operator's.
_IGNORE = (tracemalloc.__file__, "<frozen importlib._bootstrap>",
           "<frozen importlib._bootstrap_external>", "<unknown>")
TOP = 8


def handles(pid: int) -> dict:
    """Threads, open fds and sockets of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    fds = sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                sockets += 1
        except OSError:
            pass
    return {"rss_mib": int(status["VmRSS"].split()[0]) / 1024,
            "threads": int(status["Threads"]), "fds": fds, "sockets": sockets}


def take(pid: int, directory: Path, index: int, timeout: float = 120.0) -> Path | None:
    """SIGUSR2 to the traced operator; the snapshot's path once it is written."""
    path = snapshot_path(directory, pid, index)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path
        time.sleep(0.2)
    return None


# The operator may run from another checkout (a `git archive` of a commit): sites are
# named from the project's own directories, site-packages, or the standard library on.
_SITE_ROOT = re.compile(r"^.*?/(?=(?:k8s_http|my|bench|tests)/|controller\.py$)|"
                        r"^.*/site-packages/|^.*/lib/python3\.\d+/")


def _site(stat) -> str:
    frame = stat.traceback[0]
    return f"{_SITE_ROOT.sub('', frame.filename, count=1)}:{frame.lineno}"


def _load(path: str) -> tracemalloc.Snapshot:
    return tracemalloc.Snapshot.load(path).filter_traces(
        [tracemalloc.Filter(False, pattern) for pattern in _IGNORE])


def _growing_every_interval(sizes: list[dict[str, int]]) -> list[dict]:
    every = []
    if len(sizes) > 2:
        for site in sizes[-1]:
            steps = [b.get(site, 0) - a.get(site, 0) for a, b in zip(sizes, sizes[1:])]
            if all(d > 0 for d in steps):
                every.append({"site": site, "kib_per_interval": [d / 1024 for d in steps]})
    every.sort(key=lambda e: -sum(e["kib_per_interval"]))
    return every


def allocation_report(intervals: list[dict], warmup_seconds: float = 0.0) -> dict:
    """intervals: [{"t", "snapshot", ...}] in time order, one operator process. Sites
    growing in every interval are also given for the intervals from `warmup_seconds` on."""
    snaps = [_load(i["snapshot"]) for i in intervals]
    sizes: list[dict[str, int]] = []
    for snap in snaps:
        sizes.append({_site(s): s.size for s in snap.statistics("lineno")})
    grew_per_interval = []
    for prev, cur in zip(sizes, sizes[1:]):
        diffs = {site: cur.get(site, 0) - prev.get(site, 0) for site in cur.keys() | prev.keys()}
        top = sorted(((d, s) for s, d in diffs.items() if d > 0), reverse=True)[:TOP]
        grew_per_interval.append({"total_kib": (sum(cur.values()) - sum(prev.values())) / 1024,
                                  "top": [{"site": s, "kib": d / 1024} for d, s in top]})
    warm = [size for size, i in zip(sizes, intervals) if i["t"] >= warmup_seconds]
    growth = {site: sizes[-1].get(site, 0) - sizes[0].get(site, 0) for site in sizes[-1]}
    top_sites = [s for s, d in sorted(growth.items(), key=lambda kv: -kv[1])[:TOP] if d > 0]
    return {
        "traced_mib": [sum(s.values()) / MIB for s in sizes],
        "grew_per_interval": grew_per_interval,
        "sites_growing_every_interval": _growing_every_interval(sizes),
        "warmup_seconds": warmup_seconds,
        "sites_growing_every_interval_after_warmup": _growing_every_interval(warm),
        "top_sites": top_sites,
        "top_site_kib": {site: [s.get(site, 0) / 1024 for s in sizes] for site in top_sites},
    }


# -- the plots, as hand-written SVG (no plotting library in the project)

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f")


def svg_lines(title: str, xlabel: str, ylabel: str, series: list[tuple[str, list, list]],
              width: int = 760, height: int = 380) -> str:
    """A line chart: series = [(label, xs, ys)]."""
    left, right, top, bottom = 70, 20, 40, 50 + 16 * len(series)
    xs = [x for _, sx, _ in series for x in sx] or [0, 1]
    ys = [y for _, _, sy in series for y in sy] or [0, 1]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(0.0, min(ys)), max(ys) * 1.05 if max(ys) > 0 else 1.0
    pw, ph = width - left - right, height - top - bottom

    def px(x):
        return left + (x - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">'
           f'{html.escape(title)}</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>']
    for i in range(6):
        yv = y0 + (y1 - y0) * i / 5
        xv = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{left - 5}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
        out.append(f'<line x1="{left}" y1="{py(yv):.1f}" x2="{left + pw}" y2="{py(yv):.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{px(xv):.1f}" y="{top + ph + 15}" text-anchor="middle">'
                   f'{xv:.3g}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 32}" text-anchor="middle">'
               f'{html.escape(xlabel)}</text>')
    out.append(f'<text x="15" y="{top + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 15 {top + ph / 2})">{html.escape(ylabel)}</text>')
    for n, (label, sx, sy) in enumerate(series):
        colour = _COLOURS[n % len(_COLOURS)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(sx, sy))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                   f'points="{points}"/>')
        if len(sx) <= 30:
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>'
                    for x, y in zip(sx, sy)]
        ly = top + ph + 44 + 16 * n
        out.append(f'<line x1="{left}" y1="{ly - 4}" x2="{left + 20}" y2="{ly - 4}" '
                   f'stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{left + 26}" y="{ly}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svgs(data: dict, directory: Path) -> list[Path]:
    samples, alloc = data["samples"], data.get("allocation") or {}
    intervals = data.get("intervals") or []
    minutes = [s["t"] / 60 for s in samples]
    rss = svg_lines("Operator RSS during the soak (sampled every "
                    f"{data['settings']['sample_seconds']:g} s)", "minutes", "MiB",
                    [("RSS", minutes, [s["rss_mib"] for s in samples]),
                     ("tracemalloc: traced Python memory",
                      [i["t"] / 60 for i in intervals][:len(alloc.get("traced_mib", []))],
                      alloc.get("traced_mib", []))])
    sites = svg_lines(f"Top {len(alloc.get('top_sites', []))} allocation sites by growth, "
                      "size at each snapshot", "minutes", "KiB",
                      [(site, [i["t"] / 60 for i in intervals], kib)
                       for site, kib in (alloc.get("top_site_kib") or {}).items()])
    paths = [directory / "soak-rss.svg", directory / "soak-sites.svg"]
    for path, text in zip(paths, (rss, sites)):
        path.write_text(text)
    return paths


def markdown(data: dict) -> list[str]:
    intervals, alloc = data.get("intervals") or [], data.get("allocation") or {}
    if not intervals:
        return []
    lines = [f"Every {data['settings']['snapshot_minutes']:g} minutes (operator process "
             f"under `bench/convergence/traced.py`: tracemalloc, "
             "1 frame per allocation; a SIGUSR2 writes a snapshot):", "",
             "| t (min) | RSS (MiB) | traced (MiB) | threads | fds | sockets | grew most since "
             "the last snapshot (KiB) |", "|---|---|---|---|---|---|---|"]
    traced = alloc.get("traced_mib") or []
    grew = [None] + (alloc.get("grew_per_interval") or [])
    for n, i in enumerate(intervals):
        g = grew[n] if n < len(grew) else None
        top = "" if not g else "; ".join(f"`{x['site']}` {x['kib']:+.0f}" for x in g["top"][:3])
        lines.append(f"| {i['t'] / 60:.1f} | {i['rss_mib']:.1f} | "
                     f"{traced[n] if n < len(traced) else float('nan'):.2f} | {i['threads']} | "
                     f"{i['fds']} | {i['sockets']} | {top} |")
    lines.append("")
    for key, what in (("sites_growing_every_interval", "in every interval"),
                      ("sites_growing_every_interval_after_warmup",
                       f"in every interval from {alloc.get('warmup_seconds', 0) / 60:g} min on "
                       "(the first, warm-up interval left out)")):
        if key not in alloc:
            continue
        every = alloc[key]
        lines += [f"Sites that grew {what}: **{len(every)}**"
                  + (": " + "; ".join(f"`{e['site']}` ("
                                      + ", ".join(f"{k:+.1f}" for k in e["kib_per_interval"])
                                      + " KiB)" for e in every[:10]) if every else "") + ".", ""]
    lines += ["Top sites by growth from the first snapshot to the last (KiB at each snapshot):",
              ""]
    for site, kib in (alloc.get("top_site_kib") or {}).items():
        lines.append(f"- `{site}`: " + ", ".join(f"{k:.0f}" for k in kib))
    lines += ["", "Plots: `bench/results/soak-rss.svg` (RSS and traced memory over time), "
              "`bench/results/soak-sites.svg` (the top sites), drawn by `bench/soak_alloc.py`.",
              ""]
    return lines


def main(argv: list[str]) -> int:
    """Redraw the SVGs from a soak's JSON (default bench/results/soak.json); --reanalyse:
    its allocation report again from the snapshot files, if they are still there."""
    parser = argparse.ArgumentParser(description="Redraw the soak's SVGs from its JSON.")
    parser.add_argument("source", type=Path, nargs="?", default=HERE / "results" / "soak.json")
    parser.add_argument("--reanalyse", action="store_true",
                        help="the allocation report again from the snapshot files, if they are "
                             "still there (rewrites the JSON)")
    args = parser.parse_args(argv)
    source = args.source
    data = json.loads(source.read_text())
    if args.reanalyse:
        last = [i for i in data["intervals"] if i["pid"] == data["intervals"][-1]["pid"]]
        data["allocation"] = allocation_report(last, data["settings"]["warmup_minutes"] * 60)
        source.write_text(json.dumps(data, indent=1) + "\n")
    for written in write_svgs(data, source.parent):
        print(written)
    return 0
