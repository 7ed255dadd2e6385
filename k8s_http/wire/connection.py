"""Deadline-aware HTTP/1.1 connections on `http.client` + `ssl`.

`http.client` connects (TCP, TLS, a proxy's CONNECT tunnel); the exchange on
a connection is ours: `send_request` writes the request in one `sendall`,
`read_response_head` reads the status line and headers (`http.client`'s rules
and exceptions), and the body is left in the connection's `reader` (read by
`stream.read_body` or a `stream.Stream`). One request at a time per
connection, no pipelining; the reader lives as long as the connection, so a
kept-alive connection costs no new file objects per request.

Deadlines that hold against a slow or hostile server: a connect timeout, a
header timeout (the status line and headers must all arrive within it, even if
they trickle in a byte at a time) and a total deadline per attempt for the
body. Every socket read is bounded by what is left of the current deadline
(`Deadline`, read through `_DeadlineReader`), so no single slow read can
outlive it (by more than `TIMEOUT_SLACK_SECONDS`). TCP keepalive notices a
peer that vanished without a byte.
"""

from __future__ import annotations

import http.client
import io
import re
import select
import socket
import ssl
import time
from collections.abc import Iterator, Mapping

__all__ = ["Deadline", "HTTPConnection", "HTTPSConnection", "Headers", "ResponseHead",
           "read_headers", "read_response_head", "bound_socket", "is_dropped", "READ_BYTES",
           "LOST"]

# TCP keepalive: probe after 30 s idle, every 10 s, give up after 3 misses.
# A peer that vanished (node died, NAT forgot us) is noticed in about a
# minute, inside the watch's 90 s stall window, even if no byte ever arrives.
TCP_KEEPALIVE_IDLE_SECONDS = 30
TCP_KEEPALIVE_INTERVAL_SECONDS = 10
TCP_KEEPALIVE_PROBES = 3

# Socket reads hand back at most this much at a time.
READ_BYTES = 64 * 1024

# The read errors that mean "the connection is gone": the server reset or
# closed it (RemoteDisconnected is a ConnectionResetError), or the body ended
# early (IncompleteRead). A GET can safely be sent again after one of these.
LOST = (ConnectionError, http.client.IncompleteRead, ssl.SSLEOFError, ssl.SSLZeroReturnError)


class Deadline:
    """The time limits for reads on one connection, changed as a request moves on.

    `deadline` (time.monotonic(), or None) ends the current phase: headers,
    then body. `read_timeout` (seconds, or None) bounds any one read (watches).
    Real time, not the injected clock: these bound real socket waits.
    """

    __slots__ = ("deadline", "read_timeout")

    def __init__(self):
        self.deadline: float | None = None
        self.read_timeout: float | None = None

    def socket_timeout(self) -> float | None:
        timeout = self.read_timeout
        if self.deadline is not None:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("deadline passed")
            timeout = remaining if timeout is None else min(timeout, remaining)
        return timeout


# How far past its deadline a socket wait may end. Setting a socket's timeout
# is a system call that also releases the GIL (a busy process then waits to
# get it back), so a timeout set a moment ago is kept while it ends at most
# this much after the deadline, instead of being set again before every recv.
TIMEOUT_SLACK_SECONDS = 0.05


def _may_keep(current: float | None, wanted: float | None) -> bool:
    """Whether a socket whose timeout is `current` bounds a wait as `wanted` asks:
    not longer than `wanted` + slack. A shorter one is kept too: a recv it
    times out early is retried (`_DeadlineReader`), a send only ever gets the
    timeout set for it (`bound_socket`)."""
    if current is None:
        return wanted is None
    return wanted is None or current - wanted <= TIMEOUT_SLACK_SECONDS


def bound_socket(sock: socket.socket, limits: Deadline) -> None:
    """Make the socket's timeout what `limits` allow, give or take the slack: for a
    send, which has no second try, a timeout much shorter than allowed would fail
    the request, so it is not kept as a read's is."""
    wanted = limits.socket_timeout()        # TimeoutError once the deadline has passed
    current = sock.gettimeout()
    if current is None or wanted is None or abs(current - wanted) > TIMEOUT_SLACK_SECONDS:
        sock.settimeout(wanted)


