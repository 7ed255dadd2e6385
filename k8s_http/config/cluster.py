"""Cluster configuration: where the apiserver is, how to trust it, who we are.

`load_config()` follows controller-runtime's order: an explicit kubeconfig,
then `$KUBECONFIG`, then the in-cluster service account, then
`~/.kube/config`. Everything that can be checked is checked at load time, so
a misconfiguration is one `ConfigError` line naming the file and the fix
(the command line prints it and exits 2), never a traceback mid-run.

The pieces live in their own modules and are re-exported here for callers:
errors in `configerror`, token sources in `credentials`, kubeconfig parsing
in `kubeconfig`, TLS material in `tls`, server and proxy URLs in `urls`.
Secrets (tokens, private keys) never appear in `repr()`, exception messages
or logs.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .configerror import ConfigError, CredentialError, read_file, setting
from .credentials import CredentialSource, ExecCredential, StaticToken, TokenFile
from .kubeconfig import read_kubeconfig
from .tls import build_ssl_context, load_ca
from .urls import parse_server, proxy_from_env, redact_userinfo

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
        parse_server(self.server, self.source)

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
                ctx = build_ssl_context(self.ca_data, self.insecure_skip_tls_verify, pair,
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
                load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), data, self.ca_file)
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
            parts.append(f"proxy_url={redact_userinfo(self.proxy_url)!r}")
        if self.client_cert_pem:
            parts.append("client_cert=<set>")
        parts.append(f"credentials={self.credentials!r}")
        return f"ClusterConfig({', '.join(parts)})"

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
        return ClusterConfig(**read_kubeconfig([kubeconfig], context, env))
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # kubectl skips missing files in the list, but not a list of only missing files.
        existing = [p for p in listed if os.path.exists(p)]
        if not existing:
            raise ConfigError(f"$KUBECONFIG {env['KUBECONFIG']}", "none of these files exist",
                              f"fix $KUBECONFIG or name a file with {setting('kubeconfig')}")
        return ClusterConfig(**read_kubeconfig(existing, context, env))
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"):
        if context:
            raise ConfigError("in-cluster",
                              f"{setting('context')} only applies to a kubeconfig file",
                              f"drop {setting('context')}, or name the file to use with "
                              f"{setting('kubeconfig')}")
        return _from_incluster(env, incluster_dir)
    home = home or env.get("HOME") or os.path.expanduser("~")
    default = os.path.join(home, ".kube", "config")
    if not os.path.exists(default):
        raise ConfigError(f"kubeconfig {default}",
                          f"no cluster configuration found (no {setting('kubeconfig')}, "
                          "$KUBECONFIG unset, not running in a cluster, and this file does not "
                          "exist)", f"name a file with {setting('kubeconfig')} or set $KUBECONFIG")
    return ClusterConfig(**read_kubeconfig([default], context, env))


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
                 f"or name a kubeconfig file with {setting('kubeconfig')}")
    for path, what in ((token_path, "token"), (ca_path, "CA certificate")):
        if not os.path.isfile(path):
            raise ConfigError("in-cluster", f"{what} file {path} not found", mount_fix)
    credentials = TokenFile(token_path)
    credentials.token()   # fail now, at load, if it cannot be read
    ca_data = read_file(ca_path, "in-cluster", f"CA certificate file {ca_path}", mount_fix)
    namespace = "default"
    try:
        with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as f:
            namespace = f.read().strip() or "default"
    except (OSError, ValueError):
        pass   # client-go also falls back to "default"
    config = ClusterConfig(server=server, ca_data=ca_data, ca_file=ca_path,
                           proxy_url=proxy_from_env(env, "https", host.strip("[]")),
                           credentials=credentials, namespace=namespace, source="in-cluster")
    # A broken CA is a load-time error, not a first-request one.
    load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca_data,
            f"in-cluster: CA certificate file {ca_path}")
    return config
