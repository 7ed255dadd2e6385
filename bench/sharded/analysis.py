"""The arithmetic of bench/shards.py, kept pure so unit tests can pin it.

- `ready_times(samples, last_change)`: a replica's first /readyz 200, and the first
  one once its share stopped changing (ready with its own slots synced);
- `is_settled(...)`: every replica ready, the slots all held, none idle, no change
  of share for a while;
- `compare(single, replicas, key)`: each replica's figure against the single
  replica's (ratio per replica, the largest);
- `failover_figures(...)`: the creation stream around a SIGKILL, split into
  undisturbed, around the kill (waited or not) and after;
- `waits_by_creation(timeline, threshold)`: the survivors' own part of the stream
  in windows of creation time, each wait split into where it went;
  `survivors_by_window(samples)`: the cores the survivors and the plane used
  meanwhile, and the survivors' mean queue wait, reconcile and request times;
- `compare_joiner(single, joiner)`: a replica that joined the running ring
  against the single one, per slot held too;
- `goals(...)`: issue 37 item 5's goals on one run's figures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping

from bench.convergence.perobject import _quantile as quantile
from bench.scaling.analysis import Goal, ratio
from k8s_http.core.shards import SLOTS

# Issue 37 item 5's goals, 3 replicas against 1.
GOAL_RSS_RATIO = 0.4              # each replica's steady RSS
GOAL_READ_RATIO = 0.4             # each replica's bytes read, gate on
GOAL_READY_RATIO = 0.5            # each replica's start-up to ready
GOAL_WAITED_FRACTION = 1 / 3      # of the stream around a SIGKILL, waited for the Lease
# "Waited": create -> converged above this many times the undisturbed p99.
SLOW_FACTOR = 2.0
# "As fast as before": the p50 and p99 of the rest within this factor of the undisturbed
# ones (one run's p99 over ~600 objects moves by more than 10 % on this shared machine).
AS_FAST_TOLERANCE = 1.5
# The undisturbed part of the stream is said to be falling behind when its last
# quarter's p50 exceeds its first quarter's this many times.
BACKLOG_TREND = 2.0


def ready_times(samples: Iterable[tuple[float, bool]],
                last_change: float | None) -> tuple[float | None, float | None]:
    """(first ready, ready with its final share), seconds since spawn, from /readyz
    samples (seconds since spawn, 200?) in time order and the time of the replica's
    last change of share (None: it logged none). A sample taken at the change itself
    may predate the new lists, so the second is the first 200 after it."""
    samples = list(samples)
    first = next((t for t, ok in samples if ok), None)
    if last_change is None:
        return first, first
    return first, next((t for t, ok in samples if ok and t > last_change), None)


def is_settled(*, ready: Iterable[bool], held: Iterable[float], quiet_seconds: Iterable[float],
               stable_seconds: float, slots: int = SLOTS) -> bool:
    """Every replica answers /readyz 200, holds slots, together they hold all of them,
    and none changed its share in the last `stable_seconds` (`quiet_seconds`: since
    each one's last change, or since its start)."""
    ready, held, quiet = list(ready), list(held), list(quiet_seconds)
    return (bool(ready) and all(ready) and all(h > 0 for h in held)
            and sum(held) == slots and min(quiet) >= stable_seconds)


def compare(single: dict | None, replicas: list[dict], key: str,
            baseline: float | None = None) -> dict:
    """`key` of each replica against the single replica's: the values, the ratios, and
    the largest of both. `baseline` (the idle replica's figure) is first taken off
    every value: what the objects cost, without the process's own."""
    def less(value):
        return None if value is None or baseline is None else value - baseline
    reference = (single or {}).get(key)
    values = [r.get(key) for r in replicas]
    if baseline is not None:
        reference, values = less(reference), [less(v) for v in values]
    ratios = [ratio(v, reference) for v in values]
    known = [v for v in values if v is not None]
    known_ratios = [r for r in ratios if r is not None]
    return {"single": reference, "values": values, "ratios": ratios,
            "max": max(known) if known else None,
            "max_ratio": max(known_ratios) if len(known_ratios) == len(replicas) and replicas
            else None}


def compare_joiner(single: dict | None, joiner: dict) -> dict:
    """A replica that joined a running ring against the single replica: ready, RSS,
    bytes read and CPU as ratios, and CPU per slot held (each one's CPU, spawn ->
    steady, over its slots), which says whether a sharded replica's work costs more
    per object than the single one's or only looked so beside two others."""
    out = {key: compare(single, [joiner], key)["max_ratio"]
           for key in ("ready_seconds", "rss_mib", "read_bytes", "cpu_seconds")}
    per_slot = [None if not r or r.get("cpu_seconds") is None or not r.get("slots")
                else r["cpu_seconds"] / r["slots"] for r in (single, joiner)]
    out["cpu_per_slot"] = {"single": per_slot[0], "joiner": per_slot[1],
                           "ratio": ratio(per_slot[1], per_slot[0])}
    return out


def spread(values: Iterable[float]) -> dict:
    """count, p50, p99 and max of some seconds (None each when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    return {"count": len(ordered), "p50": statistics.median(ordered),
            "p99": quantile(ordered, 0.99), "max": ordered[-1]}


def failover_figures(created: Mapping[str, float], converged: Mapping[str, float],
                     slot_of: Mapping[str, int], victim_slots: Iterable[int], killed: float,
                     recovered: float | None, *, slow_factor: float = SLOW_FACTOR) -> dict:
    """The creation stream around a SIGKILL of one replica.

    `created`: name -> when its create was sent; `converged`: name -> when it was
    first seen converged (missing: never); `slot_of`: name -> its slot; `killed`:
    when the replica was killed; `recovered`: when the survivors held its slots with
    their caches synced again (None: never). Groups, by creation time:

    - before:  converged before the kill (undisturbed; its p99 sets the threshold;
               `before_trend`: its last quarter's p50 over its first quarter's, above
               BACKLOG_TREND when the replicas were falling behind the stream already);
    - around:  the others created up to `recovered` (everything after the kill when
               it never recovered); "waited" when create -> converged exceeded
               slow_factor x the undisturbed p99, or never converged;
               "rest" the others;
    - after:   created after `recovered`.

    `around` is also split by slot: in the killed replica's slots or the survivors'.
    """
    victim_slots = frozenset(victim_slots)
    latency = {n: converged[n] - created[n] for n in created if n in converged}
    undisturbed = [n for n in created if n in converged and converged[n] < killed]
    before = spread(latency[n] for n in undisturbed)
    if not before["count"]:
        return {"error": "no My converged before the kill", "before": before}
    threshold = slow_factor * before["p99"]
    end = math.inf if recovered is None else recovered
    done = set(undisturbed)
    around = [n for n in created if n not in done and created[n] <= end]
    after = [n for n in created if n not in done and created[n] > end]
    waited = [n for n in around if n not in latency or latency[n] > threshold]
    rest = [n for n in around if n not in set(waited)]
    theirs = [n for n in around if slot_of.get(n) in victim_slots]
    ours = [n for n in around if n not in set(theirs)]

    def figures(names: list[str]) -> dict:
        return {**spread(latency[n] for n in names if n in latency),
                "created": len(names),
                "never_converged": sum(1 for n in names if n not in latency)}

    # Were the replicas keeping up before the kill? The p50 of the last quarter of the
    # undisturbed (by creation) against the first quarter's: a backlog grows it.
    by_creation = sorted(undisturbed, key=created.__getitem__)
    quarter = max(1, len(by_creation) // 4)
    first, last = (statistics.median(latency[n] for n in part)
                   for part in (by_creation[:quarter], by_creation[-quarter:]))
    return {
        "threshold_seconds": threshold,
        "before_trend": ratio(last, first),
        "before": figures(undisturbed),
        "around": figures(around),
        "waited": len(waited),
        "waited_fraction": len(waited) / len(around) if around else None,
        "rest": figures(rest),
        "after": figures(after),
        "around_in_killed_slots": figures(theirs),
        "around_in_survivors_slots": figures(ours),
        "waited_in_survivors_slots": sum(1 for n in waited if n in set(ours)),
    }


# waits_by_creation's window of creation time, seconds.
CREATION_WINDOW = 5.0


def waits_by_creation(timeline: list[dict], threshold: float | None, *,
                      window: float = CREATION_WINDOW) -> list[dict]:
    """The stream's `My` in the survivors' own slots (bench/shards.py's timeline rows,
    times since the kill), in windows of `window` seconds of creation time from the
    kill on: how many were made, how many waited (create -> seen above `threshold`,
    or never seen), and the p50 of each part of the wait among those that waited:

    - queue:  create -> the operator's first Deployment apply received (the watch
              event's delivery, the work queue, a free worker);
    - write:  that apply -> the first status write done (the reconcile: two applies,
              an Event, the status, each an apiserver round trip);
    - seen:   that status write -> the bench's watch shows it;

    and over all of them, "apply_server_p50": the apiserver's own time on that
    first apply (a slow server, as opposed to a slow operator).
    """
    rows: dict[int, list[dict]] = {}
    for row in timeline:
        if not row["dead"] and row["created"] >= 0:
            rows.setdefault(int(row["created"] // window), []).append(row)

    def part(items: list[dict], start: str, end: str) -> float | None:
        return _median([r[end] - r[start] for r in items
                        if r.get(start) is not None and r.get(end) is not None])

    out = []
    for index in sorted(rows):
        made = rows[index]
        waited = [r for r in made if r["seen"] is None or threshold is None
                  or r["seen"] - r["created"] > threshold]
        out.append({"from": index * window, "to": (index + 1) * window,
                    "created": len(made), "waited": len(waited),
                    "p50": part(made, "created", "seen"),
                    "waited_queue_p50": part(waited, "created", "deployment_applied"),
                    "waited_write_p50": part(waited, "deployment_applied", "status_written"),
                    "waited_seen_p50": part(waited, "status_written", "seen"),
                    "apply_server_p50": _median([r["apply_server"] for r in made
                                                 if r.get("apply_server") is not None])})
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def survivors_by_window(samples: list[dict], *, window: float = CREATION_WINDOW
                        ) -> dict[float, dict]:
    """Each `window` of seconds since the kill, from follow()'s samples (cumulative
    figures): "survivors", the cores each used; each process of the plane, its
    cores; and per survivor the mean milliseconds of its work queue's wait
    ("queue_ms"), its reconciles ("work_ms") and its requests ("request_ms") that
    ended in the window (None where none did). Keyed by the window's start, as
    waits_by_creation's rows."""
    out: dict[float, dict] = {}
    timed = [s for s in samples if "cpu" in s]
    if not timed:
        return out
    last = int(timed[-1]["t"] // window)
    for index in range(0, last + 1):
        start, end = index * window, (index + 1) * window
        inside = [s for s in timed if start <= s["t"] <= end]
        if len(inside) < 2:
            continue
        first, final = inside[0], inside[-1]
        span = final["t"] - first["t"]
        if span <= 0:
            continue
        row = {"survivors": [round((b - a) / span, 2) for a, b in zip(first["cpu"], final["cpu"])],
               **{name: round((final["plane_cpu"][name] - first["plane_cpu"].get(name, 0.0))
                              / span, 2)
                  for name in final.get("plane_cpu", {})}}
        for what in ("queue", "work", "request"):
            row[f"{what}_ms"] = [_mean_ms(a.get(what), b.get(what)) for a, b in
                                 zip(first.get("timings") or [], final.get("timings") or [])]
        out[start] = row
    return out


def _mean_ms(before: list | None, after: list | None) -> float | None:
    """The mean, in ms, of a histogram's observations between two [sum, count] samples."""
    if not before or not after or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * 1e3, 1)


