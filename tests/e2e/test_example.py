"""The README's example operator (examples/widget_operator.py), run against the real
control plane: its ConfigMap is made, owned, put back when edited, and collected."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

from k8s_http.core.errors import AlreadyExistsError, NotFoundError
from k8s_http.core.objects import CONFIGMAPS, CRDS, get_condition
from tests.support.wait import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


def test_the_readme_shows_the_example_as_it_is():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert (ROOT / "examples" / "widget_operator.py").read_text() in blocks


@pytest.fixture(scope="module")
def widgets_crd(api_module):
    crd = yaml.safe_load((ROOT / "examples" / "widget-crd.yaml").read_text())
    try:
        api_module.create(CRDS, crd)
    except AlreadyExistsError:       # left by an earlier run on an attached plane
        pass
    eventually(lambda: (get_condition(api_module.get(CRDS, crd["metadata"]["name"]),
                                      "Established") or {}).get("status") == "True",
               timeout=60, message="Widget CRD not established")
    return crd


@pytest.fixture(scope="module")
def api_module(admin_kubeconfig):
    from k8s_http.wire.client import ApiClient
    from k8s_http.config.cluster import load_config
    client = ApiClient.from_config(load_config(admin_kubeconfig))
    yield client
    client.transport.close()


def test_the_example_operator_works(widgets_crd, admin_kubeconfig, api, namespace):
    from examples.widget_operator import WIDGETS, build
    from k8s_http.config.cluster import load_config

    mgr = build(load_config(admin_kubeconfig), metrics_bind_address="0",
                health_probe_bind_address="0", namespaces=[namespace])
    mgr.start()
    try:
        widget = api.create(WIDGETS, {"apiVersion": "example.com/v1", "kind": "Widget",
                                      "metadata": {"name": "w", "namespace": namespace},
                                      "spec": {"size": 3}})
        cm = eventually(lambda: _get(api, namespace), timeout=30, message="no ConfigMap")
        assert cm["data"] == {"size": "3"}
        (ref,) = cm["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["controller"]) == ("Widget",
                                                                widget["metadata"]["uid"], True)
        # an edit of the owned ConfigMap maps back to its Widget, which puts it back
        api.patch(CONFIGMAPS, "w", {"data": {"size": "99"}}, namespace=namespace)
        eventually(lambda: _get(api, namespace)["data"] == {"size": "3"}, timeout=30,
                   message="the edited ConfigMap was not put back")
    finally:
        mgr.stop()
    # the garbage collector follows the ownerReference
    api.delete(WIDGETS, "w", namespace=namespace)
    eventually(lambda: _get(api, namespace) is None, timeout=60,
               message="the ConfigMap outlived its Widget")


def _get(api, namespace):
    try:
        return api.get(CONFIGMAPS, "w", namespace=namespace)
    except NotFoundError:
        return None
