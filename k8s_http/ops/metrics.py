"""Every metric the runtime exports, created against a registry passed in.

Names and labels are controller-runtime's and client-go's, so existing
dashboards and alerts work unchanged. Never the global prometheus REGISTRY:
a library must not register into a process-wide singleton behind its user's
back, and tests need a fresh registry each.
"""

from __future__ import annotations

import decimal
import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client import generate_latest as _generate_text
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Metrics", "TalliedCounter", "RangeObjects", "build_info_name", "RECONCILE_RESULTS",
           "go_float", "generate_text",
           "WATCH_RESTART_REASONS", "WATCH_EVENT_TYPES",
           "DECODE_ERROR_KINDS", "WORKQUEUE_BUCKETS", "exponential_buckets"]

RECONCILE_RESULTS = ("success", "error", "requeue", "requeue_after")
WATCH_EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")
# Why a watch was reopened: timeout (the server ended it at timeoutSeconds, the
# healthy case), disconnect (EOF/RST), stall (no complete event for 90 s),
# gone (410 -> relist), too_large_rv (504 -> relist from ""), error (any
# other HTTP or ERROR-event failure), protocol (malformed bytes).
WATCH_RESTART_REASONS = ("timeout", "disconnect", "stall", "gone", "too_large_rv", "error",
                         "protocol")
# k8s_http_watch_decode_errors_total{kind}: what was wrong with the watch input.
# From the decoder (watchproto.WatchDecodeError.kind, or "framing" for bad
# chunked framing): oversize, json, not_object, utf8, framing. From the
# watcher's step (an event it could not use): unknown_type, no_resource_version,
# no_name. "skipped": lines the decoder dropped on its own. Pre-set to 0, so a
# rate() or an alert works before the first one (tests/unit/test_metrics.py
# checks that every kind the code uses is listed here).
DECODE_ERROR_KINDS = ("framing", "oversize", "json", "not_object", "utf8", "unknown_type",
                      "no_resource_version", "no_name", "skipped")


def go_float(value: float) -> str:
    """`value` as client_golang's text format writes it: strconv.FormatFloat(v, 'g', -1, 64),
    and +Inf / -Inf / NaN. The shortest digits that read back as `value` (Python's
    repr has the same ones), in exponent form below 1e-4 and from 1e6 on: "1",
    "0.005", "1e-08", "1e+06", where prometheus-client writes "1.0" and "1000000.0".
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    number = decimal.Decimal(repr(float(value))).normalize()
    exponent = number.adjusted()
    if -4 <= exponent < 6:
        return format(number, "f")
    sign, digits, _ = number.as_tuple()
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


# A histogram bucket line of prometheus-client's text format, and one label in
# it (a value is quoted, with \\, \" and \n escaped).
_BUCKET_LABELS = re.compile(rb'^([^\s{]+_bucket\{)([^\n]*)(\} )', re.MULTILINE)
_LABEL = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _go_le(label: re.Match) -> bytes:
    if label.group(1) != b"le":
        return label.group(0)
    return b'le="' + go_float(float(label.group(2))).encode() + b'"'


def generate_text(registry) -> bytes:
    """The Prometheus text format (0.0.4) of `registry`, with bucket bounds written as
    Go writes them (`le="1"`, not prometheus-client's `le="1.0"`), so a query or a
    recording rule that names a literal `le` matches ours as it matches a Go
    operator's. OpenMetrics needs nothing: there Go writes "1.0" too."""
    return _BUCKET_LABELS.sub(
        lambda line: line.group(1) + _LABEL.sub(_go_le, line.group(2)) + line.group(3),
        _generate_text(registry))


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """prometheus.ExponentialBuckets (client_golang): start, start*factor, ... `count` of them.

    Multiplied step by step as Go does, so the bounds print exactly as
    controller-runtime's (1e-08, 1e-07, ...), not as powers rounded differently.
    """
    buckets, bound = [], start
    for _ in range(count):
        buckets.append(bound)
        bound *= factor
    return tuple(buckets)

# controller-runtime's reconcile_time_seconds buckets.
_RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45,
                      0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0,
                      4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60)
# controller-runtime's workqueue histograms (pkg/metrics/workqueue.go):
# ExponentialBuckets(10e-9, 10, 12) = 10 ns .. 1000 s.
WORKQUEUE_BUCKETS = exponential_buckets(10e-9, 10, 12)
# client-go rest_client_request_duration_seconds buckets.
_REST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# Sharding handovers: a claim round trip (~10 ms), a release (one ring round,
# 0.5 s, plus a drain), a drain up to the graceful timeout (25 s).
_HANDOVER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


class Metrics:
    """The metric families, as attributes. One instance per registry."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 process_collectors: bool = False):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if process_collectors:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)

        # controller-runtime
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller", ["controller", "result"],
            registry=r)
        self.reconcile_errors_total = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller", ["controller"], registry=r)
        self.terminal_reconcile_errors_total = Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller", ["controller"],
            registry=r)
        self.reconcile_panics_total = Counter(
            "controller_runtime_reconcile_panics_total",
            "Total number of reconciliation panics per controller", ["controller"], registry=r)
        self.reconcile_timeouts_total = Counter(
            "controller_runtime_reconcile_timeouts_total",
            "Total number of reconciliation timeouts per controller", ["controller"], registry=r)
        self.reconcile_time_seconds = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller", ["controller"],
            buckets=_RECONCILE_BUCKETS, registry=r)
        self.max_concurrent_reconciles = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller", ["controller"], registry=r)
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller", ["controller"], registry=r)

        # client-go workqueue
        # priority: controller-runtime labels depth by the priority of the
        # queued items. A v0.24 controller runs on its priority queue, which
        # writes strconv.Itoa(priority): "0" for the one priority this queue
        # reports ("" is only its provider for a queue without priorities).
        self.workqueue_depth = Gauge(
            "workqueue_depth", "Current depth of workqueue by workqueue and priority",
            ["name", "controller", "priority"], registry=r)
        self.workqueue_adds_total = Counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue",
            ["name", "controller"], registry=r)
        self.workqueue_retries_total = Counter(
            "workqueue_retries_total", "Total number of retries handled by workqueue",
            ["name", "controller"], registry=r)
        self.workqueue_queue_duration_seconds = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            ["name", "controller"], buckets=WORKQUEUE_BUCKETS, registry=r)
        self.workqueue_work_duration_seconds = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            ["name", "controller"], buckets=WORKQUEUE_BUCKETS, registry=r)
        self.workqueue_unfinished_work_seconds = Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been "
            "observed by work_duration. Large values indicate stuck threads. One can deduce "
            "the number of stuck threads by observing the rate at which this increases.",
            ["name", "controller"], registry=r)
        self.workqueue_longest_running_processor_seconds = Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            ["name", "controller"], registry=r)

        # client-go REST client
        self.rest_client_requests_total = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"], registry=r)
        self.rest_client_request_duration_seconds = Histogram(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.", ["verb", "host"],
            buckets=_REST_BUCKETS, registry=r)

        # leader election
        self.leader_election_master_status = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease. "
            "Please make sure to group by name.", ["name"], registry=r)
        self.leader_election_slowpath_total = Counter(
            "leader_election_slowpath_total",
            "Total number of slow path exercised in renewing leader leases. 'name' is the "
            "string used to identify the lease. Please make sure to group by name.",
            ["name"], registry=r)

        # watch health (ours)
        # Moves once per watch event: tallied by each watcher, summed at scrape time.
        self.watch_events_total = TalliedCounter(
            "k8s_http_watch_events_total", "Watch events received, by resource and type",
            ["resource", "type"], registry=r)
        self.watch_restarts_total = Counter(
            "k8s_http_watch_restarts_total", "Watches reopened, by resource and reason",
            ["resource", "reason"], registry=r)
        self.informer_relists_total = Counter(
            "k8s_http_informer_relists_total", "Full lists made by an informer (the first included)",
            ["resource"], registry=r)
        self.cache_objects = Gauge(
            "k8s_http_cache_objects", "Objects held in an informer's cache", ["resource"],
            registry=r)
        self.watch_stalls = Gauge(
            "k8s_http_watch_stalls",
            "Stall periods in a row (an open watch silent for 90 s) without an event, bookmark "
            "or list, for the most stalled watch of a resource; /healthz fails at 3",
            ["resource"], registry=r)
        self.watch_decode_errors_total = Counter(
            "k8s_http_watch_decode_errors_total",
            "Malformed watch input (framing, JSON, oversize lines, unknown events)",
            ["resource", "kind"], registry=r)

        # <app>_build_info{version, manager} 1: named after the application,
        # which only init_build_info knows (see there).
        self.build_info: Info | None = None

    # Pre-setting known label values to 0 makes rate() and absent() work from
    # the first scrape instead of after the first occurrence. Each init_* is
    # called once, by the one component that owns its families: Manager
    # (build info), Runner (controller), WorkQueue (workqueue), Informer
    # (resource: for all of its watchers), LeaderElector (leader).
    def init_build_info(self, app_name: str, version: str) -> None:
        """`<app>_build_info{version, manager=app_name} 1`, the family named after the
        application (my-controller exports my_controller_build_info): one
        Prometheus tells several operators built on k8s_http apart by it."""
        self.build_info = Info(build_info_name(app_name),
                               "Build information: version and manager name",
                               registry=self.registry)
        self.build_info.info({"version": version, "manager": app_name})

    def init_controller(self, controller: str, workers: int) -> None:
        for result in RECONCILE_RESULTS:
            self.reconcile_total.labels(controller, result)
        self.reconcile_errors_total.labels(controller)
        self.terminal_reconcile_errors_total.labels(controller)
        self.reconcile_panics_total.labels(controller)
        self.reconcile_timeouts_total.labels(controller)
        self.reconcile_time_seconds.labels(controller)
        self.max_concurrent_reconciles.labels(controller).set(workers)
        self.active_workers.labels(controller).set(0)

    def init_workqueue(self, name: str) -> None:
        """The queue's series; a controller's queue has the controller's name (both labels)."""
        self.workqueue_depth.labels(name, name, "0")
        for family in (self.workqueue_adds_total,
                       self.workqueue_retries_total, self.workqueue_queue_duration_seconds,
                       self.workqueue_work_duration_seconds,
                       self.workqueue_unfinished_work_seconds,
                       self.workqueue_longest_running_processor_seconds):
            family.labels(name, name)

    def init_resource(self, resource: str) -> None:
        self.watch_events_total.tally(resource, keys=WATCH_EVENT_TYPES)
        for reason in WATCH_RESTART_REASONS:
            self.watch_restarts_total.labels(resource, reason)
        for kind in DECODE_ERROR_KINDS:
            self.watch_decode_errors_total.labels(resource, kind)
        self.informer_relists_total.labels(resource)
        self.cache_objects.labels(resource).set(0)
        self.watch_stalls.labels(resource).set(0)

    def init_leader(self, lease_name: str) -> None:
        self.leader_election_master_status.labels(lease_name).set(0)
        self.leader_election_slowpath_total.labels(lease_name)

    def init_shards(self) -> None:
        """Sharding's families (--shards=auto, control/sharding.py), registered only
        when a replica shards, so that without it the exposition is unchanged."""
        if hasattr(self, "shard_slots_held"):
            return
        r = self.registry
        self.shard_slots_held = Gauge(
            "k8s_http_shard_slots_held", "Slots (of 256) this replica works on", registry=r)
        self.shard_members = Gauge(
            "k8s_http_shard_members", "Live members of the ring as this replica sees them",
            registry=r)
        self.shard_claim_conflicts_total = Counter(
            "k8s_http_shard_claim_conflicts_total",
            "Claims withdrawn because another member claimed first", registry=r)
        self.shard_server_filtered = Gauge(
            "k8s_http_shard_server_filtered",
            "1 if the apiserver applied shardSelector to a probe list of Leases "
            "(KEP-5866 gate on), else 0", registry=r)
        self.shard_handover_seconds = Histogram(
            "k8s_http_shard_handover_seconds",
            "From the ring round that first found slots assigned to this replica to the "
            "one that held them (their previous owner's release, then the claim), per "
            "claimed batch", buckets=_HANDOVER_BUCKETS, registry=r)

    def init_shard_ranges(self, objects_per_range: Callable[[], Iterable[
            tuple[str, str, int]]]) -> None:
        """k8s_http_shard_range_objects{resource, range}, read at each scrape from
        `objects_per_range()`: (resource, range, objects) rows, ShardCaches'."""
        if not hasattr(self, "shard_range_objects"):
            self.shard_range_objects = RangeObjects(objects_per_range, registry=self.registry)


