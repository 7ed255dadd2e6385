"""my-controller: turns each `My` (mine.jp/v1) into a Deployment and a Service.

The contract is docs/SPEC.md §1-3. In short, for a `My` named N in namespace NS the
operator keeps, by server-side apply (field manager ``my-controller``, force):

  * Deployment N: our three labels, a selector on two of them, `replicas`, one
    container ``app`` with the image, the container port, env and resources;
  * Service N: `type`, the same selector, port -> targetPort, TCP;

both controlled by the `My` (so the garbage collector deletes them with it), and
reports `observedGeneration`, replica counts, the selector and a ``Ready``
condition on the `My`'s status subresource.

Layout of this file, top to bottom:

  1. constants and small pure helpers (labels);
  2. ``validate_spec`` / ``validate_my``: what the controller can use;
  3. ``render_deployment`` / ``render_service``: the apply configurations;
  4. ``foreign_entries_patch``: other managers' entries in the fields the My decides
     (whether an apply would change a child is k8s_http's ``needs_apply``);
  5. ``desired_status`` / ``status_changed``;
  6. ``MyReconciler``: the level-based reconcile, reading caches, writing little
     (its generic policies are k8s_http's: ``StatusHold``, ``SettledVersions``,
     ``GenerationMemo``, ``PodCheckSchedule``, ``write_through``);
  7. ``main``: flags, configuration errors as one line, the Manager
     (``run_manager``: a port that cannot be bound is a flag error).

Everything above ``MyReconciler`` is pure and unit-tested on its own. This
module imports only the standard library and the ``k8s_http`` package root.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import time
from fractions import Fraction
from typing import Callable, Mapping, NamedTuple

from k8s_http import (
    EventRecorder,
    GenerationMemo,
    DEPLOYMENTS,
    SERVICES,
    ApiError,
    ConfigError,
    ConflictError,
    InvalidError,
    Manager,
    NotFoundError,
    ObjectKey,
    PODS,
    PodCheckSchedule,
    Projection,
    Resource,
    Result,
    SettledVersions,
    StatusHold,
    Store,
    TerminalError,
    config_hash,
    queued_seconds,
    controller_of,
    get_condition,
    is_controlled_by,
    is_dns1035_label,
    is_dns1123_subdomain,
    is_env_var_name,
    is_namespace_terminating,
    is_resource_name,
    load_config,
    meta_of,
    needs_apply,
    owner_reference,
    parse_quantity,
    pod_problem,
    port_key,
    resource_version_of,
    rfc3339_now,
    set_condition,
    setup_logging,
    with_config_hash,
    write_through,
)
from k8s_http import (add_manager_flags, flag_error, manager_options, new_parser, positive_int,
                      run_manager, with_flag_names)
from k8s_http import __version__

log = logging.getLogger("my_controller")

# --------------------------------------------------------------------------
# 1. Constants and small helpers

MY = Resource("mine.jp", "v1", "my", namespaced=True, kind="My")

NAME = "my-controller"              # field manager, event source, manager name
FIELD_MANAGER = NAME

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
APP_NAME = "my"
# The owned watches use this selector, so the caches hold only our children.
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={NAME}"

# A hash of everything else in the apply configuration, carried on the child.
# Why: `needs_apply` is a subset test (desired fields present in live), which
# cannot see a field we *stopped* setting (an env var removed from the spec is
# still on the live Deployment, so "desired ⊆ live" holds). Server-side apply
# removes such a field only when we apply again; the hash changes whenever the
# configuration does, so the subset test fails and we do apply.
CONFIG_HASH_ANNOTATION = "mine.jp/config-hash"

CONTAINER_NAME = "app"
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
DEFAULT_REPLICAS = 1
DEFAULT_PORT = 8080
DEFAULT_SERVICE_TYPE = "ClusterIP"
MAX_REPLICAS = 100
MAX_IMAGE_CHARS = 512
MAX_ENV = 64
# The sources an env var may take its value from (spec.env[].valueFrom).
ENV_KEY_REFS = ("secretKeyRef", "configMapKeyRef")
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1

# The security contexts a My may ask for: only fields that restrict what the
# pod may do, never ones that grant (privileged, capabilities.add, host
# namespaces, procMount, Unconfined seccomp). Whoever may create a My must not
# get more than whoever may create a Deployment under the namespace's Pod
# Security. The CRD schema says the same (manifests/crd.yaml); a type is bool,
# int, str, list (of capability names), a tuple (an enum) or a nested dict.
_PROFILE = {"type": ("RuntimeDefault", "Localhost"), "localhostProfile": str}
POD_SECURITY_FIELDS: dict = {
    "runAsNonRoot": bool, "runAsUser": int, "runAsGroup": int, "fsGroup": int,
    "seccompProfile": _PROFILE, "appArmorProfile": _PROFILE,
}
CONTAINER_SECURITY_FIELDS: dict = {
    "runAsNonRoot": bool, "runAsUser": int, "runAsGroup": int,
    "seccompProfile": _PROFILE, "appArmorProfile": _PROFILE,
    "allowPrivilegeEscalation": bool, "readOnlyRootFilesystem": bool,
    "capabilities": {"drop": list},
}

CONDITION_READY = "Ready"
# Ready condition reasons (SPEC §2).
AVAILABLE = "Available"
PROGRESSING = "Progressing"
INVALID_SPEC = "InvalidSpec"
CONFLICT = "Conflict"
APPLY_FAILED = "ApplyFailed"
# The workload's own failures, from the Deployment's conditions: its ReplicaSet
# cannot create pods (quota, Pod Security admission, ...), or the rollout made
# no progress within spec.progressDeadlineSeconds.
REPLICA_FAILURE = "ReplicaFailure"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
# Reasons reported with one Warning event when they appear (not at every write).
WARNING_REASONS = (INVALID_SPEC, CONFLICT, REPLICA_FAILURE, PROGRESS_DEADLINE_EXCEEDED)

# A conflicting child that is not ours is not in our label-selected caches, so
# nothing we watch changes when its owner deletes it: the Manager watches that
# one name until it is deleted (watch_for_deletion). Only when it cannot (too
# many at once) do we look again this often: a refused create and a GET, never
# a write (the Conflict status is already there).
CONFLICT_RECHECK_SECONDS = 60.0

# How long a status that the Deployment controller is about to change may be
# held back, so that one write reports both (k8s_http.StatusHold):
# this long when our work queue is quick, as long as the key itself just
# waited in the queue when it is not (under a burst the user already waits
# that long, and the Deployment controller is behind by about as much), and
# never longer than the cap. So a user sees observedGeneration and a Ready
# condition for a generation the operator has acted on within about twice the
# queue's own delay, and within STATUS_COALESCE_SECONDS when it is idle.
STATUS_COALESCE_SECONDS = 0.5
STATUS_HOLD_CAP_SECONDS = 10.0

# A My that is not ready while its Deployment has caught up with its spec gets
# the cause its Pods show in the Ready message (k8s_http.pod_problem). Its Pods
# are listed (label-selected, one bounded read) only once it has been unready
# this long, so the few seconds Pods take to start cost no read, and then
# again at doubling intervals up to the maximum while it stays unready (a
# crash loop's restart count moves). A ready fleet costs no read at all.
POD_CHECK_FIRST_SECONDS = 5.0
POD_CHECK_MAX_SECONDS = 60.0
# One page: a My has at most MAX_REPLICAS Pods and a rollout's surge.
POD_LIST_LIMIT = 2 * MAX_REPLICAS

# How many My generations' validation and rendered children are remembered (a
# bounded memory, whatever the number of My objects; see MyReconciler._desired).
RENDER_MEMO_SIZE = 1024
# Weight of the newest sample in the running estimate of how long the
# Deployment controller takes to answer (an exponentially weighted mean).
ANSWER_TIME_WEIGHT = 0.2

# What the caches keep (k8s_http.Projection): exactly the fields this file reads
# from cached objects, everything else is dropped on the way in (list, watch,
# our own write answers). Declared here, beside the constants the readers use;
# a read of a field not listed fails tests/unit/test_controller.py, whose stores
# raise on dropped keys (Projection.guarded). Readers are named per group.
_CHILD_META = (
    "apiVersion", "kind",                               # needs_apply (desired has them)
    "metadata.name", "metadata.namespace",              # keys, needs_apply
    "metadata.resourceVersion",                         # Store.end_write, "Updated" events
    "metadata.generation",                              # _readiness, _is_rollout_pending
    ("metadata", "labels", LABEL_NAME), ("metadata", "labels", LABEL_INSTANCE),
    ("metadata", "labels", LABEL_MANAGED_BY),           # needs_apply: our labels only
    ("metadata", "annotations", CONFIG_HASH_ANNOTATION),  # needs_apply, _ensure_child
    "metadata.ownerReferences",   # is_controlled_by, needs_apply, the informer's mapper
)
# Unique per object: sharing them would only grow the intern table.
_CHILD_DISTINCT = ("metadata.resourceVersion",
                   ("metadata", "annotations", CONFIG_HASH_ANNOTATION))
DEPLOYMENT_PROJECTION = Projection(_CHILD_META + (
    # needs_apply and foreign_entries_patch: what render_deployment sends, and
    # the names of the entries beside ours.
    "spec.replicas", "spec.selector", "spec.progressDeadlineSeconds",
    ("spec", "template", "metadata", "labels", LABEL_NAME),
    ("spec", "template", "metadata", "labels", LABEL_INSTANCE),
    ("spec", "template", "metadata", "labels", LABEL_MANAGED_BY),
    "spec.template.spec.securityContext",
    "spec.template.spec.containers[].name", "spec.template.spec.containers[].image",
    "spec.template.spec.containers[].ports", "spec.template.spec.containers[].resources",
    "spec.template.spec.containers[].securityContext",
    "spec.template.spec.containers[].env[].name", "spec.template.spec.containers[].env[].value",
    "spec.template.spec.containers[].env[].valueFrom",
    # desired_status, _readiness, _workload_failure, _is_rollout_pending
    "status.observedGeneration", "status.replicas", "status.readyReplicas",
    "status.updatedReplicas", "status.conditions[].type", "status.conditions[].status",
    "status.conditions[].reason", "status.conditions[].message",
), distinct=_CHILD_DISTINCT,
   # Often unique ('ReplicaSet "web-5d8f" has successfully progressed.'),
   # sometimes common to all ("Deployment has minimum availability.").
   repeated=("status.conditions[].message",))
SERVICE_PROJECTION = Projection(_CHILD_META + (
    "spec.type", "spec.selector",                       # needs_apply
    "spec.ports[].port", "spec.ports[].targetPort", "spec.ports[].protocol",  # + foreign ports
), distinct=_CHILD_DISTINCT)
MY_PROJECTION = Projection((
    "apiVersion", "kind",                               # EventRecorder's involvedObject
    "metadata.name", "metadata.namespace", "metadata.uid", "metadata.generation",
    "metadata.resourceVersion", "metadata.deletionTimestamp",
    "spec",            # validate_my checks every key, render_* copy it
    "status",          # desired_status keeps the fields it does not own
), distinct=("metadata.resourceVersion",))
PROJECTIONS = {MY: MY_PROJECTION, DEPLOYMENTS: DEPLOYMENT_PROJECTION,
               SERVICES: SERVICE_PROJECTION}

def labels_for(name: str) -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_MANAGED_BY: NAME}


def selector_for(name: str) -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name}


def selector_string(name: str) -> str:
    """The selector as `status.selector` (and `kubectl get -l`) spell it: sorted keys."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_for(name).items()))


