"""bench/scaling/bare.py, the bare-client baseline of `python -m bench scale` (and of
startup_list and startup_replay), against the fake apiserver.

Only what its figure rests on: it counts every object, by streaming where the
apiserver offers it and page by page where it refuses, and says which; its
command line reads what the operator's informers read and prints one JSON line.
"""

from __future__ import annotations

import json

import pytest

from bench.scaling import bare
from my.spec import MANAGED_SELECTOR, MY
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.core.objects import DEPLOYMENTS, SERVICES
from tests.support.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(60)


def fleet(server, n, ns="default", resource=DEPLOYMENTS, labels=None, prefix="d"):
    for i in range(n):
        server.create_object(resource.path(ns), {"metadata": {"name": f"{prefix}{i:04d}",
                                                              "labels": labels or {}}})


@pytest.mark.parametrize("mode,requests", [("support", 1), ("refuse", 1 + 3)])
def test_counts_every_object_and_says_how_it_got_them(mode, requests):
    with FakeApiServer(watch_list=mode) as server:
        fleet(server, 1200)
        fleet(server, 5, ns="other")
        client = ApiClient.from_config(ClusterConfig(server=server.url))
        try:
            result = bare.measure(client, DEPLOYMENTS, "default")
            everywhere = bare.measure(client, DEPLOYMENTS)
            paged = bare.paged_list(client, DEPLOYMENTS, "other")
        finally:
            client.close()
    assert result["objects"] == 1200 and everywhere["objects"] == 1205 and paged == 5
    assert result["mode"] == ("streaming" if mode == "support" else "paged")
    assert result["seconds"] > 0
    # Streaming: one request. Refused: the refusal, then three pages of 500.
    assert len([r for r in server.requests if "/namespaces/default/" in r.path]) == requests


@pytest.mark.parametrize("mode", ["stream", "paged"])
def test_command_line_reads_the_informers_resources_and_prints_json(mode, capsys, monkeypatch):
    key, value = MANAGED_SELECTOR.split("=")
    with FakeApiServer() as server:
        fleet(server, 3, resource=MY)
        fleet(server, 3, labels={key: value})
        fleet(server, 3, resource=SERVICES, labels={key: value})
        fleet(server, 2, resource=SERVICES, prefix="other")   # not the operator's
        monkeypatch.setattr(bare, "load_config", lambda path: (
            path == "kc" or pytest.fail(path)) and ClusterConfig(server=server.url))
        assert bare.main(["--kubeconfig", "kc", "--namespace", "default", "--mode", mode]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == mode and out["seconds"] > 0
    # Streaming takes no selector: in the fleet's namespace all Services are the operator's.
    assert out["items"] == {"my": 3, "deployments": 3, "services": 5 if mode == "stream" else 3}


def test_a_missing_kubeconfig_is_a_clear_error_without_traceback(tmp_path, capsys):
    assert bare.main(["--kubeconfig", str(tmp_path / "none"), "--namespace", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bare client: ") and "Traceback" not in err
