"""bench/scale_bare.py, the bare-client baseline of bench/scale.py, against the fake apiserver.

Only what its figure rests on: it counts every object, by streaming where the
apiserver offers it and page by page where it refuses, and says which.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.core.objects import DEPLOYMENTS
from tests.support.fake_apiserver import FakeApiServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale_bare  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def fleet(server, n, ns="default"):
    for i in range(n):
        server.create_object(DEPLOYMENTS.path(ns), {"metadata": {"name": f"d{i:04d}"}})


@pytest.mark.parametrize("mode,requests", [("support", 1), ("refuse", 1 + 3)])
def test_counts_every_object_and_says_how_it_got_them(mode, requests):
    with FakeApiServer(watch_list=mode) as server:
        fleet(server, 1200)
        fleet(server, 5, ns="other")
        client = ApiClient.from_config(ClusterConfig(server=server.url))
        try:
            result = scale_bare.measure(client, DEPLOYMENTS, "default")
            everywhere = scale_bare.measure(client, DEPLOYMENTS)
        finally:
            client.close()
    assert result["objects"] == 1200 and everywhere["objects"] == 1205
    assert result["mode"] == ("streaming" if mode == "support" else "paged")
    assert result["seconds"] > 0
    # Streaming: one request. Refused: the refusal, then three pages of 500.
    assert len([r for r in server.requests if "/namespaces/default/" in r.path]) == requests


def test_command_line_prints_json(capsys, tmp_path):
    with FakeApiServer() as server:
        fleet(server, 3)
        kubeconfig = tmp_path / "kc"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
        assert scale_bare.main(["--kubeconfig", str(kubeconfig), "--resource",
                                "deployments.apps/v1", "--namespace", "default",
                                "--repeat", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objects"] == 3 and out["mode"] == "streaming" and len(out["runs"]) == 2
    assert out["resource"] == "deployments.apps"


@pytest.mark.parametrize("text", ["deployments", "apps/v1/x", "/v1", ".apps/v1"])
def test_a_bad_resource_is_a_clear_error_without_traceback(text, capsys):
    assert scale_bare.main(["--resource", text]) == 2
    err = capsys.readouterr().err
    assert "PLURAL[.GROUP]/VERSION" in err and "Traceback" not in err
