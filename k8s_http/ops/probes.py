"""Health checks and the HTTP server for /healthz, /readyz and /metrics.

    checks = HealthChecks()
    checks.add("informer-my", lambda: (informer.has_synced(), "not synced"))
    server = ProbeServer("127.0.0.1:0", registry=registry, healthz=checks, readyz=checks)
    server.start(); server.port  # -> the bound port

One stdlib `ThreadingHTTPServer` per bind address. It serves whatever it was
given: `registry` enables `/metrics`, `healthz`/`readyz` enable those paths,
so when the metrics and probe addresses are the same the manager makes one
server with all three. Paths that were not given answer 404.

Responses follow the kube-apiserver (and controller-runtime):

    GET /readyz             200 "ok"          | 503 + the check list (always verbose on failure)
    GET /readyz?verbose     200 + the check list, then "readyz check passed"
    GET /readyz?exclude=x   as above, without check x (repeatable)
    GET /readyz/<name>      one check: 200 "ok" | 503 "[-]<name> failed: <detail>"

`/healthz` is the same with 500 on failure (liveness: the kubelet restarts
us), `/readyz` uses 503 (readiness: the Service stops routing to us). The
check list looks like

    [+]informer-my ok
    [-]workers-my failed: 1 of 4 threads dead
    readyz check failed

A check that raises counts as failed with its exception's type as the detail
(the message could carry anything; the traceback goes to the log).

Secure metrics (`--metrics-secure`): pass `tls` (an `ssl.SSLContext`, see
`authn.server_tls_context`) to serve HTTPS, and `metrics_auth`, a callable
`(authorization_header_or_None) -> decision` with `.code` (200/401/403/500)
and `.reason` (see `authn.MetricsAuthorizer.check`), to guard `/metrics`.
Health paths are never authenticated: the kubelet probes them anonymously.

Bind addresses are controller-runtime's: ":8080" (all interfaces, dual-stack
when the host supports it), "127.0.0.1:0" (an ephemeral port, for tests),
"[::1]:8080", and "0" (or "") which disables the server: `start()` is then a
no-op and `port` stays None.
"""

from __future__ import annotations

import errno
import http.server
import logging
import socket
import socketserver
import ssl
import threading
from typing import Callable, Iterable
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest, CONTENT_TYPE_PLAIN_0_0_4

from .metrics import generate_text

# One parser for bind addresses, the flags' (re-exported: callers import them from here).
from .flags import is_disabled, parse_bind_address

__all__ = ["HealthChecks", "ProbeServer", "parse_bind_address", "is_disabled", "ping",
           "CheckResult"]

log = logging.getLogger(__name__)

# How long serve_forever() blocks in select() before it looks at its shutdown
# flag. stop() shuts the listening socket down first, which ends the select()
# at once, so this bounds only a stop that could not do so. Each wake-up of an
# idle server costs ~0.1 ms of CPU: two servers every 0.5 s were over a third
# of an idle operator's.
POLL_SECONDS = 5.0

# name -> (ok, detail)
CheckResult = tuple[str, bool, str]
CheckFn = Callable[[], "tuple[bool, str] | bool"]

# The kubelet's probe timeout is 1 s by default and Prometheus scrapes every
# 15-60 s: a connection idle this long is a stuck or hostile client.
REQUEST_TIMEOUT_SECONDS = 10.0
# A check's detail goes on one line of a probe body; keep it short.
MAX_DETAIL_CHARS = 256

_TEXT = "text/plain; charset=utf-8"


def ping() -> tuple[bool, str]:
    """A check that always passes: 'the HTTP server answers' (controller-runtime's healthz.Ping)."""
    return True, "ok"


