"""The kopf peer of my-controller, for bench/converge.py: the same job, kopf's way.

For each ``My`` (mine.jp/v1) named N it makes Deployment N and Service N with
the same labels, selector, container, ports and ownerReferences as
controller.py, and reports ``observedGeneration``, ``replicas``,
``readyReplicas``, ``selector`` and a ``Ready`` condition in the status.

Written the way kopf's documentation shows it (walkthrough "Creating the
objects" / "Updating the objects", "Hierarchies", "Indexing", "Events"):

* ``@kopf.on.create`` / ``on.update`` / ``on.resume`` handlers that build the
  children as dicts, ``kopf.adopt()`` them, and write them with the official
  ``kubernetes`` client -- created in ``on.create``, patched in ``on.update``
  and ``on.resume``, as the walkthrough does, each falling back to the other
  when the object is not (or already) there -- and post the Events ours posts
  ("Created" once for both children, "Updated") with ``kopf.info()``;
* the status, level-based: ``@kopf.index`` keeps every My's status and every
  Deployment's counts; ``@kopf.on.event`` on either recomputes the My's status
  and patches it only when it differs from what it last wrote (or, before
  that, from what the index says). Every change of either object recomputes,
  so the status always ends up right (an earlier version that wrote the status
  from the handlers' own, possibly stale, copies could leave a wrong count).
  The status of a new spec waits until kopf has recorded handling it: written
  earlier, its watch event makes kopf run the handler a second time.

kopf's defaults are kept, except where the CRD forces a choice: its schema is
structural and has no room for kopf's ``status.kopf`` progress records, so the
progress is kept in annotations (``settings.persistence.progress_storage``,
as kopf's "Continuity" page suggests).

Run (bench/converge.py does):
    KUBECONFIG=... bench/.venv-kopf/bin/kopf run --standalone -n NS bench/peers/kopf_operator.py
"""

from __future__ import annotations

import datetime
import json
import threading

import kopf
import kubernetes

GROUP, VERSION, PLURAL = "mine.jp", "v1", "my"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "my-controller"          # the same children as ours, so the same label

_api: kubernetes.client.ApiClient | None = None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    global _api
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
    kubernetes.config.load_kube_config()      # $KUBECONFIG, as kopf's own login does
    _api = kubernetes.client.ApiClient()


# ---------------------------------------------------------------- building the children

def _selector(name: str) -> dict:
    return {LABEL_NAME: "my", LABEL_INSTANCE: name}


def _labels(name: str) -> dict:
    return {**_selector(name), LABEL_MANAGED_BY: MANAGED_BY}


def _deployment(name: str, spec: dict) -> dict:
    port = spec.get("port", 8080)
    container = {"name": "app", "image": spec["image"],
                 "ports": [{"containerPort": port, "protocol": "TCP"}]}
    if spec.get("env"):
        container["env"] = [dict(item) for item in spec["env"]]
    if spec.get("resources"):
        container["resources"] = {section: dict(values)
                                  for section, values in spec["resources"].items()}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "replicas": spec.get("replicas", 1),
            "selector": {"matchLabels": _selector(name)},
            "template": {"metadata": {"labels": _labels(name)},
                         "spec": {"containers": [container]}},
        },
    }


def _service(name: str, spec: dict) -> dict:
    port = spec.get("port", 8080)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {"type": spec.get("serviceType", "ClusterIP"), "selector": _selector(name),
                 "ports": [{"port": port, "targetPort": port, "protocol": "TCP"}]},
    }


def _put_child(create, patch, namespace: str, body: dict, *, exists: bool) -> tuple[dict, bool]:
    """(the object as the server returned it, whether it was created). Tries first what
    should work -- patch when the child `exists` (update, resume), else create -- and
    falls back to the other on 404 / 409, so no request is wasted in the common case."""
    name = body["metadata"]["name"]
    if exists:
        try:
            return patch(name=name, namespace=namespace, body=body).to_dict(), False
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
        return create(namespace=namespace, body=body).to_dict(), True
    try:
        return create(namespace=namespace, body=body).to_dict(), True
    except kubernetes.client.ApiException as err:
        if err.status != 409:
            raise
    return patch(name=name, namespace=namespace, body=body).to_dict(), False


# ---------------------------------------------------------------- status helpers

def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(name: str, generation: int, desired: int, old_status: dict,
            counts: tuple[int, int, bool] | None) -> dict:
    """The status fields controller.py reports, from the Deployment's counts (None: none yet)."""
    replicas, ready, rolled_out = counts or (0, 0, False)
    if counts is None:
        cond, reason, message = "False", "Progressing", "waiting for the Deployment to be created"
    elif not rolled_out:
        cond, reason, message = "False", "Progressing", \
            f"{ready}/{desired} replicas ready; Deployment update pending"
    elif ready >= desired:
        cond, reason, message = "True", "Available", f"{ready}/{desired} replicas ready"
    else:
        cond, reason, message = "False", "Progressing", f"{ready}/{desired} replicas ready"
    old_ready = next((c for c in old_status.get("conditions") or [] if c.get("type") == "Ready"),
                     {})
    since = old_ready.get("lastTransitionTime") if old_ready.get("status") == cond else None
    return {
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "selector": f"{LABEL_INSTANCE}={name},{LABEL_NAME}=my",
        "conditions": [{"type": "Ready", "status": cond, "reason": reason, "message": message,
                        "lastTransitionTime": since or _now(),
                        "observedGeneration": generation}],
    }