def effective_spec(spec: dict | None) -> dict:
    """The spec with the CRD's defaults filled in (the apiserver normally did it already)."""
    spec = dict(spec or {})
    spec.setdefault("replicas", DEFAULT_REPLICAS)
    spec.setdefault("port", DEFAULT_PORT)
    spec.setdefault("serviceType", DEFAULT_SERVICE_TYPE)
    return spec


# --------------------------------------------------------------------------
# 2. Validation: what the controller can use


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_spec(spec: object) -> list[str]:
    """Problems that make the spec unusable; [] when it is fine.

    Re-checks what the CRD schema says (the CRD may be old, edited, or missing
    its defaults), plus what the apiserver would reject on the children and the
    schema cannot say: duplicate env names (server-side apply refuses duplicate
    keys in a keyed list) and requests above limits. Catching these here turns
    an endless apply-fail-retry loop into one InvalidSpec status.
    """
    if not isinstance(spec, dict):
        return ["spec: must be an object"]
    errors: list[str] = []
    spec = effective_spec(spec)

    image = spec.get("image")
    if not isinstance(image, str) or not image:
        errors.append("spec.image: required, a non-empty string such as postgres:16")
    elif len(image) > MAX_IMAGE_CHARS:
        errors.append(f"spec.image: at most {MAX_IMAGE_CHARS} characters (got {len(image)})")
    elif any(c.isspace() for c in image):
        errors.append("spec.image: must not contain whitespace")

    replicas = spec["replicas"]
    if not _is_int(replicas) or not 0 <= replicas <= MAX_REPLICAS:
        errors.append(f"spec.replicas: an integer from 0 to {MAX_REPLICAS} (got {replicas!r})")

    port = spec["port"]
    if not _is_int(port) or not 1 <= port <= 65535:
        errors.append(f"spec.port: an integer from 1 to 65535 (got {port!r})")

    if spec["serviceType"] not in SERVICE_TYPES:
        errors.append(f"spec.serviceType: one of {', '.join(SERVICE_TYPES)} "
                      f"(got {spec['serviceType']!r})")

    deadline = spec.get("progressDeadlineSeconds")
    if deadline is not None and (not _is_int(deadline) or not 1 <= deadline <= MAX_INT32):
        errors.append(f"spec.progressDeadlineSeconds: an integer from 1 to {MAX_INT32} "
                      f"(got {deadline!r})")

    errors.extend(_validate_env(spec.get("env")))
    errors.extend(_validate_resources(spec.get("resources")))
    errors.extend(_validate_security_context(spec.get("podSecurityContext"),
                                             "spec.podSecurityContext", POD_SECURITY_FIELDS))
    errors.extend(_validate_security_context(spec.get("securityContext"),
                                             "spec.securityContext", CONTAINER_SECURITY_FIELDS))
    return errors


