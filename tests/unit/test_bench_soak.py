"""bench/soak.py's pure parts: the audit-log figures, the slope, the metric labels.

The soak itself needs the control plane and 20 minutes; these tests pin the
arithmetic its report rests on.
"""

from __future__ import annotations

import json

from bench.convergence.cluster import BENCH_USER_AGENT
from bench.soak import _labels, audit_figures, slope_per_hour


def _event(verb, resource, name, at, *, agent="my-controller/0.1", sub=None):
    ref = {"resource": resource, "name": name, **({"subresource": sub} if sub else {})}
    return json.dumps({"verb": verb, "user": {"username": "admin"}, "userAgent": agent,
                       "objectRef": ref, "requestReceivedTimestamp": at}) + "\n"


def test_audit_figures(tmp_path):
    log = tmp_path / "audit.log"
    bench = BENCH_USER_AGENT + " python"
    log.write_text("".join([
        # stable-000: created once, deleted out of band twice, repaired once each
        _event("patch", "deployments", "stable-000", "2026-12-01T10:00:00.000001Z"),
        _event("delete", "deployments", "stable-000", "2026-12-01T10:00:01.000000Z", agent=bench),
        _event("patch", "deployments", "stable-000", "2026-12-01T10:00:02.000000Z"),
        _event("delete", "deployments", "stable-000", "2026-12-01T10:00:03.000000Z", agent=bench),
        _event("patch", "deployments", "stable-000", "2026-12-01T10:00:04.000000Z"),
        _event("patch", "deployments", "stable-000", "2026-12-01T10:00:04.000000Z",
               sub="status"),                                   # not the operator's object write
        # my-1: children written before its deletion (fine), then twice after (the loop)
        _event("patch", "deployments", "my-1", "2026-12-01T10:00:05.000000Z"),
        _event("delete", "my", "my-1", "2026-12-01T10:00:06.000000Z", agent=bench),
        _event("patch", "deployments", "my-1", "2026-12-01T10:00:07.000000Z"),
        _event("patch", "services", "my-1", "2026-12-01T10:00:07.500000Z"),
        _event("get", "deployments", "my-1", "2026-12-01T10:00:08.000000Z"),
        # my-2: deleted, nothing written after
        _event("delete", "my", "my-2", "2026-12-01T10:00:09.000000Z", agent=bench),
        "not json\n",
    ]))
    figures = audit_figures(log, ["stable-000", "stable-001"], repairs=2)
    assert figures["stable_deployment_writes"] == {"patch": 3}
    assert figures["writes_per_repair"] == (3 - 2) / 2      # one creation per stable My
    assert figures["writes_after_owner_deleted"] == {"patch deployments": 1, "patch services": 1}
    assert figures["mys_with_writes_after_delete"] == 1 and figures["mys_deleted"] == 2


def test_slope_per_hour_ignores_the_warm_up():
    samples = [{"t": t, "rss": 100.0 if t < 60 else 50.0 + t / 3600} for t in range(0, 600, 10)]
    assert abs(slope_per_hour(samples, "rss", after=60) - 1.0) < 1e-9
    assert slope_per_hour(samples[:2], "rss", after=0) is None


def test_labels():
    assert _labels('k8s_http_watch_restarts_total{reason="stall",resource="my.mine.jp"}') == \
        {"reason": "stall", "resource": "my.mine.jp"}
