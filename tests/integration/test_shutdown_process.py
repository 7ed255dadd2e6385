"""Graceful shutdown of the real `controller.py` process, against the fake apiserver.

tests/integration/test_manager.py covers the Manager in-process; this is the
same contract as the kubelet sees it, through real signals:

- SIGTERM with a reconcile in flight: /readyz answers 503 at once, the
  reconcile finishes, the process exits 0;
- a second SIGTERM while draining: the process exits at once, non-zero.

The reconcile is held in flight by holding the fake apiserver's answer to its
first server-side apply (the Deployment) until the test lets it go.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
import yaml

from tests.e2e.operator_process import Fleet, http_get
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import eventually

MY_COLLECTION = "/apis/mine.jp/v1/namespaces/default/my"
DEPLOYMENTS_PATH = "/apis/apps/v1/namespaces/default/deployments/held"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def apiserver():
    with FakeApiServer() as server:
        server.create_object(MY_COLLECTION, {
            "apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"name": "held", "namespace": "default", "generation": 1},
            "spec": {"image": "nginx:1.27", "replicas": 0, "port": 8080}})
        yield server


@pytest.fixture
def held_apply(apiserver):
    """(arrived, release): the Deployment apply is held from `arrived` until `release`."""
    arrived, release = threading.Event(), threading.Event()

    def hold(exchange) -> bool:
        arrived.set()
        release.wait(60)
        return False            # then answer it normally
    apiserver.script(hold, match=lambda r: r.method == "PATCH" and r.path == DEPLOYMENTS_PATH)
    try:
        yield arrived, release
    finally:
        release.set()           # never leave the fake server's thread waiting


@pytest.fixture
def operator(apiserver, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": apiserver.url}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
    fleet = Fleet(tmp_path)
    try:
        yield fleet.start("drain", kubeconfig, "--namespace", "default",
                          "--graceful-shutdown-timeout", "20s")
    finally:
        fleet.close()


def test_sigterm_turns_readyz_503_at_once_drains_and_exits_0(apiserver, held_apply, operator):
    arrived, release = held_apply
    eventually(lambda: operator.readyz() == 200, timeout=30, interval=0.1,
               message=f"never ready; log:\n{operator.log()}")
    assert arrived.wait(30), "the reconcile never reached its apply"

    sent = time.monotonic()
    operator.signal(signal.SIGTERM)
    eventually(lambda: operator.readyz() == 503, timeout=5, interval=0.02,
               message="readyz did not turn 503 after SIGTERM")
    withdrawn_after = time.monotonic() - sent
    print(f"\nreadyz 503 {withdrawn_after * 1000:.0f} ms after SIGTERM")
    assert withdrawn_after < 1.0
    # The reconcile is still in flight: the process waits for it.
    assert operator.proc.poll() is None
    assert "[-]shutdown failed: shutting down" in http_get(operator.probe_port, "/readyz")[1]

    release.set()
    operator.expect_clean_exit(timeout=20)
    # It finished its reconcile: the Service is applied only after the Deployment.
    assert apiserver.get_object("/api/v1/namespaces/default/services/held") is not None
    assert "stopped" in operator.messages()
    # Every line is a controller-runtime zap line, and a clean stop says nothing above info.
    records = operator.log_records()
    assert records and all(set(r) >= {"level", "ts", "logger", "caller", "msg"} for r in records)
    loud = [r for r in records if r["level"] not in ("debug", "info")]
    assert loud == [], loud


def test_a_second_signal_exits_at_once_with_a_non_zero_code(apiserver, held_apply, operator):
    arrived, _release = held_apply
    eventually(lambda: operator.readyz() == 200, timeout=30, interval=0.1,
               message=f"never ready; log:\n{operator.log()}")
    assert arrived.wait(30), "the reconcile never reached its apply"
    operator.signal(signal.SIGTERM)
    eventually(lambda: operator.readyz() == 503, timeout=5, interval=0.02)
    assert operator.proc.poll() is None, "exited while a reconcile was in flight"

    sent = time.monotonic()
    operator.signal(signal.SIGTERM)
    code = operator.wait_exit(timeout=5)
    print(f"\nexit {code} {(time.monotonic() - sent) * 1000:.0f} ms after the second SIGTERM")
    assert code != 0
    assert any(m.startswith("second signal") for m in operator.messages()), operator.log()
    # The held reconcile never finished: nothing was written after the apply.
    assert apiserver.get_object("/api/v1/namespaces/default/services/held") is None