def _validate_security_context(value: object, where: str, fields: dict) -> list[str]:
    """Only the restricting fields in `fields` (see POD_SECURITY_FIELDS), with their types."""
    if value is None:
        return []
    if not isinstance(value, dict):
        return [f"{where}: must be an object"]
    errors = []
    for name, item in value.items():
        kind = fields.get(name)
        here = f"{where}.{name}"
        if kind is None:
            errors.append(f"{here}: not supported (allowed: {', '.join(sorted(fields))}; "
                          "fields that grant privileges are refused)")
        elif kind is bool and not isinstance(item, bool):
            errors.append(f"{here}: must be true or false")
        elif kind is int and (not _is_int(item) or not 0 <= item <= MAX_INT64):
            errors.append(f"{here}: a non-negative integer (got {item!r})")
        elif isinstance(kind, dict):
            errors.extend(_validate_security_context(item, here, kind))
            if kind is _PROFILE and isinstance(item, dict):
                errors.extend(_validate_profile(item, here))
        elif isinstance(kind, tuple):                     # an enum
            if item not in kind:
                errors.append(f"{here}: one of {', '.join(kind)} (got {item!r})")
        elif kind is str and (not isinstance(item, str) or not item):
            errors.append(f"{here}: a non-empty string")
        elif kind is list and (not isinstance(item, list)
                               or not all(isinstance(c, str) and c for c in item)):
            errors.append(f"{here}: a list of capability names")
    return errors


def _validate_profile(profile: dict, where: str) -> list[str]:
    """What the apiserver checks on the pod: a Localhost profile names its file, others do not."""
    if "type" not in profile:
        return [f"{where}.type: required (RuntimeDefault or Localhost)"]
    if (profile.get("type") == "Localhost") != ("localhostProfile" in profile):
        return [f"{where}.localhostProfile: required with type Localhost, and only with it"]
    return []


def _validate_env(env: object) -> list[str]:
    if env is None:
        return []
    if not isinstance(env, list):
        return ["spec.env: must be a list of {name, value} or {name, valueFrom}"]
    errors = []
    if len(env) > MAX_ENV:
        errors.append(f"spec.env: at most {MAX_ENV} items (got {len(env)})")
    seen: set[str] = set()
    for i, item in enumerate(env[:MAX_ENV + 1]):
        where = f"spec.env[{i}]"
        if not isinstance(item, dict):
            errors.append(f"{where}: must be an object with name and value (or valueFrom)")
            continue
        unknown = sorted(set(item) - {"name", "value", "valueFrom"})
        if unknown:
            errors.append(f"{where}: unsupported field(s) {', '.join(unknown)}")
        name = item.get("name")
        if not is_env_var_name(name):
            errors.append(f"{where}.name: a variable name of letters, digits, '_', '-' or '.', "
                          f"not starting with a digit (got {name!r})")
        elif name in seen:
            errors.append(f"{where}.name: duplicate name {name!r}")
        else:
            seen.add(name)
        value = item.get("value")
        if value is not None and not isinstance(value, str):
            errors.append(f"{where}.value: must be a string (quote numbers and booleans)")
        if "valueFrom" in item:
            if value is not None:
                errors.append(f"{where}: give either value or valueFrom, not both")
            errors.extend(_validate_value_from(item["valueFrom"], f"{where}.valueFrom"))
    return errors


def _validate_value_from(source: object, where: str) -> list[str]:
    """valueFrom: exactly one key reference, to a Secret or ConfigMap in the My's
    own namespace (a Pod can reach no other), so a My grants nothing a Pod lacks."""
    if not isinstance(source, dict) or len(source) != 1 or \
            next(iter(source)) not in ENV_KEY_REFS:
        return [f"{where}: must hold exactly one of {', '.join(ENV_KEY_REFS)}"]
    kind, ref = next(iter(source.items()))
    where = f"{where}.{kind}"
    if not isinstance(ref, dict):
        return [f"{where}: must be an object with name and key"]
    errors = []
    unknown = sorted(set(ref) - {"name", "key", "optional"})
    if unknown:
        errors.append(f"{where}: unsupported field(s) {', '.join(unknown)}")
    if not is_dns1123_subdomain(ref.get("name")):
        errors.append(f"{where}.name: a lowercase DNS subdomain name (got {ref.get('name')!r})")
    key = ref.get("key")
    if not (isinstance(key, str) and 0 < len(key) <= 253 and
            all(c.isascii() and (c.isalnum() or c in "-._") for c in key)):
        errors.append(f"{where}.key: letters, digits, '-', '_' or '.' (got {key!r})")
    if "optional" in ref and not isinstance(ref["optional"], bool):
        errors.append(f"{where}.optional: must be true or false")
    return errors


def _validate_resources(resources: object) -> list[str]:
    if resources is None:
        return []
    if not isinstance(resources, dict):
        return ["spec.resources: must be an object with requests and/or limits"]
    errors = []
    unknown = sorted(set(resources) - {"requests", "limits"})
    if unknown:
        errors.append(f"spec.resources: unsupported field(s) {', '.join(unknown)}")
    parsed: dict[str, dict[str, Fraction]] = {}
    for section in ("requests", "limits"):
        values = resources.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            errors.append(f"spec.resources.{section}: must be a map of resource name to quantity")
            continue
        parsed[section] = {}
        for name, value in values.items():
            where = f"spec.resources.{section}.{name}"
            if not is_resource_name(name):
                errors.append(f"{where}: invalid resource name")
                continue
            try:
                parsed[section][name] = parse_quantity(value)
            except ValueError as err:
                errors.append(f"{where}: {err}")
    # The apiserver rejects a pod template whose request exceeds its limit.
    for name, request in parsed.get("requests", {}).items():
        limit = parsed.get("limits", {}).get(name)
        if limit is not None and request > limit:
            errors.append(f"spec.resources.requests.{name}: must not exceed "
                          f"spec.resources.limits.{name}")
    return errors


def validate_my(my: dict) -> list[str]:
    """validate_spec plus the rules the children put on the My's own name."""
    name = meta_of(my).get("name") or ""
    errors = []
    # The Service is named after the My: an RFC 1035 label (at most 63
    # characters, which the instance label's value also requires).
    if not is_dns1035_label(name):
        errors.append(f"metadata.name: {name!r} cannot name a Service: use at most 63 "
                      "lowercase letters, digits and '-', starting with a letter")
    return errors + validate_spec(my.get("spec"))


# --------------------------------------------------------------------------
# 3. Rendering: the apply configurations


def _child_metadata(my: dict) -> dict:
    meta = my["metadata"]
    return {"name": meta["name"], "namespace": meta.get("namespace") or "default",
            "labels": labels_for(meta["name"]),
            "ownerReferences": [owner_reference(my, resource=MY)]}


def render_deployment(my: dict) -> dict:
    """The Deployment apply configuration for `my` (a validated My).

    Only the fields we own: server-side apply leaves everything else (server
    defaults, other managers' fields) alone, and removes what we stop sending.
    """
    name = my["metadata"]["name"]
    spec = effective_spec(my.get("spec"))
    pod: dict = {"containers": [_render_container(spec)]}
    if spec.get("podSecurityContext"):
        pod["securityContext"] = copy.deepcopy(spec["podSecurityContext"])
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _child_metadata(my),
        "spec": {
            "replicas": spec["replicas"],
            "selector": {"matchLabels": selector_for(name)},
            "template": {
                "metadata": {"labels": labels_for(name)},
                "spec": pod,
            },
        },
    }
    if spec.get("progressDeadlineSeconds") is not None:
        deployment["spec"]["progressDeadlineSeconds"] = spec["progressDeadlineSeconds"]
    return with_config_hash(deployment, CONFIG_HASH_ANNOTATION)


