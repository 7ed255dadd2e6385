"""The control plane under the benchmark, and who wrote what to it.

Write counting. The apiserver's `apiserver_request_total` has no client
dimension, and kube-controller-manager writes the same resources the operators
do (PUT deployments for the revision annotation, deployments/status, Events
about Deployments and ReplicaSets). So on a control plane the bench starts
itself, the apiserver also keeps an audit log (Metadata level, one line per
request) and a request counts as the operator's when it was made with the admin
credentials (which the operators use) and not by the bench's own client, told
apart by its User-Agent. kube-controller-manager has its own identity and is not
logged at all. On a control plane the bench only attaches to, there is no audit
log: the counts then come from `apiserver_request_total` (write verbs on
deployments, services, my and events) and include kube-controller-manager's.
"""

from __future__ import annotations

import collections
import json
import os
import re
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml  # the project's own dependency

from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import load_config
from k8s_http.core.errors import ConflictError, NotFoundError
from k8s_http.core.objects import CRDS, NAMESPACES, Resource
from tests.support.controlplane import ControlPlane, ControlPlaneError

ROOT = Path(__file__).resolve().parents[2]

BENCH_USER_AGENT = "my-controller-bench/converge"
_CLK_TCK = os.sysconf("SC_CLK_TCK")
OPERATOR_USER = "admin"          # the operators run with the admin kubeconfig
MY = Resource("mine.jp", "v1", "my", True, "My")
AUDIT_LOG = "audit.log"            # in the audit_dir of bench_control_plane
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One line per request, when it completes.
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "Metadata", "users": [OPERATOR_USER]},
        {"level": "None"},
    ],
}


# kube-controller-manager's client defaults to 20 requests/s. A 1000-object burst gives
# its Deployment and ReplicaSet controllers ~5000 requests of work (ReplicaSets, Pods,
# their statuses): four minutes of backlog, during which the Deployments' status keeps
# changing and the operators, rightly, keep reporting it. Large clusters raise the
# limit; the bench does too, so each phase can start from a quiet cluster.
KCM_API_QPS, KCM_API_BURST = 200, 400


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def bench_control_plane(audit_dir: Path, *, apiserver_args: tuple[str, ...] = (),
                        controller_manager_args: tuple[str, ...] = (),
                        state_dir: Path | None = None, pods: bool = True) -> ControlPlane:
    """The project's control plane (state in `state_dir`, default a temp dir), with an
    apiserver audit log (audit_dir/audit.log) for counting requests and a faster
    controller-manager. Extra flags come after the defaults, so they override them
    (the last occurrence of a flag wins). `pods=False`: no scheduler, kwok or Nodes
    (the scale benchmark's fleets, where no Pod is wanted)."""
    policy = audit_dir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    return ControlPlane(
        state_dir,
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_dir / AUDIT_LOG}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",   # written before the response: counts are exact
            "--audit-log-maxsize=0",       # never rotated under us
            *apiserver_args,
        ],
        controller_manager_args=[f"--kube-api-qps={KCM_API_QPS}",
                                 f"--kube-api-burst={KCM_API_BURST}", *controller_manager_args],
        pods=pods)


@dataclass
class RequestCounts:
    """Requests the operator made in one window."""
    writes: int = 0
    reads: int = 0                                     # get, list, watch
    failed_writes: int = 0                             # answered >= 400 (e.g. 409 on create)
    by_kind: dict = field(default_factory=collections.Counter)   # "patch deployments" -> n
    reads_by_kind: dict = field(default_factory=collections.Counter)   # "watch pods" -> n
    source: str = "audit"
    # "patch services" -> the apiserver's seconds for each such write, from its audit
    # events (received -> response complete): where a write's time goes is the
    # apiserver's, not the client's. Empty when counted from metrics.
    server_seconds: dict = field(default_factory=lambda: collections.defaultdict(list))


def _audit_times(event: dict) -> tuple[datetime, datetime] | None:
    """(requestReceivedTimestamp, stageTimestamp) of an audit event; None without them."""
    try:
        received = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        done = datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00"))
    except (KeyError, TypeError, ValueError):
        return None
    return received, done


def _audit_seconds(event: dict) -> float | None:
    """requestReceivedTimestamp -> stageTimestamp of an audit event, in seconds."""
    times = _audit_times(event)
    return None if times is None else (times[1] - times[0]).total_seconds()


