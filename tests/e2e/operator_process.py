"""The operator as an operating-system process, for the e2e tests of issue 6 (operations).

    fleet = Fleet(tmp_path, plane)
    a = fleet.start("a", kubeconfig, "--leader-elect", "--leader-election-namespace", ns)
    a.wait_ready(); a.metric("leader_election_master_status"); a.log_records()
    a.signal(signal.SIGSTOP) ... fleet.close()     # kills whatever still runs

Each process runs `python controller.py` with JSON logs (stdout and stderr in
one file), its own metrics and probe ports on 127.0.0.1, and dies with the
test process even if pytest itself is SIGKILLed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import datetime as dt
import http.client
import json
import os
import pathlib
import re
import signal
import ssl
import subprocess
import sys
import time

import yaml

from k8s_http.core.errors import NotFoundError
from k8s_http.core.objects import DEPLOYMENTS, LEASES, Resource, get_condition
from tests.support.ports import free_port  # noqa: F401 (tests import it from here)
from tests.support.wait import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
MY = Resource("mine.jp", "v1", "my", True, "My")
SYSTEM_NS = "my-controller-system"
SA = "my-controller"
# Write methods as rest_client_requests_total labels them. PUT is only ever the
# Lease (the reconciler applies with PATCH and records events with POST).
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
MANAGED_BY = "app.kubernetes.io/managed-by"

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def http_get(port: int, path: str, *, token: str | None = None,
             tls: ssl.SSLContext | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body); (0, "") when nothing answers in time (a stopped or frozen process)."""
    if tls is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    except OSError:
        return 0, ""
    finally:
        conn.close()


def metric_series(text: str, name: str, /, **labels: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample of `name` in Prometheus text whose labels
    include `labels`. Positional-only `name`, so a label called `name` (the
    Lease's, the queue's) can be given."""
    series = []
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            series.append((found, float(line.rsplit(" ", 1)[1])))
    return series


def metric_sum(text: str, name: str, /, **labels: str) -> float:
    """Sum of the samples of `name` in Prometheus text whose labels include `labels`."""
    return sum(value for _, value in metric_series(text, name, **labels))


def kubectl(plane, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    assert plane.binaries.kubectl, "the control plane's binaries include no kubectl"
    proc = subprocess.run([plane.binaries.kubectl, "--kubeconfig", str(plane.admin_kubeconfig),
                           *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc


def install_manifests(plane) -> None:
    """`kubectl apply -k manifests/` (idempotent), then wait for the CRD to serve."""
    kubectl(plane, "apply", "-k", str(MANIFESTS))
    kubectl(plane, "wait", "--for", "condition=established", "crd/my.mine.jp", "--timeout=60s")


def make_my(name: str, namespace: str, **spec) -> dict:
    # 0 replicas: with no kubelet, that is the only way a Deployment becomes Available.
    return {"apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": "nginx:1.27", "replicas": 0, "port": 8080, **spec}}


def close_fleet_and_delete_lease(fleet, api, lease: str) -> None:
    """End a test's operators, then delete their Lease in SYSTEM_NS -- in that order,
    or a survivor would recreate it."""
    fleet.close()
    try:
        api.delete(LEASES, lease, namespace=SYSTEM_NS)
    except NotFoundError:
        pass


def is_available(api, name: str, namespace: str, generation: int | None = None) -> bool:
    """The My's Ready condition says Available (for `generation`, if given)."""
    try:
        my = api.get(MY, name, namespace=namespace)
    except NotFoundError:
        return False
    cond = get_condition(my, "Ready") or {}
    observed = (my.get("status") or {}).get("observedGeneration")
    return cond.get("reason") == "Available" and (
        generation is None or observed == generation)


def delete_mys_and_wait(api, namespace: str, timeout: float = 60.0) -> None:
    """Delete every My in `namespace` and wait until the garbage collector took their children.

    For a test's namespace before it is deleted: a namespace deletion removes
    Deployments and Mys in no particular order, and an operator watching all
    namespaces (tests/e2e/test_operator.py runs one for its whole module) would
    try to put the children back, and be refused (403), in a namespace that
    takes a while to go.
    """
    for my in api.list(MY, namespace=namespace)["items"]:
        try:
            api.delete(MY, my["metadata"]["name"], namespace=namespace)
        except NotFoundError:
            pass
    eventually(lambda: not api.list(DEPLOYMENTS, namespace=namespace,
                                    label_selector=f"{MANAGED_BY}=my-controller")["items"],
               timeout=timeout, interval=0.2, message=f"children in {namespace} not collected")


def lease_spec(api, namespace: str, name: str) -> dict:
    try:
        return api.get(LEASES, name, namespace=namespace).get("spec") or {}
    except NotFoundError:
        return {}


def micro_time_to_epoch(text: str) -> float:
    """A Lease's acquireTime / renewTime (RFC 3339, microseconds, UTC) as time.time() seconds."""
    when = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def stays_true(predicate, seconds: float, interval: float = 0.25, message: str = "") -> None:
    """Assert `predicate()` holds for `seconds`, failing at the first moment it does not.

    The counterpart of `eventually` for "nothing happens": a quiet period has
    to be waited out, but a violation is reported as soon as it is seen.
    """
    deadline = time.monotonic() + seconds
    while True:
        assert predicate(), message or getattr(predicate, "__name__", "condition")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGKILL it when the forking
    # thread (pytest's main thread) goes away, however that happens.
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class OperatorProcess:
    """One `controller.py` process and what it says: log records and metrics."""

    def __init__(self, name: str, proc: subprocess.Popen, log_path: pathlib.Path,
                 metrics_port: int, probe_port: int, *,
                 metrics_tls: ssl.SSLContext | None = None, metrics_token: str | None = None):
        self.name, self.proc, self.log_path = name, proc, log_path
        self.metrics_port, self.probe_port = metrics_port, probe_port
        # For --metrics-secure: how to reach /metrics (HTTPS) and whose token to show.
        self.metrics_tls, self.metrics_token = metrics_tls, metrics_token

    def __repr__(self) -> str:
        return f"<operator {self.name} pid {self.proc.pid}>"

    # -- output

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_records(self, since: int = 0) -> list[dict]:
        """The JSON log lines from byte offset `since` (see `log_mark`)."""
        records = []
        for line in self.log()[since:].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue    # a partial last line, or a non-JSON line (none expected)
            if isinstance(record, dict):
                records.append(record)
        return records

    def log_mark(self) -> int:
        return len(self.log())

    def messages(self, since: int = 0) -> list[str]:
        return [str(r.get("msg", "")) for r in self.log_records(since)]

    def reconcile_records(self, since: int = 0) -> list[dict]:
        """Log lines written inside a reconcile (they carry the reconcile context)."""
        return [r for r in self.log_records(since) if r.get("reconcileID")]

    @property
    def identity(self) -> str:
        """The leader-election identity, from the "campaigning ... as <id>" line."""
        for message in self.messages():
            match = re.search(r"campaigning for lease \S+ as (\S+)", message)
            if match:
                return match.group(1)
        raise AssertionError(f"{self}: no campaigning line in the log yet")

    # -- endpoints

    def scrape(self, token: str | None = None) -> tuple[int, str]:
        return http_get(self.metrics_port, "/metrics", token=token, tls=self.metrics_tls)

    def metrics_text(self) -> str:
        status, body = self.scrape(self.metrics_token)
        assert status == 200, f"{self}: /metrics answered {status}: {body[:200]}"
        return body

    def metric(self, name: str, /, **labels: str) -> float:
        return metric_sum(self.metrics_text(), name, **labels)

    def successful_writes(self) -> dict[str, float]:
        """Write requests that the apiserver accepted (2xx), by method."""
        text = self.metrics_text()
        return {m: sum(metric_sum(text, "rest_client_requests_total", method=m, code=str(code))
                       for code in (200, 201, 202, 204)) for m in WRITE_METHODS}

    def is_leader(self) -> bool:
        return self.metric("leader_election_master_status") == 1

    def readyz(self) -> int:
        return http_get(self.probe_port, "/readyz", timeout=2)[0]

    def wait_ready(self, timeout: float = 60.0) -> None:
        try:
            eventually(lambda: self.proc.poll() is None and self.readyz() == 200,
                       timeout=timeout, interval=0.2, message=f"{self} never ready")
        except AssertionError as err:
            # The exit status and the log as they are now, not as they were at the start.
            raise AssertionError(f"{err} (exit {self.proc.poll()}); log:\n"
                                 f"{self.log()[-4000:]}") from None

    # -- life

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self} still running {timeout} s later; log tail:\n"
                                 f"{self.log()[-3000:]}") from None

    def expect_clean_exit(self, timeout: float = 15.0) -> None:
        """Wait for the exit: code 0, and no traceback anywhere in the output."""
        code = self.wait_exit(timeout)
        output = self.log()
        assert code == 0, f"{self} exited {code}; log tail:\n{output[-3000:]}"
        where = output.find("Traceback")
        assert where < 0, f"{self} logged a traceback:\n{output[max(0, where - 1500):][:4500]}"