def recovery(samples: list[dict], last_change: float | None, *, slots: int = SLOTS) -> dict:
    """The survivors after the kill, from `samples` ({"t": seconds since the kill,
    "ready": [/readyz 200?], "held": [slots], "queued": [work queue depth]} per poll,
    in time order) and their last change of share (seconds since the kill):

    - claimed_after_kill: first sample where they hold every slot;
    - recovered_after_kill: first sample from then on, after their last change of
      share, where every survivor is ready (its caches synced with the new share);
    - queue_peak (summed over the survivors) and when; queue_drained_after_kill:
      first sample after the peak at or below a tenth of it.
    """
    claimed = next((s["t"] for s in samples if sum(s["held"]) == slots), None)
    recovered = None
    if claimed is not None:
        recovered = next((s["t"] for s in samples if s["t"] >= claimed and all(s["ready"])
                          and (last_change is None or s["t"] > last_change)), None)
    depths = [(sum(s["queued"]), s["t"]) for s in samples]
    peak, peak_at = max(depths, key=lambda d: d[0], default=(None, None))
    drained = None if peak is None else next(
        (t for depth, t in depths if t > peak_at and depth <= peak / 10), None)
    return {"claimed_after_kill": claimed, "recovered_after_kill": recovered,
            "queue_peak": peak, "queue_peak_after_kill": peak_at,
            "queue_drained_after_kill": drained}


