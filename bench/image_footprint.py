"""Image footprint: the image `make image` builds, beside the same operator on a slim-like Python.

    .venv/bin/python -m bench image_footprint            # prints a markdown report
    .venv/bin/python -m bench image_footprint --write    # and writes bench/RESULTS.image_footprint.md

Needs root (chroot, namespaces), the image (`make image`: build/*.oci.tar) and
the control-plane binaries (`make testbin`); attaches to `make cluster`'s plane
if one runs, else starts its own.

What is measured:
- size: the image's one layer uncompressed (build/rootfs.tar, what a node
  unpacks) and gzip-compressed (the blob in the OCI archive, what a registry
  stores and a node pulls); what the root filesystem holds, by kind;
- `my-controller --help` wall time (interpreter start + every import);
- start -> first `/readyz` 200 against the local control plane, and the
  resident memory (VmRSS) once ready and once N `My`s are Available;
each for three ways to run the same code:
- image: the image's root filesystem as a Pod runs it (tests/support/image_runtime.py:
  read-only root, uid 65532, in-cluster ServiceAccount files), Debian's
  CPython 3.11 with its precompiled bytecode;
- venv: this repository's virtualenv on the host's CPython (a python.org-style
  build, as `python:3.11-slim` has in /usr/local), bytecode cached;
- venv, no bytecode: the same with PYTHONPYCACHEPREFIX on an empty directory and
  PYTHONDONTWRITEBYTECODE=1: no .pyc is found or written, every module is
  compiled at every start -- what `python:3.11-slim` (which deletes every .pyc
  under /usr/local) does on a read-only root filesystem.
The venv runs use a ServiceAccount kubeconfig (same token, same RBAC).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import load_config
from k8s_http.core.objects import NAMESPACES
from tests.e2e.operator_process import (MY, SA, SYSTEM_NS, free_port, http_get,
                                        install_manifests, is_available, kubeconfig_token,
                                        make_my)
from tests.support.controlplane import ControlPlane, default_state_dir
from tests.support.image_runtime import PodSandbox, UnpackedImage

RESULTS = ROOT / "bench" / "RESULTS.image_footprint.md"
VERSION = "0.1.0"
ARCHIVE = ROOT / "build" / f"my-controller-{VERSION}.oci.tar"
ROOTFS_TAR = ROOT / "build" / "rootfs.tar"
CONFIGS = ("image", "venv", "venv, no bytecode")


# ---- sizes -------------------------------------------------------------------

def layer_sizes() -> dict[str, int]:
    """Uncompressed layer (the tarball podman ADDs) and its gzip blob in the archive."""
    with tarfile.open(ARCHIVE) as archive:
        def blob(digest: str) -> bytes:
            return archive.extractfile(f"blobs/sha256/{digest.split(':')[1]}").read()
        (entry,) = json.loads(archive.extractfile("index.json").read())["manifests"]
        manifest = json.loads(blob(entry["digest"]))
        (layer,) = manifest["layers"]
    return {"uncompressed": ROOTFS_TAR.stat().st_size, "compressed": layer["size"],
            "archive": ARCHIVE.stat().st_size}


def _kind(rel: str) -> str:
    if rel.startswith("usr/lib/python3/dist-packages/"):
        top = rel.split("/")[4]
        if top.startswith(("k8s_http", "controller")):
            return "the operator (controller.py, k8s_http), with bytecode"
        return "PyYAML + prometheus-client, with bytecode"
    if rel.startswith("usr/lib/python3.11/lib-dynload/"):
        return "standard library: extension modules"
    if rel.startswith("usr/lib/python3.11/"):
        return ("standard library: bytecode (.pyc)" if rel.endswith(".pyc")
                else "standard library: source (.py)")
    if rel == "usr/bin/python3.11":
        return "interpreter (python3.11)"
    if rel.startswith(("lib/", "lib64/", "usr/lib/x86_64-linux-gnu/")):
        return "shared libraries (glibc, libssl/libcrypto, zlib, expat)"
    return "other (/etc, console script, ...)"


def contents(rootfs: pathlib.Path) -> dict[str, int]:
    """Bytes of regular files by kind."""
    out: dict[str, int] = {}
    for path in rootfs.rglob("*"):
        if path.is_file() and not path.is_symlink():
            kind = _kind(str(path.relative_to(rootfs)))
            out[kind] = out.get(kind, 0) + path.stat().st_size
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# ---- --help ------------------------------------------------------------------

def _venv_env(no_bytecode: bool, empty_dir: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PYTHONPATH")}
    if no_bytecode:
        env |= {"PYTHONPYCACHEPREFIX": str(empty_dir), "PYTHONDONTWRITEBYTECODE": "1"}
    return env


def help_seconds(image: UnpackedImage, empty_dir: pathlib.Path, runs: int) -> dict[str, float]:
    argv = {
        "image": ["env", "-i", *[f"{k}={v}" for k, v in image.env.items()], "chroot",
                  f"--userspec={image.uid}:{image.gid}", str(image.rootfs), *image.entrypoint],
        "venv": [sys.executable, str(ROOT / "controller.py")],
        "venv, no bytecode": [sys.executable, str(ROOT / "controller.py")],
    }
    wall: dict[str, list[float]] = {name: [] for name in CONFIGS}
    cpu: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for i in range(runs + 1):                       # round-robin; the first round warms up
        for name in CONFIGS:
            env = _venv_env(name.endswith("no bytecode"), empty_dir)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([*argv[name], "--help"], env=env, check=True, capture_output=True)
            if i:
                wall[name].append(time.perf_counter() - t0)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(after.ru_utime + after.ru_stime
                                 - before.ru_utime - before.ru_stime)
    out = {name: {"wall": statistics.median(wall[name]), "cpu": statistics.median(cpu[name])}
           for name in CONFIGS}
    return out


# ---- against the control plane -----------------------------------------------

def _cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its own, exec'd images included; not its children)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class _Run:
    """One operator process in one of CONFIGS; .pid is the operator's host PID."""

    def __init__(self, name: str, plane, image: UnpackedImage, sa_dir: pathlib.Path,
                 kubeconfig: pathlib.Path, namespace: str, work: pathlib.Path,
                 empty_dir: pathlib.Path):
        self.name = name
        self.probe_port, metrics_port = free_port(), free_port()
        args = [f"--metrics-bind-address=127.0.0.1:{metrics_port}",
                f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                "--log-format=json", "--namespace", namespace]
        log = work / f"{name.replace(', ', '-').replace(' ', '-')}.log"
        self.t0 = time.perf_counter()
        if name == "image":
            self.pod = PodSandbox(image, sa_dir, log, name="my-controller-bench")
            host, _, port = plane.server.removeprefix("https://").rpartition(":")
            self.pod.start(args, env={"KUBERNETES_SERVICE_HOST": host,
                                      "KUBERNETES_SERVICE_PORT": port})
            self.proc = None
        else:
            self.pod = None
            with open(log, "wb") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, str(ROOT / "controller.py"), "--kubeconfig", str(kubeconfig),
                     *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=_venv_env(name.endswith("no bytecode"), empty_dir), cwd=str(ROOT))

    @property
    def pid(self) -> int:
        return self.pod.host_pid if self.pod else self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if http_get(self.probe_port, "/readyz", timeout=1)[0] == 200:
                return time.perf_counter() - self.t0
            time.sleep(0.005)
        raise RuntimeError(f"{self.name}: not ready within {timeout} s")

    def stop(self) -> int:
        if self.pod:
            self.pod.signal(signal.SIGTERM)
            return self.pod.wait(timeout=35)
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=35)


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(0.2)


