"""Resource types, object keys and small helpers for plain-dict Kubernetes objects.

Wire objects stay plain dicts with camelCase keys; nothing here talks to a server.
"""

from __future__ import annotations

import copy
import datetime as _dt
import time
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import quote

__all__ = [
    "Resource",
    "ObjectKey",
    "CORE",
    "CONFIGMAPS",
    "SECRETS",
    "SERVICES",
    "EVENTS",
    "NAMESPACES",
    "PODS",
    "SERVICEACCOUNTS",
    "DEPLOYMENTS",
    "REPLICASETS",
    "LEASES",
    "CRDS",
    "TOKENREVIEWS",
    "SUBJECTACCESSREVIEWS",
    "key_of",
    "meta_of",
    "resource_version_of",
    "is_older_version",
    "controller_of",
    "is_controlled_by",
    "owner_reference",
    "get_condition",
    "set_condition",
    "has_finalizer",
    "add_finalizer",
    "remove_finalizer",
    "strip_managed_fields",
    "rfc3339_now",
]


@dataclass(frozen=True)
class Resource:
    """One API resource type: where it lives on the apiserver.

    `group` is "" for the core group. `kind` is informational (events,
    ownerReferences); the path is built from group, version and plural.
    """

    group: str
    version: str
    plural: str
    namespaced: bool = True
    kind: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """The URL path for a collection or an object.

        A namespaced resource without a namespace gives the all-namespaces
        collection (list and watch only).
        """
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            if not name:
                raise ValueError(f"empty name for {self.plural}")
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


CORE = ""
CONFIGMAPS = Resource("", "v1", "configmaps", True, "ConfigMap")
SECRETS = Resource("", "v1", "secrets", True, "Secret")
SERVICES = Resource("", "v1", "services", True, "Service")
EVENTS = Resource("", "v1", "events", True, "Event")
NAMESPACES = Resource("", "v1", "namespaces", False, "Namespace")
PODS = Resource("", "v1", "pods", True, "Pod")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", True, "ServiceAccount")
DEPLOYMENTS = Resource("apps", "v1", "deployments", True, "Deployment")
REPLICASETS = Resource("apps", "v1", "replicasets", True, "ReplicaSet")
LEASES = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False,
                "CustomResourceDefinition")
TOKENREVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", False, "TokenReview")
SUBJECTACCESSREVIEWS = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", False,
                                "SubjectAccessReview")


class ObjectKey(NamedTuple):
    """What a reconcile is about: namespace ("" for cluster-scoped) and name.

    A named tuple: work queues, stores and reconcilers hash and compare keys
    many times per object (a queued key alone, five times), and a tuple's hash
    and equality are C code where a frozen dataclass's are a Python call each
    (timeit: a set lookup of an equal key 37 ns against 163 ns). Equal to the
    plain tuple (namespace, name); ordered by namespace, then name.
    """

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def parse(cls, text: str) -> "ObjectKey":
        namespace, _, name = text.rpartition("/")
        return cls(namespace, name)


def meta_of(obj: dict | None) -> dict:
    """The object's metadata; {} when the object or its metadata is missing or not a map."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def resource_version_of(obj: dict | None) -> str | None:
    """metadata.resourceVersion, or None (no object, or none that is a string)."""
    rv = meta_of(obj).get("resourceVersion")
    return rv if isinstance(rv, str) else None


def is_older_version(version: str | None, than: str | None) -> bool:
    """Is resourceVersion `version` older than `than`, as two versions of one object
    (or of one resource) compare? Only when both are what the apiserver writes:
    decimal digits without a leading zero, ordered by length, then digit by digit
    (KEP-5504, GA in 1.35). Anything else is not comparable: False.
    """
    if not (_comparable_version(version) and _comparable_version(than)):
        return False
    return (len(version), version) < (len(than), than)     # type: ignore[arg-type]


def _comparable_version(version: object) -> bool:
    return (isinstance(version, str) and version.isascii() and version.isdigit()
            and version[0] != "0")


def key_of(obj: dict) -> ObjectKey:
    meta = meta_of(obj)
    return ObjectKey(meta.get("namespace") or "", meta.get("name") or "")


def controller_of(obj: dict) -> dict | None:
    """The ownerReference with `controller: true`, or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def is_controlled_by(obj: dict, owner: dict) -> bool:
    ref = controller_of(obj)
    uid = (owner.get("metadata") or {}).get("uid")
    return bool(ref and uid and ref.get("uid") == uid)


