"""A kubelet for the operator's own Pods on the local plane: one process per Pod.

    kubelet = ProcessKubelet(plane, fleet, namespace=SYSTEM_NS,
                             selector="app.kubernetes.io/name=my-controller")
    with kubelet:                       # starts polling; close() stops every process
        kubectl(plane, "scale", ...)    # Pods come and go: processes follow them
        kubelet.running()               # {pod name: OperatorProcess}
    kubelet.crashes                     # processes that exited without being told to

kwok plays the kubelet of the fake Nodes (controlplane.py): the operator's Pods
become Running and Ready there, but nothing runs. This plays the part kwok
leaves out, for the Pods of one label selector: for every Pod bound to a Node
and not being deleted, it runs one `controller.py` (operator_process.Fleet)
with the Pod's container args (less the bind addresses and log format, which
Fleet sets per process), the Pod's environment (`value`s, and the downward
API's `metadata.name` / `metadata.namespace`, so POD_NAME is the Pod's name as
in a real cluster) and a token of the Pod's ServiceAccount. When the Pod gets
a deletionTimestamp, or is gone (kwok deletes a Pod as soon as it is marked),
the process gets SIGTERM, and SIGKILL once the Pod's grace period is over. A
process is never restarted: one that exits on its own is a crash, recorded.

The Pods are listed every `interval_seconds` (a list, not a watch: nothing to
resume, nothing missed). The processes are forked by the polling thread, and
PR_SET_PDEATHSIG ties them to it: close() stops them before that thread ends.
"""

from __future__ import annotations

import signal
import threading
import time

from k8s_http.config.cluster import load_config
from k8s_http.core.objects import PODS
from k8s_http.wire.client import ApiClient

# Fleet gives each process its own addresses on 127.0.0.1 and JSON logs.
_FLEET_FLAGS = ("--metrics-bind-address", "--health-probe-bind-address", "--log-format")


class ProcessKubelet:
    def __init__(self, plane, fleet, *, namespace: str, selector: str,
                 interval_seconds: float = 0.2):
        self._plane = plane
        self._fleet = fleet
        self.namespace = namespace
        self.selector = selector
        self._interval = interval_seconds
        self._client = ApiClient.from_config(load_config(str(plane.admin_kubeconfig)))
        self._lock = threading.Lock()
        self._processes: dict = {}               # pod name -> OperatorProcess (ever started)
        self._kill_at: dict[str, float] = {}     # pod name -> SIGKILL deadline, once SIGTERMed
        self._grace: dict[str, float] = {}       # pod name -> its termination grace period
        self._kubeconfigs: dict[str, str] = {}   # service account -> kubeconfig path
        self.crashes: list[str] = []             # "<pod>: exit <code>"
        self.errors: list[str] = []              # failed polls (the loop goes on)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-kubelet", daemon=True)

    def __enter__(self) -> "ProcessKubelet":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def running(self) -> dict:
        """{pod name: OperatorProcess} of the processes alive and not told to stop."""
        with self._lock:
            return {name: op for name, op in self._processes.items()
                    if name not in self._kill_at and op.proc.poll() is None}

    def processes(self) -> dict:
        """Every process started so far, by pod name."""
        with self._lock:
            return dict(self._processes)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sync()
            except Exception as exc:      # an apiserver hiccup: the next poll tries again
                self.errors.append(repr(exc))
        self._stop_all()

    def sync(self) -> None:
        """One poll: start what a new Pod asks for, stop what a going Pod ran."""
        pods = {p["metadata"]["name"]: p for p in self._client.list(
            PODS, namespace=self.namespace, label_selector=self.selector)["items"]}
        for name, pod in pods.items():
            if (name not in self._processes and not pod["metadata"].get("deletionTimestamp")
                    and pod["spec"].get("nodeName")):
                self._start(pod)
        now = time.monotonic()
        with self._lock:
            for name, op in self._processes.items():
                code = op.proc.poll()
                if code is not None:
                    if name not in self._kill_at and not any(
                            c.startswith(f"{name}:") for c in self.crashes):
                        self.crashes.append(f"{name}: exit {code}")
                    continue
                pod = pods.get(name)
                if name not in self._kill_at:
                    if pod is None or pod["metadata"].get("deletionTimestamp"):
                        op.signal(signal.SIGTERM)
                        self._kill_at[name] = now + self._grace[name]
                elif now >= self._kill_at[name]:
                    op.proc.kill()

    def _start(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        (container,) = spec["containers"]
        args = [a for a in container.get("args") or () if not a.startswith(_FLEET_FLAGS)]
        env = {}
        for var in container.get("env") or ():
            if "value" in var:
                env[var["name"]] = var["value"]
                continue
            field = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if field not in ("metadata.name", "metadata.namespace"):
                raise AssertionError(f"the process kubelet cannot fill env {var}")
            env[var["name"]] = meta["name"] if field == "metadata.name" else meta["namespace"]
        op = self._fleet.start(meta["name"], self._kubeconfig(spec["serviceAccountName"]),
                               *args, env=env)
        with self._lock:
            self._processes[meta["name"]] = op
            self._grace[meta["name"]] = float(spec.get("terminationGracePeriodSeconds", 30))

    def _kubeconfig(self, service_account: str) -> str:
        path = self._kubeconfigs.get(service_account)
        if path is None:
            path = str(self._plane.mint_service_account_kubeconfig(
                self.namespace, service_account,
                self._fleet.tmp_path / f"{service_account}.kubeconfig"))
            self._kubeconfigs[service_account] = path
        return path

    def _stop_all(self) -> None:
        """SIGTERM every process still running, SIGKILL after its grace period."""
        deadline = {}
        with self._lock:
            for name, op in self._processes.items():
                if op.proc.poll() is None:
                    if name not in self._kill_at:
                        op.signal(signal.SIGTERM)
                    deadline[name] = self._kill_at.get(name, time.monotonic() + self._grace[name])
        for name, op in self.processes().items():
            if name in deadline:
                try:
                    op.proc.wait(timeout=max(0.0, deadline[name] - time.monotonic()))
                except Exception:
                    op.proc.kill()
                    op.proc.wait(timeout=10)

    def close(self) -> None:
        """Stop polling; stop every process as a kubelet would (SIGTERM, then SIGKILL)."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        elif not self._stop.is_set():
            self._stop.set()
            self._stop_all()
        self._client.transport.close()