class RangeObjects:
    """k8s_http_shard_range_objects{resource, range}: one series per contiguous hash
    range a sharded replica holds, per resource, the objects cached in it. Its
    series are the ranges held, so they come and go with the slots; computed at
    scrape time (a Gauge's children would have to be removed one by one)."""

    NAME = "k8s_http_shard_range_objects"
    HELP = ("Objects cached per contiguous hash range [start, end) of metadata.uid "
            "(children: of their owner's) this replica holds, by resource")

    def __init__(self, objects_per_range: Callable[[], Iterable[tuple[str, str, int]]],
                 *, registry: CollectorRegistry):
        self._objects_per_range = objects_per_range
        registry.register(self)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=("resource", "range"))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=("resource", "range"))
        for resource, range_text, objects in self._objects_per_range():
            family.add_metric((resource, range_text), objects)
        yield family


class TalliedCounter:
    """A counter family summed at scrape time from tallies, each written by one thread.

    For counts taken on a hot path: k8s_http_watch_events_total moves once per
    watch event, and a prometheus_client Counter's inc() takes a lock every time
    (~1 us; 2 % of the CPU of a start-up over a 30,000-object streaming list,
    bench/startup_replay.py). A tally is a plain dict of ints; only the thread
    that owns it adds to it, so `tally[key] += 1` needs no lock. A scrape copies
    each tally (dict(), one C call under the GIL: never a half-made copy) and
    sums them. Tallies are kept for the life of the family: a counter never
    goes down when its writer goes away.

    The last label is a tally's key; the labels before it are fixed per tally.
    """

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str], *,
                 registry: CollectorRegistry):
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._tallies: list[tuple[tuple[str, ...], dict[str, int]]] = []
        self._lock = threading.Lock()      # guards _tallies: made on any thread
        registry.register(self)

    def tally(self, *labels: str, keys: Iterable[str] = ()) -> dict[str, int]:
        """A new tally for the leading label values `labels`, `keys` preset to 0
        (exported from the first scrape, so rate() works before the first count)."""
        if len(labels) != len(self._labelnames) - 1:
            raise ValueError(f"{self._name}: {len(self._labelnames) - 1} leading label "
                             f"values expected, got {labels!r}")
        counts = dict.fromkeys(keys, 0)
        with self._lock:
            self._tallies.append((tuple(labels), counts))
        return counts

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            tallies = list(self._tallies)
        totals: dict[tuple[str, ...], int] = {}
        for labels, counts in tallies:
            for key, count in dict(counts).items():
                series = labels + (key,)
                totals[series] = totals.get(series, 0) + count
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for series, count in totals.items():
            family.add_metric(series, count)
        yield family


def build_info_name(app_name: str) -> str:
    """The build-info family for an application: "my-controller" -> "my_controller_build"
    (exposed as my_controller_build_info). Characters a metric name cannot hold become "_"."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", app_name)
    if not name or name[0].isdigit():
        name = "_" + name
    return f"{name}_build"
