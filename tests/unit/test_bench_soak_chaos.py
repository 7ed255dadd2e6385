"""The pure parts of bench/soak_alloc.py and bench/chaos.py, and the fault proxy's partition.

The soak and the chaos runs need the control plane; these tests pin what their
reports rest on: which allocation sites grew (from real tracemalloc snapshots of
this process), the hand-written SVG, the "all converged" and "duplicates"
predicates, and that a partition holds a request until it heals. No timing is
asserted beyond "held, then answered".
"""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
import tracemalloc
import xml.dom.minidom

import pytest

from bench import chaos, soak_alloc
from tests.support.faultproxy import FaultProxy

_kept: list = []


def _grow(n: int) -> None:
    _kept.append([bytearray(1024) for _ in range(n)])     # the one site that grows


def test_allocation_report_finds_the_site_that_grows_every_interval(tmp_path):
    tracemalloc.start(1)
    try:
        intervals = []
        for i in range(4):
            _grow(50)
            path = tmp_path / f"s{i}.tracemalloc"
            tracemalloc.take_snapshot().dump(str(path))
            intervals.append({"t": 60.0 * i, "snapshot": str(path)})
    finally:
        tracemalloc.stop()
        _kept.clear()
    report = soak_alloc.allocation_report(intervals, warmup_seconds=60.0)
    for key in ("sites_growing_every_interval", "sites_growing_every_interval_after_warmup"):
        sites = [e["site"] for e in report[key]]
        assert any(s.startswith("tests/unit/test_bench_soak_chaos.py:") for s in sites), sites
    assert len(report["sites_growing_every_interval_after_warmup"][0]["kib_per_interval"]) == 2
    assert len(report["grew_per_interval"]) == 3
    assert len(report["traced_mib"]) == 4
    grower = next(s for s in report["top_sites"] if s.startswith("tests/unit/"))
    kib = report["top_site_kib"][grower]
    assert kib == sorted(kib) and kib[-1] - kib[0] >= 3 * 50


def test_svg_is_well_formed_and_has_a_line_per_series():
    text = soak_alloc.svg_lines("RSS <&>", "minutes", "MiB",
                                [("a", [0, 1, 2], [1.0, 2.0, 3.0]), ("b", [0, 2], [0.0, 0.0])])
    doc = xml.dom.minidom.parseString(text)
    assert len(doc.getElementsByTagName("polyline")) == 2


class _Observer:
    def __init__(self, objects):
        self.lock = threading.Lock()
        self.objects = objects


def _my(name, value, generation=2, observed=2):
    return {"metadata": {"name": name, "generation": generation},
            "spec": {"env": [{"name": "FOO", "value": value}]},
            "status": {"observedGeneration": observed, "conditions": [{"type": "Ready"}]}}


def _deployment(name, value):
    return {"metadata": {"name": name}, "spec": {"template": {"spec": {"containers": [
        {"env": [{"name": "FOO", "value": value}]}]}}}}


@pytest.mark.parametrize("my, deployment, service, want", [
    (_my("a", "v1"), _deployment("a", "v1"), True, True),
    (_my("a", "v2"), _deployment("a", "v1"), True, False),        # the update not applied
    (_my("a", "v1", observed=1), _deployment("a", "v1"), True, False),   # old status
    (_my("a", "v1"), _deployment("a", "v1"), False, False),        # no Service
    (_my("a", "v1"), None, True, False),
])
def test_all_converged(my, deployment, service, want):
    observer = _Observer({"my": {"a": my}, "deployment": {"a": deployment} if deployment else {},
                          "service": {"a": {}} if service else {}})
    assert chaos.all_converged(observer, ["a"]) is want


def test_duplicates_counts_owners_with_two_children():
    owned = lambda uid: {"metadata": {"ownerReferences": [{"kind": "My", "uid": uid}]}}  # noqa

    class Client:
        def list(self, resource, namespace):
            if resource.plural == "deployments":
                return {"items": [owned("u1"), owned("u1"), owned("u2")]}
            return {"items": [owned("u1"), owned("u2")]}
    assert chaos.duplicates(Client()) == {"deployments": 1, "services": 0}


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"kind":"Status"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_partition_holds_a_request_until_it_heals():
    from tests.support.certs import test_pki
    pki = test_pki()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki.server.cert, pki.server.key)
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client_ctx = ssl.create_default_context(cafile=pki.ca_cert)
    proxy = FaultProxy(f"https://127.0.0.1:{server.server_address[1]}", client_ctx).start()
    try:
        proxy.partition(1.0)
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.sendall(b"GET /api HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(0.5)
            with pytest.raises(socket.timeout):
                sock.recv(1)                  # nothing while partitioned
            sock.settimeout(10)
            assert sock.recv(64).startswith(b"HTTP/1.1 200")   # then it flows again
        assert proxy.injected["partition"] == 1
    finally:
        proxy.stop()
        server.shutdown()


def _audit_line(at: str, agent: str, verb: str, resource: str, name: str) -> str:
    import json
    return json.dumps({"requestReceivedTimestamp": at, "userAgent": agent, "verb": verb,
                       "objectRef": {"resource": resource, "name": name}})


def test_the_sharded_soak_names_objects_two_replicas_wrote_and_their_closest_writes(tmp_path):
    from bench import soak
    ua = "my-controller/0.1 (linux) k8s_http shard/"
    audit = tmp_path / "audit.log"
    audit.write_text("\n".join([
        _audit_line("2026-12-06T10:00:00.000000Z", ua + "soak-a", "patch", "deployments", "x"),
        _audit_line("2026-12-06T10:00:20.500000Z", ua + "soak-b", "patch", "deployments", "x"),
        _audit_line("2026-12-06T10:00:21.000000Z", ua + "soak-b", "patch", "services", "y"),
        _audit_line("2026-12-06T10:00:23.250000Z", ua + "soak-c", "patch", "services", "y"),
        _audit_line("2026-12-06T10:00:24.000000Z", ua + "soak-c", "get", "services", "y"),
        _audit_line("2026-12-06T10:00:24.100000Z", "bench/1.0", "patch", "services", "y"),
        _audit_line("2026-12-06T10:00:25.000000Z", ua + "soak-a", "patch", "leases", "l"),
        _audit_line("2026-12-06T10:00:26.000000Z", ua + "soak-a", "patch", "my", "z"),
        "not json",
    ]) + "\n")
    figures = soak.writers_figures(audit)
    assert figures["objects_written"] == 3                  # leases, reads and the bench's apart
    assert figures["objects_written_by_two_replicas"] == 2
    assert figures["closest_writes_by_two_replicas"] == {
        "seconds": 2.25, "object": "services/y", "first": "soak-b", "then": "soak-c"}
