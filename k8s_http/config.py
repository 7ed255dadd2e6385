"""Cluster configuration: where the apiserver is, how to trust it, who we are.

`load_config()` follows controller-runtime's order: an explicit kubeconfig,
then `$KUBECONFIG`, then the in-cluster service account, then
`~/.kube/config`. Everything that can be checked is checked at load time, so
a misconfiguration is one `ConfigError` line naming the file and the fix
(the command line prints it and exits 2), never a traceback mid-run.

Credentials are live objects (`CredentialSource`): bound service-account
tokens rotate and exec plugins mint short-lived tokens, so the transport asks
for the token on every request and calls `invalidate()` after a 401.

Secrets (tokens, private keys) never appear in `repr()`, exception messages
or logs. Private keys stay in memory; `ssl` can only load them from a file, so
one lives on disk in a private 0600 file for the duration of a single
`load_cert_chain` call.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import ipaddress
import json
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import yaml

from .errors import K8sHttpError

__all__ = [
    "ConfigError",
    "CredentialError",
    "ClusterConfig",
    "CredentialSource",
    "StaticToken",
    "TokenFile",
    "ExecCredential",
    "load_config",
    "SERVICE_ACCOUNT_DIR",
]

log = logging.getLogger(__name__)

# Where the kubelet mounts the pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

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

# Directories tried, in order, for the short-lived client-key file: /dev/shm is
# memory-backed (the key never reaches a disk) and stays writable under a
# read-only root filesystem. Tests replace this list.
_KEY_FILE_DIRS = ["/dev/shm", None]  # None = tempfile.gettempdir()


# --------------------------------------------------------------------------
# Errors


class ConfigError(K8sHttpError):
    """A configuration problem only the user can fix.

    str() is one line: ``<where>: <problem>; <fix>``, where `where` names the
    file (or variable) at fault. It never contains a token or a key.
    """

    def __init__(self, where: str, problem: str, fix: str = ""):
        super().__init__(where, problem, fix)   # args stay picklable
        self.where = where
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return _one_line(f"{self.where}: {self.problem}" + (f"; {self.fix}" if self.fix else ""))


class CredentialError(ConfigError):
    """A credential source failed while running (token file gone, exec plugin failed).

    Raised from `token()` / `client_cert()`, so possibly mid-run, not only at load.
    """


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _clip(text: str, limit: int) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _is_valid_token(token: str) -> bool:
    # Visible ASCII only. Anything else would be refused by http.client with a
    # ValueError that quotes the header value, i.e. the token, so reject it here.
    return bool(token) and all("!" <= c <= "~" for c in token)


# --------------------------------------------------------------------------
# Credential sources


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
            if not _is_valid_token(text):
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
            stderr = _clip(proc.stderr.decode("utf-8", "replace"), MAX_STDERR_CHARS)
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
            got = _clip(repr(obj.get("apiVersion")), 80)
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
        if token is not None and not _is_valid_token(token):
            raise self._fail("returned a token with spaces or non-ASCII characters", fix)
        expires_at = None
        stamp = status.get("expirationTimestamp")
        if stamp:
            expires_at = _parse_rfc3339(stamp)
            if expires_at is None:
                raise self._fail(f"returned an expirationTimestamp that is not RFC 3339: "
                                 f"{_clip(repr(stamp), 60)}", fix)
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


# --------------------------------------------------------------------------
# The configuration


@dataclass(repr=False, eq=False)
class ClusterConfig:
    """Everything the transport needs to reach and authenticate to one apiserver.

    Invariant: `server` is an http(s) URL with a host (checked on creation).
    Bearer tokens come from `credentials.token()` per request; the client
    certificate is `client_cert_pem`/`client_key_pem`, else the one
    `credentials.client_cert()` issues (exec plugins), and is presented by
    the context `ssl_context()` returns.
    """

    server: str                                   # "https://127.0.0.1:6443" (+ optional path)
    ca_data: bytes | None = None                  # PEM; None = the system trust store
    ca_file: str | None = None                    # where ca_data came from, re-read by reload_ca()
    insecure_skip_tls_verify: bool = False        # only ever set by a kubeconfig that says so
    tls_server_name: str | None = None            # SNI and hostname to verify, if not the URL's
    proxy_url: str | None = None                  # http:// proxy, tunnelled with CONNECT
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    credentials: CredentialSource | None = None
    namespace: str = "default"
    source: str = "ClusterConfig"                 # "kubeconfig /path (context x)" or "in-cluster"
    # (cache key, context): rebuilt when the CA or the client certificate changes.
    _ssl_cache: tuple | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self):
        _parse_server(self.server, self.source)

    # -- where to connect

    @property
    def scheme(self) -> str:
        """"https" or "http"."""
        return urlsplit(self.server).scheme

    @property
    def host(self) -> str:
        """Host to connect to, without IPv6 brackets."""
        return urlsplit(self.server).hostname

    @property
    def port(self) -> int:
        url = urlsplit(self.server)
        return url.port or (443 if url.scheme == "https" else 80)

    @property
    def base_path(self) -> str:
        """Path prefix of the server URL ("" or e.g. "/k8s/clusters/c-1"); API paths go after it."""
        return urlsplit(self.server).path.rstrip("/")

    @property
    def server_hostname(self) -> str:
        """The name TLS sends as SNI and verifies: tls-server-name if set, else the URL's host."""
        return self.tls_server_name or self.host

    # -- TLS

    def ssl_context(self) -> ssl.SSLContext | None:
        """A verifying client context, or None for an http:// server.

        Cached, and rebuilt when the CA (reload_ca) or the client certificate
        (an exec plugin re-issued it) changes, so the transport may call this
        for every new connection. Raises ConfigError (or CredentialError from
        an exec plugin) if the material cannot be loaded.
        """
        if self.scheme != "https":
            return None
        pair = self._client_cert_pair()   # outside the lock: it may run an exec plugin
        with self._lock:
            key = (self.ca_data, pair)
            if self._ssl_cache is None or self._ssl_cache[0] != key:
                ctx = _build_ssl_context(self.ca_data, self.insecure_skip_tls_verify, pair,
                                         self.source)
                self._ssl_cache = (key, ctx)
            return self._ssl_cache[1]

    def reload_ca(self) -> bool:
        """Re-read `ca_file` (after a TLS verification failure: the CA may have rotated).

        True if the CA changed and is usable; the next ssl_context() then uses
        it. A missing or broken file keeps the old CA (logged), never drops
        verification.
        """
        if not self.ca_file:
            return False
        try:
            with open(self.ca_file, "rb") as f:
                data = f.read()
        except OSError as e:
            log.warning("CA file %s: re-read failed; keeping the previous CA", self.ca_file,
                        extra={"error": e.strerror})
            return False
        with self._lock:
            if data == self.ca_data:
                return False
            try:
                _load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), data, self.ca_file)
            except ConfigError as e:
                log.warning("CA file %s: keeping the previous CA", self.ca_file,
                            extra={"error": str(e)})
                return False
            self.ca_data = data
            self._ssl_cache = None
            log.info("CA file %s changed; new connections use the new CA", self.ca_file)
            return True

    def _client_cert_pair(self) -> tuple[bytes, bytes] | None:
        if self.client_cert_pem and self.client_key_pem:
            return self.client_cert_pem, self.client_key_pem
        if self.credentials is not None:
            return self.credentials.client_cert()
        return None

    def __repr__(self) -> str:
        if self.insecure_skip_tls_verify:
            ca = "NOT VERIFIED (insecure-skip-tls-verify)"
        elif self.ca_file:
            ca = f"file {self.ca_file}"
        else:
            ca = "data" if self.ca_data else "system"
        parts = [f"server={self.server!r}", f"source={self.source!r}",
                 f"namespace={self.namespace!r}", f"ca={ca!r}"]
        if self.tls_server_name:
            parts.append(f"tls_server_name={self.tls_server_name!r}")
        if self.proxy_url:
            parts.append(f"proxy_url={_redact_userinfo(self.proxy_url)!r}")
        if self.client_cert_pem:
            parts.append("client_cert=<set>")
        parts.append(f"credentials={self.credentials!r}")
        return f"ClusterConfig({', '.join(parts)})"


