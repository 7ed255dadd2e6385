"""A throw-away test PKI made with /usr/bin/openssl, once per test session.

    from tests.support.certs import test_pki
    pki = test_pki()
    pki.ca_cert            # path of the CA certificate (PEM)
    pki.ca_pem             # its bytes
    pki.server             # Leaf: 127.0.0.1 + localhost SANs, valid, signed by the CA
    pki.client             # Leaf: CN=test-admin, O=system:masters (clientAuth)
    pki.expired            # Leaf: server cert for 127.0.0.1 whose validity ended in 2020
    pki.wrong_san          # Leaf: server cert for wrong.example.com only
    pki.other_ca_cert      # a second, unrelated CA: trusting it must fail against `server`

Each `Leaf` has `cert` / `key` (paths) and `cert_pem` / `key_pem` (bytes).
Keys are P-256 (fast to make). Files live in a temporary directory removed at
interpreter exit. Nothing here is secret, and nothing may be used outside tests.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

__all__ = ["Leaf", "TestPKI", "test_pki", "CLIENT_CN", "CLIENT_ORG"]

OPENSSL = "/usr/bin/openssl"
CLIENT_CN = "test-admin"
CLIENT_ORG = "system:masters"


@dataclass(frozen=True)
class Leaf:
    cert: str
    key: str

    @property
    def cert_pem(self) -> bytes:
        with open(self.cert, "rb") as f:
            return f.read()

    @property
    def key_pem(self) -> bytes:
        with open(self.key, "rb") as f:
            return f.read()


@dataclass(frozen=True)
class TestPKI:
    __test__ = False  # not a pytest test class, despite the name

    directory: str
    ca_cert: str
    ca_key: str
    other_ca_cert: str
    server: Leaf
    client: Leaf
    expired: Leaf
    wrong_san: Leaf

    @property
    def ca_pem(self) -> bytes:
        with open(self.ca_cert, "rb") as f:
            return f.read()

    @property
    def other_ca_pem(self) -> bytes:
        with open(self.other_ca_cert, "rb") as f:
            return f.read()


def _run(*args: str, cwd: str) -> None:
    proc = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _write(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    return path


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _make_ca(d: str, name: str, cn: str) -> tuple[str, str]:
    _run("req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.crt",
         "-subj", f"/CN={cn}", "-days", "3650",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    return os.path.join(d, f"{name}.crt"), os.path.join(d, f"{name}.key")


def _leaf_ext(d: str, name: str, *, san: str | None, usage: str) -> str:
    lines = ["basicConstraints=critical,CA:FALSE",
             "keyUsage=critical,digitalSignature",
             f"extendedKeyUsage={usage}"]
    if san:
        lines.append(f"subjectAltName={san}")
    return _write(d, f"{name}.ext", "\n".join(lines) + "\n")


def _make_leaf(d: str, name: str, subj: str, *, san: str | None, usage: str) -> Leaf:
    _run("req", "-new", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", subj, cwd=d)
    ext = _leaf_ext(d, name, san=san, usage=usage)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "365", "-sha256", "-extfile", ext,
         "-out", f"{name}.crt", cwd=d)
    return Leaf(os.path.join(d, f"{name}.crt"), os.path.join(d, f"{name}.key"))


def _make_expired_leaf(d: str, name: str) -> Leaf:
    # `openssl x509 -days` cannot go backwards; `openssl ca` takes explicit dates.
    _run("req", "-new", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", "/CN=expired-server", cwd=d)
    ext = _leaf_ext(d, name, san="IP:127.0.0.1,DNS:localhost", usage="serverAuth")
    _write(d, "index.txt", "")
    _write(d, "serial", "1000\n")
    conf = _write(d, "ca.cnf", "[ca]\ndefault_ca = ca_default\n[ca_default]\n"
                  "database = index.txt\nnew_certs_dir = .\nserial = serial\n"
                  "default_md = sha256\npolicy = policy_any\n"
                  "[policy_any]\ncommonName = supplied\n")
    _run("ca", "-batch", "-config", conf, "-cert", "ca.crt", "-keyfile", "ca.key",
         "-in", f"{name}.csr", "-out", f"{name}.crt", "-notext",
         "-startdate", "20200101000000Z", "-enddate", "20200102000000Z",
         "-extfile", ext, cwd=d)
    return Leaf(os.path.join(d, f"{name}.crt"), os.path.join(d, f"{name}.key"))


@functools.lru_cache(maxsize=None)
def test_pki() -> TestPKI:
    """Make the PKI on first call; later calls (in the same process) return it."""
    d = tempfile.mkdtemp(prefix="k8s-http-pki-")
    atexit.register(shutil.rmtree, d, True)
    ca_cert, ca_key = _make_ca(d, "ca", "k8s-http test CA")
    other_ca_cert, _ = _make_ca(d, "other-ca", "unrelated test CA")
    server = _make_leaf(d, "server", "/CN=kube-apiserver",
                        san="IP:127.0.0.1,DNS:localhost", usage="serverAuth")
    client = _make_leaf(d, "client", f"/O={CLIENT_ORG}/CN={CLIENT_CN}",
                        san=None, usage="clientAuth")
    wrong_san = _make_leaf(d, "wrong-san", "/CN=wrong.example.com",
                           san="DNS:wrong.example.com", usage="serverAuth")
    expired = _make_expired_leaf(d, "expired")
    return TestPKI(directory=d, ca_cert=ca_cert, ca_key=ca_key, other_ca_cert=other_ca_cert,
                   server=server, client=client, expired=expired, wrong_san=wrong_san)


test_pki.__test__ = False  # type: ignore[attr-defined]  # not a pytest test function
