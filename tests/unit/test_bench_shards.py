"""bench/shards.py's pure parts: ready with its share, settled, the ratios to the single
replica, the creation stream around a SIGKILL, issue 37 item 5's goals and the
generated section; and the control plane's apiserver flag swap it restarts with.

The benchmark itself needs the control plane (`python -m bench shards`); these tests
only pin the arithmetic and the rendering its report rests on. No timing is asserted.
"""

from __future__ import annotations

import pytest

from bench import shards
from bench.sharded import analysis, report
from tests.support.controlplane import ControlPlane


# ---------------------------------------------------------------- ready, settled

def test_ready_is_the_first_200_after_the_last_change_of_share():
    samples = [(0.5, False), (1.0, True), (1.5, False), (2.0, False), (2.5, True), (3.0, True)]
    # Ready at 1.0 s with a first share; its share changed at 1.2 s; ready again at 2.5 s.
    assert analysis.ready_times(samples, 1.2) == (1.0, 2.5)


def test_a_sample_taken_at_the_change_itself_does_not_count():
    # The 200 at 2.0 s may have been answered before the new lists were asked for.
    assert analysis.ready_times([(2.0, True), (2.1, True)], 2.0) == (2.0, 2.1)


def test_without_a_change_of_share_ready_is_the_first_200_and_never_ready_is_none():
    assert analysis.ready_times([(0.1, False), (0.7, True)], None) == (0.7, 0.7)
    assert analysis.ready_times([(0.1, False), (0.2, False)], 0.05) == (None, None)
    assert analysis.ready_times([(0.1, True), (0.2, True)], 5.0) == (0.1, None)


def _settled(**overrides):
    figures = dict(ready=[True, True, True], held=[80.0, 90.0, 86.0],
                   quiet_seconds=[3.5, 4.0, 10.0], stable_seconds=3.0)
    figures.update(overrides)
    return analysis.is_settled(**figures)


def test_settled_needs_every_replica_ready_all_slots_held_none_idle_and_quiet():
    assert _settled()
    assert not _settled(ready=[True, False, True])
    assert not _settled(held=[80.0, 90.0, 85.0])             # a slot nobody holds
    assert not _settled(held=[256.0, 0.0, 0.0])              # a replica without slots
    assert not _settled(quiet_seconds=[3.5, 2.9, 10.0])      # a share changed just now
    assert _settled(ready=[True], held=[256.0], quiet_seconds=[3.0])
    assert not _settled(ready=[], held=[], quiet_seconds=[0.0])


# ---------------------------------------------------------------- ratios

def test_compare_gives_each_replicas_ratio_to_the_single_one_and_the_largest():
    single = {"rss_mib": 100.0}
    replicas = [{"rss_mib": 38.0}, {"rss_mib": 45.0}, {"rss_mib": 40.0}]
    c = analysis.compare(single, replicas, "rss_mib")
    assert c["ratios"] == pytest.approx([0.38, 0.45, 0.40])
    assert c["max"] == 45.0 and c["max_ratio"] == pytest.approx(0.45)


def test_compare_above_a_baseline_takes_it_off_every_figure():
    c = analysis.compare({"rss_mib": 100.0}, [{"rss_mib": 40.0}, {"rss_mib": 50.0}],
                         "rss_mib", baseline=30.0)
    assert c["single"] == 70.0 and c["values"] == [10.0, 20.0]
    assert c["max_ratio"] == pytest.approx(20 / 70)


def test_a_missing_figure_leaves_the_largest_ratio_unmeasured():
    c = analysis.compare({"rss_mib": 100.0}, [{"rss_mib": 40.0}, {}], "rss_mib")
    assert c["ratios"] == [0.4, None] and c["max_ratio"] is None
    assert analysis.compare(None, [{"rss_mib": 1.0}], "rss_mib")["max_ratio"] is None
    assert analysis.compare({"rss_mib": 1.0}, [], "rss_mib")["max_ratio"] is None


# ---------------------------------------------------------------- the stream around a kill

def _stream():
    """40 My, one a second; the kill at 20 s, recovery at 30 s. Slot = index % 4, the
    killed replica held slot 0. Undisturbed latency 1 s; the killed replica's My
    created before recovery converge at 31 s; one survivor's My waited 5 s."""
    created, converged, slots = {}, {}, {}
    for i in range(40):
        name = f"m{i:02d}"
        created[name], slots[name] = float(i), i % 4
        converged[name] = i + 1.0
        if 19 <= i <= 30 and i % 4 == 0:
            converged[name] = 31.0
    converged["m25"] = 30.0
    del converged["m29"]                 # never converged
    return created, converged, slots


