"""bench/scale.py's pure parts: the /metrics reconcile count, the per-object slope, the
goals of issue 17, the fleet's converged objects and the generated section.

The benchmark itself needs the control plane (`make bench-scale`); these tests only pin
the arithmetic and the rendering its report rests on. No timing is asserted.
"""

from __future__ import annotations

import pytest

from bench.convergence.operators import reconcile_total
from bench.scaling import analysis, report
from bench.scaling.fleet import Growth, finished_rollout_status, fleet_name, fleet_service
from k8s_http import needs_apply
from my.render import render_deployment, render_service
from my.status import AVAILABLE, desired_status, status_changed

METRICS = """\
# HELP controller_runtime_reconcile_total Total number of reconciliations per controller
# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller="my",result="success"} 998
controller_runtime_reconcile_total{controller="my",result="error"} 2
controller_runtime_reconcile_total{controller="my",result="requeue"} 0
controller_runtime_reconcile_total_created{controller="my",result="success"} 1.7e+09
controller_runtime_reconcile_time_seconds_sum{controller="my"} 12.5
controller_runtime_reconcile_errors_total{controller="my"} 2
"""


# ---------------------------------------------------------------- /metrics

def test_reconcile_total_sums_every_result_of_the_counter_only():
    assert reconcile_total(METRICS) == 1000


def test_reconcile_total_reads_an_unlabelled_sample_and_floats():
    assert reconcile_total("controller_runtime_reconcile_total 3.0\n") == 3
    assert reconcile_total('controller_runtime_reconcile_total{a="b"} 1e3 1700000000\n') == 1000


def test_reconcile_total_is_zero_without_the_counter():
    assert reconcile_total("# nothing\nprocess_cpu_seconds_total 4\n") == 0


def test_reconcile_total_refuses_a_broken_sample():
    with pytest.raises(ValueError):
        reconcile_total('controller_runtime_reconcile_total{controller="my"} many\n')


# ---------------------------------------------------------------- slope

def test_fit_line_recovers_an_exact_slope():
    idle = 30 * analysis.MIB
    points = [(n, idle + n * 2.0 * analysis.KIB) for n in (0, 1000, 10000)]
    line = analysis.fit_line(points)
    assert line.slope / analysis.KIB == pytest.approx(2.0)
    assert line.intercept == pytest.approx(idle)
    assert line.points == 3


def test_fit_line_is_least_squares_through_noisy_points():
    # y = x + noise that sums to zero at each end: the slope is the mean trend.
    line = analysis.fit_line([(0, 1.0), (1, 1.0), (2, 3.0), (3, 3.0)])
    assert line.slope == pytest.approx(0.8)
    assert line.intercept == pytest.approx(0.8)


def test_fit_line_needs_two_distinct_sizes():
    assert analysis.fit_line([]) is None
    assert analysis.fit_line([(1000, 5.0), (1000, 6.0)]) is None


def test_per_object_kib_is_above_the_idle_process():
    assert analysis.per_object_kib(40 * analysis.MIB, 30 * analysis.MIB, 1024) == \
        pytest.approx(10.0)
    assert analysis.per_object_kib(40.0, 30.0, 0) is None


# ---------------------------------------------------------------- goals

def _goals(**overrides):
    figures = dict(slope_kib=2.0, peer_slope_kib=3.0, ready_seconds=1.1, bare_seconds=1.0,
                   writes_by_size={0: 0, 1000: 0}, idle_percent=0.5, largest_size=1000)
    figures.update(overrides)
    return {g.name.split(",")[0].split(" (")[0]: g for g in analysis.goals(**figures)}


def test_every_goal_met():
    goals = _goals()
    assert [g.met for g in goals.values()] == [True] * 5
    assert all(g.by == "" for g in goals.values())


