"""The operator end to end: manifests/ applied with kubectl, the operator as its own process.

The operator authenticates as its own ServiceAccount (a bound token minted
through the TokenRequest API), so the RBAC in manifests/base/rbac.yaml is what is
tested: any verb it lacks shows up as a 403 in its log and its metrics.
Pods run on the plane's fake Nodes (kwok), Ready at once; most Mys here still
ask for 0 replicas, as their Deployments are then Available as soon as the
Deployment controller has looked at them (tests/e2e/test_pods.py is about Pods).

The operator runs once for the module. Each test uses its own namespace (the
`namespace` fixture), except the sample, which lives in `default` as shipped.
"""

from __future__ import annotations

import copy
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from k8s_http.core.errors import ForbiddenError, InvalidError, NotFoundError
from k8s_http.core.objects import (DEPLOYMENTS, EVENTS, NAMESPACES, PODS, SERVICEACCOUNTS,
                                   SERVICES, Resource, get_condition)
from tests.e2e.operator_process import free_port
from tests.support.wait import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
MY = Resource("mine.jp", "v1", "my", True, "My")
SYSTEM_NS = "my-controller-system"
SA = "my-controller"
MANAGED = {"app.kubernetes.io/managed-by": "my-controller"}
# Everything here converges in about a second; this is headroom for a loaded CI machine.
TIMEOUT = 30.0
# The module's operator runs throughout: a test's namespace going with its Mys
# still in it would add the operator's refused re-creations to the writes and
# 403s this module counts.
pytestmark = pytest.mark.mys_deleted_first


# ---------------------------------------------------------------------------
# Fixtures


def _http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


class Operator:
    def __init__(self, proc: subprocess.Popen, log_path: pathlib.Path, metrics_port: int,
                 probe_port: int):
        self.proc, self.log_path = proc, log_path
        self.metrics_port, self.probe_port = metrics_port, probe_port

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        status, text = _http_get(self.metrics_port, "/metrics")
        assert status == 200, f"/metrics answered {status}"
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line.split("}")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def writes(self) -> dict[str, float]:
        """Requests that change something, by method. PUT is the Lease renewal (the
        reconciler never PUTs: it applies with PATCH and creates events with POST)."""
        return {m: self.metric("rest_client_requests_total", method=m)
                for m in ("POST", "PATCH", "DELETE")}


def kubectl(plane, *args: str, check: bool = True, input: str | None = None
            ) -> subprocess.CompletedProcess:
    kubectl_bin = plane.binaries.kubectl
    assert kubectl_bin, "the control plane's binaries include no kubectl"
    proc = subprocess.run([kubectl_bin, "--kubeconfig", str(plane.admin_kubeconfig), *args],
                          capture_output=True, text=True, timeout=120, input=input)
    if check:
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(control_plane):
    """`kubectl apply -k manifests/`, as a user would, then wait for the CRD."""
    kubectl(control_plane, "apply", "-k", str(MANIFESTS))
    kubectl(control_plane, "wait", "--for", "condition=established", "crd/my.mine.jp",
            "--timeout=60s")
    return control_plane


