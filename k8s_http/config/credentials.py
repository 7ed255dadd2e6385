"""Credential sources: where the bearer token (or exec-issued certificate) comes from.

Credentials are live objects (`CredentialSource`): bound service-account
tokens rotate and exec plugins mint short-lived tokens, so the transport asks
for the token on every request and calls `invalidate()` after a 401.
Tokens never appear in `repr()`, exception messages or logs.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from .configerror import ConfigError, CredentialError, clip

__all__ = ["CredentialSource", "StaticToken", "TokenFile", "ExecCredential",
           "is_valid_token", "EXEC_API_VERSIONS"]

log = logging.getLogger(__name__)

# The kubelet rewrites a projected service-account token once it is 80 % through
# its lifetime (or a day old); client-go re-reads the file every minute, and so do we.
TOKEN_FILE_RELOAD_SECONDS = 60.0

# An exec plugin that hangs (waiting on a browser, a dead network) must not
# hold every request forever; kubectl has no limit, an operator needs one.
EXEC_TIMEOUT_SECONDS = 60.0

# Re-run an exec plugin this long before its credential expires, so a request
# is not sent with a token that dies in flight (the 401 retry covers the rest).
EXEC_EXPIRY_SKEW_SECONDS = 10.0

# The plugin's stderr is evidence for the error message, not a log file.
MAX_STDERR_CHARS = 300

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")

def is_valid_token(token: str) -> bool:
    # Visible ASCII only. Anything else would be refused by http.client with a
    # ValueError that quotes the header value, i.e. the token, so reject it here.
    return bool(token) and all("!" <= c <= "~" for c in token)

class CredentialSource:
    """Where the bearer token (or exec-issued client certificate) comes from.

    Implementations are thread-safe: the transport calls them from every
    worker thread.
    """

    def token(self) -> str | None:
        """The current bearer token, or None if this source only gives a certificate."""
        return None

    def client_cert(self) -> tuple[bytes, bytes] | None:
        """(certificate PEM, key PEM) to present in the TLS handshake, or None."""
        return None

    def invalidate(self) -> None:
        """The server rejected the credential (401): fetch a fresh one on next use."""


class StaticToken(CredentialSource):
    """A token written inline in the kubeconfig: nothing to refresh."""

    def __init__(self, token: str):
        self._token = token

    def token(self) -> str | None:
        return self._token

    def __repr__(self) -> str:
        return "StaticToken(<redacted>)"


class TokenFile(CredentialSource):
    """A token read from a file, re-read every `reload_seconds` and after `invalidate()`.

    If a re-read fails (the kubelet swaps the file with a rename, a window can
    exist) the last good token is kept, as client-go does; only a first read
    that fails is an error.
    """

    def __init__(self, path: str, reload_seconds: float = TOKEN_FILE_RELOAD_SECONDS, *,
                 clock=time.monotonic):
        self.path = path
        self._reload_seconds = reload_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None   # last good token; None until the first read
        self._read_at = 0.0              # clock() of the last read attempt
        self._stale = True               # invalidate() was called, or never read

    def token(self) -> str | None:
        with self._lock:
            now = self._clock()
            if self._stale or now - self._read_at >= self._reload_seconds:
                self._reload_locked(now)
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._stale = True

    def _reload_locked(self, now: float) -> None:
        self._read_at = now
        self._stale = False
        try:
            with open(self.path, "rb") as f:
                text = f.read().decode("utf-8").strip()
            if not text:
                raise ValueError("the file is empty")
            if not is_valid_token(text):
                raise ValueError("the file holds more than a bearer token")
        except (OSError, ValueError) as e:
            problem = getattr(e, "strerror", None) or str(e)
            if self._token is not None:
                log.warning("token file %s: re-read failed; keeping the previous token",
                            self.path, extra={"error": problem})
                return
            raise CredentialError(f"token file {self.path}", f"cannot read the token: {problem}",
                                  "make the file exist, be readable, and hold a bearer token"
                                  ) from None
        self._token = text

    def __repr__(self) -> str:
        return f"TokenFile({self.path!r})"


@dataclass(frozen=True)
class _IssuedCredential:
    token: str | None
    cert_pem: bytes | None
    key_pem: bytes | None
    expires_at: float | None   # wall-clock seconds since the epoch; None = until a 401


class ExecCredential(CredentialSource):
    """A client-go credential plugin (``users[].user.exec``), run without a terminal.

    The plugin gets the environment, the configured `env` entries and
    ``KUBERNETES_EXEC_INFO`` (spec.interactive false, as kubectl sends when it
    has no terminal), no stdin, and `timeout_seconds` to print an
    ExecCredential on stdout. The result is cached until its
    expirationTimestamp (or forever if it has none) and re-fetched after
    `invalidate()`. The lock is held while the plugin runs, so concurrent
    callers wait for one run instead of starting many.

    `wall_clock` is a wall clock (time.time), not a monotonic one, because
    expirationTimestamp is an absolute time.
    """

    def __init__(self, command: str, args=(), *, api_version: str, env=(),
                 interactive_mode: str | None = None, install_hint: str = "",
                 cluster_info: dict | None = None, base_env: Mapping[str, str] = os.environ,
                 where: str = "exec plugin", timeout_seconds: float = EXEC_TIMEOUT_SECONDS,
                 wall_clock=time.time):
        self.command = command
        self.args = list(args)
        self.api_version = api_version
        self._where = where
        if api_version not in EXEC_API_VERSIONS:
            raise ConfigError(where, f"exec apiVersion {api_version!r} is not supported",
                              f"use one of: {', '.join(EXEC_API_VERSIONS)}")
        if interactive_mode is None:
            # v1 made the field required; v1beta1 defaulted it (client-go defaults.go).
            if api_version.endswith("/v1"):
                raise ConfigError(where, f"exec.interactiveMode is required for {api_version}",
                                  "set exec.interactiveMode: Never (or IfAvailable)")
            interactive_mode = "IfAvailable"
        if interactive_mode not in EXEC_INTERACTIVE_MODES:
            raise ConfigError(where, f"exec.interactiveMode {interactive_mode!r} is not valid",
                              "use Never or IfAvailable")
        if interactive_mode == "Always":
            # An operator refreshes credentials from background threads: there is
            # never a terminal to prompt on, so such a plugin could never succeed.
            raise ConfigError(where, f"exec plugin {command!r} has interactiveMode Always, "
                              "but this program runs plugins without a terminal",
                              "use a plugin (or plugin flags) that works non-interactively and "
                              "set interactiveMode: Never or IfAvailable")
        self.interactive_mode = interactive_mode
        self._install_hint = install_hint
        self._env = dict(base_env)
        for name, value in env:
            self._env[name] = value
        spec: dict = {"interactive": False}
        if cluster_info is not None:
            spec["cluster"] = cluster_info
        self._env["KUBERNETES_EXEC_INFO"] = json.dumps(
            {"apiVersion": api_version, "kind": "ExecCredential", "spec": spec})
        self._timeout_seconds = timeout_seconds
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._issued: _IssuedCredential | None = None   # None: run the plugin on next use

    def token(self) -> str | None:
        return self._current().token

    def client_cert(self) -> tuple[bytes, bytes] | None:
        issued = self._current()
        if issued.cert_pem is None or issued.key_pem is None:
            return None
        return issued.cert_pem, issued.key_pem

    def invalidate(self) -> None:
        with self._lock:
            self._issued = None

    def _current(self) -> _IssuedCredential:
        with self._lock:
            if not self._is_fresh_locked():
                self._issued = self._run_locked()
            return self._issued

    def _is_fresh_locked(self) -> bool:
        issued = self._issued
        if issued is None:
            return False
        if issued.expires_at is None:
            return True
        return self._wall_clock() < issued.expires_at - EXEC_EXPIRY_SKEW_SECONDS

    def _fail(self, problem: str, fix: str) -> CredentialError:
        return CredentialError(self._where, f"exec plugin {self.command!r} {problem}", fix)

    def _run_locked(self) -> _IssuedCredential:
        try:
            proc = subprocess.run([self.command, *self.args], env=self._env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=self._timeout_seconds,
                                  check=False)
        except FileNotFoundError:
            raise self._fail("was not found", self._install_hint or
                             "install it, or fix users[].user.exec.command") from None
        except subprocess.TimeoutExpired:
            raise self._fail(f"did not finish within {self._timeout_seconds:g} s",
                             "check that it works without a terminal and can reach its issuer"
                             ) from None
        except OSError as e:
            raise self._fail(f"could not be started: {e.strerror}",
                             "check that the command is an executable file") from None
        if proc.returncode != 0:
            # stderr is the plugin's own explanation; stdout may hold a token, never shown.
            stderr = clip(proc.stderr.decode("utf-8", "replace"), MAX_STDERR_CHARS)
            raise self._fail(f"exited with status {proc.returncode}"
                             + (f": {stderr}" if stderr else ""),
                             "run it by hand to see why, and fix its configuration")
        return self._parse(proc.stdout)

    def _parse(self, stdout: bytes) -> _IssuedCredential:
        fix = "the plugin must print an ExecCredential object as JSON on stdout"
        try:
            obj = json.loads(stdout)
        except (ValueError, RecursionError):
            raise self._fail("printed something that is not JSON", fix) from None
        if not isinstance(obj, dict) or obj.get("kind") != "ExecCredential":
            raise self._fail("did not print an ExecCredential", fix)
        if obj.get("apiVersion") != self.api_version:
            got = clip(repr(obj.get("apiVersion")), 80)
            raise self._fail(f"answered with apiVersion {got}, expected {self.api_version}",
                             "set exec.apiVersion to the version the plugin speaks")
        status = obj.get("status")
        if not isinstance(status, dict):
            raise self._fail("printed an ExecCredential without a status", fix)
        token = status.get("token") or None
        cert = status.get("clientCertificateData") or None
        key = status.get("clientKeyData") or None
        for name, value in (("token", token), ("clientCertificateData", cert),
                            ("clientKeyData", key)):
            if value is not None and not isinstance(value, str):
                raise self._fail(f"returned a status.{name} that is not a string", fix)
        if (cert is None) != (key is None):
            raise self._fail("returned only one of clientCertificateData and clientKeyData",
                             "the plugin must return both, or a token")
        if token is None and cert is None:
            raise self._fail("returned neither a token nor a client certificate", fix)
        if token is not None and not is_valid_token(token):
            raise self._fail("returned a token with spaces or non-ASCII characters", fix)
        expires_at = None
        stamp = status.get("expirationTimestamp")
        if stamp:
            expires_at = _parse_rfc3339(stamp)
            if expires_at is None:
                raise self._fail(f"returned an expirationTimestamp that is not RFC 3339: "
                                 f"{clip(repr(stamp), 60)}", fix)
        return _IssuedCredential(token, cert.encode() if cert else None,
                                 key.encode() if key else None, expires_at)

    def __repr__(self) -> str:
        return f"ExecCredential(command={self.command!r}, api_version={self.api_version!r})"


def _parse_rfc3339(value) -> float | None:
    """Seconds since the epoch, or None unless `value` is an RFC 3339 time with an offset."""
    if not isinstance(value, str):
        return None
    try:
        # Python 3.11 reads "Z" and any number of fractional digits.
        stamp = _dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None
    return stamp.timestamp()
