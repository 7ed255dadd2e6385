"""`make demo`: the operator, end to end, in one terminal.

Without a configured cluster it starts the local control plane (building it the
first time, with progress), installs the CRD, namespace and RBAC from
manifests/, runs the operator in the foreground, creates the Secret foobar-db
(a random password) and the sample `foobar` that reads it, waits until foobar is
Ready (its Pod runs on one of the local plane's fake Nodes), shows
`kubectl get my,deploy,svc,pods` and its status, and prints the metrics and
probe URLs. Ctrl-C stops the operator (gracefully) and tears everything down.

With `--kubeconfig PATH` or `$KUBECONFIG` set, it uses that cluster instead,
and leaves it as it found it apart from the CRD and the sample.

    python -m tests.support.demo [--kubeconfig PATH] [--namespace NS] [--once]

`--once` exits after showing the converged state (tests/e2e/test_demo.py runs it so).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from k8s_http import (CRDS, SECRETS, AlreadyExistsError, ApiClient, ApiError, ConfigError,
                      Resource, load_config)
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
MY = Resource("mine.jp", "v1", "my", namespaced=True, kind="My")
# Pods start in seconds on the local plane's fake Nodes; a real cluster pulls
# postgres:16 first.
READY_TIMEOUT_SECONDS = 300


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"==> {text}", flush=True)


def wait_for(predicate, timeout_seconds: float, what: str):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"demo: timed out after {timeout_seconds:.0f} s waiting for {what}")


def apply_file(client: ApiClient, path: Path, namespace: str | None = None) -> None:
    """Server-side apply every document of a manifest (no kubectl needed)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        group, _, version = doc["apiVersion"].rpartition("/")
        kind = doc["kind"]
        plural = {"CustomResourceDefinition": "customresourcedefinitions",
                  "Namespace": "namespaces", "ServiceAccount": "serviceaccounts",
                  "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
                  "Role": "roles", "RoleBinding": "rolebindings", "My": "my"}[kind]
        namespaced = kind not in ("CustomResourceDefinition", "Namespace", "ClusterRole",
                                  "ClusterRoleBinding")
        if namespace and namespaced:
            doc["metadata"]["namespace"] = namespace
        client.apply(Resource(group, version, plural, namespaced, kind), doc,
                     field_manager="my-controller-demo", force=True,
                     namespace=doc["metadata"].get("namespace"))


def create_password_secret(client: ApiClient, namespace: str) -> None:
    """The Secret the sample reads its password from, unless it exists (a cluster's own)."""
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": "foobar-db", "namespace": namespace},
              "stringData": {"password": secrets.token_hex(16)}}
    try:
        client.create(SECRETS, secret, namespace=namespace)
    except AlreadyExistsError:
        pass


def kubectl(kubectl_path: str | None, kubeconfig: str, *args: str) -> None:
    if not kubectl_path:
        return
    subprocess.run([kubectl_path, "--kubeconfig", kubeconfig, *args], check=False)


def run_demo(kubeconfig: str, namespace: str, kubectl_path: str | None, once: bool) -> int:
    client = ApiClient.from_config(load_config(kubeconfig))
    say("installing the CRD, namespace and RBAC from manifests/")
    for name in ("namespace.yaml", "crd.yaml", "rbac.yaml", "user-roles.yaml"):
        apply_file(client, MANIFESTS / "base" / name)
    wait_for(lambda: any(c.get("type") == "Established" and c.get("status") == "True"
                         for c in client.get(CRDS, "my.mine.jp").get("status", {})
                         .get("conditions", [])), 30, "the CRD to be established")

    metrics_port, probe_port = free_port(), free_port()
    say(f"starting the operator: python controller.py --kubeconfig {kubeconfig}")
    operator = subprocess.Popen(
        [sys.executable, str(REPO / "controller.py"), "--kubeconfig", kubeconfig,
         "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
         "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
         "--log-format", "text"], cwd=REPO)
    try:
        say(f"creating the Secret foobar-db (a random password) in namespace {namespace}")
        create_password_secret(client, namespace)
        say(f"creating the sample My foobar in namespace {namespace}: its password from the Secret")
        apply_file(client, MANIFESTS / "samples" / "my-foobar.yaml", namespace=namespace)

        def ready():
            try:
                my = client.get(MY, "foobar", namespace=namespace)
            except ApiError:
                return None
            conds = (my.get("status") or {}).get("conditions") or []
            return my if any(c.get("type") == "Ready" and c.get("status") == "True"
                             for c in conds) else None

        my = wait_for(ready, READY_TIMEOUT_SECONDS, "foobar to be Ready")
        say("kubectl get my,deploy,svc,pods")
        kubectl(kubectl_path, kubeconfig, "get", "my,deploy,svc,pods", "-n", namespace,
                "-o", "wide")
        say("foobar's status")
        print(yaml.safe_dump(my.get("status"), sort_keys=False), flush=True)
        say(f"metrics: http://127.0.0.1:{metrics_port}/metrics")
        say(f"probes:  http://127.0.0.1:{probe_port}/healthz  "
            f"http://127.0.0.1:{probe_port}/readyz?verbose")
        if once:
            return 0
        say("the operator runs in the foreground; press Ctrl-C to stop and tear down")
        return operator.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if operator.poll() is None:
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="use this cluster instead of a local control plane")
    parser.add_argument("--namespace", default="default", help="where to create foobar")
    parser.add_argument("--once", action="store_true", help="exit once foobar is converged")
    args = parser.parse_args(argv)

    try:
        if args.kubeconfig:
            say(f"using the cluster in {args.kubeconfig}")
            from tests.support.controlplane import ControlPlaneError, find_binaries
            try:
                kubectl_path = find_binaries(build=False).kubectl
            except ControlPlaneError:
                kubectl_path = None
            return run_demo(args.kubeconfig, args.namespace, kubectl_path, args.once)

        from tests.support.controlplane import ControlPlane
        say("starting a local control plane (etcd, kube-apiserver, kube-controller-manager, "
            "kube-scheduler, kwok with 3 fake Nodes)")
        plane = ControlPlane()
        try:
            plane.start()
            say(f"control plane up in {plane.timings.get('total_seconds', 0):.1f} s; "
                f"kubeconfig: {plane.admin_kubeconfig}")
            return run_demo(str(plane.admin_kubeconfig), args.namespace,
                            plane.binaries.kubectl, args.once)
        finally:
            say("tearing down the control plane")
            plane.stop()
    except ConfigError as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
