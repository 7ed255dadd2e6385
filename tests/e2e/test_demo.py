"""The README's first command, `make demo`, as a user runs it on a machine with no cluster:
its own control plane, the manifests, the operator, the sample converged, then a clean
teardown. (`--once` ends it where a user would press Ctrl-C.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)


def test_the_demo_converges_the_sample_on_its_own_control_plane_and_tears_it_down():
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}   # "no cluster configured"
    proc = subprocess.run([sys.executable, "-m", "tests.support.demo", "--once"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "starting a local control plane" in out
    assert "foobar" in out and "observedGeneration: 1" in out
    # Its Pod runs on a fake Node: the sample is Available, its password from the Secret.
    assert "reason: Available" in out and "1/1 replicas ready" in out, out[-3000:]
    assert "Running" in out and "kwok-node-" in out, out[-3000:]
    assert "creating the Secret foobar-db" in out
    assert "/metrics" in out and "/readyz" in out
    assert "stopped exit_code=0" in out          # the operator shut down gracefully
    assert "tearing down the control plane" in out
    assert "Traceback" not in out
