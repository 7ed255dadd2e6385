"""Logging setup: text or JSON lines, a per-reconcile context, and token redaction.

    setup_logging(level="info", fmt="auto")
    with reconcile_context("my", key, reconcile_id, kind="My", group="mine.jp"):
        log.info("applied")          # carries controller, namespace, name, reconcileID ...

The JSON lines are controller-runtime's (zap production encoder): keys
`level` (debug, info, warn, error), `ts`, `logger`, `caller` (package/file:line),
`msg`, then the reconcile context (`controller`, `controllerGroup`,
`controllerKind`, `<Kind>: {name, namespace}`, `namespace`, `name`,
`reconcileID`), any `extra=` fields, `error` (the exception's message, as
Go's err.Error() reads: no class name in front; the class name alone when the
message is empty; or an `extra={"error": ...}`) and `stacktrace` (the
traceback; for an error line without an exception, the call site's stack, as
zap adds one to every error). So a log pipeline written for controller-runtime
operators (`select(.level=="error") | .error`) reads ours unchanged. Python's
CRITICAL has no zap name below panic and is written as `error`.

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
import random
import re
import sys
import traceback
import uuid
from typing import Iterator, TextIO

__all__ = [
    "LEVEL_NAMES",
    "LOG_LEVELS",
    "LOG_FORMATS",
    "CONTEXT_FIELDS",
    "level_name",
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

# The --log-level values (SPEC §3), least severe first.
LEVEL_NAMES = ("debug", "info", "warning", "error")
# Each name's logging level; "warn" and "critical" are accepted aliases.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
LOG_FORMATS = ("auto", "text", "json")

# The reconcile context fields, in the order they are printed (controller-runtime's
# keys; the `<Kind>: {name, namespace}` object goes between controllerKind and namespace).
CONTEXT_FIELDS = ("controller", "controllerGroup", "controllerKind", "namespace", "name",
                  "reconcileID")

# The record attribute ContextFilter stores the context under: one attribute,
# because "name" (a context key) is also the logger's name on a LogRecord.
_CONTEXT_ATTR = "_k8s_http_context"

_CONTEXT: contextvars.ContextVar[dict[str, object] | None] = contextvars.ContextVar(
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
        raise ValueError(f"invalid log level {text!r}: use one of {', '.join(LEVEL_NAMES)}")
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
def reconcile_context(controller: str, key: object, reconcile_id: str, *, kind: str = "",
                      group: str = "") -> Iterator[None]:
    """Every record logged inside carries the reconcile context (controller-runtime's keys).

    `key` is an ObjectKey (or "namespace/name" text). With `kind`, the line
    also has controllerKind and the `<Kind>: {name, namespace}` object that
    controller-runtime adds; `group` gives controllerGroup ("" for the core group).
    This (with kind and group bound) is the `log_context` callable the Runner
    takes. Nesting restores the outer context on exit; other threads never see it.
    """
    namespace = getattr(key, "namespace", None)
    name = getattr(key, "name", None)
    if not isinstance(namespace, str) or not isinstance(name, str):
        namespace, _, name = str(key).rpartition("/")
    ctx: dict[str, object] = {"controller": str(controller)}
    if kind:
        ctx["controllerGroup"] = group
        ctx["controllerKind"] = kind
        ctx[kind] = {"name": name, "namespace": namespace} if namespace else {"name": name}
    if namespace:
        ctx["namespace"] = namespace
    ctx["name"] = name
    ctx["reconcileID"] = str(reconcile_id)
    token = _CONTEXT.set(ctx)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def current_context() -> dict[str, object]:
    """The reconcile context of the calling thread ({} outside any)."""
    return dict(_CONTEXT.get() or {})


def new_reconcile_id() -> str:
    """A fresh id for one reconcile: a version-4 UUID, as controller-runtime's.

    From `random` (seeded from os.urandom at start), not uuid.uuid4(): it only
    has to tell reconciles apart, and an os.urandom syscall (with its GIL
    hand-off) per reconcile showed at 14 % of the runner's own time in the
    1,000-object burst profile. 122 random bits make a collision as unlikely
    as uuid4's.
    """
    return str(uuid.UUID(int=random.getrandbits(128), version=4))


class ContextFilter(logging.Filter):
    """Attaches the current reconcile context to each record (one attribute).

    A field the caller passed explicitly with `extra=` wins over the context's.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CONTEXT.get()
        if ctx and not hasattr(record, _CONTEXT_ATTR):
            setattr(record, _CONTEXT_ATTR, ctx)
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
    """The reconcile context first (in its order), then any `extra=` fields (which win)."""
    extras = {name: value for name, value in record.__dict__.items()
              if name not in _RECORD_ATTRS and not name.startswith("_")}
    out: dict[str, object] = {}
    ctx = record.__dict__.get(_CONTEXT_ATTR)
    if isinstance(ctx, dict):
        for name, value in ctx.items():
            out[name] = extras.pop(name, value)
    out.update(extras)
    return out


def level_name(levelno: int) -> str:
    """zap's name for a logging level: debug, info, warn, error."""
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    return "info" if levelno >= logging.INFO else "debug"


def _caller(record: logging.LogRecord) -> str:
    """zap's short caller, package/file:line: the logger's package when the
    logger is named after its module (`getLogger(__name__)`), else the file alone."""
    package, _, module = record.name.rpartition(".")
    if module == record.module and package:
        return f"{package.replace('.', '/')}/{record.module}.py:{record.lineno}"
    return f"{record.filename}:{record.lineno}"


class _BaseFormatter(logging.Formatter):
    def message(self, record: logging.LogRecord) -> str:
        # RedactFilter normally rendered it already; be safe without it too.
        try:
            text = record.getMessage()
        except Exception:
            text = f"{_safe_str(record.msg)} (unformattable args: {_safe_repr(record.args)})"
        return redact(text)

    @staticmethod
    def error_text(record: logging.LogRecord) -> str:
        """The `error` field: the exception's message as Go's err.Error() gives it,
        without the class name (which only stands in for an empty message); "" without one."""
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return ""
        try:
            text = str(exc)
        except Exception:
            text = "<unprintable>"
        return redact(_clip(text or type(exc).__name__))

    @staticmethod
    def call_stack() -> str:
        """The stack of the logging call, without logging's and this module's frames."""
        frames = [f for f in traceback.extract_stack()
                  if f.filename not in (__file__, logging.__file__)
                  and not f.filename.endswith(("logging/__init__.py", "threading.py"))]
        return redact("".join(traceback.format_list(frames)).rstrip("\n"))

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
    """One JSON object per line, controller-runtime's zap keys (see the module docstring).

    ASCII-only output (`ensure_ascii`), so a lone surrogate or any other
    character the stream cannot encode is written as a JSON escape instead of
    breaking the write.
    """

    _OWN_KEYS = ("level", "ts", "logger", "caller", "msg", "error", "stacktrace")

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "level": level_name(record.levelno),
            "ts": _timestamp(record),
            "logger": record.name,
            "caller": _caller(record),
            "msg": self.message(record),
        }
        fields = _fields(record)
        for name, value in fields.items():
            if name not in self._OWN_KEYS:
                doc[name] = self._jsonable(value)
        error = self.error_text(record) or (
            self._jsonable(fields["error"]) if "error" in fields else "")
        if error:
            doc["error"] = error
        stack = self.exception_text(record)
        if not stack and record.levelno >= logging.ERROR:
            stack = self.call_stack()
        if stack:
            doc["stacktrace"] = stack
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
    """`ts LEVEL logger: msg key=value ... error=...`, then the traceback on its own lines.

    For a person at a terminal: the same level names as the JSON (upper case),
    no caller, and the kind object of the reconcile context left out (the
    namespace and name say it already).
    """

    def format(self, record: logging.LogRecord) -> str:
        line = (f"{_timestamp(record)} {level_name(record.levelno).upper():<5} {record.name}: "
                f"{self.message(record)}")
        fields = _fields(record)
        error = self.error_text(record)
        if error:
            fields.pop("error", None)
        for name, value in fields.items():
            if isinstance(value, dict) and name[:1].isupper():
                continue        # the `<Kind>: {name, namespace}` context object
            line += f" {name}={self._value(value)}"
        if error:
            line += f" error={self._value(error)}"
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
