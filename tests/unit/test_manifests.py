"""manifests/: static checks that need no cluster.

The e2e suite renders and applies the same files on a real apiserver
(tests/e2e/test_overlay.py renders an overlay with `kubectl kustomize`); these
catch the mistakes a reviewer would: wildcards or secrets in RBAC, a Pod that
fails the restricted Pod Security level, args the binary does not accept (or a
namespace baked into them), a CRD whose bounds disagree with the controller, a
component patch that no longer fits the base, dashboards and alerts querying
metric names the code does not export.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import yaml
from prometheus_client import CollectorRegistry

import controller
from k8s_http import parse_quantity
from k8s_http.core.names import ENV_VAR_NAME
from k8s_http.ops.metrics import Metrics
from my.spec import (CONTAINER_SECURITY_FIELDS, DEFAULT_PORT, DEFAULT_REPLICAS, DEFAULT_SERVICE_TYPE,
                     MAX_ENV, MAX_IMAGE_CHARS, MAX_REPLICAS, MY, POD_SECURITY_FIELDS, SERVICE_TYPES,
                     validate_my)
from my.status import (APPLY_FAILED, AVAILABLE, CONDITION_READY, CONFLICT, INVALID_SPEC,
                       PROGRESS_DEADLINE_EXCEEDED, PROGRESSING, REPLICA_FAILURE)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "my-controller-system"
ALERTS = "components/monitoring/alerts/prometheusrule.yaml"


def load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def kustomization(directory: str) -> dict:
    return load(f"{directory}/kustomization.yaml")[0]


def _is_kustomize_file(path: pathlib.Path) -> bool:
    # kustomization.yaml, JSON patches (lists of operations) under components/, and
    # kustomize's own transformer configurations under transformers/
    return path.name == "kustomization.yaml" or "components" in path.parts and \
        path.name.endswith("-patch.yaml") or "transformers" in path.parts


def all_docs() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if _is_kustomize_file(path):
            continue
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
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), where


def test_default_install_is_the_base_and_nothing_optional():
    assert kustomization(".")["resources"] == ["base"]
    base = kustomization("base")
    assert base["resources"] == ["namespace.yaml", "crd.yaml", "rbac.yaml", "user-roles.yaml",
                                 "deployment.yaml", "metrics-service.yaml"]
    for name in base["resources"]:
        assert (MANIFESTS / "base" / name).is_file()
    # the base bakes no namespace transform in: overlays set it
    assert "namespace" not in base and "namePrefix" not in base
    # The sample cannot go with its CRD in one apply; ServiceMonitors need foreign CRDs.
    text = (MANIFESTS / "kustomization.yaml").read_text()
    for apart in ("samples/", "overlays/secure-metrics/", "components/monitoring/"):
        assert apart in text                                   # documented, not installed


def test_every_kustomization_references_what_exists():
    for path in MANIFESTS.rglob("kustomization.yaml"):
        kust = yaml.safe_load(path.read_text())
        for entry in kust.get("resources", []) + kust.get("components", []):
            target = (path.parent / entry).resolve()
            assert target.exists(), (path, entry)
            if target.is_dir():
                assert (target / "kustomization.yaml").is_file(), (path, entry)
                # kustomize refuses a base that contains the overlay (a cycle)
                assert target not in path.parent.resolve().parents, (path, entry)
        for patch in kust.get("patches", []):
            assert (path.parent / patch["path"]).is_file(), (path, patch)
        assert kust["kind"] == ("Component" if "components" in path.parts else "Kustomization")


def test_samples_are_apart_and_valid():
    assert kustomization("samples")["resources"] == ["my-foobar.yaml"]
    my = one(load("samples/my-foobar.yaml"), "My", "foobar")
    assert my["apiVersion"] == "mine.jp/v1" and my["metadata"]["namespace"] == "default"
    assert my["spec"]["image"] == "postgres:16" and my["spec"]["port"] == 5432
    assert validate_my({**my, "metadata": {**my["metadata"], "uid": "u"}}) == []


def test_namespaced_objects_live_in_the_controller_namespace():
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for where, doc in all_docs():
        if doc["kind"] in cluster_scoped | {"My"}:
            continue
        assert doc["metadata"].get("namespace") == NAMESPACE, (where, doc["kind"])


def test_namespace_enforces_restricted_pod_security():
    ns = one(load("base/namespace.yaml"), "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# ---------------------------------------------------------------------------
# RBAC

RBAC = load("base/rbac.yaml")
USER_ROLES = load("base/user-roles.yaml")


def _rules():
    for doc in RBAC:
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc.get("rules", []):
                yield doc, rule


def test_rbac_has_no_wildcards_secrets_or_deletes_and_only_lists_pods():
    for doc, rule in _rules():
        for field in ("apiGroups", "resources", "verbs", "nonResourceURLs", "resourceNames"):
            assert not any("*" in v for v in rule.get(field, [])), (doc["metadata"]["name"], rule)
        resources = {r.split("/")[0] for r in rule.get("resources", [])}
        assert not resources & {"secrets", "configmaps", "nodes"}, rule
        if "pods" in resources:       # read to say why a My is not ready, never written
            assert set(rule["verbs"]) == {"list"}, rule
        assert not set(rule["verbs"]) & {"delete", "deletecollection", "escalate", "bind",
                                         "impersonate"}, rule


def _granted(role_name: str) -> dict[tuple[str, str], set[str]]:
    role = next(d for d in RBAC + USER_ROLES if d["kind"] in ("ClusterRole", "Role")
                and d["metadata"]["name"] == role_name)
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def test_controller_role_is_exactly_what_the_code_uses():
    # Keep in step with the table at the top of manifests/base/rbac.yaml.
    assert _granted("my-controller") == {
        ("mine.jp", "my"): {"get", "list", "watch"},
        ("mine.jp", "my/status"): {"patch"},
        ("mine.jp", "my/finalizers"): {"update"},
        ("apps", "deployments"): {"get", "list", "watch", "create", "patch"},
        ("", "services"): {"get", "list", "watch", "create", "patch"},
        ("", "pods"): {"list"},
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


def test_user_roles_are_aggregated_into_the_built_in_ones():
    editor, viewer = one(USER_ROLES, "ClusterRole", "my-editor"), \
        one(USER_ROLES, "ClusterRole", "my-viewer")
    assert {k: v for k, v in editor["metadata"]["labels"].items() if "aggregate" in k} == {
        "rbac.authorization.k8s.io/aggregate-to-admin": "true",
        "rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    assert {k: v for k, v in viewer["metadata"]["labels"].items() if "aggregate" in k} == {
        "rbac.authorization.k8s.io/aggregate-to-view": "true"}
    assert _granted("my-editor")[("mine.jp", "my")] == {
        "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
    # status is the controller's to write: users read it
    assert _granted("my-editor")[("mine.jp", "my/status")] == {"get"}
    assert all(verbs <= {"get", "list", "watch"} for verbs in _granted("my-viewer").values())
    assert set(_granted("my-viewer")) == {("mine.jp", "my"), ("mine.jp", "my/status"),
                                          ("mine.jp", "my/scale")}
    for role in USER_ROLES:                        # nothing beyond My
        assert all(rule["apiGroups"] == ["mine.jp"] for rule in role["rules"])


def test_metrics_roles():
    assert _granted("my-controller-metrics-auth") == {
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"}}
    reader = one(RBAC, "ClusterRole", "my-controller-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


# ---------------------------------------------------------------------------
# The controller Deployment

DEPLOYMENT = one(load("base/deployment.yaml"), "Deployment", "my-controller")
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
            assert parse_quantity(request) <= parse_quantity(
                res["limits"][name])


def test_args_are_accepted_by_the_binary_and_enable_leader_election():
    args = controller.build_parser().parse_args(CONTAINER.get("args", []))
    assert args.leader_elect is True
    # No namespace baked in: the Lease follows the Pod's namespace under any overlay.
    assert args.leader_election_namespace is None
    assert not any(NAMESPACE in arg for arg in CONTAINER["args"])
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
    svc = one(load("base/metrics-service.yaml"), "Service")
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert DEPLOYMENT["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in CONTAINER["ports"]}
    ann = svc["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8080"
    assert ann["prometheus.io/path"] == "/metrics"
    monitor = one(load("components/monitoring/servicemonitor.yaml"), "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]


# ---------------------------------------------------------------------------
# CRD

CRD = one(load("base/crd.yaml"), "CustomResourceDefinition", "my.mine.jp")
(VERSION,) = CRD["spec"]["versions"]
SPEC_SCHEMA = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_crd_names_and_subresources():
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"]) == ("mine.jp", "Namespaced")
    assert spec["names"] == {"kind": "My", "listKind": "MyList", "plural": "my", "singular": "my"}
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1", True, True)
    assert MY.api_version == "mine.jp/v1" and MY.plural == "my"
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
        1, MAX_IMAGE_CHARS)
    assert (props["replicas"]["default"], props["replicas"]["minimum"],
            props["replicas"]["maximum"]) == (DEFAULT_REPLICAS, 0,
                                              MAX_REPLICAS)
    assert (props["port"]["default"], props["port"]["minimum"], props["port"]["maximum"]) == (
        DEFAULT_PORT, 1, 65535)
    assert props["serviceType"]["default"] == DEFAULT_SERVICE_TYPE
    assert tuple(props["serviceType"]["enum"]) == SERVICE_TYPES
    env = props["env"]
    assert env["maxItems"] == MAX_ENV
    assert env["x-kubernetes-list-type"] == "map" and env["x-kubernetes-list-map-keys"] == ["name"]
    assert env["items"]["properties"]["name"]["pattern"] == ENV_VAR_NAME.pattern


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


def _undescribed(schema: dict, where: str) -> list[str]:
    missing = [] if schema.get("description") else [where]
    for name, sub in (schema.get("properties") or {}).items():
        missing += _undescribed(sub, f"{where}.{name}")
    if isinstance(schema.get("items"), dict):
        missing += _undescribed(schema["items"], f"{where}[]")
    return missing


def test_crd_describes_spec_status_and_every_status_field():
    """What `kubectl explain my.status` shows: nothing left blank."""
    props = VERSION["schema"]["openAPIV3Schema"]["properties"]
    assert SPEC_SCHEMA.get("description")
    assert _undescribed(props["status"], "status") == []
    assert set(props["status"]["properties"]) == {"observedGeneration", "replicas",
                                                  "readyReplicas", "selector", "conditions"}


def test_crd_conditions_are_the_standard_condition_schema():
    """metav1.Condition as the Kubernetes type declares it (kubectl, kstatus and
    dashboards parse conditions by it): five required fields with its bounds."""
    conditions = VERSION["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "conditions"]
    assert conditions["type"] == "array"
    assert (conditions["x-kubernetes-list-type"], conditions["x-kubernetes-list-map-keys"]) == (
        "map", ["type"])
    item = conditions["items"]
    assert sorted(item["required"]) == ["lastTransitionTime", "message", "reason", "status",
                                        "type"]
    fields = item["properties"]
    assert set(fields) == set(item["required"]) | {"observedGeneration"}
    bounds = {name: {k: v for k, v in field.items() if k != "description"}
              for name, field in fields.items()}
    assert bounds == {
        "type": {"type": "string", "maxLength": 316, "pattern":
                 r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                 r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                   "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
        "message": {"type": "string", "maxLength": 32768},
    }
    # the operator's own condition type and reasons fit it
    for reason in (AVAILABLE, PROGRESSING, INVALID_SPEC, CONFLICT, APPLY_FAILED, REPLICA_FAILURE,
                   PROGRESS_DEADLINE_EXCEEDED):
        assert re.fullmatch(bounds["reason"]["pattern"], reason), reason
    assert re.fullmatch(bounds["type"]["pattern"], CONDITION_READY)


@pytest.mark.parametrize("value", ["100m", "1", "0.5", ".5", "256Mi", "1Gi", "1e3", "+1", "2k",
                                   "-1", "1.5.5", "lots", "1Gb", "", "1e", "Mi"])
def test_crd_quantity_pattern_agrees_with_the_controller(value):
    pattern = SPEC_SCHEMA["properties"]["resources"]["properties"]["requests"][
        "additionalProperties"]["pattern"]
    limits_pattern = SPEC_SCHEMA["properties"]["resources"]["properties"]["limits"][
        "additionalProperties"]["pattern"]
    assert pattern == limits_pattern
    try:
        parse_quantity(value)
        ok = True
    except ValueError:
        ok = False
    assert bool(re.match(pattern, value)) == ok


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
    metrics.init_workqueue("my")
    metrics.init_resource("my.mine.jp")
    metrics.init_leader("my-controller")
    metrics.init_build_info("my-controller", "test")
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
    dash = json.loads((MANIFESTS / "components" / "monitoring" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            found = re.search(r"label_values\((\w+)", query["query"])
            if found:
                exprs.append(found.group(1))
    return exprs


def _rule_exprs() -> list[str]:
    rule = one(load(ALERTS), "PrometheusRule")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def _recorded_names() -> set[str]:
    rule = one(load(ALERTS), "PrometheusRule")
    return {r["record"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r}


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_queried_metric_is_exported(source):
    exprs = _dashboard_exprs() if source == "dashboard" else _rule_exprs()
    assert exprs
    exported = exported_metric_names()
    if source == "rules":      # and what Prometheus itself writes: `up`, the recording rules
        exported |= {"up"} | _recorded_names()
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
    rule = one(load(ALERTS), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    for needed in ("MyControllerDown", "MyControllerNotReconciling", "MyControllerReconcileErrors", "MyControllerQueueGrowing",
                   "MyControllerWatchStalled", "MyControllerNoLeader"):
        assert needed in alerts
    for name, r in alerts.items():
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert r["annotations"]["summary"], name
        assert re.fullmatch(r"\d+[smh]", r.get("for", "0m")), name
        assert r["expr"].count("(") == r["expr"].count(")"), name


def test_the_schemas_security_contexts_are_the_controllers():
    """The CRD and my.spec.validate_spec accept the same restricting fields."""
    props = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]

    def shape(schema):
        if schema.get("type") == "object":
            return {k: shape(v) for k, v in schema["properties"].items()}
        if "enum" in schema:
            return tuple(schema["enum"])
        return {"boolean": bool, "integer": int, "string": str, "array": list}[schema["type"]]
    assert shape(props["podSecurityContext"]) == POD_SECURITY_FIELDS
    assert shape(props["securityContext"]) == CONTAINER_SECURITY_FIELDS


# ---------------------------------------------------------------------------
# The secure-metrics component, applied to the base here with a small RFC 6902
# applier (the e2e test renders it with kubectl's kustomize on top of this).

def json_patch(doc: dict, ops: list[dict]) -> dict:
    doc = json.loads(json.dumps(doc))
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].lstrip("/").split("/")]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "test":
            current = node[int(last)] if isinstance(node, list) else node[last]
            assert current == op["value"], (op, current)
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif op["op"] == "add" and isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), op["value"])
        elif op["op"] in ("add", "replace"):
            if isinstance(node, list):
                node[int(last)] = op["value"]
            else:
                assert op["op"] == "add" or last in node, op
                node[last] = op["value"]
        else:
            raise AssertionError(f"op {op['op']} not handled by this test")
    return doc


COMPONENT = "components/secure-metrics"


def _patched(kind: str, doc: dict) -> dict:
    kust = kustomization(COMPONENT)
    (patch,) = [p for p in kust["patches"] if p["target"]["kind"] == kind]
    assert patch["target"]["name"] == doc["metadata"]["name"]
    return json_patch(doc, load(f"{COMPONENT}/{patch['path']}")[0])


def test_secure_metrics_component_serves_https_on_8443_with_a_mounted_certificate():
    assert kustomization("overlays/secure-metrics")["components"] == [f"../../{COMPONENT}"]
    deployment = _patched("Deployment", DEPLOYMENT)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = controller.build_parser().parse_args(container["args"])
    assert args.metrics_secure and args.metrics_bind_address.endswith(":8443")
    assert args.leader_elect and args.leader_election_namespace is None
    (mount,) = container["volumeMounts"]
    assert args.metrics_cert_dir == mount["mountPath"] and mount["readOnly"] is True
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"] and set(volume) == {"name", "secret"}  # restricted PSS
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": 8443, "health": 8081}

    service = _patched("Service", one(load("base/metrics-service.yaml"), "Service"))
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (8443, "https")
    ann = service["metadata"]["annotations"]
    assert (ann["prometheus.io/port"], ann["prometheus.io/scheme"]) == ("8443", "https")

    monitor = one(load(f"{COMPONENT}/servicemonitor.yaml"), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "https" and endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"]["name"] == volume["secret"]["secretName"]
    assert endpoint["tlsConfig"]["serverName"] == \
        f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    # scrapers need the reader role; the controller may review tokens (base RBAC)
    assert one(RBAC, "ClusterRole", "my-controller-metrics-reader")
    assert ("authentication.k8s.io", "tokenreviews") in _granted("my-controller-metrics-auth")


def test_secure_metrics_patch_refuses_a_reordered_base():
    reordered = json.loads(json.dumps(DEPLOYMENT))
    reordered["spec"]["template"]["spec"]["containers"][0]["args"].reverse()
    with pytest.raises(AssertionError):
        _patched("Deployment", reordered)


# ---------------------------------------------------------------------------
# The dashboard is scoped to this operator; the README's metrics table is the code's

def _selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, label matchers) for each vector selector in `expr`."""
    return re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)


