#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris + libFuzzer) of the parsers that face the wire.

    nice -n 19 python -m bench fuzz TARGET --seconds 600     # one target
    nice -n 19 python -m bench fuzz all --seconds 600 --jobs 2

Targets (RELIABILITY.md, "Malformed bytes from the wire"):

  chunked     watchproto.ChunkedDecoder: the body fed whole and in pieces
              (1 to 16 bytes); only ChunkedFramingError may escape, both ways
              must agree (same payload, same verdict), the buffer stays capped
  lines       watchproto.LineDecoder (a small line cap, managedFields cut on or
              off, fed in pieces): only WatchDecodeError may escape; after the
              events are drained an unfinished line is never over the cap
  events      client.WatchStream over the de-framed body, each event and each
              failure (ERROR events become ApiErrors) stepped through the watcher's
              state machine (watchstep.step, failure), and the failure formatted as
              the watcher logs it (JSON and text): the typed errors WatchStream
              documents (ApiError, ProtocolError, ApiConnectionError) may escape
              the stream; nothing may escape the machine or the log formatting
  kubeconfig  kubeconfig.read_kubeconfig on the input as a kubeconfig file (in a
              private directory with a token file and an exec plugin beside it):
              only ConfigError may escape
  exec        credentials.ExecCredential's parsing of a plugin's stdout: only
              CredentialError may escape

Anything else that escapes is a crash: libFuzzer stops and writes the input to
bench/.fuzz/artifacts/TARGET/. An input that runs over --timeout seconds is a
hang, and the process going over --rss-limit-mb is a memory failure; both stop
the run the same way. The corpus grows in bench/.fuzz/corpus/TARGET (git-ignored),
always holds the seeds below, and is reused by later runs.

atheris lives in bench/.venv-fuzz, built from bench/requirements-fuzz.txt on
first use; this script re-runs itself there, one libFuzzer process per target.
Each run is recorded in bench/results/fuzz.json (the latest per target), from
which bench/RESULTS.fuzz.md is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import io
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = HERE / ".venv-fuzz"
REQUIREMENTS = HERE / "requirements-fuzz.txt"
WORK = HERE / ".fuzz"                   # corpus, artifacts, dictionaries, logs (git-ignored)
RESULTS_JSON = HERE / "results" / "fuzz.json"
RESULTS_MD = HERE / "RESULTS.fuzz.md"

TARGETS = ("chunked", "lines", "events", "kubeconfig", "exec")
# The longest input libFuzzer makes, per target: past each cap the decoders have
# (a 1 KiB chunk-size line, a 16 KiB trailer section; the lines target caps lines
# at 64 bytes to 8 KiB, the events target at 4 KiB).
MAX_LEN = {"chunked": 20000, "lines": 8192, "events": 8192, "kubeconfig": 8192, "exec": 4096}

# Crashes the fuzzer found, how each was fixed and the unit test that keeps it
# fixed. Written into RESULTS.fuzz.md as they are.
FINDINGS: list[tuple[str, str, str]] = [
    ("kubeconfig", "`when: 2001-13-01` (a smoke run, within seconds): libyaml types the scalar as "
     "a timestamp and PyYAML's constructor raises `ValueError` (month must be in 1..12), not a "
     "YAMLError; an impossible day or hour, an int over Python's 4,300-digit limit and "
     "`!!int x` do the same",
     "`_parse_kubeconfig` turns it into the one-line ConfigError \"not valid YAML (a value does "
     "not fit its type)\", never quoting the value; tests/unit/test_fuzz_findings.py::"
     "test_kubeconfig_with_a_value_yaml_cannot_build_is_a_config_error"),
    ("kubeconfig", "`!!timestamp` on a key of a cluster's mapping (the 10-minute run, after "
     "18 s): no date pattern matches the text and PyYAML's constructor calls "
     "`.groupdict()` on None: an `AttributeError` escaped",
     "the same ConfigError for an AttributeError from PyYAML's constructors; the same test "
     "(its `!!timestamp` case)"),
    ("kubeconfig", "not from the fuzzer: reading PyYAML's other constructors after the two "
     "finds above, `!!bool maybe` (KeyError) and `!!int ''` (IndexError)",
     "caught there too (LookupError); the same test (its last two cases)"),
    ("events", "not from the fuzzer (its 10-minute run did not reach it): seen while writing "
     "the target, an ERROR event with code 504 and `details.causes` a number or `true`: "
     "`watcher.failure` asks `is_too_large_resource_version`, whose `has_status_cause` iterated "
     "`causes` whatever it was, and the `TypeError` escaped the watch loop's error handling",
     "`has_status_cause` reads causes only from a list; tests/unit/test_fuzz_findings.py::"
     "test_an_error_event_whose_causes_are_not_a_list_is_a_failure and "
     "test_a_write_refused_with_causes_that_are_not_a_list_is_no_namespace_termination"),
]