def _render_container(spec: dict) -> dict:
    """The ``app`` container of the Deployment's pod template, from the effective spec."""
    container: dict = {
        "name": CONTAINER_NAME,
        "image": spec["image"],
        # protocol is sent explicitly: it is part of the list key (containerPort, protocol).
        "ports": [{"containerPort": spec["port"], "protocol": "TCP"}],
    }
    env = []
    for item in spec.get("env") or []:
        entry = {"name": item["name"]}
        # The apiserver drops an empty value (omitempty); sending "" would make the
        # live object differ from the desired one forever.
        if item.get("value"):
            entry["value"] = item["value"]
        elif item.get("valueFrom"):
            entry["valueFrom"] = copy.deepcopy(item["valueFrom"])
        env.append(entry)
    if env:
        container["env"] = env
    resources = {}
    for section in ("requests", "limits"):
        values = (spec.get("resources") or {}).get(section) or {}
        if values:
            resources[section] = {k: str(v) for k, v in values.items()}
    if resources:
        container["resources"] = resources
    if spec.get("securityContext"):
        container["securityContext"] = copy.deepcopy(spec["securityContext"])
    return container


def render_service(my: dict) -> dict:
    """The Service apply configuration for `my`: type, selector, port -> targetPort, TCP."""
    name = my["metadata"]["name"]
    spec = effective_spec(my.get("spec"))
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _child_metadata(my),
        "spec": {
            "type": spec["serviceType"],
            "selector": selector_for(name),
            "ports": [{"port": spec["port"], "targetPort": spec["port"], "protocol": "TCP"}],
        },
    }
    return with_config_hash(service, CONFIG_HASH_ANNOTATION)


# --------------------------------------------------------------------------
# 4. Fields the spec decides hold nothing of anybody else's

def foreign_entries_patch(desired: dict, live: dict | None) -> dict | None:
    """A strategic merge patch that removes what other field managers added
    inside the fields the My's spec decides; None when there is nothing.

    Server-side apply cannot do this: it merges our list entries with other
    managers' (a foreign Service port beside ours, an env var on our
    container) and only the manager that set a field can drop it by applying.
    The merge may even be invalid: two unnamed Service ports are a 422, so a
    forced apply fails for ever. The decided fields are: the Service's ports;
    the ``app`` container's ports, env, resources and securityContext. Entries
    are deleted by their strategic-merge key, map keys by null. Everything
    else (annotations, extra labels, injected containers, server defaults) is
    left alone. Service ports: ours are stated in the same patch, so the
    Service is never without a port.
    """
    if live is None:
        return None
    if desired.get("kind") == "Service":
        return _foreign_service_ports(desired, live)
    return _foreign_in_app_container(desired, live)


def _foreign_service_ports(desired: dict, live: dict) -> dict | None:
    ours = desired["spec"]["ports"]
    wanted = {port_key(p) for p in ours}
    foreign = [p for p in (live.get("spec") or {}).get("ports") or []
               if isinstance(p, dict) and port_key(p) not in wanted]
    if not foreign:
        return None
    # Merge key of Service ports in a strategic merge patch: `port` (so a foreign
    # entry on one of our port numbers cannot be deleted without ours).
    our_ports = {p["port"] for p in ours}
    deletes = [{"port": p.get("port"), "$patch": "delete"} for p in foreign
               if p.get("port") not in our_ports]
    return {"spec": {"ports": deletes + [dict(p) for p in ours]}}


def _foreign_in_app_container(desired: dict, live: dict) -> dict | None:
    want = desired["spec"]["template"]["spec"]["containers"][0]
    pod = ((live.get("spec") or {}).get("template") or {}).get("spec") or {}
    have = next((c for c in pod.get("containers") or []
                 if isinstance(c, dict) and c.get("name") == want["name"]), None)
    if have is None:
        return None          # the apply adds our container; nothing foreign to remove
    patch: dict = {}
    ports = {port_key(p) for p in want.get("ports") or []}
    extra_ports = {p.get("containerPort") for p in have.get("ports") or []
                   if isinstance(p, dict) and port_key(p) not in ports}
    if extra_ports:
        patch["ports"] = [{"containerPort": port, "$patch": "delete"}
                          for port in sorted(extra_ports, key=str)]
    env = {e["name"] for e in want.get("env") or []}
    extra_env = [e.get("name") for e in have.get("env") or []
                 if isinstance(e, dict) and e.get("name") not in env]
    if extra_env:
        patch["env"] = [{"name": name, "$patch": "delete"} for name in extra_env]
    resources = _foreign_resources(want.get("resources") or {}, have.get("resources") or {})
    if resources:
        patch["resources"] = resources
    security = _foreign_keys(want.get("securityContext"), have.get("securityContext"))
    if security is not None:
        patch["securityContext"] = security
    if not patch:
        return None
    return {"spec": {"template": {"spec": {"containers": [{"name": want["name"], **patch}]}}}}


def _foreign_resources(want: dict, have: dict) -> dict:
    patch = {}
    for section in ("requests", "limits"):
        extra = [name for name in (have.get(section) or {})
                 if name not in (want.get(section) or {})
                 # the apiserver defaults a missing request to its limit
                 and not (section == "requests" and name in (want.get("limits") or {}))]
        if extra:
            patch[section] = {name: None for name in extra}
    return patch


def _foreign_keys(want: object, have: object) -> object:
    """The keys of map `have` that `want` lacks, as nulls (nested maps recursed); None if none."""
    if not isinstance(have, dict) or not have:
        return None
    if not isinstance(want, dict):
        return None if want is not None else {key: None for key in have}
    patch = {}
    for key, value in have.items():
        if key not in want:
            patch[key] = None
        elif isinstance(want[key], dict):
            nested = _foreign_keys(want[key], value)
            if nested is not None:
                patch[key] = nested
    return patch or None


# --------------------------------------------------------------------------
# 5. Status


def _readiness(spec: dict, deployment: dict | None, pod_cause: str | None = None
               ) -> tuple[str, str, str]:
    """(status, reason, message) of the Ready condition from the Deployment, and
    `pod_cause` (what the Pods show, see pod_problem) appended when not ready.

    SPEC: Available when ready >= desired. We also require the Deployment
    controller to have seen the current Deployment spec and to have rolled it
    out to every replica; otherwise the old ReplicaSet's ready pods would make
    an image change look Available before a single new pod runs.
    """
    desired = spec.get("replicas", DEFAULT_REPLICAS)
    if deployment is None:
        return "False", PROGRESSING, "waiting for the Deployment to be created"
    status = deployment.get("status") or {}
    ready = status.get("readyReplicas") or 0
    updated = status.get("updatedReplicas") or 0
    generation = meta_of(deployment).get("generation") or 0
    if (status.get("observedGeneration") or 0) < generation:
        return "False", PROGRESSING, f"{ready}/{desired} replicas ready; Deployment update pending"
    if ready >= desired and updated >= desired:
        return "True", AVAILABLE, f"{ready}/{desired} replicas ready"
    # Not available: say why when the Deployment controller knows. Its
    # ReplicaFailure condition carries the ReplicaSet's refusal (e.g. the Pod
    # Security admission message); Progressing=False/ProgressDeadlineExceeded a
    # stalled rollout. Both go away by themselves when the cause does.
    failure = _workload_failure(status)
    if failure is not None:
        reason, condition = failure
        detail = condition.get("message") or condition.get("reason") or "no message"
        if pod_cause:
            detail = f"{detail}; {pod_cause}"
        return "False", reason, f"{ready}/{desired} replicas ready: {detail}"
    if pod_cause:
        return "False", PROGRESSING, f"{ready}/{desired} replicas ready: {pod_cause}"
    return "False", PROGRESSING, f"{ready}/{desired} replicas ready"