def _parse_server(server, where: str):
    fix = "set the cluster's server to https://HOST:PORT"
    if not isinstance(server, str) or not server:
        raise ConfigError(where, "no server URL", fix)
    try:
        url = urlsplit(server)
        url.port   # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise ConfigError(where, f"server {server!r} is not a valid URL", fix) from None
    if url.scheme not in ("https", "http"):
        raise ConfigError(where, f"server {server!r} is not an http(s) URL", fix)
    if any(c.isspace() or not c.isprintable() for c in server):
        raise ConfigError(where, f"server {server!r} contains spaces or control characters", fix)
    if not url.hostname:
        raise ConfigError(where, f"server {server!r} has no host", fix)
    if url.username or url.password:
        raise ConfigError(where, "server URL carries a user name or password",
                          "remove it and use a token, certificate or exec plugin")
    return url


def _redact_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"<redacted>@{host}").geturl()


def _load_ca(ctx: ssl.SSLContext, ca_data: bytes, where: str) -> None:
    fix = "it must hold PEM certificates (-----BEGIN CERTIFICATE-----)"
    try:
        ctx.load_verify_locations(cadata=ca_data.decode("ascii"))
    except (UnicodeDecodeError, ssl.SSLError, ValueError):
        raise ConfigError(where, "the certificate authority is not a valid PEM certificate",
                          fix) from None


