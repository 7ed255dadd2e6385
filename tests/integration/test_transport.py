"""Transport against the fake apiserver over TLS on 127.0.0.1: auth, retries, deadlines, TLS.

Waiting uses injected sleeps (Retry-After) or short real deadlines (a few
tenths of a second); the fake server scripts every fault.
"""

from __future__ import annotations

import logging
import select
import shutil
import socket
import threading
import time
import traceback

import pytest

from k8s_http.core import errors
from k8s_http.config.cluster import ClusterConfig, CredentialError, StaticToken, TokenFile
from k8s_http.ops.metrics import Metrics
from k8s_http.wire.transport import DEFAULT_USER_AGENT, Transport
from tests.support.certs import CLIENT_CN
from tests.support.clock import FakeClock
from tests.support.fake_apiserver import (
    FakeApiServer, chunk, close, close_after_response, http_head, raw, redirect, reset, respond,
    sequence, stall, status, status_body, too_many_requests, trickle, LAST_CHUNK, TOKEN,
)
from tests.support.wait import eventually

CM_PATH = "/api/v1/namespaces/default/configmaps"


class Sleeps(list):
    """An injected sleep: records the delays, never waits."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make_transport(server, pki, *, credentials="default", ca_data=None, **kwargs) -> Transport:
    config = ClusterConfig(server=server.url, ca_data=ca_data or pki.ca_pem,
                           credentials=StaticToken(TOKEN) if credentials == "default"
                           else credentials, **kwargs.pop("config", {}))
    kwargs.setdefault("sleep", Sleeps())
    kwargs.setdefault("metrics", Metrics())
    return Transport(config, **kwargs)


@pytest.fixture
def transport(server, pki):
    t = make_transport(server, pki)
    yield t
    t.close()


def count(transport: Transport, code: str, method: str = "GET") -> float:
    value = transport.metrics.registry.get_sample_value(
        "rest_client_requests_total", {"code": code, "method": method, "host": transport.host})
    return value or 0.0


# ---------------------------------------------------------------------------
# Auth and headers


def test_token_auth_and_request_headers(server, transport):
    resp = transport.request("GET", "/version")
    assert resp.status == 200 and resp.json()["gitVersion"].startswith("v1.")
    (req,) = server.requests
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.headers["user-agent"] == DEFAULT_USER_AGENT == "k8s_http/0.1 (python)"
    assert req.headers["accept"] == "application/json"
    assert "accept-encoding" not in req.headers      # never ask for compression
    assert transport.host == server.host
    assert count(transport, "200") == 1


def test_client_certificate_auth(pki):
    with FakeApiServer(pki=pki, client_cert_auth=True) as srv:
        with_cert = make_transport(srv, pki, credentials=None, config={
            "client_cert_pem": pki.client.cert_pem, "client_key_pem": pki.client.key_pem})
        assert with_cert.request("GET", "/version").status == 200
        assert srv.requests[-1].client_cn == CLIENT_CN
        assert "authorization" not in srv.requests[-1].headers
        without = make_transport(srv, pki, credentials=None)
        with pytest.raises(errors.UnauthorizedError):
            without.request("GET", "/version")


def test_keep_alive_connection_is_reused(server, transport):
    transport.request("GET", "/version")
    transport.request("GET", "/version")
    first, second = server.requests
    assert first.conn_id == second.conn_id
    (idle,) = transport._idle
    assert idle.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if hasattr(socket, "TCP_KEEPIDLE"):
        assert idle.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30


def _hammer(t, threads: int, requests_each: int) -> None:
    failures = []

    def worker():
        try:
            for _ in range(requests_each):
                assert t.request("GET", "/version").status == 200
        except Exception as e:      # collected, asserted below
            failures.append(e)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for th in workers:
        th.start()
    for th in workers:
        th.join(30)
    assert not failures


def test_pool_under_concurrency(server, pki):
    # A pool as large as the number of threads never has to close a connection
    # handed back, so no thread ever needs a connection it did not use before.
    t = make_transport(server, pki, pool_size=6)
    _hammer(t, threads=6, requests_each=10)
    assert len(server.requests) == 60
    assert len({r.conn_id for r in server.requests}) <= 6
    assert len(t._idle) <= 6


def test_the_pool_keeps_at_most_pool_size_idle_connections(server, pki):
    # Connections handed back beyond the cap are closed (how many new ones that
    # takes depends on how the threads interleave, so only the cap is asserted).
    t = make_transport(server, pki, pool_size=2)
    _hammer(t, threads=6, requests_each=10)
    assert len(server.requests) == 60
    assert len(t._idle) <= 2


def test_plain_http_server():
    with FakeApiServer(token=TOKEN) as srv:
        t = Transport(srv.config())
        assert srv.url.startswith("http://")
        assert t.request("GET", "/version").status == 200
        assert srv.requests[0].bearer_token == TOKEN


def test_rotated_token_file_is_reread_after_401(server, pki, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("old-token\n")
    server.token = "old-token"
    t = make_transport(server, pki, credentials=TokenFile(str(token_file), reload_seconds=3600))
    assert t.request("GET", "/version").status == 200

    # The kubelet rotates the file and the apiserver stops accepting the old token.
    token_file.write_text("new-token\n")
    server.token = "new-token"
    assert t.request("GET", "/version").status == 200
    sent = [r.bearer_token for r in server.requests]
    assert sent == ["old-token", "old-token", "new-token"]
    assert count(t, "401") == 1 and count(t, "200") == 2


def test_401_is_retried_only_once(server, transport):
    server.token = "something-else"
    with pytest.raises(errors.UnauthorizedError):
        transport.request("GET", "/version")
    assert len(server.requests) == 2


def test_token_with_header_breaking_characters_is_refused_without_echoing_it(server, pki):
    t = make_transport(server, pki, credentials=StaticToken(TOKEN + "\r\nX-Evil: 1"))
    with pytest.raises(CredentialError) as info:
        t.request("GET", "/version")
    assert TOKEN not in str(info.value) and "X-Evil" not in str(info.value)
    assert server.requests == []


# ---------------------------------------------------------------------------
# 429 / 5xx / 3xx / Status-in-200 / Content-Encoding


def test_429_with_retry_after_is_retried_after_the_delay(server, transport):
    server.script(too_many_requests(retry_after=7), times=2)
    assert transport.request("GET", "/version").status == 200
    assert transport._sleep == [7, 7]
    assert len(server.requests) == 3
    assert count(transport, "429") == 2


@pytest.mark.parametrize("header,expected", [("0", 1), ("-4", 1), ("100000", 300)])
def test_retry_after_is_clamped(server, transport, header, expected):
    server.script(respond(503, status_body(503, "ServiceUnavailable"), {"Retry-After": header}))
    transport.request("GET", "/version")
    assert transport._sleep == [expected]


def test_429_without_retry_after_is_raised(server, transport):
    server.script(too_many_requests(retry_after=None))
    with pytest.raises(errors.TooManyRequestsError) as info:
        transport.request("GET", "/version")
    assert info.value.code == 429 and info.value.reason == "TooManyRequests"
    assert len(server.requests) == 1 and transport._sleep == []


def test_5xx_without_retry_after_is_raised(server, transport):
    server.script(status(500, "InternalError", "etcd is sad"))
    with pytest.raises(errors.ServerError) as info:
        transport.request("POST", CM_PATH, body=b"{}")
    assert info.value.code == 500 and "etcd is sad" in str(info.value)
    assert len(server.requests) == 1


def test_5xx_with_retry_after_gives_up_after_max_retries(server, transport):
    server.script(respond(503, status_body(503, "ServiceUnavailable", "busy"),
                          {"Retry-After": "2"}), times=None)
    with pytest.raises(errors.ServerError) as info:
        transport.request("GET", "/version")
    assert len(server.requests) == 10 and transport._sleep == [2] * 9
    assert info.value.retry_after_seconds == 2


def test_redirect_is_not_followed_and_the_token_stays_home(server, transport, pki):
    with FakeApiServer(pki=pki) as elsewhere:
        server.script(redirect(f"{elsewhere.url}/version", 307))
        with pytest.raises(errors.RedirectError) as info:
            transport.request("GET", "/version")
        assert info.value.code == 307
        assert elsewhere.requests == []
    assert len(server.requests) == 1


def test_failure_status_inside_a_200_is_an_error(server, transport):
    server.script(respond(200, status_body(409, "Conflict", "stale")))
    with pytest.raises(errors.ConflictError) as info:
        transport.request("GET", "/version")
    assert info.value.reason == "Conflict"
    # A Success Status (e.g. from a DELETE) is an answer, not an error.
    server.script(respond(200, status_body(200, "", "", success=True)))
    assert transport.request("GET", "/version").json()["status"] == "Success"


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate"])
def test_unrequested_content_encoding_is_rejected(server, transport, encoding):
    server.script(respond(200, b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": encoding}))
    with pytest.raises(errors.ProtocolError, match="Content-Encoding"):
        transport.request("GET", "/version")


def test_identity_content_encoding_is_fine(server, transport):
    server.script(respond(200, {"ok": True}, {"Content-Encoding": "identity"}))
    assert transport.request("GET", "/version").json() == {"ok": True}


# ---------------------------------------------------------------------------
# Lost connections


def _is_post(req):
    return req.method == "POST"


def _is_get(req):
    return req.method == "GET"


@pytest.mark.parametrize("fault", [close, reset], ids=["eof", "rst"])
def test_get_is_retried_once_on_a_fresh_connection(server, transport, fault):
    transport.request("GET", "/version")                # a pooled keep-alive connection
    server.script(fault(), match=_is_get)                # the server drops it mid-request
    assert transport.request("GET", "/version").status == 200
    warm, lost, retried = server.requests
    assert lost.conn_id == warm.conn_id                  # the failure was on the pooled one
    assert retried.conn_id != warm.conn_id


def test_get_lost_twice_is_raised(server, transport):
    server.script(close(), match=_is_get, times=2)
    with pytest.raises(errors.ApiConnectionError):
        transport.request("GET", "/version")
    assert len(server.requests) == 2
    assert count(transport, "<error>") == 2


@pytest.mark.parametrize("fault", [close, reset], ids=["eof", "rst"])
def test_write_is_never_retried_after_a_lost_connection(server, transport, fault):
    transport.request("GET", "/version")
    server.script(fault(), match=_is_post)   # the server read the POST, then went away
    with pytest.raises(errors.ApiConnectionError, match="POST"):
        transport.request("POST", CM_PATH, body=b'{"metadata":{"name":"x"}}')
    assert len(server.requests_for("POST")) == 1
    assert server.objects(CM_PATH) == []


def test_idle_connection_closed_by_the_server_is_not_used(server, transport):
    # The server answers, then closes the idle keep-alive connection.
    server.script(close_after_response())
    transport.request("GET", "/version")
    eventually(lambda: server.closed_connections == 1, message="server never closed it")
    created = transport.request("POST", CM_PATH, body=b'{"metadata":{"name":"x"}}')
    assert created.status == 201
    first, post = server.requests
    assert post.conn_id != first.conn_id
    assert len(server.requests_for("POST")) == 1


# ---------------------------------------------------------------------------
# Deadlines


def test_body_trickling_past_the_total_deadline_times_out(server, pki):
    t = make_transport(server, pki, request_timeout_seconds=0.6)
    server.script(trickle(http_head(200, length=2000) + b"x" * 2000, interval_seconds=0.05))
    started = time.monotonic()
    with pytest.raises(errors.ApiTimeoutError):
        t.request("GET", "/version")
    assert time.monotonic() - started < 3.0


def test_headers_trickling_past_the_header_timeout_time_out(server, pki):
    t = make_transport(server, pki, header_timeout_seconds=0.5)
    head = http_head(200, length=2, headers={f"X-Pad-{i}": "y" * 20 for i in range(20)})
    server.script(trickle(head + b"{}", interval_seconds=0.02, step=2))
    started = time.monotonic()
    with pytest.raises(errors.ApiTimeoutError):
        t.request("GET", "/version")
    assert time.monotonic() - started < 3.0


def test_silent_server_hits_the_header_timeout(server, pki):
    t = make_transport(server, pki, header_timeout_seconds=0.3)
    server.script(stall(30))
    started = time.monotonic()
    with pytest.raises(errors.ApiTimeoutError):
        t.request("GET", "/version")
    assert time.monotonic() - started < 3.0
    assert count(t, "<error>") == 1


def test_connect_refused_is_a_connection_error(pki):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()                        # nothing listens there now
    config = ClusterConfig(server=f"https://127.0.0.1:{port}", ca_data=pki.ca_pem)
    with pytest.raises(errors.ApiConnectionError, match="cannot connect"):
        Transport(config).request("GET", "/version")


# ---------------------------------------------------------------------------
# TLS


@pytest.mark.parametrize("case,expect", [
    ("untrusted", "unable to get local issuer certificate"),
    ("wrong_san", "mismatch"),
    ("expired", "expired"),
])
def test_tls_verification_failures_never_fall_back(pki, case, expect):
    cert = {"untrusted": pki.server, "wrong_san": pki.wrong_san, "expired": pki.expired}[case]
    ca = pki.other_ca_pem if case == "untrusted" else pki.ca_pem
    with FakeApiServer(pki=pki, server_cert=cert, token=TOKEN) as srv:
        t = make_transport(srv, pki, ca_data=ca)
        for _ in range(2):          # and not on a second try either
            with pytest.raises(errors.ApiConnectionError, match="TLS verification") as info:
                t.request("GET", "/version")
            assert expect in str(info.value)
        assert srv.requests == []   # nothing, the token least of all, was sent
        assert count(t, "<error>") == 2


def test_tls_server_name_is_what_gets_verified(pki):
    with FakeApiServer(pki=pki, server_cert=pki.wrong_san, token=TOKEN) as srv:
        t = make_transport(srv, pki, config={"tls_server_name": "wrong.example.com"})
        assert t.request("GET", "/version").status == 200


def test_tls_failure_rereads_the_ca_file(server, pki, tmp_path):
    ca_file = tmp_path / "ca.crt"
    shutil.copy(pki.other_ca_cert, ca_file)     # the old CA, before a rotation
    t = make_transport(server, pki, ca_data=pki.other_ca_pem,
                       config={"ca_file": str(ca_file)})
    with pytest.raises(errors.ApiConnectionError):
        t.request("GET", "/version")
    shutil.copy(pki.ca_cert, ca_file)           # the CA bundle is rotated on disk
    with pytest.raises(errors.ApiConnectionError):
        t.request("GET", "/version")            # fails with the old CA, and re-reads the file
    assert t.request("GET", "/version").status == 200


# ---------------------------------------------------------------------------
# Proxy


class ConnectProxy:
    """A minimal HTTP CONNECT proxy that records what it was asked."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://user:pa%3Ass@127.0.0.1:{self.listener.getsockname()[1]}"
        self.connects: list[tuple[str, dict]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client):
        f = client.makefile("rb")
        target = f.readline().split()[1].decode()
        headers = {}
        while (line := f.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        self.connects.append((target, headers))
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        socks = [client, upstream]
        while not self.stopping.is_set():
            readable, _, _ = select.select(socks, [], [], 0.2)
            for s in readable:
                data = s.recv(65536)
                if not data:
                    client.close()
                    upstream.close()
                    return
                (upstream if s is client else client).sendall(data)

    def stop(self):
        self.stopping.set()
        self.listener.close()


def test_https_through_a_connect_proxy(server, pki):
    proxy = ConnectProxy()
    try:
        t = make_transport(server, pki, config={"proxy_url": proxy.url})
        assert t.request("GET", "/version").status == 200
        ((target, headers),) = proxy.connects
        assert target == server.host
        # user:pa:ss, base64
        assert headers["proxy-authorization"] == "Basic dXNlcjpwYTpzcw=="
        assert server.requests[0].headers["authorization"] == f"Bearer {TOKEN}"
    finally:
        proxy.stop()


# ---------------------------------------------------------------------------
# Rate limit and metrics


def test_client_side_token_bucket(server, pki):
    t = make_transport(server, pki, qps=2.0, burst=1, clock=FakeClock(100.0))
    for _ in range(3):
        t.request("GET", "/version")
    # Burst 1 goes at once; the next two queue behind it at 2 qps (the clock never moves).
    assert t._sleep == [0.5, 1.0]


def test_rest_client_metrics(server, transport):
    transport.request("GET", "/version")
    with pytest.raises(errors.NotFoundError):
        transport.request("GET", CM_PATH + "/missing")
    transport.request("POST", CM_PATH, body=b'{"metadata":{"name":"m"}}')
    assert count(transport, "200") == 1
    assert count(transport, "404") == 1
    assert count(transport, "201", "POST") == 1
    hist = transport.metrics.registry.get_sample_value(
        "rest_client_request_duration_seconds_count", {"verb": "GET", "host": transport.host})
    assert hist == 2


# ---------------------------------------------------------------------------
# Streams


def test_stream_reads_strict_chunked_payload(server, transport):
    server.script(raw(http_head(200, chunked=True), chunk(b"hello "), chunk(b"world"), LAST_CHUNK,
                      delay_seconds=0.05))
    with transport.stream(CM_PATH, query={"watch": "1"}) as s:
        got = b""
        while data := s.read_payload():
            got += data
    assert got == b"hello world"
    assert transport._idle == []            # a stream's connection is never pooled


def test_stream_with_content_length(server, transport):
    server.script(raw(http_head(200, length=5) + b"abcde", close_after=False))
    with transport.stream(CM_PATH) as s:
        assert s.read_payload() == b"abcde"
        assert s.read_payload() == b""


@pytest.mark.parametrize("bad", [b"0x5\r\nhello\r\n", b"1_0\r\n", b"-5\r\n", b"+5\r\nhello\r\n",
                                 b"5\r\nhelloXX", b"123456789\r\n", b"zz\r\n", b"\r\n",
                                 b"5\nhello\r\n"])
def test_stream_rejects_malformed_chunk_framing(server, transport, bad):
    server.script(raw(http_head(200, chunked=True) + bad, close_after=False))
    with transport.stream(CM_PATH) as s:
        with pytest.raises(errors.ProtocolError):
            while s.read_payload():
                pass


def test_stream_cut_mid_chunk_is_a_connection_error(server, transport):
    server.script(raw(http_head(200, chunked=True), b"20\r\nonly part"))
    with transport.stream(CM_PATH) as s:
        assert s.read_payload() == b"only part"
        with pytest.raises(errors.ApiConnectionError):
            s.read_payload()


def test_stream_error_status_is_raised_with_its_body(server, transport):
    server.script(status(403, "Forbidden", 'configmaps is forbidden: User "x" cannot watch'))
    with pytest.raises(errors.ForbiddenError, match="cannot watch"):
        transport.stream(CM_PATH)


def test_stream_close_from_another_thread_unblocks_the_reader(server, transport):
    server.script(raw(http_head(200, chunked=True), close_after=False))
    s = transport.stream(CM_PATH, read_timeout_seconds=30)
    result = []
    reader = threading.Thread(target=lambda: result.append(s.read_payload()))
    reader.start()
    eventually(lambda: s._reading, message="the reader never started reading")
    s.close()
    reader.join(5)
    assert not reader.is_alive() and result == [b""]


def test_stream_read_timeout(server, transport):
    server.script(sequence(raw(http_head(200, chunked=True), close_after=False), stall(None)))
    with transport.stream(CM_PATH, read_timeout_seconds=0.3) as s:
        with pytest.raises(errors.ApiTimeoutError):
            s.read_payload()


# ---------------------------------------------------------------------------
# Secrets


def _all_text(exc: BaseException) -> str:
    seen, parts = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def test_token_never_appears_in_exceptions_reprs_or_logs(server, pki, caplog):
    caplog.set_level(logging.DEBUG)
    t = make_transport(server, pki, header_timeout_seconds=0.3)
    texts = [repr(t), repr(t.config), repr(t.config.credentials)]
    faults = [
        (lambda: setattr(server, "token", "nope"), errors.UnauthorizedError),
        (lambda: server.script(status(500, "InternalError", "x")), errors.ServerError),
        (lambda: server.script(redirect("https://evil.example/")), errors.RedirectError),
        (lambda: server.script(close(), times=2), errors.ApiConnectionError),
        (lambda: server.script(stall(30)), errors.ApiTimeoutError),
        (lambda: server.script(respond(200, b"x", {"Content-Encoding": "gzip"})),
         errors.ProtocolError),
    ]
    for arrange, expected in faults:
        server.token = TOKEN
        server.clear_scripts()
        arrange()
        with pytest.raises(expected) as info:
            t.request("GET", "/version")
        texts.append(_all_text(info.value))
    with FakeApiServer(pki=pki, server_cert=pki.expired) as bad_tls:
        with pytest.raises(errors.ApiConnectionError) as info:
            make_transport(bad_tls, pki).request("GET", "/version")
        texts.append(_all_text(info.value))
    assert caplog.records, "expected the transport to log at DEBUG"
    texts.append(caplog.text)
    texts += [str(r.args) for r in caplog.records]
    leaked = [text for text in texts if TOKEN in text]
    assert not leaked
    # The check can fail: the token did go over the wire.
    assert any(r.bearer_token == TOKEN for r in server.requests)
