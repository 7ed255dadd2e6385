"""The demo's operator ports: never the same one twice, even when the kernel hands
a just-released port out again (as it did in CI to two operators started back to back)."""

from __future__ import annotations

import itertools
import socket

from tests.support import demo


class _KernelReusingPorts:
    """socket.socket whose bind to port 0 gets `port`, then `port` again, then later ones."""

    ports = None

    def __init__(self, *args, **kwargs):
        self._port = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def bind(self, address):
        self._port = next(self.ports)

    def getsockname(self):
        return ("127.0.0.1", self._port)

    def close(self):
        pass


def test_two_ports_in_a_row_differ_when_the_kernel_repeats_one(monkeypatch):
    # Far above the ephemeral range, so no port handed out before in this process.
    _KernelReusingPorts.ports = itertools.chain([64999, 64999], itertools.count(65000))
    monkeypatch.setattr(socket, "socket", _KernelReusingPorts)
    metrics_port, probe_port = demo.free_port(), demo.free_port()
    assert metrics_port == 64999
    assert probe_port != metrics_port
