"""A fault-injecting HTTP proxy between the operator and a real kube-apiserver.

    proxy = FaultProxy(plane.server, plane.admin_ssl_context()).start()
    proxy.write_kubeconfig(path)          # the operator talks plain HTTP to the proxy
    proxy.arm("429_retry_after", count=3) # the next 3 non-watch requests get a 429
    proxy.arm("reset", resource="my")     # an open watch on `my` is reset
    proxy.refuse(30)                      # connections refused for 30 s
    proxy.injected                        # Counter: fault -> times it was applied

The operator connects over plain HTTP with no credentials; the proxy
re-originates every request over TLS with the credentials of the context it
was given (the control plane's admin certificate), one upstream connection per
client connection, and relays answers. Watch answers are relayed line by line
(one event per chunk), so faults can be put into an open stream. Stdlib only.

Faults, each applied once per `arm(..., count=n)`:

request faults (the next matching request; watches excluded unless said):
  429_retry_after  429 with Retry-After: 1          429       429 without Retry-After
  503              503 without Retry-After          gone_watch  HTTP 410 to the next watch
  lost_answer      a write is forwarded and done upstream, then the client
                   connection is reset before any answer (the client cannot know)
stream faults (one open watch, of `resource` if given):
  reset       RST mid-stream                   gone_event   an ERROR event with a 410 Status
  silent      nothing more is sent (upstream closed), until the client gives up or
              `silent_seconds` pass (then a reset)
  oversize    a 17 MiB line                    not_json / not_object / bad_utf8 / nested
  bad_chunk   an invalid chunk-size line       (malformed lines, one each)
refuse(seconds): the listening socket is closed and every client connection cut;
  it reopens on the same port afterwards.
partition(seconds): a network partition: nothing is relayed either way for `seconds`
  (requests and watch lines wait, connections are accepted but not answered), then
  everything held flows again, as TCP would deliver it once the network heals.

An upstream that cannot be reached (the apiserver killed) cuts the client
connection, as a load balancer with no backend would.
"""

from __future__ import annotations

import collections
import http.client
import json
import queue
import select
import socket
import ssl
import struct
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

__all__ = ["FaultProxy", "REQUEST_FAULTS", "STREAM_FAULTS"]

REQUEST_FAULTS = ("429_retry_after", "429", "503", "gone_watch", "lost_answer")
STREAM_FAULTS = ("reset", "gone_event", "silent", "oversize", "not_json", "not_object",
                 "bad_utf8", "nested", "bad_chunk")
_WRITES = ("POST", "PUT", "PATCH", "DELETE")
# Hop-by-hop headers, and what the proxy sets itself.
_DROP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                 "content-length", "te", "trailer", "upgrade"}
_MAX_HEADER_BYTES = 65536
_POLL_SECONDS = 0.2
# socket -> its makefile("rb") reader, for _reset. socket.socket has __slots__.
_RFILES: dict = {}

_MALFORMED_LINES = {
    "not_json": b"this is not json\n",
    "not_object": b"[1, 2, 3]\n",
    "bad_utf8": b'{"type":"ADDED","object":{"metadata":{"name":"\xff\xfe"}}}\n',
    "nested": b"[" * 100_000 + b"\n",
}


