"""One HTTP/1.1 exchange on a connection (connection.py, stream.read_body), without a network:
the request bytes, the response head, whole bodies, and the socket timeouts behind every read."""

import http.client
import io
import time

import pytest

from k8s_http.wire.connection import (TIMEOUT_SLACK_SECONDS, Deadline, HTTPConnection,
                                      _DeadlineReader, bound_socket, read_response_head)
from k8s_http.core.errors import ProtocolError
from k8s_http.wire.stream import read_body


class FakeSocket:
    """Records timeouts set and bytes sent; recv_into plays a script of byte strings
    and TimeoutErrors (each TimeoutError stands for a wait that ran out)."""

    def __init__(self, script=(), timeout=None):
        self.script = list(script)
        self.timeout = timeout
        self.set_calls = []
        self.sent = b""

    def gettimeout(self):
        return self.timeout

    def settimeout(self, value):
        self.set_calls.append(value)
        self.timeout = value

    def recv_into(self, buffer):
        item = self.script.pop(0) if self.script else b""
        if isinstance(item, BaseException):
            raise item
        buffer[:len(item)] = item
        return len(item)

    def sendall(self, data):
        self.sent += data


def limits(*, deadline_in=None, read_timeout=None) -> Deadline:
    d = Deadline()
    d.deadline = None if deadline_in is None else time.monotonic() + deadline_in
    d.read_timeout = read_timeout
    return d


def read_all(reader) -> bytes:
    buf = bytearray(64)
    n = reader.readinto(buf)
    return bytes(buf[:n])


# -- the socket timeout behind each read


def test_a_fixed_read_timeout_is_set_once_not_before_every_recv():
    sock = FakeSocket([b"a", b"b", b"c"])
    reader = _DeadlineReader(sock, limits(read_timeout=90.0))
    assert [read_all(reader) for _ in range(3)] == [b"a", b"b", b"c"]
    assert sock.set_calls == [90.0]


def test_a_timeout_that_would_outlive_the_deadline_is_shortened():
    sock = FakeSocket([b"x"], timeout=60.0)
    reader = _DeadlineReader(sock, limits(deadline_in=5.0))
    assert read_all(reader) == b"x"
    assert len(sock.set_calls) == 1 and 4.0 < sock.set_calls[0] <= 5.0


def test_a_timeout_set_a_moment_ago_is_kept_within_the_slack():
    sock = FakeSocket([b"x"], timeout=5.0 + TIMEOUT_SLACK_SECONDS / 2)
    reader = _DeadlineReader(sock, limits(deadline_in=5.0))
    assert read_all(reader) == b"x"
    assert sock.set_calls == []


def test_a_shorter_timeout_is_kept_and_its_early_expiry_is_waited_through():
    # The socket allows 1 s where the deadline allows 30: the recv it times out is made again.
    sock = FakeSocket([TimeoutError("timed out"), TimeoutError("timed out"), b"late"], timeout=1.0)
    reader = _DeadlineReader(sock, limits(deadline_in=30.0))
    assert read_all(reader) == b"late"
    assert sock.set_calls == []


def test_a_wait_as_long_as_allowed_that_times_out_is_a_timeout():
    sock = FakeSocket([TimeoutError("timed out"), b"never"])
    reader = _DeadlineReader(sock, limits(read_timeout=2.0))
    with pytest.raises(TimeoutError):
        read_all(reader)
    assert sock.set_calls == [2.0]


def test_a_passed_deadline_raises_before_any_recv():
    sock = FakeSocket([b"x"], timeout=1.0)
    reader = _DeadlineReader(sock, limits(deadline_in=-0.1))
    with pytest.raises(TimeoutError, match="deadline passed"):
        read_all(reader)
    assert sock.script == [b"x"]


def test_a_send_gets_the_whole_allowed_time_never_less():
    # A send has no second try: a socket timeout shorter than allowed is raised to it.
    sock = FakeSocket(timeout=1.0)
    bound_socket(sock, limits(deadline_in=30.0))
    assert len(sock.set_calls) == 1 and 29.0 < sock.set_calls[0] <= 30.0
    bound_socket(sock, limits(deadline_in=30.0))          # a moment later, within the slack: kept
    bound_socket(sock, limits(deadline_in=30.0 - TIMEOUT_SLACK_SECONDS / 2))
    assert len(sock.set_calls) == 1
    bound_socket(sock, limits(deadline_in=10.0))          # much shorter: set
    assert len(sock.set_calls) == 2 and sock.set_calls[1] <= 10.0


