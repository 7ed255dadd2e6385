#!/usr/bin/env python3
"""The scale bench's control plane, and a long-lived one whose fleet outlives a run.

    python -m bench plane up DIR        # start it detached (prints the kubeconfig)
    python -m bench scale --cluster-dir DIR --sizes 30000 ...   # grows the fleet, keeps it
    python -m bench scale --cluster-dir DIR --sizes 30000 ...   # again: no growing
    python -m bench plane down DIR

Settings (module constants of tests/support/controlplane.py, which it reads when
it starts etcd and kube-controller-manager, plus flags):
  * the Deployment and ReplicaSet controllers off, so no ReplicaSet or Pod exists:
    the fleet is My + Deployment + Service and the plane idles between runs;
  * a /12 Service range: room for 1,048,574 Services (a /16 holds 65,534);
  * etcd's quota raised for 100,000 My with their history;
  * the convergence bench's audit log (in DIR when supervised), so writes are
    counted exactly whether the bench started the plane or attached to it.

Why a plane that outlives a run: growing the fleet is most of a large run, and
it slows as the fleet grows. kube-apiserver 1.36 lists every IPAddress object
twice on each Service create (ipallocator.Allocator.createIPAddress updates its
allocated/available gauges through Used(), a List of the IPAddress lister), so a
create costs O(Services): in one run the fleet grew at 79 My/s up to 1,000,
26 My/s up to 10,000 and 9 My/s up to 30,000 (38 of the run's 55 minutes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.convergence.cluster import bench_control_plane
from tests.support import controlplane

# The controllers kept: ownerReference cascades, namespaces, ServiceAccounts.
KCM_CONTROLLERS = tuple(c for c in controlplane.KCM_CONTROLLERS
                        if c not in ("deployment-controller", "replicaset-controller"))
SERVICE_CIDR = "10.0.0.0/12"
# etcd's quota for 100,000 My (~2.5 GB of keys with their history before compaction).
ETCD_QUOTA_BYTES = 8 * 1024 ** 3
APISERVER_ARGS = (f"--service-cluster-ip-range={SERVICE_CIDR}",)


def plane_settings() -> None:
    """Set where tests/support/controlplane.py reads them (module constants: flags
    given again would not do, --controllers is a list that repeats append to, and the
    first mention of a controller wins)."""
    controlplane.KCM_CONTROLLERS = KCM_CONTROLLERS
    controlplane.ETCD_QUOTA_BYTES = ETCD_QUOTA_BYTES


def supervised_plane(state_dir: Path) -> controlplane.ControlPlane:
    """The plane a supervisor runs in state_dir, its audit log there too. Pod-less,
    by choice: a fleet of 100,000 My would be 100,000 Pods for kwok and the scheduler,
    and the scale benchmark measures the operators' caches, not the Pods."""
    return bench_control_plane(state_dir, apiserver_args=APISERVER_ARGS, state_dir=state_dir,
                               pods=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down", "run"),
                        help="start it detached, stop it, or run it in the foreground")
    parser.add_argument("dir", type=Path, help="its state directory")
    args = parser.parse_args(argv)
    command, state_dir = args.command, args.dir.resolve()
    plane_settings()
    if command == "up":
        return controlplane._cmd_up(
            state_dir, [sys.executable, "-m", "bench", "plane", "run", str(state_dir)])
    if command == "down":
        return controlplane._cmd_down(state_dir)
    return controlplane._serve_forever(state_dir, supervised_plane)