def against_plane(image: UnpackedImage, work: pathlib.Path, empty_dir: pathlib.Path, *,
                  runs: int, mys: int) -> dict:
    plane = ControlPlane.attach(default_state_dir())
    own = plane is None
    if own:
        plane = ControlPlane().start()
    api = ApiClient.from_config(load_config(str(plane.admin_kubeconfig)))
    try:
        install_manifests(plane)
        kubeconfig = plane.mint_service_account_kubeconfig(SYSTEM_NS, SA, work / "sa.kubeconfig")
        sa_dir = work / "serviceaccount"
        sa_dir.mkdir(mode=0o755)
        (sa_dir / "token").write_text(kubeconfig_token(kubeconfig))
        (sa_dir / "ca.crt").write_bytes((plane.pki_dir / "ca.crt").read_bytes())
        (sa_dir / "namespace").write_text(SYSTEM_NS)
        for path in sa_dir.iterdir():
            path.chmod(0o644)
        namespaces = {}
        for name in CONFIGS:
            namespaces[name] = f"bench-image-{CONFIGS.index(name)}-{int(time.time())}"
            api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": namespaces[name]}})
        ready = {name: [] for name in CONFIGS}
        cpu_ready = {name: [] for name in CONFIGS}
        rss_ready = {name: [] for name in CONFIGS}
        rss_busy = {}
        # Round-robin over the configurations, so that load from other work on
        # the machine spreads over all three alike; the last round also reconciles.
        for i in range(runs):
            for name in CONFIGS:
                namespace = namespaces[name]
                run = _Run(name, plane, image, sa_dir, kubeconfig, namespace, work, empty_dir)
                try:
                    ready[name].append(run.wait_ready())
                    cpu_ready[name].append(_cpu_seconds(run.pid))
                    time.sleep(1.0)                         # let start-up garbage settle
                    rss_ready[name].append(_rss_bytes(run.pid))
                    if i == runs - 1:
                        for n in range(mys):
                            api.create(MY, make_my(f"m{n}", namespace))
                        _wait(lambda: all(is_available(api, f"m{n}", namespace)
                                          for n in range(mys)), 120, f"{mys} Mys Available")
                        time.sleep(2.0)
                        rss_busy[name] = _rss_bytes(run.pid)
                    code = run.stop()
                    if code != 0:
                        raise RuntimeError(f"{name}: exit {code} on SIGTERM")
                finally:
                    if run.pod:
                        run.pod.kill()
                    elif run.proc.poll() is None:
                        run.proc.kill()
        for namespace in namespaces.values():
            api.delete(NAMESPACES, namespace)
        out = {name: {"ready_seconds": statistics.median(ready[name]), "ready_all": ready[name],
                      "cpu_to_ready": statistics.median(cpu_ready[name]),
                      "rss_ready": statistics.median(rss_ready[name]),
                      "rss_after_mys": rss_busy[name]} for name in CONFIGS}
        return out
    finally:
        api.transport.close()
        if own:
            plane.stop()


