"""The operators under test, as processes: start, "ready", CPU, memory, stop.

Each runs as a child of the bench, tied to it (PR_SET_PDEATHSIG), its output
read line by line by a thread that timestamps the lines the scenarios wait for
and copies everything to a log file.

"Ready" is what each operator offers: ours logs "caches synced" once every
informer has listed (the moment its /readyz turns 200, which is checked
after the line), the controller-runtime peer logs "Starting workers" at the
same point; kopf has no readiness endpoint, so its start-up is timed to its
first handler run (the first "Handler '...' succeeded." line).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .cluster import ROOT, proc_cpu_seconds

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1

# The Python processes the benches start write and reuse bytecode as usual
# (next to the code, in the git-ignored __pycache__ directories). The image
# ships precompiled bytecode; a shell with PYTHONDONTWRITEBYTECODE=1 (this
# machine's has it) would instead make every operator start compile its 36
# modules again, 0.3-0.9 s of a start-up figure that no deployment pays.


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a Python process a bench starts: bytecode written and reused."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def precompile(python: str) -> None:
    """Compile this repository's code once, before anything is timed."""
    subprocess.run([python, "-m", "compileall", "-q", "-x", r"/\.venv", str(ROOT / "k8s_http"),
                    str(ROOT / "my"), str(ROOT / "controller.py"), str(ROOT / "bench")],
                   env=python_env(), check=False, stdout=subprocess.DEVNULL)


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def peak_rss_bytes(pid: int) -> int:
    return _status_kib(pid, "VmHWM") * 1024


def rss_bytes(pid: int) -> int:
    return _status_kib(pid, "VmRSS") * 1024