def _ratio_goal(name: str, limit: float, value: float | None) -> Goal:
    met = None if value is None else value <= limit
    return Goal(name, f"<= {limit:g}x", "not measured" if value is None else f"{value:.2f}x",
                met, "" if met is not False else f"+{value - limit:.2f}x")


def goals(runs: Mapping[str, dict], failover: dict | None) -> list[Goal]:
    """Issue 37 item 5's goals. `runs`: gate ("on", "off") -> its "comparison"
    (`compare` of rss_mib, read_bytes and ready_seconds); `failover`: the
    `failover_figures` of the stream (None: not run)."""
    out = []
    for gate, run in runs.items():
        comparison = run.get("comparison") or {}
        out.append(_ratio_goal(f"RSS of each replica vs the single one, gate {gate}",
                               GOAL_RSS_RATIO, (comparison.get("rss_mib") or {}).get("max_ratio")))
        if gate == "on":
            out.append(_ratio_goal(f"bytes read by each replica vs the single one, gate {gate}",
                                   GOAL_READ_RATIO,
                                   (comparison.get("read_bytes") or {}).get("max_ratio")))
        out.append(_ratio_goal(f"start-up to ready of each replica vs the single one, gate {gate}",
                               GOAL_READY_RATIO,
                               (comparison.get("ready_seconds") or {}).get("max_ratio")))
    if failover is None:
        return out
    fraction = failover.get("waited_fraction")
    met = None if fraction is None else fraction <= GOAL_WAITED_FRACTION
    out.append(Goal(
        "SIGKILL of one of 3: share of the stream around it that waited for the Lease",
        "<= 1/3 (0.33)", "not measured" if fraction is None else
        f"{fraction:.2f} ({failover['waited']} of {failover['around']['created']}; waited: "
        f"create -> converged > {failover['threshold_seconds']:.2f} s)",
        met, "" if met is not False else f"+{fraction - GOAL_WAITED_FRACTION:.2f}"))
    before, rest = failover.get("before") or {}, failover.get("rest") or {}
    p50, p99 = ratio(rest.get("p50"), before.get("p50")), ratio(rest.get("p99"), before.get("p99"))
    met = None if p50 is None or p99 is None else max(p50, p99) <= AS_FAST_TOLERANCE
    out.append(Goal(
        "SIGKILL of one of 3: the rest converge as fast as before (p50, p99)",
        f"<= {AS_FAST_TOLERANCE:g}x each", "not measured" if met is None else
        f"p50 {rest['p50']:.2f} s vs {before['p50']:.2f} s ({p50:.2f}x), "
        f"p99 {rest['p99']:.2f} s vs {before['p99']:.2f} s ({p99:.2f}x)",
        met, "" if met is not False else f"+{max(p50, p99) - AS_FAST_TOLERANCE:.2f}x"))
    return out
