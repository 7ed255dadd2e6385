"""Each metric family is pre-set once, by the component that owns it, and the
build-info family is named after the application, not after my-controller."""

import collections

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from k8s_http import CONFIGMAPS, DEPLOYMENTS, SERVICES, ClusterConfig, Manager
from k8s_http.core.objects import Resource
from k8s_http.ops.metrics import Metrics, build_info_name

MYS = Resource("mine.jp", "v1", "mys", "My")


@pytest.fixture
def init_calls(monkeypatch):
    """(method, label) -> how many times a Metrics.init_* ran with it."""
    calls = collections.Counter()
    for method in ("init_build_info", "init_controller", "init_workqueue", "init_resource",
                   "init_leader"):
        original = getattr(Metrics, method)

        def counting(self, label, *args, _method=method, _original=original):
            calls[(_method, label)] += 1
            return _original(self, label, *args)
        monkeypatch.setattr(Metrics, method, counting)
    return calls


def test_a_manager_pre_sets_each_family_once(init_calls):
    mgr = Manager(ClusterConfig(server="http://127.0.0.1:1"), "my-controller",
                  namespaces=["a", "b"], leader_elect=True, leader_election_namespace="sys",
                  metrics_bind_address="0", health_probe_bind_address="0",
                  registry=CollectorRegistry())
    mgr.store_for(DEPLOYMENTS, "x=y")
    mgr.add_controller(CONFIGMAPS, lambda key: None, owns=[DEPLOYMENTS, SERVICES],
                       owns_label_selector="x=y", workers=2)
    for informer in mgr._informers.values():      # one watcher per namespace each
        informer.start()
        informer.stop()
    assert dict(init_calls) == {
        ("init_build_info", "my-controller"): 1,
        ("init_leader", "my-controller"): 1,
        ("init_controller", "configmap"): 1,
        ("init_workqueue", "configmap"): 1,
        ("init_resource", "configmaps"): 1,
        ("init_resource", "deployments.apps"): 1,
        ("init_resource", "services"): 1,
    }


@pytest.mark.parametrize("app, family", [
    ("my-controller", "my_controller_build"), ("widget-controller", "widget_controller_build"),
    ("web.example", "web_example_build"), ("9lives", "_9lives_build"), ("", "__build"),
])
def test_the_build_info_family_is_named_after_the_application(app, family):
    assert build_info_name(app) == family


def test_my_controller_still_exports_my_controller_build_info():
    registry = CollectorRegistry()
    Metrics(registry).init_build_info("my-controller", "0.1.0")
    exposition = generate_latest(registry).decode()
    assert 'my_controller_build_info{manager="my-controller",version="0.1.0"} 1.0' in exposition
    assert "widget" not in exposition


def test_a_sharded_manager_exports_the_objects_of_each_range_it_holds():
    registry = CollectorRegistry()
    mgr = Manager(ClusterConfig(server="http://127.0.0.1:1"), "my-controller",
                  namespaces=["a"], shards=True, shard_label="sharding.example.com/slot",
                  leader_election_namespace="sys", registry=registry)
    mgr.add_controller(MYS, lambda key: None, owns=[DEPLOYMENTS])
    text = generate_latest(registry).decode()
    # Nothing held yet: the family is there, with no range.
    assert "# TYPE k8s_http_shard_range_objects gauge" in text
    assert "k8s_http_shard_range_objects{" not in text
    mgr._shard_caches.select(frozenset(range(128, 256)))
    text = generate_latest(registry).decode()
    for resource in ("mys.mine.jp", "deployments.apps"):
        assert ('k8s_http_shard_range_objects{range="0x8000000000000000-0x10000000000000000",'
                f'resource="{resource}"}} 0.0') in text
    # A scrape that asks for other families (`?name[]=`) counts nothing.
    counted = []
    mgr.metrics.shard_range_objects._objects_per_range = lambda: counted.append(1) or []
    generate_latest(registry)
    assert counted == [1]
    assert "k8s_http_shard_range_objects{" not in generate_latest(
        registry.restricted_registry(["k8s_http_shard_slots_held"])).decode()
    assert counted == [1]


def test_an_unsharded_manager_has_no_shard_families():
    registry = CollectorRegistry()
    Manager(ClusterConfig(server="http://127.0.0.1:1"), "my-controller", registry=registry)
    assert "k8s_http_shard_" not in generate_latest(registry).decode()