def test_each_goal_missed_says_by_how_much():
    goals = _goals(slope_kib=5.0, peer_slope_kib=4.0, ready_seconds=1.5, bare_seconds=1.0,
                   writes_by_size={0: 0, 1000: 7}, idle_percent=2.5)
    assert [g.met for g in goals.values()] == [False] * 5
    slope, peer, ready, writes, idle = goals.values()
    assert slope.by == "+2.50 KiB (2.0x)"
    assert peer.by == "+1.00 KiB/My" and peer.measured == "1.25x"
    assert ready.by == "+0.30 s" and ready.measured == "1.50x"
    assert writes.by == "7 writes" and "7 at 1,000" in writes.measured
    assert idle.by == "+1.50 points"


def test_goal_boundaries_are_inclusive_where_the_issue_says_at_most():
    goals = _goals(slope_kib=2.5, peer_slope_kib=2.5, ready_seconds=1.2, bare_seconds=1.0,
                   idle_percent=1.0)
    slope, peer, ready, _writes, idle = goals.values()
    assert slope.met and peer.met and ready.met
    assert idle.met is False            # "under 1% of a core": 1.0 is not under


def test_the_ready_goal_takes_the_median_ratio_of_every_pair():
    # the run's own pair (1.5x) and three more: median of 1.5, 1.1, 1.0, 1.2 = 1.15
    goals = _goals(ready_seconds=1.5, bare_seconds=1.0,
                   ready_pairs=[(2.2, 2.0), (1.0, 1.0), (2.4, 2.0)])
    ready = goals["ready vs the bare client's read"]
    assert ready.met and ready.measured == "1.15x, median of 4 pairs (1.00-1.50x)"
    missed = _goals(ready_seconds=1.5, bare_seconds=1.0, ready_pairs=[(1.3, 1.0), (1.0, 1.0)])
    ready = missed["ready vs the bare client's read"]
    assert ready.met is False and ready.by == "+0.10x"       # median 1.3


def test_a_goal_without_figures_is_not_measured_rather_than_met():
    goals = _goals(slope_kib=None, peer_slope_kib=None, ready_seconds=None, writes_by_size={},
                   idle_percent=None)
    assert [g.met for g in goals.values()] == [None] * 5
    assert all(g.measured == "not measured" for g in goals.values())


# ---------------------------------------------------------------- the fleet's objects

def _my(name="s-000001"):
    return {"apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"name": name, "namespace": "scale-fleet", "uid": "u-1", "generation": 1},
            "spec": {"image": "registry.example.com/team/app:1.0", "replicas": 1,
                     "port": 8080, "serviceType": "ClusterIP"}}


def test_fleet_names_sort_in_creation_order():
    names = [fleet_name(i) for i in (0, 9, 10, 99_999)]
    assert names == sorted(names) and len({len(n) for n in names}) == 1