def _build_ssl_context(ca_data: bytes | None, insecure: bool,
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
            _load_ca(ctx, ca_data, where)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_pair is not None:
        _load_client_cert(ctx, *cert_pair, where)
    return ctx


class _NoPassword(Exception):
    pass


def _refuse_password():
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
    raise _NoPassword


def _load_client_cert(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, where: str) -> None:
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


# --------------------------------------------------------------------------
# Proxies from the environment (as Go's http.ProxyFromEnvironment, which client-go uses)


def _proxy_from_env(env: Mapping[str, str], scheme: str, host: str) -> str | None:
    names = ("HTTPS_PROXY", "https_proxy") if scheme == "https" else ("HTTP_PROXY", "http_proxy")
    proxy = next((env[n] for n in names if env.get(n)), None)
    if not proxy or _is_loopback(host) or _is_no_proxy(host, env):
        return None
    return proxy if "://" in proxy else "http://" + proxy


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_no_proxy(host: str, env: Mapping[str, str]) -> bool:
    """NO_PROXY: "*", IPs and CIDRs, "name" (itself and subdomains), ".name" (subdomains)."""
    host = host.lower()
    entries = (env.get("NO_PROXY") or env.get("no_proxy") or "").split(",")
    for entry in (e.strip().lower() for e in entries):
        if entry == "*":
            return True
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                return True
            continue
        except ValueError:
            pass   # not an IP host, or not an IP entry: compare as names
        if entry.count(":") == 1:
            entry = entry.rsplit(":", 1)[0]   # "name:port": the port is not compared
        if entry.startswith("."):
            if host.endswith(entry):
                return True
        elif entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


# --------------------------------------------------------------------------
# Loading


def load_config(kubeconfig: str | None = None, *, context: str | None = None,
                env: Mapping[str, str] = os.environ, home: str | None = None,
                incluster_dir: str = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    """Find and load the cluster configuration, as controller-runtime's GetConfig does.

    Order: `kubeconfig` (the --kubeconfig flag) > `$KUBECONFIG` (a
    colon-separated list, merged like kubectl) > in-cluster (when
    `$KUBERNETES_SERVICE_HOST` and `_PORT` are set) > `~/.kube/config`.
    `context` (--context) picks a kubeconfig context instead of current-context.
    Raises ConfigError, one line naming the file and the fix.
    """
    if kubeconfig:
        return _from_kubeconfig([kubeconfig], context, env)
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # kubectl skips missing files in the list, but not a list of only missing files.
        existing = [p for p in listed if os.path.exists(p)]
        if not existing:
            raise ConfigError(f"$KUBECONFIG {env['KUBECONFIG']}", "none of these files exist",
                              "fix $KUBECONFIG or pass --kubeconfig PATH")
        return _from_kubeconfig(existing, context, env)
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"):
        if context:
            raise ConfigError("in-cluster", "--context only applies to a kubeconfig file",
                              "drop --context, or pass --kubeconfig with the file to use")
        return _from_incluster(env, incluster_dir)
    home = home or env.get("HOME") or os.path.expanduser("~")
    default = os.path.join(home, ".kube", "config")
    if not os.path.exists(default):
        raise ConfigError(f"kubeconfig {default}",
                          "no cluster configuration found (no --kubeconfig, $KUBECONFIG unset, "
                          "not running in a cluster, and this file does not exist)",
                          "pass --kubeconfig PATH or set $KUBECONFIG")
    return _from_kubeconfig([default], context, env)


def _from_incluster(env: Mapping[str, str], sa_dir: str) -> ClusterConfig:
    host = env["KUBERNETES_SERVICE_HOST"]
    port = env["KUBERNETES_SERVICE_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("in-cluster $KUBERNETES_SERVICE_PORT", f"{port!r} is not a port number",
                          "unset it or set it to the apiserver's port")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"   # an IPv6 literal in a URL needs brackets
    server = f"https://{host}:{port}"

    token_path = os.path.join(sa_dir, "token")
    ca_path = os.path.join(sa_dir, "ca.crt")
    mount_fix = ("mount the service-account token (automountServiceAccountToken: true), "
                 "or pass --kubeconfig")
    for path, what in ((token_path, "token"), (ca_path, "CA certificate")):
        if not os.path.isfile(path):
            raise ConfigError("in-cluster", f"{what} file {path} not found", mount_fix)
    credentials = TokenFile(token_path)
    credentials.token()   # fail now, at load, if it cannot be read
    ca_data = _read_file(ca_path, "in-cluster", f"CA certificate file {ca_path}", mount_fix)
    namespace = "default"
    try:
        with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as f:
            namespace = f.read().strip() or "default"
    except (OSError, ValueError):
        pass   # client-go also falls back to "default"
    config = ClusterConfig(server=server, ca_data=ca_data, ca_file=ca_path,
                           proxy_url=_proxy_from_env(env, "https", host.strip("[]")),
                           credentials=credentials, namespace=namespace, source="in-cluster")
    # A broken CA is a load-time error, not a first-request one.
    _load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca_data,
             f"in-cluster: CA certificate file {ca_path}")
    return config


def _read_file(path: str, where: str, what: str, fix: str) -> bytes:
    """The file's bytes, or ConfigError "<where>: <what> not found; <fix>"."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        problem = "not found"
    except IsADirectoryError:
        problem = "is a directory, not a file"
    except OSError as e:
        problem = f"cannot be read ({e.strerror})"
    except ValueError:   # a NUL byte in the path
        problem = "is not a valid path"
    raise ConfigError(where, f"{what} {problem}", fix)


@dataclass
class _Entry:
    """One named cluster, user or context, with the kubeconfig file that defined it."""
    name: str
    body: dict
    path: str

    @property
    def where(self) -> str:
        return f"kubeconfig {self.path}"

    def resolve(self, value: str) -> str:
        """A relative path in a kubeconfig is relative to that file's directory (as kubectl)."""
        if os.path.isabs(value):
            return value
        # Lexical cleaning, like Go's filepath.Join.
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.path)), value))

    def str_field(self, key: str, section: str) -> str | None:
        value = self.body.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(self.where, f"{section} {self.name!r}: {key} must be a string",
                              f"fix {key}")
        return value

    def bool_field(self, key: str, section: str) -> bool:
        value = self.body.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise ConfigError(self.where, f"{section} {self.name!r}: {key} must be true or false",
                              f"fix {key}")
        return value