class _DeadlineReader(io.RawIOBase):
    """The socket as a raw stream in which every recv is bounded by a `Deadline`.

    A server trickling one byte just inside each socket timeout cannot stretch
    a read past the deadline, because the allowed wait is recomputed for every
    recv. The socket's timeout is set only when it would let a recv outlive
    the deadline (see `TIMEOUT_SLACK_SECONDS`); one shorter than allowed is
    kept, and a recv it times out before the deadline is simply made again.
    """

    def __init__(self, sock: socket.socket, limits: Deadline):
        self._sock = sock
        self._limits = limits

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        sock = self._sock
        while True:
            wanted = self._limits.socket_timeout()   # TimeoutError once the deadline passed
            current = sock.gettimeout()
            if not _may_keep(current, wanted):
                sock.settimeout(wanted)
                current = wanted
            try:
                return sock.recv_into(buffer)
            except TimeoutError:
                if wanted is not None and current >= wanted:
                    raise                       # the whole allowed wait has passed
                # An early timeout (the socket's was shorter than allowed): wait on.


# The limits http.client puts on a response's header block.
MAX_HEADER_LINE_BYTES = 65536
MAX_HEADERS = 100


class Headers(Mapping):
    """A response's header fields: names case-insensitive, every value of a repeated
    name kept (`get_all`); `get` and `[]` give the first. What http.client's
    HTTPMessage offers for reading, without the email parser behind it."""

    def __init__(self, fields: list[tuple[str, str]]):
        self._fields = fields
        self._by_name: dict[str, list[str]] = {}
        for name, value in fields:
            self._by_name.setdefault(name.lower(), []).append(value)

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()][0]

    def get(self, name: str, default=None):
        values = self._by_name.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, failobj=None) -> list[str] | None:
        values = self._by_name.get(name.lower())
        return list(values) if values else failobj

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def items(self) -> list[tuple[str, str]]:        # every field, repeated names included
        return list(self._fields)

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


def read_headers(fp) -> Headers:
    """Read a header block up to its empty line, within http.client's limits.

    http.client hands the block to the email package's parser, which was the
    largest single cost of a request in the burst profile; header fields are
    simple enough to split here. A line without a colon is skipped; a line
    starting with a space or tab continues the field before it (obsolete folding).
    """
    fields: list[tuple[str, str]] = []
    while True:
        line = fp.readline(MAX_HEADER_LINE_BYTES + 1)
        if len(line) > MAX_HEADER_LINE_BYTES:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return Headers(fields)
        if len(fields) >= MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t"):
            if fields:
                name, value = fields[-1]
                fields[-1] = (name, f"{value} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if colon and name.strip():
            fields.append((name.strip(), value.strip()))


# Characters a request target or header value must not contain (request splitting).
_UNSAFE_IN_TARGET = re.compile(r"[\x00-\x20\x7f]")


class ResponseHead:
    """A response's status line and headers; its body is still unread in `fp`
    (`length` bytes, chunked, or until the server closes)."""

    __slots__ = ("status", "reason", "version", "headers", "chunked", "length", "will_close", "fp")

    def __init__(self, status: int, reason: str, version: int, headers: Headers, fp, *,
                 method: str):
        self.status = status
        self.reason = reason
        self.version = version           # 10 or 11, as http.client
        self.headers = headers
        self.fp = fp
        self.chunked = (headers.get("transfer-encoding") or "").lower() == "chunked"
        connection = (headers.get("connection") or "").lower()
        if version == 11:
            self.will_close = "close" in connection
        else:                            # HTTP/1.0: closes unless kept alive
            self.will_close = not (headers.get("keep-alive") or "keep-alive" in connection)
        self.length: int | None = None
        length = headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            if self.length is not None and self.length < 0:
                self.length = None
        if status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or \
                100 <= status < 200 or method == "HEAD":
            self.length = 0
            self.chunked = False
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True       # the body ends when the server closes


def _read_status_line(fp) -> tuple[str, int, str]:
    """(version, status, reason), with http.client's rules and exceptions."""
    raw = fp.readline(MAX_HEADER_LINE_BYTES + 1)
    if len(raw) > MAX_HEADER_LINE_BYTES:
        raise http.client.LineTooLong("status line")
    if not raw:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    line = raw.decode("iso-8859-1")
    parts = line.split(None, 2)
    version = parts[0] if len(parts) >= 2 else ""
    if not version.startswith("HTTP/"):
        raise http.client.BadStatusLine(line)
    try:
        status = int(parts[1])
    except ValueError:
        raise http.client.BadStatusLine(line) from None
    if not 100 <= status <= 999:
        raise http.client.BadStatusLine(line)
    return version, status, parts[2] if len(parts) > 2 else ""


def read_response_head(fp, method: str) -> ResponseHead:
    """The status line and headers of the response to `method` (interim 100s
    skipped); the body is left unread in `fp`."""
    while True:
        version, status, reason = _read_status_line(fp)
        if status != http.client.CONTINUE:
            break
        read_headers(fp)                         # an interim 100 response's headers
    if version in ("HTTP/1.0", "HTTP/0.9"):
        number = 10
    elif version.startswith("HTTP/1."):
        number = 11
    else:
        raise http.client.UnknownProtocol(version)
    return ResponseHead(status, reason.strip(), number, read_headers(fp), fp, method=method)


def enable_tcp_keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", TCP_KEEPALIVE_IDLE_SECONDS),
                        ("TCP_KEEPINTVL", TCP_KEEPALIVE_INTERVAL_SECONDS),
                        ("TCP_KEEPCNT", TCP_KEEPALIVE_PROBES)):
        option = getattr(socket, name, None)
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