def test_the_stream_is_split_at_the_kill_and_the_recovery():
    created, converged, slots = _stream()
    f = analysis.failover_figures(created, converged, slots, {0}, killed=20.0, recovered=30.0)
    # Converged before the kill: created 0..18 (m18 at 19 s; m19 waits to 31 s).
    assert f["before"]["count"] == 19 and f["before"]["p99"] == 1.0
    assert f["threshold_seconds"] == 2.0
    # Around: created 19..30, not done before the kill. Waited: m20, m24, m28 (the
    # killed replica's slot), m25 (5 s) and m29 (never converged).
    assert f["around"]["created"] == 12
    assert f["waited"] == 5
    assert f["waited_fraction"] == pytest.approx(5 / 12)
    assert f["waited_in_survivors_slots"] == 2
    assert f["rest"]["count"] == 7 and f["rest"]["p50"] == 1.0
    assert f["around_in_killed_slots"]["created"] == 3
    assert f["around"]["never_converged"] == 1
    assert f["after"]["created"] == 9 and f["after"]["p99"] == 1.0
    assert f["before_trend"] == 1.0


def test_a_stream_the_replicas_fell_behind_on_before_the_kill_shows_in_the_trend():
    created = {f"m{i}": float(i) for i in range(8)}
    converged = {n: t + 1.0 + t for n, t in created.items()}      # latency 1 s .. 8 s
    f = analysis.failover_figures(created, converged, {}, set(), killed=100.0, recovered=None)
    assert f["before_trend"] == pytest.approx(7.5 / 1.5)


def test_without_a_recovery_everything_after_the_kill_is_around_it():
    created, converged, slots = _stream()
    f = analysis.failover_figures(created, converged, slots, {0}, killed=20.0, recovered=None)
    assert f["around"]["created"] == 21 and f["after"]["created"] == 0


def test_no_undisturbed_object_is_an_error_not_a_figure():
    f = analysis.failover_figures({"a": 0.0}, {"a": 5.0}, {"a": 1}, {1}, killed=1.0,
                                  recovered=4.0)
    assert "error" in f


# ---------------------------------------------------------------- goals

def _comparison(rss, read, ready):
    return {"comparison": {"rss_mib": {"max_ratio": rss}, "read_bytes": {"max_ratio": read},
                           "ready_seconds": {"max_ratio": ready}}}


def _failover(waited, around, rest_p50, rest_p99, before_p50=1.0, before_p99=2.0):
    return {"waited": waited, "around": {"created": around},
            "waited_fraction": waited / around, "threshold_seconds": 4.0,
            "before": {"p50": before_p50, "p99": before_p99},
            "rest": {"p50": rest_p50, "p99": rest_p99}}


def test_goals_met_and_the_bytes_goal_is_for_the_gate_on_only():
    goals = analysis.goals({"off": _comparison(0.4, 0.9, 0.5), "on": _comparison(0.35, 0.4, 0.3)},
                           _failover(10, 30, 1.2, 2.9))
    names = [g.name for g in goals]
    assert sum("bytes read" in n for n in names) == 1
    assert "gate on" in next(n for n in names if "bytes read" in n)
    assert [g.met for g in goals] == [True] * len(goals) and len(goals) == 7


def test_goals_missed_say_by_how_much_and_unmeasured_ones_say_so():
    goals = analysis.goals({"on": _comparison(0.55, None, 0.8)}, _failover(11, 30, 1.6, 2.0))
    rss, read, ready, waited, fast = goals
    assert (rss.met, rss.by, rss.measured) == (False, "+0.15x", "0.55x")
    assert read.met is None and read.measured == "not measured"
    assert ready.met is False and ready.by == "+0.30x"
    assert waited.met is False and waited.by == "+0.03"
    assert fast.met is False and fast.by == "+0.10x"          # p50 1.6x, p99 1.0x


def test_without_the_failover_only_the_ratio_goals():
    assert len(analysis.goals({"off": _comparison(0.3, 0.3, 0.3)}, None)) == 2


# ---------------------------------------------------------------- the whole report

def _replica(name, slots, ready, rss, read):
    return {"name": name, "slots": slots, "ready_seconds": ready, "ready_first_seconds": ready,
            "share_changes": 1, "rss_mib": rss, "peak_rss_mib": rss + 1, "read_bytes": read,
            "read_bytes_at_ready": read - 10, "cpu_seconds": 1.0,
            "objects": {"my.v1.mine.jp": slots * 10, "deployments.v1.apps": slots * 10}}


