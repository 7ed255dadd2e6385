"""The watch `Stream`: the body of a 200 GET, read and de-framed as it arrives.

Bypasses `http.client`'s lenient body parsing: the chunked body is de-framed
by `watchproto.ChunkedDecoder` (strict) and read with `read1()`, so events
are not held back, each read bounded by the connection's `Deadline`.
"""

from __future__ import annotations

import http.client
import socket
import threading

from .connection import READ_BYTES, Deadline
from .errors import ApiConnectionError, ApiTimeoutError
from .watchproto import ChunkedDecoder

__all__ = ["Stream"]


class Stream:
    """The body of a 200 GET, read as it arrives (a watch). Context manager.

    `read_payload()` returns the next de-framed bytes (b"" once the body ended
    cleanly, or after `close()`); `close()` may be called from any thread and
    unblocks a read in progress.
    """

    def __init__(self, conn, resp: http.client.HTTPResponse, *, read_timeout_seconds: float,
                 path: str = ""):
        self.status = resp.status
        self.headers = resp.headers
        self.path = path
        self._conn = conn
        self._resp = resp
        self._sock = conn.sock
        # Bypass http.client's (lenient) body parsing: read the buffered
        # socket file it read the headers from, and de-frame ourselves.
        self._fp = resp.fp
        self._limits: Deadline = conn.limits
        self._limits.deadline = None
        self._limits.read_timeout = read_timeout_seconds
        self.read_timeout_seconds = read_timeout_seconds
        self._decoder = ChunkedDecoder() if resp.chunked else None
        # Content-Length bytes left, or None: chunked, or delimited by EOF.
        self._remaining = None if resp.chunked else resp.length
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
        self._resp.close()
        self._conn.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Stream(GET {self.path}, status={self.status})"
