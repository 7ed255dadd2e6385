"""The sans-I/O watch decoders, fed whole and one byte at a time.

Covers docs/SPEC.md "Malformed bytes from the wire", the decoding part of
items 1-15. No sockets, no sleeps. Every malformed input is fed through the
`feeding` fixture: once whole and once one byte at a time, and the outcome
must be the same.
"""

from __future__ import annotations

import http.client
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k8s_http.core.errors import ProtocolError
from k8s_http.wire.watchproto import (
    ChunkedDecoder,
    ChunkedFramingError,
    LineDecoder,
    WatchDecodeError,
    WatchEvent,
)


# ---------------------------------------------------------------- helpers

def short(value) -> str:
    """A readable test id for long byte strings."""
    text = repr(value)
    return text if len(text) <= 48 else text[:45] + "..."


def whole(data: bytes) -> list[bytes]:
    return [data]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


@pytest.fixture(params=[whole, bytewise], ids=["whole", "bytewise"])
def feeding(request):
    """Split input for feeding: whole, or one byte at a time."""
    return request.param


def dechunk(pieces: list[bytes], decoder: ChunkedDecoder | None = None) -> tuple[bytes, ChunkedDecoder]:
    decoder = decoder or ChunkedDecoder()
    return b"".join(decoder.feed(p) for p in pieces), decoder


def decode(pieces: list[bytes], decoder: LineDecoder | None = None):
    """Feed pieces, draining after each; return (events, error or None, decoder)."""
    decoder = decoder or LineDecoder()
    events = []
    try:
        for piece in pieces:
            decoder.feed(piece)
            events.extend(decoder.events())
    except WatchDecodeError as err:
        return events, err, decoder
    return events, None, decoder


def frame(payload: bytes, sizes=None) -> bytes:
    """Chunk-encode payload (one chunk, or chunks of the given sizes) plus the last chunk."""
    out, pos = bytearray(), 0
    for size in sizes or [len(payload)]:
        piece = payload[pos:pos + size]
        pos += size
        if piece:
            out += b"%x\r\n%s\r\n" % (len(piece), piece)
    assert pos >= len(payload)
    return bytes(out + b"0\r\n\r\n")


def line(event_type, obj) -> bytes:
    return json.dumps({"type": event_type, "object": obj}).encode() + b"\n"


def pod(name: str, rv: str) -> dict:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": rv}}


GOOD = line("ADDED", pod("a", "1"))
GOOD_EVENT = WatchEvent("ADDED", pod("a", "1"))


# ---------------------------------------------------------------- chunked framing

class TestChunkedValid:
    def test_decodes_chunks_and_finishes(self, feeding):
        data = b"5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n"
        payload, dec = dechunk(feeding(data))
        assert payload == b"hello, world"
        assert dec.done

    @pytest.mark.parametrize("size", [b"1A", b"1a", b"0001a", b"0000001a"])
    def test_hex_digits_case_and_leading_zeros(self, feeding, size):
        payload, dec = dechunk(feeding(size + b"\r\n" + b"x" * 26 + b"\r\n0\r\n\r\n"))
        assert payload == b"x" * 26 and dec.done

    @pytest.mark.parametrize("ext", [b";foo=bar", b";foo", b" ;foo=bar", b'\t;q="a b"', b";a=1;b=2"])
    def test_chunk_extensions_are_ignored(self, feeding, ext):  # item 3
        data = b"1a" + ext + b"\r\n" + b"y" * 26 + b"\r\n0" + ext + b"\r\n\r\n"
        payload, dec = dechunk(feeding(data))
        assert payload == b"y" * 26 and dec.done

    def test_trailers_are_read_and_discarded(self, feeding):  # item 4
        data = b"3\r\nabc\r\n0\r\nX-Checksum: 1234\r\nX-Other: y\r\n\r\n"
        payload, dec = dechunk(feeding(data))
        assert payload == b"abc"
        assert dec.done

    def test_not_done_until_the_trailer_section_ends(self):
        dec = ChunkedDecoder()
        assert dec.feed(b"3\r\nabc\r\n0\r\n") == b"abc"
        assert not dec.done
        dec.feed(b"X-A: 1\r\n")
        assert not dec.done
        dec.feed(b"\r\n")
        assert dec.done

    def test_size_line_and_trailers_exactly_at_their_caps(self, feeding):
        size_line = b"3;" + b"e" * (1024 - 2)             # 1024 bytes, CRLF excluded
        trailer = b"X: " + b"t" * (16384 - 2 - 5) + b"\r\n"  # with the final CRLF: 16384
        assert len(size_line) == 1024 and len(trailer) + 2 == 16384
        payload, dec = dechunk(feeding(size_line + b"\r\nabc\r\n0\r\n" + trailer + b"\r\n"))
        assert payload == b"abc" and dec.done

    def test_empty_feed_is_a_no_op(self):
        dec = ChunkedDecoder()
        assert dec.feed(b"") == b""
        assert dec.feed(b"2\r\nok\r\n") == b"ok"
        assert dec.feed(b"") == b""

    def test_accepts_bytearray_and_memoryview(self):
        dec = ChunkedDecoder()
        assert dec.feed(bytearray(b"2\r\nok\r\n")) == b"ok"
        assert dec.feed(memoryview(b"1\r\n!\r\n0\r\n\r\n")) == b"!"
        assert dec.done