def test_summarise_and_markdown(tmp_path):
    mib = 1024 * 1024
    group = {"replicas": [_replica("on-a", 80, 4.0, 40.0, 30 * mib),
                          _replica("on-b", 90, 5.0, 45.0, 35 * mib),
                          _replica("on-c", 86, 4.5, 42.0, 33 * mib)],
             "object_writes": 0, "load_average_at_start": [1.0, 2.0, 3.0]}
    data = {
        "meta": {"command": "python -m bench shards --size 2000", "date": "2026-12-06",
                 "git": "abc1234", "machine": {"load_average_at_start": [1.0, 2.0, 3.0],
                                               "cpus": 2, "memory_gib": 24},
                 "python": "3.11", "versions": {"etcd": "v3"}, "wall_seconds": 600},
        "settings": {"size": 2000, "replicas": 3, "workers": 4, "stream_rate": 20.0,
                     "stream_seconds": 60.0},
        "idle": {"replicas": [_replica("idle", 256, 1.0, 30.0, 5 * mib)]},
        "gates": {"on": {"single": {"replicas": [_replica("on-solo", 256, 10.0, 100.0,
                                                          100 * mib)],
                                    "object_writes": 0},
                         "three": group, "bare": {"seconds": 3.0},
                         "apiserver": {"apiserver_restart_seconds": 8.0}}},
        "failover": {"created": 1200, "victim": "on-a", "victim_slots": 80,
                     "killed_at": 30.0, "not_converged": 0,
                     "recovery": {"claimed_after_kill": 15.5, "recovered_after_kill": 17.0},
                     **_failover(100, 400, 1.1, 2.1), "object_writes": 3600},
        "fleet": {"created_my": 2000, "seconds": 100.0, "my_per_second": 20.0},
        "converge": {"reconciled_seconds": 60.0, "seconds": 65.0, "writes": 12000,
                     "failed_writes": 4000, "writes_by_kind": {"patch deployments": 4000}},
    }
    shards.summarise(data)
    comparison = data["gates"]["on"]["comparison"]
    assert comparison["rss_mib"]["max_ratio"] == pytest.approx(0.45)
    assert comparison["ready_seconds"]["max_ratio"] == pytest.approx(0.5)
    above = data["gates"]["on"]["comparison_above_idle"]["rss_mib"]
    assert above["max_ratio"] == pytest.approx(15 / 70)
    assert [g["met"] for g in data["goals"]] == [False, True, True, True, True]
    path = tmp_path / "RESULTS.shards.md"
    report.write_markdown(path, data)
    text = path.read_text()
    assert text.startswith("## Sharded replicas: 1 vs 3 at 2,000 `My`")
    assert "| RSS of each replica vs the single one, gate on | <= 0.4x | 0.45x | **no**, by +0.05x |" \
        in text
    assert "| steady RSS (VmRSS) | 100.0 MiB | 40.0 MiB | 45.0 MiB | 42.0 MiB | 0.45× |" in text
    assert "| steady RSS above the idle replica | 70.0 MiB |" in text
    assert "python -m bench shards --size 2000" in text and " Whole run: 10.0 min.\n" in text


def test_a_joiner_is_compared_with_the_single_replica_per_slot_too(tmp_path):
    mib = 1024 * 1024
    single = {**_replica("on-solo", 256, 10.0, 100.0, 100 * mib), "cpu_seconds": 25.6}
    together = [{**_replica(n, 80, 9.0, 40.0, 30 * mib), "cpu_seconds": 11.2}
                for n in ("on-a", "on-b", "on-c")]
    joiner = {**_replica("on-d", 64, 3.0, 35.0, 25 * mib), "cpu_seconds": 6.4}
    data = {"meta": {}, "settings": {"size": 2000, "replicas": 3},
            "gates": {"on": {"single": {"replicas": [single]},
                             "three": {"replicas": together}}},
            "rejoin": {"replicas": [joiner], "object_writes": 0,
                       "survivors_slots_before": [128, 128], "survivors_slots_after": [96, 96],
                       "settled_seconds": 5.5, "load_average_at_start": [1.0, 2.0, 3.0]}}
    shards.summarise(data)
    c = data["rejoin"]["comparison"]
    assert c["ready_seconds"] == pytest.approx(0.3)
    assert c["cpu_per_slot"] == {"single": pytest.approx(0.1), "joiner": pytest.approx(0.1),
                                 "ratio": pytest.approx(1.0)}
    path = tmp_path / "RESULTS.shards.md"
    report.write_markdown(path, data)
    text = path.read_text()
    assert "### A replica joining the running ring" in text
    assert "their slots 128 + 128 before, 96 + 96 after" in text
    assert "| start-up: spawn → ready with its share | 10.00 s | 3.00 s | 0.30× |" in text
    assert "| CPU per slot held, spawn → steady | 0.100 s | 0.100 s | 1.00× |" in text
    assert "0.140 s (1.40×)" in text