def read_chars(pid: int) -> int:
    """`rchar` of /proc/PID/io: bytes the process got from read(2) and its kin, of
    every file descriptor (files, pipes, sockets read with read(2): OpenSSL's TLS),
    whether from the page cache or not; recv(2) on a socket is not counted."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise KeyError("rchar")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return None


class OperatorProcess:
    """One run of one operator. Subclasses say how to start it and what "ready" is."""

    key = "?"            # results key, e.g. "ours-w4"
    label = "?"          # for tables, e.g. "my-controller --workers 4"
    ready_pattern: re.Pattern | None = None     # a log line that means "ready"
    processed_pattern: re.Pattern | None = None  # a log line per object processed

    def __init__(self, kubeconfig: Path, namespace: str, log_dir: Path):
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_line_at: float | None = None
        self.processed_lines = 0
        self.last_processed_at: float | None = None
        self._reader: threading.Thread | None = None
        self._lines_lock = threading.Lock()
        self.log_path: Path | None = None
        self.env: dict[str, str] = {}      # added to the process's environment

    # -- to override

    def argv(self) -> list[str]:
        raise NotImplementedError

    def wait_started(self, timeout_seconds: float) -> float:
        """Block until the operator serves; returns seconds since start."""
        raise NotImplementedError

    def wait_ready_for_startup(self, timeout_seconds: float) -> float:
        """The start-up figure: seconds from process start to "ready"."""
        raise NotImplementedError

    def wait_ready_line(self, timeout_seconds: float) -> float:
        """Seconds from start to the first log line matching `ready_pattern`."""
        deadline = self.started_at + timeout_seconds
        while time.monotonic() < deadline:
            if self.ready_line_at is not None:
                return self.ready_line_at - self.started_at
            self.check_alive()
            time.sleep(0.01)
        raise TimeoutError(f"{self.label}: no log line matching {self.ready_pattern.pattern!r} "
                           f"within {timeout_seconds} s")

    def processed_count(self) -> int:
        """How many objects it has processed since start (start-up scenario)."""
        with self._lines_lock:
            return self.processed_lines

    # -- lifecycle

    def start(self, tag: str) -> None:
        self.log_path = self.log_dir / f"{self.key}-{tag}.log"
        env = python_env(KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1", **self.env)
        parent = os.getpid()

        def tie_to_parent() -> None:         # between fork and exec
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

        self.ready_line_at = None
        self.processed_lines = 0
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=tie_to_parent)
        self._reader = threading.Thread(target=self._read_output, daemon=True,
                                        name=f"{self.key}-output")
        self._reader.start()

    def _read_output(self) -> None:
        with open(self.log_path, "wb") as log:
            for line in self.proc.stdout:
                now = time.monotonic()
                log.write(line)
                text = line.decode(errors="replace")
                if self.ready_pattern and self.ready_line_at is None and \
                        self.ready_pattern.search(text):
                    self.ready_line_at = now
                if self.processed_pattern and self.processed_pattern.search(text):
                    with self._lines_lock:
                        self.processed_lines += 1
                        self.last_processed_at = now

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.label} exited with code {self.proc.returncode}; "
                               f"see {self.log_path}")

    def stop(self, grace_seconds: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after the grace period. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        return self.proc.returncode

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def peak_rss_bytes(self) -> int:
        return peak_rss_bytes(self.pid)

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def read_chars(self) -> int:
        return read_chars(self.pid)


class OurOperator(OperatorProcess):
    """python controller.py, watching the benchmark's namespace."""

    def __init__(self, *args, workers: int, python: str, profile_to: Path | None = None,
                 trace_to: Path | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.workers = workers
        self.python = python
        self.profile_to = profile_to
        self.trace_to = trace_to       # tracemalloc snapshots on SIGUSR2 (traced.py)
        self.key = f"ours-w{workers}"
        self.label = f"my-controller --workers {workers}"
        self.ready_pattern = re.compile(r'"caches synced')
        self.metrics_port = 0
        self.probe_port = 0

    def argv(self) -> list[str]:
        self.metrics_port, self.probe_port = free_port(), free_port()
        flags = ["--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace,
                 "--workers", str(self.workers),
                 "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                 "--health-probe-bind-address", f"127.0.0.1:{self.probe_port}",
                 "--log-level", "info", "--log-format", "json"]
        if self.trace_to is not None:
            return [self.python, str(ROOT / "bench" / "convergence" / "traced.py"),
                    str(self.trace_to), "--", *flags]
        if self.profile_to is not None:
            return [self.python, str(ROOT / "bench" / "convergence" / "profiled.py"),
                    str(self.profile_to), "--", *flags]
        return [self.python, str(ROOT / "controller.py"), *flags]

    def _readyz(self) -> int | None:
        return _http_status(f"http://127.0.0.1:{self.probe_port}/readyz", timeout=2.0)

    def wait_ready_for_startup(self, timeout_seconds: float) -> float:
        # The "caches synced" log line, logged as /readyz turns 200, read from
        # the pipe as the controller-runtime peer's "Starting workers" is:
        # polling /readyz every 10 ms would load the process being timed with
        # a hundred probe requests a second. /readyz is then checked to agree.
        seconds = self.wait_ready_line(timeout_seconds)
        deadline = time.monotonic() + 5.0
        while self._readyz() != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: logged 'caches synced' but /readyz is not 200")
            self.check_alive()
            time.sleep(0.01)
        return seconds

    wait_started = wait_ready_for_startup

    def processed_count(self) -> int:
        return reconciles_finished(self.metrics_port)


def reconciles_finished(metrics_port: int) -> int:
    """Reconciles finished since start (controller_runtime_reconcile_total, all results):
    ours and controller-runtime export it under the same name. 0 while /metrics does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                    timeout=2.0) as resp:
            text = resp.read().decode()
    except OSError:
        return 0
    return reconcile_total(text)


RECONCILE_TOTAL = "controller_runtime_reconcile_total"


def reconcile_total(text: str) -> int:
    """Reconciles finished, all controllers and results, from /metrics text.

    Only the counter's own samples count: `..._total{...} v` and `..._total v`;
    the `_created` series and HELP/TYPE comments do not. A value that is not a
    number raises ValueError (a broken exposition is not "0 reconciles").
    """
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(RECONCILE_TOTAL):
            continue
        rest = line[len(RECONCILE_TOTAL):]
        if not rest or rest[0] not in "{ ":
            continue                       # another metric sharing the prefix
        value = rest.rsplit("}", 1)[-1].split()
        if not value:
            raise ValueError(f"no value in {line!r}")
        total += float(value[0])
    return int(total)


class ControllerRuntimeOperator(OperatorProcess):
    """The controller-runtime peer (bench/peers/crpeer, Go), watching the bench's namespace.

    "Ready" is its log line "Starting workers": controller-runtime starts the
    workers once every informer of the controller has synced.
    """

    ready_pattern = re.compile(r'"Starting workers"')

    def __init__(self, *args, workers: int, binary: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.workers = workers
        self.binary = binary
        self.key = f"cr-w{workers}"
        self.label = f"controller-runtime peer, {workers} workers"
        self.metrics_port = 0

    def argv(self) -> list[str]:
        self.metrics_port = free_port()
        return [str(self.binary), "--kubeconfig", str(self.kubeconfig),
                "--namespace", self.namespace, "--workers", str(self.workers),
                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                "--health-probe-bind-address", "0"]

    def wait_ready_for_startup(self, timeout_seconds: float) -> float:
        return self.wait_ready_line(timeout_seconds)

    wait_started = wait_ready_for_startup

    def processed_count(self) -> int:
        return reconciles_finished(self.metrics_port)


class KopfOperator(OperatorProcess):
    """kopf run --standalone -n NS bench/peers/kopf_operator.py, in bench/.venv-kopf."""

    key = "kopf"
    label = "kopf"
    ready_pattern = re.compile(r"Handler '[^']+' succeeded\.")
    processed_pattern = re.compile(r"is processed: \d+ succeeded")

    def __init__(self, *args, venv: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.venv = venv
        self.liveness_port = 0

    def argv(self) -> list[str]:
        self.liveness_port = free_port()
        return [str(self.venv / "bin" / "kopf"), "run", "--standalone",
                "--namespace", self.namespace,
                "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
                str(ROOT / "bench" / "peers" / "kopf_operator.py")]

    def wait_started(self, timeout_seconds: float) -> float:
        # Liveness answers once the startup handlers ran and the watchers are being set
        # up; the watchers' first lists follow within a moment.
        deadline = self.started_at + timeout_seconds
        while time.monotonic() < deadline:
            if _http_status(f"http://127.0.0.1:{self.liveness_port}/healthz") == 200:
                return time.monotonic() - self.started_at
            self.check_alive()
            time.sleep(0.05)
        raise TimeoutError(f"kopf: liveness not 200 within {timeout_seconds} s")

    def wait_ready_for_startup(self, timeout_seconds: float) -> float:
        return self.wait_ready_line(timeout_seconds)
