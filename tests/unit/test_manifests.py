"""manifests/: static checks that need no cluster.

The e2e suite applies the same files to a real apiserver; these catch the
mistakes a reviewer would: wildcards or secrets in RBAC, a Pod that fails the
restricted Pod Security level, args the binary does not accept, a CRD whose
bounds disagree with the controller, dashboards and alerts querying metric
names the code does not export.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import yaml
from prometheus_client import CollectorRegistry

import controller
from k8s_http.metrics import Metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "my-controller-system"


def load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def all_docs() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((str(path.relative_to(MANIFESTS)), doc))
    return docs


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs
             if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def test_every_yaml_file_parses_into_kubernetes_objects():
    docs = all_docs()
    assert len(docs) >= 12
    for where, doc in docs:
        assert isinstance(doc, dict), where
        if doc.get("kind") == "Kustomization":
            continue
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), where


def test_kustomization_installs_the_controller_and_nothing_optional():
    kust = load("kustomization.yaml")[0]
    resources = kust["resources"]
    assert resources == ["namespace.yaml", "crd.yaml", "rbac.yaml", "deployment.yaml",
                         "metrics-service.yaml"]
    for name in resources:
        assert (MANIFESTS / name).is_file()
    # The sample cannot go with its CRD in one apply; the ServiceMonitor needs foreign CRDs.
    assert "sample-my.yaml" not in resources and "servicemonitor.yaml" not in resources
    assert "servicemonitor.yaml" in (MANIFESTS / "kustomization.yaml").read_text()  # documented


def test_namespaced_objects_live_in_the_controller_namespace():
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for where, doc in all_docs():
        if doc["kind"] in cluster_scoped | {"Kustomization", "My"}:
            continue
        assert doc["metadata"].get("namespace") == NAMESPACE, (where, doc["kind"])


def test_namespace_enforces_restricted_pod_security():
    ns = one(load("namespace.yaml"), "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# ---------------------------------------------------------------------------
# RBAC

RBAC = load("rbac.yaml")


def _rules():
    for doc in RBAC:
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc.get("rules", []):
                yield doc, rule


def test_rbac_has_no_wildcards_secrets_pods_or_deletes():
    for doc, rule in _rules():
        for field in ("apiGroups", "resources", "verbs", "nonResourceURLs", "resourceNames"):
            assert not any("*" in v for v in rule.get(field, [])), (doc["metadata"]["name"], rule)
        resources = {r.split("/")[0] for r in rule.get("resources", [])}
        assert not resources & {"secrets", "pods", "configmaps", "nodes"}, rule
        assert not set(rule["verbs"]) & {"delete", "deletecollection", "escalate", "bind",
                                         "impersonate"}, rule


def _granted(role_name: str) -> dict[tuple[str, str], set[str]]:
    role = next(d for d in RBAC if d["kind"] in ("ClusterRole", "Role")
                and d["metadata"]["name"] == role_name)
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def test_controller_role_is_exactly_what_the_code_uses():
    # Keep in step with the table at the top of manifests/rbac.yaml.
    assert _granted("my-controller") == {
        ("mine.jp", "my"): {"get", "list", "watch"},
        ("mine.jp", "my/status"): {"patch"},
        ("mine.jp", "my/finalizers"): {"update"},
        ("apps", "deployments"): {"get", "list", "watch", "create", "patch"},
        ("", "services"): {"get", "list", "watch", "create", "patch"},
        ("", "events"): {"create"},
    }


def test_leases_only_in_the_controller_namespace():
    role = one(RBAC, "Role", "my-controller-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _granted("my-controller-leader-election") == {
        ("coordination.k8s.io", "leases"): {"get", "create", "update"}}
    for doc in RBAC:
        if doc["kind"] == "ClusterRole":
            assert all(r.get("resources") != ["leases"] for r in doc.get("rules", []))


def test_bindings_point_at_the_service_account():
    sa = one(RBAC, "ServiceAccount", "my-controller")
    bound = {}
    for doc in RBAC:
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            (subject,) = doc["subjects"]
            assert (subject["kind"], subject["name"], subject["namespace"]) == \
                ("ServiceAccount", sa["metadata"]["name"], NAMESPACE)
            bound[doc["roleRef"]["name"]] = doc["roleRef"]["kind"]
    # metrics-auth (reviews for --metrics-secure) is the controller's; metrics-reader
    # is for the scraper, so it is not bound to the controller
    assert bound == {"my-controller": "ClusterRole", "my-controller-leader-election": "Role",
                     "my-controller-metrics-auth": "ClusterRole"}


def test_metrics_roles():
    assert _granted("my-controller-metrics-auth") == {
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"}}
    reader = one(RBAC, "ClusterRole", "my-controller-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


# ---------------------------------------------------------------------------
# The controller Deployment

DEPLOYMENT = one(load("deployment.yaml"), "Deployment", "my-controller")
POD = DEPLOYMENT["spec"]["template"]["spec"]
(CONTAINER,) = POD["containers"]


def test_pod_security_restricted():
    pod_sc, sc = POD["securityContext"], CONTAINER["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == 65532 and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert "privileged" not in sc and "hostNetwork" not in POD and "hostPID" not in POD
    assert not POD.get("volumes")          # no hostPath or anything else


def test_requests_and_limits():
    res = CONTAINER["resources"]
    assert set(res["requests"]) == {"cpu", "memory"} and set(res["limits"]) >= {"memory"}
    for name, request in res["requests"].items():
        if name in res["limits"]:
            assert controller.parse_quantity(request) <= controller.parse_quantity(
                res["limits"][name])


def test_args_are_accepted_by_the_binary_and_enable_leader_election():
    args = controller.build_parser().parse_args(CONTAINER.get("args", []))
    assert args.leader_elect is True
    assert args.leader_election_namespace == NAMESPACE
    assert args.metrics_bind_address.endswith(":8080")
    assert args.health_probe_bind_address.endswith(":8081")
    # The kubelet's SIGKILL must not cut the drain short.
    assert POD["terminationGracePeriodSeconds"] > args.graceful_shutdown_timeout


def test_probes_and_ports():
    ports = {p["name"]: p["containerPort"] for p in CONTAINER["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = CONTAINER[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == 8081
    assert CONTAINER["image"] == "my-controller:0.1.0"
    assert POD["serviceAccountName"] == "my-controller"


def test_metrics_service_selects_the_controller_pods():
    svc = one(load("metrics-service.yaml"), "Service")
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert DEPLOYMENT["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in CONTAINER["ports"]}
    ann = svc["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8080"
    assert ann["prometheus.io/path"] == "/metrics"
    monitor = one(load("servicemonitor.yaml"), "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]


# ---------------------------------------------------------------------------
# CRD

CRD = one(load("crd.yaml"), "CustomResourceDefinition", "my.mine.jp")
(VERSION,) = CRD["spec"]["versions"]
SPEC_SCHEMA = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_crd_names_and_subresources():
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"]) == ("mine.jp", "Namespaced")
    assert spec["names"] == {"kind": "My", "listKind": "MyList", "plural": "my", "singular": "my"}
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1", True, True)
    assert controller.MY.api_version == "mine.jp/v1" and controller.MY.plural == "my"
    assert VERSION["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns == {"Image": ".spec.image", "Desired": ".spec.replicas",
                       "Ready": ".status.readyReplicas",
                       "Status": '.status.conditions[?(@.type=="Ready")].reason',
                       "Age": ".metadata.creationTimestamp",
                       "Message": '.status.conditions[?(@.type=="Ready")].message'}


def test_crd_bounds_and_defaults_match_the_controller():
    props = SPEC_SCHEMA["properties"]
    assert SPEC_SCHEMA["required"] == ["image"]
    assert (props["image"]["minLength"], props["image"]["maxLength"]) == (
        1, controller.MAX_IMAGE_CHARS)
    assert (props["replicas"]["default"], props["replicas"]["minimum"],
            props["replicas"]["maximum"]) == (controller.DEFAULT_REPLICAS, 0,
                                              controller.MAX_REPLICAS)
    assert (props["port"]["default"], props["port"]["minimum"], props["port"]["maximum"]) == (
        controller.DEFAULT_PORT, 1, 65535)
    assert props["serviceType"]["default"] == controller.DEFAULT_SERVICE_TYPE
    assert tuple(props["serviceType"]["enum"]) == controller.SERVICE_TYPES
    env = props["env"]
    assert env["maxItems"] == controller.MAX_ENV
    assert env["x-kubernetes-list-type"] == "map" and env["x-kubernetes-list-map-keys"] == ["name"]
    assert env["items"]["properties"]["name"]["pattern"] == controller._ENV_NAME.pattern


def _structural(schema: dict, where: str = "") -> None:
    """Every node has a type (or int-or-string / preserve-unknown): a structural schema."""
    if not (schema.get("type") or schema.get("x-kubernetes-int-or-string")
            or schema.get("x-kubernetes-preserve-unknown-fields")):
        raise AssertionError(f"no type at {where or '/'}")
    for name, sub in (schema.get("properties") or {}).items():
        _structural(sub, f"{where}.{name}")
    if isinstance(schema.get("items"), dict):
        _structural(schema["items"], f"{where}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        _structural(schema["additionalProperties"], f"{where}{{}}")


def test_crd_schema_is_structural():
    _structural(VERSION["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("value", ["100m", "1", "0.5", ".5", "256Mi", "1Gi", "1e3", "+1", "2k",
                                   "-1", "1.5.5", "lots", "1Gb", "", "1e", "Mi"])
def test_crd_quantity_pattern_agrees_with_the_controller(value):
    pattern = SPEC_SCHEMA["properties"]["resources"]["properties"]["requests"][
        "additionalProperties"]["pattern"]
    limits_pattern = SPEC_SCHEMA["properties"]["resources"]["properties"]["limits"][
        "additionalProperties"]["pattern"]
    assert pattern == limits_pattern
    try:
        controller.parse_quantity(value)
        ok = True
    except ValueError:
        ok = False
    assert bool(re.match(pattern, value)) == ok


def test_sample_is_valid():
    my = one(load("sample-my.yaml"), "My", "foobar")
    assert my["apiVersion"] == "mine.jp/v1" and my["metadata"]["namespace"] == "default"
    assert my["spec"]["image"] == "postgres:16" and my["spec"]["port"] == 5432
    assert controller.validate_my({**my, "metadata": {**my["metadata"], "uid": "u"}}) == []


# ---------------------------------------------------------------------------
# Dashboard and alerts query metrics that exist

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                   "unless", "bool", "offset", "le", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (good enough for our own expressions)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)                             # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                            # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][-+]?\d+)?", "0", expr)  # numbers, 1e-9 too
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        token = match.group(0)
        if expr[match.end():].lstrip().startswith("("):
            continue                                                  # a function
        if token.lower() in PROMQL_KEYWORDS:
            continue
        names.add(token)
    return names


def test_promql_metric_names_parser():
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="y(z)"}[5m]))) / b > 1e-9 '
        'and on (x) c unless absent(d)') == {"a_bucket", "b", "c", "d"}


def exported_metric_names() -> set[str]:
    registry = CollectorRegistry()
    metrics = Metrics(registry, process_collectors=True)
    metrics.init_controller("my", 4)
    metrics.init_resource("my.mine.jp")
    metrics.init_leader("my-controller")
    metrics.build_info.info({"version": "test"})
    names = set()
    suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count",
                                                                 "_created"],
                "summary": ["", "_sum", "_count", "_created"], "info": ["_info"],
                "gauge": [""], "unknown": [""], "stateset": [""], "gaugehistogram": [
                    "_bucket", "_gsum", "_gcount"]}
    for family in registry.collect():
        names.update(family.name + s for s in suffixes[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def _dashboard_exprs() -> list[str]:
    dash = json.loads((MANIFESTS / "monitoring" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            found = re.search(r"label_values\((\w+)", query["query"])
            if found:
                exprs.append(found.group(1))
    return exprs


def _rule_exprs() -> list[str]:
    rule = one(load("monitoring/prometheusrule.yaml"), "PrometheusRule")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_queried_metric_is_exported(source):
    exprs = _dashboard_exprs() if source == "dashboard" else _rule_exprs()
    assert exprs
    exported = exported_metric_names()
    queried = set().union(*(promql_metric_names(e) for e in exprs))
    assert queried, exprs
    assert queried <= exported, sorted(queried - exported)


def test_the_dashboard_covers_what_operators_look_at():
    queried = set().union(*(promql_metric_names(e) for e in _dashboard_exprs()))
    for needed in ("controller_runtime_reconcile_total",
                   "controller_runtime_reconcile_errors_total",
                   "controller_runtime_reconcile_time_seconds_bucket", "workqueue_depth",
                   "k8s_http_watch_restarts_total", "k8s_http_cache_objects",
                   "leader_election_master_status"):
        assert needed in queried, needed


def test_alerts_are_well_formed():
    rule = one(load("monitoring/prometheusrule.yaml"), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    for needed in ("MyControllerDown", "MyControllerReconcileErrors", "MyControllerQueueGrowing",
                   "MyControllerWatchStalled", "MyControllerNoLeader"):
        assert needed in alerts
    for name, r in alerts.items():
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert r["annotations"]["summary"], name
        assert re.fullmatch(r"\d+[smh]", r.get("for", "0m")), name
        assert r["expr"].count("(") == r["expr"].count(")"), name


def test_the_schemas_security_contexts_are_the_controllers():
    """The CRD and controller.validate_spec accept the same restricting fields."""
    props = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]

    def shape(schema):
        if schema.get("type") == "object":
            return {k: shape(v) for k, v in schema["properties"].items()}
        if "enum" in schema:
            return tuple(schema["enum"])
        return {"boolean": bool, "integer": int, "string": str, "array": list}[schema["type"]]
    assert shape(props["podSecurityContext"]) == controller.POD_SECURITY_FIELDS
    assert shape(props["securityContext"]) == controller.CONTAINER_SECURITY_FIELDS