def test_a_failed_rejoin_says_so_and_compares_nothing(tmp_path):
    data = {"meta": {}, "settings": {"size": 10}, "gates": {},
            "rejoin": {"error": "not settled within 180 s", "object_writes": 0}}
    shards.summarise(data)
    assert "comparison" not in data["rejoin"]
    path = tmp_path / "RESULTS.shards.md"
    report.write_markdown(path, data)
    assert "Failed: not settled within 180 s" in path.read_text()


# ---------------------------------------------------------------- the apiserver's flags

def test_set_apiserver_flag_replaces_the_flag_for_the_next_start(tmp_path):
    plane = ControlPlane(tmp_path, pods=False,
                         apiserver_args=["--feature-gates=ShardedListAndWatch=true", "--v=2"])
    plane._argv["kube-apiserver"] = ["kube-apiserver", "--v=1",
                                     "--feature-gates=ShardedListAndWatch=true", "--v=2"]
    plane.set_apiserver_flag("--feature-gates", "ShardedListAndWatch=false")
    assert plane._argv["kube-apiserver"] == ["kube-apiserver", "--v=1", "--v=2",
                                             "--feature-gates=ShardedListAndWatch=false"]
    assert plane._extra_args["kube-apiserver"] == ["--v=2",
                                                   "--feature-gates=ShardedListAndWatch=false"]


# ---------------------------------------------------------------- the fleet for sharded replicas

def test_the_sharded_fleets_children_are_what_a_sharded_replica_renders():
    import controller
    from bench.scaling.fleet import fleet_child, fleet_service
    from k8s_http import Store, needs_apply
    from k8s_http.core.objects import DEPLOYMENTS, SERVICES
    from my.render import render_deployment
    from my.spec import MY, SLOT_LABEL
    my = {"apiVersion": "mine.jp/v1", "kind": "My",
          "metadata": {"name": "s-000001", "namespace": "shards-fleet", "generation": 1,
                       "uid": "5f2b9c1e-0d7a-4c59-a0e4-3f1a2b3c4d5e"},
          "spec": {"image": "registry.example.com/team/app:1.0", "replicas": 1, "port": 8080,
                   "serviceType": "ClusterIP"}}
    reconciler = controller.MyReconciler(
        None, {MY: Store(), DEPLOYMENTS: Store(), SERVICES: Store()}, slot_label=SLOT_LABEL,
        watch_for_deletion=lambda *a: True, cancel_deletion_watches=lambda o: None)
    deployment, service = reconciler._validate_and_render(my)[1]
    assert fleet_child(my, render_deployment, slot_label=SLOT_LABEL) == deployment
    assert fleet_service(my, slot_label=SLOT_LABEL) == service
    headless = fleet_service(my, headless=True, slot_label=SLOT_LABEL)
    assert headless["metadata"]["labels"][SLOT_LABEL] == service["metadata"]["labels"][SLOT_LABEL]
    assert not needs_apply(service, headless)
    # Without the label, the sharded replica would apply both children again.
    assert needs_apply(deployment, fleet_child(my, render_deployment))


def test_recovery_is_all_slots_held_then_every_survivor_ready_after_its_last_change():
    def sample(t, ready, held, queued=(0, 0)):
        return {"t": t, "ready": list(ready), "held": list(held), "queued": list(queued)}
    samples = [sample(1.0, (True, True), (90, 80), (2, 1)),
               sample(15.0, (True, True), (90, 80)),
               sample(15.5, (True, True), (130, 126), (0, 0)),     # claimed; the 200s are old
               sample(16.0, (False, True), (130, 126), (300, 100)),
               sample(17.0, (True, True), (130, 126), (250, 150)),
               sample(18.0, (True, True), (130, 126), (30, 9))]
    r = analysis.recovery(samples, last_change=15.6)
    assert r["claimed_after_kill"] == 15.5 and r["recovered_after_kill"] == 17.0
    assert (r["queue_peak"], r["queue_peak_after_kill"]) == (400, 16.0)
    assert r["queue_drained_after_kill"] == 18.0
    never = analysis.recovery(samples[:2], last_change=None)
    assert never["claimed_after_kill"] is None and never["recovered_after_kill"] is None
    assert analysis.recovery([], None)["queue_peak"] is None