def _pods_worth_reading(spec: dict, deployment: dict | None) -> bool:
    """Whether this My's Pods may say why it is not ready: the Deployment controller
    has caught up with the current spec and made Pods, and not all are ready."""
    if deployment is None:
        return False
    status = deployment.get("status") or {}
    if (status.get("observedGeneration") or 0) < (meta_of(deployment).get("generation") or 0):
        return False
    desired = spec.get("replicas", DEFAULT_REPLICAS)
    return (status.get("replicas") or 0) > 0 and (status.get("readyReplicas") or 0) < desired


def _workload_failure(status: dict) -> tuple[str, dict] | None:
    """(reason, the Deployment's condition) when its ReplicaSet cannot create pods
    (ReplicaFailure=True) or its rollout stalled (Progressing=False with
    ProgressDeadlineExceeded); None otherwise."""
    conditions = {c.get("type"): c for c in status.get("conditions") or []
                  if isinstance(c, dict)}
    failure = conditions.get("ReplicaFailure") or {}
    if failure.get("status") == "True":
        return REPLICA_FAILURE, failure
    progressing = conditions.get("Progressing") or {}
    if progressing.get("status") == "False" and \
            progressing.get("reason") == PROGRESS_DEADLINE_EXCEEDED:
        return PROGRESS_DEADLINE_EXCEEDED, progressing
    return None


def _is_rollout_pending(deployment: dict | None) -> bool:
    """The Deployment controller is about to change what this Deployment's status
    says: it has not observed the current generation, or has not yet brought the
    pod counts (replicas, updatedReplicas) to spec.replicas. Readiness is not
    waited for: pods may take minutes to become ready, and each change of
    readyReplicas is reported as it comes."""
    if deployment is None:
        return False
    status = deployment.get("status") or {}
    if (status.get("observedGeneration") or 0) < (meta_of(deployment).get("generation") or 0):
        return True
    if _workload_failure(status) is not None:
        return False        # an answer already: the counts will not reach spec.replicas soon
    desired = (deployment.get("spec") or {}).get("replicas", DEFAULT_REPLICAS)
    return (status.get("replicas") or 0) != desired or \
        (status.get("updatedReplicas") or 0) != desired


def desired_status(my: dict, deployment: dict | None, *,
                   condition: tuple[str, str] | None = None, now: str | None = None,
                   pod_cause: str | None = None) -> dict:
    """The status `my` should have.

    `deployment`: our Deployment as last seen (None when missing or not ours);
    its status gives the replica counts. `condition`: (reason, message) for a
    failure (InvalidSpec, Conflict, ApplyFailed), which makes Ready False;
    None computes Available / Progressing from the Deployment, with `pod_cause`
    (why its Pods are not ready) in the message when not Available.

    Fields of the status we do not own (other conditions, say) are kept.
    `lastTransitionTime` moves only when the Ready status flips (set_condition).
    """
    old = my.get("status") or {}
    generation = meta_of(my).get("generation")
    if condition is None:
        cond_status, reason, message = _readiness(effective_spec(my.get("spec")), deployment,
                                                  pod_cause)
    else:
        cond_status, (reason, message) = "False", condition
    counts = (deployment or {}).get("status") or {}
    # A shallow copy: every key this sets is replaced, not changed in place (set_condition
    # copies the conditions), and the rest is carried over as it is, never modified.
    new = dict(old)
    new.update({
        "observedGeneration": generation,
        "replicas": counts.get("replicas") or 0,
        "readyReplicas": counts.get("readyReplicas") or 0,
        "selector": selector_string(meta_of(my).get("name") or ""),
        "conditions": set_condition(old.get("conditions"), {
            "type": CONDITION_READY, "status": cond_status, "reason": reason,
            "message": message, "observedGeneration": generation,
        }, now=now),
    })
    return new


def _same_inputs(a: dict | None, b: dict | None) -> bool:
    """Whether two versions of a My agree on everything a reconcile reads but its status."""
    if a is None or b is None:
        return a is b
    meta_a, meta_b = meta_of(a), meta_of(b)
    return (a.get("spec") == b.get("spec") and
            all(meta_a.get(f) == meta_b.get(f)
                for f in ("uid", "generation", "deletionTimestamp", "name", "namespace")))


def status_changed(old: dict | None, new: dict) -> bool:
    """Whether writing `new` would change what the status reports."""
    old = old or {}
    return any(old.get(key) != value for key, value in new.items())


def _ready_summary(status: dict | None) -> tuple | None:
    cond = get_condition({"status": status or {}}, CONDITION_READY)
    return (cond.get("status"), cond.get("reason"), cond.get("message")) if cond else None


# --------------------------------------------------------------------------
# 6. The reconcile (Events go through k8s_http's EventRecorder)


def _unfixable(my: dict, reason: str, message: str) -> TerminalError:
    """The error a reconcile ends with when the My is Ready=False for a cause the
    operator cannot fix itself (InvalidSpec, Conflict): counted where
    controller-runtime users look (result="error", reconcile_errors_total), never
    retried (a change to the My or the deletion watch brings the key back), and
    logged at error level once, when the cause appears: quiet when the My's status
    (as this reconcile read it) already said the same."""
    cond = get_condition(my, CONDITION_READY) or {}
    seen = cond.get("status") == "False" and cond.get("reason") == reason and \
        cond.get("message") == message
    return TerminalError(f"{reason}: {message}", quiet=seen)


class _Blocked(NamedTuple):
    """A child we may not write (a name taken by someone else): stop the reconcile."""
    result: Result | None


