"""Our metrics against controller-runtime v0.24's and client-go's, family by family.

The reference table below was taken by reading their source (names, types,
label names, buckets, help texts), not by running them:

- controller-runtime v0.24, pkg/internal/controller/metrics/metrics.go:
  controller_runtime_reconcile_total, _reconcile_errors_total,
  _terminal_reconcile_errors_total, _reconcile_panics_total,
  _reconcile_timeouts_total, _reconcile_time_seconds (explicit buckets),
  _max_concurrent_reconciles, _active_workers.
- controller-runtime v0.24, pkg/metrics/workqueue.go: the seven workqueue_*
  families, labels (name, controller) plus `priority` on depth, histogram
  buckets prometheus.ExponentialBuckets(10e-9, 10, 12).
- controller-runtime v0.24, pkg/metrics/leaderelection.go:
  leader_election_master_status and leader_election_slowpath_total {name}.
- controller-runtime v0.24, pkg/metrics/client_go_adapter.go:
  rest_client_requests_total {code, method, host}.
- client-go / k8s.io/component-base v0.36 (Kubernetes v1.36),
  metrics/prometheus/restclient/metrics.go: rest_client_request_duration_seconds
  {verb, host} and its buckets (controller-runtime v0.24 does not export it).

The counting semantics are held by the behaviour tests: retries on every
delayed or rate-limited add (client-go util/workqueue/delaying_queue.go
AddAfter, controller-runtime pkg/controller/priorityqueue/priorityqueue.go
AddWithOpts): test_workqueue.py; panics and timeouts: test_runner.py; the
leader-election slow path (client-go tools/leaderelection/leaderelection.go
tryAcquireOrRenew): test_leader.py.
"""

from __future__ import annotations

import math
import pathlib
import re

import pytest
from prometheus_client import CollectorRegistry

from k8s_http.metrics import DECODE_ERROR_KINDS, Metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]

# controller-runtime's reconcile_time_seconds buckets, as listed in metrics.go.
RECONCILE_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
                     0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5,
                     6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60]
# component-base restclient's request latency buckets.
REST_BUCKETS = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0]


def go_exponential_buckets(start: float, factor: float, count: int) -> list[float]:
    """client_golang's ExponentialBuckets, step by step as its loop does."""
    out = []
    for _ in range(count):
        out.append(start)
        start *= factor
    return out


WORKQUEUE_BUCKETS = go_exponential_buckets(10e-9, 10, 12)

# name -> (type, label names, buckets or None, help)
REFERENCE = {
    "controller_runtime_reconcile_total": (
        "counter", {"controller", "result"}, None,
        "Total number of reconciliations per controller"),
    "controller_runtime_reconcile_errors_total": (
        "counter", {"controller"}, None, "Total number of reconciliation errors per controller"),
    "controller_runtime_terminal_reconcile_errors_total": (
        "counter", {"controller"}, None,
        "Total number of terminal reconciliation errors per controller"),
    "controller_runtime_reconcile_panics_total": (
        "counter", {"controller"}, None, "Total number of reconciliation panics per controller"),
    "controller_runtime_reconcile_timeouts_total": (
        "counter", {"controller"}, None,
        "Total number of reconciliation timeouts per controller"),
    "controller_runtime_reconcile_time_seconds": (
        "histogram", {"controller"}, RECONCILE_BUCKETS,
        "Length of time per reconciliation per controller"),
    "controller_runtime_max_concurrent_reconciles": (
        "gauge", {"controller"}, None, "Maximum number of concurrent reconciles per controller"),
    "controller_runtime_active_workers": (
        "gauge", {"controller"}, None, "Number of currently used workers per controller"),
    "workqueue_depth": (
        "gauge", {"name", "controller", "priority"}, None,
        "Current depth of workqueue by workqueue and priority"),
    "workqueue_adds_total": (
        "counter", {"name", "controller"}, None, "Total number of adds handled by workqueue"),
    "workqueue_retries_total": (
        "counter", {"name", "controller"}, None, "Total number of retries handled by workqueue"),
    "workqueue_queue_duration_seconds": (
        "histogram", {"name", "controller"}, WORKQUEUE_BUCKETS,
        "How long in seconds an item stays in workqueue before being requested"),
    "workqueue_work_duration_seconds": (
        "histogram", {"name", "controller"}, WORKQUEUE_BUCKETS,
        "How long in seconds processing an item from workqueue takes."),
    "workqueue_unfinished_work_seconds": (
        "gauge", {"name", "controller"}, None,
        "How many seconds of work has been done that is in progress and hasn't been observed "
        "by work_duration. Large values indicate stuck threads. One can deduce the number of "
        "stuck threads by observing the rate at which this increases."),
    "workqueue_longest_running_processor_seconds": (
        "gauge", {"name", "controller"}, None,
        "How many seconds has the longest running processor for workqueue been running."),
    "leader_election_master_status": (
        "gauge", {"name"}, None,
        "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
        "1 indicates master. 'name' is the string used to identify the lease. Please make sure "
        "to group by name."),
    "leader_election_slowpath_total": (
        "counter", {"name"}, None,
        "Total number of slow path exercised in renewing leader leases. 'name' is the string "
        "used to identify the lease. Please make sure to group by name."),
    "rest_client_requests_total": (
        "counter", {"code", "method", "host"}, None,
        "Number of HTTP requests, partitioned by status code, method, and host."),
    "rest_client_request_duration_seconds": (
        "histogram", {"verb", "host"}, REST_BUCKETS,
        "Request latency in seconds. Broken down by verb, and host."),
}


def exported() -> dict[str, object]:
    """Our families after a manager-like start, by exposition name (counters without _total)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_controller("my", 4)
    metrics.init_workqueue("my")
    metrics.init_leader("my-controller")
    metrics.rest_client_requests_total.labels("200", "GET", "h")
    metrics.rest_client_request_duration_seconds.labels("GET", "h")
    return {family.name: family for family in registry.collect()}


FAMILIES = exported()


def _family(name: str):
    # prometheus-client names a counter family without its _total suffix.
    return FAMILIES.get(name) or FAMILIES[name.removesuffix("_total")]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_family_matches_the_reference(name):
    kind, labels, buckets, help_text = REFERENCE[name]
    family = _family(name)
    assert family.type == kind
    assert family.documentation == help_text
    assert family.samples, f"{name}: no series pre-set"
    for sample in family.samples:
        assert set(sample.labels) - {"le"} == labels, sample
    if buckets is not None:
        bounds = sorted({float(s.labels["le"]) for s in family.samples
                         if s.name.endswith("_bucket")})
        assert bounds[:-1] == buckets and math.isinf(bounds[-1])


def test_workqueue_bucket_bounds_print_as_go_prints_them():
    # strconv.FormatFloat(b, 'g', -1, 64) and Python's repr are both shortest round-trip:
    # the 10e-9 * 10^k products print with the same digits, 9.999999999999999e-06 included.
    les = [s.labels["le"] for s in FAMILIES["workqueue_queue_duration_seconds"].samples
           if s.name.endswith("_bucket")]
    assert les[:6] == ["1e-08", "1e-07", "1e-06", "9.999999999999999e-06",
                       "9.999999999999999e-05", "0.001"]
    assert les[-3:] == ["100.0", "1000.0", "+Inf"]


def test_every_decode_error_kind_the_code_uses_is_pre_set():
    # Kinds come from the decoder (_fail("kind", ...)), the watcher's step (Skip("kind"))
    # and the watcher's own labels ("framing" default, "skipped").
    sources = (ROOT / "k8s_http" / "watchproto.py").read_text() + \
        (ROOT / "k8s_http" / "watcher.py").read_text()
    used = set(re.findall(r'_fail\("(\w+)"', sources)) | set(re.findall(r'Skip\("(\w+)"', sources))
    used |= set(re.findall(r'watch_decode_errors_total\.labels\([^)]*"(\w+)"\)', sources))
    used |= set(re.findall(r'or "(\w+)"\n\s+self\._metrics\.watch_decode_errors_total', sources))
    assert {"utf8", "json", "oversize", "unknown_type", "skipped", "framing"} <= used
    assert used <= set(DECODE_ERROR_KINDS), sorted(used - set(DECODE_ERROR_KINDS))
    registry = CollectorRegistry()
    Metrics(registry).init_resource("my.mine.jp")
    for kind in DECODE_ERROR_KINDS:
        assert registry.get_sample_value("k8s_http_watch_decode_errors_total",
                                         {"resource": "my.mine.jp", "kind": kind}) == 0