# ------------------------------------------------------------------ seeds and dictionaries

def _frame(payload: bytes, sizes=(7, 300, 1)) -> bytes:
    """`payload` in chunked framing, cut at `sizes` in turn."""
    out, pos, i = [], 0, 0
    while pos < len(payload):
        n = sizes[i % len(sizes)]
        out.append(b"%x\r\n%s\r\n" % (n if pos + n <= len(payload) else len(payload) - pos,
                                      payload[pos:pos + n]))
        pos, i = pos + n, i + 1
    return b"".join(out) + b"0\r\n\r\n"


_POD = {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "a", "namespace": "default", "uid": "u-1", "resourceVersion": "17",
                     "labels": {"app": "x"},
                     "managedFields": [{"manager": "m", "operation": "Apply",
                                        "fieldsV1": {"f:spec": {}}}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}


def _event_lines() -> list[bytes]:
    events = [
        {"type": "ADDED", "object": _POD},
        {"type": "MODIFIED", "object": dict(_POD, metadata=dict(_POD["metadata"],
                                                                resourceVersion="18"))},
        {"type": "DELETED", "object": _POD},
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "19"}}},
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {
            "resourceVersion": "20", "annotations": {"k8s.io/initial-events-end": "true"}}}},
        {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "code": 410, "reason": "Expired", "message": "too old"}},
        {"type": "ERROR", "object": {"kind": "Status", "code": 504, "message": "Too large "
                                     "resource version", "details": {"causes": [
                                         {"reason": "ResourceVersionTooLarge"}]}}},
        {"type": "ERROR", "object": {"kind": "Status", "code": 500}},
        {"type": "WHATEVER", "object": {}},
    ]
    return [json.dumps(e, separators=(",", ":")).encode() for e in events]


def _kubeconfigs() -> list[bytes]:
    # Past the YAML and the names, a stub certificate stops at the TLS check, which
    # comes last: only the client-certificate seed has one.
    cluster = "clusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n"
    insecure = "    insecure-skip-tls-verify: true\n"
    stub_ca = "    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\n"
    head = "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
    ctx = "contexts:\n- name: x\n  context: {cluster: c, user: u, namespace: ns}\n"
    users = [
        (insecure, "users:\n- name: u\n  user:\n    token: abc.def\n"),
        (insecure, "users:\n- name: u\n  user:\n    tokenFile: token\n"),
        (insecure, "users:\n- name: u\n  user:\n    exec:\n"
         "      apiVersion: client.authentication.k8s.io/v1\n      command: ./plugin\n"
         "      args: [get-token]\n      interactiveMode: Never\n"
         "      provideClusterInfo: true\n      env: [{name: A, value: b}]\n"),
        (stub_ca, "users:\n- name: u\n  user:\n    client-certificate-data: QUJD\n"
         "    client-key-data: QUJD\n"),
    ]
    seeds = [(head + cluster + tls + ctx + user).encode() for tls, user in users]
    seeds.append(b"apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: http://h:80\n"
                 b"    proxy-url: http://proxy:3128\n    insecure-skip-tls-verify: true\n"
                 b"contexts:\n- {name: x, context: {cluster: c}}\ncurrent-context: x\n"
                 b"when: 2001-12-14\nn: 12\n")
    return seeds


def _exec_outputs() -> list[bytes]:
    v1 = "client.authentication.k8s.io/v1"
    outs = [{"status": {"token": "tok-1", "expirationTimestamp": "2030-01-01T00:00:00Z"}},
            {"status": {"clientCertificateData": "-----BEGIN CERTIFICATE-----\n",
                        "clientKeyData": "-----BEGIN PRIVATE KEY-----\n"}},
            {"status": {"token": "t", "expirationTimestamp": "2030-01-01T00:00:00.123+02:00"}}]
    return [json.dumps(dict(o, kind="ExecCredential", apiVersion=v1)).encode() for o in outs]


def seeds(target: str) -> list[bytes]:
    lines = _event_lines()
    if target == "chunked":
        payload = b"\n".join(lines) + b"\n"
        return [b"\x00" + _frame(payload), b"\x05" + _frame(payload, (4096,)),
                b"\x03" + b"1a;ext=1\r\n" + b"x" * 26 + b"\r\n0\r\nTrailer: y\r\n\r\n"]
    if target in ("lines", "events"):
        return [b"\x00" + b"\n".join(lines) + b"\n", b"\x81" + b"\r\n".join(lines[:3]) + b"\r\n",
                b"\x02" + lines[4] + b"\n" + lines[0] + b"\n" + lines[6] + b"\n"]
    if target == "kubeconfig":
        return _kubeconfigs()
    return _exec_outputs()


_TOKENS = {
    "chunked": [b"\r\n", b"0\r\n\r\n", b";", b"ffffffff", b"Trailer: x\r\n"],
    "lines": [b'"type":', b'"object":', b'"ADDED"', b'"BOOKMARK"', b'"ERROR"', b'"metadata":',
              b'"managedFields":[', b'"resourceVersion":', b"\\ud800", b"NaN", b"1e999",
              b"\r\n", b"[[[[[[[["],
    "events": [b'"type":', b'"object":', b'"ADDED"', b'"MODIFIED"', b'"DELETED"', b'"BOOKMARK"',
               b'"ERROR"', b'"metadata":', b'"name":', b'"resourceVersion":', b'"code":',
               b'"details":', b'"causes":', b'"reason":', b'"message":', b'"Status"', b"410",
               b"504", b'"annotations":', b'"k8s.io/initial-events-end":"true"',
               b'"ResourceVersionTooLarge"', b'"managedFields":['],
    "kubeconfig": [b"clusters:", b"users:", b"contexts:", b"current-context:", b"cluster:",
                   b"user:", b"context:", b"server:", b"https://", b"certificate-authority:",
                   b"certificate-authority-data:", b"client-certificate:", b"client-key:",
                   b"client-certificate-data:", b"client-key-data:", b"token:", b"tokenFile:",
                   b"exec:", b"command:", b"apiVersion:", b"interactiveMode:", b"env:",
                   b"proxy-url:", b"insecure-skip-tls-verify:", b"auth-provider:",
                   b"provideClusterInfo:", b"extensions:", b"!!binary", b"!!timestamp",
                   b"!!int", b"!!float", b"<<:", b"&a", b"*a", b"2001-12-14", b"0x", b"0o",
                   b"client.authentication.k8s.io/v1", b"- name:", b"[", b"{", b"---"],
    "exec": [b'"kind":"ExecCredential"', b'"apiVersion":"client.authentication.k8s.io/v1"',
             b'"status":', b'"token":', b'"clientCertificateData":', b'"clientKeyData":',
             b'"expirationTimestamp":', b'"2030-01-01T00:00:00Z"', b"+14:00", b"-23:59",
             b"9999-12-31", b"0001-01-01", b"T24:00:00", b".999999999"],
}