def test_the_fleets_deployment_status_makes_the_operator_report_available_and_write_nothing():
    my = _my()
    deployment = render_deployment(my)
    deployment["metadata"]["generation"] = 1
    deployment["status"] = finished_rollout_status(deployment, "2026-12-01T00:00:00Z")
    my["status"] = desired_status(my, deployment, now="2026-12-01T00:00:00Z")
    ready = my["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("True", AVAILABLE)
    # What the operator would compute on start-up equals what is stored: no status write.
    again = desired_status(my, deployment, now="2026-12-02T00:00:00Z")
    assert not status_changed(my["status"], again)
    assert not needs_apply(render_deployment(my), deployment)


def test_a_headless_fleet_service_is_the_operators_service_without_an_address():
    my = _my()
    rendered, headless = render_service(my), fleet_service(my, headless=True)
    assert fleet_service(my) == rendered
    assert headless["spec"].pop("clusterIP") == "None"
    assert headless == rendered
    # As the apiserver returns it (clusterIPs defaulted), the operator finds nothing to apply.
    live = fleet_service(my, headless=True)
    live["spec"]["clusterIPs"] = ["None"]
    live["spec"]["sessionAffinity"] = "None"
    assert not needs_apply(render_service(my), live)


def test_growth_rates():
    assert Growth(100, 4.0).as_dict() == {"created_my": 100, "seconds": 4.0,
                                          "my_per_second": 25.0, "objects_per_second": 75.0,
                                          "requests_per_second": 125.0}
    assert Growth(0, 0.0).as_dict()["my_per_second"] == 0.0


# ---------------------------------------------------------------- the generated section

def _run(ready, settled, writes=0, **extra):
    return {"label": extra.pop("label", "op"), "ready_seconds": ready,
            "all_reconciled_seconds": ready + 1, "reconciles": 10, "cpu_seconds": 1.0,
            "cpu_seconds_to_all_reconciled": 0.9, "peak_rss_mib": settled + 5,
            "settled_rss_mib": settled, "idle_cpu_percent": 0.1, "writes": writes,
            "writes_by_kind": {"patch my/status": writes} if writes else {},
            "ready_signal": "/readyz 200", "reconciled_signal": "metrics", **extra}


def test_markdown_has_slopes_goals_and_the_before_column(tmp_path):
    data = {
        "meta": {"command": "python -m bench scale --sizes 0,1000", "date": "2026-12-01",
                 "git": "abc1234", "machine": {"load_average_at_start": [1.0, 2.0, 3.0],
                                               "cpus": 2, "memory_gib": 24},
                 "python": "3.11", "versions": {"etcd": "v3"}},
        "settings": {"operators": ["ours-w4", "cr-w4"], "settle_seconds": 10.0,
                     "idle_seconds": 30.0, "bare_mode": "paged"},
        "fleet": [{"size": 0, "created_my": 0, "seconds": 0.0, "my_per_second": 0.0,
                   "objects_per_second": 0.0, "requests_per_second": 0.0,
                   "control_plane_rss_mib": {"kube-apiserver": 300.0, "etcd": 50.0}},
                  {"size": 1000, "created_my": 1000, "seconds": 30.0, "my_per_second": 33.3,
                   "objects_per_second": 100.0, "requests_per_second": 166.7,
                   "control_plane_rss_mib": {"kube-apiserver": 400.0, "etcd": 80.0}}],
        "bare": {"1000": {"seconds": 0.5, "seconds_in_process": 0.3, "items": {}}},
        "runs": {"0": {"ours-w4": _run(0.4, 30.0), "cr-w4": _run(0.3, 28.0)},
                 "1000": {"ours-w4": _run(0.6, 40.0, writes=3), "cr-w4": _run(0.5, 36.0)}},
    }
    from bench import scale
    scale.summarise(data)
    assert data["slopes"]["ours-w4"]["kib_per_my"] == pytest.approx(10.24)
    assert data["slopes"]["cr-w4"]["kib_per_my"] == pytest.approx(8.192)
    before = {"meta": {"git": "0ld0ld0"}, "slopes": {"ours-w4": {"kib_per_my": 16.0,
                                                                 "intercept_mib": 33.0}}}
    out = tmp_path / "RESULTS.scale.md"
    report.write_markdown(out, data, before)
    text = out.read_text()
    assert "10.24 KiB/My" in text and "8.19 KiB/My" in text
    assert "| before (0ld0ld0) | 16.00 KiB/My (idle 33.0 MiB) | – |" in text
    assert "1.20×" in text                          # ready ÷ bare client, ours at 1,000
    assert "**no**, by 3 writes" in text
    assert "3 patch my/status" in text
    goal_lines = [report.goal_text(g) for g in data["goals"]]
    assert any("MISSED" in line for line in goal_lines)


def test_markdown_of_a_run_stopped_early_says_which_sizes_it_has(tmp_path):
    data = {"settings": {"operators": ["ours-w4"], "sizes": [0, 1000, 30000],
                         "settle_seconds": 10.0, "idle_seconds": 30.0},
            "fleet": [], "bare": {},
            "runs": {"0": {"ours-w4": _run(0.4, 30.0)}, "1000": {"ours-w4": _run(0.6, 40.0)}}}
    from bench import scale
    scale.summarise(data)
    out = tmp_path / "RESULTS.scale.md"
    report.write_markdown(out, data)
    assert "**Stopped early**: sizes measured 0, 1,000 of the planned 0, 1,000, 30,000" \
        in out.read_text()


# ---------------------------------------------------------------- the bare-client seam

def test_the_bare_client_streams_by_default_and_drops_the_selector(monkeypatch):
    from bench.scaling import bare
    calls = []
    monkeypatch.setattr(bare, "measure", lambda client, resource, namespace=None: (
        calls.append((client, resource, namespace)) or {"mode": "streaming", "objects": 7,
                                                         "seconds": 0.1}))
    assert bare.DEFAULT_MODE == "stream" and sorted(bare.LISTERS) == ["paged", "stream"]
    assert bare.LISTERS["stream"]("client", "my", "ns", "a=b") == 7
    assert calls == [("client", "my", "ns")]


def test_a_reused_fleet_is_taken_over_and_its_last_threads_are_made_again():
    from bench.scaling.fleet import Fleet

    class Listing:
        def __init__(self, names):
            self.names = names

        def list(self, resource, *, namespace):
            assert namespace == "ns"
            return {"items": [{"metadata": {"name": n}} for n in self.names]}

        def get(self, resource, name, *, namespace):
            assert (resource.plural, name, namespace) == ("services", fleet_name(0), "ns")
            return {"spec": {"clusterIP": "10.0.0.10"}}

    # s-000000 .. s-000099, then a gap: only the unbroken run from 0 counts.
    names = [fleet_name(i) for i in range(100)] + [fleet_name(150), "someone-elses"]
    fleet = Fleet(Listing(names), "ns", threads=16)
    assert fleet.discover() == 100
    assert fleet.size == 84                 # the last 16 may have been cut short: made again
    assert Fleet(Listing([]), "ns", threads=16).discover() == 0
    small = Fleet(Listing([fleet_name(0)]), "ns", threads=16)
    assert small.discover() == 1 and small.size == 0


def test_a_reused_fleet_of_other_services_than_asked_for_is_refused():
    from bench.scaling.fleet import Fleet, FleetMismatch
    from k8s_http.core.errors import NotFoundError

    class Plane:
        def __init__(self, service):
            self.service = service

        def list(self, resource, *, namespace):
            return {"items": [{"metadata": {"name": fleet_name(i)}} for i in range(3)]}

        def get(self, resource, name, *, namespace):
            if self.service is None:
                raise NotFoundError("services s-000000 not found")
            return self.service

    clusterip, headless = {"spec": {"clusterIP": "10.0.0.10"}}, {"spec": {"clusterIP": "None"}}
    assert Fleet(Plane(headless), "ns", headless=True).discover() == 3
    assert Fleet(Plane(clusterip), "ns").discover() == 3
    assert Fleet(Plane(None), "ns", headless=True).discover() == 3     # cut short: no answer
    with pytest.raises(FleetMismatch, match="has ClusterIP Services and this run asks for "
                                            "headless ones: run without --headless-services"):
        Fleet(Plane(clusterip), "ns", headless=True).discover()
    with pytest.raises(FleetMismatch, match="has headless Services .* run with --headless"):
        Fleet(Plane(headless), "ns").discover()


def test_the_ready_pairs_alternate_who_goes_first(monkeypatch):
    from bench import scale
    runs = []
    monkeypatch.setattr(scale, "run_bare", lambda *_: runs.append("bare") or {"seconds": 2.0})
    monkeypatch.setattr(scale, "ready_once", lambda *_: runs.append("ours") or 3.0)
    pairs = scale.ready_pairs(bench=None, cluster=None, size=10, count=3, mode="stream",
                              timeout=1.0)
    assert runs == ["bare", "ours", "ours", "bare", "bare", "ours"]
    assert [p["first"] for p in pairs] == ["bare", scale.HEADLINE, "bare"]
    assert [p["ratio"] for p in pairs] == [1.5] * 3


def test_the_log_line_gives_the_new_my_figures_only_when_measured():
    run = {"ready_seconds": 1.0, "writes": 3}
    assert "new My" not in report.one_line(run)
    assert report.one_line({**run, "new_my_seconds": [0.41, None]}).endswith(
        ", new My at ready -> converged [0.41, None] s")
