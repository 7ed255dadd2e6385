"""Sans-I/O watch decoding: bytes in, watch events out.

Two independent decoders, h11-style: no sockets, threads or clocks; the
caller does the I/O and feeds whatever bytes arrived.

- `ChunkedDecoder` removes HTTP/1.1 chunked framing (RFC 9112 section 7.1),
  strictly. `http.client` is lenient (it takes `0x1a`, `1_0`, `-5` as chunk
  sizes and never checks the CRLF after chunk data); a desynchronised stream
  must end in a `ProtocolError` and a reconnect, not in garbage handed to
  the JSON decoder.
- `LineDecoder` splits the de-framed payload into lines and turns each line
  into a `WatchEvent`.

Both keep their pending input in one `bytearray` and remember where the last
search stopped, so a huge chunk or line arriving one byte at a time costs
O(n) in total, and both cap what they buffer, so a hostile or broken server
cannot make the process grow without bound. After a decoder has raised, the
stream is unusable: every later call raises again.

Neither decoder keeps the exception it raised, only its text. An exception
carries its traceback, whose frames hold `self` and the buffer as locals: a
decoder referring to its own exception is a reference cycle that keeps up to
16 MiB alive until a full cyclic collection, which may never run (fifty
oversized lines leaked 800 MB that way). For the same reason a failing
decoder empties its buffer in place, so a caller that holds on to the
exception (to log it, or in a retry decision) holds an empty buffer.
"""

from __future__ import annotations

import json
import re
from typing import Iterator, NamedTuple

from ..core.errors import ProtocolError
from .defaults import MAX_WATCH_LINE_BYTES

__all__ = [
    "ChunkedDecoder",
    "cut_managed_fields",
    "ChunkedFramingError",
    "LineDecoder",
    "WatchDecodeError",
    "WatchEvent",
]

_CR = 0x0D
_LF = 0x0A

# A chunk-size line, CRLF included: 1 to 8 hex digits, then optionally
# extensions (BWS ";" ...), which are ignored but may not contain a CR.
# int(x, 16) alone would also take "0x1a", "1_0", "+5", "-5" and surrounding
# whitespace. Eight digits (4 GiB) is far more than any apiserver writes in
# one chunk.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,8})(?:[ \t]*;[^\r\n]*)?\r\n")
# The fast path between two chunks: the CRLF closing one chunk's data and the
# next size line, matched at once; a size line with extensions (which no
# apiserver sends) takes the general path through _SIZE.
_NEXT_CHUNK = re.compile(rb"\r\n([0-9A-Fa-f]{1,8})\r\n")


# ChunkedDecoder states. In _SIZE and _TRAILER it reads a CRLF-terminated
# line; in _DATA it passes `_remaining` payload bytes straight through; in
# _DATA_END it expects exactly the CRLF that closes the chunk data.
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedFramingError(ProtocolError):
    """The chunked transfer framing is broken: the stream must be abandoned."""