# libyaml's safe loader when PyYAML was built with it: kubeconfigs with many
# clusters reach hundreds of KiB, and the pure-Python parser is ~10x slower.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_kubeconfig(path: str) -> dict:
    fix = "fix the file, or pass --kubeconfig with another one"
    where = f"kubeconfig {path}"
    data = _read_file(path, where, "file", "check the path (--kubeconfig or $KUBECONFIG)")
    try:
        doc = yaml.load(data, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        # Only the position and the parser's complaint: the text may hold a token.
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = _clip(getattr(e, "problem", "") or "", 80)
        raise ConfigError(where, f"not valid YAML{at}" + (f" ({problem})" if problem else ""),
                          fix) from None
    except RecursionError:
        raise ConfigError(where, "not valid YAML (nested too deeply)", fix) from None
    if doc is None:
        return {}   # an empty file is an empty config, as for kubectl
    if not isinstance(doc, dict):
        raise ConfigError(where, f"not a kubeconfig (the YAML is a {type(doc).__name__}, "
                          "not a mapping)", fix)
    return doc


def _entries(doc: dict, path: str, section: str, inner: str) -> list[_Entry]:
    """The `section` list (clusters/users/contexts) of one file, shape-checked."""
    where = f"kubeconfig {path}"
    items = doc.get(section)
    if items is None:
        return []
    if not isinstance(items, list):
        raise ConfigError(where, f"{section} must be a list", f"fix {section}")
    entries = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not item["name"]:
            raise ConfigError(where, f"{section}[{i}] has no name",
                              f"give each entry of {section} a name")
        body = item.get(inner)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ConfigError(where, f"{section}[{i}].{inner} must be a mapping",
                              f"fix {section}[{i}]")
        entries.append(_Entry(item["name"], body, path))
    return entries


def _from_kubeconfig(paths: list[str], context: str | None,
                     env: Mapping[str, str]) -> ClusterConfig:
    # Merge like kubectl: for each name the first file defining it wins, and
    # current-context comes from the first file that sets one.
    maps: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    current = None
    for path in paths:
        doc = _parse_kubeconfig(path)
        for section, inner in (("clusters", "cluster"), ("users", "user"),
                               ("contexts", "context")):
            for entry in _entries(doc, path, section, inner):
                maps[section].setdefault(entry.name, entry)
        cc = doc.get("current-context")
        if current is None and isinstance(cc, str) and cc:
            current = cc
    where = f"kubeconfig {os.pathsep.join(paths)}"
    names = ", ".join(sorted(maps["contexts"])) or "none"

    name = context or current
    if not name:
        if not maps["contexts"]:
            raise ConfigError(where, "defines no contexts",
                              "add a context, or point --kubeconfig at another file")
        raise ConfigError(where, f"no current-context is set (contexts: {names})",
                          "pass --context with one of them, or run kubectl config use-context")
    ctx = maps["contexts"].get(name)
    if ctx is None:
        fix = ("pass --context with one of them" if context else
               "pass --context with one of them, or run kubectl config use-context")
        raise ConfigError(where, f"context {name!r} not found (contexts: {names})", fix)

    cluster_name = ctx.str_field("cluster", "context")
    if not cluster_name:
        raise ConfigError(ctx.where, f"context {name!r} names no cluster",
                          "set contexts[].context.cluster")
    cluster = maps["clusters"].get(cluster_name)
    if cluster is None:
        known = ", ".join(sorted(maps["clusters"])) or "none"
        raise ConfigError(where, f"cluster {cluster_name!r} of context {name!r} not found "
                          f"(clusters: {known})", "fix the context's cluster or add the cluster")
    user_name = ctx.str_field("user", "context")
    user = None
    if user_name:
        user = maps["users"].get(user_name)
        if user is None:
            known = ", ".join(sorted(maps["users"])) or "none"
            raise ConfigError(where, f"user {user_name!r} of context {name!r} not found "
                              f"(users: {known})", "fix the context's user or add the user")

    tls = _cluster_settings(cluster, env)
    cert, key, credentials = None, None, None
    if user is not None:
        cert, key, credentials = _user_settings(user, cluster, tls, env)
    # Fail now on a CA or client certificate that cannot be loaded. An exec
    # plugin is not run at load (kubectl also waits for the first request).
    if urlsplit(tls["server"]).scheme == "https":
        if tls["ca_data"]:
            _load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), tls["ca_data"],
                     f"{cluster.where}: cluster {cluster.name!r}")
        if cert is not None:
            _load_client_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key,
                              f"{user.where}: user {user.name!r}")
    return ClusterConfig(credentials=credentials, client_cert_pem=cert, client_key_pem=key,
                         namespace=ctx.str_field("namespace", "context") or "default",
                         source=f"kubeconfig {os.pathsep.join(paths)} (context {name})", **tls)


