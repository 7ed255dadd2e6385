"""The operator's status writes pass the CRD's status schema (manifests/base/crd.yaml).

The apiserver refuses a whole status patch when one field breaks the schema, so
a reason that misses metav1.Condition's pattern or a message over its maxLength
would leave a My's status stale with nothing but a 422 in the log. Each way
my.status.desired_status builds the Ready condition is checked against the
schema as the CRD declares it (a small validator for the keywords used there).
"""

from __future__ import annotations

import datetime as dt
import pathlib
import re

import pytest
import yaml

from k8s_http.core.objects import set_condition
from my.status import APPLY_FAILED, CONFLICT, INVALID_SPEC, desired_status

CRD = yaml.safe_load((pathlib.Path(__file__).resolve().parents[2] / "manifests" / "base" /
                      "crd.yaml").read_text())
STATUS = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
CONDITION = STATUS["properties"]["conditions"]["items"]


def violations(value, schema: dict, where: str = "") -> list[str]:
    """What in `value` breaks `schema` (the OpenAPI keywords the status schema uses)."""
    found = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool}
    if kind and not (isinstance(value, types[kind]) and not (kind == "integer" and
                                                             isinstance(value, bool))):
        return [f"{where}: {value!r} is not {kind}"]
    if kind == "object":
        for name in schema.get("required", []):
            if name not in value:
                found.append(f"{where}.{name}: required")
        for name, sub in value.items():
            if name in schema.get("properties", {}):
                found += violations(sub, schema["properties"][name], f"{where}.{name}")
    elif kind == "array":
        for i, item in enumerate(value):
            found += violations(item, schema.get("items", {}), f"{where}[{i}]")
    elif kind == "string":
        if "enum" in schema and value not in schema["enum"]:
            found.append(f"{where}: {value!r} not in {schema['enum']}")
        if len(value) > schema.get("maxLength", len(value)):
            found.append(f"{where}: longer than {schema['maxLength']}")
        if len(value) < schema.get("minLength", 0):
            found.append(f"{where}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            found.append(f"{where}: {value!r} does not match {schema['pattern']}")
        if schema.get("format") == "date-time":
            try:
                dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                found.append(f"{where}: {value!r} is not a date-time")
    elif kind == "integer" and value < schema.get("minimum", value):
        found.append(f"{where}: below {schema['minimum']}")
    return found


def test_the_validator_refuses_what_the_apiserver_would():
    good = {"type": "Ready", "status": "True", "reason": "Available", "message": "",
            "lastTransitionTime": "2024-01-01T00:00:00Z", "observedGeneration": 1}
    assert violations(good, CONDITION) == []
    for change in ({"reason": "Not Ready"}, {"reason": ""}, {"status": "Yes"},
                   {"type": "-Ready"}, {"lastTransitionTime": "yesterday"},
                   {"observedGeneration": -1}, {"message": "x" * 32769}):
        assert violations({**good, **change}, CONDITION), change
    for missing in ("type", "status", "reason", "message", "lastTransitionTime"):
        assert violations({k: v for k, v in good.items() if k != missing}, CONDITION), missing


def _my(generation=3, status=None):
    my = {"apiVersion": "mine.jp/v1", "kind": "My",
          "metadata": {"name": "web", "namespace": "default", "uid": "u", "generation": generation},
          "spec": {"image": "nginx:1.27", "replicas": 2}}
    if status is not None:
        my["status"] = status
    return my


def _deployment(**status):
    return {"metadata": {"generation": 1}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, **status}}


FAILING = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
           "message": "pods \"web-1\" is forbidden: violates PodSecurity \"restricted\""}
STALLED = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
           "message": "ReplicaSet \"web-1\" has timed out progressing."}


@pytest.mark.parametrize("deployment, condition, pod_cause", [
    (None, None, None),                                                       # Progressing
    (_deployment(replicas=2, readyReplicas=2, updatedReplicas=2), None, None),   # Available
    (_deployment(replicas=2, readyReplicas=1, updatedReplicas=2), None,
     "Pod web-1: container app waiting: ImagePullBackOff"),
    (_deployment(replicas=0, conditions=[FAILING]), None, None),              # ReplicaFailure
    (_deployment(replicas=2, conditions=[STALLED]), None, None),              # ProgressDeadline..
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 1}}, None, None),
    (None, (INVALID_SPEC, "spec.port: must be 1..65535"), None),
    (None, (CONFLICT, ""), None),                                  # empty message
    (None, (APPLY_FAILED, "x" * 40000), None),                     # too long
])
def test_every_ready_condition_the_operator_writes_fits_the_schema(deployment, condition,
                                                                  pod_cause):
    status = desired_status(_my(), deployment, condition=condition,
                                       pod_cause=pod_cause)
    assert violations(status, STATUS) == []
    (ready,) = status["conditions"]
    assert set(CONDITION["required"]) <= set(ready)
    # and again over a status it wrote before (lastTransitionTime kept or moved)
    again = desired_status(_my(status=status), None, condition=(
        CONFLICT, "taken"))
    assert violations(again, STATUS) == []


def test_a_message_over_the_schemas_bound_is_cut_to_it():
    bound = CONDITION["properties"]["message"]["maxLength"]
    (cond,) = set_condition([], {"type": "Ready", "status": "False", "reason": "ApplyFailed",
                                 "message": "y" * (bound + 100)}, now="2024-01-01T00:00:00Z")
    assert len(cond["message"]) == bound and cond["message"].startswith("y" * 100)
    (kept,) = set_condition([], {"type": "Ready", "status": "False", "reason": "ApplyFailed",
                                 "message": "y" * bound}, now="2024-01-01T00:00:00Z")
    assert kept["message"] == "y" * bound