class Fleet:
    """Starts operator processes and makes sure none outlives the test."""

    def __init__(self, tmp_path: pathlib.Path):
        self.tmp_path = tmp_path
        self.processes: list[OperatorProcess] = []

    def start(self, name: str, kubeconfig: str | os.PathLike, *args: str,
              metrics_tls: ssl.SSLContext | None = None,
              metrics_token: str | None = None,
              env: dict[str, str] | None = None) -> OperatorProcess:
        """`env`: variables added to the test's environment (a Pod's, say)."""
        metrics_port, probe_port = free_port(), free_port()
        log_path = self.tmp_path / f"operator-{name}.log"
        # The kubeconfig is passed explicitly; a stray $KUBECONFIG must not matter.
        env = {**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, **(env or {})}
        argv = [sys.executable, str(ROOT / "controller.py"), "--kubeconfig", str(kubeconfig),
                "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
                "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
                "--log-format", "json", *args]
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=str(ROOT),
                                    preexec_fn=_die_with_parent)
        op = OperatorProcess(name, proc, log_path, metrics_port, probe_port,
                             metrics_tls=metrics_tls, metrics_token=metrics_token)
        self.processes.append(op)
        return op

    def running(self) -> list[OperatorProcess]:
        return [p for p in self.processes if p.proc.poll() is None]

    def close(self) -> None:
        """SIGKILL whatever still runs (a stopped process dies too) and reap it."""
        for op in self.processes:
            if op.proc.poll() is None:
                op.proc.kill()
        for op in self.processes:
            try:
                op.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def kubeconfig_token(path: str | os.PathLike) -> str:
    """The bearer token of a kubeconfig's (only) user."""
    with open(path) as f:
        (user,) = yaml.safe_load(f)["users"]
    return user["user"]["token"]