class TestChunkedTruncated:  # item 1: EOF mid-stream is "not done", never an error
    @pytest.mark.parametrize("cut,expected", [
        (b"5", b""), (b"5\r", b""), (b"5\r\nhel", b"hel"), (b"5\r\nhello", b"hello"),
        (b"5\r\nhello\r", b"hello"), (b"5\r\nhello\r\n0\r\n", b"hello"),
        (b"5\r\nhello\r\n0\r\nX: y\r\n", b"hello"),
    ], ids=short)
    def test_truncated_stream_is_not_done(self, feeding, cut, expected):
        payload, dec = dechunk(feeding(cut))
        assert not dec.done
        assert payload == expected

    def test_truncated_mid_line_leaves_a_partial_line(self):
        payload, dec = dechunk([frame(GOOD + GOOD[:10])[:-5]])   # last chunk cut off
        assert not dec.done
        events, err, lines = decode([payload])
        assert events == [GOOD_EVENT] and err is None
        assert lines.partial


class TestChunkedMalformed:
    @pytest.mark.parametrize("size_line", [
        b"0x1a", b"0X1a", b"1_0", b"-5", b"+5", b"", b"zz", b"1g", b"x",
        b" 1a", b"1a ", b"1 a", b"\t1a", b"1a\t", b"1a\x00", b"1a,2",
        b"123456789", b"000000001", b"1a;ext\rmore",
    ], ids=short)
    @pytest.mark.parametrize("before", [b"", b"2\r\nok\r\n"], ids=["first", "after-a-chunk"])
    def test_invalid_chunk_size_line(self, feeding, size_line, before):  # item 2
        dec = ChunkedDecoder()
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(before + size_line + b"\r\n" + b"z" * 26 + b"\r\n0\r\n\r\n"), dec)

    def test_http_client_accepts_what_we_reject(self):
        """Why we frame ourselves: http.client takes these sizes as valid (item 2)."""
        for size in (b"0x5", b"0_5", b" 5 "):
            raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n"
            resp = http.client.HTTPResponse(_FakeSocket(raw))
            resp.begin()
            assert resp.read() == b"hello"
            with pytest.raises(ChunkedFramingError):
                dechunk([raw.split(b"\r\n\r\n", 1)[1]])

    def test_bare_lf_after_size(self, feeding):
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"5\nhello\r\n0\r\n\r\n"))

    def test_size_line_over_cap_is_rejected_even_without_its_end(self, feeding):  # item 3
        # No LF ever arrives: the cap must apply while the line is incomplete.
        dec = ChunkedDecoder()
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"1a;" + b"e" * 2000), dec)
        assert len(dec._buf) == 0   # the partial line is released

    def test_size_line_one_over_cap(self, feeding):
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"3;" + b"e" * (1025 - 2) + b"\r\nabc\r\n0\r\n\r\n"))

    @pytest.mark.parametrize("after", [b"X", b"\n", b"\r\r\n", b"\rX", b"0\r\n\r\n", b" \r\n"], ids=short)
    def test_missing_crlf_after_chunk_data(self, feeding, after):  # item 5
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"5\r\nhello" + after + b"0\r\n\r\n"))

    def test_chunk_longer_than_declared(self, feeding):
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"5\r\nhello world\r\n0\r\n\r\n"))

    def test_trailers_over_cap(self, feeding):  # item 4
        trailers = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(200))  # ~21 KiB
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"0\r\n" + trailers + b"\r\n"))

    def test_one_endless_trailer_line_over_cap(self, feeding):
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"0\r\nX: " + b"v" * 17000))

    def test_bare_lf_in_trailers(self, feeding):
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"0\r\nX: y\n\r\n"))

    def test_data_after_the_last_chunk(self, feeding):
        with pytest.raises(ChunkedFramingError):
            dechunk(feeding(b"0\r\n\r\n1\r\nx\r\n"))

    def test_failed_decoder_stays_failed(self):
        dec = ChunkedDecoder()
        with pytest.raises(ChunkedFramingError):
            dec.feed(b"0x5\r\n")
        with pytest.raises(ChunkedFramingError):
            dec.feed(b"5\r\nhello\r\n")

    def test_framing_error_is_a_protocol_error(self):
        assert issubclass(ChunkedFramingError, ProtocolError)


class _FakeSocket:
    """Just enough of a socket for http.client.HTTPResponse (no I/O)."""

    def __init__(self, data: bytes):
        self._data = data

    def makefile(self, mode):
        return io.BufferedReader(io.BytesIO(self._data))


class TestChunkedLinear:
    def test_huge_chunk_in_small_pieces_is_never_buffered(self):
        # Chunk data passes straight through: nothing piles up to be
        # re-copied or re-scanned, however small the pieces.
        size = 4 * 1024 * 1024
        dec = ChunkedDecoder()
        assert dec.feed(b"%x\r\n" % size) == b""
        total = 0
        piece = b"d" * 61
        while total + len(piece) <= size:
            assert dec.feed(piece) == piece
            assert len(dec._buf) == 0
            total += len(piece)
        assert dec.feed(b"d" * (size - total) + b"\r\n0\r\n\r\n") == b"d" * (size - total)
        assert dec.done

    def test_long_size_line_in_single_bytes_scans_each_byte_once(self):
        dec = ChunkedDecoder(max_size_line_bytes=1 << 20)
        dec._buf = _CountingBuffer()
        line = b"5;" + b"e" * 200_000
        for i in range(len(line)):
            dec.feed(line[i:i + 1])
        assert dec.feed(b"\r\nhello\r\n") == b"hello"
        assert dec._buf.scanned <= 2 * len(line)


class _CountingBuffer(bytearray):
    """A bytearray that counts the bytes its find() calls may look at."""

    scanned = 0

    def find(self, sub, start=0, end=None):
        stop = len(self) if end is None else end
        self.scanned += max(0, stop - start)
        return super().find(sub, start, stop)


# ---------------------------------------------------------------- watch lines

class TestLinesValid:
    def test_events_in_order(self, feeding):
        data = line("ADDED", pod("a", "1")) + line("MODIFIED", pod("a", "2")) + line("DELETED", pod("a", "3"))
        events, err, dec = decode(feeding(data))
        assert err is None
        assert events == [WatchEvent("ADDED", pod("a", "1")), WatchEvent("MODIFIED", pod("a", "2")),
                          WatchEvent("DELETED", pod("a", "3"))]
        assert events[0].type == "ADDED" and events[0].object["metadata"]["name"] == "a"
        assert not dec.partial and dec.skipped == 0

    def test_crlf_and_blank_lines(self, feeding):
        data = b"\n\r\n" + GOOD.rstrip(b"\n") + b"\r\n" + b"   \n\t\r\n" + GOOD
        events, err, _ = decode(feeding(data))
        assert err is None and events == [GOOD_EVENT, GOOD_EVENT]

    def test_next_event_returns_none_until_a_line_completes(self):
        dec = LineDecoder()
        dec.feed(GOOD[:-1])
        assert dec.next_event() is None and dec.partial
        dec.feed(b"\n")
        assert dec.partial is False
        assert dec.next_event() == GOOD_EVENT
        assert dec.next_event() is None

    def test_partial_flag(self):
        dec = LineDecoder()
        assert not dec.partial
        dec.feed(GOOD + GOOD)
        assert not dec.partial     # complete lines only, even undrained
        assert list(dec.events()) == [GOOD_EVENT, GOOD_EVENT]
        dec.feed(b"{")
        assert dec.partial

    def test_bookmark_with_only_a_resource_version(self, feeding):  # item 15
        data = b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1",' \
               b'"metadata":{"resourceVersion":"12345"}}}\n'
        events, err, dec = decode(feeding(data))
        assert err is None and dec.skipped == 0
        assert events == [WatchEvent("BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                                  "metadata": {"resourceVersion": "12345"}})]

    def test_error_events_are_returned_not_raised(self, feeding):  # item 13
        gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                "reason": "Expired", "message": "too old resource version: 1 (5)"}
        data = line("ERROR", gone) + line("ERROR", {**gone, "code": 500, "reason": "InternalError"})
        events, err, _ = decode(feeding(data))
        assert err is None
        assert [e.type for e in events] == ["ERROR", "ERROR"]
        assert [e.object["code"] for e in events] == [410, 500]

    def test_error_event_without_a_status_is_still_an_error(self):
        events, err, dec = decode([b'{"type":"ERROR"}\n{"type":"ERROR","object":"boom"}\n'])
        assert err is None
        assert events == [WatchEvent("ERROR", {}), WatchEvent("ERROR", {})]

    def test_resource_version_stays_an_opaque_string(self):  # item 12
        events, _, _ = decode([line("ADDED", pod("a", "000123")) + line("ADDED", pod("b", "9" * 40))])
        assert [e.object["metadata"]["resourceVersion"] for e in events] == ["000123", "9" * 40]

    def test_lone_surrogate_escape_is_accepted(self, feeding):  # item 11
        data = b'{"type":"ADDED","object":{"metadata":{"name":"x\\ud800y","resourceVersion":"1"}}}\n'
        events, err, _ = decode(feeding(data))
        assert err is None
        name = events[0].object["metadata"]["name"]
        assert name == "x\ud800y"
        # Whatever logs it must be able to render it.
        assert "\\ud800" in repr(name) and "\\ud800" in json.dumps(name)
        assert name.encode("utf-8", "backslashreplace") == b"x\\ud800y"

    def test_utf8_split_across_feeds(self):  # item 6
        data = line("ADDED", {"metadata": {"name": "日本-é-😀", "resourceVersion": "1"}}).replace(
            b"\\u65e5\\u672c", "日本".encode()).replace(b"\\u00e9", "é".encode()).replace(
            b"\\ud83d\\ude00", "😀".encode())
        assert "😀".encode() in data
        split = data.index("😀".encode()) + 2         # inside the 4-byte sequence
        for pieces in ([data[:split], data[split:]], bytewise(data)):
            events, err, _ = decode(pieces)
            assert err is None
            assert events == [WatchEvent("ADDED", {"metadata": {"name": "日本-é-😀", "resourceVersion": "1"}})]

    def test_floats_and_big_ints_within_bounds(self):  # item 12
        events, err, _ = decode([b'{"type":"ADDED","object":{"f":1.5e300,"i":' + b"7" * 4000 + b'}}\n'])
        assert err is None
        assert events[0].object["f"] == 1.5e300 and events[0].object["i"] == int("7" * 4000)

    def test_moderately_nested_json_is_fine(self):
        nested = b"[" * 200 + b"]" * 200
        events, err, _ = decode([b'{"type":"ADDED","object":{"n":' + nested + b'}}\n'])
        assert err is None and len(events) == 1


class TestLinesSkipped:  # item 14: ignored and counted, never raised
    @pytest.mark.parametrize("raw", [
        b'{"type":"SYNC","object":{"metadata":{}}}',
        b'{"type":"added","object":{"metadata":{}}}',
        b'{"object":{"metadata":{}}}',
        b'{"type":["ADDED"],"object":{}}',
        b'{"type":{"a":1},"object":{}}',
        b'{"type":null,"object":{}}',
        b'{"type":"ADDED"}',
        b'{"type":"ADDED","object":null}',
        b'{"type":"MODIFIED","object":[1,2]}',
        b'{"type":"DELETED","object":"pod"}',
        b'{}',
        b'{"type":"BOOKMARK","object":{}}',
        b'{"type":"BOOKMARK","object":{"metadata":{}}}',
        b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":123}}}',
        b'{"type":"BOOKMARK","object":{"metadata":"x"}}',
    ], ids=short)
    def test_unusable_event_is_skipped_and_counted(self, feeding, raw):
        events, err, dec = decode(feeding(GOOD + raw + b"\n" + GOOD))
        assert err is None
        assert events == [GOOD_EVENT, GOOD_EVENT]
        assert dec.skipped == 1


class TestLinesMalformed:  # items 7-10, 12: the stream must be abandoned
    @pytest.mark.parametrize("raw,kind", [
        (b"not json", "json"),
        (b"{", "json"),
        (b'{"type":"ADDED","object":', "json"),
        (b"{'type':'ADDED'}", "json"),
        (b'{"type":"ADDED","object":{}} trailing', "json"),
        (b'{"type":"ADDED","object":{}}{"type":"ADDED","object":{}}', "json"),
        (b'{"type":"ADDED","object":{"x":NaN}}', "json"),
        (b'{"type":"ADDED","object":{"x":Infinity}}', "json"),
        (b'{"type":"ADDED","object":{"x":-Infinity}}', "json"),
        (b'{"type":"ADDED","object":{"x":1e999}}', "json"),
        (b'{"type":"ADDED","object":{"x":-1e999}}', "json"),
        (b'{"type":"ADDED","object":{"x":' + b"9" * 5000 + b"}}", "json"),
        (b'{"type":"ADDED","object":{"x":"\x01"}}', "json"),
        (b"[]", "not_object"),
        (b'[{"type":"ADDED","object":{}}]', "not_object"),
        (b"1", "not_object"),
        (b'"ADDED"', "not_object"),
        (b"null", "not_object"),
        (b"true", "not_object"),
        (b'{"type":"ADDED","object":{"x":"\xff"}}', "utf8"),
        (b'{"type":"ADDED","object":{"x":"\xc3"}}', "utf8"),          # truncated sequence
        (b'{"type":"ADDED","object":{"x":"\xc0\xaf"}}', "utf8"),      # overlong "/"
        (b'{"type":"ADDED","object":{"x":"\xed\xa0\x80"}}', "utf8"),  # encoded surrogate
        (b'{"type":"ADDED","object":{"x":"\xf4\x90\x80\x80"}}', "utf8"),  # > U+10FFFF
    ], ids=short)
    def test_bad_line(self, feeding, raw, kind):
        events, err, dec = decode(feeding(GOOD + raw + b"\n" + GOOD))
        assert events == [GOOD_EVENT]          # what came before is delivered, once
        assert isinstance(err, WatchDecodeError) and isinstance(err, ProtocolError)
        assert err.kind == kind
        assert raw.decode("latin-1") not in str(err)   # the line is never quoted

    def test_deeply_nested_json(self, feeding):  # item 9: RecursionError, caught
        raw = b'{"type":"ADDED","object":{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n"
        events, err, _ = decode(feeding(GOOD + raw) if feeding is whole else [GOOD, raw])
        assert events == [GOOD_EVENT]
        assert err is not None and err.kind == "json"

    def test_utf16_and_bom_are_not_guessed(self):
        # json.loads(bytes) would decode these as UTF-16 / UTF-8-with-BOM.
        utf16 = '{"type":"ADDED","object":{}}'.encode("utf-16-le")
        assert json.loads(utf16) == {"type": "ADDED", "object": {}}
        for raw in (utf16, b"\xef\xbb\xbf" + GOOD.rstrip(b"\n")):
            events, err, _ = decode([raw + b"\n"])
            assert events == [] and err.kind == "json"

    def test_failed_decoder_stays_failed(self):
        dec = LineDecoder()
        dec.feed(b"[]\n" + GOOD)
        with pytest.raises(WatchDecodeError):
            dec.next_event()
        with pytest.raises(WatchDecodeError) as again:
            dec.next_event()
        assert again.value.kind == "not_object"
        with pytest.raises(WatchDecodeError):
            dec.feed(GOOD)


class TestLinesOversize:  # item 7
    CAP = 1000

    def test_line_at_the_cap_is_accepted(self, feeding):
        obj = {"metadata": {"resourceVersion": "1"}, "pad": ""}
        raw = line("ADDED", obj).rstrip(b"\n")
        raw = raw.replace(b'"pad": ""', b'"pad": "' + b"p" * (self.CAP - len(raw)) + b'"')
        assert len(raw) == self.CAP
        for ending in (b"\n", b"\r\n"):
            events, err, _ = decode(feeding(raw + ending), LineDecoder(max_line_bytes=self.CAP))
            assert err is None and len(events) == 1

    def test_complete_line_over_the_cap(self, feeding):
        raw = b'{"type":"ADDED","object":{"pad":"' + b"p" * self.CAP + b'"}}\n'
        events, err, _ = decode(feeding(GOOD + raw + GOOD), LineDecoder(max_line_bytes=self.CAP))
        assert events == [GOOD_EVENT] and err.kind == "oversize"

    def test_unterminated_line_fails_as_soon_as_it_passes_the_cap(self):
        dec = LineDecoder(max_line_bytes=self.CAP)
        dec.feed(GOOD)
        assert list(dec.events()) == [GOOD_EVENT]
        fed = 0
        with pytest.raises(WatchDecodeError) as err:
            while True:          # one byte at a time, never a newline
                dec.feed(b"x")
                fed += 1
                assert dec.next_event() is None
                assert len(dec._buf) <= self.CAP + 1
        assert err.value.kind == "oversize"
        assert fed == self.CAP + 1      # cap + 1 bytes may wait for the LF of a CRLF
        assert len(dec._buf) == 0       # the buffer is released at once

    def test_default_cap_is_16_mib_and_the_buffer_never_passes_it(self):
        dec = LineDecoder()
        piece = b"x" * (1024 * 1024)
        with pytest.raises(WatchDecodeError) as err:
            for i in range(32):
                dec.feed(piece)
                assert len(dec._buf) <= 16 * 1024 * 1024 + 1
                assert dec.next_event() is None
        assert err.value.kind == "oversize"
        assert i == 16                  # the 17th MiB crosses the cap, in feed itself

    def test_long_line_in_small_pieces_is_scanned_once(self):
        dec = LineDecoder()
        dec._buf = _CountingBuffer()
        size = 1024 * 1024
        raw = b'{"type":"ADDED","object":{"pad":"' + b"p" * size + b'"}}\n'
        for i in range(0, len(raw), 64):
            dec.feed(raw[i:i + 64])
            events = list(dec.events())
        assert len(events) == 1 and len(events[0].object["pad"]) == size
        assert dec._buf.scanned <= 2 * len(raw)


# ---------------------------------------------------------------- both together

class TestFramingAndLines:  # item 6
    def test_several_events_in_one_chunk_and_one_event_across_chunks(self, feeding):
        a, b, c = (line("ADDED", pod(n, str(i))) for i, n in enumerate("abc"))
        payload = a + b + c
        body = frame(payload, sizes=[len(a) + len(b) + 5, 3, len(c)])   # b and c cut
        framing, lines = ChunkedDecoder(), LineDecoder()
        events = []
        for piece in feeding(body):
            lines.feed(framing.feed(piece))
            events.extend(lines.events())
        assert framing.done and not lines.partial
        assert events == [WatchEvent("ADDED", pod(n, str(i))) for i, n in enumerate("abc")]


_names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12)
_events = st.lists(
    st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]), _names,
              st.integers(min_value=1, max_value=10 ** 12)),
    min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events, data=st.data())
def test_random_splits_decode_each_event_exactly_once(events, data):
    expected = []
    payload = bytearray()
    for etype, name, rv in events:
        obj = {"metadata": {"resourceVersion": str(rv)}} if etype == "BOOKMARK" else \
            {"metadata": {"name": name, "resourceVersion": str(rv)}, "data": {"k": name * 3}}
        expected.append(WatchEvent(etype, obj))
        ending = data.draw(st.sampled_from([b"\n", b"\r\n", b"\n\n"]))
        # ensure_ascii=False: multi-byte UTF-8 on the wire, to be split inside.
        payload += json.dumps({"type": etype, "object": obj}, ensure_ascii=False).encode() + ending
    sizes = data.draw(st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=40))
    sizes.append(len(payload))
    body = frame(bytes(payload), sizes)
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(body)), max_size=30)))
    framing, lines = ChunkedDecoder(), LineDecoder()
    got = []
    for start, stop in zip([0] + cuts, cuts + [len(body)]):
        lines.feed(framing.feed(body[start:stop]))
        got.extend(lines.events())
    assert framing.done
    assert got == expected
    assert lines.skipped == 0 and not lines.partial


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_truncation_anywhere_never_raises_and_never_invents_events(data):  # item 1
    payload = b"".join(line("MODIFIED", pod("p", str(i))) for i in range(5))
    body = frame(payload, sizes=[100, 7, 300, 1, 1000])
    cut = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    framing, lines = ChunkedDecoder(), LineDecoder()
    received = framing.feed(body[:cut])
    lines.feed(received)
    got = list(lines.events())
    assert not framing.done
    # Only whole lines come out, in order; whatever follows is a partial line.
    assert got == [WatchEvent("MODIFIED", pod("p", str(i))) for i in range(len(got))]
    delivered = b"".join(line("MODIFIED", pod("p", str(i))) for i in range(len(got)))
    assert received.startswith(delivered)
    assert lines.partial == (len(received) > len(delivered))
