"""Securing /metrics: a TLS server context, and scrapes authorized by the apiserver.

    authz = MetricsAuthorizer(ApiClient(client.transport))   # a client WITHOUT the write guard
    server = ProbeServer(":8443", registry=registry, tls=server_tls_context(cert, key),
                         metrics_auth=authz.check)

What `--metrics-secure` means in controller-runtime (its
`filters.WithAuthenticationAndAuthorization`), done the same way:

1. the scraper's bearer token is checked with a TokenReview;
2. the user it names is checked with a SubjectAccessReview for `get` on the
   non-resource URL `/metrics` (what a `ClusterRole` with
   `nonResourceURLs: ["/metrics"]` grants, e.g. to Prometheus).

Both answers are cached so a scrape every 15 s costs no apiserver call:
TokenReview results 1 min, allowed 5 min, denied 30 s (a new RoleBinding
takes effect within half a minute). Cache keys hold a SHA-256 of the token,
never the token itself. The TokenReview and SubjectAccessReview are
`create`s: on a standby replica the manager's guarded client would refuse
them, so this needs an ApiClient without the leader write guard. The RBAC
the process needs: `create` on `tokenreviews.authentication.k8s.io` and
`subjectaccessreviews.authorization.k8s.io`.

Certificates: `server_tls_context()` loads PEM files (mount a Secret, e.g.
from cert-manager). The container image has no openssl, so there is no
built-in self-signed fallback in production; `self_signed_cert()` makes one
with the `openssl` command when it exists (development only).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..core import errors
from ..core.objects import SUBJECTACCESSREVIEWS, TOKENREVIEWS

__all__ = ["MetricsAuthorizer", "Decision", "server_tls_context", "self_signed_cert",
           "TOKEN_TTL_SECONDS", "ALLOW_TTL_SECONDS", "DENY_TTL_SECONDS"]

log = logging.getLogger(__name__)

# controller-runtime's (and kube-rbac-proxy's) cache lifetimes.
TOKEN_TTL_SECONDS = 60.0
ALLOW_TTL_SECONDS = 300.0
DENY_TTL_SECONDS = 30.0
# Bounded caches: a flood of random tokens must not grow memory without limit.
MAX_CACHE_ENTRIES = 4096


@dataclass(frozen=True)
class Decision:
    """What to answer a scrape: 200, 401 (who are you?), 403 (not allowed) or 500."""

    code: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.code == 200


@dataclass(frozen=True)
class _User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]   # hashable form of map[string][]string


class _TtlCache:
    """key -> value until a deadline on the injected clock. Thread-safe, bounded."""

    def __init__(self, clock: Callable[[], float], max_entries: int = MAX_CACHE_ENTRIES):
        self._clock = clock
        self._max = max_entries
        self._lock = threading.Lock()
        self._items: dict[object, tuple[float, object]] = {}

    def get(self, key: object) -> tuple[bool, object]:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return False, None
            if self._clock() >= hit[0]:
                del self._items[key]
                return False, None
            return True, hit[1]

    def put(self, key: object, value: object, ttl_seconds: float) -> None:
        with self._lock:
            now = self._clock()
            if len(self._items) >= self._max:
                self._items = {k: v for k, v in self._items.items() if v[0] > now}
                if len(self._items) >= self._max:
                    # Still full of live entries (a flood of distinct tokens):
                    # drop the oldest tenth at once, so this O(n) pass runs at
                    # most once per max/10 inserts.
                    for k in list(self._items)[:max(1, self._max // 10)]:
                        del self._items[k]
            self._items[key] = (now + ttl_seconds, value)


class MetricsAuthorizer:
    """Authenticates a bearer token and authorizes `verb` on the non-resource `path`."""

    def __init__(self, client, *, path: str = "/metrics", verb: str = "get",
                 clock: Callable[[], float] = time.monotonic,
                 token_ttl_seconds: float = TOKEN_TTL_SECONDS,
                 allow_ttl_seconds: float = ALLOW_TTL_SECONDS,
                 deny_ttl_seconds: float = DENY_TTL_SECONDS):
        self._client = client
        self.path = path
        self.verb = verb
        self.token_ttl_seconds = token_ttl_seconds
        self.allow_ttl_seconds = allow_ttl_seconds
        self.deny_ttl_seconds = deny_ttl_seconds
        self._tokens = _TtlCache(clock)       # sha256(token) -> _User | None (not authenticated)
        self._reviews = _TtlCache(clock)      # _User -> (allowed, reason)

    def check(self, authorization: str | None) -> Decision:
        """Decide on a request's Authorization header value. Never raises."""
        token = _bearer_token(authorization)
        if not token:
            return Decision(401, "a bearer token is required")
        try:
            user = self._authenticate(token)
            if user is None:
                return Decision(401, "the token was not accepted")
            allowed, reason = self._authorize(user)
        except (errors.K8sHttpError, ValueError, TypeError, AttributeError) as exc:
            # Not cached: the next scrape asks again. No token in this message:
            # exceptions never carry request bodies.
            log.warning("metrics authorization failed", extra={"error": str(exc)})
            return Decision(500, "authorization is unavailable")
        if not allowed:
            return Decision(403, f"user {user.name!r} may not {self.verb} {self.path}"
                                 + (f": {reason}" if reason else ""), user.name)
        return Decision(200, "ok", user.name)

    def _authenticate(self, token: str) -> _User | None:
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        hit, user = self._tokens.get(key)
        if hit:
            return user  # type: ignore[return-value]
        review = self._client.create(TOKENREVIEWS, {
            "apiVersion": TOKENREVIEWS.api_version, "kind": TOKENREVIEWS.kind,
            "metadata": {}, "spec": {"token": token}})
        status = review.get("status") or {}
        user = _user_from(status.get("user")) if status.get("authenticated") is True else None
        self._tokens.put(key, user, self.token_ttl_seconds)
        return user

    def _authorize(self, user: _User) -> tuple[bool, str]:
        hit, answer = self._reviews.get(user)
        if hit:
            return answer  # type: ignore[return-value]
        spec: dict = {"user": user.name, "groups": list(user.groups),
                      "nonResourceAttributes": {"path": self.path, "verb": self.verb}}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = self._client.create(SUBJECTACCESSREVIEWS, {
            "apiVersion": SUBJECTACCESSREVIEWS.api_version, "kind": SUBJECTACCESSREVIEWS.kind,
            "metadata": {}, "spec": spec})
        status = review.get("status") or {}
        answer = (status.get("allowed") is True and status.get("denied") is not True,
                  str(status.get("reason") or ""))
        self._reviews.put(user, answer,
                          self.allow_ttl_seconds if answer[0] else self.deny_ttl_seconds)
        return answer


def _bearer_token(authorization: str | None) -> str:
    if not authorization:
        return ""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _user_from(info: object) -> _User | None:
    if not isinstance(info, dict) or not isinstance(info.get("username"), str):
        return None
    groups = info.get("groups") if isinstance(info.get("groups"), list) else []
    extra = info.get("extra") if isinstance(info.get("extra"), dict) else {}
    return _User(info["username"], str(info.get("uid") or ""),
                 tuple(str(g) for g in groups),
                 tuple(sorted((str(k), tuple(str(x) for x in v))
                              for k, v in extra.items() if isinstance(v, list))))


# ---------------------------------------------------------------------------
# TLS


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server-side context from PEM files; TLS 1.2+ only.

    Raises ValueError naming the files when they cannot be loaded.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the metrics certificate {cert_file!r} / key "
                         f"{key_file!r}: {exc}; mount a TLS Secret there") from exc
    return context


def self_signed_cert(directory: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                     *, openssl: str | None = None) -> tuple[str, str]:
    """Write tls.crt / tls.key (self-signed, P-256, 1 year) into `directory` with openssl.

    Development only: scrapers cannot verify it. Raises RuntimeError when no
    openssl command is available (as in the container image).
    """
    openssl = openssl or shutil.which("openssl")
    if not openssl:
        raise RuntimeError("no openssl command to make a self-signed metrics certificate: "
                           "provide a certificate and key instead")
    cert, key = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
    san = ",".join(("IP:" if h.replace(".", "").isdigit() or ":" in h else "DNS:") + h
                   for h in hosts)
    proc = subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "365", "-subj", f"/CN={hosts[0]}",
         "-addext", f"subjectAltName={san}"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl could not make a self-signed certificate: "
                           f"{proc.stderr.strip()[:500]}")
    os.chmod(key, 0o600)
    return cert, key
