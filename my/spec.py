"""The `My` resource (mine.jp/v1): its names, its defaults, and what a usable spec is.

One job: say what a `My` asks for. The resource and the names the operator
gives what it makes (field manager, labels, the config-hash annotation), the
CRD's defaults (``effective_spec``), and ``validate_spec`` / ``validate_my``:
the problems that make a `My` unusable, the contract of docs/SPEC.md §1.

Invariants: pure (no I/O, no clock, no logging); a `My` is only read, never
changed; validation re-checks what the CRD schema says (manifests/crd.yaml) and
what the apiserver would refuse on the children, so a spec that passes renders
children the apiserver accepts. Imports only the standard library and the
``k8s_http`` package root; the bottom of ``my`` (render and status import it).
"""

from __future__ import annotations

from fractions import Fraction

from k8s_http import (
    Resource,
    is_dns1035_label,
    is_dns1123_subdomain,
    is_env_var_name,
    is_resource_name,
    meta_of,
    parse_quantity,
)

# --------------------------------------------------------------------------
# The resource, its names and defaults

MY = Resource("mine.jp", "v1", "my", namespaced=True, kind="My")

NAME = "my-controller"              # field manager, event source, manager name
FIELD_MANAGER = NAME

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
APP_NAME = "my"
# The owned watches use this selector, so the caches hold only our children.
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={NAME}"
# With --shards=auto, each child carries its owner's slot (k8s_http.core.shards):
# a replica watches the children of its own slots only. The domain also names
# the member Leases' ring label and slots annotation (docs/SHARDING.md).
SLOT_LABEL = "sharding.mine.jp/slot"

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
# Validation: what the controller can use


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

