"""Free TCP ports on 127.0.0.1 for processes a test or the demo starts."""

from __future__ import annotations

import socket

# Every port free_port has handed out in this process. A port is free when
# asked for and bound by the operator later: two asks in a row (two operators
# started back to back) can be given the same just-released port, and the second
# operator then fails to bind (seen in CI, 2026-12-03). Never handing one out twice
# closes that window; a session uses a few hundred of ~28,000 ephemeral ports.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