class HealthChecks:
    """Named checks, run in the order they were added. Thread-safe.

    A check is `fn() -> (ok, detail)`; a bare bool is accepted too. `detail`
    explains a failure ("not synced", "no watch progress for 200 s").
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checks: dict[str, CheckFn] = {}   # insertion order is the report order

    def add(self, name: str, fn: CheckFn) -> None:
        """Register a check. Raises ValueError on an empty or duplicate name."""
        if not name or not isinstance(name, str):
            raise ValueError(f"health check name must be a non-empty string, not {name!r}")
        if not callable(fn):
            raise ValueError(f"health check {name!r}: {fn!r} is not callable")
        with self._lock:
            if name in self._checks:
                raise ValueError(f"health check {name!r} is already registered")
            self._checks[name] = fn

    def remove(self, name: str) -> None:
        with self._lock:
            self._checks.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._checks)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._checks

    def run(self, *, only: str | None = None, exclude: Iterable[str] = ()) -> list[CheckResult]:
        """Run the checks: [(name, ok, detail)]. `only` runs one check (KeyError if unknown)."""
        with self._lock:   # copy, so checks run without the lock (they may be slow)
            if only is not None:
                checks = [(only, self._checks[only])]
            else:
                skip = set(exclude)
                checks = [(n, f) for n, f in self._checks.items() if n not in skip]
        return [(name, *_run_one(name, fn)) for name, fn in checks]

    def is_ok(self) -> bool:
        return all(ok for _, ok, _ in self.run())


def _run_one(name: str, fn: CheckFn) -> tuple[bool, str]:
    try:
        result = fn()
    except Exception as exc:
        # A broken check is a bug worth a traceback, but it must not break the probe.
        log.warning("health check %r raised", name, exc_info=True)
        return False, f"check raised {type(exc).__name__}"
    if isinstance(result, tuple) and len(result) == 2:
        ok, detail = result
    else:
        ok, detail = result, ""
    ok = bool(ok)
    detail = " ".join(str(detail).split())   # one line, no control characters
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[:MAX_DETAIL_CHARS] + "..."
    return ok, detail or ("ok" if ok else "failed")


# ---------------------------------------------------------------------------
# HTTP


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True          # a hung client never blocks process exit
    block_on_close = False         # nor stop()
    allow_reuse_address = True     # restart on the same port while old sockets are in TIME_WAIT
    dual_stack = False

    # Set per instance by ProbeServer.
    software: str = "k8s_http"     # the Server header: the application's name
    registry: CollectorRegistry | None = None
    healthz: HealthChecks | None = None
    readyz: HealthChecks | None = None
    tls: ssl.SSLContext | None = None
    metrics_auth: Callable[[str | None], object] | None = None

    def get_request(self):
        sock, addr = super().get_request()
        if self.tls is not None:
            # The handshake happens on the handler's first read, on the
            # handler's thread and under its timeout, so a slow or plain-HTTP
            # client never holds up the accept loop.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request, client_address) -> None:
        # socketserver would print a traceback to stderr; failed handshakes and
        # dropped clients are routine on a port anyone in the cluster can reach.
        log.debug("probe server: connection from %s failed", client_address, exc_info=True)

    def server_bind(self) -> None:
        if self.dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would call socket.getfqdn(), a reverse DNS
        # lookup that can take seconds in a cluster; we never need the name.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = self.server_address[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_SECONDS
    sys_version = ""
    error_content_type = _TEXT
    error_message_format = "%(code)d %(message)s\n"

    def version_string(self) -> str:
        return f"{self.server.software} {self.sys_version}"

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _method_not_allowed(self) -> None:
        self._reply(405, b"method not allowed\n", _TEXT, head=False,
                    extra_headers={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_PATCH = do_DELETE = _method_not_allowed

    def _serve(self, *, head: bool) -> None:
        try:
            url = urlsplit(self.path)
            query = parse_qs(url.query, keep_blank_values=True)
            path = url.path
            if path == "/metrics" and self.server.registry is not None:
                self._metrics(query, head=head)
                return
            for endpoint, checks, fail_code in (("healthz", self.server.healthz, 500),
                                                ("readyz", self.server.readyz, 503)):
                if checks is None:
                    continue
                if path == f"/{endpoint}":
                    self._all_checks(endpoint, checks, fail_code, query, head=head)
                    return
                if path.startswith(f"/{endpoint}/"):
                    name = unquote(path[len(endpoint) + 2:])
                    self._one_check(name, checks, fail_code, head=head)
                    return
            self._reply(404, b"404 page not found\n", _TEXT, head=head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to answer
        except Exception:
            log.exception("probe server: %s %s failed", self.command, self.path)
            try:
                self._reply(500, b"internal server error\n", _TEXT, head=head)
            except OSError:
                pass

    def _metrics(self, query: dict[str, list[str]], *, head: bool) -> None:
        if self.server.metrics_auth is not None:
            decision = self.server.metrics_auth(self.headers.get("Authorization"))
            if decision.code != 200:
                headers = {"WWW-Authenticate": 'Bearer realm="metrics"'} \
                    if decision.code == 401 else None
                self._reply(decision.code, f"{decision.reason}\n".encode("utf-8", "replace"),
                            _TEXT, head=head, extra_headers=headers)
                return
        registry = self.server.registry
        names = query.get("name[]")
        if names:   # Prometheus' `?name[]=x` filter, as prometheus-client's own handler
            registry = registry.restricted_registry(names)
        try:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        except Exception:  # an Accept header prometheus-client cannot parse
            encoder, content_type = generate_latest, CONTENT_TYPE_PLAIN_0_0_4
        if encoder is generate_latest:      # the text format: bucket bounds as Go writes them
            encoder = generate_text
        self._reply(200, encoder(registry), content_type, head=head)

    def _all_checks(self, endpoint: str, checks: HealthChecks, fail_code: int,
                    query: dict[str, list[str]], *, head: bool) -> None:
        results = checks.run(exclude=query.get("exclude", ()))
        failed = any(not ok for _, ok, _ in results)
        # Like the kube-apiserver: terse "ok" when healthy, the list when asked
        # for (?verbose) or when something failed (so the kubelet's event says what).
        if not failed and "verbose" not in query:
            self._reply(200, b"ok", _TEXT, head=head)
            return
        lines = [_line(name, ok, detail) for name, ok, detail in results]
        lines.append(f"{endpoint} check {'failed' if failed else 'passed'}")
        body = ("\n".join(lines) + "\n").encode("utf-8", "backslashreplace")
        self._reply(fail_code if failed else 200, body, _TEXT, head=head)

    def _one_check(self, name: str, checks: HealthChecks, fail_code: int, *, head: bool) -> None:
        try:
            [(_, ok, detail)] = checks.run(only=name)
        except KeyError:
            self._reply(404, f"no check named {name!r}\n".encode("utf-8", "backslashreplace"),
                        _TEXT, head=head)
            return
        if ok:
            self._reply(200, b"ok", _TEXT, head=head)
        else:
            body = (_line(name, ok, detail) + "\n").encode("utf-8", "backslashreplace")
            self._reply(fail_code, body, _TEXT, head=head)

    def _reply(self, code: int, body: bytes, content_type: str, *, head: bool,
               extra_headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # Scrapes and probes every few seconds would drown the real logs.
        log.debug("probe server: %s " + format, self.address_string(), *args)


def _line(name: str, ok: bool, detail: str) -> str:
    return f"[+]{name} ok" if ok else f"[-]{name} failed: {detail}"


class ProbeServer:
    """One HTTP server on one bind address, serving what it was given.

    registry: a CollectorRegistry for `/metrics` (None: no /metrics).
    healthz / readyz: HealthChecks for those paths (None: not served).
    tls: serve HTTPS with this server-side context. metrics_auth: guards /metrics.
    server_name: the Server header, the application's name.
    Requests are handled on daemon threads; `stop()` is idempotent.
    """

    def __init__(self, bind_address: str, *, registry: CollectorRegistry | None = None,
                 healthz: HealthChecks | None = None, readyz: HealthChecks | None = None,
                 tls: ssl.SSLContext | None = None,
                 metrics_auth: Callable[[str | None], object] | None = None,
                 server_name: str = "k8s_http"):
        self.bind_address = bind_address
        self.server_name = server_name
        self._address = parse_bind_address(bind_address)  # ValueError early, before start()
        self.registry = registry
        self.healthz = healthz
        self.readyz = readyz
        self.tls = tls
        self.metrics_auth = metrics_auth
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def port(self) -> int | None:
        """The bound port once started (useful with port 0); None if disabled or not started."""
        server = self._server
        return server.server_address[1] if server is not None else None

    def start(self) -> None:
        """Bind and serve on a daemon thread. A no-op when disabled or already started.

        Raises OSError naming the address when it cannot bind (port in use,
        address not on this host).
        """
        with self._lock:
            if self._address is None or self._server is not None:
                return
            server = self._bind(*self._address)
            server.registry, server.healthz, server.readyz = self.registry, self.healthz, \
                self.readyz
            server.tls, server.metrics_auth = self.tls, self.metrics_auth
            server.software = self.server_name
            self._server = server
            self._thread = threading.Thread(target=server.serve_forever,
                                            kwargs={"poll_interval": POLL_SECONDS},
                                            name=f"probe-server-{self.port}", daemon=True)
            self._thread.start()
        log.info("serving %s on %s (port %d, %s)", ", ".join(self._paths()), self.bind_address,
                 self.port, "https" if self.tls is not None else "http")

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent; in-flight requests are abandoned."""
        with self._lock:
            server, thread = self._server, self._thread
            if server is None or thread is None:
                return
            self._thread = None
        # serve_forever() only looks at its shutdown flag between select()
        # polls (POLL_SECONDS). Shutting the listening socket down first makes
        # select() return at once (accept then fails and is ignored), so
        # stop() takes milliseconds instead of up to a poll interval.
        try:
            server.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        server.shutdown()        # sets the flag and waits for serve_forever to return
        server.server_close()
        thread.join(timeout=5)

    def _paths(self) -> list[str]:
        paths = ["/metrics"] if self.registry is not None else []
        paths += ["/healthz"] if self.healthz is not None else []
        paths += ["/readyz"] if self.readyz is not None else []
        return paths

    def _bind(self, host: str, port: int) -> _Server:
        try:
            if not host and socket.has_dualstack_ipv6():
                # ":8080" means every interface, IPv4 and IPv6, as in Go.
                try:
                    return _make_server(("::", port), socket.AF_INET6, dual_stack=True)
                except OSError as exc:
                    if exc.errno == errno.EADDRINUSE:
                        raise
                    # IPv6 present in the kernel but disabled on the host: IPv4 only.
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            return _make_server((host or "0.0.0.0", port), family)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {self.bind_address!r}: "
                                     f"{exc.strerror or exc}") from exc


# socketserver creates the socket in __init__ from class attributes, so the
# address family has to be chosen by class.
class _Server6(_Server):
    address_family = socket.AF_INET6


class _DualStackServer(_Server6):
    dual_stack = True


def _make_server(address: tuple[str, int], family: int, *, dual_stack: bool = False) -> _Server:
    if dual_stack:
        return _DualStackServer(address, _Handler)
    return (_Server6 if family == socket.AF_INET6 else _Server)(address, _Handler)