def _status(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message, "reason": reason,
                       "code": code}).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _shut(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _hung_up(sock: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and not sock.recv(1, socket.MSG_PEEK)
    except (OSError, ValueError):
        return True


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN.

    socket.close() only drops a reference while a makefile() object is open on
    the socket, so the reading side's file is closed first (`_RFILES`) or the
    RST would wait for the serving thread to finish.
    """
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    rfile = _RFILES.pop(sock, None)
    try:
        if rfile is not None:
            rfile.close()
        sock.close()
    except OSError:
        pass


class _Armed:
    """A pending fault: how many times still to apply, and to which resource."""

    def __init__(self, fault: str, count: int, resource: str | None, params: dict):
        self.fault, self.left, self.resource, self.params = fault, count, resource, params


class _Request:
    def __init__(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes):
        self.method, self.target, self.headers, self.body = method, target, headers, body
        url = urlsplit(target)
        self.path = url.path
        query = parse_qs(url.query)
        self.watch = query.get("watch", [""])[0] in ("1", "true")

    def resource(self) -> str:
        """The collection's plural name from the path (…/my, …/deployments/x -> deployments)."""
        parts = [p for p in self.path.split("/") if p]
        if "namespaces" in parts:
            i = parts.index("namespaces")
            parts = parts[:i] + parts[i + 2:]
        return parts[3] if parts and parts[0] == "apis" and len(parts) > 3 else \
            (parts[2] if parts and parts[0] == "api" and len(parts) > 2 else "")


def _read_request(rfile) -> _Request | None:
    line = rfile.readline(_MAX_HEADER_BYTES)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers = []
    length = 0
    while True:
        h = rfile.readline(_MAX_HEADER_BYTES)
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        name, value = name.strip(), value.strip()
        if name.lower() == "content-length":
            length = int(value)
        headers.append((name, value))
    body = rfile.read(length) if length else b""
    return _Request(method, target, headers, body)


class FaultProxy:
    def __init__(self, upstream: str, ssl_context: ssl.SSLContext, *, host: str = "127.0.0.1",
                 port: int = 0):
        url = urlsplit(upstream)
        self._up_host, self._up_port = url.hostname, url.port or 443
        self._ssl = ssl_context
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []                  # guarded by _lock
        self._clients: set[socket.socket] = set()        # guarded by _lock
        self._listener: socket.socket | None = None
        self._refusing_until = 0.0
        self._partitioned_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.injected: collections.Counter = collections.Counter()
        self.injected_on: collections.Counter = collections.Counter()  # (fault, resource)
        self.requests: collections.Counter = collections.Counter()   # "GET my" -> n
        self.open_watches: collections.Counter = collections.Counter()
        # resource -> the last watch line relayed before its latest stream fault: a
        # client that read up to the fault saw it last (its resourceVersion is the client's).
        self.last_before_fault: dict[str, bytes | None] = {}

    # ---- control --------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    def start(self) -> "FaultProxy":
        self._listen()
        self._thread = threading.Thread(target=self._accept_loop, name="faultproxy-accept",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._close_listener()
        self._cut_clients()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        path = Path(path)
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "anonymous", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "anonymous",
                                                       "namespace": namespace}}],
        }))
        return path

    def arm(self, fault: str, count: int = 1, *, resource: str | None = None,
            **params) -> None:
        """Apply `fault` to the next `count` matching requests or open watches."""
        if fault not in REQUEST_FAULTS + STREAM_FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        with self._lock:
            self._armed.append(_Armed(fault, count, resource, params))

    def pending(self) -> int:
        """Armed faults not yet applied."""
        with self._lock:
            return sum(a.left for a in self._armed)

    def disarm(self) -> None:
        with self._lock:
            self._armed.clear()

    def refuse(self, seconds: float) -> None:
        """Refuse connections for `seconds` (listener closed) and cut every open one."""
        self._refusing_until = time.monotonic() + seconds
        self._close_listener()
        self._cut_clients()
        self.injected["refuse"] += 1

    def partition(self, seconds: float) -> None:
        """Drop everything for `seconds`: no byte relayed either way, nothing answered."""
        self._partitioned_until = time.monotonic() + seconds
        self.injected["partition"] += 1

    def _partitioned(self) -> bool:
        return time.monotonic() < self._partitioned_until

    def _hold_while_partitioned(self, sock: socket.socket) -> bool:
        """Wait out a partition; False if the client hung up meanwhile."""
        while self._partitioned() and not self._stop.is_set():
            if _hung_up(sock):
                return False
            time.sleep(_POLL_SECONDS)
        return True

    # ---- internals --------------------------------------------------------

    def _take(self, kinds: tuple[str, ...], resource: str, ok=lambda a: True) -> _Armed | None:
        with self._lock:
            for armed in self._armed:
                if armed.fault in kinds and armed.left > 0 and ok(armed) and \
                        (armed.resource is None or armed.resource == resource):
                    armed.left -= 1
                    self.injected[armed.fault] += 1
                    self.injected_on[(armed.fault, resource)] += 1
                    self._armed = [a for a in self._armed if a.left > 0]
                    return armed
        return None

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.listen(64)
        sock.settimeout(_POLL_SECONDS)
        self._port = sock.getsockname()[1]
        self._listener = sock

    def _close_listener(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            sock.close()

    def _cut_clients(self) -> None:
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            listener = self._listener
            if listener is None:
                if time.monotonic() >= self._refusing_until:
                    try:
                        self._listen()
                    except OSError:
                        self._stop.wait(_POLL_SECONDS)
                else:
                    self._stop.wait(_POLL_SECONDS)
                continue
            try:
                sock, _ = listener.accept()
            except (socket.timeout, OSError):
                continue
            sock.settimeout(None)
            with self._lock:
                self._clients.add(sock)
            threading.Thread(target=self._serve, args=(sock,), name="faultproxy-conn",
                             daemon=True).start()

    def _upstream(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self._up_host, self._up_port, context=self._ssl,
                                           timeout=120)

    def _serve(self, sock: socket.socket) -> None:
        upstream = None
        try:
            rfile = sock.makefile("rb")
            _RFILES[sock] = rfile             # for _reset (see there)
            while not self._stop.is_set():
                req = _read_request(rfile)
                if req is None:
                    return
                resource = req.resource()
                self.requests[f"{req.method} {resource}{' watch' if req.watch else ''}"] += 1
                if not self._hold_while_partitioned(sock):
                    return
                if self._answer_fault(sock, req, resource):
                    continue
                lost = req.method in _WRITES and self._take(("lost_answer",), resource)
                if upstream is None:
                    upstream = self._upstream()
                try:
                    headers = {k: v for k, v in req.headers if k.lower() not in _DROP_HEADERS}
                    upstream.request(req.method, req.target, body=req.body or None,
                                     headers=headers)
                    resp = upstream.getresponse()
                    if req.watch and resp.status == 200:
                        self._relay_watch(sock, upstream, resp, resource)
                        return
                    body = resp.read()
                except (OSError, http.client.HTTPException):
                    _reset(sock)              # no backend: the client sees a cut connection
                    return
                if lost:
                    _reset(sock)              # done upstream; the answer never arrives
                    return
                if not self._hold_while_partitioned(sock):
                    return
                self._send_response(sock, resp.status, resp.reason, resp.getheaders(), body)
                if resp.will_close:
                    upstream.close()
                    upstream = None
        except (OSError, ValueError):
            pass
        finally:
            _RFILES.pop(sock, None)
            with self._lock:
                self._clients.discard(sock)
            if upstream is not None:
                upstream.close()
            try:
                sock.close()
            except OSError:
                pass

    def _answer_fault(self, sock: socket.socket, req: _Request, resource: str) -> bool:
        """Answer `req` with an armed request fault instead of forwarding it; True if done."""
        if req.watch:
            armed = self._take(("gone_watch",), resource)
            if armed is None:
                return False
            self._send_status(sock, 410, "Expired", "too old resource version (fault proxy)")
            return True
        armed = self._take(("429_retry_after", "429", "503"), resource)
        if armed is None:
            return False
        if armed.fault == "503":
            self._send_status(sock, 503, "ServiceUnavailable", "unavailable (fault proxy)")
        else:
            extra = [("Retry-After", "1")] if armed.fault == "429_retry_after" else []
            self._send_status(sock, 429, "TooManyRequests", "too many requests (fault proxy)",
                              extra)
        return True

    def _send_status(self, sock, code: int, reason: str, message: str, extra=()) -> None:
        body = _status(code, reason, message)
        self._send_response(sock, code, reason, [("Content-Type", "application/json"),
                                                 *extra], body)

    @staticmethod
    def _send_response(sock, code: int, reason: str, headers, body: bytes) -> None:
        head = [f"HTTP/1.1 {code} {reason}"]
        head += [f"{k}: {v}" for k, v in headers if k.lower() not in _DROP_HEADERS]
        head.append(f"Content-Length: {len(body)}")
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    # ---- watches ----

    def _relay_watch(self, sock, upstream, resp, resource: str) -> None:
        head = [f"HTTP/1.1 200 OK"]
        head += [f"{k}: {v}" for k, v in resp.getheaders() if k.lower() not in _DROP_HEADERS]
        head += ["Transfer-Encoding: chunked", "Connection: close"]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        lines: queue.Queue = queue.Queue()

        def read_upstream() -> None:
            try:
                while True:
                    line = resp.readline()
                    lines.put(line)           # b"" is the clean end
                    if not line:
                        return
            except Exception as err:          # cut or killed upstream, or closed by us
                lines.put(err)

        reader = threading.Thread(target=read_upstream, name="faultproxy-watch", daemon=True)
        reader.start()
        with self._lock:
            self.open_watches[resource] += 1
        last_line = None
        try:
            while not self._stop.is_set():
                # A watch client never sends: readable means it hung up (or was
                # cut by refuse()). Such a relay must not take the next fault.
                if _hung_up(sock):
                    return
                if self._partitioned():       # lines wait upstream (queued) until it heals
                    time.sleep(_POLL_SECONDS)
                    continue
                armed = self._take(STREAM_FAULTS, resource)
                if armed is not None:
                    self.last_before_fault[resource] = last_line
                    _shut(upstream.sock)
                    self._stream_fault(sock, armed)
                    return
                try:
                    line = lines.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    continue
                if isinstance(line, Exception):
                    _reset(sock)
                    return
                if not line:
                    sock.sendall(b"0\r\n\r\n")
                    return
                sock.sendall(_chunk(line))
                last_line = line
        finally:
            with self._lock:
                self.open_watches[resource] -= 1
            # Shut the socket first: close() waits for the buffer lock the
            # reader thread holds while it is blocked in a read.
            _shut(upstream.sock)
            reader.join(timeout=10)
            upstream.close()

    def _stream_fault(self, sock: socket.socket, armed: _Armed) -> None:
        fault = armed.fault
        try:
            if fault == "reset":
                _reset(sock)
            elif fault == "gone_event":
                event = {"type": "ERROR", "object": json.loads(_status(
                    410, "Expired", "too old resource version (fault proxy)"))}
                sock.sendall(_chunk(json.dumps(event).encode() + b"\n") + b"0\r\n\r\n")
            elif fault == "silent":
                self._hold_silent(sock, armed.params.get("silent_seconds"))
            elif fault == "oversize":
                piece = b"x" * (1024 * 1024)
                for _ in range(17):
                    sock.sendall(_chunk(piece))
                sock.sendall(_chunk(b"\n") + b"0\r\n\r\n")
            elif fault == "bad_chunk":
                sock.sendall(b"zz\r\n{}\r\n")
            else:
                sock.sendall(_chunk(_MALFORMED_LINES[fault]))
                self._hold_silent(sock, 30)   # the client drops it at once
        except OSError:
            pass                              # the client hung up first: as it should

    def _hold_silent(self, sock: socket.socket, seconds: float | None) -> None:
        """Send nothing until the client closes, `seconds` pass (then RST), or the proxy stops."""
        deadline = None if seconds is None else time.monotonic() + seconds
        sock.settimeout(_POLL_SECONDS)
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                _reset(sock)
                return
            try:
                if not sock.recv(4096):
                    return
            except socket.timeout:
                continue


# ---- the scenario the soak cycles through and the e2e test runs once ----------------

def scenario(*, silent_seconds: float | None = None,
             refuse_seconds: float = 30.0) -> list[tuple[str, object]]:
    """[(what, apply(proxy))]: one of each fault, spread over the three watched resources.

    `silent_seconds=None` keeps a silent watch silent until the client gives up
    (its 90 s stall timeout); the e2e test cuts it short.
    """
    def arm(*args, **kwargs):
        return lambda proxy: proxy.arm(*args, **kwargs)

    def gone_on_request(proxy):
        proxy.arm("gone_watch", resource="my")
        proxy.arm("reset", resource="my")       # so that a watch request comes at once

    return [
        ("watch reset (RST) on my", arm("reset", resource="my")),
        ("ERROR event 410 on my", arm("gone_event", resource="my")),
        ("429 with Retry-After: 1, x5", arm("429_retry_after", 5)),
        ("17 MiB line on deployments", arm("oversize", resource="deployments")),
        ("429 without Retry-After, x3", arm("429", 3)),
        ("silent watch on my", arm("silent", resource="my", silent_seconds=silent_seconds)),
        ("503 without Retry-After, x3", arm("503", 3)),
        ("write done, answer lost, x2", arm("lost_answer", 2)),
        ("non-JSON line on services", arm("not_json", resource="services")),
        ("HTTP 410 to a watch request on my", gone_on_request),
        ("invalid chunk framing on deployments", arm("bad_chunk", resource="deployments")),
        (f"connections refused for {refuse_seconds:g} s", lambda p: p.refuse(refuse_seconds)),
        ("invalid UTF-8 line on my", arm("bad_utf8", resource="my")),
        ("deeply nested JSON line on services", arm("nested", resource="services")),
        ("JSON that is not an object on deployments", arm("not_object", resource="deployments")),
        ("watch reset (RST) on services", arm("reset", resource="services")),
    ]
