"""HTTP(S) to the apiserver on `http.client` + `ssl`: a keep-alive pool, deadlines, retries, auth.

One `Transport` per apiserver, shared by every thread. What it guarantees:

- Deadlines that hold against a slow or hostile server (`connection.py`): a
  connect timeout, a header timeout and a total deadline per attempt.
- The retry policy of client-go's REST client: 429/5xx are retried only when
  the server says when (`Retry-After`, clamped to 1..300 s, at most
  `max_retries` tries); a GET whose connection was lost is retried once on a
  fresh connection, a write never is (the server may have applied it); a 401
  re-reads the credentials and retries once. Everything else is raised as a
  typed error (`errors.from_status` for HTTP statuses).
- Redirects are never followed: the bearer token never leaves for another host.
- The token is never logged and never put in an exception message.
- Watches get a dedicated connection (`stream()`), never pooled, read as a
  `stream.Stream`.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from urllib.parse import unquote, urlencode, urlsplit

from ..core import errors
from ..core.backoff import TokenBucket
from ..core.errors import ApiConnectionError, ApiTimeoutError, K8sHttpError, ProtocolError
from ..config.cluster import ClusterConfig, CredentialError
from ..ops.metrics import Metrics
from .connection import (LOST, Headers, HTTPConnection, HTTPSConnection, ResponseHead,
                         is_dropped, read_response_head)
from .defaults import WATCH_STALL_TIMEOUT_SECONDS
from .stream import Stream, read_body

__all__ = ["Transport", "Response", "Stream", "DEFAULT_USER_AGENT", "user_agent"]

log = logging.getLogger(__name__)


def user_agent(app_name: str, version: str) -> str:
    """The User-Agent naming the application, as the apiserver's audit log shows it."""
    return f"{app_name}/{version} (python; k8s_http)"


# Without an application name (a bare Transport or ApiClient): the library's own.
DEFAULT_USER_AGENT = "k8s_http/0.1 (python)"

# Retry-After is obeyed within these bounds (client-go: at least 1 s; our cap
# keeps a confused server from parking a worker for hours).
MIN_RETRY_AFTER_SECONDS = 1
MAX_RETRY_AFTER_SECONDS = 300


class _ConnectionLost(Exception):
    """Internal: the connection broke before a complete answer; the retry policy decides."""


class Response:
    """A complete answer: status, headers, the whole body."""

    __slots__ = ("status", "headers", "body", "_json")

    def __init__(self, status: int, headers: Headers, body: bytes):
        self.status = status
        self.headers = headers
        self.body = body
        self._json = None      # the parsed body, once json() has been called

    def json(self) -> dict:
        """The body as a JSON object (parsed once); ProtocolError if it is not one."""
        if self._json is None:
            try:
                doc = json.loads(self.body.decode("utf-8"))
            except (ValueError, RecursionError):
                raise ProtocolError(f"HTTP {self.status}: the body is not valid JSON") from None
            if not isinstance(doc, dict):
                raise ProtocolError(f"HTTP {self.status}: the body is JSON but not an object")
            self._json = doc
        return self._json

    def __repr__(self) -> str:
        return f"Response(status={self.status}, {len(self.body)} bytes)"


def _retry_after_seconds(headers) -> float | None:
    """Retry-After in whole seconds, clamped; None if absent or not a number (no retry)."""
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    try:
        seconds = int(value.strip())
    except ValueError:
        return None
    return float(min(max(seconds, MIN_RETRY_AFTER_SECONDS), MAX_RETRY_AFTER_SECONDS))


def _header_safe(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)


