"""The pure parts of `bench/converge.py --pods-ready` (bench/convergence/ready.py and
ready_report.py): the loads, the split of each My's wait, the goals and the section
kept in RESULTS.converge.md. The measurement itself needs the plane with Pods."""

from __future__ import annotations


import pytest

from bench.convergence import ready, ready_report, report


def test_loads_parse_one_at_a_time_and_rates():
    loads = ready.parse_loads("100@serial, 200@5,400@20")
    assert [(l.count, l.rate) for l in loads] == [(100, None), (200, 5.0), (400, 20.0)]
    assert [l.key for l in loads] == ["ready_100_serial", "ready_200_5ps", "ready_400_20ps"]
    assert loads[0].title == "100 one at a time" and loads[2].title == "400 at 20/s"
    for bad in ("", "100", "x@5", "0@5", "10@0"):
        with pytest.raises(ValueError):
            ready.parse_loads(bad)


def _deployment(name, *, ready_replicas=0, updated=0, generation=1, observed=1):
    return {"metadata": {"name": name, "generation": generation}, "spec": {"replicas": 1},
            "status": {"observedGeneration": observed, "readyReplicas": ready_replicas,
                       "updatedReplicas": updated}}


def _my(name, status="False", reason="Progressing", observed=1):
    return {"metadata": {"name": name, "generation": 1},
            "status": {"observedGeneration": observed,
                       "conditions": [{"type": "Ready", "status": status, "reason": reason}]}}


def test_each_wait_is_split_into_the_operators_legs_and_the_planes():
    each = ready.ReadyPerObject(["a"])
    each.sent("a", 10.0)
    each.offer("deployment", _deployment("a"), 10.020)                      # made: +20 ms
    each.offer("my", _my("a"), 10.030)                                     # Progressing
    each.offer("deployment", _deployment("a", ready_replicas=1, updated=1, observed=0), 10.1)
    each.offer("deployment", _deployment("a", ready_replicas=1, updated=1), 10.150)
    each.offer("my", _my("a", "True", "Available", observed=0), 10.155)    # stale generation
    each.offer("my", _my("a", "True", "Available"), 10.160)                # Ready: +10 ms
    each.offer("my", _my("a", "True", "Available"), 10.300)                # later: ignored
    each.offer("service", {"metadata": {"name": "a"}}, 10.02)
    each.offer("deployment", _deployment("other"), 10.0)                   # not ours
    assert each.wait_ready(["a"], 0.0) and each.pending() == []
    figures = each.figures()
    assert figures["ready_p50_ms"] == pytest.approx(160)
    assert figures["deployment_p50_ms"] == pytest.approx(20)
    assert figures["available_p50_ms"] == pytest.approx(150)
    assert figures["available_to_ready_p50_ms"] == pytest.approx(10)
    assert figures["operator_added_p99_ms"] == pytest.approx(30)
    assert each.versions == {"my": 4, "deployment": 3, "service": 1}


def test_an_object_not_yet_ready_is_pending_and_left_out_of_the_figures():
    each = ready.ReadyPerObject(["a", "b"])
    each.sent("a", 0.0)
    each.sent("b", 0.0)
    each.offer("deployment", _deployment("a", ready_replicas=1, updated=1), 0.1)
    each.offer("my", _my("a", "True", "Available"), 0.2)
    assert each.pending() == ["b"] and not each.wait_ready(["a", "b"], 0.01)
    assert each.figures()["ready_max_ms"] == pytest.approx(200)


def _data(ours: dict, peer: dict, floor: dict | None = None) -> dict:
    raw = {"ours-w4": {"ready_10_serial": [ours], "ready_20_5ps": [ours]},
           "cr-w4": {"ready_10_serial": [peer], "ready_20_5ps": [peer]}}
    if floor is not None:
        raw["floor"] = {"ready_10_serial": [floor], "ready_20_5ps": [floor]}
    return {"raw": raw, "operators": report.aggregate(raw),
            "ratios": report.ratios(raw, reference="cr-w4"),
            "loads": [{"key": "ready_10_serial", "title": "10 one at a time", "rate": None},
                      {"key": "ready_20_5ps", "title": "20 at 5/s", "rate": 5.0}]}