def _cluster_settings(cluster: _Entry, env: Mapping[str, str]) -> dict:
    """ClusterConfig keyword arguments from one clusters[] entry."""
    label = f"cluster {cluster.name!r}"
    server = cluster.str_field("server", "cluster")
    if not server:
        raise ConfigError(cluster.where, f"{label} has no server",
                          "set clusters[].cluster.server to https://HOST:PORT")
    url = _parse_server(server, f"{cluster.where}: {label}")

    ca_data, ca_file = None, None
    data = cluster.str_field("certificate-authority-data", "cluster")
    path = cluster.str_field("certificate-authority", "cluster")
    if data:   # the -data form wins over the path, as in client-go
        ca_data = _b64(data, cluster, "certificate-authority-data")
    elif path:
        ca_file = cluster.resolve(path)
        ca_data = _read_file(ca_file, cluster.where, f"{label}: certificate-authority {ca_file}",
                             "fix the path (a relative path is resolved from the kubeconfig's "
                             "directory) or use certificate-authority-data")
    insecure = cluster.bool_field("insecure-skip-tls-verify", "cluster")
    if insecure and ca_data:
        # kubectl refuses this too: it is never clear which one the user meant.
        raise ConfigError(cluster.where, f"{label} sets both a certificate authority and "
                          "insecure-skip-tls-verify", "remove one of them")

    proxy = cluster.str_field("proxy-url", "cluster")
    if proxy:
        try:
            parsed = urlsplit(proxy)
            parsed.port   # noqa: B018 -- raises ValueError on a bad port
        except ValueError:
            parsed = None
        if parsed is None or parsed.scheme != "http" or not parsed.hostname:
            raise ConfigError(cluster.where, f"{label}: proxy-url must be an http:// URL",
                              "use an HTTP CONNECT proxy: http://HOST:PORT")
    else:
        proxy = _proxy_from_env(env, url.scheme, url.hostname)
    return {"server": server.rstrip("/"), "ca_data": ca_data, "ca_file": ca_file,
            "insecure_skip_tls_verify": insecure,
            "tls_server_name": cluster.str_field("tls-server-name", "cluster"),
            "proxy_url": proxy}


