"""The children of a `My`: its Deployment and Service apply configurations, and
the patch that removes other managers' entries from the fields the My decides.

One job: from a validated `My`, what its children must say (docs/SPEC.md §1).
``render_deployment`` / ``render_service`` give the server-side apply
configurations, only the fields we own, each carrying the hash of its whole
configuration (``CONFIG_HASH_ANNOTATION``) so that a field we stop sending is
seen as a change. ``foreign_entries_patch`` gives the strategic merge patch that
deletes what other field managers added inside those fields (whether an apply
would change a child is k8s_http's ``needs_apply``).

Invariants: pure (no I/O, no clock, no logging); inputs are never changed and
every answer is a new object sharing nothing with them, so callers may keep or
change it. Imports only ``my.spec``, the standard library and the ``k8s_http``
package root.
"""

from __future__ import annotations

import copy

from k8s_http import owner_reference, port_key, with_config_hash

from my.spec import MY, CONFIG_HASH_ANNOTATION, CONTAINER_NAME, effective_spec, labels_for, \
    selector_for


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
# Fields the spec decides hold nothing of anybody else's

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

