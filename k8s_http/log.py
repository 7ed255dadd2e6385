"""Logging setup: text or JSON lines, a per-reconcile context, and token redaction.

    setup_logging(level="info", fmt="auto")
    with reconcile_context("my", "default/foobar", reconcile_id):
        log.info("applied")          # carries controller, key and reconcile_id

One handler on the root logger, so every library logger (`k8s_http.*`, the
user's own) ends up in the same format. The handler has two filters:

- `ContextFilter` copies the current reconcile context (a `contextvars`
  variable, so each worker thread sees only its own) onto the record;
- `RedactFilter` renders the message once and masks bearer tokens and JWTs in
  it: a safety net, the code is not supposed to log them in the first place.

Neither the filters nor the formatters may raise: a log call with the wrong
number of arguments, a lone surrogate from the wire, or an object whose repr()
fails still produces a line. Losing the log line of a failure is worse than
an ugly one.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import json
import logging
import re
import sys
import uuid
from typing import Iterator, TextIO

__all__ = [
    "LOG_LEVELS",
    "LOG_FORMATS",
    "CONTEXT_FIELDS",
    "parse_level",
    "setup_logging",
    "reconcile_context",
    "current_context",
    "new_reconcile_id",
    "redact",
    "ContextFilter",
    "RedactFilter",
    "JsonFormatter",
    "TextFormatter",
]

# The --log-level values (SPEC §3); "warn" and "critical" are accepted aliases.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
LOG_FORMATS = ("auto", "text", "json")

# The reconcile context fields, in the order they are printed.
CONTEXT_FIELDS = ("controller", "key", "reconcile_id")

_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "k8s_http_reconcile_context", default=None)

# Attributes every LogRecord has; anything else on a record came from `extra=`
# (or from ContextFilter) and is printed as a field.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}

# Marks the handler setup_logging() installs, so a second call replaces it.
_HANDLER_MARK = "_k8s_http_handler"

_REDACTED = "[REDACTED]"
# "Bearer <token>" in any case, as in an Authorization header or a curl line.
# The token charset is RFC 6750's b64token.
_BEARER = re.compile(r"(?i)\b(bearer)(\s+|%20|=|:\s*)[A-Za-z0-9\-._~+/]+=*")
# A JWT: three base64url segments, the first two being JSON objects ('{"' ->
# "eyJ"). Service-account tokens are JWTs, so this catches them anywhere.
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")

# Longest field value kept in a line: a log line is not a place for an object dump.
_MAX_FIELD_CHARS = 8192


def parse_level(text: str | int) -> int:
    """'debug' | 'info' | 'warning' | 'error' (any case) -> a logging level.

    Raises ValueError with a message naming the bad value and the valid ones.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    level = LOG_LEVELS.get(str(text).strip().lower())
    if level is None:
        raise ValueError(f"invalid log level {text!r}: use one of debug, info, warning, error")
    return level


def redact(text: str) -> str:
    """Mask bearer tokens and JWTs in `text`."""
    if "earer" not in text and "EARER" not in text and "eyJ" not in text:
        return text  # the common case: no regex work at all
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{_REDACTED}", text)
    return _JWT.sub(_REDACTED, text)


# ---------------------------------------------------------------------------
# Reconcile context


@contextlib.contextmanager
def reconcile_context(controller: str, key: object, reconcile_id: str) -> Iterator[None]:
    """Every record logged inside carries controller, key and reconcile_id.

    This is the `log_context` callable the Runner takes. Nesting restores the
    outer context on exit; other threads never see it.
    """
    token = _CONTEXT.set({"controller": str(controller), "key": str(key),
                          "reconcile_id": str(reconcile_id)})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def current_context() -> dict[str, str]:
    """The reconcile context of the calling thread ({} outside any)."""
    return dict(_CONTEXT.get() or {})


def new_reconcile_id() -> str:
    """A fresh id for one reconcile (a UUID, as controller-runtime uses)."""
    return str(uuid.uuid4())


class ContextFilter(logging.Filter):
    """Adds the current reconcile context fields to each record.

    A field the caller passed explicitly with `extra=` wins.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CONTEXT.get()
        if ctx:
            for name, value in ctx.items():
                if not hasattr(record, name):
                    setattr(record, name, value)
        return True


class RedactFilter(logging.Filter):
    """Renders the message once, masking tokens; never rejects a record.

    Afterwards `record.msg` is the final text and `record.args` is empty, so
    the formatters (and any other handler) see the redacted message. A
    format/argument mismatch, which `logging` would report as a "Logging
    error" and drop, is turned into a readable line instead.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # wrong argument count/type, a failing __str__ ...
            message = f"{_safe_str(record.msg)} (unformattable args: {_safe_repr(record.args)})"
        record.msg = redact(message)
        record.args = None
        return True


# ---------------------------------------------------------------------------
# Formatters


def _safe_str(value: object) -> str:
    try:
        return value if isinstance(value, str) else str(value)
    except Exception:
        return _safe_repr(value)


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"


def _clip(text: str) -> str:
    if len(text) > _MAX_FIELD_CHARS:
        return text[:_MAX_FIELD_CHARS] + "...(truncated)"
    return text