def _dict_line(token: bytes) -> str:
    return '"' + "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}"
                         for b in token) + '"'


# ------------------------------------------------------------------ the targets (in the venv)

def _targets():
    """TestOneInput per target; imports k8s_http under atheris' instrumentation."""
    import atheris

    with atheris.instrument_imports(include=["k8s_http", "yaml"]):
        from k8s_http.cache import watchstep
        from k8s_http.wire.client import WatchStream
        from k8s_http.config.configerror import ConfigError, CredentialError
        from k8s_http.config.credentials import ExecCredential
        from k8s_http.core.errors import ApiConnectionError, ApiError, ProtocolError
        from k8s_http.config.kubeconfig import read_kubeconfig
        from k8s_http.ops.log import setup_logging
        from k8s_http.wire.watchproto import ChunkedDecoder, ChunkedFramingError, LineDecoder, \
            WatchDecodeError

    def pieces(data: bytes, size: int):
        return [data[i:i + size] for i in range(0, len(data), size)] or [b""]

    def decode_chunked(parts):
        dec = ChunkedDecoder()
        out = []
        try:
            for part in parts:
                out.append(dec.feed(part))
                # Only an incomplete size line, chunk-end CRLF or trailer line waits.
                assert len(dec._buf) <= max(dec.max_size_line_bytes + 2, dec.max_trailer_bytes)
        except ChunkedFramingError:
            return None         # how far it got before the error depends on the cuts
        return b"".join(out), dec.done

    def chunked(data: bytes) -> None:
        if not data:
            return
        body = data[1:]
        whole = decode_chunked([body])
        split = decode_chunked(pieces(body, data[0] % 16 + 1))
        assert whole == split, (whole, split)

    def lines(data: bytes) -> None:
        if len(data) < 2:
            return
        cap = 64 << (data[0] & 7)               # 64 B to 8 KiB
        dec = LineDecoder(max_line_bytes=cap, skip_managed_fields=bool(data[0] & 0x80))
        try:
            for part in pieces(data[1:], (data[0] >> 3 & 15) + 1):
                dec.feed(part)
                for _ in dec.events():
                    pass
                assert len(dec._buf) - dec._start <= cap + 1
        except WatchDecodeError:
            return

    class Payload:
        """A Stream (transport.Stream's reading half) over bytes already de-framed."""
        path = "/api/v1/pods"

        def __init__(self, parts):
            self._parts = iter(parts)

        def read_payload(self, timeout_seconds=None):
            return next(self._parts, b"")

        def close(self):
            pass

    def events(data: bytes) -> None:
        if len(data) < 2:
            return
        parts = pieces(data[1:], (data[0] & 15) + 1)
        stream = WatchStream(Payload(parts), clock=lambda: 0.0, max_line_bytes=4096,
                             skip_managed_fields=bool(data[0] & 0x80))
        # A plain watch and a streaming list, each stepped through every input.
        states = [watchstep.Watching("1"), watchstep.Streaming("1")]
        try:
            for event in stream:
                states = [relisted(watchstep.step(state, event)[1]) for state in states]
        except (ApiError, ProtocolError, ApiConnectionError) as err:
            failed = watchstep.failure(err)
            for state in states:
                watchstep.step(state, failed)
            # Logged as the watcher logs a restart; its text is the server's (RELIABILITY.md
            # 11: a lone surrogate must not break a log line). A handler would swallow an
            # error in emit(), so its filters and format are called here directly.
            for handler in log_handlers:
                record = logging.LogRecord("k8s_http.cache.watcher", logging.WARNING, __file__, 0,
                                           "%s: watch restarting (%s: %s)",
                                           ("pods", failed.reason, err), (type(err), err, None))
                if handler.filter(record):
                    handler.format(record)

    log_handlers = [setup_logging("debug", fmt, stream=io.StringIO()) for fmt in ("json", "text")]
    logging.getLogger().handlers.clear()     # nothing is written: the handlers are called above

    def relisted(state):
        """A Listing state takes no events: the loop lists first (here: an empty list)."""
        if isinstance(state, watchstep.Listing):
            return watchstep.step(state, watchstep.Listed([], "2"))[1]
        return state

    workdir = Path(tempfile.mkdtemp(prefix="fuzz-kubeconfig-"))
    (workdir / "token").write_text("file-token\n")
    plugin = workdir / "plugin"
    plugin.write_text("#!/bin/sh\nexit 1\n")
    plugin.chmod(0o755)
    config = workdir / "config"
    env = {"PATH": str(workdir), "HTTPS_PROXY": "proxy:3128", "NO_PROXY": "10.0.0.0/8,.internal"}

    def kubeconfig(data: bytes) -> None:
        config.write_bytes(data)
        try:
            read_kubeconfig([str(config)], None, env)
        except ConfigError:
            return

    plugins = [ExecCredential("plugin", api_version=version, interactive_mode="Never",
                              base_env={}) for version in
               ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")]

    def exec_output(data: bytes) -> None:
        try:
            plugins[len(data) & 1]._parse(data)
        except CredentialError:
            return

    return {"chunked": chunked, "lines": lines, "events": events, "kubeconfig": kubeconfig,
            "exec": exec_output}


def run_target(target: str, libfuzzer_args: list[str]) -> None:
    """In the venv: hand the target to libFuzzer (which exits when done)."""
    import atheris
    test_one_input = _targets()[target]
    atheris.Setup([sys.argv[0], *libfuzzer_args], test_one_input)
    atheris.Fuzz()


# ------------------------------------------------------------------ the driver

def ensure_venv() -> Path:
    """bench/.venv-fuzz with REQUIREMENTS, rebuilt when the file changes; its python."""
    python = VENV / "bin" / "python"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = VENV / ".requirements-sha256"
    if not (python.exists() and stamp.exists() and stamp.read_text() == digest):
        print(f"[fuzz] installing {REQUIREMENTS.name} into {VENV.relative_to(ROOT)} ...",
              file=sys.stderr, flush=True)
        venv.create(VENV, with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--only-binary=:all:", "-r", str(REQUIREMENTS)], check=True)
        stamp.write_text(digest)
    return python


def prepare(target: str) -> tuple[Path, Path, Path]:
    """The target's corpus (seeded when empty), artifact directory and dictionary."""
    corpus = WORK / "corpus" / target
    artifacts = WORK / "artifacts" / target
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    for seed in seeds(target):          # named as libFuzzer names them: never twice
        (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    dictionary = WORK / f"{target}.dict"
    dictionary.write_text("".join(_dict_line(t) + "\n" for t in _TOKENS[target]))
    return corpus, artifacts, dictionary


_STAT = re.compile(r"^stat::(\w+):\s*(\d+)", re.M)
_DONE = re.compile(r"^Done (\d+) runs in (\d+) second", re.M)
_PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/", re.M)
_PYTHON_EXC = re.compile(r"=== Uncaught Python exception: ===\s*\n(.*?)\n(?=\S)", re.S)


def fuzz_one(python: Path, target: str, args) -> dict:
    corpus, artifacts, dictionary = prepare(target)
    before = set(artifacts.iterdir())
    log = WORK / f"{target}.log"
    argv = [str(python), "-m", "bench", "fuzz", "--run", target, "--",
            str(corpus), f"-max_total_time={args.seconds}", f"-timeout={args.timeout}",
            f"-rss_limit_mb={args.rss_limit_mb}", f"-max_len={MAX_LEN[target]}",
            f"-dict={dictionary}", f"-artifact_prefix={artifacts}/", "-print_final_stats=1",
            "-print_pcs=0"]
    started = dt.datetime.now(dt.timezone.utc)
    load = os.getloadavg()[0]
    print(f"[fuzz] {target}: {args.seconds} s, log {log.relative_to(ROOT)}", file=sys.stderr,
          flush=True)
    with open(log, "w") as out:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(WORK))
    text = log.read_text(errors="replace")
    stats = {k: int(v) for k, v in _STAT.findall(text)}
    progress = _PROGRESS.findall(text)
    done = _DONE.search(text)
    new = sorted(p.name for p in set(artifacts.iterdir()) - before)
    exc = _PYTHON_EXC.search(text)
    record = {
        "target": target, "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "git": _git_head(), "load_at_start": round(load, 1),
        "seconds_asked": args.seconds,
        "seconds": int(done.group(2)) if done else
        int((dt.datetime.now(dt.timezone.utc) - started).total_seconds()),
        "execs": stats.get("number_of_executed_units",
                           int(progress[-1][0]) if progress else 0),
        "execs_per_second": stats.get("average_exec_per_sec", 0),
        "corpus_files": sum(1 for _ in corpus.iterdir()),
        "corpus_units": int(progress[-1][3]) if progress else 0,
        "coverage": int(progress[-1][1]) if progress else 0,
        "features": int(progress[-1][2]) if progress else 0,
        "peak_rss_mb": stats.get("peak_rss_mb", 0),
        "exit_code": proc.returncode,
        "artifacts": new,
        "problem": _problem(text, exc),
    }
    print(f"[fuzz] {target}: exit {proc.returncode}, {record['execs']} execs, "
          f"{record['corpus_files']} corpus files, artifacts {new or 'none'}"
          + (f", {record['problem']}" if record["problem"] else ""), file=sys.stderr, flush=True)
    return record


def _git_head() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def _problem(text: str, exc) -> str:
    """One line on why a run stopped early, '' if it ran its time."""
    if exc:
        last = [line for line in exc.group(1).splitlines() if line.strip()]
        return f"uncaught {last[-1].strip()}" if last else "uncaught exception"
    for needle, what in (("ERROR: libFuzzer: timeout", "timeout"),
                         ("ERROR: libFuzzer: out-of-memory", "out of memory"),
                         ("ERROR: libFuzzer: deadly signal", "deadly signal")):
        if needle in text:
            return what
    return ""


def save(records: list[dict], args) -> None:
    """Merge the records (the latest per target) into fuzz.json; rewrite RESULTS.fuzz.md."""
    RESULTS_JSON.parent.mkdir(exist_ok=True)
    with open(RESULTS_JSON, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)     # two invocations may finish together
        f.seek(0)
        text = f.read()
        data = json.loads(text) if text.strip() else {"runs": {}}
        history = data.setdefault("earlier", [])
        for record in records:
            if record["target"] in data["runs"]:    # kept: a crash stops a run early
                history.append(data["runs"][record["target"]])
            data["runs"][record["target"]] = dict(record, command=_command(args, record),
                                                  **_versions())
        f.seek(0)
        f.truncate()
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    RESULTS_MD.write_text(render(data))
    print(f"[fuzz] wrote {RESULTS_JSON.relative_to(ROOT)} and {RESULTS_MD.relative_to(ROOT)}",
          file=sys.stderr)


def _command(args, record: dict) -> str:
    return (f"nice -n 19 python -m bench fuzz {args.target} --seconds {args.seconds}"
            + (f" --jobs {args.jobs}" if args.target == "all" else ""))


def _versions() -> dict:
    out = subprocess.run([str(VENV / "bin" / "python"), "-c",
                          "import importlib.metadata as m, platform; "
                          "print(m.version('atheris'), m.version('PyYAML'), "
                          "platform.python_version())"],
                         capture_output=True, text=True, check=True).stdout.split()
    return {"atheris": out[0], "pyyaml": out[1], "python": out[2]}


def render(data: dict) -> str:
    runs = [data["runs"][t] for t in TARGETS if t in data["runs"]]
    lines = [
        "## Fuzzing: the parsers that face the wire (atheris, coverage-guided)", "",
        "Written by `bench/fuzz.py` (its docstring says what each target feeds and which "
        "errors it may raise). Each target runs in its own libFuzzer process at `nice -n 19`, "
        "at most two at once, on the 2-core development VM shared with other work; the corpus "
        "(bench/.fuzz/, git-ignored) carries over from run to run. Per-input limit "
        f"{'/'.join(sorted({str(r.get('timeout', 10)) for r in runs})) or 10} s, "
        "RSS limit 1024 MB.", "",
        "| target | run | command | seconds | executions | exec/s | corpus files (in use) "
        "| coverage (edges / features) | peak RSS MB | stopped by |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        stopped = "time" if not r["problem"] and r["exit_code"] == 0 else \
            f"**{r['problem'] or 'exit ' + str(r['exit_code'])}** ({', '.join(r['artifacts'])})"
        at = f", git {r['git']}, load {r['load_at_start']}" if "git" in r else ""
        lines.append(f"| {r['target']} | {r['started']}{at}, atheris {r['atheris']}, "
                     f"CPython {r['python']}, PyYAML {r['pyyaml']} | `{r['command']}` | "
                     f"{r['seconds']} | {r['execs']:,} | {r['execs_per_second']:,} | "
                     f"{r['corpus_files']:,}"
                     + (f" ({r['corpus_units']:,})" if r.get("corpus_units") else "")
                     + f" | {r['coverage']} / {r['features']} | "
                     f"{r['peak_rss_mb']} | {stopped} |")
    stopped_early = [r for r in data.get("earlier", []) if r["problem"] or r["exit_code"]]
    if stopped_early:
        lines += ["", "Earlier runs that stopped before their time (the crash was fixed, then "
                  "the target ran again):", ""]
        lines += [f"- {r['target']}, {r['started']}: "
                  f"{r['problem'] or 'exit ' + str(r['exit_code'])} after {r['seconds']} s "
                  f"and {r['execs']:,} executions ({', '.join(r['artifacts'])})"
                  for r in stopped_early]
    lines += ["", "### Crashes found, and how each was fixed", ""]
    if FINDINGS:
        lines += ["| target | input and what escaped | fix, and the unit test that keeps it |",
                  "|---|---|---|"]
        lines += [f"| {t} | {what} | {fix} |" for t, what, fix in FINDINGS]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run"]:
        run_target(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=TARGETS + ("all", "render"),
                        help="a target, all of them, or render: rewrite RESULTS.fuzz.md only")
    parser.add_argument("--seconds", type=int, default=600, help="per target (default 600)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="targets fuzzed at once by `all` (default 2: the VM has 2 cores)")
    parser.add_argument("--timeout", type=int, default=10,
                        help="seconds one input may take before it counts as a hang")
    parser.add_argument("--rss-limit-mb", type=int, default=1024)
    parser.add_argument("--no-record", action="store_true",
                        help="leave bench/results/fuzz.json and RESULTS.fuzz.md alone")
    args = parser.parse_args(argv)
    if args.target == "render":
        RESULTS_MD.write_text(render(json.loads(RESULTS_JSON.read_text())))
        return 0
    python = ensure_venv()
    targets = list(TARGETS) if args.target == "all" else [args.target]
    records: dict[str, dict] = {}
    pending = list(targets)
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                target = pending.pop(0)
            record = fuzz_one(python, target, args)
            record["timeout"] = args.timeout
            with lock:
                records[target] = record

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(args.jobs, len(targets))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = [records[t] for t in targets]
    if not args.no_record:
        save(ordered, args)
    return 1 if any(r["problem"] or r["exit_code"] for r in ordered) else 0