class Transport:
    """Requests to one apiserver; thread-safe.

    Every attempt is counted in `rest_client_requests_total{code,method,host}`
    (code "<error>" when no HTTP status came back) and timed in
    `rest_client_request_duration_seconds{verb,host}` (the whole exchange; for a
    stream, up to its headers).
    """

    def __init__(self, config: ClusterConfig, *, qps: float = 0.0, burst: int = 0,
                 user_agent: str = DEFAULT_USER_AGENT, connect_timeout_seconds: float = 10.0,
                 header_timeout_seconds: float = 30.0, request_timeout_seconds: float = 60.0,
                 max_retries: int = 10, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, pool_size: int = 8):
        self.config = config
        self.user_agent = user_agent
        self.connect_timeout_seconds = connect_timeout_seconds
        self.header_timeout_seconds = header_timeout_seconds
        self.request_timeout_seconds = request_timeout_seconds
        self.max_retries = max(1, max_retries)
        self.metrics = metrics if metrics is not None else Metrics()
        self.pool_size = pool_size
        self._clock = clock
        self._sleep = sleep
        self._bucket = TokenBucket(qps, burst, clock)
        url = urlsplit(config.server)
        self._https = url.scheme == "https"
        self._server_host = url.hostname
        self._server_port = url.port or (443 if self._https else 80)
        self._host_header = _host_header(url.hostname, url.port, self._https)
        self._base_path = url.path.rstrip("/")
        self.host = url.netloc          # "127.0.0.1:6443": the metrics label
        # (code, method) -> the two labelled request metrics (see _count); a dict
        # read or insert is atomic under the GIL, a racing insert only repeats labels().
        self._request_metrics: dict[tuple[str, str], tuple] = {}
        self._server_hostname = config.tls_server_name or url.hostname
        self._proxy = urlsplit(config.proxy_url) if config.proxy_url else None

        self._lock = threading.Lock()
        # Idle keep-alive connections, most recently used last (reused LIFO:
        # the freshest is the least likely to have been closed by the server).
        # Invariant: each was returned after a complete response and is not
        # in use; len(_idle) <= pool_size.
        self._idle: list[http.client.HTTPConnection] = []
        # Bumped when connections must not be reused (new credentials after a
        # 401, a CA reload); connections of an older generation are closed.
        self._generation = 0
        self._closed = False

    # -- public API

    def request(self, method: str, path: str, *, query: Mapping | None = None,
                body: bytes | None = None, content_type: str | None = None,
                timeout_seconds: float | None = None) -> Response:
        """Send one request, with the retry policy; a status >= 300 raises a typed ApiError.

        `timeout_seconds` (default `request_timeout_seconds`) is the total
        deadline of each attempt -- connect, send, headers, body; waits for
        Retry-After come on top.
        """
        method = method.upper()
        target = self._target(path, query)
        timeout = timeout_seconds or self.request_timeout_seconds
        resp = self._with_retries(method, path, lambda fresh: self._attempt(
            method, path, target, body, content_type, timeout, fresh=fresh))
        self._raise_for_status(resp, method, path)
        return resp

    def stream(self, path: str, *, query: Mapping | None = None,
               read_timeout_seconds: float = WATCH_STALL_TIMEOUT_SECONDS) -> "Stream":
        """GET whose body is read as it arrives, on a dedicated connection (watches)."""
        target = self._target(path, query)
        result = self._with_retries("GET", path, lambda fresh: self._attempt_stream(
            path, target, read_timeout_seconds))
        if isinstance(result, Stream):
            return result
        self._raise_for_status(result, "GET", path)
        # A 2xx other than 200 has no watch body to read.
        raise ProtocolError(f"GET {path}: expected 200 for a stream, got {result.status}")

    def close(self) -> None:
        """Close the idle connections and stop pooling; open streams are their owners' to close."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for conn in idle:
            conn.close()

    # -- the retry policy

    def _with_retries(self, method: str, path: str, attempt):
        tries = 0
        auth_retried = False
        lost_retried = False
        creds = self.config.credentials
        while True:
            tries += 1
            self._throttle()
            try:
                resp = attempt(lost_retried)
            except _ConnectionLost as lost:
                if method == "GET" and not lost_retried:
                    log.info("%s %s: connection lost (%s); retrying once on a new connection",
                             method, path, lost)
                    lost_retried = True
                    continue
                # A write may have been applied: it is never blindly repeated.
                raise ApiConnectionError(f"{method} {path}: connection lost before a complete "
                                         f"answer: {lost}") from lost.__cause__
            if resp.status == 401 and creds is not None and not auth_retried:
                log.info("%s %s: 401 Unauthorized; reloading credentials and retrying once",
                         method, path)
                auth_retried = True
                creds.invalidate()
                self._drop_idle()   # pooled TLS sessions may carry an old client certificate
                continue
            if resp.status == 429 or resp.status >= 500:
                delay = _retry_after_seconds(resp.headers)
                if delay is not None and tries < self.max_retries:
                    log.info("%s %s: %d, Retry-After %gs (try %d of %d)", method, path,
                             resp.status, delay, tries, self.max_retries)
                    self._sleep(delay)
                    continue
            return resp

    def _throttle(self) -> None:
        wait = self._bucket.reserve()
        if wait > 0:
            self._sleep(wait)

    def _raise_for_status(self, resp: Response, method: str, path: str) -> None:
        if 200 <= resp.status < 300:
            # The apiserver can report a failure inside a 200 (a Status object).
            if b'"Status"' in resp.body and _is_json(resp.headers):
                doc = resp.json()
                if doc.get("kind") == "Status" and doc.get("status") == "Failure":
                    code = doc.get("code")
                    code = code if isinstance(code, int) and code >= 300 else 500
                    raise errors.from_status(code, doc, method=method, path=path)
            return
        raise errors.from_status(resp.status, resp.body, method=method, path=path,
                                 retry_after_seconds=_retry_after_seconds(resp.headers))

    # -- one attempt

    def _attempt(self, method: str, path: str, target: str, body: bytes | None,
                 content_type: str | None, timeout: float, *, fresh: bool) -> Response:
        started = time.monotonic()
        code = "<error>"        # client-go's label when no HTTP status came back
        conn = None
        try:
            conn = self._checkout(fresh)
            head = self._send(conn, method, target, body, content_type, started + timeout)
            code = str(head.status)
            self._check_encoding(head, method, path)
            data = read_body(head)  # every read bounded by the total deadline
        except BaseException as e:
            if conn is not None:
                conn.close()
            self._raise_classified(e, method, path)
        finally:
            self._count(code, method, started)
        log.debug("%s %s -> %s (%d bytes) in %.3fs", method, path, code, len(data),
                  time.monotonic() - started)
        if head.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return Response(head.status, head.headers, data)

    def _attempt_stream(self, path: str, target: str, read_timeout_seconds: float):
        started = time.monotonic()
        code = "<error>"
        conn = None
        try:
            conn = self._connect()  # dedicated: a stream never comes from or goes to the pool
            deadline = started + self.request_timeout_seconds
            head = self._send(conn, "GET", target, None, None, deadline)
            code = str(head.status)
            self._check_encoding(head, "GET", path)
            if head.status != 200:
                data = read_body(head)
                conn.close()
                return Response(head.status, head.headers, data)
            log.debug("GET %s -> 200 (stream)", path)
            return Stream(conn, head, read_timeout_seconds=read_timeout_seconds, path=path)
        except BaseException as e:
            if conn is not None:
                conn.close()
            self._raise_classified(e, "GET", path)
        finally:
            self._count(code, "GET", started)

    def _send(self, conn, method: str, target: str, body: bytes | None,
              content_type: str | None, deadline: float) -> ResponseHead:
        """Send the request and read the status line and headers; the body is left unread."""
        headers = self._headers(method, body, content_type)
        limits = conn.limits
        limits.read_timeout = None
        # The header timeout bounds the send too.
        limits.deadline = min(deadline, time.monotonic() + self.header_timeout_seconds)
        conn.send_request(method, target, headers, body)
        head = read_response_head(conn.reader, method)
        limits.deadline = deadline
        return head

    def _headers(self, method: str, body: bytes | None, content_type: str | None) -> dict:
        # No Accept-Encoding: the answer comes uncompressed (see _check_encoding).
        headers = {"Host": self._host_header, "User-Agent": self.user_agent,
                   "Accept": "application/json"}
        creds = self.config.credentials
        token = creds.token() if creds is not None else None
        if token:
            if not _header_safe(token):
                # A ValueError about the header would be the only trace, and the
                # token must not reach a message.
                raise CredentialError(repr(creds), "the bearer token contains characters not "
                                      "allowed in an HTTP header",
                                      "check the token file or the plugin's output")
            headers["Authorization"] = f"Bearer {token}"
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            headers["Content-Length"] = str(len(body))
        elif method in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = "0"
        return headers

    def _check_encoding(self, head: ResponseHead, method: str, path: str) -> None:
        encoding = (head.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            # We never send Accept-Encoding, so a compressed body is a broken server or proxy.
            raise ProtocolError(f"{method} {path}: response has Content-Encoding "
                                f"{encoding[:40]!r}, which was never asked for")

    def _count(self, code: str, method: str, started: float) -> None:
        # The labelled children are looked up once per (code, method): labels()
        # takes a lock and builds a tuple on every call, per request.
        children = self._request_metrics.get((code, method))
        if children is None:
            children = self._request_metrics[(code, method)] = (
                self.metrics.rest_client_requests_total.labels(code, method, self.host),
                self.metrics.rest_client_request_duration_seconds.labels(method, self.host))
        children[0].inc()
        children[1].observe(time.monotonic() - started)

    @staticmethod
    def _raise_classified(err: BaseException, method: str, path: str):
        """Re-raise a failure during an exchange as what the caller (or retry policy) sees."""
        if isinstance(err, (K8sHttpError, _ConnectionLost)) or not isinstance(err, Exception):
            raise err
        if isinstance(err, TimeoutError):
            raise ApiTimeoutError(f"{method} {path}: timed out waiting for the apiserver "
                                  f"({err or 'socket timeout'})") from err
        if isinstance(err, LOST):
            raise _ConnectionLost(type(err).__name__ + (f": {err}" if str(err) else "")) from err
        if isinstance(err, http.client.HTTPException):
            raise ProtocolError(f"{method} {path}: malformed HTTP response: "
                                f"{type(err).__name__}") from err
        if isinstance(err, OSError):
            raise ApiConnectionError(f"{method} {path}: {err}") from err
        raise err

    # -- connections

    def _target(self, path: str, query: Mapping | None) -> str:
        target = self._base_path + path
        if query:
            pairs = [(k, _query_value(v)) for k, v in query.items() if v is not None]
            if pairs:
                target += "?" + urlencode(pairs)
        return target

    def _checkout(self, fresh: bool):
        """An idle pooled connection (unless `fresh`), else a new one."""
        while not fresh:
            with self._lock:
                if not self._idle:
                    break
                candidate = self._idle.pop()
                current = candidate.generation == self._generation
            # Checked outside the lock: is_dropped is a system call, which lets
            # other threads run, and the lock would stay held until this thread
            # got the interpreter back (every other request's checkin and checkout
            # waiting on it meanwhile).
            if current and not is_dropped(candidate.sock):
                return candidate
            candidate.close()
        return self._connect()

    def _checkin(self, conn) -> None:
        with self._lock:
            if (not self._closed and conn.generation == self._generation
                    and len(self._idle) < self.pool_size):
                self._idle.append(conn)
                return
        conn.close()

    def _drop_idle(self) -> None:
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _connect(self):
        """A new connected (and, for https, verified) connection."""
        with self._lock:
            generation = self._generation
        if self._proxy is not None:
            host, port = self._proxy.hostname, self._proxy.port or 80
        else:
            host, port = self._server_host, self._server_port
        if self._https:
            conn = HTTPSConnection(host, port, timeout=self.connect_timeout_seconds,
                                   generation=generation, context=self.config.ssl_context(),
                                   server_hostname=self._server_hostname)
        else:
            conn = HTTPConnection(host, port, timeout=self.connect_timeout_seconds,
                                  generation=generation)
        if self._proxy is not None:
            conn.set_tunnel(self._server_host, self._server_port, headers=self._proxy_headers())
        try:
            conn.connect()
        except ssl.SSLCertVerificationError as e:
            conn.close()
            # The CA may have rotated: re-read the CA file for the next try.
            # There is no fallback to an unverified connection.
            if self.config.reload_ca():
                self._drop_idle()
            raise ApiConnectionError(
                f"TLS verification of the apiserver {self._server_hostname} failed: "
                f"{e.verify_message or e.reason}; check the cluster's certificate-authority "
                f"(and tls-server-name)") from e
        except ssl.SSLError as e:
            conn.close()
            raise ApiConnectionError(f"TLS handshake with {self.host} failed: "
                                     f"{e.reason or e}") from e
        except TimeoutError as e:
            conn.close()
            raise ApiTimeoutError(f"connecting to {self.host} timed out after "
                                  f"{self.connect_timeout_seconds:g}s") from e
        except OSError as e:
            conn.close()
            raise ApiConnectionError(f"cannot connect to {self.host}: "
                                     f"{e.strerror or e}") from e
        return conn

    def _proxy_headers(self) -> dict:
        proxy = self._proxy
        if proxy.username is None:
            return {}
        userinfo = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        return {"Proxy-Authorization": "Basic " + base64.b64encode(userinfo.encode()).decode()}

    def __repr__(self) -> str:
        return f"Transport({self.config.server!r})"


def _host_header(hostname: str, port: int | None, https: bool) -> str:
    """The Host header for the apiserver (through a proxy's tunnel too), as http.client
    wrote it: the port only when it is not the scheme's default, IPv6 in brackets."""
    host = f"[{hostname}]" if ":" in hostname else hostname
    if port is None or port == (443 if https else 80):
        return host
    return f"{host}:{port}"


def _query_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_json(headers) -> bool:
    ctype = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    return ctype == "application/json" or ctype.endswith("+json")