def test_goals_are_ratios_to_the_peer_and_the_write_budget():
    ours = {"operator_added_p50_ms": 10.0, "operator_added_p99_ms": 40.0, "cpu_seconds": 1.0,
            "plane_cpu_net_ms_per_my": 70.0, "object_writes_to_ready_per_my": 3.5}
    peer = {"operator_added_p50_ms": 25.0, "operator_added_p99_ms": 50.0, "cpu_seconds": 2.0,
            "plane_cpu_net_ms_per_my": 100.0, "object_writes_to_ready_per_my": 4.5}
    goals = {g["goal"]: g for g in ready_report.goals(_data(ours, peer), op="ours-w4",
                                                      reference="cr-w4")}
    assert goals["10 one at a time: operator-added p50 <= the peer's"]["value"] == 0.4
    assert goals["20 at 5/s: operator-added p50 <= 0.5x the peer's"]["met"] is True
    assert goals["20 at 5/s: operator-added p99 <= 0.5x the peer's"]["met"] is False
    assert goals["20 at 5/s: operator CPU <= 0.75x"]["value"] == 0.5
    assert goals["20 at 5/s: plane CPU (kube-apiserver + etcd, above quiet) per My <= 0.8x"][
        "met"] is True
    assert goals["10 one at a time: writes per My (Events apart), create -> Ready <= 4.0"][
        "value"] == 3.5


def test_with_the_floor_in_the_run_each_ratio_goal_shows_the_best_any_operator_could_reach():
    ours = {"operator_added_p50_ms": 20.0, "operator_added_p99_ms": 40.0, "cpu_seconds": 1.0,
            "plane_cpu_net_ms_per_my": 90.0, "object_writes_to_ready_per_my": 3.5}
    peer = {"operator_added_p50_ms": 25.0, "operator_added_p99_ms": 50.0, "cpu_seconds": 2.0,
            "plane_cpu_net_ms_per_my": 100.0, "object_writes_to_ready_per_my": 4.5}
    floor = {"operator_added_p50_ms": 15.0, "operator_added_p99_ms": 30.0, "cpu_seconds": 0.0,
             "plane_cpu_net_ms_per_my": 85.0, "object_writes_to_ready_per_my": 3.0}
    listed = ready_report.goals(_data(ours, peer, floor), op="ours-w4", reference="cr-w4",
                                floor="floor")
    goals = {g["goal"]: g for g in listed}
    assert goals["20 at 5/s: operator-added p50 <= 0.5x the peer's"]["floor"] == 0.6
    assert goals["20 at 5/s: plane CPU (kube-apiserver + etcd, above quiet) per My <= 0.8x"][
        "floor"] == 0.85
    # No floor figure for what only an operator process has.
    assert "floor" not in goals["20 at 5/s: operator CPU <= 0.75x"]
    lines = report.goal_lines(listed)
    assert lines[0].endswith("| the floor (no operator) |")
    assert any(line.endswith("| 0.85x |") for line in lines)
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_the_floor_makes_each_mys_children_once_and_reports_each_once_when_available():
    from bench.convergence.floor_operator import FloorOperator
    floor = FloorOperator(kubeconfig=None, namespace="ns")
    my = {"metadata": {"name": "a", "generation": 1}}
    progressing = {"metadata": {"name": "a", "generation": 1},
                   "spec": {"replicas": 1}, "status": {"observedGeneration": 1}}
    available = {"metadata": {"name": "a", "generation": 1}, "spec": {"replicas": 1},
                 "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                            "readyReplicas": 1, "availableReplicas": 1}}
    for kind, obj in (("my", my), ("my", my), ("deployment", progressing),
                      ("deployment", available), ("deployment", available), ("service", my)):
        floor.offer(kind, obj, 0.0)
    queued = []
    while not floor._todo.empty():
        what, obj = floor._todo.get_nowait()
        queued.append((what, obj["metadata"]["name"]))
    assert queued == [("children", "a"), ("status", "a")]


def test_the_section_replaces_its_earlier_self_and_survives_the_burst_report(tmp_path):
    path = tmp_path / "RESULTS.converge.md"
    path.write_text("# burst report\n")
    ready_report.splice(path, [ready_report.BEGIN, "first", ready_report.END])
    ready_report.splice(path, [ready_report.BEGIN, "second", ready_report.END])
    text = path.read_text()
    assert text.startswith("# burst report\n") and "second" in text and "first" not in text
    assert ready_report.kept_block(path) == f"{ready_report.BEGIN}\nsecond\n{ready_report.END}"
    assert ready_report.kept_block(tmp_path / "missing.md") is None