class ChunkedDecoder:
    """Strict HTTP/1.1 chunked framing, sans-I/O.

    ``feed(data)`` returns the payload bytes de-framed so far (possibly b"").
    ``done`` turns True once the terminating 0-size chunk and its trailer
    section (read and discarded) have been seen. A stream that ends while
    ``done`` is False was truncated.
    """

    def __init__(self, *, max_size_line_bytes: int = 1024, max_trailer_bytes: int = 16384):
        self.max_size_line_bytes = max_size_line_bytes
        self.max_trailer_bytes = max_trailer_bytes
        self._state = _SIZE
        # Invariant: _buf holds only bytes not yet consumed, i.e. the start
        # of an incomplete size line, chunk-end CRLF or trailer line. Chunk
        # data never stays in it: it is passed through as soon as it arrives.
        self._buf = bytearray()
        # No LF in _buf[:_scan]: where the search for the line end resumes.
        self._scan = 0
        self._remaining = 0        # payload bytes left in the current chunk
        self._trailer_bytes = 0    # trailer-section bytes consumed so far
        # The text of the error that broke the stream; never the exception (see above).
        self._failed: str | None = None

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> bytes:
        if self._failed is not None:
            raise ChunkedFramingError(f"stream already failed: {self._failed}")
        if not data:
            return b""
        try:
            return self._feed(data)
        except ProtocolError as err:
            self._failed = str(err)
            self._buf.clear()       # in place: the traceback's frames still name it
            raise

    def _feed(self, data: bytes) -> bytes:
        # Work on `data` itself when nothing is pending (the usual case), so
        # chunk data is copied once, into the returned payload.
        if self._buf:
            buf = self._buf
            buf += data
        else:
            buf = data if type(data) is bytes else bytes(data)
        out = []
        pos = 0                     # everything before pos is consumed
        end = len(buf)
        state = self._state
        while pos < end:
            if state == _DATA:
                take = min(self._remaining, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    state = _DATA_END
            elif state == _SIZE:
                lf = self._find_line_end(buf, pos, end, self.max_size_line_bytes + 2)
                if lf < 0:
                    break           # incomplete, and within its cap
                m = _SIZE_LINE.match(buf, pos, lf + 1)
                if m is None:
                    raise ChunkedFramingError(
                        f"invalid chunk size line {bytes(buf[pos:min(lf + 1, pos + 40)])!r}")
                pos = lf + 1
                self._remaining = int(m.group(1), 16)
                state = _DATA if self._remaining else _TRAILER
            elif state == _DATA_END:
                m = _NEXT_CHUNK.match(buf, pos)
                if m is not None:   # fast path: "\r\n<size>\r\n" all there
                    pos = m.end()
                    self._remaining = int(m.group(1), 16)
                    state = _DATA if self._remaining else _TRAILER
                    continue
                if end - pos == 1:  # only the CR so far?
                    if buf[pos] != _CR:
                        raise ChunkedFramingError("chunk data not followed by CRLF")
                    break
                if not buf.startswith(b"\r\n", pos):
                    raise ChunkedFramingError("chunk data not followed by CRLF")
                pos += 2
                state = _SIZE
            elif state == _TRAILER:
                # Trailer fields are discarded unread; only their size counts.
                lf = self._find_line_end(buf, pos, end,
                                         self.max_trailer_bytes - self._trailer_bytes)
                if lf < 0:
                    break
                if lf == pos or buf[lf - 1] != _CR:
                    raise ChunkedFramingError("bare LF in the trailer section")
                self._trailer_bytes += lf + 1 - pos
                if lf - pos == 1:   # the empty line ends the trailer section
                    state = _DONE
                pos = lf + 1
            else:
                raise ChunkedFramingError("data after the last chunk")
        self._state = state
        if buf is self._buf:
            del buf[:pos]
        elif pos < end:
            self._buf += buf[pos:]
        return b"".join(out)

    def _find_line_end(self, buf, pos: int, end: int, budget: int) -> int:
        """Index of the LF ending the line that starts at pos, or -1 if incomplete.

        Raises when the line, CRLF included, is over `budget` bytes, whether
        it is complete or not: a line cannot grow the buffer past its cap.
        """
        lf = buf.find(b"\n", pos + self._scan, end)
        if lf < 0:
            if end - pos >= budget:     # the LF is still to come: over budget
                raise ChunkedFramingError("chunk size line or trailer section over its cap")
            self._scan = end - pos
            return -1
        self._scan = 0
        if lf + 1 - pos > budget:
            raise ChunkedFramingError("chunk size line or trailer section over its cap")
        return lf


class WatchEvent(NamedTuple):
    type: str       # ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
    object: dict    # the object as sent (a Status for ERROR)


class WatchDecodeError(ProtocolError):
    """A watch line could not be decoded: the stream must be abandoned.

    `kind` is "oversize", "json", "not_object" or "utf8". The message never
    quotes the line: it may be huge, and it is the apiserver's data.
    """

    def __init__(self, kind: str, message: str):
        super().__init__(f"watch stream: {message}")
        self.kind = kind


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    # 1e999 parses as inf without going through parse_constant.
    if value - value != 0.0:
        raise ValueError("number out of range")
    return value


# Built once: json.loads(..., parse_constant=...) builds a new decoder (and
# scanner) on every call. Integers stay exact and are bounded by Python's
# int-from-string digit limit (4300 by default), which raises ValueError.
_JSON = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
# scan_once(text, 0) parses the value at offset 0 and returns (value, end);
# it skips the two whitespace regexes of decode(), which matters on the hot
# path. decode() stays the judge of anything the fast path does not consume.
_scan_json = _JSON.scan_once
_decode_json = _JSON.decode
# WatchEvent(...) runs a Python-level __new__; tuple.__new__ does the same in C.
_new_tuple = tuple.__new__

_MANAGED_FIELDS = b'"managedFields":['
_COMMA = 0x2C
_OPEN_BRACE = 0x7B


def cut_managed_fields(line: bytes | bytearray) -> bytes | bytearray | None:
    """`line` without the first managedFields key in it, or None if it cannot be cut safely.

    managedFields are often half an object's bytes and most of its JSON
    values (every field an owner set is a nested map); a client that never
    reads them need not decode them. The cut is made on the raw bytes, and
    only where the bytes prove it is structural:

    - `"managedFields":[` is a key: in valid JSON a raw, unescaped `"` is a
      string delimiter, and a string followed by `:` is a key.
    - The array ends at the first raw `]` after it when that `]` is followed
      by `,"` and a letter, or by `},"` and a letter: a letter cannot follow a
      closing quote, so that `"` opens a key, and nothing between it and the
      `]` can be inside a string. A managedFields entry has no list in it
      (manager, operation, apiVersion, time, fieldsType, fieldsV1 of nested
      maps, subresource), so the first structural `]` is the array's own.

    The apiserver writes a typed object's metadata with managedFields last
    (`]},"spec":`) and a custom resource's keys sorted (`],"name":`). If a
    future entry did hold a list, the cut would end inside the array, leave
    the rest unbalanced and so not valid JSON: the caller then decodes the
    whole line, as it does whenever this returns None. The bytes cut out are
    never looked at: a line whose only defect (bad JSON, bad UTF-8) lies inside
    them is taken, as the rest of it is sound and nothing cut is ever read.
    """
    start = line.find(_MANAGED_FIELDS)
    if start < 1:
        return None
    close = line.find(b"]", start + len(_MANAGED_FIELDS))
    if close < 0:
        return None
    after = close + 2 if line[close + 1:close + 2] == b"}" else close + 1
    if line[after:after + 2] != b',"' or not line[after + 2:after + 3].isalpha():
        return None
    before = line[start - 1]
    if before == _COMMA:                        # ...,"managedFields":[...]  -> ...
        return line[:start - 1] + line[close + 1:]
    if before == _OPEN_BRACE:                   # {"managedFields":[...],"x" -> {"x"
        return line[:start] + line[close + 2 if after == close + 1 else close + 1:]
    return None


def _decode_cut(line: bytearray) -> dict | None:
    """The line's JSON object without managedFields; None whenever the cut
    or what is left of the line is in any way doubtful (the caller then
    decodes the whole line, which is the judge of malformed input)."""
    cut = cut_managed_fields(line)
    if cut is None:
        return None
    try:
        text = cut.decode("utf-8")
        doc, end = _scan_json(text, 0)
    except (UnicodeDecodeError, ValueError, RecursionError, StopIteration):
        return None
    return doc if end == len(text) and type(doc) is dict else None


class LineDecoder:
    """Newline-delimited JSON watch events, sans-I/O.

    ``feed(bytes)`` then ``next_event()`` until it returns None (more bytes
    needed), or iterate ``events()``. Lines may end in LF or CRLF; blank lines
    are ignored. A line that is not valid UTF-8, not JSON, not a JSON object,
    or longer than ``max_line_bytes`` raises `WatchDecodeError`. A well-formed
    line that is not a usable event (unknown type, no object, a BOOKMARK
    without a resourceVersion) is skipped and counted in ``skipped``; an
    ERROR event is always returned, so that an error is never lost.
    """

    def __init__(self, *, max_line_bytes: int = MAX_WATCH_LINE_BYTES,
                 skip_managed_fields: bool = False):
        self.max_line_bytes = max_line_bytes
        # Objects come without metadata.managedFields, never decoded (see
        # cut_managed_fields), for a caller that would drop them anyway.
        self.skip_managed_fields = skip_managed_fields
        self.skipped = 0
        # Invariants: _buf[:_start] is consumed (dropped at the next feed);
        # there is no LF in _buf[_start:_scan]; an unterminated line is
        # never buffered beyond max_line_bytes + 1 (the 1 is for the CR of a
        # CRLF still to come): feed raises the moment it would be, so the
        # buffer never holds more than the cap plus one feed.
        self._buf = bytearray()
        self._start = 0
        self._scan = 0
        # (kind, message) of the error that broke the stream; never the
        # exception itself (see the module docstring).
        self._failed: tuple[str, str] | None = None

    @property
    def partial(self) -> bool:
        """Bytes of an incomplete (unterminated) line are buffered."""
        buf = self._buf
        return len(buf) > self._start and buf[-1] != _LF

    def feed(self, data: bytes) -> None:
        self._check_failed()
        buf = self._buf
        if self._start:
            # Compact. When the caller drains events between feeds, what is
            # left after the last LF came in the previous feed, so each byte
            # is moved at most once: O(n) overall.
            del buf[:self._start]
            self._scan -= self._start
            self._start = 0
        buf += data
        if len(buf) > self.max_line_bytes + 1 and buf.find(b"\n", self._scan) < 0:
            raise self._oversize()
        # Otherwise the first line is complete: next_event checks its length.

    def next_event(self) -> WatchEvent | None:
        self._check_failed()
        buf = self._buf
        while True:
            start = self._start
            lf = buf.find(b"\n", self._scan)
            if lf < 0:
                self._scan = len(buf)
                if len(buf) - start > self.max_line_bytes + 1:
                    raise self._oversize()
                return None
            self._start = self._scan = lf + 1
            end = lf - 1 if lf > start and buf[lf - 1] == _CR else lf
            if end - start > self.max_line_bytes:
                raise self._oversize()
            if end == start:
                continue            # blank line
            event = self._decode_line(buf[start:end])
            if event is not None:
                return event

    def events(self) -> Iterator[WatchEvent]:
        """Yield every event that is complete in the buffer."""
        while (event := self.next_event()) is not None:
            yield event

    def _decode_line(self, line: bytearray) -> WatchEvent | None:
        doc = _decode_cut(line) if self.skip_managed_fields else None
        if doc is None:
            doc = self._decode_whole(line)
            if doc is None:
                return None
        etype = doc.get("type")
        obj = doc.get("object")
        if type(obj) is not dict:
            if etype == "ERROR":
                # An error must never be dropped: the client raises it (as a
                # generic server error, for want of a Status).
                return WatchEvent("ERROR", {})
            self.skipped += 1
            return None
        if etype == "ADDED" or etype == "MODIFIED" or etype == "DELETED" or etype == "ERROR":
            return _new_tuple(WatchEvent, (etype, obj))
        if etype == "BOOKMARK":
            # A bookmark carries only metadata.resourceVersion (no name, no
            # uid); without it there is nothing to use it for.
            meta = obj.get("metadata")
            if type(meta) is dict and type(meta.get("resourceVersion")) is str:
                return WatchEvent(etype, obj)
        self.skipped += 1
        return None

    def _decode_whole(self, line: bytearray) -> dict | None:
        """The line's JSON object; None for a whitespace-only line; raises if it is not one."""
        # Decode UTF-8 ourselves, strictly: json.loads(bytes) would guess
        # UTF-16/32 from NUL bytes and let encoded surrogates through.
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail("utf8", "line is not valid UTF-8") from None
        try:
            try:
                doc, end = _scan_json(text, 0)
            except StopIteration:   # no value at offset 0 (leading whitespace?)
                end = -1
            if end != len(text):
                doc = _decode_json(text)
        except (ValueError, RecursionError) as err:
            # RecursionError: deeply nested input (json's C scanner recurses).
            if not text.strip():
                return None         # a whitespace-only line is a blank line
            reason = "nested too deeply" if isinstance(err, RecursionError) else "not valid JSON"
            raise self._fail("json", f"line is {reason}") from None
        if type(doc) is not dict:
            raise self._fail("not_object", "line is JSON but not an object")
        return doc

    def _check_failed(self) -> None:
        if self._failed is not None:
            kind, message = self._failed
            raise WatchDecodeError(kind, f"stream already failed: {message}")

    def _oversize(self) -> WatchDecodeError:
        return self._fail("oversize", f"line longer than {self.max_line_bytes} bytes")

    def _fail(self, kind: str, message: str) -> WatchDecodeError:
        """Poison the decoder and return the error for the caller to raise."""
        error = WatchDecodeError(kind, message)
        self._failed = (kind, str(error))
        # Release up to max_line_bytes at once, in place: the frames of the
        # traceback-to-be hold this very bytearray as a local.
        self._buf.clear()
        self._start = self._scan = 0
        return error
