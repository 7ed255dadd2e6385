"""Install footprint: what a clean virtualenv holds after installing each contender.

Counted: site-packages, less the tools every venv is seeded with (pip,
setuptools, wheel). Bytes are the files' apparent sizes, .pyc caches included
(pip compiles them at install, as a container build would).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .cluster import ROOT

SEED = {"pip", "setuptools", "wheel", "pkg_resources", "_distutils_hack", "distutils-precedence.pth"}
BENCH = ROOT / "bench"
KOPF_VENV = BENCH / ".venv-kopf"
KOPF_REQUIREMENTS = BENCH / "requirements-kopf.txt"


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def _base_python() -> str:
    """A python that is not inside a venv, to make venvs from."""
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_venv(path: Path, requirements: list[str], *, marker: str) -> Path:
    """A venv at `path` with `requirements` (pip args), rebuilt when `marker` changes."""
    stamp = path / ".bench-stamp"
    if stamp.exists() and stamp.read_text() == marker:
        return path
    shutil.rmtree(path, ignore_errors=True)
    print(f"[converge] building {path.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
    _run([_base_python(), "-m", "venv", str(path)])
    _run([str(path / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
          *requirements])
    stamp.write_text(marker)
    return path


def ensure_kopf_venv() -> Path:
    digest = hashlib.sha256(KOPF_REQUIREMENTS.read_bytes()).hexdigest()
    return ensure_venv(KOPF_VENV, ["-r", str(KOPF_REQUIREMENTS)], marker=digest)


def _site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no site-packages under {venv}")
    return found[0]


def _is_seed(name: str) -> bool:
    base = name.split("-", 1)[0].lower() if name.endswith(".dist-info") else name
    return base in SEED or name in SEED


def measure(venv: Path) -> dict:
    site = _site_packages(venv)
    total = 0
    distributions = []
    for entry in site.iterdir():
        if _is_seed(entry.name):
            continue
        if entry.name.endswith(".dist-info"):
            distributions.append(entry.name[:-len(".dist-info")])
        if entry.is_dir():
            for dirpath, _, files in os.walk(entry):
                total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
        else:
            total += entry.stat().st_size
    return {"site_packages_mib": total / 2**20, "distributions": len(distributions),
            "names": sorted(distributions)}


def footprints() -> dict:
    """ours (the project's wheel), kopf (its bench venv), kubernetes (the official client)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="my-controller-wheel-") as tmp:
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
              "--disable-pip-version-check", "-w", tmp, str(ROOT)])
        wheel = next(Path(tmp).glob("*.whl"))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        ours = ensure_venv(BENCH / ".venv-footprint-ours", [str(wheel)], marker=digest)
    out["ours"] = {"installed": wheel.name, **measure(ours)}
    out["kopf"] = {"installed": "kopf (+ kubernetes, for its handlers) from "
                                "bench/requirements-kopf.txt", **measure(ensure_kopf_venv())}
    kube_version = next(line.split("==")[1].strip() for line in
                        KOPF_REQUIREMENTS.read_text().splitlines()
                        if line.startswith("kubernetes=="))
    kube = ensure_venv(BENCH / ".venv-footprint-kubernetes", [f"kubernetes=={kube_version}"],
                       marker=kube_version)
    out["kubernetes"] = {"installed": f"kubernetes=={kube_version}", **measure(kube)}
    return out
