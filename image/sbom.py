#!/usr/bin/env python3
"""The image's SBOM, SPDX 2.3 JSON, from what its root filesystems hold.

    image/sbom.py OUT.spdx.json DIGESTS SOURCE_DATE_EPOCH KEY=VALUE... -- ROOTFS-ARCH...

Written by image/build.sh beside the OCI archive. DIGESTS is oci_index.py's
output ("linux/ARCH sha256:..." per platform, "index sha256:..."); the
KEY=VALUE pairs are the image's OCI annotations. Each ROOTFS-ARCH (a directory
named rootfs-amd64, rootfs-arm64) is read as a scanner reads the image: the
Debian packages from var/lib/dpkg/status.d/, the Python distributions from
their dist-info METADATA, the operator from its own files. One document: the
index CONTAINS one image per platform, each CONTAINS its packages. No clock, no
random: the same build gives the same bytes (created is SOURCE_DATE_EPOCH, the
namespace names the index digest). Standard library only.
"""

from __future__ import annotations

import datetime
import email.parser
import json
import pathlib
import re
import sys
import urllib.parse

SITE = "usr/lib/python3/dist-packages"
SPDX_EXPRESSION = re.compile(r"[A-Za-z0-9.+-]+( (AND|OR|WITH) [A-Za-z0-9.+-]+)*")


def control_fields(text: str) -> dict[str, str]:
    """A deb822 paragraph's fields (continuation lines dropped: none is needed here)."""
    fields = {}
    for line in text.splitlines():
        if line[:1] not in (" ", "\t") and ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def spdx_id(*parts: str) -> str:
    return "SPDXRef-" + "-".join(re.sub(r"[^A-Za-z0-9.-]", ".", p) for p in parts)


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe=".-_~")


def package(pid: str, name: str, version: str, *, purl: str, supplier: str = "NOASSERTION",
            license_declared: str = "NOASSERTION", comment: str = "") -> dict:
    pkg = {"SPDXID": pid, "name": name, "versionInfo": version, "supplier": supplier,
           "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
           "licenseConcluded": "NOASSERTION", "licenseDeclared": license_declared,
           "copyrightText": "NOASSERTION",
           "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                             "referenceLocator": purl}]}
    if comment:
        pkg["comment"] = comment
    return pkg


def debian_packages(root: pathlib.Path, arch: str) -> list[dict]:
    out = []
    for path in sorted((root / "var/lib/dpkg/status.d").iterdir()):
        if path.name.endswith(".md5sums"):
            continue
        f = control_fields(path.read_text())
        name, version = f["Package"], f["Version"]
        maintainer = f.get("Maintainer", "")
        who = re.fullmatch(r"(.*?)\s*<(.*)>", maintainer)
        supplier = f"Organization: {who[1]} ({who[2]})" if who else "NOASSERTION"
        qualifiers = f"arch={f.get('Architecture', arch)}&distro=debian-12"
        source = f.get("Source", "").split(" ")[0]
        if source and source != name:
            qualifiers += f"&upstream={quote(source)}"
        copyright_file = root / "usr/share/doc" / name / "copyright"
        out.append(package(
            spdx_id(arch, "deb", name), name, version, supplier=supplier,
            purl=f"pkg:deb/debian/{quote(name)}@{quote(version)}?{qualifiers}",
            comment=(f"licence terms: /usr/share/doc/{name}/copyright"
                     if copyright_file.exists() else "")))
    return out


def python_packages(root: pathlib.Path, arch: str) -> list[dict]:
    out = []
    for metadata in sorted((root / SITE).glob("*.dist-info/METADATA")):
        meta = email.parser.Parser().parsestr(metadata.read_text(), headersonly=True)
        name, version = meta["Name"], meta["Version"]
        licence = meta.get("License-Expression") or meta.get("License") or ""
        normal = re.sub(r"[-_.]+", "-", name).lower()
        out.append(package(
            spdx_id(arch, "pypi", normal), normal, version,
            license_declared=licence if SPDX_EXPRESSION.fullmatch(licence) else "NOASSERTION",
            purl=f"pkg:pypi/{normal}@{quote(version)}"))
    return out


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    out, digests_file, epoch, *pairs = argv[:sep]
    roots = [pathlib.Path(r) for r in argv[sep + 1:]]
    ann = dict(pair.split("=", 1) for pair in pairs)
    digests = dict(line.split() for line in pathlib.Path(digests_file).read_text().splitlines())
    name, version = ann["org.opencontainers.image.title"], ann["org.opencontainers.image.version"]
    index_hex = digests["index"].split(":", 1)[1]
    created = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)

    def image(pid: str, checksum: str, purpose_comment: str, qualifiers: str = "") -> dict:
        pkg = package(pid, name, version, license_declared=ann["org.opencontainers.image.licenses"],
                      purl=f"pkg:oci/{name}@{quote(checksum)}{qualifiers}", comment=purpose_comment)
        pkg["primaryPackagePurpose"] = "CONTAINER"
        pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksum.split(":", 1)[1]}]
        if ann.get("org.opencontainers.image.source"):
            pkg["downloadLocation"] = "git+" + ann["org.opencontainers.image.source"] + \
                "@" + ann["org.opencontainers.image.revision"]
        return pkg

    packages = [image("SPDXRef-index", digests["index"], "the OCI image index (its digest)")]
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                      "relatedSpdxElement": "SPDXRef-index"}]
    for root in roots:
        arch = root.name.rsplit("-", 1)[1]
        pid = spdx_id("image", arch)
        packages.append(image(pid, digests[f"linux/{arch}"], f"the linux/{arch} image (its manifest digest)",
                              f"?arch={arch}"))
        relationships.append({"spdxElementId": "SPDXRef-index", "relationshipType": "CONTAINS",
                              "relatedSpdxElement": pid})
        operator = package(spdx_id(arch, "operator"), name, version,
                           license_declared=ann["org.opencontainers.image.licenses"],
                           purl=f"pkg:generic/{name}@{quote(version)}",
                           comment=f"the operator: /{SITE}/controller.py, /{SITE}/k8s_http/, /{SITE}/my/")
        for pkg in [operator, *debian_packages(root, arch), *python_packages(root, arch)]:
            packages.append(pkg)
            relationships.append({"spdxElementId": pid, "relationshipType": "CONTAINS",
                                  "relatedSpdxElement": pkg["SPDXID"]})
    document = {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{name}-{version}",
        "documentNamespace": f"https://spdx.org/spdxdocs/{name}-{version}-{index_hex}",
        "creationInfo": {"created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "creators": ["Tool: my-controller-image-sbom.py"]},
        "packages": packages, "relationships": relationships,
    }
    pathlib.Path(out).write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