class MyReconciler:
    """reconcile(key) for `My` objects.

    Reads `stores`, the caches of My and of our children by resource (MY,
    DEPLOYMENTS, SERVICES; the children's selected by MANAGED_SELECTOR, see
    `main`), and writes through `client`. `watch_for_deletion(resource, key,
    owner) -> bool`, `cancel_deletion_watches(owner)` and `watching_deletion(resource,
    key) -> bool` are the Manager's
    narrow watches on a name outside the caches (a conflicting child).

    Level-based: every call looks at the current state (caches, and the server
    where a cache cannot know) and does what is missing, whatever the event
    that triggered it. When nothing differs it writes nothing.
    """

    CHILDREN = ((DEPLOYMENTS, render_deployment), (SERVICES, render_service))

    def __init__(self, client, stores: Mapping[Resource, Store], *,
                 watch_for_deletion: Callable[[Resource, ObjectKey, ObjectKey], bool],
                 cancel_deletion_watches: Callable[[ObjectKey], None],
                 watching_deletion: Callable[[Resource, ObjectKey], bool] = lambda r, k: False,
                 recorder: EventRecorder | None = None,
                 now: Callable[[], str] = rfc3339_now,
                 clock: Callable[[], float] = time.monotonic,
                 status_coalesce_seconds: float = STATUS_COALESCE_SECONDS):
        self.client = client
        self._stores = stores
        self._watch_for_deletion = watch_for_deletion
        self._cancel_deletion_watches = cancel_deletion_watches
        self._watching_deletion = watching_deletion
        # main() passes the manager's asynchronous recorder; this one waits for each Event.
        self.recorder = recorder or EventRecorder(client, component=NAME)
        self._now = now
        # (child plural, key) -> the foreign-entries patch a webhook undid (see
        # _remove_foreign_entries); dropped when the My goes.
        self._futile_patches: dict[tuple[str, ObjectKey], str] = {}
        self._clock = clock
        # A status change the Deployment controller is about to follow with its
        # answer is held back so that one write reports both (see _write_status).
        self._status_hold = StatusHold(
            coalesce_seconds=status_coalesce_seconds, cap_seconds=STATUS_HOLD_CAP_SECONDS,
            weight=ANSWER_TIME_WEIGHT, clock=clock, queued_seconds=queued_seconds)
        # The resourceVersions (My, Deployment, Service) a reconcile finished with:
        # everything written, or a status held. The same versions in the caches
        # again give the same answer (the reconcile reads nothing else once both
        # children exist, and a hold only depends on the time), so a resync, or an
        # echo of our own write that still wakes the key (one the store could not
        # name the writer of: see write_through), costs three cache reads.
        self._settled = SettledVersions(stores, (MY, DEPLOYMENTS, SERVICES))
        # When to read the Pods of a My that is not ready (see _pod_cause).
        self._pod_checks = PodCheckSchedule(first_seconds=POD_CHECK_FIRST_SECONDS,
                                            max_seconds=POD_CHECK_MAX_SECONDS, clock=clock)
        # Validation and rendered children per My generation: see _desired.
        self._rendered = GenerationMemo(RENDER_MEMO_SIZE)

    def __call__(self, key: ObjectKey) -> Result | None:
        if self._settled.unchanged(key):
            done, result = self._settled_result(key)
            if done:
                return result
        self._settled.forget(key)
        # The store answers with our own last write until its watch brings it.
        my = self._stores[MY].get(key)
        if my is None:
            self._forget(key)     # gone: the garbage collector deletes the children
            return None
        # Children our cache shows (or our last write of them).
        lives = {resource: self._cached_child(resource, key) for resource, _ in self.CHILDREN}
        if meta_of(my).get("deletionTimestamp"):
            # Being deleted (maybe in the foreground, children first): do not recreate them.
            return None

        problems, desired = self._desired(key, my)
        if problems:
            # Children are left as they are; no retry until the generation changes
            # (the My's update event brings us back). The same generation gives the
            # same status, so a repeat writes nothing.
            message = "; ".join(problems)
            self._write_status(key, my, self._our_cached_deployment(key, my),
                               condition=(INVALID_SPEC, message))
            raise _unfixable(my, INVALID_SPEC, message)

        # Children our cache shows under another controller (labelled, but owned by
        # another My) stop the reconcile before anything is written.
        for resource, live in lives.items():
            if live is not None and not is_controlled_by(live, my):
                return self._conflict(key, my, resource, live)

        # A child missing for a reason we know (its name taken, watched) is no sign
        # of a stale cache: no live read for it.
        if any(live is None and not self._watching_deletion(resource, key)
               for resource, live in lives.items()) and self._has_acted_on(my) \
                and not self._still_exists(key, my):
            return None

        blocked = self._ensure_children(key, my, desired, lives)
        if blocked is not None:
            return blocked.result
        return self._report(key, my, lives)

    def _settled_result(self, key: ObjectKey) -> tuple[bool, Result | None]:
        """(True, what to return) when nothing changed since a reconcile finished
        (an echo of our own writes, a resync), known from the caches'
        resourceVersions alone; (False, None) when a timer it set is due: a held
        status to write as it stands, or Pods to read again."""
        now = self._clock()
        until = self._status_hold.held_until(key)
        if until is None:
            due = self._pod_checks.due_at(key)
            if due is None:
                return True, None
            if due > now:      # handed out early: the promise to come back stands
                return True, Result(requeue_after_seconds=due - now, priority=1)
            return False, None          # its Pods are due to be read again
        if until > now:
            return True, Result(requeue_after_seconds=until - now, priority=1)
        return False, None              # the hold is over and nothing came

    def _forget(self, key: ObjectKey) -> None:
        """The My is gone: drop what was kept for it."""
        self.recorder.forget(key)
        self._cancel_deletion_watches(key)
        for resource, _ in self.CHILDREN:
            self._futile_patches.pop((resource.plural, key), None)
        self._status_hold.forget(key)
        self._settled.forget(key)
        self._pod_checks.stop(key)

    def _ensure_children(self, key: ObjectKey, my: dict, desired: tuple[dict, ...],
                         lives: dict) -> _Blocked | None:
        """Apply each child in turn (`lives` updated with what the server answered);
        _Blocked when one may not be written; one Event per kind of change."""
        changes: list[tuple[str, Resource]] = []      # ("Created" | "Updated", kind)
        try:
            for (resource, _), want in zip(self.CHILDREN, desired):
                live = self._ensure_child(key, my, resource, want, lives[resource], changes)
                if isinstance(live, _Blocked):
                    return live
                lives[resource] = live
        except ApiError as err:
            if is_namespace_terminating(err):
                # The namespace is being deleted (its controller removes the children
                # before the My): creating anything there is refused, and the My goes
                # next. As client-go's controllers do, give up quietly, no retry.
                log.info("not recreating %s %s: namespace %s is being deleted",
                         resource.kind, key.name, key.namespace)
                changes.clear()          # its Events would be refused the same way
                return _Blocked(None)
            message = f"applying {resource.kind} {key.name} failed: {err}"   # the failed one
            self.recorder.event(my, "Warning", "ReconcileError", message)
            try:
                self._write_status(key, my, self._our_cached_deployment(key, my),
                                   condition=(APPLY_FAILED, message))
            except Exception as status_err:  # the apply error is the one to report
                log.warning("could not record ApplyFailed on %s", key,
                            extra={"error": f"{type(status_err).__name__}: {status_err}"})
            raise  # the runner retries with backoff
        finally:
            self._report_changes(my, changes)
        return None

    def _report(self, key: ObjectKey, my: dict, lives: dict) -> Result | None:
        """Write the status the children now give (maybe held), and when to come back."""
        deployment = self._reported_deployment(key, my, lives[DEPLOYMENTS])
        pod_cause, recheck = self._pod_cause(key, my, deployment)
        wait, reported = self._write_status(key, my, deployment, pod_cause=pod_cause,
                                            pending=_is_rollout_pending(deployment))
        # The versions this reconcile worked from or wrote, not a fresh cache read:
        # a version the watch brought meanwhile has not been reconciled yet.
        self._settled.settle(key, reported, deployment, lives[SERVICES])
        if wait:
            # Priority: the Deployment's update (or the end of the window) brings
            # the key back ahead of the queue, so holding costs no extra queue pass.
            return Result(requeue_after_seconds=min(wait, recheck or wait), priority=1)
        if recheck:
            # To read its Pods then. With priority, as a hold: the Deployment's update
            # saying they are ready brings the key back first, and then the timer is
            # dropped (no reconcile for nothing when Pods start in time).
            return Result(requeue_after_seconds=recheck, priority=1)
        return None

    def _pod_cause(self, key: ObjectKey, my: dict, deployment: dict | None
                   ) -> tuple[str | None, float | None]:
        """(why the My's Pods are not ready, seconds until they are to be read again).

        (None, None) while there is nothing to read them for (see
        _pods_worth_reading). The first read comes POD_CHECK_FIRST_SECONDS after
        the My was first seen unready, the next ones at doubling intervals; in
        between, the cause the last read found is reported, so the message does
        not flap. A failed read keeps that cause: it never fails the reconcile.
        """
        if not _pods_worth_reading(effective_spec(my.get("spec")), deployment):
            self._pod_checks.stop(key)
            return None, None

        def read(last: str | None) -> str | None:
            try:
                pods = self.client.list(PODS, namespace=key.namespace, limit=POD_LIST_LIMIT,
                                        label_selector=selector_string(key.name))["items"]
            except ApiError as err:
                log.info("could not read the Pods of %s to tell why it is not ready: %s",
                         key, err)
                return last
            return pod_problem(pods)
        return self._pod_checks.check(key, read)

    def _reported_deployment(self, key: ObjectKey, my: dict, deployment: dict | None
                             ) -> dict | None:
        """The Deployment the status reports on: `deployment` (as our apply answered or
        the cache showed it), or the informer's copy when that already carries the
        Deployment controller's answer for the same generation. The answer can arrive
        while this reconcile applies the Service and posts its Event; reporting it
        saves the status write that would follow. Same generation, so the same spec,
        and a status at or past ours. (The store answers with our own write until
        its watch has brought a newer version of the key.)"""
        if deployment is None or not _is_rollout_pending(deployment):
            return deployment
        cached = self._stores[DEPLOYMENTS].get(key)
        if cached is not None and is_controlled_by(cached, my) and \
                meta_of(cached).get("generation") == meta_of(deployment).get("generation") and \
                not _is_rollout_pending(cached):
            return cached
        return deployment

    # -- children -------------------------------------------------------

    def _desired(self, key: ObjectKey, my: dict) -> tuple[list[str], tuple[dict, ...]]:
        """validate_my(my), and the children rendered when it finds nothing.

        Remembered for the last RENDER_MEMO_SIZE generations of My objects
        (k8s_http.GenerationMemo): a new My is reconciled again when its
        Deployment's controller answers (after our status write, so from another
        resourceVersion of the same generation), and validating and rendering
        (with the canonical JSON of the config hash) was a fifth of a burst's CPU.
        Both read only the name, namespace, uid and spec, and the spec cannot
        change without the generation (the status subresource is on). Every
        answer is a new copy.
        """
        return self._rendered(key, my, self._validate_and_render)

    def _validate_and_render(self, my: dict) -> tuple[list[str], tuple[dict, ...]]:
        problems = validate_my(my)
        return problems, () if problems else tuple(render(my) for _, render in self.CHILDREN)

    @staticmethod
    def _has_acted_on(my: dict) -> bool:
        """We reconciled this My before (its status says so): a missing child vanished."""
        return (my.get("status") or {}).get("observedGeneration") is not None

    def _still_exists(self, key: ObjectKey, my: dict) -> bool:
        """A live read before re-creating a child that vanished.

        The garbage collector deletes the children of a deleted My. If our My
        cache is stale (its watch down, say), the cached My is a ghost, and
        re-creating its children would fight the collector in a loop (create,
        collect, DELETED event, create...). One GET per repair settles it: the
        My must exist with the same uid. A new My (no status yet) costs no read.
        """
        try:
            live = self.client.get(MY, key.name, namespace=key.namespace)
        except NotFoundError:
            live = None
        if live is not None and meta_of(live).get("uid") == meta_of(my).get("uid"):
            return True
        log.info("not re-creating the children of %s: the My is gone (uid %s), the cache "
                 "is behind", key, meta_of(my).get("uid"))
        return False

    def _cached_child(self, resource: Resource, key: ObjectKey) -> dict | None:
        """The child named like the My as our cache (or our last write) shows it.

        Our caches hold only objects carrying our managed-by label, so None means
        (a) no object, (b) ours but not yet seen by the watch, or (c) someone
        else's unlabelled object of that name, or ours with the label removed.
        `_ensure_child` tells them apart with a create-only apply.
        """
        return self._stores[resource].get(key)

    def _ensure_child(self, key: ObjectKey, my: dict, resource: Resource, desired: dict,
                      live: dict | None, changes: list) -> dict | _Blocked | None:
        """Make the child say what `desired` says; returns it as the server has it
        (or the cached copy when nothing differed), or _Blocked when it is not ours.

        A child missing from the cache is created with a create-only apply: one
        request when the name is free, which is every new My. Only if the name is
        taken (409) do we read the object to see whose it is, and a foreign one is
        never touched -- a plain forced apply would take it over.
        """
        if live is not None and config_hash(live, CONFIG_HASH_ANNOTATION) == \
                config_hash(desired, CONFIG_HASH_ANNOTATION):
            # Our spec is what the child was last applied with, so list entries
            # we do not send now are someone else's: remove them first (a forced
            # apply would merge ours with theirs, maybe into a 422).
            live = self._remove_foreign_entries(key, resource, desired, live, changes)
        if not needs_apply(desired, live):
            return live
        if live is None and self._watching_deletion(resource, key):
            self._conflict_stands(key, my)
        if live is None:
            try:
                applied = self._apply(resource, desired, key, create_only=True)
            except ConflictError:
                try:
                    live = self.client.get(resource, key.name, namespace=key.namespace)
                except NotFoundError:
                    return _Blocked(Result(requeue=True))   # deleted in between: look again soon
                if not is_controlled_by(live, my):
                    return _Blocked(self._conflict(key, my, resource, live))
                if not needs_apply(desired, live):
                    return live
                applied = self._apply(resource, desired, key, base=live)
        else:
            applied = self._apply_over(key, resource, desired, live, changes)
        if live is None:
            changes.append(("Created", resource))
        elif resource_version_of(applied) != resource_version_of(live):
            changes.append(("Updated", resource))
        else:
            # The server found nothing to change: needs_apply saw a difference that
            # is not one (a normalisation it does not model). Harmless but a write.
            log.debug("apply of %s %s changed nothing", resource.kind, key.name)
        return applied

    def _conflict_stands(self, key: ObjectKey, my: dict) -> None:
        """The name is known to be taken (found so, and its squatter's deletion not
        yet reported): another create would only be refused. The Conflict status
        stands (written again only for a new generation), and the reconcile ends
        with it; the deletion watch brings the key back when the squatter goes."""
        cond = get_condition(my, CONDITION_READY) or {}
        if cond.get("reason") == CONFLICT:
            self._write_status(key, my, None, condition=(CONFLICT, cond.get("message", "")))
            raise _unfixable(my, CONFLICT, cond.get("message", ""))

    def _apply_over(self, key: ObjectKey, resource: Resource, desired: dict, live: dict,
                    changes: list) -> dict:
        """Apply a changed spec over an existing child, then remove foreign entries.

        Applied first, because the apply itself drops the entries of our
        previous spec (we own them), so a port change costs one write. What
        remains beside ours in the answer is someone else's. If the merge with
        their entries is invalid (a 422: two unnamed Service ports), they are
        removed first and the apply made again.
        """
        try:
            applied = self._apply(resource, desired, key, base=live)
        except InvalidError:
            if foreign_entries_patch(desired, live) is None:
                raise
            live = self._remove_foreign_entries(key, resource, desired, live, changes)
            applied = self._apply(resource, desired, key, base=live)
        return self._remove_foreign_entries(key, resource, desired, applied, changes)

    def _remove_foreign_entries(self, key: ObjectKey, resource: Resource, desired: dict,
                                live: dict, changes: list) -> dict:
        """Delete other managers' entries in the fields the spec decides (one patch).

        A mutating admission webhook may put them back on every write (an env
        var injected into each container, say). Then the patch is futile and
        repeating it would be a write per reconcile for ever: a patch that left
        the same foreign entries behind is not sent again until what it would
        remove changes.
        """
        patch = foreign_entries_patch(desired, live)
        if patch is None:
            self._futile_patches.pop((resource.plural, key), None)
            return live
        fingerprint = json.dumps(patch, sort_keys=True)
        if self._futile_patches.get((resource.plural, key)) == fingerprint:
            return live
        patched = self._write(resource, live, lambda: self.client.patch(
            resource, key.name, patch, namespace=key.namespace, patch_type="strategic",
            field_manager=FIELD_MANAGER))
        if resource_version_of(patched) != resource_version_of(live):
            changes.append(("Updated", resource))
        if foreign_entries_patch(desired, patched) == patch:
            log.warning("%s %s: other entries in fields the My decides came back at once "
                        "(a mutating admission webhook?); leaving them: %s",
                        resource.kind, key.name, fingerprint)
            self._futile_patches[(resource.plural, key)] = fingerprint
        return patched

    def _apply(self, resource: Resource, desired: dict, key: ObjectKey, *,
               create_only: bool = False, base: dict | None = None) -> dict:
        return self._write(resource, base, lambda: self.client.apply(
            resource, desired, field_manager=FIELD_MANAGER, force=True,
            namespace=key.namespace, create_only=create_only))

    def _write(self, resource: Resource, base: dict | None, send: Callable[[], dict]) -> dict:
        """Send a write the cache answers with at once (k8s_http.write_through)."""
        return write_through(self._stores[resource], send, base=base)

    def _conflict(self, key: ObjectKey, my: dict, resource: Resource, live: dict) -> Result:
        owner = controller_of(live)
        held = f" (controlled by {owner.get('kind')} {owner.get('name')})" if owner else ""
        message = (f"{resource.kind} {key.name} already exists and is not controlled "
                   f"by this My{held}; delete or rename it")
        self._write_status(key, my, None, condition=(CONFLICT, message))
        # Its deletion is invisible to our label-selected watches: watch its name.
        if self._watch_for_deletion(resource, key, key):
            raise _unfixable(my, CONFLICT, message)
        return Result(requeue_after_seconds=CONFLICT_RECHECK_SECONDS)

    def _our_cached_deployment(self, key: ObjectKey, my: dict) -> dict | None:
        cached = self._cached_child(DEPLOYMENTS, key)
        return cached if cached is not None and is_controlled_by(cached, my) else None

    # -- writing --------------------------------------------------------

    def _report_changes(self, my: dict, changes: list[tuple[str, Resource]]) -> None:
        """One Event per kind of change in a reconcile ("Created Deployment x and
        Service x"), not one per child: Events are writes too."""
        name = meta_of(my).get("name")
        for verb in ("Created", "Updated"):
            kinds = list(dict.fromkeys(resource.kind for done, resource in changes
                                       if done == verb))
            if kinds:
                what = " and ".join(f"{kind} {name}" for kind in kinds)
                log.info("%s %s", verb.lower(), what)
                self.recorder.event(my, "Normal", verb, f"{verb} {what}")

    def _write_status(self, key: ObjectKey, my: dict, deployment: dict | None, *,
                      condition: tuple[str, str] | None = None, pod_cause: str | None = None,
                      pending: bool | None = None) -> tuple[float, dict | None]:
        """Write the status `my` should have, if it differs. Returns the seconds
        the caller should come back after when the write is held, and the My as
        it now stands (the server's answer when written; None when it was
        deleted meanwhile).

        `pending`: whether the Deployment controller is still at work on the
        Deployment (_is_rollout_pending); None when the status is not about the
        Deployment (a failure condition), which is never held. While it is at
        work, its next status update would need a write of its own, so a change
        may wait for it (k8s_http.StatusHold): within STATUS_COALESCE_SECONDS
        when our queue is idle, about the queue's own delay under a burst, and
        not at all while its recent answers took longer than that. Idle, a new
        My costs one status write.
        """
        old = my.get("status") or {}
        new = desired_status(my, deployment, condition=condition, now=self._now(),
                             pod_cause=pod_cause)
        wait = self._status_hold.wait(key, pending)
        if not status_changed(old, new):
            self._status_hold.release(key)
            return 0.0, my
        if wait > 0:
            return wait, my
        self._status_hold.release(key)
        try:
            written = self._write(MY, my, lambda: self.client.patch_status(
                MY, key.name, {"status": new}, namespace=key.namespace))
        except NotFoundError:
            return 0.0, None  # deleted meanwhile: nothing to report on
        summary = _ready_summary(new) or ()
        # debug: the status itself says it (kubectl get my); at info every status
        # write of a burst was a log line.
        log.debug("status of %s: Ready=%s %s", key, *summary[:2])
        self._warn_on_news(my, old, new)
        # A merge patch of /status lands on whatever the My is by then: if someone
        # changed it after our read, the answer carries a spec this reconcile never
        # saw. Then it is not what we settled on: the input is, and the change's own
        # event brings us back.
        return 0.0, written if _same_inputs(written, my) else my

    def _warn_on_news(self, my: dict, old: dict, new: dict) -> None:
        """Warning events follow the condition, not each write: an InvalidSpec,
        Conflict or workload failure is reported once when it appears, not at
        every replica change. A workload failure's message carries replica
        counts that move: only a new reason is news there."""
        old_summary, new_summary = _ready_summary(old) or (), _ready_summary(new) or ()
        reason = new_summary[1] if len(new_summary) > 1 else None
        if reason in WARNING_REASONS:
            compared = 2 if reason in (REPLICA_FAILURE, PROGRESS_DEADLINE_EXCEEDED) else 3
            if old_summary[:compared] != new_summary[:compared]:
                self.recorder.event(my, "Warning", reason, new_summary[2])


