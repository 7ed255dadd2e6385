"""Deadline-aware HTTP connections on `http.client` + `ssl`.

Deadlines that hold against a slow or hostile server: a connect timeout, a
header timeout (the status line and headers must all arrive within it, even if
they trickle in a byte at a time) and a total deadline per attempt for the
body. Every socket read is bounded by what is left of the current deadline
(`Deadline`, read through `_DeadlineReader`), so no single slow read can
outlive it. TCP keepalive notices a peer that vanished without a byte.
"""

from __future__ import annotations

import functools
import http.client
import io
import select
import socket
import ssl
import time
from collections.abc import Iterator, Mapping

__all__ = ["Deadline", "HTTPConnection", "HTTPSConnection", "Headers", "read_headers",
           "is_dropped", "READ_BYTES", "LOST"]

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


class _DeadlineReader(io.RawIOBase):
    """The socket as a raw stream in which every recv is bounded by a `Deadline`.

    A server trickling one byte just inside each socket timeout cannot stretch
    a read past the deadline, because the timeout is recomputed for every recv.
    """

    def __init__(self, sock: socket.socket, limits: Deadline, keep_open):
        self._sock = sock
        self._limits = limits
        # http.client's own makefile(): while it is open, closing the socket
        # object (http.client does so when the server says Connection: close)
        # leaves the descriptor open for the body still to be read.
        self._keep_open = keep_open

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self._sock.settimeout(self._limits.socket_timeout())
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._keep_open.close()
        super().close()


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


class HTTPResponse(http.client.HTTPResponse):
    """http.client's response, reading through a `_DeadlineReader`, with its own
    header parsing (`read_headers`); the body is read by http.client as before."""

    def __init__(self, sock, debuglevel=0, method=None, url=None, *, limits: Deadline):
        super().__init__(sock, debuglevel, method, url)
        self.fp = io.BufferedReader(_DeadlineReader(sock, limits, self.fp), READ_BYTES)

    def begin(self) -> None:
        """Status line and headers; sets what http.client's body reading relies on
        (version, status, chunked, length, will_close), with its rules."""
        if self.headers is not None:
            return
        while True:
            # http.client's own status-line reader: its errors (BadStatusLine,
            # RemoteDisconnected, LineTooLong) are what the transport classifies.
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            read_headers(self.fp)                    # an interim 100 response's headers
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = read_headers(self.fp)
        self.chunked = (self.headers.get("transfer-encoding") or "").lower() == "chunked"
        self.chunk_left = None
        connection = (self.headers.get("connection") or "").lower()
        if self.version == 11:
            self.will_close = "close" in connection
        else:                                        # HTTP/1.0: closes unless kept alive
            self.will_close = not (self.headers.get("keep-alive") or "keep-alive" in connection)
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            if self.length is not None and self.length < 0:
                self.length = None
        if status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or \
                100 <= status < 200 or self._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True                   # the body ends when the server closes


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


class HTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, *, timeout: float, generation: int):
        super().__init__(host, port, timeout=timeout)
        self.generation = generation     # the pool drops connections of older generations
        self.limits = Deadline()
        self.response_class = functools.partial(HTTPResponse, limits=self.limits)

    def connect(self) -> None:
        super().connect()       # TCP, and the CONNECT tunnel if there is a proxy
        enable_tcp_keepalive(self.sock)


class HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, *, timeout: float, generation: int,
                 context: ssl.SSLContext, server_hostname: str):
        super().__init__(host, port, timeout=timeout, context=context)
        self.generation = generation
        self.limits = Deadline()
        self.response_class = functools.partial(HTTPResponse, limits=self.limits)
        self._server_hostname = server_hostname

    def connect(self) -> None:
        # Not HTTPSConnection.connect: it verifies the URL's host, and we may
        # have to verify tls-server-name instead.
        http.client.HTTPConnection.connect(self)
        enable_tcp_keepalive(self.sock)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_hostname)


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
