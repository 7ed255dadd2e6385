"""Oversized and malformed watch lines leave memory where it was (docs/SPEC.md, "Malformed bytes" item 7).

The cyclic garbage collector is disabled for each test: what is freed must be
freed by reference counting alone, the moment the error is dropped. A decoder
that kept the exception it raised (whose traceback holds the decoder and its
buffer) leaked each 16 MiB buffer until a full collection -- ~800 MB for the
fifty lines below -- and these tests catch exactly that.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from prometheus_client import CollectorRegistry

from k8s_http.wire.client import WatchStream
from k8s_http.core.errors import ApiConnectionError
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import DEPLOYMENTS
from k8s_http.cache.watcher import Watcher
from k8s_http.wire.watchproto import ChunkedDecoder, ChunkedFramingError, LineDecoder, WatchDecodeError
from tests.support.clock import FakeStopEvent
from tests.support.fake_client import InMemoryApiClient

MIB = 1024 * 1024
LINES = 50
PIECE = b"x" * MIB              # one read from the socket; never a newline


@pytest.fixture
def traced():
    """tracemalloc on and the cyclic collector off; yields current() in MiB above the start."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield lambda: (tracemalloc.get_traced_memory()[0] - base) / MIB
    finally:
        tracemalloc.stop()
        if was_enabled:
            gc.enable()


def oversize_by_feed(dec: LineDecoder) -> WatchDecodeError:
    """An unterminated line fed a MiB at a time until feed() refuses it."""
    try:
        while True:
            dec.feed(PIECE)
            assert dec.next_event() is None
    except WatchDecodeError as err:
        return err


def refused(dec: LineDecoder, line: bytes) -> WatchDecodeError:
    try:
        dec.feed(line)
        dec.next_event()
    except WatchDecodeError as err:
        return err
    raise AssertionError("the line was accepted")


def oversize_complete(dec: LineDecoder) -> WatchDecodeError:
    """A complete line over the cap, refused by next_event()."""
    return refused(dec, b'{"type":"ADDED","object":{"pad":"' + PIECE * 17 + b'"}}\n')


def invalid_json(dec: LineDecoder) -> WatchDecodeError:
    """A 15 MiB line under the cap that is not JSON (the line is copied and decoded first)."""
    return refused(dec, b'{"type":"ADDED","object":' + PIECE * 15 + b'\n')


@pytest.mark.parametrize("make_error", [oversize_by_feed, oversize_complete, invalid_json])
def test_fifty_bad_lines_in_a_row_leave_memory_where_it_was(traced, make_error):
    held = []
    for _ in range(LINES):
        dec = LineDecoder()
        err = make_error(dec)
        assert err.kind in ("oversize", "json")
        with pytest.raises(WatchDecodeError):       # poisoned, and says so without the buffer
            dec.feed(b"{}\n")
        held.append(traced())
        del err, dec
    # Each line is freed when its error and decoder are dropped: nothing accumulates.
    assert traced() < 1, f"{traced():.1f} MiB still allocated after {LINES} bad lines"
    # While one error is alive its frames may name the line, its copy and its
    # text (3 x 16 MiB at most): bounded by one line, never by the count.
    assert max(held) < 56, f"up to {max(held):.1f} MiB while one error was held"


def test_a_held_oversize_error_does_not_hold_its_buffer(traced):
    # A caller may keep the error a while (a retry decision, a log record): the
    # decoder empties its buffer in place, so the frames in the traceback name
    # an empty bytearray.
    errors = [oversize_by_feed(LineDecoder()) for _ in range(LINES)]
    assert all(e.kind == "oversize" for e in errors)
    assert traced() < 8, f"{traced():.1f} MiB held by {LINES} kept errors"


def test_fifty_framing_errors_in_a_row_leave_memory_where_it_was(traced):
    for _ in range(LINES):
        dec = ChunkedDecoder(max_size_line_bytes=2 * MIB)
        with pytest.raises(ChunkedFramingError):
            dec.feed(PIECE)     # a "size line" a MiB long with no end, then its bad end
            dec.feed(PIECE + b"\r\n")
        with pytest.raises(ChunkedFramingError):
            dec.feed(b"0\r\n\r\n")
        del dec
    assert traced() < 1, f"{traced():.1f} MiB still allocated after {LINES} framing errors"


# ---------------------------------------------------------------- through the watcher

class _OversizeStream:
    """The transport's Stream, answering every read with a MiB and never a newline."""

    path = "/apis/apps/v1/deployments"

    def read_payload(self, timeout_seconds=None):
        return PIECE

    def close(self):
        pass


def sampling_client(stop, traced):
    """A list (nothing stored), then LINES watches that each send one endless line; memory
    is sampled into `client.samples` at each watch."""
    client = InMemoryApiClient()
    client.samples = []

    def watch(resource, **kwargs):
        client.samples.append(traced())      # the previous watch's line is gone by now
        if len(client.samples) > LINES:
            stop.set()
            raise ApiConnectionError("done")
        return WatchStream(_OversizeStream())
    client.watches = watch
    return client


def test_the_watcher_reconnecting_after_fifty_oversized_lines_stays_flat(traced):
    stop = FakeStopEvent()
    client = sampling_client(stop, traced)
    metrics = Metrics(CollectorRegistry())
    watcher = Watcher(client, DEPLOYMENTS, on_sync=lambda items: [], on_event=lambda t, o: None,
                      metrics=metrics, rng=lambda: 0.5)
    watcher.run(stop)
    restarts = metrics.registry.get_sample_value(
        "k8s_http_watch_restarts_total", {"resource": str(DEPLOYMENTS), "reason": "protocol"})
    assert restarts == LINES
    # At every reconnect the previous line's 16 MiB is already released (a leak
    # would add 16 MiB per line: 800 MiB by the last one).
    assert max(client.samples) < 8, [round(s, 1) for s in client.samples]
    del watcher
    assert traced() < 4
