"""Defaults shared by several layers, each defined once.

A watch that sends no complete event for `WATCH_STALL_TIMEOUT_SECONDS` is
presumed dead and reconnected: the apiserver sends a bookmark about every
60 s on a quiet watch, so 90 s of silence means the stream (or the peer) is
gone. One watch line larger than `MAX_WATCH_LINE_BYTES` abandons the stream
(docs/SPEC.md, "Malformed bytes": the decoder's buffer is bounded, whatever the server sends).
"""

__all__ = ["WATCH_STALL_TIMEOUT_SECONDS", "MAX_WATCH_LINE_BYTES"]

WATCH_STALL_TIMEOUT_SECONDS = 90.0

MAX_WATCH_LINE_BYTES = 16 * 1024 * 1024
