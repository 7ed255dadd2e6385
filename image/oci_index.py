#!/usr/bin/env python3
"""Join single-platform OCI archives into one archive holding an image index.

    image/oci_index.py OUT.tar REF SOURCE_DATE_EPOCH KEY=VALUE... -- ARCHIVE...

Each ARCHIVE is what `podman save --format oci-archive` writes for one image.
OUT.tar is an OCI image layout (as `docker buildx --output type=oci` writes a
multi-platform one) whose index.json names one descriptor, REF, pointing at an
image index with one manifest per platform (taken from each image's config).
The KEY=VALUE annotations go on the index and on every manifest (the manifests
are rewritten for that, so their digests are those of the annotated ones).
The tar is sorted, with fixed owners, modes and mtimes (SOURCE_DATE_EPOCH):
the same inputs give the same bytes. Standard library only.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def canonical(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_archive(path: str) -> tuple[dict, dict[str, bytes]]:
    """(the one manifest, every blob by digest) of a single-image OCI archive."""
    blobs: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        index = json.load(tar.extractfile("index.json"))
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith("blobs/sha256/"):
                blobs["sha256:" + member.name.rsplit("/", 1)[1]] = tar.extractfile(member).read()
    (descriptor,) = index["manifests"]
    if descriptor["mediaType"] != MANIFEST:
        raise SystemExit(f"{path}: not a single image ({descriptor['mediaType']})")
    return json.loads(blobs[descriptor["digest"]]), blobs


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    out, ref, epoch, *pairs = argv[:sep]
    archives = argv[sep + 1:]
    annotations = dict(pair.split("=", 1) for pair in pairs)
    blobs: dict[str, bytes] = {}
    platforms = []
    for path in archives:
        manifest, found = read_archive(path)
        blobs.update((d, found[d]) for d in
                     [manifest["config"]["digest"], *(l["digest"] for l in manifest["layers"])])
        config = json.loads(found[manifest["config"]["digest"]])
        platform = {"architecture": config["architecture"], "os": config["os"]}
        if config.get("variant"):
            platform["variant"] = config["variant"]
        manifest["annotations"] = {**manifest.get("annotations", {}), **annotations}
        data = canonical(manifest)
        blobs[digest(data)] = data
        platforms.append({"mediaType": MANIFEST, "digest": digest(data), "size": len(data),
                          "platform": platform})
    index = canonical({"schemaVersion": 2, "mediaType": INDEX, "manifests": platforms,
                       "annotations": annotations})
    blobs[digest(index)] = index
    top = canonical({"schemaVersion": 2, "manifests": [{
        "mediaType": INDEX, "digest": digest(index), "size": len(index),
        "annotations": {"org.opencontainers.image.ref.name": ref}}]})
    files = {"oci-layout": canonical({"imageLayoutVersion": "1.0.0"}), "index.json": top,
             **{"blobs/sha256/" + d.split(":", 1)[1]: b for d, b in blobs.items()}}
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ["blobs", "blobs/sha256"]:
            tar.addfile(entry(name, int(epoch), directory=True))
        for name in sorted(files):
            tar.addfile(entry(name, int(epoch), size=len(files[name])), io.BytesIO(files[name]))
    for p in platforms:
        arch = p["platform"]["architecture"]
        print(f"{p['platform']['os']}/{arch} {p['digest']}")
    print(f"index {digest(index)}")


def entry(name: str, mtime: int, *, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode, info.size, info.mtime = (0o755 if directory else 0o644), size, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


if __name__ == "__main__":
    main(sys.argv[1:])