def _user_settings(user: _Entry, cluster: _Entry, tls: dict, env: Mapping[str, str]):
    """(client cert PEM, client key PEM, CredentialSource) from one users[] entry."""
    label = f"user {user.name!r}"
    provider = user.body.get("auth-provider")
    if provider:
        kind = provider.get("name") if isinstance(provider, dict) else None
        raise ConfigError(user.where, f"{label} uses auth-provider {kind!r}, which is not "
                          "supported (it was removed from kubectl too)",
                          "switch the user to an exec plugin (e.g. gke-gcloud-auth-plugin, "
                          "kubelogin)")
    acting = [k for k in ("as", "as-uid", "as-groups", "as-user-extra") if user.body.get(k)]
    if acting:
        # Ignoring it would silently act as a different identity than configured.
        raise ConfigError(user.where, f"{label} asks for impersonation ({', '.join(acting)}), "
                          "which is not supported", "remove it, or use that identity's own "
                          "credentials")
    if user.body.get("username") or user.body.get("password"):
        raise ConfigError(user.where, f"{label} uses basic auth (username/password), which "
                          "is not supported", "use a token, a client certificate or an exec plugin")

    cert = _pem_field(user, "client-certificate")
    key = _pem_field(user, "client-key")
    if (cert is None) != (key is None):
        missing = "client-key" if key is None else "client-certificate"
        raise ConfigError(user.where, f"{label} has no {missing} to go with its "
                          f"{'client-certificate' if key is None else 'client-key'}",
                          f"set {missing} (or {missing}-data)")

    token = user.str_field("token", "user")
    token_file = user.str_field("tokenFile", "user")
    plugin = user.body.get("exec")
    if plugin and (token or token_file or cert):
        raise ConfigError(user.where, f"{label} sets an exec plugin and also a token or "
                          "client certificate", "keep only one way to authenticate")

    credentials: CredentialSource | None = None
    if plugin:
        credentials = _exec_source(plugin, user, cluster, tls, env)
    elif token_file:   # a token file wins over an inline token, as in client-go
        path = user.resolve(token_file)
        _read_file(path, user.where, f"{label}: tokenFile {path}",
                   "fix the path (a relative path is resolved from the kubeconfig's directory)")
        credentials = TokenFile(path)
        credentials.token()   # an empty file is a load-time error too
    elif token:
        if not _is_valid_token(token.strip()):
            raise ConfigError(user.where, f"{label}: the token contains spaces or non-ASCII "
                              "characters", "set token to the bearer token alone")
        credentials = StaticToken(token.strip())
    return cert, key, credentials


