"""What a platform team's scan sees in the image (`make image`: build/my-controller-VERSION.oci.tar).

A real scanner reads the archive: syft v1.57.2 (built from the Go module proxy
by `make test`, tests/support/fetch_syft.sh; $SYFT overrides the path). For each
platform of the image index it must name the distribution and list every
`keep` package of image/packages.lock at its exact version, no `drop` package
(their files are gone), and both PyPI packages at the versions of
image/requirements.lock. The SPDX SBOM written beside the archive must list the
same packages, and the archive's index and manifests carry the OCI annotations.
"""

from __future__ import annotations

import configparser
import datetime
import json
import os
import pathlib
import re
import subprocess
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_CFG = configparser.ConfigParser()
_CFG.read(ROOT / "setup.cfg")
VERSION = _CFG["metadata"]["version"]
ARCHIVE = ROOT / "build" / f"my-controller-{VERSION}.oci.tar"
SBOM = ROOT / "build" / f"my-controller-{VERSION}.spdx.json"
SYFT_VERSION = re.search(r"^SYFT_VERSION := (\S+)", (ROOT / "Makefile").read_text(), re.M)[1]
SYFT = os.environ.get("SYFT") or str(
    pathlib.Path.home() / ".cache" / "my-controller" / "tools" / f"syft-{SYFT_VERSION}" / "syft")
PLATFORMS = ["linux/amd64", "linux/arm64"]
MAX_UNCOMPRESSED = 45_000_000

pytestmark = pytest.mark.timeout(300)


def lock(action: str) -> dict[str, str]:
    """name -> version of image/packages.lock's `action` lines."""
    out = {}
    for line in (ROOT / "image" / "packages.lock").read_text().splitlines():
        if line.startswith(action + " "):
            name, _, version = line.split()[1].partition("=")
            out[name] = version
    return out


def python_lock() -> dict[str, str]:
    text = (ROOT / "image" / "requirements.lock").read_text()
    return {m[1].lower(): m[2] for m in re.finditer(r"^([\w-]+)==(\S+)", text, re.M)}


def archive_json(name: str) -> dict:
    with tarfile.open(ARCHIVE) as tar:
        return json.load(tar.extractfile(name))


def index() -> dict:
    (top,) = archive_json("index.json")["manifests"]
    assert top["mediaType"] == "application/vnd.oci.image.index.v1+json"
    return archive_json("blobs/" + top["digest"].replace(":", "/"))