def _timestamp(record: logging.LogRecord) -> str:
    """RFC 3339 UTC with milliseconds: 2024-05-01T12:00:00.123Z."""
    when = _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """Context fields first (fixed order), then any `extra=` fields."""
    out: dict[str, object] = {}
    for name in CONTEXT_FIELDS:
        if name in record.__dict__:
            out[name] = record.__dict__[name]
    for name, value in record.__dict__.items():
        if name not in _RECORD_ATTRS and name not in out and not name.startswith("_"):
            out[name] = value
    return out


class _BaseFormatter(logging.Formatter):
    def message(self, record: logging.LogRecord) -> str:
        # RedactFilter normally rendered it already; be safe without it too.
        try:
            text = record.getMessage()
        except Exception:
            text = f"{_safe_str(record.msg)} (unformattable args: {_safe_repr(record.args)})"
        return redact(text)

    def exception_text(self, record: logging.LogRecord) -> str:
        """The traceback (and stack_info), redacted; "" when there is none."""
        parts = []
        try:
            if record.exc_info and record.exc_info[0] is not None:
                parts.append(self.formatException(record.exc_info))
            elif record.exc_text:
                parts.append(record.exc_text)
            if record.stack_info:
                parts.append(self.formatStack(record.stack_info))
        except Exception as exc:  # a broken __str__ on the exception itself
            parts.append(f"<traceback unavailable: {type(exc).__name__}>")
        return redact("\n".join(parts))


class JsonFormatter(_BaseFormatter):
    """One JSON object per line: ts, level, logger, msg, context/extra fields, exc.

    ASCII-only output (`ensure_ascii`), so a lone surrogate or any other
    character the stream cannot encode is written as a JSON escape instead of
    breaking the write.
    """

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": self.message(record),
        }
        for name, value in _fields(record).items():
            if name not in doc:
                doc[name] = self._jsonable(value)
        exc = self.exception_text(record)
        if exc:
            doc["exc"] = exc
        try:
            return json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError):  # cannot happen after _jsonable; belt and braces
            return json.dumps({k: _safe_str(v) for k, v in doc.items()}, ensure_ascii=True)

    @staticmethod
    def _jsonable(value: object) -> object:
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, str):
            return redact(_clip(value))
        try:
            # Lists and dicts stay structured when they serialize cleanly.
            json.dumps(value, ensure_ascii=True, allow_nan=False)
            return value
        except (TypeError, ValueError, RecursionError):
            return redact(_clip(_safe_str(value)))


class TextFormatter(_BaseFormatter):
    """`ts LEVEL logger: msg key=value ...`, then the traceback on its own lines."""

    def format(self, record: logging.LogRecord) -> str:
        line = (f"{_timestamp(record)} {record.levelname:<7} {record.name}: "
                f"{self.message(record)}")
        for name, value in _fields(record).items():
            line += f" {name}={self._value(value)}"
        exc = self.exception_text(record)
        if exc:
            line += "\n" + exc
        return line

    @staticmethod
    def _value(value: object) -> str:
        text = redact(_clip(_safe_str(value)))
        if not text or any(c.isspace() or c in '"=' for c in text):
            return json.dumps(text, ensure_ascii=False)
        return text


class _SafeStreamHandler(logging.StreamHandler):
    """A StreamHandler whose lines always fit the stream's encoding.

    Text output keeps non-ASCII characters; what the stream cannot encode (a
    lone surrogate, or anything non-ASCII on an ASCII stream) is written as a
    backslash escape instead of raising inside emit().
    """

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        encoding = getattr(self.stream, "encoding", None) or "utf-8"
        try:
            text.encode(encoding)
        except UnicodeEncodeError:
            text = text.encode(encoding, "backslashreplace").decode(encoding)
        except LookupError:  # an encoding name Python does not know
            text = text.encode("ascii", "backslashreplace").decode("ascii")
        return text


# ---------------------------------------------------------------------------
# Setup


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def setup_logging(level: str | int = "info", fmt: str = "auto",
                  stream: TextIO | None = None) -> logging.Handler:
    """Install the runtime's handler on the root logger and return it.

    fmt: "auto" (text on a TTY, JSON lines otherwise), "text" or "json".
    stream: defaults to sys.stderr as it is at call time (not at import, so
    test runners that swap sys.stderr are honoured).

    Idempotent: a previous handler installed by this function is removed
    first, so calling it twice (e.g. tests, or a re-exec) never duplicates
    lines; the latest call's level and format win. Handlers installed by
    others are left alone. Raises ValueError for a bad level or format.
    """
    numeric = parse_level(level)
    if fmt not in LOG_FORMATS:
        raise ValueError(f"invalid log format {fmt!r}: use one of {', '.join(LOG_FORMATS)}")
    stream = stream if stream is not None else sys.stderr
    if fmt == "auto":
        fmt = "text" if _is_tty(stream) else "json"

    handler = _SafeStreamHandler(stream)
    handler.setFormatter(TextFormatter() if fmt == "text" else JsonFormatter())
    # Order matters: the context is attached before the message is rendered.
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactFilter())
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler
