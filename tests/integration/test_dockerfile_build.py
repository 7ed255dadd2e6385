"""The user-facing Dockerfile, built for real by a Dockerfile builder, equals `make image`'s image.

image/check_dockerfile.sh builds it with `podman build` (RUN steps and all) on a
bookworm base made from Debian's packages, since the digest-pinned Docker Hub
base cannot be pulled here, and compares every file (mode, owner, size, and the
bytecode's bytes) and the image config with localhost/my-controller:VERSION,
which `make test` builds first (`make image`). A missing tool or image fails
the test with the reason; nothing is skipped.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(900)     # a cold builder base is made with mmdebstrap first


def test_the_dockerfile_builds_the_image_make_image_builds():
    proc = subprocess.run([str(ROOT / "image" / "check_dockerfile.sh")], capture_output=True,
                          text=True, timeout=880)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "the Dockerfile builds the same image as make image" in proc.stderr
