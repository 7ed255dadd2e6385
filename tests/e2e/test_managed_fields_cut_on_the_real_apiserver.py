"""The managedFields cut against what the real kube-apiserver writes.

The unit tests hold `cut_managed_fields` to its contract on made-up lines; this
proves the cut is actually made (not just safely refused) on the apiserver's own
serialisation: a typed object with managedFields last in its metadata, by two
managers (an apply and the Deployment controller's status update), a Service,
and a custom resource, whose keys the apiserver writes sorted.
"""

from __future__ import annotations

import copy
import json

import pytest

from k8s_http.core.objects import DEPLOYMENTS, SERVICES
from k8s_http.wire.watchproto import cut_managed_fields
from tests.e2e.test_example import api_module, widgets_crd  # noqa: F401  (fixtures)
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(120)
MANAGER = "e2e-cut"


def deployment(name: str) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{
                                      "name": "app", "image": "registry.example.com/a:1",
                                      "args": ["]},\"x", "a]"],
                                      "ports": [{"containerPort": 8080}]}]}}}}


def watch_lines(api, path: str) -> list[bytes]:
    """The raw lines of a watch from now (the current objects as ADDED, then any change), 1 s long."""
    stream = api.transport.stream(path, query={"watch": "1", "timeoutSeconds": "1"})
    payload = b""
    try:
        while data := stream.read_payload(timeout_seconds=10):
            payload += data
    finally:
        stream.close()
    return [line for line in payload.split(b"\n") if line.strip()]


def test_the_apiservers_own_lines_are_cut_to_the_object_less_its_managed_fields(
        widgets_crd, api, namespace):
    from examples.widget_operator import WIDGETS

    api.apply(DEPLOYMENTS, deployment("web"), field_manager=MANAGER, namespace=namespace)
    api.apply(SERVICES, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
              field_manager=MANAGER, namespace=namespace)
    api.create(WIDGETS, {"apiVersion": "example.com/v1", "kind": "Widget",
                         "metadata": {"name": "w", "namespace": namespace,
                                      "annotations": {"a": "]},\"b"}},
                         "spec": {"size": 3}}, namespace=namespace)
    # The Deployment controller's status update: a second manager, a subresource.
    eventually(lambda: len(api.get(DEPLOYMENTS, "web", namespace=namespace)
                           ["metadata"]["managedFields"]) == 2,
               timeout=60, message="the Deployment controller never wrote the status")

    paths = (DEPLOYMENTS.path(namespace), SERVICES.path(namespace), WIDGETS.path(namespace))
    for path in paths:
        # The object as ADDED, and any update the Deployment controller makes meanwhile.
        lines = watch_lines(api, path)
        assert lines, path
        for line in lines:
            whole = json.loads(line)
            assert whole["object"]["metadata"]["managedFields"], path
            cut = cut_managed_fields(line)
            assert cut is not None, (path, whole["type"])
            expected = copy.deepcopy(whole)
            del expected["object"]["metadata"]["managedFields"]
            assert json.loads(cut) == expected, (path, whole["type"])
