"""helm v4 for the chart tests: $HELM (set by `make test`), else the build
tests/support/fetch_helm.sh made in ~/.cache/my-controller/tools for
HELM_VERSION. Runs get their own config, cache and data directories, so no
user repository or plugin of this machine's helm takes part.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

HELM_VERSION = "v4.3.2"
TOOLS = pathlib.Path(os.environ.get("MY_CONTROLLER_CACHE")
                     or pathlib.Path.home() / ".cache" / "my-controller") / "tools"
ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "my-controller"
HOW = (f"`make helm` builds helm {HELM_VERSION} (or run tests/support/fetch_helm.sh "
       f"{TOOLS}), or set HELM to a helm v4 binary")


def find_helm() -> str | None:
    for candidate in (os.environ.get("HELM"), str(TOOLS / f"helm-{HELM_VERSION}" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_helm(helm: str, home: pathlib.Path, *args: str, check: bool = True,
             timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")
           and k != "KUBECONFIG"}
    for name in ("CONFIG", "CACHE", "DATA"):
        env[f"HELM_{name}_HOME"] = str(home / name.lower())
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc
