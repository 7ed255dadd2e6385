"""A local Kubernetes control plane for tests, benchmarks and demos (envtest-like).

Real etcd + kube-apiserver (+ kube-controller-manager for garbage collection,
Deployments, ReplicaSets, namespaces, tokens and Node lifecycle) on loopback
ports, with a throw-away PKI; and, by default, Pods that run: kube-scheduler
places them on fake Nodes that kwok (sigs.k8s.io/kwok) keeps alive, and kwok
plays their kubelet from the stages in tests/support/kwok/ (Running and Ready
at once; the failures a test asks for by name, see kwok/stages.yaml). The
Deployment, ReplicaSet, node-lifecycle, taint-eviction and Pod GC controllers
are the real ones. `pods=False` gives the Pod-less plane the scale benchmark
chose explicitly (no scheduler, no kwok, no Nodes).

As a library::

    plane = ControlPlane()          # state in a fresh temp dir, removed by stop()
    plane.start()                   # ~ seconds once the binaries exist
    plane.admin_kubeconfig          # path of a client-cert kubeconfig (system:masters)
    plane.mint_service_account_kubeconfig("ns", "sa", "/tmp/sa.kubeconfig")
    plane.restart_apiserver()       # same port, same etcd: for fault tests
    plane.node_names                # the fake Nodes (3 by default: ControlPlane(nodes=N))
    plane.stop()                    # idempotent; also runs at exit and on SIGTERM/SIGHUP

As a command (state in $MY_CONTROLLER_CLUSTER_DIR, default <repo>/.cluster)::

    python -m tests.support.controlplane up       # detached; prints the kubeconfig path
    python -m tests.support.controlplane env      # export KUBECONFIG=...
    python -m tests.support.controlplane status   # pids, RSS, start-up timings
    python -m tests.support.controlplane down
    python -m tests.support.controlplane run      # foreground until Ctrl-C

Binaries, in this order: $KUBEBUILDER_ASSETS (envtest's layout: etcd,
kube-apiserver, kubectl; kube-controller-manager, kube-scheduler and kwok are
not part of envtest's archives, so they may come from the next source), our cache
(~/.cache/my-controller/testbin/...), else tests/support/build_testbin.sh
builds them once per machine, its progress on stderr.

No process outlives its owner: every child runs in its own process group with
PR_SET_PDEATHSIG, so even a SIGKILLed test run takes etcd and the apiserver with
it; stop() also runs from atexit and from SIGTERM/SIGHUP handlers so that the
normal paths shut down gracefully.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import ctypes
import http.client
import json
import os
import queue
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = [
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "K8S_VERSION",
    "ETCD_VERSION",
    "default_state_dir",
    "find_binaries",
]

# Keep in step with tests/support/build_testbin.sh: we pass these to it, so a
# bump here rebuilds into a new cache directory.
K8S_VERSION = os.environ.get("K8S_VERSION", "v1.36.3")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "v3.6.16")

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tests" / "support" / "build_testbin.sh"
# kwok's configuration (its option defaults are not applied to a --config file,
# so every parallelism is set) and the stages that play the fake Nodes' kubelet.
KWOK_DIR = REPO_ROOT / "tests" / "support" / "kwok"
KWOK_CONFIGS = (KWOK_DIR / "kwok.yaml", KWOK_DIR / "stages.yaml")
# kwok manages the Nodes carrying this label, and only those.
FAKE_NODE_LABEL = ("type", "kwok")
DEFAULT_NODES = 3
# The Ready-timeouts below are for busy machines: a fake Node is Ready, and
# free of the apiserver's not-ready taint, within seconds when idle.
NODES_READY_TIMEOUT_SECONDS = 90.0

# The controllers an operator's end-to-end tests lean on: ownerReference
# cascades (garbage collector), Deployment -> ReplicaSet (Pods are never run:
# there is no kubelet), namespace deletion, and ServiceAccount token Secrets.
# v1.36 names them "<name>-controller"; the short names are kept as aliases.
KCM_CONTROLLERS = (
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "namespace-controller",
    "serviceaccount-token-controller",
    "serviceaccount-controller",
)
# With Pods: the apiserver taints every new Node not-ready:NoSchedule, which
# only the node-lifecycle controller removes (and it marks the Pods of a Node
# that stops reporting not ready); taint-eviction evicts them from a Node gone
# NotReady or unreachable; Pod GC deletes the Pods of a deleted Node.
POD_KCM_CONTROLLERS = (
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
)

# A /16: room for 65,534 Services, so a 1000-object burst (bench, demo, an
# attached `make cluster`) never runs out of ClusterIPs as a /24's 254 would.
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/16"
# The first address of the range is the `kubernetes` Service's ClusterIP; the
# serving cert carries it so in-cluster-style clients would verify too.
KUBERNETES_SERVICE_IP = "10.0.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# Big enough for any test here (thousands of objects); small enough that a
# runaway test trips etcd's NOSPACE alarm long before it fills the disk.
ETCD_QUOTA_BYTES = 2 * 1024 ** 3

# Cold starts on 2 busy cores: etcd ~1 s, the apiserver 5-20 s (it installs
# every built-in API and its post-start hooks before /readyz turns green).
ETCD_READY_TIMEOUT_SECONDS = 60.0
APISERVER_READY_TIMEOUT_SECONDS = 120.0
KCM_READY_TIMEOUT_SECONDS = 90.0
STOP_GRACE_SECONDS = 10.0

STATE_FILE = "state.json"
# Who each component's kubeconfig authenticates as (client certificates, see make_pki).
COMPONENT_USERS = ("system:kube-controller-manager", "system:kube-scheduler", "kwok-controller")
PROCESS_NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class ControlPlaneError(RuntimeError):
    """The control plane could not be found, built, started or reached."""


def _log(message: str) -> None:
    # Progress goes to stderr: stdout of the CLI is for the kubeconfig path only.
    print(f"[controlplane] {message}", file=sys.stderr, flush=True)


def default_state_dir() -> Path:
    return Path(os.environ.get("MY_CONTROLLER_CLUSTER_DIR") or REPO_ROOT / ".cluster")


# --------------------------------------------------------------------------- binaries

@dataclass(frozen=True)
class Binaries:
    etcd: str
    kube_apiserver: str
    kube_controller_manager: str | None
    kubectl: str | None
    source: str                    # where they came from, for logs and reports
    kube_scheduler: str | None = None
    kwok: str | None = None


def _cache_dir() -> Path:
    cache = os.environ.get("MY_CONTROLLER_CACHE") or os.path.expanduser("~/.cache/my-controller")
    return Path(cache) / "testbin" / f"k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}"


def _executable(directory: Path, name: str) -> str | None:
    path = directory / name
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _run_build_script() -> Path:
    """Build the binaries (minutes, once per machine); progress streams to stderr."""
    if shutil.which("go") is None:
        raise ControlPlaneError(
            "no control-plane binaries: set KUBEBUILDER_ASSETS to an envtest directory "
            f"(etcd, kube-apiserver), or install Go >= 1.26 so {BUILD_SCRIPT} can build them")
    _log(f"building etcd {ETCD_VERSION} and kubernetes {K8S_VERSION} with {BUILD_SCRIPT} "
         "(once per machine; cold builds take 20-40 minutes on 2 cores)")
    env = dict(os.environ, K8S_VERSION=K8S_VERSION, ETCD_VERSION=ETCD_VERSION)
    # stderr is inherited, so the script's progress lines reach the terminal.
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, text=True)
    if result.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {result.returncode} "
                                "(its output is above)")
    lines = result.stdout.strip().splitlines()
    return Path(lines[-1]) if lines else _cache_dir()


def find_binaries(*, build: bool = True, need_controller_manager: bool = True,
                  need_pods: bool = False) -> Binaries:
    """Locate etcd, kube-apiserver, kube-controller-manager, kubectl, and with
    `need_pods` kube-scheduler and kwok.

    Raises ControlPlaneError, naming what is missing and how to get it, when
    they cannot be found and `build` is false or the build fails.
    """
    cache = _cache_dir()
    cached = cache if (cache / ".complete").exists() else None
    if cached and need_pods and not (_executable(cache, "kube-scheduler")
                                     and _executable(cache, "kwok")):
        cached = None       # a cache from before they joined: the build adds just them

    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        adir = Path(assets)
        etcd, apiserver = _executable(adir, "etcd"), _executable(adir, "kube-apiserver")
        if not (etcd and apiserver):
            raise ControlPlaneError(
                f"KUBEBUILDER_ASSETS={assets} lacks etcd or kube-apiserver: point it at an "
                "envtest directory (setup-envtest use -p path) or unset it")
        kcm = _executable(adir, "kube-controller-manager")
        if kcm is None and cached:
            kcm = _executable(cached, "kube-controller-manager")
        if kcm is None and need_controller_manager and build:
            kcm = _executable(_run_build_script(), "kube-controller-manager")
        if kcm is None and need_controller_manager:
            raise ControlPlaneError(
                f"KUBEBUILDER_ASSETS={assets} has no kube-controller-manager (envtest ships "
                f"none) and {cache} is not built: run make testbin")
        kubectl = _executable(adir, "kubectl") or (cached and _executable(cached, "kubectl"))
        scheduler, kwok = (_executable(adir, name) or (cached and _executable(cached, name))
                           for name in ("kube-scheduler", "kwok"))
        if need_pods and not (scheduler and kwok):
            if not build:
                raise ControlPlaneError(
                    f"KUBEBUILDER_ASSETS={assets} has no kube-scheduler or kwok (envtest "
                    f"ships neither) and {cache} is not built: run make testbin")
            built = _run_build_script()
            scheduler, kwok = _executable(built, "kube-scheduler"), _executable(built, "kwok")
        return Binaries(etcd, apiserver, kcm, kubectl or None, f"KUBEBUILDER_ASSETS={assets}",
                        scheduler or None, kwok or None)

    if cached is None:
        if not build:
            raise ControlPlaneError(f"control-plane binaries not built in {cache}: run make "
                                    "testbin, or set KUBEBUILDER_ASSETS to envtest binaries")
        cached = _run_build_script()
    etcd, apiserver = _executable(cached, "etcd"), _executable(cached, "kube-apiserver")
    kcm = _executable(cached, "kube-controller-manager")
    scheduler, kwok = _executable(cached, "kube-scheduler"), _executable(cached, "kwok")
    if not (etcd and apiserver) or (need_controller_manager and not kcm) or \
            (need_pods and not (scheduler and kwok)):
        raise ControlPlaneError(f"{cached} is incomplete: delete it and run make testbin")
    return Binaries(etcd, apiserver, kcm, _executable(cached, "kubectl"), f"cache {cached}",
                    scheduler, kwok)


# --------------------------------------------------------------------------- PKI

def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def make_pki(directory: Path) -> dict[str, Path]:
    """A throw-away PKI: CAs, serving certs, client certs, service-account key pair.

    EC P-256 keys for TLS because they are generated instantly; the
    service-account signing key is RSA, which every token consumer accepts.
    """
    if shutil.which("openssl") is None:
        raise ControlPlaneError("openssl not found: it makes the control plane's throw-away PKI")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    d = directory

    def make_ca(name: str, common_name: str) -> None:
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "3650",
                 "-subj", f"/CN={common_name}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)

    def issue(name: str, subject: str, extensions: str, ca: str = "ca") -> None:
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
        (d / f"{name}.ext").write_text(extensions)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                 "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "3650",
                 "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)
        (d / f"{name}.csr").unlink()
        (d / f"{name}.ext").unlink()

    make_ca("ca", "my-controller-test-ca")
    # The front proxy's own CA: the apiserver publishes it (requestheader) so that
    # delegating servers like kube-controller-manager can load a complete
    # authentication config instead of logging an error for every missing bundle.
    make_ca("front-proxy-ca", "my-controller-test-front-proxy-ca")
    serving_sans = ",".join([
        "IP:127.0.0.1", "DNS:localhost", f"IP:{KUBERNETES_SERVICE_IP}", "DNS:kubernetes",
        "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local"])
    server_ext = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                  "extendedKeyUsage=serverAuth\nsubjectAltName={}\n")
    client_ext = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                  "extendedKeyUsage=clientAuth\n")
    issue("apiserver", "/CN=kube-apiserver", server_ext.format(serving_sans))
    issue("kcm-serving", "/CN=kube-controller-manager",
          server_ext.format("IP:127.0.0.1,DNS:localhost"))
    # system:masters bypasses RBAC: the admin of a throw-away cluster.
    issue("admin", "/O=system:masters/CN=admin", client_ext)
    # With --use-service-account-credentials=false every controller acts as this
    # one identity, which then needs every controller's permissions: masters.
    issue("kcm-client", "/O=system:masters/CN=system:kube-controller-manager", client_ext)
    issue("front-proxy-client", "/CN=front-proxy-client", client_ext, ca="front-proxy-ca")
    # The scheduler and kwok (the fake Nodes' kubelet) as masters too: a throw-away
    # cluster, where their exact RBAC would only be noise.
    issue("scheduler-client", "/O=system:masters/CN=system:kube-scheduler", client_ext)
    issue("kwok-client", "/O=system:masters/CN=kwok-controller", client_ext)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "sa.key", cwd=d)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    for key in d.glob("*.key"):
        os.chmod(key, 0o600)
    return {p.name: p for p in d.iterdir()}


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _write_private(path: Path, text: str) -> None:
    """Write a file holding credentials: 0600 from the first byte, then renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _kubeconfig(server: str, ca: Path, user: str, credentials: dict, namespace: str = "default"
                ) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "my-controller-test",
                      "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "my-controller-test", "user": user,
                                                "namespace": namespace}}],
        "current-context": user,
        "preferences": {},
    }, sort_keys=False)


# --------------------------------------------------------------------------- processes

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def _free_port() -> int:
    # Racy by nature (the port is free now, not necessarily in a second); start
    # retries with fresh ports when a process reports "address already in use".
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Spawner:
    """Starts every child from one long-lived daemon thread.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not
    the process. A child started from a short-lived thread (a test helper, a
    pytest-timeout thread) would be killed the moment that thread returned; a
    daemon thread lives exactly as long as the process.
    """

    def __init__(self):
        self._requests: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], *, log_path: Path, tie_to_parent: bool) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="controlplane-spawner",
                                                daemon=True)
                self._thread.start()
        done: queue.Queue = queue.Queue(maxsize=1)
        self._requests.put((argv, log_path, tie_to_parent, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def _loop(self) -> None:
        while True:
            argv, log_path, tie_to_parent, done = self._requests.get()
            try:
                done.put((True, self._popen(argv, log_path, tie_to_parent)))
            except BaseException as exc:  # handed to the caller, which re-raises it
                done.put((False, exc))

    @staticmethod
    def _popen(argv: list[str], log_path: Path, tie_to_parent: bool) -> subprocess.Popen:
        parent = os.getpid()

        def preexec() -> None:
            # Runs in the child between fork and exec: async-signal-safe work only.
            if tie_to_parent:
                _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() != parent:   # the parent died before prctl took effect
                    os._exit(1)

        with open(log_path, "ab") as log:
            # process_group=0: its own group, so a terminal's Ctrl-C reaches only us
            # (we stop the children in order) and killpg() takes any grandchild too.
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, close_fds=True, process_group=0,
                                    preexec_fn=preexec)


_SPAWNER = _Spawner()


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is not running anything.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pid_runs(pid: int | None, executable: str) -> bool:
    """True if pid is alive and runs `executable` (guards against a recycled pid)."""
    if not _pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return os.path.basename(argv0) == os.path.basename(executable)


def _terminate(pid: int, *, grace_seconds: float, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group, SIGKILL it after grace_seconds, reap if it is our child."""
    def signal_group(sig: int) -> None:
        try:
            os.killpg(pid, sig)     # each child leads its own group (process_group=0)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        if proc is None and not _pid_alive(pid):
            break
        time.sleep(0.05)
    if proc is not None:
        if proc.poll() is None:
            signal_group(signal.SIGKILL)
        proc.wait()
    elif _pid_alive(pid):
        signal_group(signal.SIGKILL)


def rss_bytes(pid: int | None) -> int | None:
    """Resident set size of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, TypeError):
        pass
    return None


def _tail(path: Path | str | None, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except (OSError, TypeError):
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- HTTP

def _https_get(port: int, path: str, context: ssl.SSLContext, *, timeout: float = 2.0
               ) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _probe(port: int, path: str, context: ssl.SSLContext) -> bool:
    try:
        status, _ = _https_get(port, path, context)
    except (OSError, http.client.HTTPException):
        return False
    return status == 200


def _etcd_healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        return resp.status == 200 and json.loads(resp.read()).get("health") == "true"
    except (OSError, http.client.HTTPException, ValueError):
        return False
    finally:
        conn.close()


# --------------------------------------------------------------------------- the plane

_LIVE_PLANES: "weakref.WeakSet[ControlPlane]" = weakref.WeakSet()
_PREVIOUS_HANDLERS: dict[int, object] = {}


def _stop_all_planes() -> None:
    for plane in list(_LIVE_PLANES):
        try:
            plane.stop()
        except Exception as exc:  # at exit: report, and keep stopping the others
            _log(f"stopping the control plane in {plane.state_dir} failed: {exc!r}")


def _on_fatal_signal(signum, frame) -> None:
    _stop_all_planes()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
    else:
        # Die of the same signal, as the default disposition would have.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_exit_hooks() -> None:
    """atexit for normal exits; SIGTERM/SIGHUP (which skip atexit) stop the planes first.

    Only on the main thread, and only over the default disposition, so an
    application's own handlers (pytest's, the supervisor's) stay in charge.
    SIGKILL needs no hook: PR_SET_PDEATHSIG covers it.
    """
    if getattr(_install_exit_hooks, "done", False):
        return
    _install_exit_hooks.done = True
    atexit.register(_stop_all_planes)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        current = signal.getsignal(signum)
        if current in (signal.SIG_DFL, None):
            _PREVIOUS_HANDLERS[signum] = current
            signal.signal(signum, _on_fatal_signal)


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on loopback ports.

    state_dir holds the PKI, etcd's data, one log per process, the admin
    kubeconfig and state.json (pids, ports, timings: what `attach` and the CLI
    read). Without a state_dir a temp dir is used and removed by a clean stop().
    apiserver_args / controller_manager_args are appended to the default flags.
    """

    def __init__(self, state_dir: str | os.PathLike | None = None, *,
                 binaries: Binaries | None = None, controller_manager: bool = True,
                 build: bool = True, tie_to_parent: bool = True,
                 apiserver_args: Sequence[str] = (), controller_manager_args: Sequence[str] = (),
                 pods: bool = True, nodes: int = DEFAULT_NODES):
        self._own_temp_dir = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="my-controller-cp-"))
        self._binaries = binaries
        self._with_kcm = controller_manager
        # Pods need the controller-manager's node-lifecycle controller (see
        # POD_KCM_CONTROLLERS), so without it there are none.
        self._with_pods = bool(pods and controller_manager)
        self.node_names = [f"kwok-node-{i}" for i in range(nodes)] if self._with_pods else []
        self._build = build
        # False only for an "attached" plane (see attach()), whose processes
        # belong to a supervisor in another process.
        self._tie_to_parent = tie_to_parent
        # Appended to the defaults, so a later flag wins (e.g. an audit log for a
        # benchmark, a feature gate for one test module).
        self._extra_args = {"kube-apiserver": list(apiserver_args),
                            "kube-controller-manager": list(controller_manager_args)}
        self._procs: dict[str, subprocess.Popen] = {}
        self._argv: dict[str, list[str]] = {}
        self._lock = threading.RLock()
        self._supervisor_pid: int | None = None       # set when attached
        self.timings: dict[str, float] = {}
        self.etcd_port = self.apiserver_port = self.kcm_port = 0
        self.started = False
        self.failed = False
        # A temp state dir is removed by stop() unless this is set (a test
        # session that failed keeps its logs for the post-mortem).
        self.keep_logs = False

    # --- paths and endpoints

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = find_binaries(build=self._build,
                                           need_controller_manager=self._with_kcm,
                                           need_pods=self._with_pods)
        return self._binaries

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def log_paths(self) -> dict[str, Path]:
        return {name: self.log_path(name) for name in PROCESS_NAMES
                if self.log_path(name).exists()}

    def pids(self) -> dict[str, int | None]:
        if self._supervisor_pid:
            return {n: p.get("pid") for n, p in self._read_state().get("processes", {}).items()}
        return {name: self._live_pid(name) for name in self._argv}

    def rss_bytes(self) -> dict[str, int | None]:
        return {name: rss_bytes(pid) for name, pid in self.pids().items()}

    def admin_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        ctx.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        return ctx

    # --- lifecycle

    def start(self) -> "ControlPlane":
        """Start everything and wait until it serves. Raises ControlPlaneError, with the
        failing process's log tail and every log path, when something does not come up."""
        if self._supervisor_pid:
            raise ControlPlaneError("an attached control plane is started by its supervisor")
        with self._lock:
            if self.started:
                return self
            try:
                binaries = self.binaries      # may build: not part of the start-up time
            except ControlPlaneError:
                if self._own_temp_dir:        # nothing ran yet: nothing to keep
                    shutil.rmtree(self.state_dir, ignore_errors=True)
                raise
            _install_exit_hooks()
            _LIVE_PLANES.add(self)
            t0 = time.monotonic()
            try:
                self._prepare_dirs()
                # etcd needs no keys (plain HTTP on loopback): make the PKI while
                # it boots; the RSA service-account key alone can take a second.
                with ThreadPoolExecutor(1, thread_name_prefix="controlplane-pki") as pool:
                    pki = pool.submit(self._make_pki_timed, t0)
                    self._start_etcd()
                    self.timings["etcd_ready_seconds"] = time.monotonic() - t0
                    pki.result()
                self._start_apiserver_fresh()
                self.timings["apiserver_ready_seconds"] = time.monotonic() - t0
                self._write_kubeconfigs()
                if self._with_kcm and binaries.kube_controller_manager:
                    self._start_kcm()
                    self.timings["controller_manager_ready_seconds"] = time.monotonic() - t0
                if self._with_pods:
                    self._start_pod_runtime()
                    self.timings["nodes_ready_seconds"] = time.monotonic() - t0
                self.timings["total_seconds"] = time.monotonic() - t0
            except BaseException:
                self.failed = True
                self.stop()
                raise
            self.started = True
            self._write_state("ready")
            return self

    def stop(self) -> None:
        """Stop every process (controller-manager, apiserver, etcd: reverse start order).

        Idempotent. A temp state dir is removed unless start() failed, so its
        logs stay for the post-mortem.
        """
        with self._lock:
            if self._supervisor_pid:
                return            # attached: the supervisor owns the processes
            for name in reversed(PROCESS_NAMES):
                proc = self._procs.pop(name, None)
                if proc is not None and proc.poll() is None:
                    _terminate(proc.pid, grace_seconds=STOP_GRACE_SECONDS, proc=proc)
            was_started, self.started = self.started, False
            _LIVE_PLANES.discard(self)
            if not self.state_dir.exists():
                return
            if self._own_temp_dir and not (self.failed or self.keep_logs):
                shutil.rmtree(self.state_dir, ignore_errors=True)
            else:
                # Keep logs and state.json for a look; drop data and keys.
                shutil.rmtree(self.state_dir / "etcd-data", ignore_errors=True)
                shutil.rmtree(self.pki_dir, ignore_errors=True)
                for kubeconfig in (self.admin_kubeconfig, *self._component_kubeconfigs()):
                    kubeconfig.unlink(missing_ok=True)
                if was_started or self.failed:
                    self._write_state("failed" if self.failed else "stopped")
                    _log(f"control-plane logs kept in {self.log_dir}")

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe_failure(self) -> str:
        """Where to look: every log path (for a failing test's report)."""
        return "control-plane logs:\n" + "\n".join(
            f"  {name}: {path}" for name, path in self.log_paths().items())

    # --- fault injection (same port, same etcd)

    def kill_apiserver(self, sig: int = signal.SIGKILL) -> None:
        """Kill kube-apiserver (SIGKILL by default: a crash, connections reset)."""
        if self._supervisor_pid:
            self._ask_supervisor(signal.SIGUSR1,
                                 lambda s: s["processes"]["kube-apiserver"].get("pid") is None)
            return
        self._kill_local("kube-apiserver", sig, "apiserver-down")

    def _kill_local(self, name: str, sig: int, state: str) -> None:
        with self._lock:
            proc = self._procs.pop(name, None)
            if proc is None:
                return
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            if sig == signal.SIGKILL:
                proc.wait()
            else:
                _terminate(proc.pid, grace_seconds=STOP_GRACE_SECONDS, proc=proc)
            self._write_state(state)

    def start_apiserver(self) -> float:
        """Start kube-apiserver again with the same flags; returns seconds to /readyz."""
        if self._supervisor_pid:
            t0 = time.monotonic()
            self._ask_supervisor(signal.SIGUSR2, lambda s: _pid_alive(
                s["processes"]["kube-apiserver"].get("pid")),
                timeout_seconds=APISERVER_READY_TIMEOUT_SECONDS + 10)
            self._wait("kube-apiserver", lambda: _probe(self.apiserver_port, "/readyz",
                                                          self.admin_ssl_context()),
                       APISERVER_READY_TIMEOUT_SECONDS)
            return time.monotonic() - t0
        with self._lock:
            if "kube-apiserver" in self._procs:
                raise ControlPlaneError("kube-apiserver is already running")
            t0 = time.monotonic()
            proc = self._spawn("kube-apiserver", self._argv["kube-apiserver"])
            try:
                self._wait_apiserver_ready()
            except ControlPlaneError:
                # Leave it down, not half-up: the caller may try again.
                self._procs.pop("kube-apiserver", None)
                if proc.poll() is None:
                    _terminate(proc.pid, grace_seconds=2, proc=proc)
                raise
            self._write_state("ready")
            return time.monotonic() - t0

    def kill_process(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one process of the plane by name (e.g. "etcd"); its data stays on disk."""
        if name == "kube-apiserver" or self._supervisor_pid:
            if name != "kube-apiserver":
                raise ControlPlaneError("an attached plane can only kill kube-apiserver")
            return self.kill_apiserver(sig)
        self._kill_local(name, sig, f"{name}-down")

    def start_process(self, name: str) -> float:
        """Start a process killed by kill_process again, same flags and data (etcd keeps
        its data dir: --initial-cluster-state is ignored once it holds a member);
        returns seconds until it serves."""
        if name == "kube-apiserver" or self._supervisor_pid:
            if name != "kube-apiserver":
                raise ControlPlaneError("an attached plane can only start kube-apiserver")
            return self.start_apiserver()
        ready, timeout = {
            "etcd": (lambda: _etcd_healthy(self.etcd_port), ETCD_READY_TIMEOUT_SECONDS),
            "kube-controller-manager": (self._kcm_healthy, KCM_READY_TIMEOUT_SECONDS),
        }.get(name, (lambda: True, 0.0))
        with self._lock:
            if name in self._procs:
                raise ControlPlaneError(f"{name} is already running")
            t0 = time.monotonic()
            self._spawn(name, self._argv[name])
            self._wait(name, ready, timeout)
            self._write_state("ready")
            return time.monotonic() - t0

    def restart_process(self, name: str) -> float:
        """kill_process then start_process; returns seconds until it serves again."""
        self.kill_process(name)
        return self.start_process(name)

    def restart_apiserver(self, sig: int = signal.SIGKILL) -> float:
        self.kill_apiserver(sig)
        return self.start_apiserver()

    def set_apiserver_flag(self, flag: str, value: str) -> None:
        """`--flag=value` in place of every `--flag=...` kube-apiserver has, from its
        next start (after kill_apiserver: same port, same etcd data), e.g. a feature
        gate turned off. A plane started here only: an attached plane's flags are its
        supervisor's."""
        if self._supervisor_pid:
            raise ControlPlaneError("an attached plane's kube-apiserver flags are its supervisor's")
        prefix = f"{flag}="

        def replaced(argv: list[str]) -> list[str]:
            return [a for a in argv if not a.startswith(prefix)] + [prefix + value]

        with self._lock:
            self._extra_args["kube-apiserver"] = replaced(self._extra_args["kube-apiserver"])
            if "kube-apiserver" in self._argv:          # what start_apiserver() runs again
                self._argv["kube-apiserver"] = replaced(self._argv["kube-apiserver"])

    # --- tokens

    def mint_service_account_kubeconfig(self, namespace: str, name: str,
                                        path: str | os.PathLike, *,
                                        expiration_seconds: int = 3600) -> Path:
        """Write a kubeconfig that authenticates as ServiceAccount namespace/name.

        The token comes from the TokenRequest API (a bound, expiring token, as a
        Pod would get), asked for with the admin certificate.
        """
        answer = self.api_request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": int(expiration_seconds)}}, ok=(201,))
        token = answer["status"]["token"]
        path = Path(path)
        _write_private(path, _kubeconfig(self.server, self.pki_dir / "ca.crt",
                                         f"system:serviceaccount:{namespace}:{name}",
                                         {"token": token}, namespace=namespace))
        return path

    # --- internals: start-up

    def _make_pki_timed(self, t0: float) -> None:
        make_pki(self.pki_dir)
        self.timings["pki_seconds"] = time.monotonic() - t0

    def _prepare_dirs(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # A reused directory (the CLI's .cluster) starts from nothing: fresh
        # keys, empty etcd. Logs are kept, appended to.
        for stale in ("etcd-data", "pki"):
            shutil.rmtree(self.state_dir / stale, ignore_errors=True)
        self.log_dir.mkdir(exist_ok=True)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.log_path(name), "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        proc = _SPAWNER.popen(argv, log_path=self.log_path(name), tie_to_parent=self._tie_to_parent)
        self._procs[name] = proc
        self._argv[name] = argv
        return proc

    def _wait(self, name: str, ready, timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        proc = self._procs.get(name)
        while not ready():
            if proc is not None and proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {proc.returncode} while starting; last lines of "
                    f"{self.log_path(name)}:\n{_tail(self.log_path(name))}\n"
                    + self.describe_failure())
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} not ready after {timeout_seconds:.0f} s; last lines of "
                    f"{self.log_path(name)}:\n{_tail(self.log_path(name))}\n"
                    + self.describe_failure())
            time.sleep(0.1)

    def _with_port_retries(self, name: str, attempt_start) -> None:
        # _free_port() is racy: if another process grabbed the port in between,
        # start again on fresh ports instead of failing the whole run.
        for attempt in range(3):
            try:
                attempt_start()
                return
            except ControlPlaneError:
                if attempt == 2 or "address already in use" not in _tail(self.log_path(name),
                                                                         200).lower():
                    raise
                _log(f"{name}: port taken, retrying on another one")
                proc = self._procs.pop(name, None)
                if proc is not None and proc.poll() is None:
                    _terminate(proc.pid, grace_seconds=2, proc=proc)

    def _start_etcd(self) -> None:
        def attempt() -> None:
            self.etcd_port, peer = _free_port(), _free_port()
            client_url = f"http://127.0.0.1:{self.etcd_port}"
            peer_url = f"http://127.0.0.1:{peer}"
            data = self.state_dir / "etcd-data"
            shutil.rmtree(data, ignore_errors=True)
            self._spawn("etcd", [
                self.binaries.etcd,
                "--name=default",
                f"--data-dir={data}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--initial-cluster-state=new",
                # Throw-away data: skipping fsync makes every write ~10x cheaper.
                "--unsafe-no-fsync",
                f"--quota-backend-bytes={ETCD_QUOTA_BYTES}",
                "--log-level=warn",
            ])
            self._wait("etcd", lambda: _etcd_healthy(self.etcd_port), ETCD_READY_TIMEOUT_SECONDS)
        self._with_port_retries("etcd", attempt)

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki_dir
        return [
            self.binaries.kube_apiserver,
            f"--secure-port={self.apiserver_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # RBAC, so a least-privilege ServiceAccount is really denied; Node for
            # parity with real clusters (it only ever concerns kubelets).
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            # No kubelet, so no Pod could ever get its token mounted: the plugin
            # would only reject Pods (envtest disables it for the same reason).
            "--disable-admission-plugins=ServiceAccount",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # One apiserver whose address nobody else can reach: do not maintain
            # the `kubernetes` Endpoints with it.
            "--endpoint-reconciler-type=none",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            "--profiling=false",
            "--v=1",
            *self._extra_args["kube-apiserver"],
        ]

    def _start_apiserver_fresh(self) -> None:
        def attempt() -> None:
            self.apiserver_port = _free_port()
            self._spawn("kube-apiserver", self._apiserver_argv())
            self._wait_apiserver_ready()
        self._with_port_retries("kube-apiserver", attempt)

    def _wait_apiserver_ready(self) -> None:
        ctx = self.admin_ssl_context()
        self._wait("kube-apiserver", lambda: _probe(self.apiserver_port, "/readyz", ctx),
                   APISERVER_READY_TIMEOUT_SECONDS)

    def _write_kubeconfigs(self) -> None:
        pki = self.pki_dir
        _write_private(self.admin_kubeconfig, _kubeconfig(
            self.server, pki / "ca.crt", "admin",
            {"client-certificate-data": _b64(pki / "admin.crt"),
             "client-key-data": _b64(pki / "admin.key")}))
        for path, user, cert in zip(self._component_kubeconfigs(), COMPONENT_USERS,
                                    ("kcm-client", "scheduler-client", "kwok-client")):
            _write_private(path, _kubeconfig(
                self.server, pki / "ca.crt", user,
                {"client-certificate-data": _b64(pki / f"{cert}.crt"),
                 "client-key-data": _b64(pki / f"{cert}.key")}))

    def _component_kubeconfigs(self) -> tuple[Path, Path, Path]:
        return tuple(self.state_dir / f"{name}.kubeconfig" for name in ("kcm", "scheduler", "kwok"))

    def _start_kcm(self) -> None:
        pki = self.pki_dir
        kubeconfig = self.state_dir / "kcm.kubeconfig"

        def attempt() -> None:
            self.kcm_port = _free_port()
            self._spawn("kube-controller-manager", [
                self.binaries.kube_controller_manager,
                f"--kubeconfig={kubeconfig}",
                # Its own /healthz is served behind delegated authn/authz.
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.kcm_port}",
                f"--tls-cert-file={pki / 'kcm-serving.crt'}",
                f"--tls-private-key-file={pki / 'kcm-serving.key'}",
                f"--controllers={','.join(self._kcm_controllers())}",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
                *self._extra_args["kube-controller-manager"],
            ])
            self._wait("kube-controller-manager", self._kcm_healthy, KCM_READY_TIMEOUT_SECONDS)
        self._with_port_retries("kube-controller-manager", attempt)

    def _kcm_healthy(self) -> bool:
        """kube-controller-manager's /healthz answers 200 (its serving cert is the CA's)."""
        context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        return _probe(self.kcm_port, "/healthz", context)

    def _kcm_controllers(self) -> tuple[str, ...]:
        return KCM_CONTROLLERS + (POD_KCM_CONTROLLERS if self._with_pods else ())

    def _start_pod_runtime(self) -> None:
        """kube-scheduler, kwok, and the fake Nodes, Ready and schedulable.

        The scheduler serves nothing (--secure-port=0): whether it works shows in
        the Pods. A Node is usable once the node-lifecycle controller has lifted
        the apiserver's not-ready taint, which it does when kwok reports it Ready.
        """
        self._spawn("kube-scheduler", [
            self.binaries.kube_scheduler,
            f"--kubeconfig={self.state_dir / 'scheduler.kubeconfig'}",
            "--leader-elect=false",
            "--secure-port=0",
            "--profiling=false",
            "--v=1",
        ])
        self._spawn("kwok", [
            self.binaries.kwok,
            f"--kubeconfig={self.state_dir / 'kwok.kubeconfig'}",
            *(f"--config={path}" for path in KWOK_CONFIGS),
            f"--manage-nodes-with-label-selector={'='.join(FAKE_NODE_LABEL)}",
        ])
        for name in self.node_names:
            self.add_node(name)
        self._wait("kwok", lambda: self._nodes_schedulable(self.node_names),
                   NODES_READY_TIMEOUT_SECONDS)
        for name in ("kube-scheduler", "kwok"):
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited while starting; last lines of "
                                        f"{self.log_path(name)}:\n{_tail(self.log_path(name))}")

    def add_node(self, name: str) -> None:
        """Create a fake Node that kwok keeps alive (no taint: any Pod may land on it).

        Its capacity is what kwok reports for a Node that states none (1000 CPUs,
        1 TiB, a million Pods), so only a Pod asking for more is Unschedulable.
        """
        key, value = FAKE_NODE_LABEL
        self.api_request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "labels": {key: value, "kubernetes.io/hostname": name,
                                    "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
                         "annotations": {"kwok.x-k8s.io/node": "fake",
                                         "node.alpha.kubernetes.io/ttl": "0"}},
        }, ok=(201, 409))

    def _nodes_schedulable(self, names: Sequence[str]) -> bool:
        try:
            nodes = {n["metadata"]["name"]: n for n in
                     self.api_request("GET", "/api/v1/nodes")["items"]}
        except ControlPlaneError:
            return False
        for name in names:
            node = nodes.get(name)
            if node is None or (node.get("spec") or {}).get("taints"):
                return False
            ready = [c for c in (node.get("status") or {}).get("conditions") or []
                     if c.get("type") == "Ready"]
            if not ready or ready[0].get("status") != "True":
                return False
        return True

    def api_request(self, method: str, path: str, body: dict | None = None, *,
                    ok: Sequence[int] = (200, 201)) -> dict:
        """One request as the admin; the decoded answer. ControlPlaneError otherwise."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.apiserver_port,
                                           context=self.admin_ssl_context(), timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ControlPlaneError(f"{method} {path}: {exc}") from exc
        finally:
            conn.close()
        if resp.status not in ok:
            raise ControlPlaneError(f"{method} {path}: {resp.status} "
                                    f"{payload[:300].decode(errors='replace')}")
        return json.loads(payload) if payload else {}

    # --- state file (read by attach(), the CLI and the supervisor's callers)

    def _state(self, status: str) -> dict:
        b = self._binaries
        return {
            "status": status,
            "supervisor_pid": os.getpid(),
            "server": self.server,
            "kubeconfig": str(self.admin_kubeconfig),
            "state_dir": str(self.state_dir),
            "ports": {"etcd": self.etcd_port, "kube-apiserver": self.apiserver_port,
                      "kube-controller-manager": self.kcm_port},
            "nodes": self.node_names,
            # Every process ever started is listed; pid is None while it is down.
            "processes": {name: {"pid": self._live_pid(name),
                                 "executable": argv[0],
                                 "log": str(self.log_path(name))}
                          for name, argv in self._argv.items()},
            "timings": self.timings,
            "binaries": {"source": b.source if b else None},
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def _live_pid(self, name: str) -> int | None:
        proc = self._procs.get(name)
        return proc.pid if proc is not None and proc.poll() is None else None

    def _write_state(self, status: str) -> None:
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self._state(status), indent=2) + "\n")
        os.replace(tmp, self.state_dir / STATE_FILE)

    def _read_state(self) -> dict:
        return read_state(self.state_dir) or {}

    # --- attaching to a plane run by a supervisor (`up` / `run`)

    @classmethod
    def attach(cls, state_dir: str | os.PathLike | None = None) -> "ControlPlane | None":
        """A handle on the plane a supervisor runs in state_dir, or None if none is serving.

        stop() on it does nothing (the supervisor owns the processes);
        kill_apiserver()/start_apiserver() are asked of the supervisor.
        """
        state_dir = Path(state_dir or default_state_dir())
        state = read_state(state_dir)
        if not state or state.get("status") != "ready" or not _pid_alive(
                state.get("supervisor_pid")):
            return None
        plane = cls(state_dir, tie_to_parent=False)
        plane._supervisor_pid = state["supervisor_pid"]
        plane.etcd_port = state["ports"]["etcd"]
        plane.apiserver_port = state["ports"]["kube-apiserver"]
        plane.kcm_port = state["ports"]["kube-controller-manager"]
        plane.node_names = state.get("nodes") or []
        plane._with_pods = bool(plane.node_names)
        plane.timings = state.get("timings", {})
        plane.started = True
        if not _probe(plane.apiserver_port, "/readyz", plane.admin_ssl_context()):
            return None
        return plane

    def _ask_supervisor(self, sig: int, done, timeout_seconds: float = 30.0) -> None:
        os.kill(self._supervisor_pid, sig)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            state = self._read_state()
            if state.get("processes") and done(state):
                return
            time.sleep(0.05)
        raise ControlPlaneError(f"the supervisor (pid {self._supervisor_pid}) did not act on "
                                f"signal {sig} within {timeout_seconds:.0f} s; see "
                                f"{self.state_dir / 'supervisor.log'}")


def read_state(state_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- CLI

def _serve_forever(state_dir: Path, make_plane: Callable[[Path], "ControlPlane"] | None = None
                   ) -> int:
    """The supervisor: start a plane, keep it until SIGINT/SIGTERM, then stop it.

    `make_plane(state_dir)` builds it (default: `ControlPlane(state_dir)`), for
    a supervised plane with other flags (bench/scaling/plane.py).

    SIGUSR1 kills kube-apiserver and SIGUSR2 starts it again: how attached
    test sessions inject faults into a plane they do not own. The handlers
    only queue the request; this loop, on the main thread, does the work.
    SimpleQueue because its put() is reentrant: a handler may interrupt this
    very thread inside get(), where queue.Queue would deadlock on its lock.
    """
    requests: queue.SimpleQueue = queue.SimpleQueue()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, lambda s, _f: requests.put(s))
    plane = (make_plane or ControlPlane)(state_dir)
    try:
        plane._prepare_dirs()
        plane._write_state("starting")
        plane.start()
    except ControlPlaneError as exc:
        _log(str(exc))
        (state_dir / STATE_FILE).write_text(json.dumps(
            {"status": "failed", "error": str(exc), "supervisor_pid": os.getpid()}) + "\n")
        return 1
    t = plane.timings
    _log(f"ready in {t['total_seconds']:.1f} s (apiserver {t['apiserver_ready_seconds']:.1f} s); "
         f"KUBECONFIG={plane.admin_kubeconfig}; Ctrl-C or `down` stops it")
    try:
        while True:
            try:
                signum = requests.get(timeout=1.0)
            except queue.Empty:
                continue
            if signum == signal.SIGUSR1:
                _log("killing kube-apiserver (asked by a client)")
                plane.kill_apiserver()
            elif signum == signal.SIGUSR2:
                _log("starting kube-apiserver (asked by a client)")
                try:
                    plane.start_apiserver()
                except ControlPlaneError as exc:
                    _log(str(exc))
            else:
                _log(f"{signal.Signals(signum).name}: stopping")
                break
    finally:
        plane.stop()
    return 0


def _cmd_up(state_dir: Path, run_argv: list[str] | None = None) -> int:
    """Start the supervisor detached (`run_argv`: its command, default this module's
    `run`) and wait until its plane is ready."""
    plane = ControlPlane.attach(state_dir)
    if plane is not None:
        _log(f"already running (supervisor pid {plane._supervisor_pid})")
        print(plane.admin_kubeconfig)
        return 0
    # Build (or find) the binaries here, in the foreground, so the progress is
    # visible; the detached supervisor then starts in seconds.
    try:
        find_binaries(need_pods=True)
    except ControlPlaneError as exc:
        _log(str(exc))
        return 2
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    with open(state_dir / "supervisor.log", "ab") as log:
        supervisor = subprocess.Popen(
            run_argv or [sys.executable, "-m", "tests.support.controlplane",
                         "--dir", str(state_dir), "run"],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)      # detached: survives this shell and its Ctrl-C
    deadline = time.monotonic() + ETCD_READY_TIMEOUT_SECONDS + APISERVER_READY_TIMEOUT_SECONDS \
        + KCM_READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        state = read_state(state_dir) or {}
        if state.get("status") == "ready":
            t = state["timings"]
            _log(f"ready in {t['total_seconds']:.1f} s; supervisor pid {supervisor.pid}; "
                 f"logs in {state_dir / 'logs'}")
            print(state["kubeconfig"])
            return 0
        if state.get("status") == "failed" or supervisor.poll() is not None:
            _log(f"start failed; see {state_dir / 'supervisor.log'}:\n"
                 f"{_tail(state_dir / 'supervisor.log')}")
            return 1
        time.sleep(0.2)
    _log("timed out waiting for the control plane; stopping it")
    _terminate(supervisor.pid, grace_seconds=STOP_GRACE_SECONDS * 3, proc=supervisor)
    return 1


def _cmd_down(state_dir: Path) -> int:
    state = read_state(state_dir)
    if not state:
        _log(f"no control plane in {state_dir}")
        return 0
    supervisor = state.get("supervisor_pid")
    if _pid_alive(supervisor):
        # The supervisor stops its children in order; allow it their grace periods.
        _terminate(supervisor, grace_seconds=STOP_GRACE_SECONDS * 3 + 5)
    # Belt and braces: anything the state still names and that still runs the
    # same executable (not a recycled pid) is killed.
    for name, info in (state.get("processes") or {}).items():
        if _pid_runs(info.get("pid"), info.get("executable") or name):
            _log(f"{name} (pid {info['pid']}) outlived its supervisor: killing it")
            _terminate(info["pid"], grace_seconds=2)
    # A supervisor that was SIGKILLed could not clean up after itself.
    for leftover in ("etcd-data", "pki"):
        shutil.rmtree(state_dir / leftover, ignore_errors=True)
    for kubeconfig in ("admin.kubeconfig", "kcm.kubeconfig", "scheduler.kubeconfig",
                       "kwok.kubeconfig"):
        (state_dir / kubeconfig).unlink(missing_ok=True)
    state.update(status="stopped", processes={})
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    _log(f"stopped; logs kept in {state_dir / 'logs'}")
    return 0


def _cmd_status(state_dir: Path) -> int:
    state = read_state(state_dir)
    if not state:
        _log(f"no control plane in {state_dir}")
        return 1
    status = state.get("status")
    if status == "ready" and not _pid_alive(state.get("supervisor_pid")):
        status = "dead (its supervisor is gone: run `down`, then `up`)"
    print(f"status: {status}  server: {state.get('server')}")
    print(f"kubeconfig: {state.get('kubeconfig')}")
    for name, info in (state.get("processes") or {}).items():
        rss = rss_bytes(info.get("pid"))
        print(f"{name:24} pid {info.get('pid')!s:>8}  rss "
              f"{(f'{rss / 2**20:.0f} MiB') if rss else '-':>8}  log {info.get('log')}")
    for key, value in (state.get("timings") or {}).items():
        print(f"{key}: {value:.2f}")
    return 0 if status == "ready" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.controlplane",
        description="A local etcd + kube-apiserver + kube-controller-manager for tests and demos.")
    parser.add_argument("--dir", type=Path, default=None,
                        help="state directory (default $MY_CONTROLLER_CLUSTER_DIR or "
                             "<repo>/.cluster)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start detached; print the admin kubeconfig path")
    sub.add_parser("down", help="stop the detached control plane")
    sub.add_parser("env", help="print `export KUBECONFIG=...` for eval")
    sub.add_parser("status", help="pids, RSS and start-up timings")
    sub.add_parser("run", help="run in the foreground until Ctrl-C")
    sub.add_parser("binaries", help="find (or build) the binaries; print their directory")
    args = parser.parse_args(argv)
    state_dir = (args.dir or default_state_dir()).resolve()

    if args.command == "up":
        return _cmd_up(state_dir)
    if args.command == "down":
        return _cmd_down(state_dir)
    if args.command == "status":
        return _cmd_status(state_dir)
    if args.command == "run":
        return _serve_forever(state_dir)
    if args.command == "binaries":
        try:
            b = find_binaries()
        except ControlPlaneError as exc:
            _log(str(exc))
            return 2
        print(os.path.dirname(b.kube_apiserver))
        return 0
    # env
    plane = ControlPlane.attach(state_dir)
    if plane is None:
        _log(f"no control plane serving in {state_dir}: run `make cluster` first")
        return 1
    print(f"export KUBECONFIG={plane.admin_kubeconfig}")
    print(f"export MY_CONTROLLER_CLUSTER_DIR={state_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