def owner_reference(owner: dict, *, resource: Resource | None = None, controller: bool = True,
                    block_owner_deletion: bool = True) -> dict:
    """An ownerReference pointing at `owner` (which must have name and uid).

    apiVersion and kind come from `resource` when given, else from `owner`
    itself: pass the resource for an object from a cache, which may lack them
    (items of a list of a built-in type do not carry them).
    """
    meta = owner["metadata"]
    return {
        "apiVersion": resource.api_version if resource is not None else owner["apiVersion"],
        "kind": resource.kind if resource is not None else owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": block_owner_deletion,
    }


def get_condition(obj: dict, type_: str) -> dict | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == type_:
            return cond
    return None


# metav1.Condition's maxLength for message (the CRD's conditions schema declares it).
_MAX_CONDITION_MESSAGE = 32768


def set_condition(conditions: list | None, new: dict, *, now: str | None = None) -> list:
    """Return a new conditions list with `new` merged in by type.

    `lastTransitionTime` moves only when the condition's status flips; any
    other change (reason, message, observedGeneration) keeps the old time.
    """
    result = [copy.deepcopy(c) for c in conditions or [] if isinstance(c, dict)]
    cond = dict(new)
    message = cond.get("message")
    if isinstance(message, str) and len(message) > _MAX_CONDITION_MESSAGE:
        # The Condition schema's bound: a longer one would fail the whole status write.
        cond["message"] = message[:_MAX_CONDITION_MESSAGE - 1] + "\u2026"
    for i, old in enumerate(result):
        if old.get("type") == cond["type"]:
            if old.get("status") == cond.get("status") and old.get("lastTransitionTime"):
                cond["lastTransitionTime"] = old["lastTransitionTime"]
            else:
                cond.setdefault("lastTransitionTime", now or rfc3339_now())
            result[i] = cond
            return result
    cond.setdefault("lastTransitionTime", now or rfc3339_now())
    result.append(cond)
    return result


def has_finalizer(obj: dict, name: str) -> bool:
    return name in ((obj.get("metadata") or {}).get("finalizers") or [])


def add_finalizer(obj: dict, name: str) -> bool:
    """Add in place; True if it changed."""
    fins = obj.setdefault("metadata", {}).setdefault("finalizers", [])
    if name in fins:
        return False
    fins.append(name)
    return True


def remove_finalizer(obj: dict, name: str) -> bool:
    """Remove in place; True if it changed."""
    fins = (obj.get("metadata") or {}).get("finalizers") or []
    if name not in fins:
        return False
    obj["metadata"]["finalizers"] = [f for f in fins if f != name]
    return True


# What awaits_reconcile reads (paths of keys, as informer.KeyMapper's reads).
AWAITS_RECONCILE_READS = (("metadata", "generation"), ("status", "observedGeneration"))


def awaits_reconcile(obj: dict) -> bool:
    """The object's status does not say it was reconciled at its generation:
    no status.observedGeneration yet (a new object), or an older one (a spec
    change not acted on). False without a generation. For resources whose
    status reports observedGeneration; to any other, every object awaits."""
    generation = meta_of(obj).get("generation")
    if generation is None:
        return False
    status = obj.get("status")
    observed = status.get("observedGeneration") if isinstance(status, dict) else None
    return observed != generation


def strip_managed_fields(obj: dict) -> dict:
    """The default cache transform: managedFields are often half of an object's size."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        meta.pop("managedFields", None)
    return obj


# (whole second, its text): the text changes once a second, and every status
# computed asks for it. One tuple, replaced whole, so threads never see half of it.
_last_second: tuple[int, str] = (-1, "")


def rfc3339_now() -> str:
    """The current UTC time to the second, as Kubernetes writes timestamps."""
    global _last_second
    second = int(time.time())
    cached = _last_second
    if cached[0] != second:
        text = _dt.datetime.fromtimestamp(second, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        cached = _last_second = (second, text)
    return cached[1]
