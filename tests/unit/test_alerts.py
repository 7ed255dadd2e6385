"""The alerts with Prometheus' own tool: `promtool check rules`, `promtool test rules`.

promtool comes from $PROMTOOL (set by `make test`), the PATH, or the copy
`make test` extracts from Debian's prometheus package into ~/.cache. Without
it these tests fail and say how to get it (never a skip: CI must not lose
the check quietly).

tests/unit/fixtures/alerts_test.yaml feeds the rules series from this
operator and from two others (a controller-runtime operator using the same
controller and Lease names, and another k8s_http operator): only ours may
fire, and with the labels Alertmanager routes on.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from k8s_http.ops.metrics import Metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULE = ROOT / "manifests" / "components" / "monitoring" / "alerts" / "prometheusrule.yaml"
FIXTURE = ROOT / "tests" / "unit" / "fixtures" / "alerts_test.yaml"
CACHED = pathlib.Path.home() / ".cache" / "my-controller" / "promtool" / "promtool"
OURS = 'and on (job, namespace, instance) my_controller_build_info{manager="my-controller"}'


@pytest.fixture(scope="module")
def promtool() -> str:
    for candidate in (os.environ.get("PROMTOOL"), shutil.which("promtool"), str(CACHED)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("promtool not found: `make test` installs it (or run "
                "tests/support/fetch_promtool.sh ~/.cache/my-controller/promtool)", pytrace=False)


def run(promtool: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120,
                          input=stdin)


@pytest.fixture
def rules_dir(tmp_path) -> pathlib.Path:
    """The PrometheusRule's spec as a plain rules file, beside the promtool test."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(FIXTURE, tmp_path / FIXTURE.name)
    return tmp_path


def test_promtool_check_rules(promtool, rules_dir):
    proc = run(promtool, "check", "rules", str(rules_dir / "rules.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules_only_ours_fire(promtool, rules_dir):
    proc = run(promtool, "test", "rules", str(rules_dir / FIXTURE.name))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_both_ways():
    """Each alert appears in the fixture as silent (others broken) and, where ours can
    break that way in a unit test, as firing."""
    alerts = {r["alert"] for g in yaml.safe_load(RULE.read_text())["spec"]["groups"]
              for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(FIXTURE.read_text())["tests"]
    silent = {t["alertname"] for t in tests[0]["alert_rule_test"] if not t["exp_alerts"]}
    firing = {t["alertname"] for case in tests for t in case["alert_rule_test"]
              if t["exp_alerts"]}
    assert silent == alerts
    assert {"MyControllerDown", "MyControllerNoLeader", "MyControllerForbidden",
            "MyControllerReconcileErrors", "MyControllerNotReconciling"} <= firing


def test_every_alert_is_scoped_and_routable():
    for group in yaml.safe_load(RULE.read_text())["spec"]["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            expr = " ".join(rule["expr"].split())
            assert 'my_controller_build_info{manager="my-controller"}' in expr, name
            if name not in ("MyControllerDown", "my_controller:installs:known"):
                assert OURS in expr, name
            # every aggregation keeps the routing labels
            for by in re.findall(r"\bby \(([^)]*)\)", expr):
                assert {"job", "namespace"} <= {x.strip() for x in by.split(",")}, (name, by)


def test_the_down_alert_has_no_window_to_fall_out_of():
    """A lookback (`max_over_time(...[1h])`) ends the alert an hour into an outage."""
    rules = {r.get("alert") or r["record"]: r
             for g in yaml.safe_load(RULE.read_text())["spec"]["groups"] for r in g["rules"]}
    for name in ("MyControllerDown", "my_controller:installs:known"):
        assert "[" not in rules[name]["expr"], name
    assert "absent(" in rules["MyControllerDown"]["expr"]


def test_promtool_check_metrics_on_our_exposition(promtool):
    registry = CollectorRegistry()
    metrics = Metrics(registry, process_collectors=True)
    metrics.init_controller("my", 4)
    metrics.init_workqueue("my")
    metrics.init_resource("my.mine.jp")
    metrics.init_leader("my-controller")
    metrics.init_build_info("my-controller", "0.1.0")
    proc = run(promtool, "check", "metrics", stdin=generate_latest(registry).decode())
    assert proc.returncode == 0, proc.stdout + proc.stderr