def _row(name, created, applied, written, seen, *, dead=False, server=None):
    return {"name": name, "slot": 1, "dead": dead, "owner": "b", "created": created,
            "deployment_applied": applied, "status_written": written, "seen": seen,
            "apply_server": server}


def test_waits_by_creation_splits_the_survivors_waits_where_they_went():
    timeline = [_row("before", -3.0, -2.9, -2.8, -2.7),           # before the kill: left out
                _row("theirs", 1.0, 9.0, 9.2, 9.3, dead=True),    # the killed one's: left out
                _row("fast", 0.5, 0.6, 0.7, 0.75, server=0.008),
                _row("queued", 1.0, 7.0, 7.2, 7.3, server=0.006),
                _row("slow-write", 2.0, 2.1, 6.1, 6.2, server=0.9),
                _row("lost", 6.0, None, None, None)]
    rows = analysis.waits_by_creation(timeline, threshold=1.0)
    assert [(r["from"], r["to"], r["created"], r["waited"]) for r in rows] == \
        [(0.0, 5.0, 3, 2), (5.0, 10.0, 1, 1)]
    first = rows[0]
    assert first["p50"] == pytest.approx(4.2)                   # 0.25, 4.2, 6.3
    assert first["waited_queue_p50"] == pytest.approx((6.0 + 0.1) / 2)
    assert first["waited_write_p50"] == pytest.approx((0.2 + 4.0) / 2)
    assert first["waited_seen_p50"] == pytest.approx(0.1)
    assert first["apply_server_p50"] == pytest.approx(0.008)   # over all three, waited or not
    assert rows[1]["p50"] is None and rows[1]["waited_queue_p50"] is None
    assert rows[1]["apply_server_p50"] is None


def test_survivors_by_window_from_cumulative_samples():
    def sample(t, cpu, apiserver, queue=((0.0, 0), (0.0, 0))):
        return {"t": t, "cpu": list(cpu), "plane_cpu": {"kube-apiserver": apiserver},
                "timings": [{"queue": list(q), "work": [0.0, 0], "request": [0.0, 0]}
                            for q in queue]}
    samples = [sample(0.0, (1.0, 2.0), 10.0), sample(2.0, (2.0, 2.5), 12.0),
               sample(5.0, (4.0, 3.0), 15.0, ((1.0, 10), (0.0, 0))),
               sample(7.0, (4.0, 3.0), 16.0, ((1.0, 10), (0.0, 0))),
               sample(9.0, (5.0, 4.0), 17.0, ((3.0, 12), (0.2, 4)))]
    windows = analysis.survivors_by_window(samples)
    assert windows[0.0]["survivors"] == [0.6, 0.2] and windows[0.0]["kube-apiserver"] == 1.0
    assert windows[0.0]["queue_ms"] == [100.0, None]          # 1 s over 10 keys; none
    assert windows[5.0]["survivors"] == [0.25, 0.25]
    assert windows[5.0]["queue_ms"] == [1000.0, 50.0]
    assert windows[5.0]["work_ms"] == [None, None]
    assert analysis.survivors_by_window([{"t": 1.0, "ready": [True]}]) == {}


def test_the_waits_table_puts_each_window_beside_the_cores_used():
    failover = {"by_creation": [{"from": 0.0, "to": 5.0, "created": 60, "waited": 12,
                                 "p50": 0.4, "waited_queue_p50": 3.5, "waited_write_p50": 0.2,
                                 "waited_seen_p50": 0.01, "apply_server_p50": 0.052}],
                "survivors_samples": [
                    {"t": 0.0, "cpu": [1.0, 1.0], "plane_cpu": {"kube-apiserver": 0.0,
                                                                "etcd": 0.0}},
                    {"t": 5.0, "cpu": [5.0, 3.0], "plane_cpu": {"kube-apiserver": 6.0,
                                                                "etcd": 1.0}}]}
    text = "\n".join(report._waits_table(failover))
    assert "| 0–5 s | 60 | 12 | 0.40 s | 3.50 s | 0.20 s | 0.01 s | 52 ms | 0.80 + 0.40 | 1.20 " \
           "| 0.20 | – | – |" in text
    assert report._waits_table({}) == []