def _same_status(old: dict, new: dict) -> bool:
    """Whether `old` already says what `new` says (condition timestamps aside)."""
    def conditions(status):
        return [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                for c in status.get("conditions") or []]
    return all(old.get(key) == value for key, value in new.items() if key != "conditions") \
        and conditions(old) == conditions(new)


def _counts(status: dict, generation: int | None) -> tuple[int, int, bool]:
    """(replicas, readyReplicas, rolled out) from a Deployment's status."""
    return (status.get("replicas") or 0, status.get("readyReplicas") or 0,
            (status.get("observedGeneration") or 0) >= (generation or 0))


def _first(store):
    return next(iter(store), None) if store is not None else None


# ---------------------------------------------------------------- the children

@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
def ensure_children(name, namespace, spec, body, reason, logger, **_):
    spec = dict(spec)
    deployment, service = _deployment(name, spec), _service(name, spec)
    kopf.adopt([deployment, service])          # ownerReferences (controller), namespace

    apps = kubernetes.client.AppsV1Api(_api)
    core = kubernetes.client.CoreV1Api(_api)
    exists = reason != "create"                # update, resume: the children should be there
    _, created = _put_child(apps.create_namespaced_deployment,
                            apps.patch_namespaced_deployment, namespace, deployment,
                            exists=exists)
    _, service_created = _put_child(core.create_namespaced_service,
                                    core.patch_namespaced_service, namespace, service,
                                    exists=exists)
    made = [f"{kind} {name}" for kind, new in (("Deployment", created),
                                               ("Service", service_created)) if new]
    if made:                                   # one Event for both, as ours posts
        kopf.info(body, reason="Created", message="Created " + " and ".join(made))
    if reason == "update":                     # a spec change: one Event, as ours posts
        kopf.info(body, reason="Updated", message=f"Updated the children of {name}")
    logger.info(f"Deployment and Service {name} are in place")


# ---------------------------------------------------------------- the status

# kopf's record of the configuration it last handled. A status write that reaches
# kopf before kopf's own record of a new spec does makes kopf handle that spec again
# (the write's watch event carries a body with the old record), so the status waits
# until the record matches the spec.
LAST_HANDLED = "kopf.zalando.org/last-handled-configuration"


def _handled(spec, meta) -> bool:
    record = (meta.get("annotations") or {}).get(LAST_HANDLED)
    try:
        return record is not None and json.loads(record).get("spec") == dict(spec)
    except ValueError:
        return False


@kopf.index(GROUP, VERSION, PLURAL)
def my_objects(namespace, name, spec, status, meta, **_):
    """(namespace, name) -> the My's generation, desired replicas and current status."""
    return {(namespace, name): {"generation": meta.get("generation"),
                                "replicas": spec.get("replicas", 1),
                                "handled": _handled(spec, meta),
                                "status": dict(status)}}


@kopf.index("apps", "v1", "deployments", labels={LABEL_MANAGED_BY: MANAGED_BY})
def deployment_counts(namespace, status, meta, **_):
    """(namespace, owning My's name) -> the Deployment's replica counts."""
    owner = next((ref for ref in meta.get("ownerReferences") or []
                  if ref.get("controller") and ref.get("kind") == "My"), None)
    if owner is None:
        return None
    return {(namespace, owner["name"]): _counts(dict(status), meta.get("generation"))}


# What this process last wrote to each My's status. The My index lags behind our own
# writes (it is updated by their watch events), so comparing against it alone would
# write the same status again and again; like controller.py's memo, the last write is
# the fresher truth. One lock per object: kopf runs the two event handlers in threads.
_written: dict[tuple[str, str], dict] = {}
_locks: dict[tuple[str, str], threading.Lock] = {}


def _refresh_status(namespace: str, name: str, my_objects: kopf.Index,
                    deployment_counts: kopf.Index) -> None:
    key = (namespace, name)
    with _locks.setdefault(key, threading.Lock()):
        parent = _first(my_objects.get(key))
        if parent is None or not parent["handled"]:
            return
        current = _written.get(key, parent["status"])
        counts = _first(deployment_counts.get(key))
        new = _status(name, parent["generation"], parent["replicas"], current, counts)
        if _same_status(current, new):
            return
        kubernetes.client.CustomObjectsApi(_api).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": new})
        _written[key] = new


@kopf.on.event(GROUP, VERSION, PLURAL)
def my_changed(type, name, namespace, my_objects: kopf.Index,
               deployment_counts: kopf.Index, **_):
    if type == "DELETED":
        _written.pop((namespace, name), None)
    else:
        _refresh_status(namespace, name, my_objects, deployment_counts)


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_MANAGED_BY: MANAGED_BY})
def deployment_changed(type, meta, namespace, my_objects: kopf.Index,
                       deployment_counts: kopf.Index, **_):
    owner = next((ref for ref in meta.get("ownerReferences") or []
                  if ref.get("controller") and ref.get("kind") == "My"), None)
    if owner is not None and type != "DELETED":
        _refresh_status(namespace, owner["name"], my_objects, deployment_counts)
