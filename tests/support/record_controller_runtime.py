"""Record what the controller-runtime peer shows a platform team: its /metrics and log keys.

    python -m tests.support.record_controller_runtime [--peer PATH]

Runs the peer (bench/peers/crpeer, controller-runtime v0.24, built by
bench/peers/build_crpeer.sh into ~/.cache) on a local control plane with Pods,
gives it a small workload (two My that become Available, one whose Deployment
name is taken by a foreign Deployment), then writes

  tests/unit/fixtures/controller_runtime.metrics.txt   its /metrics, as scraped
  tests/unit/fixtures/controller_runtime.logs.json     per log message: the keys
                                                       of its JSON lines

which tests/unit/test_against_controller_runtime.py compares with ours. Run it
again when the peer's version changes; the fixtures say which version made them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from k8s_http import DEPLOYMENTS, NAMESPACES, ApiClient, Resource, load_config
from tests.support.controlplane import ControlPlane
from tests.support.ports import free_port
from tests.support.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
MY = Resource("mine.jp", "v1", "my", namespaced=True, kind="My")
NAMESPACE = "recorded"


def _peer_binary() -> Path:
    out = subprocess.run(["bash", str(ROOT / "bench" / "peers" / "build_crpeer.sh")],
                         capture_output=True, text=True, check=True).stdout.split()
    return Path(out[-1])


def _workload(api: ApiClient) -> None:
    api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": NAMESPACE}})
    api.create(DEPLOYMENTS, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "taken", "namespace": NAMESPACE},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "theirs"}},
                 "template": {"metadata": {"labels": {"app": "theirs"}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}}},
        namespace=NAMESPACE)
    for name in ("one", "two", "taken"):
        api.create(MY, {"apiVersion": "mine.jp/v1", "kind": "My",
                        "metadata": {"name": name, "namespace": NAMESPACE},
                        "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}},
                   namespace=NAMESPACE)


def record(peer: Path) -> None:
    with ControlPlane() as plane:
        kubectl = plane.binaries.kubectl
        subprocess.run([kubectl, "--kubeconfig", str(plane.admin_kubeconfig), "apply", "-f",
                        str(ROOT / "manifests" / "base" / "crd.yaml")], check=True)
        subprocess.run([kubectl, "--kubeconfig", str(plane.admin_kubeconfig), "wait", "--for",
                        "condition=established", "crd/my.mine.jp"], check=True)
        api = ApiClient.from_config(load_config(str(plane.admin_kubeconfig)))
        port = free_port()
        log_path = plane.state_dir / "crpeer.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([str(peer), "--kubeconfig", str(plane.admin_kubeconfig),
                                     "--metrics-bind-address", f"127.0.0.1:{port}",
                                     "--health-probe-bind-address", "0"],
                                    stdout=log, stderr=subprocess.STDOUT)
        try:
            eventually(lambda: b"Starting workers" in log_path.read_bytes(), timeout=60)
            _workload(api)
            time.sleep(15)                 # Pods up, the conflict retried a few times
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                metrics = r.read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        lines = log_path.read_text().splitlines()      # the plane's temp dir goes with it
    keys: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("{"):
            doc = json.loads(line)
            keys.setdefault(doc.get("msg", ""), sorted(set(doc) - {"ts"}))
    header = f"# recorded from {peer.parent.name} by tests/support/record_controller_runtime.py\n"
    (FIXTURES / "controller_runtime.metrics.txt").write_text(header + metrics)
    (FIXTURES / "controller_runtime.logs.json").write_text(
        json.dumps({"peer": peer.parent.name, "keys_by_message": keys}, indent=1,
                   sort_keys=True) + "\n")
    print(f"wrote {FIXTURES}/controller_runtime.{{metrics.txt,logs.json}}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", type=Path, default=None, help="the crpeer binary")
    args = parser.parse_args(argv)
    record(args.peer or _peer_binary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