@pytest.fixture(scope="module")
def operator(installed, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("operator")
    kubeconfig = installed.mint_service_account_kubeconfig(SYSTEM_NS, SA, tmp / "sa.kubeconfig")
    metrics_port, probe_port = free_port(), free_port()
    log_path = tmp / "operator.log"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "controller.py"), "--kubeconfig", str(kubeconfig),
             "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
             "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
             "--leader-elect", "--leader-election-namespace", SYSTEM_NS,
             "--log-format", "json", "--log-level", "debug", "--workers", "2",
             "--graceful-shutdown-timeout", "10s"],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=str(ROOT))
    op = Operator(proc, log_path, metrics_port, probe_port)
    try:
        eventually(lambda: proc.poll() is None and _http_get(probe_port, "/readyz")[0] == 200,
                   timeout=60, interval=0.2,
                   message=f"operator never ready; log:\n{op.log()[-4000:]}")
        # Leader: the Lease is held (and, with it, the reconcile gate open).
        eventually(lambda: op.metric("leader_election_master_status") == 1, timeout=30,
                   interval=0.2, message="never became leader")
        yield op
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def make_my(name: str, namespace: str, **spec) -> dict:
    return {"apiVersion": "mine.jp/v1", "kind": "My",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": "nginx:1.27", "replicas": 0, "port": 8080, **spec}}


def get_or_none(api, resource, name, namespace):
    try:
        return api.get(resource, name, namespace=namespace)
    except NotFoundError:
        return None


def ready(api, name, namespace) -> dict | None:
    my = get_or_none(api, MY, name, namespace)
    return get_condition(my, "Ready") if my else None


def wait_reason(api, name, namespace, reason, timeout=TIMEOUT) -> dict:
    def check():
        cond = ready(api, name, namespace)
        assert cond and cond.get("reason") == reason, cond
        return get_or_none(api, MY, name, namespace)
    return eventually(check, timeout=timeout, interval=0.1, message=f"{name}: Ready/{reason}")


def events_for(api, name, namespace) -> list[dict]:
    items = api.list(EVENTS, namespace=namespace,
                     field_selector=f"involvedObject.name={name}")["items"]
    return [e for e in items if e.get("involvedObject", {}).get("kind") == "My"]


# ---------------------------------------------------------------------------
# The sample, as shipped


def test_sample_gets_its_deployment_and_service(operator, installed, api):
    # As the README says: the Secret first (the sample only names it), then the sample.
    kubectl(installed, "apply", "-f", "-", input=kubectl(
        installed, "create", "secret", "generic", "foobar-db", "-n", "default",
        "--from-literal=password=e2e-only", "--dry-run=client", "-o", "yaml").stdout)
    kubectl(installed, "apply", "-k", str(MANIFESTS / "samples"))
    try:
        my = eventually(lambda: (get_or_none(api, MY, "foobar", "default") or {}).get("status"),
                        timeout=TIMEOUT, interval=0.1, message="sample never got a status")
        my = api.get(MY, "foobar", namespace="default")
        uid = my["metadata"]["uid"]
        owner = {"apiVersion": "mine.jp/v1", "kind": "My", "name": "foobar", "uid": uid,
                 "controller": True, "blockOwnerDeletion": True}
        labels = {"app.kubernetes.io/name": "my", "app.kubernetes.io/instance": "foobar",
                  "app.kubernetes.io/managed-by": "my-controller"}
        selector = {"app.kubernetes.io/name": "my", "app.kubernetes.io/instance": "foobar"}

        dep = eventually(lambda: get_or_none(api, DEPLOYMENTS, "foobar", "default"),
                         timeout=TIMEOUT)
        assert labels.items() <= dep["metadata"]["labels"].items()
        assert dep["metadata"]["ownerReferences"] == [owner]
        assert dep["spec"]["selector"] == {"matchLabels": selector}
        assert dep["spec"]["replicas"] == 1
        assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        assert container["name"] == "app" and container["image"] == "postgres:16"
        assert container["ports"] == [{"containerPort": 5432, "protocol": "TCP"}]
        assert container["env"] == [{"name": "POSTGRES_PASSWORD", "valueFrom": {
            "secretKeyRef": {"name": "foobar-db", "key": "password"}}}]
        assert container["resources"] == {"requests": {"cpu": "100m"},
                                          "limits": {"memory": "256Mi"}}

        svc = eventually(lambda: get_or_none(api, SERVICES, "foobar", "default"), timeout=TIMEOUT)
        assert labels.items() <= svc["metadata"]["labels"].items()
        assert svc["metadata"]["ownerReferences"] == [owner]
        assert svc["spec"]["type"] == "ClusterIP"
        assert svc["spec"]["selector"] == selector
        (port,) = svc["spec"]["ports"]
        assert (port["port"], port["targetPort"], port["protocol"]) == (5432, 5432, "TCP")

        # Its Pod runs on a fake Node: the My is Available.
        my = wait_reason(api, "foobar", "default", "Available")
        status = my["status"]
        assert status["observedGeneration"] == my["metadata"]["generation"]
        assert status["selector"] == "app.kubernetes.io/instance=foobar,app.kubernetes.io/name=my"
        assert status["readyReplicas"] == 1
        cond = get_condition(my, "Ready")
        assert cond["status"] == "True" and cond["lastTransitionTime"]
        # printer columns and the scale subresource
        table = kubectl(installed, "get", "my", "foobar", "-n", "default").stdout
        assert table.split("\n")[0].split() == ["NAME", "IMAGE", "DESIRED", "READY", "STATUS",
                                                "AGE"]
        assert "postgres:16" in table and "Available" in table
        scale = kubectl(installed, "get", "--raw",
                        "/apis/mine.jp/v1/namespaces/default/my/foobar/scale").stdout
        assert '"selector":"app.kubernetes.io/instance=foobar,app.kubernetes.io/name=my"' in scale
        # this My's events only: on an attached `make cluster`, an earlier foobar's remain
        events = [e for e in events_for(api, "foobar", "default")
                  if e["involvedObject"].get("uid") == uid]
        assert [(e["reason"], e["message"]) for e in events] == [
            ("Created", "Created Deployment foobar and Service foobar")]
    finally:
        kubectl(installed, "delete", "-k", str(MANIFESTS / "samples"), "--wait=false",
                check=False)
        kubectl(installed, "delete", "secret", "foobar-db", "-n", "default", "--wait=false",
                check=False)


# ---------------------------------------------------------------------------
# Behaviour


def test_zero_replicas_is_available_and_scale_works(operator, installed, api, namespace):
    api.create(MY, make_my("zero", namespace))
    my = wait_reason(api, "zero", namespace, "Available")
    first = get_condition(my, "Ready")
    assert first["status"] == "True" and first["observedGeneration"] == 1
    # kubectl scale goes through the scale subresource to spec.replicas
    kubectl(installed, "scale", "my/zero", "-n", namespace, "--replicas=2")
    eventually(lambda: api.get(DEPLOYMENTS, "zero", namespace=namespace)["spec"]["replicas"] == 2,
               timeout=TIMEOUT, interval=0.1)
    # The two Pods run on the fake Nodes: Available again, at the new generation.
    def scaled():
        my = wait_reason(api, "zero", namespace, "Available")
        assert my["status"]["observedGeneration"] == 2 and my["status"]["readyReplicas"] == 2
        return my
    my = eventually(scaled, timeout=TIMEOUT, interval=0.1)
    assert get_condition(my, "Ready")["lastTransitionTime"] >= first["lastTransitionTime"]


def test_drift_is_put_back(operator, api, namespace):
    api.create(MY, make_my("drift", namespace, env=[{"name": "A", "value": "1"}]))
    wait_reason(api, "drift", namespace, "Available")
    api.patch(DEPLOYMENTS, "drift", {"spec": {"replicas": 3, "template": {"spec": {
        "containers": [{"name": "app", "image": "evil:1"}]}}}}, namespace=namespace,
        patch_type="strategic")

    def restored():
        dep = api.get(DEPLOYMENTS, "drift", namespace=namespace)
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert (dep["spec"]["replicas"], c["image"]) == (0, "nginx:1.27"), (dep["spec"]["replicas"],
                                                                           c["image"])
        return True
    eventually(restored, timeout=TIMEOUT, interval=0.1, message="drift not corrected")
    # a deleted child comes back
    old_uid = api.get(SERVICES, "drift", namespace=namespace)["metadata"]["uid"]
    api.delete(SERVICES, "drift", namespace=namespace)
    eventually(lambda: (get_or_none(api, SERVICES, "drift", namespace) or {"metadata": {}})[
        "metadata"].get("uid") not in (None, old_uid), timeout=TIMEOUT, interval=0.1,
        message="deleted Service not recreated")
    # a removed managed-by label takes the child out of the cache; it is still put back
    api.patch(DEPLOYMENTS, "drift", {"metadata": {"labels": {
        "app.kubernetes.io/managed-by": None}}}, namespace=namespace)
    # ... on the next reconcile of the My (its update is the trigger)
    api.patch(MY, "drift", {"spec": {"env": [{"name": "A", "value": "2"}]}}, namespace=namespace)

    def relabelled():
        dep = api.get(DEPLOYMENTS, "drift", namespace=namespace)
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert dep["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "my-controller"
        assert c["env"] == [{"name": "A", "value": "2"}], c.get("env")
        return True
    eventually(relabelled, timeout=TIMEOUT, interval=0.1)
    # removing the env var from the My removes it from the Deployment (config hash)
    api.patch(MY, "drift", {"spec": {"env": None}}, namespace=namespace)
    eventually(lambda: "env" not in api.get(DEPLOYMENTS, "drift", namespace=namespace)[
        "spec"]["template"]["spec"]["containers"][0], timeout=TIMEOUT, interval=0.1,
        message="env var removed from the My is still on the Deployment")


def test_service_type_and_port_changes(operator, api, namespace):
    """The classic server-side apply trap: NodePort -> ClusterIP (nodePort set by the server)."""
    api.create(MY, make_my("svc", namespace, serviceType="NodePort", port=9000))
    svc = eventually(lambda: get_or_none(api, SERVICES, "svc", namespace), timeout=TIMEOUT)
    assert svc["spec"]["type"] == "NodePort" and svc["spec"]["ports"][0].get("nodePort")
    api.patch(MY, "svc", {"spec": {"serviceType": "ClusterIP", "port": 9001}}, namespace=namespace)

    def switched():
        spec = api.get(SERVICES, "svc", namespace=namespace)["spec"]
        (port,) = spec["ports"]
        assert spec["type"] == "ClusterIP" and "nodePort" not in port, spec
        assert (port["port"], port["targetPort"]) == (9001, 9001), port
        return True
    eventually(switched, timeout=TIMEOUT, interval=0.1)
    # the status of generation 2 (the Available of generation 1 may still be there)
    eventually(lambda: wait_reason(api, "svc", namespace, "Available")["status"]
               ["observedGeneration"] == 2, timeout=TIMEOUT, interval=0.1)
    dep = api.get(DEPLOYMENTS, "svc", namespace=namespace)
    assert dep["spec"]["template"]["spec"]["containers"][0]["ports"] == [
        {"containerPort": 9001, "protocol": "TCP"}]


def test_deleting_the_my_deletes_its_children(operator, api, namespace):
    api.create(MY, make_my("doomed", namespace))
    wait_reason(api, "doomed", namespace, "Available")
    assert get_or_none(api, SERVICES, "doomed", namespace)
    api.delete(MY, "doomed", namespace=namespace)
    # the real garbage collector, following the ownerReferences
    eventually(lambda: get_or_none(api, DEPLOYMENTS, "doomed", namespace) is None
               and get_or_none(api, SERVICES, "doomed", namespace) is None,
               timeout=60, interval=0.2, message="children survived their My")


def test_a_foreign_deployment_is_a_conflict(operator, api, namespace):
    foreign = {"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "clash", "labels": {"app": "theirs"}},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "theirs"}},
                        "template": {"metadata": {"labels": {"app": "theirs"}},
                                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    created = api.create(DEPLOYMENTS, foreign, namespace=namespace)
    api.create(MY, make_my("clash", namespace))
    my = wait_reason(api, "clash", namespace, "Conflict")
    assert get_condition(my, "Ready")["status"] == "False"
    assert "Deployment clash" in get_condition(my, "Ready")["message"]
    eventually(lambda: any(e["reason"] == "Conflict" and e["type"] == "Warning"
                           for e in events_for(api, "clash", namespace)), timeout=TIMEOUT)
    time.sleep(2)   # give a would-be hot loop the time to show itself
    dep = api.get(DEPLOYMENTS, "clash", namespace=namespace)
    # untouched (its status moves: the Deployment controller works on it)
    assert dep["spec"] == created["spec"] and dep["metadata"]["labels"] == {"app": "theirs"}
    assert "ownerReferences" not in dep["metadata"]
    assert not [m for m in dep["metadata"].get("managedFields", [])
                if m.get("operation") == "Apply"]
    assert get_or_none(api, SERVICES, "clash", namespace) is None
    assert len([e for e in events_for(api, "clash", namespace) if e["reason"] == "Conflict"]) == 1


def test_a_spec_the_schema_cannot_catch_is_invalid(operator, api, namespace):
    # requests above limits: the CRD schema cannot compare two fields; the controller does.
    api.create(MY, make_my("greedy", namespace, resources={"requests": {"cpu": "2"},
                                                          "limits": {"cpu": "1"}}))
    my = wait_reason(api, "greedy", namespace, "InvalidSpec")
    assert "must not exceed" in get_condition(my, "Ready")["message"]
    assert get_or_none(api, DEPLOYMENTS, "greedy", namespace) is None
    eventually(lambda: [e["reason"] for e in events_for(api, "greedy", namespace)] ==
               ["InvalidSpec"], timeout=TIMEOUT)


def test_the_crd_rejects_what_it_can(operator, api, namespace):
    with pytest.raises(InvalidError) as info:
        api.create(MY, make_my("bounds", namespace, replicas=101, port=0))
    assert "spec.replicas" in str(info.value) and "spec.port" in str(info.value)
    with pytest.raises(InvalidError) as info:
        api.create(MY, make_my("1digit", namespace))      # cannot name a Service (CEL rule)
    assert "name" in str(info.value)
    created = api.create(MY, {"apiVersion": "mine.jp/v1", "kind": "My",
                              "metadata": {"name": "defaults", "namespace": namespace},
                              "spec": {"image": "nginx"}})
    assert created["spec"] == {"image": "nginx", "replicas": 1, "port": 8080,
                               "serviceType": "ClusterIP"}


def test_creating_one_my_costs_at_most_three_object_writes(operator, api, namespace):
    time.sleep(2)      # earlier tests' own writes coming back through the watches
    before = operator.writes()
    api.create(MY, make_my("frugal", namespace))
    wait_reason(api, "frugal", namespace, "Available")
    eventually(lambda: get_or_none(api, SERVICES, "frugal", namespace), timeout=TIMEOUT)
    time.sleep(3)      # anything the Deployment controller's status updates would trigger
    after = operator.writes()
    # PATCH: the Deployment and the Service (server-side apply) and the status.
    # POST: only Events (the reconciler creates nothing else).
    assert after["PATCH"] - before["PATCH"] <= 3, (before, after)
    assert after["DELETE"] == before["DELETE"]


def test_zero_writes_once_converged(operator, api, namespace):
    for i in range(3):
        api.create(MY, make_my(f"quiet-{i}", namespace))
    for i in range(3):
        wait_reason(api, f"quiet-{i}", namespace, "Available")
    time.sleep(2)      # let the last watch events (our own writes coming back) drain
    before = operator.writes()
    reconciles_before = operator.metric("controller_runtime_reconcile_total", controller="my")
    # A touch the cache does not keep (an annotation): the cached My is the same,
    # so nothing is reconciled at all.
    for i in range(3):
        api.patch(MY, f"quiet-{i}", {"metadata": {"annotations": {"touched": "yes"}}},
                  namespace=namespace)
    # A change it does see, which asks nothing of us: another controller's
    # condition beside ours. A reconcile each, and nothing to do.
    for i in range(3):
        api.patch(MY, f"quiet-{i}", [{"op": "add", "path": "/status/conditions/-", "value": {
            "type": "Audited", "status": "True", "reason": "Checked", "message": "by a test",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}}],
            namespace=namespace, patch_type="json", subresource="status")
    eventually(lambda: operator.metric("controller_runtime_reconcile_total", controller="my")
               >= reconciles_before + 3, timeout=TIMEOUT, interval=0.1)
    mark = len(operator.log())
    time.sleep(5)
    assert operator.writes() == before, \
        f"writes during a quiet period; the log meanwhile:\n{operator.log()[mark - 20000:]}"
    assert operator.metric("controller_runtime_reconcile_total", controller="my") == \
        reconciles_before + 3, "the annotations, or our own watch echoes, woke reconciles"
    for i in range(3):
        conditions = api.get(MY, f"quiet-{i}", namespace=namespace)["status"]["conditions"]
        assert {c["type"] for c in conditions} == {"Ready", "Audited"}


def test_the_controller_pod_is_admitted_under_restricted_pod_security(installed, api, namespace):
    api.patch(NAMESPACES, namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}})
    eventually(lambda: get_or_none(api, SERVICEACCOUNTS, "default", namespace), timeout=TIMEOUT,
               interval=0.1, message="no default ServiceAccount")
    # The default install's Pod, and the secure-metrics overlay's (a Secret volume more).
    for overlay in (MANIFESTS, MANIFESTS / "overlays" / "secure-metrics"):
        rendered = kubectl(installed, "kustomize", str(overlay)).stdout
        deployment = next(d for d in yaml.safe_load_all(rendered)
                          if d and d["kind"] == "Deployment")
        template = deployment["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "controller-dry-run",
                            "labels": template["metadata"]["labels"]},
               "spec": copy.deepcopy(template["spec"])}
        pod["spec"].pop("serviceAccountName")       # that account lives in the system namespace
        admitted = api.create(PODS, pod, namespace=namespace, dry_run=True)
        assert admitted["metadata"]["name"] == "controller-dry-run", overlay
    # the check is live: the same Pod without its seccomp profile is refused
    weaker = copy.deepcopy(pod)
    weaker["spec"]["securityContext"].pop("seccompProfile")
    weaker["spec"]["containers"][0]["securityContext"].pop("seccompProfile")
    with pytest.raises(ForbiddenError) as info:
        api.create(PODS, weaker, namespace=namespace, dry_run=True)
    assert "PodSecurity" in str(info.value) and "seccompProfile" in str(info.value)
    # and the real one, created by the ReplicaSet in the (restricted) system namespace
    eventually(lambda: api.list(PODS, namespace=SYSTEM_NS,
                                label_selector="app.kubernetes.io/name=my-controller")["items"],
               timeout=60, interval=0.2, message="controller Pod not admitted in its namespace")


def test_no_request_was_forbidden(operator):
    """Runs last in this module: the whole run, with the manifests' RBAC, had no 403
    but the apiserver's refusals to create in a namespace being deleted (a test's
    namespace goes while the operator watches every namespace), each logged as such."""
    log = operator.log()
    terminating = log.count("is being deleted")
    assert operator.metric("rest_client_requests_total", code="403") == terminating
    # Each such refusal also shows in the transport's request log (debug); any
    # other mention of a 403 is one the operator did not explain.
    going = set(re.findall(r"namespace (\S+) is being deleted", log))
    unexplained = [line for line in log.splitlines()
                   if ('"code": 403' in line or "403 Forbidden" in line or " 403 " in line)
                   and not (" -> 403 " in line
                            and any(f"/namespaces/{ns}/" in line for ns in going))]
    assert unexplained == [], unexplained[:5]
    assert operator.proc.poll() is None, "the operator exited"


def test_sigterm_exits_cleanly(operator):
    operator.proc.send_signal(signal.SIGTERM)
    assert operator.proc.wait(timeout=30) == 0
    assert "Traceback" not in operator.log()
