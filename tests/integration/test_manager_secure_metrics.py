"""Manager(metrics_secure=True): HTTPS and scrape authorization wired up, on the fake apiserver.

tests/integration/test_secure_metrics.py covers ProbeServer + MetricsAuthorizer
themselves; tests/e2e/test_metrics_auth.py the real apiserver's answers. Here:
what the Manager builds from its two arguments, including the self-signed
fallback, the configuration errors, and a standby answering scrapes.
"""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys

import pytest
import yaml
from prometheus_client import CollectorRegistry

from k8s_http import CONFIGMAPS, ConfigError, Manager, with_flag_names
from k8s_http.core.objects import LEASES, SUBJECTACCESSREVIEWS, TOKENREVIEWS
from tests.e2e.operator_process import free_port
from tests.support.certs import test_pki
from tests.support.wait import eventually

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)


def manager(apiserver, **kwargs) -> Manager:
    # Two servers: with one address for both the manager would share one server.
    mgr = Manager(apiserver.config(), "secure", metrics_bind_address="127.0.0.1:0",
                  health_probe_bind_address=f"127.0.0.1:{free_port()}",
                  registry=CollectorRegistry(),
                  metrics_secure=True, **kwargs)
    mgr.add_controller(CONFIGMAPS, lambda key: None, workers=1)
    return mgr


def get(port, path, *, token=None, tls=None):
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=tls) if tls \
        else http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE      # the self-signed certificate cannot be verified
    return context


def test_without_a_cert_dir_a_self_signed_certificate_is_served(apiserver):
    mgr = manager(apiserver)
    mgr.start()
    try:
        metrics_port, probe_port = mgr.server_ports
        assert get(metrics_port, "/metrics", tls=unverified())[0] == 401
        assert get(metrics_port, "/metrics", token="other-token", tls=unverified())[0] == 403
        status, body = get(metrics_port, "/metrics", token="reader-token", tls=unverified())
        assert status == 200 and "rest_client_requests_total" in body
        # Nobody can verify it: it is self-signed.
        with pytest.raises(ssl.SSLCertVerificationError):
            get(metrics_port, "/metrics", tls=ssl.create_default_context())
        # The probes stay plain HTTP and unauthenticated.
        eventually(lambda: get(probe_port, "/readyz")[0] == 200)
        assert get(probe_port, "/healthz")[0] == 200
    finally:
        assert mgr.stop() == 0


def test_a_cert_dir_is_served_and_verifies(apiserver, tmp_path):
    pki = test_pki()
    (tmp_path / "tls.crt").write_bytes(pki.server.cert_pem)
    (tmp_path / "tls.key").write_bytes(pki.server.key_pem)
    mgr = manager(apiserver, metrics_cert_dir=str(tmp_path))
    mgr.start()
    try:
        tls = ssl.create_default_context(cafile=pki.ca_cert)
        assert get(mgr.server_ports[0], "/metrics", token="reader-token", tls=tls)[0] == 200
    finally:
        mgr.stop()


def test_a_standby_answers_scrapes(apiserver):
    """The reviews are creates; the leader write guard must not refuse them on a standby."""
    apiserver.create_object(LEASES.path("default"), {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "secure", "namespace": "default"},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600}})
    mgr = manager(apiserver, leader_elect=True, leader_election_namespace="default")
    mgr.start()
    try:
        eventually(lambda: apiserver.requests_for("GET", LEASES.path("default", "secure")))
        assert not mgr.is_leader()
        status, body = get(mgr.server_ports[0], "/metrics", token="reader-token",
                           tls=unverified())
        assert status == 200, body
        assert 'leader_election_master_status{name="secure"} 0.0' in body
    finally:
        mgr.stop()


def test_configuration_errors_name_the_fix(apiserver, tmp_path):
    with pytest.raises(ConfigError) as info:
        manager(apiserver, metrics_cert_dir=str(tmp_path / "missing"))
    assert str(tmp_path / "missing") in str(info.value) and "tls.crt" in str(info.value)

    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(ConfigError):
        manager(apiserver, metrics_cert_dir=str(tmp_path))

    with pytest.raises(ConfigError) as info:
        Manager(apiserver.config(), "x", metrics_bind_address="127.0.0.1:9443",
                health_probe_bind_address="127.0.0.1:9443", metrics_secure=True,
                registry=CollectorRegistry())
    assert "address of its own" in str(info.value)

    # A certificate without --metrics-secure would leave /metrics open: refused. The
    # Manager names its arguments; a command line built on k8s_http.ops.flags, its flags.
    with pytest.raises(ConfigError) as info:
        Manager(apiserver.config(), "x", metrics_bind_address="127.0.0.1:0",
                health_probe_bind_address="0", metrics_cert_dir=str(tmp_path),
                registry=CollectorRegistry())
    assert str(info.value) == (
        "metrics_cert_dir=: a certificate directory was given without metrics_secure=, so "
        "/metrics would be plain HTTP; add metrics_secure=, or drop metrics_cert_dir=")
    assert str(with_flag_names(info.value)) == (
        "--metrics-cert-dir: a certificate directory was given without --metrics-secure, so "
        "/metrics would be plain HTTP; add --metrics-secure, or drop --metrics-cert-dir")

    # Metrics disabled: nothing to secure, no certificate needed.
    Manager(apiserver.config(), "x", metrics_bind_address="0", metrics_secure=True,
            metrics_cert_dir=str(tmp_path / "missing"), registry=CollectorRegistry())


def test_the_command_line_reports_a_bad_cert_dir_in_one_line(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "controller.py"), "--kubeconfig", str(kubeconfig),
         "--metrics-secure", "--metrics-cert-dir", str(tmp_path / "nope"),
         "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "0"],
        capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("my-controller: error: ") and "Traceback" not in proc.stderr
    assert str(tmp_path / "nope") in line and "tls.crt" in line
