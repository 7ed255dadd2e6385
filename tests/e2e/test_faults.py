"""The soak's fault scenario, once and short, against the real control plane.

`bench/soak.py` runs `faultproxy.scenario()` in a loop for 20 minutes with 200
`My`s; this runs each fault once (a silent watch cut after 3 s, connections
refused for 3 s, no apiserver kill: the plane is shared by the session) with
a spec update, a create and a delete after each, then checks that nothing was
lost: every `My` converges to its last spec, the children of deleted ones are
gone, and the operator process never exited.
"""

from __future__ import annotations

import pytest

from k8s_http.core.errors import NotFoundError
from k8s_http.core.objects import DEPLOYMENTS
from tests.e2e.operator_process import (MY, delete_mys_and_wait, http_get, install_manifests,
                                        make_my, metric_sum)
from tests.support.faultproxy import FaultProxy, scenario
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(420)


def env_value(api, name, namespace):
    try:
        deployment = api.get(DEPLOYMENTS, name, namespace=namespace)
    except NotFoundError:
        return None
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        for item in container.get("env") or []:
            if item["name"] == "V":
                return item["value"]
    return None


def my_with(name, namespace, value):
    return make_my(name, namespace, env=[{"name": "V", "value": value}])


def converged(api, namespace, want: dict[str, str]) -> bool:
    mys = {m["metadata"]["name"]: m for m in api.list(MY, namespace=namespace)["items"]}
    assert set(mys) == set(want)
    for name, value in want.items():
        status = mys[name].get("status") or {}
        env, generation = env_value(api, name, namespace), mys[name]["metadata"]["generation"]
        # An assertion, not False: `eventually` then names the My that is behind.
        assert env == value and status.get("observedGeneration") == generation, (
            f"{name}: Deployment env {env!r} (want {value!r}), status observedGeneration "
            f"{status.get('observedGeneration')} of generation {generation}")
    children = {d["metadata"]["name"] for d in api.list(DEPLOYMENTS, namespace=namespace)["items"]}
    assert children == set(want), f"Deployments {sorted(children ^ set(want))} differ"
    return True


def test_every_fault_once_loses_nothing(control_plane, api, namespace, fleet, tmp_path):
    install_manifests(control_plane)
    with FaultProxy(control_plane.server, control_plane.admin_ssl_context()) as proxy:
        kubeconfig = proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig", namespace)
        op = fleet.start("faults", kubeconfig, "--namespace", namespace)
        op.wait_ready()
        want = {f"f-{i:02d}": "0" for i in range(12)}
        for name in want:
            api.create(MY, my_with(name, namespace, "0"), namespace=namespace)
        eventually(lambda: converged(api, namespace, want), timeout=120, interval=0.5,
                   message="the Mys never converged before the faults")

        steps = scenario(silent_seconds=3.0, refuse_seconds=3.0)
        for i, (what, apply) in enumerate(steps):
            apply(proxy)
            # Work for the operator while the fault is armed: a spec update, a
            # create and a delete.
            names = sorted(want)
            updated = names[i % len(names)]
            want[updated] = str(i + 1)
            api.patch(MY, updated, {"spec": {"env": [{"name": "V", "value": want[updated]}]}},
                      namespace=namespace)
            new = f"n-{i:02d}"
            api.create(MY, my_with(new, namespace, "0"), namespace=namespace)
            want[new] = "0"
            gone = names[(i + 5) % len(names)]
            if gone != updated:
                api.delete(MY, gone, namespace=namespace)
                del want[gone]
            eventually(lambda: proxy.pending() == 0, timeout=120, interval=0.2,
                       message=f"fault {what!r} never reached the operator")
            assert op.proc.poll() is None, f"the operator exited after {what!r}"

        eventually(lambda: converged(api, namespace, want), timeout=180, interval=1.0,
                   message="the Mys did not converge to their last spec after the faults")
        assert op.proc.poll() is None
        assert http_get(op.probe_port, "/healthz")[0] == 200
        metrics = op.metrics_text()
        injected_410 = proxy.injected["gone_event"] + proxy.injected["gone_watch"]
        # One initial list per informer, then one per 410 at least.
        assert metric_sum(metrics, "k8s_http_informer_relists_total") >= 3 + injected_410
        # Each malformed stream was seen as what it is, and the watch reopened.
        decoded = {kind: metric_sum(metrics, "k8s_http_watch_decode_errors_total", kind=kind)
                   for kind in ("oversize", "json", "not_object", "utf8", "framing")}
        assert all(decoded.values()), (decoded, proxy.injected_on)
        assert metric_sum(metrics, "k8s_http_watch_restarts_total", reason="protocol") >= 5
        assert proxy.injected["refuse"] == 1 and proxy.injected["lost_answer"] == 2
        delete_mys_and_wait(api, namespace)
