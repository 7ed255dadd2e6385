"""pip install footprint: the package installed from wheels into a clean virtualenv.

    .venv/bin/python -m bench footprint            # prints a markdown report
    .venv/bin/python -m bench footprint --write    # and writes bench/RESULTS.footprint.md

How the package installs outside the image (the image itself is measured by
bench/image_footprint.py). Steps: build our wheel and the dependencies' wheels from
the repository (`pip wheel`), create a fresh virtualenv, install from those
wheels only (`--no-index`), then measure what landed in site-packages, with
and without the installer (pip, setuptools) that the image removes, and how
long `my-controller --help` takes to start with and without bytecode.

tests/integration/test_install.py uses the same functions and checks the
outcome (exact package list, the console script works).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.footprint.md"
# What pip, setuptools and a venv bring along; the image removes them.
INSTALLER_DISTS = ("pip", "setuptools", "wheel", "_distutils_hack", "pkg_resources",
                   "distutils-precedence.pth")


class InstallError(RuntimeError):
    pass


def _run(argv, *, env=None, timeout=600, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd)
    if proc.returncode != 0:
        raise InstallError(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def build_wheels(dest: pathlib.Path, python: str = sys.executable) -> list[pathlib.Path]:
    """`pip wheel --wheel-dir dest <repo>`: our wheel plus the dependencies' wheels."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    # Build from a copy of the sources the Dockerfile copies, as the image does:
    # a build in the work tree would leave build/ and *.egg-info behind.
    src = dest.parent / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "controller.py"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    for package in ("k8s_http", "my"):
        shutil.copytree(ROOT / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([python, "-m", "pip", "wheel", "--quiet", "--wheel-dir", dest, src], env=env)
    return sorted(dest.glob("*.whl"))


def make_venv(where: pathlib.Path, wheels: pathlib.Path, *, compile_bytecode: bool = True
              ) -> pathlib.Path:
    """A fresh venv with my-controller installed from `wheels` only; returns its python."""
    _run([sys.executable, "-m", "venv", where])
    python = where / "bin" / "python"
    argv = [python, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-index",
            "--disable-pip-version-check", "--find-links", wheels, "my-controller"]
    if not compile_bytecode:
        argv.insert(5, "--no-compile")
    _run(argv)
    return python


def site_packages(python: pathlib.Path) -> pathlib.Path:
    out = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return pathlib.Path(out.stdout.strip())


def installed(python: pathlib.Path) -> dict[str, str]:
    """{canonical name: version} of what `pip list` shows."""
    out = _run([python, "-m", "pip", "list", "--format", "freeze", "--disable-pip-version-check"])
    result = {}
    for line in out.stdout.splitlines():
        name, _, version = line.partition("==")
        result[re.sub(r"[-_.]+", "-", name).lower()] = version
    return result


def tree_bytes(path: pathlib.Path, *, skip=()) -> int:
    total = 0
    for entry in path.iterdir():
        if any(entry.name == s or entry.name.startswith(s + "-") for s in skip):
            continue
        if entry.is_dir() and not entry.is_symlink():
            total += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        elif entry.is_file():
            total += entry.stat().st_size
    return total


def by_distribution(sp: pathlib.Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for entry in sp.iterdir():
        name = re.sub(r"-[0-9].*\.dist-info$", "", entry.name).removesuffix(".py")
        name = {"_yaml": "yaml", "controller": "k8s_http + controller.py",
                "__pycache__": "k8s_http + controller.py",   # controller.py's bytecode
                "k8s_http": "k8s_http + controller.py", "my_controller": "k8s_http + controller.py",
                "my": "k8s_http + controller.py",            # the My package beside it
                "PyYAML": "yaml", "prometheus_client": "prometheus_client"}.get(name, name)
        size = (sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
                if entry.is_dir() else entry.stat().st_size)
        sizes[name] = sizes.get(name, 0) + size
    return sizes


def startup_seconds(script: pathlib.Path, *, runs: int = 5, env_extra=None) -> float:
    """Median wall time of `my-controller --help` (import of everything + argparse)."""
    env = {**os.environ, **(env_extra or {})}
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        _run([script, "--help"], env=env)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure() -> dict:
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        tmp = pathlib.Path(tmp)
        wheels = tmp / "wheels"
        wheels.mkdir()
        built = build_wheels(wheels)
        python = make_venv(tmp / "venv", wheels)
        sp = site_packages(python)
        # Sizes as the image has them: bytecode included.
        total, runtime = tree_bytes(sp), tree_bytes(sp, skip=INSTALLER_DISTS)
        sizes = by_distribution(sp)
        bytecode = sum(f.stat().st_size for f in sp.rglob("*.pyc")
                       if not f.relative_to(sp).parts[0].startswith(INSTALLER_DISTS))
        script = python.parent / "my-controller"
        with_pyc = startup_seconds(script)
        for cache in list(sp.rglob("__pycache__")):
            shutil.rmtree(cache)
        # As on a read-only root filesystem: nothing cached, nothing written.
        without_pyc = startup_seconds(script, env_extra={"PYTHONDONTWRITEBYTECODE": "1"})
        return {
            "wheels": {w.name: w.stat().st_size for w in built},
            "packages": installed(python),
            "total": total,
            "runtime": runtime,
            "runtime_bytecode": bytecode,
            "by_distribution": sizes,
            "startup_with_pyc": with_pyc,
            "startup_without_pyc": without_pyc,
            "python": platform.python_version(),
        }


def report(m: dict) -> str:
    mb = lambda n: f"{n / 1e6:.2f} MB"  # noqa: E731
    today = dt.date.today().isoformat()
    lines = [
        "# pip install footprint (outside the image)",
        "",
        f"Measured {today} on Python {m['python']} ({platform.machine()}), with",
        "`.venv/bin/python -m bench footprint --write`: the package installed with pip",
        "in a clean virtualenv (wheels built by `pip wheel` from the repository,",
        "installed with `--no-index --no-cache-dir`). The image is measured in the",
        "section above.",
        "",
        "Sizes are bytes of files (not disk blocks), bytecode included as installed.",
        "",
        "| what | size |",
        "|---|---|",
        f"| site-packages, everything | {mb(m['total'])} |",
        f"| site-packages without pip/setuptools | {mb(m['runtime'])} |",
        f"| &nbsp;&nbsp;of which precompiled bytecode (.pyc) | {mb(m['runtime_bytecode'])} |",
        "| by distribution (with bytecode): | |",
    ]
    for name, size in sorted(m["by_distribution"].items(), key=lambda kv: -kv[1]):
        if size >= 50_000:
            lines.append(f"| &nbsp;&nbsp;{name} | {mb(size)} |")
    lines += ["", "Wheels:", ""]
    lines += [f"- `{name}`: {size / 1e3:.0f} kB" for name, size in sorted(m["wheels"].items())]
    lines += ["", "`pip list` in the fresh venv: " + ", ".join(
        f"{k} {v}" for k, v in sorted(m["packages"].items())), ""]
    lines += [
        "Start-up (`my-controller --help`, median of 5; imports the whole runtime):",
        "",
        f"- bytecode precompiled at install: {m['startup_with_pyc']:.2f} s",
        f"- no bytecode, PYTHONDONTWRITEBYTECODE=1 (read-only root FS without precompiling): "
        f"{m['startup_without_pyc']:.2f} s",
        "",
        "(The stdlib's bytecode stays cached in both; bench/image_footprint.py removes",
        "that too for the `python:3.11-slim` comparison.)",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS}")
    args = parser.parse_args(argv)
    text = report(measure())
    print(text)
    if args.write:
        RESULTS.write_text(text)
    return 0