# -- the request


def connection_on(sock: FakeSocket) -> HTTPConnection:
    conn = HTTPConnection("apiserver.test", 6443, timeout=10, generation=0)
    conn.sock = sock
    conn._start_exchanges()
    conn.limits.deadline = time.monotonic() + 30
    return conn


def test_the_request_goes_out_in_one_send_with_its_headers_and_body():
    sock = FakeSocket()
    conn = connection_on(sock)
    conn.send_request("PATCH", "/api/v1/namespaces/a/configmaps/b?fieldManager=x",
                      {"Host": "apiserver.test:6443", "Content-Length": "2"}, b"{}")
    assert sock.sent == (b"PATCH /api/v1/namespaces/a/configmaps/b?fieldManager=x HTTP/1.1\r\n"
                         b"Host: apiserver.test:6443\r\nContent-Length: 2\r\n\r\n{}")


@pytest.mark.parametrize("target", ["/api/v1/a b", "/api/v1/a\r\nX-Injected: 1", "/a\x00"])
def test_a_target_that_would_split_the_request_is_refused_unsent(target):
    sock = FakeSocket()
    with pytest.raises(http.client.InvalidURL):
        connection_on(sock).send_request("GET", target, {"Host": "h"}, None)
    assert sock.sent == b""


def test_a_header_value_with_a_line_break_is_refused_unsent():
    sock = FakeSocket()
    with pytest.raises(ValueError, match="User-Agent"):
        connection_on(sock).send_request("GET", "/", {"User-Agent": "a\r\nX: 1"}, None)
    assert sock.sent == b""


# -- the response


def head_of(raw: bytes, method: str = "GET"):
    return read_response_head(io.BufferedReader(io.BytesIO(raw)), method)


def test_a_response_with_a_content_length():
    head = head_of(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nAudit-Id: 1\r\n\r\nhello")
    assert (head.status, head.reason, head.version, head.length, head.chunked,
            head.will_close) == (201, "Created", 11, 5, False, False)
    assert head.headers["audit-id"] == "1"
    assert read_body(head) == b"hello"


def test_a_chunked_response_is_de_framed_strictly():
    head = head_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\nTrailer: x\r\n\r\n")
    assert head.chunked and read_body(head) == b"hello!"
    broken = head_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n")
    with pytest.raises(ProtocolError):
        read_body(broken)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
])
def test_a_body_cut_short_is_an_incomplete_read(raw):
    with pytest.raises(http.client.IncompleteRead):
        read_body(head_of(raw))


def test_without_a_length_the_body_ends_when_the_server_closes():
    head = head_of(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
    assert head.will_close and head.length is None and read_body(head) == b"until the end"
    old = head_of(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert old.version == 10 and old.will_close and read_body(old) == b"ok"
    kept = head_of(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    assert kept.will_close


def test_no_body_after_a_204_a_304_or_a_head_request():
    assert read_body(head_of(b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n")) == b""
    assert read_body(head_of(b"HTTP/1.1 304 Not Modified\r\n\r\n")) == b""
    head = head_of(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", method="HEAD")
    assert head.length == 0 and not head.will_close and read_body(head) == b""


def test_interim_100_responses_are_skipped():
    head = head_of(b"HTTP/1.1 100 Continue\r\nX: 1\r\n\r\n"
                   b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert head.status == 200 and "X" not in head.headers and read_body(head) == b"ok"


@pytest.mark.parametrize("raw, error", [
    (b"", http.client.RemoteDisconnected),
    (b"garbage\r\n\r\n", http.client.BadStatusLine),
    (b"HTTP/1.1 abc OK\r\n\r\n", http.client.BadStatusLine),
    (b"HTTP/1.1 42 Odd\r\n\r\n", http.client.BadStatusLine),
    (b"HTTP/2.0 200 OK\r\n\r\n", http.client.UnknownProtocol),
    (b"HTTP/1.1 200 " + b"x" * 70000 + b"\r\n\r\n", http.client.LineTooLong),
])
def test_a_broken_status_line_raises_what_http_client_would(raw, error):
    with pytest.raises(error):
        head_of(raw)
