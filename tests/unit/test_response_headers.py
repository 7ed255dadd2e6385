"""The response header parser that replaces the email package's (connection.read_headers)."""

import http.client
import io

import pytest

from k8s_http.wire.connection import MAX_HEADERS, Headers, read_headers


def parse(block: bytes) -> Headers:
    return read_headers(io.BytesIO(block))


def test_fields_are_case_insensitive_and_repeated_names_keep_every_value():
    h = parse(b"Content-Type: application/json\r\nWarning: 299 - \"a\"\r\n"
              b"warning: 299 - \"b\"\r\nContent-Length:  12 \r\n\r\nbody")
    assert h["content-type"] == h.get("CONTENT-TYPE") == "application/json"
    assert h.get("Content-Length") == "12"
    assert h.get_all("Warning") == ['299 - "a"', '299 - "b"'] and h.get("warning") == '299 - "a"'
    assert h.get("Retry-After") is None and h.get_all("Retry-After") is None
    assert "content-type" in h and "Audit-Id" not in h and 3 not in h
    assert len(h) == 4 and list(h) == ["Content-Type", "Warning", "warning", "Content-Length"]
    assert h.items()[0] == ("Content-Type", "application/json")


def test_the_block_ends_at_the_empty_line_and_leaves_the_body_unread():
    fp = io.BytesIO(b"A: 1\n\nrest")
    assert parse(b"A: 1\n\n").get("a") == "1"
    read_headers(fp)
    assert fp.read() == b"rest"


def test_folded_lines_continue_the_field_and_lines_without_a_colon_are_skipped():
    h = parse(b"X-Long: one\r\n  two\r\n\tthree\r\nnot a header\r\n: no name\r\nB: 2\r\n\r\n")
    assert h.get("x-long") == "one two three" and h.get("b") == "2" and len(h) == 2


def test_http_client_limits_hold():
    with pytest.raises(http.client.LineTooLong):
        parse(b"X: " + b"a" * 70000 + b"\r\n\r\n")
    many = b"".join(b"H%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n"
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        parse(many)
    assert len(parse(many[: many.index(b"H100")] + b"\r\n")) == MAX_HEADERS


def test_an_end_of_stream_ends_the_block():
    assert parse(b"A: 1\r\n").get("A") == "1"


def test_non_ascii_bytes_are_read_as_latin_1():
    assert parse(b"X: caf\xe9\r\n\r\n").get("x") == "caf\u00e9"
