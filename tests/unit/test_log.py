"""k8s_http.ops.log: line shape, reconcile context, redaction, and never crashing on odd input."""

import io
import json
import logging
import re
import threading
import uuid

import pytest

from k8s_http.ops import log as klog
from k8s_http.ops.log import (parse_level, reconcile_context, redact, setup_logging,
                              current_context)

# A realistic-looking (but fake) service-account token.
JWT = ("eyJhbGciOiJSUzI1NiIsImtpZCI6ImFiYyJ9."
       "eyJpc3MiOiJrdWJlcm5ldGVzL3NlcnZpY2VhY2NvdW50In0."
       "c2lnbmF0dXJlLXNpZ25hdHVyZS1zaWduYXR1cmU")
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def root_logging():
    """Restore the root logger's handlers and level after each test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


@pytest.fixture
def json_log(root_logging):
    stream = io.StringIO()
    setup_logging("debug", "json", stream)

    def lines():
        return [json.loads(line) for line in stream.getvalue().splitlines()]
    return logging.getLogger("test.logger"), lines


@pytest.fixture
def text_log(root_logging):
    stream = io.StringIO()
    setup_logging("debug", "text", stream)
    return logging.getLogger("test.logger"), stream


def test_json_line_shape(json_log):
    logger, lines = json_log
    logger.info("hello %s", "world")
    [doc] = lines()
    # zap's production encoder order and keys (controller-runtime's JSON logs)
    assert list(doc) == ["level", "ts", "logger", "caller", "msg"]
    assert TS.match(doc["ts"]), doc["ts"]
    assert doc["level"] == "info"
    assert doc["logger"] == "test.logger"
    line = _line_of('logger.info("hello %s", "world")')
    assert doc["caller"] == f"test_log.py:{line}"
    assert doc["msg"] == "hello world"


def _line_of(text: str) -> int:
    for number, line in enumerate(open(__file__).read().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(text)


@pytest.mark.parametrize("level, name", [(logging.DEBUG, "debug"), (logging.INFO, "info"),
                                         (logging.WARNING, "warn"), (logging.ERROR, "error"),
                                         (logging.CRITICAL, "error")])
def test_zap_level_names(json_log, level, name):
    logger, lines = json_log
    logger.log(level, "x")
    [doc] = lines()
    assert doc["level"] == name


def test_caller_is_package_and_file_for_module_loggers(json_log):
    _, lines = json_log
    logging.getLogger("k8s_http.control.runner").info("a logger named after another module")
    logging.getLogger("tests.unit.test_log").info("a logger named after this module")
    other, own = lines()
    assert other["caller"].startswith("test_log.py:")
    assert own["caller"].startswith("tests/unit/test_log.py:")


def test_error_and_stacktrace_keys(json_log):
    logger, lines = json_log
    try:
        {}["missing"]
    except KeyError as err:
        logger.error("Reconciler error", exc_info=err)
    logger.warning("lease renewal failed", extra={"error": "Forbidden: leases"})
    logger.error("no exception here")
    failed, warned, bare = lines()
    assert failed["msg"] == "Reconciler error"          # the error text is not in msg
    assert failed["error"] == "'missing'"              # err.Error(): no class name in front
    assert failed["stacktrace"].startswith("Traceback (most recent call last):")
    assert list(failed)[-2:] == ["error", "stacktrace"]
    assert warned["error"] == "Forbidden: leases" and "stacktrace" not in warned
    # zap adds the call site's stack to every error line
    assert "test_error_and_stacktrace_keys" in bare["stacktrace"] and "error" not in bare


def test_json_extra_fields_kept_and_odd_values_stringified(json_log):
    logger, lines = json_log
    logger.warning("x", extra={"count": 3, "names": ["a", "b"], "obj": object(),
                               "nan": float("nan")})
    [doc] = lines()
    assert doc["count"] == 3 and doc["names"] == ["a", "b"]
    assert doc["obj"].startswith("<object object")
    assert doc["nan"] == "nan"            # allow_nan=False: still valid JSON


def test_context_fields_inside_and_not_outside(json_log):
    logger, lines = json_log
    with reconcile_context("my", "default/foobar", "rid-1"):
        logger.info("inside")
        with reconcile_context("other", "ns/x", "rid-2"):
            logger.info("nested")
        logger.info("inside again")
    logger.info("outside")
    docs = lines()
    assert [(d.get("controller"), d.get("namespace"), d.get("name"), d.get("reconcileID"))
            for d in docs] == [
        ("my", "default", "foobar", "rid-1"), ("other", "ns", "x", "rid-2"),
        ("my", "default", "foobar", "rid-1"), (None, None, None, None)]
    assert all(d["logger"] == "test.logger" for d in docs)   # "name" never clobbers it


def test_context_has_controller_runtimes_keys_in_its_order(json_log):
    from k8s_http.core.objects import ObjectKey

    logger, lines = json_log
    with reconcile_context("my", ObjectKey("default", "foobar"), "rid", kind="My",
                           group="mine.jp"):
        logger.info("applied")
    [doc] = lines()
    assert list(doc)[5:] == ["controller", "controllerGroup", "controllerKind", "My",
                             "namespace", "name", "reconcileID"]
    assert doc["My"] == {"name": "foobar", "namespace": "default"}
    assert (doc["controllerGroup"], doc["controllerKind"]) == ("mine.jp", "My")


def test_context_is_per_thread(json_log):
    logger, lines = json_log
    with reconcile_context("my", "a/b", "rid"):
        t = threading.Thread(target=lambda: logger.info("from another thread"))
        t.start()
        t.join()
        assert current_context() == {"controller": "my", "namespace": "a", "name": "b",
                                     "reconcileID": "rid"}
    [doc] = lines()
    assert "controller" not in doc
    assert current_context() == {}


def test_context_fields_in_text_format(text_log):
    logger, stream = text_log
    with reconcile_context("my", "default/foo bar", "rid-1"):
        logger.info("applied")
    line = stream.getvalue().rstrip("\n")
    assert TS.match(line.split(" ")[0])
    assert " INFO " in line and "test.logger: applied" in line
    assert line.endswith('controller=my namespace=default name="foo bar" reconcileID=rid-1')


def test_traceback_in_stacktrace_field(json_log):
    logger, lines = json_log
    try:
        raise RuntimeError("kaboom")
    except RuntimeError:
        logger.exception("reconcile failed")
    [doc] = lines()
    assert doc["level"] == "error" and doc["msg"] == "reconcile failed"
    assert doc["stacktrace"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: kaboom" in doc["stacktrace"]
    assert doc["error"] == "kaboom"


def test_traceback_in_text_format(text_log):
    logger, stream = text_log
    try:
        raise ValueError("bad")
    except ValueError:
        logger.exception("failed")
    out = stream.getvalue()
    assert 'ERROR test.logger: failed error=bad\nTraceback (most recent call' in out
    assert out.rstrip().endswith("ValueError: bad")


@pytest.mark.parametrize("secret, leaked", [
    ("Authorization: Bearer abc.DEF-123_x~+/=", "abc.DEF-123"),
    ("curl -H 'authorization: bearer s3cr3tT0ken'", "s3cr3tT0ken"),
    (f"token {JWT} in a message", JWT[:40]),
    (f"url?access_token={JWT}", JWT[-20:]),
])
def test_tokens_are_redacted_in_message(json_log, secret, leaked):
    logger, lines = json_log
    logger.info("request: %s", secret)
    [doc] = lines()
    assert leaked not in doc["msg"]
    assert "[REDACTED]" in doc["msg"]


def test_tokens_are_redacted_in_tracebacks_and_fields(json_log):
    logger, lines = json_log
    try:
        raise RuntimeError(f"Bearer {JWT}")
    except RuntimeError:
        logger.exception("boom", extra={"header": f"Bearer {JWT}"})
    [doc] = lines()
    raw = json.dumps(doc)
    assert JWT[:30] not in raw and JWT[-20:] not in raw


def test_tokens_are_redacted_in_text_format(text_log):
    logger, stream = text_log
    logger.info("sent Bearer %s", JWT)
    assert JWT[-20:] not in stream.getvalue()
    assert "Bearer [REDACTED]" in stream.getvalue()


def test_redact_leaves_ordinary_text_alone():
    text = "reconciled default/foobar in 12 ms; eyJ alone is fine; bearer"
    assert redact(text) == text


def test_lone_surrogates_do_not_crash_json(json_log, capsys):
    logger, lines = json_log
    logger.info("name %s", "bad\ud800name", extra={"field": "\udcff"})
    [doc] = lines()                        # still one valid JSON line
    assert doc["msg"] == "name bad\ud800name"
    assert doc["field"] == "\udcff"
    assert "Logging error" not in capsys.readouterr().err


def test_lone_surrogates_do_not_crash_text_on_an_ascii_stream(root_logging, capsys):
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    setup_logging("info", "text", stream)
    logging.getLogger("t").info("surrogate \ud800 and snowman \u2603")
    stream.flush()
    out = raw.getvalue().decode("ascii")
    assert "surrogate \\ud800 and snowman \\u2603" in out
    assert "Logging error" not in capsys.readouterr().err


def test_non_str_and_mismatched_arguments(json_log, capsys):
    logger, lines = json_log

    class BadStr:
        def __str__(self):
            raise RuntimeError("no str")

        def __repr__(self):
            raise RuntimeError("no repr")

    logger.info(12345)
    logger.info(b"\xff\xfe")
    logger.info("%s and %s", "only one")
    logger.info("%d", "not a number")
    logger.info("value %s", BadStr())
    logger.info(BadStr())
    docs = lines()
    assert len(docs) == 6
    assert docs[0]["msg"] == "12345"
    assert docs[1]["msg"] == "b'\\xff\\xfe'"
    assert docs[2]["msg"].startswith("%s and %s (unformattable args")
    assert "unformattable" in docs[3]["msg"]
    assert "unrepresentable" in docs[4]["msg"]
    assert "unrepresentable" in docs[5]["msg"]
    assert "Logging error" not in capsys.readouterr().err


def test_setup_is_idempotent(root_logging):
    first, second = io.StringIO(), io.StringIO()
    setup_logging("info", "json", first)
    foreign = logging.NullHandler()
    logging.getLogger().addHandler(foreign)
    setup_logging("info", "json", second)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_k8s_http_handler", False)]
    assert len(ours) == 1
    assert foreign in logging.getLogger().handlers      # others' handlers are left alone
    logging.getLogger("x").info("once")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1


def test_level_is_applied(root_logging):
    stream = io.StringIO()
    setup_logging("warning", "json", stream)
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    assert [json.loads(line)["msg"] for line in stream.getvalue().splitlines()] == ["shown"]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_auto_format_text_on_tty_json_otherwise(root_logging):
    tty = _Tty()
    setup_logging("info", "auto", tty)
    logging.getLogger("x").info("hi")
    assert not tty.getvalue().startswith("{")
    pipe = io.StringIO()
    setup_logging("info", "auto", pipe)
    logging.getLogger("x").info("hi")
    assert json.loads(pipe.getvalue())["msg"] == "hi"


@pytest.mark.parametrize("text, level", [
    ("debug", logging.DEBUG), ("INFO", logging.INFO), (" Warning ", logging.WARNING),
    ("warn", logging.WARNING), ("error", logging.ERROR), (logging.ERROR, logging.ERROR)])
def test_parse_level(text, level):
    assert parse_level(text) == level


@pytest.mark.parametrize("text", ["verbose", "", "5", "trace"])
def test_parse_level_rejects_bad_values_clearly(text):
    with pytest.raises(ValueError, match=r"invalid log level .*use one of debug, info, "
                                         r"warning, error"):
        parse_level(text)


def test_setup_rejects_bad_format(root_logging):
    with pytest.raises(ValueError, match="invalid log format 'xml'"):
        setup_logging("info", "xml", io.StringIO())


def test_reconcile_id_is_unique():
    assert klog.new_reconcile_id() != klog.new_reconcile_id()


def test_reconcile_id_is_a_uuid_as_controller_runtimes():
    ids = {klog.new_reconcile_id() for _ in range(1000)}
    assert len(ids) == 1000
    for rid in ids:
        parsed = uuid.UUID(rid)
        assert str(parsed) == rid and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_an_exception_without_a_message_reads_as_its_class_name(json_log):
    logger, lines = json_log
    try:
        raise TimeoutError()
    except TimeoutError as err:
        logger.error("failed", exc_info=err)
    [doc] = lines()
    assert doc["error"] == "TimeoutError"          # not an empty error


def test_redact_filter_rewrites_the_record_for_every_handler():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "auth %s", (f"Bearer {JWT}",),
                               None)
    assert klog.RedactFilter().filter(record) is True
    assert record.getMessage() == "auth Bearer [REDACTED]"
    assert record.args is None


def test_json_lines_are_pure_ascii(json_log):
    logger, lines = json_log
    logger.info("caf\u00e9 \u2603 \ud800")
    [ours] = [h for h in logging.getLogger().handlers if getattr(h, "_k8s_http_handler", False)]
    stream = ours.stream
    assert stream.getvalue().isascii()
    assert lines()[0]["msg"] == "caf\u00e9 \u2603 \ud800"