# ---- report --------------------------------------------------------------------

def measure(runs: int, mys: int) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("bench/image_footprint.py needs root (chroot, namespaces)")
    if not ARCHIVE.exists() or not ROOTFS_TAR.exists():
        raise SystemExit(f"{ARCHIVE.relative_to(ROOT)} is missing: run `make image`")
    with tempfile.TemporaryDirectory(prefix="image-footprint-") as tmp:
        work = pathlib.Path(tmp)
        empty = work / "empty-pycache"
        empty.mkdir()
        image = UnpackedImage.from_archive(ARCHIVE, work / "image")
        interpreter = subprocess.run(
            ["chroot", str(image.rootfs), "/usr/bin/python3.11", "-c",
             "import sys; print(sys.version.split()[0])"], capture_output=True, text=True,
            check=True).stdout.strip()
        load_before = os.getloadavg()[0]
        return {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load": [load_before],
            "sizes": layer_sizes(), "contents": contents(image.rootfs),
            "help": help_seconds(image, empty, runs=max(runs, 5)),
            "plane": against_plane(image, work, empty, runs=runs, mys=mys),
            "python_image": interpreter, "python_host": platform.python_version(),
            "runs": runs, "mys": mys, "cpus": os.cpu_count(),
        }


def report(m: dict) -> str:
    mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
    s, p, h = m["sizes"], m["plane"], m["help"]
    lines = [
        "# Image footprint",
        "",
        f"Measured {m['date']} on {m['cpus']} shared CPUs (1-minute load average "
        f"{m['load'][0]:.1f} at the start, {m['load'][1]:.1f} at the end) with",
        "`make image && sudo .venv/bin/python -m bench image_footprint --write`",
        f"(image: Debian CPython {m['python_image']}; venv: host CPython {m['python_host']}).",
        "",
        "| image `localhost/my-controller:0.1.0` | size |",
        "|---|---|",
        f"| uncompressed (the one layer; what a node unpacks) | **{mb(s['uncompressed'])}** |",
        f"| compressed (gzip layer; what a registry stores and a node pulls) | "
        f"**{mb(s['compressed'])}** |",
        "| for scale, uncompressed: `python:3.11-slim` ~130 MB, distroless "
        "`python3-debian12` ~50 MB (not measured here: no registry) | |",
        "",
        "What the root filesystem holds (bytes of regular files):",
        "",
        "| part | size |",
        "|---|---|",
    ]
    lines += [f"| {kind} | {mb(size)} |" for kind, size in m["contents"].items()]
    lines += [
        "",
        f"Start-up, the same operator three ways (median; `--help` of {max(m['runs'], 5)} runs, "
        f"start to first `/readyz` 200 of {m['runs']} runs against the local control plane; "
        f"RSS = VmRSS once ready, and after {m['mys']} `My`s are Available):",
        "",
        "| | `--help` wall (CPU) | start → `/readyz` wall (CPU) | RSS ready | RSS, "
        f"{m['mys']} `My`s |",
        "|---|---|---|---|---|",
    ]
    for name in CONFIGS:
        label = {"image": "image (read-only root, uid 65532, in-cluster config)",
                 "venv": "venv, bytecode cached (`python:3.11-slim` with a writable root)",
                 "venv, no bytecode": "venv, no bytecode (`python:3.11-slim` on a read-only "
                                      "root)"}[name]
        lines.append(f"| {label} | {h[name]['wall']:.2f} s ({h[name]['cpu']:.2f} s) | "
                     f"{p[name]['ready_seconds']:.2f} s ({p[name]['cpu_to_ready']:.2f} s) | "
                     f"{mb(p[name]['rss_ready'])} | {mb(p[name]['rss_after_mys'])} |")
    lines += [
        "",
        "The machine is shared with other work: wall times vary from run to run, CPU",
        "seconds (the process's own utime + stime) much less. The image's wall time",
        "includes setting up its namespaces and mounts (unshare, mount, chroot).",
        "",
        "All runs, start → `/readyz`: " + "; ".join(
            f"{name}: " + ", ".join(f"{t:.2f}" for t in p[name]["ready_all"]) + " s"
            for name in CONFIGS),
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS}")
    parser.add_argument("--runs", type=int, default=5, help="start-ups per configuration")
    parser.add_argument("--mys", type=int, default=20, help="Mys reconciled for the busy RSS")
    args = parser.parse_args(argv)
    m = measure(args.runs, args.mys)
    m["load"].append(os.getloadavg()[0])
    text = report(m)
    print(text)
    if args.write:
        RESULTS.write_text(text)
        (ROOT / "bench" / "results" / "image_footprint.json").write_text(json.dumps(m, indent=2) + "\n")
    return 0
