"""Watch limits shared by the wire and the cache, each defined once.

A watch that sends no complete event for `WATCH_STALL_TIMEOUT_SECONDS` is
presumed dead and reconnected: the apiserver sends a bookmark about every
60 s on a quiet watch, so 90 s of silence means the stream (or the peer) is
gone. One watch line larger than `MAX_WATCH_LINE_BYTES` abandons the stream
(docs/SPEC.md, "Malformed bytes": the decoder's buffer is bounded, whatever the server sends).

The stall timeout is the default of `Informer(stall_timeout_seconds=)`, which
hands it to its `Watcher`s (cache), which pass it to `ApiClient.watch` (the
`WatchStream`'s deadline between events) and on to `Transport.stream` (as
`read_timeout_seconds`, each read's socket deadline). No other module defines it.
"""

__all__ = ["WATCH_STALL_TIMEOUT_SECONDS", "MAX_WATCH_LINE_BYTES"]

WATCH_STALL_TIMEOUT_SECONDS = 90.0

MAX_WATCH_LINE_BYTES = 16 * 1024 * 1024
