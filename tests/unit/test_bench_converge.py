"""The pure parts of bench/converge.py, bench/watch_decode.py and bench/startup_list.py:
request counting, aggregation, goals, profile buckets, the generated watch-decoding
section, the start-up list table.

The benchmark itself needs the control plane and kopf's venv (`make bench`);
these tests only pin the arithmetic its report rests on.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from bench.convergence import report
from bench.convergence.cluster import BENCH_USER_AGENT, AuditLog
from bench.convergence.perobject import PerObject, _quantile, agrees
from bench.convergence.scenarios import converged, env_value, server_ms, status_current


def _audit(verb, resource, *, user="admin", agent="my-controller/0.1", sub=None, code=200,
           received=None, done=None):
    ref = {"resource": resource, **({"subresource": sub} if sub else {})}
    times = {"requestReceivedTimestamp": received, "stageTimestamp": done} if received else {}
    return json.dumps({"kind": "Event", "verb": verb, "user": {"username": user},
                       "userAgent": agent, "objectRef": ref,
                       "responseStatus": {"code": code}, **times}) + "\n"


def test_audit_log_counts_only_the_operators_requests_after_the_mark(tmp_path):
    log = tmp_path / "audit.log"
    log.write_text(_audit("create", "my", agent=BENCH_USER_AGENT))
    mark = AuditLog(log).mark()
    with open(log, "a") as f:
        f.write(_audit("patch", "deployments"))
        f.write(_audit("patch", "my", sub="status"))
        f.write(_audit("create", "services", code=409))
        f.write(_audit("get", "services"))
        f.write(_audit("create", "my", agent=BENCH_USER_AGENT))        # the load generator
        f.write(_audit("update", "deployments", user="system:kube-controller-manager"))
        f.write('{"kind": "Event", "verb": "pat')                        # a line being written
    counts = AuditLog(log).since(mark)
    assert (counts.writes, counts.reads, counts.failed_writes) == (3, 1, 1)
    assert counts.by_kind == {"patch deployments": 1, "patch my/status": 1,
                              "create services": 1}


def test_audit_log_gives_the_apiservers_time_per_kind_of_write(tmp_path):
    log = tmp_path / "audit.log"
    t = "2026-12-02T13:06:30.{}Z"
    with open(log, "w") as f:
        f.write(_audit("patch", "services", received=t.format("100000"), done=t.format("146000")))
        f.write(_audit("patch", "services", received=t.format("200000"), done=t.format("230000")))
        f.write(_audit("patch", "services", received=t.format("300000"), done=t.format("400000")))
        f.write(_audit("patch", "deployments", received=t.format("100000"), done=t.format("117000")))
        f.write(_audit("patch", "deployments"))                  # no timestamps: counted, not timed
        f.write(_audit("get", "services", received=t.format("1"), done=t.format("9")))   # a read
    counts = AuditLog(log).since(0)
    assert counts.by_kind == {"patch services": 3, "patch deployments": 2}
    assert server_ms(counts.server_seconds) == {
        "patch deployments": {"p50": 17.0, "mean": 17.0},
        "patch services": {"p50": 46.0, "mean": 58.7}}


def test_ratios_pair_runs_in_order_and_skip_failed_ones():
    raw = {"ours-w4": {"burst_10": [{"converge_seconds": 1.0}, {"error": "x"},
                                    {"converge_seconds": 3.0}]},
           "kopf": {"burst_10": [{"converge_seconds": 4.0}, {"converge_seconds": 5.0},
                                 {"converge_seconds": 6.0}]}}
    agg = report.aggregate(raw)
    assert agg["ours-w4"]["burst_10"]["converge_seconds"]["median"] == 2.0
    assert agg["ours-w4"]["burst_10"]["errors"] == ["x"]
    ratio = report.ratios(raw)["ours-w4"]["burst_10"]["converge_seconds"]
    assert ratio["runs"] == [0.25, 0.5]


def test_goals_report_the_margin():
    agg = {"ours-w4": {"idle": {"writes": report.summary([0, 0, 2])},
                       "latency": {"p99_ms": report.summary([50.0]),
                                   "status_max_ms": report.summary([1500.0])},
                       "startup": {"ready_seconds": report.summary([0.5])},
                       "burst_1000": {"object_writes_per_object": report.summary([3.1])}}}
    rat = {"ours-w4": {"burst_1000": {"converged_p50_seconds": report.summary([0.5]),
                                      "converged_p99_seconds": report.summary([1.6]),
                                      "all_converged_seconds": report.summary([0.8]),
                                      "cpu_seconds": report.summary([0.6])}}}
    goals = report.goals(agg, rat, op="ours-w4", size=1000, reference="cr-w4")
    assert [g["met"] for g in goals] == [True, False, True, True, True, False, True, True,
                                         True]
    assert "cr-w4" in goals[0]["goal"]
    lines = "\n".join(report.goal_lines(goals))
    assert "2.0x the limit" in lines                  # p99 1.6x against 0.8x
    assert "1.5x the limit" in lines                  # first status in 1.5 s against 1 s


@pytest.mark.parametrize("status, ok", [
    ({"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "False"}]}, True),
    ({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}, False),
    ({"observedGeneration": 2}, False),
])
def test_status_is_current_only_with_the_generation_and_a_ready_condition(status, ok):
    my = {"metadata": {"name": "a", "generation": 2}, "status": status}
    assert status_current(my) is ok
    assert converged("my", my) is ok
    assert converged("deployment", {"metadata": {"name": "a"}})


def test_env_value_reads_the_app_container():
    deployment = {"spec": {"template": {"spec": {"containers": [
        {"name": "app", "env": [{"name": "OTHER", "value": "1"}, {"name": "FOO", "value": "v2"}]}
    ]}}}}
    assert env_value(deployment) == "v2"


def test_the_watch_decode_section_takes_every_ratio_from_its_report():
    from bench import watch_decode

    def mode(name, cpu_us):
        return {"mode": name, "label": name, "runs": 3, "events_per_second_best": 1e6 / cpu_us,
                "events_per_second_median": 1e6 / cpu_us,
                "cpu_seconds_per_event_best": cpu_us / 1e6,
                "cpu_seconds_per_event_median": cpu_us / 1e6}
    report_ = {"date": "2026-11-30T00:00:00Z", "command": "python -m bench watch_decode",
               "elapsed_seconds": 50.0, "events": 1000, "official_events": 200,
               "payload_bytes": 2_000_000, "mean_event_bytes": 2000,
               "machine": {"cpus": 2, "loadavg_1m": 0.5},
               "versions": {"python": "3.11.7", "implementation": "CPython",
                            "peers": {"kubernetes": "37.0.2", "urllib3": "2.8.0"}},
               "results": [mode("client", 20.0), mode("raw", 18.0), mode("httpclient", 22.0),
                           mode("decoder", 17.0), mode("official", 200.0),
                           mode("official_raw", 25.0), mode("ceiling", 16.0)]}
    text = watch_decode.section(report_)
    assert "0.80 end to end" in text and "0.94 of the bare" in text       # 16/20, 16/17
    assert "10.0x less CPU per event" in text and "1.25x against" in text   # 200/20, 25/20
    assert "18.0 vs 22.0 CPU µs/event" in text and "2026-11-30T00:00:00Z" in text


def _my(status=None, generation=1):
    return {"metadata": {"name": "my-0000", "generation": generation}, "status": status or {}}


def _deployment(**status):
    return {"metadata": {"name": "my-0000", "generation": 1}, "spec": {"replicas": 1},
            "status": status}


def _progressing(replicas=0, generation=1):
    return {"observedGeneration": generation, "replicas": replicas, "readyReplicas": 0,
            "conditions": [{"type": "Ready", "status": "False", "reason": "Progressing"}]}


def test_an_early_status_agrees_with_a_deployment_not_yet_observed_until_its_counts_come():
    early = _my(_progressing())
    assert agrees(early, _deployment())                     # nothing observed yet: 0, not ready
    assert not agrees(early, _deployment(observedGeneration=1, replicas=1, updatedReplicas=1))
    assert agrees(_my(_progressing(replicas=1)),
                  _deployment(observedGeneration=1, replicas=1, updatedReplicas=1))
    assert not agrees(_my(), _deployment())                 # no status at all
    assert not agrees(_my(_progressing(), generation=2), _deployment())   # an older generation
    assert not agrees(early, None)
    available = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1,
                 "conditions": [{"type": "Ready", "status": "True", "reason": "Available"}]}
    ready = _deployment(observedGeneration=1, replicas=1, updatedReplicas=1, readyReplicas=1)
    assert agrees(_my(available), ready)
    assert not agrees(_my(dict(_progressing(replicas=1), readyReplicas=1)), ready)


def test_per_object_times_converged_first_status_and_steady():
    each = PerObject(["my-0000"])
    each.sent("my-0000", 10.0)
    each.offer("my", _my(), 10.1)
    each.offer("deployment", _deployment(), 10.5)
    assert each.pending() == ["my-0000"]
    each.offer("my", _my(_progressing()), 11.0)             # early status: converged
    each.offer("service", {"metadata": {"name": "my-0000"}}, 12.0)   # beside it, not in it
    each.offer("deployment", _deployment(observedGeneration=1, replicas=1, updatedReplicas=1),
               14.0)                                       # counts come: no longer agrees
    assert not each.all_agree()
    each.offer("my", _my(_progressing(replicas=1)), 14.5)   # reported: steady
    assert each.wait_all_converged(0) and each.all_agree()
    figures = each.figures(t0=10.0)
    assert figures["converged_p50_seconds"] == pytest.approx(1.0)
    assert figures["first_status_max_seconds"] == pytest.approx(1.0)
    assert figures["steady_p99_seconds"] == pytest.approx(4.5)
    assert figures["deployment_p50_seconds"] == pytest.approx(0.5)
    assert figures["service_p50_seconds"] == pytest.approx(2.0)
    assert figures["all_converged_seconds"] == pytest.approx(1.0)
    assert figures["converged_50pct_done_seconds"] == pytest.approx(1.0)


def test_the_pace_through_a_burst_is_when_each_share_of_the_objects_got_there():
    names = [f"my-{i:04d}" for i in range(4)]
    each = PerObject(names)
    for i, name in enumerate(names):
        each.sent(name, 10.0 + i)
        each.offer("deployment", dict(_deployment(), metadata={"name": name}), 10.0 + 2 * i + 1)
    figures = each.figures(t0=10.0)
    assert [figures[f"deployment_{share}pct_done_seconds"] for share in (25, 50, 75)] == \
        pytest.approx([1.0, 3.0, 5.0])
    assert figures["all_deployment_seconds"] == pytest.approx(7.0)


def test_nearest_rank_quantile_is_a_measured_value():
    values = [float(v) for v in range(1, 1001)]
    assert _quantile(values, 0.99) == 990.0 and _quantile(values, 0.5) == 500.0
    assert _quantile([3.0], 0.99) == 3.0


def test_startup_list_table_takes_the_best_run_per_mode_and_their_ratio():
    from bench import startup_list
    runs = [{"mode": "streaming", "kind": "bare", "seconds": 2.0, "cpu_seconds": 0.3},
            {"mode": "streaming", "kind": "bare", "seconds": 1.0, "cpu_seconds": 0.4},
            {"mode": "paged", "kind": "bare", "seconds": 4.0, "cpu_seconds": 0.5}]
    md = startup_list.table(runs, 20000)
    assert "| bare client, time to receive all (s) | 1.0 | 4.0 | 0.25x |" in md
    assert "| bare client, CPU (s) | 0.3 | 0.5 | 0.60x |" in md
    assert "| informer, time to synced (s) | None | None | - |" in md


def test_our_operator_command_line_and_environment(tmp_path, monkeypatch):
    from bench.convergence import operators
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    op = operators.OurOperator(tmp_path / "kubeconfig", "ns", tmp_path,
                               workers=4, python="python3")
    argv = op.argv()
    assert argv[1].endswith("controller.py") and "--workers" in argv
    assert f"127.0.0.1:{op.metrics_port}" in argv and f"127.0.0.1:{op.probe_port}" in argv
    assert op.ready_pattern.search('{"msg":"caches synced; starting workers"}')
    # Bytecode is written and reused, as a deployed image has it precompiled.
    assert "PYTHONDONTWRITEBYTECODE" not in operators.python_env(A="1")


def test_write_memory_markdown_has_a_row_per_run_from_either_form_of_its_results():
    from bench import write_memory
    run = {"size": 5000, "created_kb_per_my": 3.35, "started_kb_per_my": 1.99,
           "ratio_created_to_started": 1.1505}
    row = "| 5,000 | 3.4 | 2.0 | 1.15 |"
    assert f"| size 5,000 {row}" in write_memory.markdown([run])          # what --out writes
    gathered = write_memory.markdown({"command": "python -m bench write_memory --sizes 5000",
                                      "note": "two commits", "runs": {"after @ 5000": run}})
    assert f"| after @ 5000 {row}" in gathered and "two commits" in gathered


def test_audit_log_gives_the_operators_first_write_of_each_kind_per_object(tmp_path):
    log = tmp_path / "audit.log"
    t = "2026-12-06T09:00:00.{}Z"

    def named(line, name):
        event = json.loads(line)
        event["objectRef"]["name"] = name
        return json.dumps(event) + "\n"
    with open(log, "w") as f:
        f.write(named(_audit("create", "my", agent=BENCH_USER_AGENT, received=t.format("1"),
                             done=t.format("2")), "a"))                  # the load generator's
        f.write(named(_audit("patch", "deployments", received=t.format("100000"),
                             done=t.format("150000")), "a"))
        f.write(named(_audit("patch", "deployments", received=t.format("300000"),
                             done=t.format("350000")), "a"))             # not the first
        f.write(named(_audit("patch", "my", sub="status", received=t.format("200000"),
                             done=t.format("250000")), "a"))
        f.write(named(_audit("patch", "deployments", received=t.format("100000"),
                             done=t.format("150000")), "other"))         # not asked for
        f.write(named(_audit("get", "my", received=t.format("1"), done=t.format("2")), "a"))
    base = datetime.fromisoformat("2026-12-06T09:00:00+00:00").timestamp()
    writes = AuditLog(log).first_writes(0, {"a"})
    assert set(writes) == {"a"}
    assert {k: (round(r - base, 3), round(d - base, 3)) for k, (r, d) in writes["a"].items()} == {
        "patch deployments": (0.1, 0.15), "patch my/status": (0.2, 0.25)}