def _pem_field(user: _Entry, key: str) -> bytes | None:
    data = user.str_field(f"{key}-data", "user")
    if data:
        return _b64(data, user, f"{key}-data")
    path = user.str_field(key, "user")
    if path:
        path = user.resolve(path)
        return _read_file(path, user.where, f"user {user.name!r}: {key} {path}",
                          "fix the path (a relative path is resolved from the kubeconfig's "
                          f"directory) or use {key}-data")
    return None


def _exec_source(spec, user: _Entry, cluster: _Entry, tls: dict,
                 env: Mapping[str, str]) -> ExecCredential:
    label = f"user {user.name!r}"

    def bad(what: str):
        return ConfigError(user.where, f"{label}: exec.{what}", f"fix users[].user.exec")

    if not isinstance(spec, dict):
        raise bad("must be a mapping")
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise bad("command is missing")
    if os.sep in command:
        command = user.resolve(command)   # kubectl resolves it only when it is a path
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad("args must be a list of strings")
    items = spec.get("env") or []
    if not isinstance(items, list):
        raise bad("env must be a list of {name, value} strings")
    pairs = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                and isinstance(item.get("value"), str)):
            raise bad("env must be a list of {name, value} strings")
        pairs.append((item["name"], item["value"]))
    api_version = spec.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        raise bad("apiVersion is missing (e.g. client.authentication.k8s.io/v1)")
    hint = spec.get("installHint") if isinstance(spec.get("installHint"), str) else ""
    if shutil.which(command, path=env.get("PATH", os.defpath)) is None:
        raise ConfigError(user.where, f"{label}: exec plugin {command!r} not found "
                          "or not executable",
                          _clip(hint, 200) or "install it, or fix users[].user.exec.command")

    cluster_info = None
    if spec.get("provideClusterInfo") is True:
        # The plugin gets the cluster as client.authentication.k8s.io's Cluster type.
        cluster_info = {"server": tls["server"],
                        "insecure-skip-tls-verify": tls["insecure_skip_tls_verify"]}
        if tls["ca_data"]:
            cluster_info["certificate-authority-data"] = base64.b64encode(tls["ca_data"]).decode()
        if tls["tls_server_name"]:
            cluster_info["tls-server-name"] = tls["tls_server_name"]
        if tls["proxy_url"]:
            cluster_info["proxy-url"] = tls["proxy_url"]
        extensions = cluster.body.get("extensions")
        for ext in extensions if isinstance(extensions, list) else []:
            if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
                cluster_info["config"] = ext.get("extension")
    return ExecCredential(command, args, api_version=api_version, env=pairs,
                          interactive_mode=spec.get("interactiveMode") or None,
                          install_hint=hint, cluster_info=cluster_info, base_env=env,
                          where=f"{user.where}: {label}")


def _b64(value: str, entry: _Entry, key: str) -> bytes:
    try:
        # Go's decoder skips line breaks; so do we, but nothing else.
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(entry.where, f"{key} of {entry.name!r} is not valid base64",
                          "set it to the base64 of the PEM file (base64 -w0 FILE)") from None
