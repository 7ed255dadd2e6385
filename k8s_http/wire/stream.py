"""Response bodies: whole (`read_body`), or as they arrive (the watch `Stream`).

Both read the connection's buffered reader, each read bounded by the
connection's `Deadline`, and de-frame a chunked body with
`watchproto.ChunkedDecoder` (strict: a desynchronised body is a
`ProtocolError`, never garbage handed to the JSON decoder). A `Stream` reads
with `read1()`, so events are not held back.
"""

from __future__ import annotations

import http.client
import socket
import threading

from ..core.errors import ApiConnectionError, ApiTimeoutError
from .connection import READ_BYTES, Deadline, ResponseHead
from .watchproto import ChunkedDecoder

__all__ = ["Stream", "read_body"]


def read_body(head: ResponseHead) -> bytes:
    """The whole body of a response whose head was just read. A body cut short
    raises http.client.IncompleteRead (the connection was lost: a GET may be
    sent again); broken chunk framing raises ProtocolError."""
    fp = head.fp
    if head.chunked:
        decoder = ChunkedDecoder()
        parts = []
        while not decoder.done:
            data = fp.read1(READ_BYTES)
            if not data:
                raise http.client.IncompleteRead(b"".join(parts))
            parts.append(decoder.feed(data))
        return b"".join(parts)
    if head.length is None:
        return fp.read()                # delimited by the server closing the connection
    data = fp.read(head.length) if head.length else b""
    if len(data) < head.length:
        raise http.client.IncompleteRead(data, head.length - len(data))
    return data


class Stream:
    """The body of a 200 GET, read as it arrives (a watch). Context manager.

    `read_payload()` returns the next de-framed bytes (b"" once the body ended
    cleanly, or after `close()`); `close()` may be called from any thread and
    unblocks a read in progress.
    """

    def __init__(self, conn, head: ResponseHead, *, read_timeout_seconds: float,
                 path: str = ""):
        self.status = head.status
        self.headers = head.headers
        self.path = path
        self._conn = conn
        self._sock = conn.sock
        self._fp = head.fp              # the connection's reader, just past the headers
        self._limits: Deadline = conn.limits
        self._limits.deadline = None
        self._limits.read_timeout = read_timeout_seconds
        self.read_timeout_seconds = read_timeout_seconds
        self._decoder = ChunkedDecoder() if head.chunked else None
        # Content-Length bytes left, or None: chunked, or delimited by EOF.
        self._remaining = None if head.chunked else head.length
        self._ended = False         # the body ended cleanly
        self._lock = threading.Lock()
        # Invariants: once _closed is set it stays set; the socket is
        # released exactly once, by close() if no read is in progress, else
        # by the reader when its read returns (so a descriptor is never
        # closed under a thread blocked on it).
        self._closed = False
        self._reading = False
        self._released = False

    def read_payload(self, timeout_seconds: float | None = None) -> bytes:
        """The next payload bytes, as soon as any arrive; b"" at a clean end or after close().

        Waits at most `timeout_seconds` (default: the stream's read timeout)
        -> ApiTimeoutError. A body cut short -> ApiConnectionError; broken
        chunk framing -> ProtocolError.
        """
        with self._lock:
            if self._closed:
                return b""
            self._reading = True
        try:
            while not self._ended:
                self._limits.read_timeout = (self.read_timeout_seconds if timeout_seconds is None
                                             else max(timeout_seconds, 0.001))
                want = READ_BYTES if self._remaining is None else min(READ_BYTES,
                                                                      self._remaining)
                try:
                    data = self._fp.read1(want) if want else b""
                except TimeoutError:
                    if self._closed:
                        return b""
                    raise ApiTimeoutError(f"GET {self.path}: no data for "
                                          f"{self._limits.read_timeout:g}s") from None
                except (OSError, ValueError) as e:     # ValueError: file closed under us
                    if self._closed:
                        return b""
                    raise ApiConnectionError(f"GET {self.path}: connection lost mid-stream: "
                                             f"{type(e).__name__}") from e
                if self._closed:
                    return b""
                if not data:
                    if (self._decoder is not None and not self._decoder.done) or self._remaining:
                        raise ApiConnectionError(f"GET {self.path}: connection closed in the "
                                                 "middle of the body")
                    self._ended = True
                    return b""
                if self._decoder is None:
                    if self._remaining is not None:
                        self._remaining -= len(data)
                        self._ended = self._remaining == 0
                    return data
                payload = self._decoder.feed(data)      # ProtocolError on broken framing
                self._ended = self._decoder.done
                if payload:
                    return payload
            return b""
        finally:
            with self._lock:
                self._reading = False
                release = self._closed or self._ended
            if release:
                self._release()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
        if self._sock is not None:
            try:
                # The TCP socket itself, under any TLS layer: a blocked read returns.
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
            except OSError:
                pass
        if not reading:
            self._release()

    def _release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._conn.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Stream(GET {self.path}, status={self.status})"