# --------------------------------------------------------------------------
# 7. Command line


def build_parser() -> argparse.ArgumentParser:
    """The library's manager flags under this operator's name, plus --workers."""
    parser = new_parser(
        NAME,
        description="A Kubernetes operator: keeps a Deployment and a Service for every\n"
                    "My (mine.jp/v1) and reports their state in its status.",
        epilog="Examples:\n"
               "  my-controller --kubeconfig ~/.kube/config --namespace default\n"
               "  my-controller --leader-elect --leader-election-namespace my-controller-system\n"
               "Endpoints: /metrics on the metrics address; /healthz and /readyz on\n"
               "the health-probe address.",
    )
    groups = add_manager_flags(parser, NAME, version=__version__)
    groups["reconciling"].add_argument("--workers", type=positive_int, default=4, metavar="N",
                                       help="concurrent reconciles")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup_logging(args.log_level, args.log_format)
        config = load_config(args.kubeconfig, context=args.context)
        mgr = Manager(config, NAME, **manager_options(args))
    except ConfigError as err:
        return flag_error(NAME, with_flag_names(err))
    # The caches the reconciler reads, made before it is registered, each keeping
    # only what this file reads (PROJECTIONS); the controller's own watches (MY,
    # and the owned kinds under the same selector) share them.
    stores = {MY: mgr.store_for(MY, transform=PROJECTIONS[MY]),
              DEPLOYMENTS: mgr.store_for(DEPLOYMENTS, MANAGED_SELECTOR,
                                         transform=PROJECTIONS[DEPLOYMENTS]),
              SERVICES: mgr.store_for(SERVICES, MANAGED_SELECTOR,
                                      transform=PROJECTIONS[SERVICES])}
    reconciler = MyReconciler(mgr.client, stores, watch_for_deletion=mgr.watch_for_deletion,
                              cancel_deletion_watches=mgr.cancel_deletion_watches,
                              watching_deletion=mgr.watching_deletion,
                              recorder=mgr.event_recorder(NAME))
    mgr.add_controller(MY, reconciler, owns=[DEPLOYMENTS, SERVICES],
                       owns_label_selector=MANAGED_SELECTOR, workers=args.workers,
                       transforms=PROJECTIONS)
    # A port in use or an address this host does not have is a flag problem,
    # reported as one.
    return run_manager(mgr, NAME)

if __name__ == "__main__":
    sys.exit(main())