def test_dashboard_queries_only_this_operator():
    dash = json.loads((MANIFESTS / "components" / "monitoring" / "dashboard.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    for name in ("job", "namespace"):
        query = variables[name]["query"]["query"]
        assert 'my_controller_build_info{manager="my-controller"' in query, query
        # "All" = the values found, never ".*" (which sums every job Prometheus scrapes)
        assert variables[name].get("allValue") in (None, ""), name
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for expr in exprs:
        selectors = _selectors(expr)
        assert selectors, expr
        for metric, matchers in selectors:
            assert 'job=~"$job"' in matchers and 'namespace=~"$namespace"' in matchers, expr
            if metric.startswith("controller_runtime_"):
                assert 'controller="my"' in matchers, expr
            if metric.startswith("workqueue_"):
                assert 'controller="my"' in matchers and 'name="my"' in matchers, expr
            if metric.startswith("leader_election_"):
                assert 'name="my-controller"' in matchers, expr


def _readme_metrics_table() -> dict[str, set[str]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Metrics"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| `([a-z0-9_:]+)` \| ([^|]*) \|", section, re.M)
    return {name: {x.strip() for x in labels.split(",") if x.strip() and x.strip() != "-"}
            for name, labels in rows}


def test_readme_metrics_table_is_what_the_code_exports():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_controller("my", 4)
    metrics.init_workqueue("my")
    metrics.init_resource("my.mine.jp")
    metrics.init_leader("my-controller")
    metrics.init_build_info("my-controller", "0.1.0")
    metrics.rest_client_requests_total.labels("200", "GET", "h")
    metrics.rest_client_request_duration_seconds.labels("GET", "h")
    exported = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "") + \
            ("_info" if family.type == "info" else "")
        exported[name] = set().union(*(set(s.labels) - {"le"} for s in family.samples))
    assert _readme_metrics_table() == exported


def test_sharding_overlay_runs_three_members_with_list_watch_and_delete_on_leases():
    """overlays/sharding: --shards=auto instead of --leader-elect, 3 replicas, each
    Pod naming its member Lease, and `list`, `watch` (the ring) and `delete`
    (expired members' Leases) on leases in the Role."""
    component = "components/sharding"
    assert kustomization("overlays/sharding")["resources"] == ["../../base"]
    assert kustomization("overlays/sharding")["components"] == [f"../../{component}"]
    patches = {p["target"]["kind"]: p for p in kustomization(component)["patches"]}
    deployment = json_patch(DEPLOYMENT, load(f"{component}/{patches['Deployment']['path']}")[0])
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = controller.build_parser().parse_args(container["args"])
    assert args.shards == "auto" and not args.leader_elect
    assert args.leader_election_namespace is None
    assert not [a for a in container["args"] if a.startswith("--leader-election")]
    (env,) = container["env"]
    assert env["name"] == "POD_NAME"
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    role = one(RBAC, "Role", "my-controller-leader-election")
    assert patches["Role"]["target"]["name"] == role["metadata"]["name"]
    patched = json_patch(role, load(f"{component}/{patches['Role']['path']}")[0])
    (rule,) = patched["rules"]
    assert rule["resources"] == ["leases"]
    assert set(rule["verbs"]) == {"get", "create", "update", "list", "watch", "delete"}
    # The default install is untouched: leader election, one replica.
    assert "overlays/sharding/" in (MANIFESTS / "kustomization.yaml").read_text()
