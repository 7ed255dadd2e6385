"""TLS material: the client `SSLContext`, its CA and its in-memory client key.

Private keys stay in memory; `ssl` can only load them from a file, so one
lives on disk in a private 0600 file for the duration of a single
`load_cert_chain` call.
"""

from __future__ import annotations

import os
import ssl
import tempfile

from .configerror import ConfigError

__all__ = ["load_ca", "build_ssl_context", "load_client_cert"]

# Directories tried, in order, for the short-lived client-key file: /dev/shm is
# memory-backed (the key never reaches a disk) and stays writable under a
# read-only root filesystem. Tests replace this list.
_KEY_FILE_DIRS = ["/dev/shm", None]  # None = tempfile.gettempdir()

def load_ca(ctx: ssl.SSLContext, ca_data: bytes, where: str) -> None:
    fix = "it must hold PEM certificates (-----BEGIN CERTIFICATE-----)"
    try:
        ctx.load_verify_locations(cadata=ca_data.decode("ascii"))
    except (UnicodeDecodeError, ssl.SSLError, ValueError):
        raise ConfigError(where, "the certificate authority is not a valid PEM certificate",
                          fix) from None


def build_ssl_context(ca_data: bytes | None, insecure: bool,
                      cert_pair: tuple[bytes, bytes] | None, where: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure:
        # Reached only when a kubeconfig says insecure-skip-tls-verify: true.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.check_hostname = True
        ctx.verify_mode = ssl.CERT_REQUIRED
        if ca_data:
            load_ca(ctx, ca_data, where)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_pair is not None:
        load_client_cert(ctx, *cert_pair, where)
    return ctx


class _NoPassword(Exception):
    pass


def _refuse_password():
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
    raise _NoPassword


def load_client_cert(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, where: str) -> None:
    """load_cert_chain from memory: a 0600 file in a fresh 0700 dir, removed at once."""
    private_dir = None
    for parent in _KEY_FILE_DIRS:
        try:
            private_dir = tempfile.mkdtemp(prefix="k8s-http-", dir=parent)   # mode 0700
            break
        except OSError:
            continue
    if private_dir is None:
        raise ConfigError(where, "no writable directory to load the client key from",
                          "mount a writable /tmp (an emptyDir) or /dev/shm")
    try:
        fd, path = tempfile.mkstemp(suffix=".pem", dir=private_dir)   # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(cert_pem.rstrip(b"\n") + b"\n" + key_pem)
            ctx.load_cert_chain(path, password=_refuse_password)
        except _NoPassword:
            raise ConfigError(where, "the client key is encrypted with a passphrase",
                              "decrypt it (openssl pkey -in key.pem -out plain.pem)") from None
        except ssl.SSLError:   # before OSError, its base class
            raise ConfigError(where, "the client certificate and key are not valid PEM or do "
                              "not match", "check client-certificate and client-key") from None
        except OSError as e:
            raise ConfigError(where, f"cannot write the client key file ({e.strerror})",
                              f"make {os.path.dirname(private_dir)} writable") from None
        finally:
            os.unlink(path)
    finally:
        os.rmdir(private_dir)
