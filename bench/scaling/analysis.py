"""The arithmetic of bench/scale.py, kept pure so unit tests can pin it.

- `fit_line(points)`: least-squares line through (size, bytes), the per-object
  slope; `per_object_kib` for one size against the idle process.
- `goals(...)`: issue 17's goals, checked on one run's figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

KIB = 1024
MIB = 1024 * 1024

# Issue 17's goals.
GOAL_KIB_PER_MY = 2.5              # RSS per My including its two children
GOAL_READY_VS_BARE = 1.2           # ready within 1.2x the bare client's read of the same objects
GOAL_IDLE_CORE_PERCENT = 1.0       # idle CPU at the largest size, % of one core
GOAL_WRITES = 0                    # over a converged fleet


@dataclass(frozen=True)
class Line:
    slope: float          # bytes per object
    intercept: float      # bytes at size 0
    points: int


def fit_line(points: list[tuple[float, float]]) -> Line | None:
    """Least squares through (size, bytes); None with fewer than two distinct sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return Line(slope=slope, intercept=mean_y - slope * mean_x, points=n)


def per_object_kib(rss_bytes: float, idle_bytes: float, size: int) -> float | None:
    """KiB per object above the idle process (size 0) at one size."""
    if size <= 0:
        return None
    return (rss_bytes - idle_bytes) / size / KIB


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    measured: str
    met: bool | None          # None: not measured in this run
    by: str = ""              # how far off, when missed

    def as_dict(self) -> dict:
        return {"goal": self.name, "target": self.target, "measured": self.measured,
                "met": self.met, "by": self.by}


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "not measured" if value is None else f"{value:{spec}}{unit}"


def goals(*, slope_kib: float | None, peer_slope_kib: float | None,
          ready_seconds: float | None, bare_seconds: float | None,
          writes_by_size: dict[int, int], idle_percent: float | None,
          largest_size: int, ready_pairs: list[tuple[float, float]] = ()) -> list[Goal]:
    """Issue 17's goals for our operator, from one run's figures.

    `ready_pairs`: further (ready, bare) seconds at the largest size, each pair
    measured back to back; with them the ready goal is judged on the median of
    every pair's ratio (the run's own included): one pair moves by +-0.15x with
    the apiserver's pace on this shared machine."""
    out = []
    out.append(Goal(
        "RSS per My, incl. its two children (slope)", f"<= {GOAL_KIB_PER_MY} KiB",
        _fmt(slope_kib, ".2f", " KiB"),
        None if slope_kib is None else slope_kib <= GOAL_KIB_PER_MY,
        "" if slope_kib is None or slope_kib <= GOAL_KIB_PER_MY
        else f"+{slope_kib - GOAL_KIB_PER_MY:.2f} KiB ({slope_kib / GOAL_KIB_PER_MY:.1f}x)"))
    met = None if slope_kib is None or peer_slope_kib is None else slope_kib <= peer_slope_kib
    out.append(Goal(
        "memory per object vs the controller-runtime peer", "<= 1.00x",
        _fmt(ratio(slope_kib, peer_slope_kib), ".2f", "x"), met,
        f"+{slope_kib - peer_slope_kib:.2f} KiB/My" if met is False else ""))
    r = ratio(ready_seconds, bare_seconds)
    ratios = [x for x in [r, *(ratio(a, b) for a, b in ready_pairs)] if x is not None]
    if len(ratios) > 1:
        r = statistics.median(ratios)
        measured = (f"{r:.2f}x, median of {len(ratios)} pairs "
                    f"({min(ratios):.2f}-{max(ratios):.2f}x)")
        by = f"+{r - GOAL_READY_VS_BARE:.2f}x"
    else:
        measured = _fmt(r, ".2f", "x")
        by = "" if r is None else f"+{ready_seconds - GOAL_READY_VS_BARE * bare_seconds:.2f} s"
    out.append(Goal(
        f"ready vs the bare client's read, {largest_size:,} My", f"<= {GOAL_READY_VS_BARE}x",
        measured, None if r is None else r <= GOAL_READY_VS_BARE,
        "" if r is None or r <= GOAL_READY_VS_BARE else by))
    total_writes = sum(writes_by_size.values()) if writes_by_size else None
    out.append(Goal(
        "writes over a converged fleet, every size", f"{GOAL_WRITES}",
        "not measured" if total_writes is None else
        ", ".join(f"{w} at {s:,}" for s, w in sorted(writes_by_size.items())),
        None if total_writes is None else total_writes == GOAL_WRITES,
        "" if not total_writes else f"{total_writes} writes"))
    out.append(Goal(
        f"idle CPU at {largest_size:,} My", f"< {GOAL_IDLE_CORE_PERCENT:g} % of a core",
        _fmt(idle_percent, ".2f", " %"),
        None if idle_percent is None else idle_percent < GOAL_IDLE_CORE_PERCENT,
        "" if idle_percent is None or idle_percent < GOAL_IDLE_CORE_PERCENT
        else f"+{idle_percent - GOAL_IDLE_CORE_PERCENT:.2f} points"))
    return out
