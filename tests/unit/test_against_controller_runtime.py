"""Ours beside a recorded controller-runtime v0.24 operator: /metrics and log keys.

The fixtures are what the controller-runtime peer (bench/peers/crpeer) showed on
a local control plane with a small workload, a conflict included
(tests/support/record_controller_runtime.py recorded them). A dashboard, an
alert or a saved log search written for it must work on ours unchanged:

  * every family both export: the same type, the same label names, the same
    label values where they are an enumeration (result, priority), the same
    bucket bounds written the same way (le="1", not "1.0");
  * the families only it exports are the webhook and certificate-watcher ones
    (we serve neither webhooks nor a certificate watcher), listed below;
  * every log message both write: our JSON line has each key its line has.
"""

from __future__ import annotations

import io
import json
import logging
import pathlib
import re

import pytest
from prometheus_client import CollectorRegistry

from k8s_http.ops.log import reconcile_context, setup_logging
from k8s_http.ops.metrics import Metrics, generate_text

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
# What the peer exports and we do not, and why.
ONLY_THEIRS = {
    "certwatcher_read_certificate_errors_total": "no certificate watcher (certs read at start)",
    "certwatcher_read_certificate_total": "no certificate watcher (certs read at start)",
    "controller_runtime_webhook_panics_total": "no webhooks",
    "controller_runtime_conversion_webhook_panics_total": "no webhooks",
}
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? ')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def families(text: str) -> dict[str, dict]:
    """name -> {type, label names, label values by name, le bounds} from the text format."""
    out: dict[str, dict] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            out[name] = {"type": kind, "labels": set(), "values": {}, "le": []}
            continue
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name = match["name"]
        family = next((f for f in (name, re.sub(r"_(bucket|sum|count)$", "", name))
                       if f in out), None)
        if family is None:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        if "le" in labels:
            le = labels.pop("le")
            if le not in out[family]["le"]:
                out[family]["le"].append(le)
        out[family]["labels"].update(labels)
        for key, value in labels.items():
            out[family]["values"].setdefault(key, set()).add(value)
    return out


@pytest.fixture(scope="module")
def theirs() -> dict[str, dict]:
    return {name: family for name, family in
            families((FIXTURES / "controller_runtime.metrics.txt").read_text()).items()
            if not name.startswith(("go_", "process_"))}


@pytest.fixture(scope="module")
def ours() -> dict[str, dict]:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_controller("my", 4)
    metrics.init_workqueue("my")
    metrics.reconcile_time_seconds.labels("my").observe(0.01)
    metrics.rest_client_requests_total.labels("200", "GET", "127.0.0.1:6443").inc()
    return families(generate_text(registry).decode())


def test_every_family_of_theirs_is_ours_or_named_as_not(theirs, ours):
    missing = sorted(set(theirs) - set(ours) - set(ONLY_THEIRS))
    assert not missing, f"families controller-runtime exports and we do not: {missing}"


def test_shared_families_have_the_same_type_labels_and_buckets(theirs, ours):
    shared = sorted(set(theirs) & set(ours))
    assert len(shared) >= 15, shared
    for name in shared:
        mine, theirs_ = ours[name], theirs[name]
        assert mine["type"] == theirs_["type"], name
        assert mine["labels"] == theirs_["labels"], name
        assert mine["le"] == theirs_["le"], name


@pytest.mark.parametrize("family, label", [
    ("controller_runtime_reconcile_total", "result"),
    ("workqueue_depth", "priority"),
])
def test_enumerated_label_values_are_the_same(theirs, ours, family, label):
    assert ours[family]["values"][label] == theirs[family]["values"][label]


def _our_keys(emit) -> dict[str, set[str]]:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        setup_logging("debug", "json", stream)
        emit()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    keys: dict[str, set[str]] = {}
    for line in stream.getvalue().splitlines():
        doc = json.loads(line)
        keys.setdefault(doc["msg"], set()).update(set(doc) - {"ts"})
    return keys


def test_our_reconcile_error_line_has_every_key_of_theirs():
    recorded = json.loads((FIXTURES / "controller_runtime.logs.json").read_text())
    theirs = {msg: set(keys) for msg, keys in recorded["keys_by_message"].items()}

    def emit():
        log = logging.getLogger("k8s_http.control.runner")
        with reconcile_context("my", _Key("recorded", "taken"),
                               "0b5c6c1e-1111-4a4a-9999-000000000001", kind="My",
                               group="mine.jp"):
            try:
                raise RuntimeError("Deployment taken already exists")
            except RuntimeError as err:
                log.error("Reconciler error", exc_info=err)
    ours = _our_keys(emit)
    assert theirs["Reconciler error"] <= ours["Reconciler error"], \
        theirs["Reconciler error"] - ours["Reconciler error"]


class _Key:
    def __init__(self, namespace, name):
        self.namespace, self.name = namespace, name

    def __str__(self):
        return f"{self.namespace}/{self.name}"
