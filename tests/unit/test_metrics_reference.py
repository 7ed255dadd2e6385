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

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from k8s_http.ops.metrics import DECODE_ERROR_KINDS, Metrics, generate_text, go_float

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


def _exposed_les(text: str, family: str) -> list[str]:
    return re.findall(rf'^{family}_bucket{{[^\n]*\ble="([^"]*)"', text, re.MULTILINE)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_controller("my", 4)
    metrics.init_workqueue("my")
    metrics.rest_client_request_duration_seconds.labels("GET", "h")
    return registry


@pytest.mark.parametrize("value,go", [
    (1.0, "1"), (0.0, "0"), (10.0, "10"), (1000.0, "1000"), (100000.0, "100000"),
    (1e6, "1e+06"), (123456789.0, "1.23456789e+08"), (2.5, "2.5"), (0.005, "0.005"),
    (0.0001, "0.0001"), (1e-05, "1e-05"), (1e-08, "1e-08"), (1.5e-07, "1.5e-07"),
    (9.999999999999999e-06, "9.999999999999999e-06"), (-2.0, "-2"),
    (math.inf, "+Inf"), (-math.inf, "-Inf")])
def test_go_float_is_strconv_format_float_g(value, go):
    # strconv.FormatFloat(v, 'g', -1, 64): %e below 1e-4 and from 1e+06 on, shortest digits
    assert go_float(value) == go


def test_text_exposition_writes_bucket_bounds_as_go():
    """client_golang's text format: `le="1"`, `le="60"`, `le="+Inf"` (expfmt writeFloat);
    prometheus-client's own would say "1.0", so a rule naming le="1" would miss ours."""
    text = generate_text(_registry()).decode()
    reconcile = _exposed_les(text, "controller_runtime_reconcile_time_seconds")
    assert reconcile[:3] == ["0.005", "0.01", "0.025"]
    assert "1" in reconcile and "60" in reconcile and "1.0" not in reconcile
    assert reconcile[-1] == "+Inf"
    queue = _exposed_les(text, "workqueue_queue_duration_seconds")
    assert queue == ["1e-08", "1e-07", "1e-06", "9.999999999999999e-06",
                     "9.999999999999999e-05", "0.001", "0.01", "0.1", "1", "10", "100",
                     "1000", "+Inf"]
    rest = _exposed_les(text, "rest_client_request_duration_seconds")
    assert rest == ["0.005", "0.025", "0.1", "0.25", "0.5", "1", "2", "4", "8", "15", "30",
                    "60", "+Inf"]
    # nothing else changed: the same lines as prometheus-client's, le apart
    registry = _registry()

    def same(exposition: bytes) -> str:     # le apart, and the _created times of the moment
        lines = exposition.decode().splitlines()
        return re.sub(r'le="[^"]*"', "", "\n".join(l for l in lines if "_created" not in l))
    assert same(generate_text(registry)) == same(generate_latest(registry))


def test_openmetrics_exposition_writes_bucket_bounds_as_go():
    """client_golang's OpenMetrics writer (writeOpenMetricsFloat) appends ".0" to a
    bound with neither "." nor "e": "1.0", "60.0", "1e-08", "+Inf". prometheus-client's
    OpenMetrics output already reads so; the wrapper leaves it alone."""
    text = openmetrics_latest(_registry()).decode()
    for family in ("controller_runtime_reconcile_time_seconds",
                   "workqueue_queue_duration_seconds", "rest_client_request_duration_seconds"):
        les = _exposed_les(text, family)
        assert les and les[-1] == "+Inf"
        for le in les[:-1]:
            go = go_float(float(le))
            assert le == (go if "." in go or "e" in go else go + ".0"), (family, le)


def test_the_metrics_endpoint_serves_the_go_text_format():
    from k8s_http.ops import probes
    assert probes.generate_text is generate_text
    source = pathlib.Path(probes.__file__).read_text()
    assert "encoder = generate_text" in source


def test_workqueue_depth_priority_is_controller_runtimes_zero():
    # a v0.24 controller's priority queue: strconv.Itoa(priority), "0" for the default one
    depth = [s for s in FAMILIES["workqueue_depth"].samples]
    assert depth and all(s.labels["priority"] == "0" for s in depth)


def test_every_decode_error_kind_the_code_uses_is_pre_set():
    # Kinds come from the decoder (_fail("kind", ...)), the watcher's step (Skip("kind"))
    # and the watcher's own labels ("framing" default, "skipped").
    sources = (ROOT / "k8s_http" / "wire" / "watchproto.py").read_text() + \
        (ROOT / "k8s_http" / "cache" / "watcher.py").read_text() + \
        (ROOT / "k8s_http" / "cache" / "watchstep.py").read_text()
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