@pytest.fixture(scope="module", params=PLATFORMS)
def syft_listing(request) -> tuple[str, dict]:
    assert ARCHIVE.exists(), f"{ARCHIVE.relative_to(ROOT)} is missing: run `make image`"
    assert os.access(SYFT, os.X_OK), f"no syft at {SYFT}: `make test` builds it (tests/support/fetch_syft.sh)"
    proc = subprocess.run([SYFT, "scan", "-q", "--platform", request.param, "-o", "json",
                           f"oci-archive:{ARCHIVE}"], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return request.param, json.loads(proc.stdout)


def test_syft_lists_every_kept_debian_package_and_both_pypi_packages(syft_listing):
    platform, listing = syft_listing
    arch = platform.split("/")[1]
    assert listing["source"]["metadata"]["architecture"] == arch
    assert listing["distro"]["id"] == "debian" and listing["distro"]["versionID"].split(".")[0] == "12"
    found = {(a["type"], a["name"]): a for a in listing["artifacts"]}
    debs = {name: a["version"] for (kind, name), a in found.items() if kind == "deb"}
    assert debs == lock("keep"), "syft's Debian packages differ from image/packages.lock's keep lines"
    assert not set(debs) & set(lock("drop"))
    for name in debs:
        assert found["deb", name]["metadata"]["architecture"] in (arch, "all")
    pypi = {name: a["version"] for (kind, name), a in found.items() if kind == "python"}
    assert pypi == python_lock()
    # Licences come from the copyright files kept in the image.
    assert {l["value"] for l in found["deb", "zlib1g"]["licenses"]} == {"Zlib"}
    assert {l["value"] for l in found["python", "pyyaml"]["licenses"]} == {"MIT"}
    # The interpreter is the Debian package's file, not an unowned binary.
    assert not [a for a in listing["artifacts"] if a["type"] == "binary"]


def test_the_sbom_lists_what_the_scanner_finds(syft_listing):
    platform, listing = syft_listing
    arch = platform.split("/")[1]
    sbom = json.loads(SBOM.read_text())
    assert sbom["spdxVersion"] == "SPDX-2.3" and sbom["dataLicense"] == "CC0-1.0"
    ids = {p["SPDXID"]: p for p in sbom["packages"]}
    (image_id,) = [i for i, p in ids.items() if p.get("primaryPackagePurpose") == "CONTAINER"
                   and p["externalRefs"][0]["referenceLocator"].endswith(f"?arch={arch}")]
    assert "sha256:" + ids[image_id]["checksums"][0]["checksumValue"] == \
        listing["source"]["metadata"]["manifestDigest"]
    contained = [ids[r["relatedSpdxElement"]] for r in sbom["relationships"]
                 if r["spdxElementId"] == image_id and r["relationshipType"] == "CONTAINS"]
    purls = {p["externalRefs"][0]["referenceLocator"].split("@")[0]: p["versionInfo"] for p in contained}
    scanned = {f"pkg:{'pypi' if a['type'] == 'python' else a['type']}/"
               f"{'debian/' if a['type'] == 'deb' else ''}{a['name']}": a["version"]
               for a in listing["artifacts"]}
    assert purls == {**scanned, "pkg:generic/my-controller": VERSION}


def test_one_index_with_both_platforms_and_the_annotations():
    idx = index()
    platforms = [f"{m['platform']['os']}/{m['platform']['architecture']}" for m in idx["manifests"]]
    assert sorted(platforms) == PLATFORMS
    # The commit the image was built from (make rebuilds it when its inputs
    # change, not at every commit): created is that commit's time.
    revision = idx["annotations"]["org.opencontainers.image.revision"]
    epoch = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct", revision],
                           capture_output=True, text=True)
    assert re.fullmatch(r"[0-9a-f]{40}", revision) and epoch.returncode == 0, revision
    created = datetime.datetime.fromtimestamp(int(epoch.stdout), datetime.timezone.utc)
    expected = {"org.opencontainers.image.version": VERSION,
                "org.opencontainers.image.revision": revision,
                "org.opencontainers.image.created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "org.opencontainers.image.licenses": _CFG["metadata"]["license"]}
    origin = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"],
                            capture_output=True, text=True)
    # build.sh's rule: IMAGE_SOURCE, else the origin remote as an https URL.
    source = os.environ.get("IMAGE_SOURCE") or re.sub(
        r"^git@([^:]*):", r"https://\1/", origin.stdout.strip()).removesuffix(".git")
    for descriptor in [None, *idx["manifests"]]:
        annotations = (idx if descriptor is None else archive_json(
            "blobs/" + descriptor["digest"].replace(":", "/")))["annotations"]
        assert {k: annotations.get(k) for k in expected} == expected
        assert annotations.get("org.opencontainers.image.source", "") == source


def test_each_platform_stays_under_the_size_budget():
    for m in index()["manifests"]:
        manifest = archive_json("blobs/" + m["digest"].replace(":", "/"))
        config = archive_json("blobs/" + manifest["config"]["digest"].replace(":", "/"))
        assert config["architecture"] == m["platform"]["architecture"]
        (layer,) = manifest["layers"]
        with tarfile.open(ARCHIVE) as tar:
            blob = tar.extractfile("blobs/" + layer["digest"].replace(":", "/"))
            with tarfile.open(fileobj=blob, mode="r|gz") as fs:
                size = sum(member.size for member in fs)
        assert size <= MAX_UNCOMPRESSED, f"{m['platform']['architecture']}: {size} bytes of files"