class _Exchange:
    """What our two connection classes add to http.client's: deadlines, and the
    request/response exchange on the connected socket."""

    limits: Deadline
    reader: io.BufferedReader | None

    def _start_exchanges(self) -> None:
        """Called once connected: the buffered reader every response is read through."""
        self.reader = io.BufferedReader(_DeadlineReader(self.sock, self.limits), READ_BYTES)

    def send_request(self, method: str, target: str, headers: Mapping[str, str],
                     body: bytes | None) -> None:
        """Write the request line, headers and body in one `sendall`, the socket
        bounded by `limits` (the caller sets the phase's deadline)."""
        if _UNSAFE_IN_TARGET.search(target) or _UNSAFE_IN_TARGET.search(method):
            raise http.client.InvalidURL(f"the request target or method contains control "
                                         f"characters or spaces: {target[:80]!r}")
        lines = [f"{method} {target} HTTP/1.1"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name} has a line break in its value")
            lines.append(f"{name}: {value}")
        lines.append("\r\n")
        data = "\r\n".join(lines).encode("latin-1")
        if body:
            data += body
        bound_socket(self.sock, self.limits)
        self.sock.sendall(data)

    def close(self) -> None:
        self.reader = None               # reads the socket, which close() closes
        super().close()


class HTTPConnection(_Exchange, http.client.HTTPConnection):
    def __init__(self, host: str, port: int, *, timeout: float, generation: int):
        super().__init__(host, port, timeout=timeout)
        self.generation = generation     # the pool drops connections of older generations
        self.limits = Deadline()
        self.reader = None

    def connect(self) -> None:
        super().connect()       # TCP, and the CONNECT tunnel if there is a proxy
        enable_tcp_keepalive(self.sock)
        self._start_exchanges()


class HTTPSConnection(_Exchange, http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, *, timeout: float, generation: int,
                 context: ssl.SSLContext, server_hostname: str):
        super().__init__(host, port, timeout=timeout, context=context)
        self.generation = generation
        self.limits = Deadline()
        self.reader = None
        self._server_hostname = server_hostname

    def connect(self) -> None:
        # Not HTTPSConnection.connect: it verifies the URL's host, and we may
        # have to verify tls-server-name instead.
        http.client.HTTPConnection.connect(self)
        enable_tcp_keepalive(self.sock)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_hostname)
        self._start_exchanges()


def is_dropped(sock: socket.socket | None) -> bool:
    """True if an idle keep-alive connection is unusable.

    An idle connection has nothing to read; if it is readable, the server
    closed it (EOF) or sent something unasked. Checking before reuse keeps a
    write from being sent into a connection the server already closed.
    """
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