def _request_kind(event: dict) -> str:
    """"verb resource[/subresource]" of an audit event: "patch my/status"."""
    ref = event.get("objectRef") or {}
    what = ref.get("resource", event.get("requestURI", "?"))
    if ref.get("subresource"):
        what += "/" + ref["subresource"]
    return f"{event.get('verb', '')} {what}"


class AuditLog:
    """Counts the operator's requests in the apiserver's audit log between two marks."""

    source = "audit"

    def __init__(self, path: Path):
        self.path = path

    def mark(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def _operator_events(self, mark: int, until: int | None = None) -> Iterator[dict]:
        """The operator's audit events from `mark` (to `until`), the load generator's
        (the same user, another user agent) left out."""
        with open(self.path, "rb") as f:
            f.seek(mark)
            data = f.read() if until is None else f.read(max(0, until - mark))
        for line in data.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue          # a line cut at `until`, or being written
            if (event.get("user") or {}).get("username") != OPERATOR_USER:
                continue
            if (event.get("userAgent") or "").startswith(BENCH_USER_AGENT):
                continue
            yield event

    def since(self, mark: int, until: int | None = None) -> RequestCounts:
        counts = RequestCounts(source=self.source)
        for event in self._operator_events(mark, until):
            kind = _request_kind(event)
            if event.get("verb", "") in WRITE_VERBS:
                counts.writes += 1
                counts.by_kind[kind] += 1
                seconds = _audit_seconds(event)
                if seconds is not None:
                    counts.server_seconds[kind].append(seconds)
                if ((event.get("responseStatus") or {}).get("code") or 0) >= 400:
                    counts.failed_writes += 1
            else:
                counts.reads += 1
                counts.reads_by_kind[kind] += 1
        return counts

    def first_writes(self, mark: int, names: set[str]) -> dict[str, dict[str, tuple]]:
        """name -> {"patch deployments": (received, done), ...}: the operator's first
        write of each kind on an object named in `names`, since `mark`, as wall-clock
        seconds of the apiserver (received, and the response complete)."""
        out: dict[str, dict[str, tuple]] = {}
        for event in self._operator_events(mark):
            name = (event.get("objectRef") or {}).get("name")
            times = _audit_times(event)
            if name in names and event.get("verb", "") in WRITE_VERBS and times is not None:
                out.setdefault(name, {}).setdefault(
                    _request_kind(event), (times[0].timestamp(), times[1].timestamp()))
        return out


_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class ApiserverMetrics:
    """Fallback counter: write verbs on our four resources from apiserver_request_total.

    Every client's requests are in it -- kube-controller-manager's (Deployment
    status, Events) and the bench's own spec patches in the churn phase -- so
    this over-counts; used only on a control plane the bench did not start.
    """

    source = "apiserver_request_total (all clients)"
    RESOURCES = {"deployments", "services", "my", "events"}

    def __init__(self, server: str, ssl_context: ssl.SSLContext):
        self.server = server
        self.ssl_context = ssl_context

    def _scrape(self) -> collections.Counter:
        with urllib.request.urlopen(self.server + "/metrics", context=self.ssl_context,
                                    timeout=10) as resp:
            text = resp.read().decode()
        totals: collections.Counter = collections.Counter()
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if not m:
                continue
            labels = dict(_LABEL.findall(m.group("labels")))
            # APPLY is server-side apply's verb; creates of My objects are the bench's own.
            if labels.get("resource") in self.RESOURCES and \
                    labels.get("verb") in ("POST", "PUT", "PATCH", "APPLY", "DELETE") and \
                    not (labels["resource"] == "my" and labels["verb"] == "POST"):
                what = labels["resource"] + ("/" + labels["subresource"]
                                             if labels.get("subresource") else "")
                totals[f"{labels['verb'].lower()} {what}"] += int(float(m.group("value")))
        return totals

    def mark(self) -> collections.Counter:
        return self._scrape()

    def since(self, mark: collections.Counter, until=None) -> RequestCounts:
        delta = (until or self._scrape()) - mark
        return RequestCounts(writes=sum(delta.values()), by_kind=delta, source=self.source)


class BenchCluster:
    """A control plane (started here, or attached to) plus the bench's own client."""

    def __init__(self, work_dir: Path, *, attach_dir: Path | None = None,
                 apiserver_args: tuple[str, ...] = (),
                 controller_manager_args: tuple[str, ...] = (), pods: bool = True):
        self.work_dir = work_dir
        self.attach_dir = attach_dir
        self.extra_args = {"apiserver_args": apiserver_args,
                           "controller_manager_args": controller_manager_args, "pods": pods}
        self.plane: ControlPlane | None = None
        self.counter: AuditLog | ApiserverMetrics | None = None
        self.client: ApiClient | None = None
        self.started_here = False

    def start(self) -> "BenchCluster":
        if self.attach_dir is not None:
            self.plane = ControlPlane.attach(self.attach_dir)
            if self.plane is None:
                raise ControlPlaneError(f"no control plane serving in {self.attach_dir}: start "
                                        "one with `python -m tests.support.controlplane up`")
            # A plane the bench's own supervisor runs (bench/scaling/plane.py) keeps an
            # audit log beside its state: exact counts, as on a plane started here.
            audit = self.attach_dir / AUDIT_LOG
            self.counter = (AuditLog(audit) if audit.exists() else
                            ApiserverMetrics(self.plane.server, self.plane.admin_ssl_context()))
        else:
            self.plane = bench_control_plane(self.work_dir, **self.extra_args)  # removed by stop()
            self.plane.start()
            self.started_here = True
            self.counter = AuditLog(self.work_dir / AUDIT_LOG)
        config = load_config(str(self.kubeconfig))
        # Enough pooled connections for the load generator's threads.
        self.client = ApiClient.from_config(config, user_agent=BENCH_USER_AGENT, pool_size=32)
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.plane is not None and self.started_here:
            self.plane.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    def control_plane_cpu(self) -> float:
        """CPU seconds used so far by etcd, kube-apiserver and kube-controller-manager."""
        total = 0.0
        for pid in self.plane.pids().values():
            try:
                total += proc_cpu_seconds(pid)
            except (OSError, TypeError):
                pass
        return total

    def process_cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each process of the plane, by name (etcd,
        kube-apiserver, kube-controller-manager, kube-scheduler, kwok)."""
        out = {}
        for name, pid in self.plane.pids().items():
            try:
                out[name] = proc_cpu_seconds(pid)
            except (OSError, TypeError):
                pass
        return out

    def wait_quiet(self, *, below: float = 0.15, window_seconds: float = 3.0,
                   timeout_seconds: float = 180.0) -> float:
        """Wait until the control plane used less than `below` of a core over a whole
        window (its background work done); seconds waited. Gives up quietly after
        `timeout_seconds`: a plane that never idles is reported, not fatal."""
        t0 = time.monotonic()
        while True:
            cpu0, started = self.control_plane_cpu(), time.monotonic()
            time.sleep(window_seconds)
            used = (self.control_plane_cpu() - cpu0) / (time.monotonic() - started)
            waited = time.monotonic() - t0
            if used < below or waited >= timeout_seconds:
                return waited

    def binaries_source(self) -> str:
        if not self.started_here:
            return f"attached to the control plane in {self.attach_dir}"
        return self.plane.binaries.source

    # -- objects

    def install_crd(self, path: Path, timeout_seconds: float = 60.0) -> None:
        crd = yaml.safe_load(path.read_text())
        self.client.apply(CRDS, crd, field_manager="my-controller-bench", force=True)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            live = self.client.get(CRDS, crd["metadata"]["name"])
            conditions = (live.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in conditions):
                return
            time.sleep(0.1)
        raise TimeoutError(f"CRD {crd['metadata']['name']} not Established in {timeout_seconds} s")

    def create_namespace(self, name: str) -> None:
        try:
            self.client.create(NAMESPACES, {"metadata": {"name": name}})
        except ConflictError:
            pass

    def delete_namespace(self, name: str, *, timeout_seconds: float = 300.0,
                         wait: bool = True) -> float:
        """Delete and wait until it is gone (kube-controller-manager empties it). Seconds taken."""
        t0 = time.monotonic()
        try:
            self.client.delete(NAMESPACES, name)
        except NotFoundError:
            return 0.0
        if not wait:
            return 0.0
        while time.monotonic() - t0 < timeout_seconds:
            try:
                self.client.get(NAMESPACES, name)
            except NotFoundError:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise TimeoutError(f"namespace {name} still there after {timeout_seconds:.0f} s")
