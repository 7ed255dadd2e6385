"""Would a server-side apply change the object? A subset test, without a request.

A controller that applies its desired object on every reconcile writes (and
wakes every watcher of the object) even when nothing differs. `needs_apply`
answers from the cached copy instead: every field of the apply configuration
must be in the live object with the same value. Extra fields in the live object
are fine: server defaults (protocol, imagePullPolicy, clusterIP, ...) and
fields other managers own.

It follows server-side apply's merge rules where a plain comparison would see
drift that is not there: lists with `listMapKeys` (containers, env, ports,
ownerReferences) are matched item by item on their key, so an item another
manager added (a sidecar injected by a webhook) is not drift; quantities under
`resources.requests` / `resources.limits` compare by value, as the apiserver
canonicalises them ("1000m" is stored as "1").

What a subset test cannot see is a field the caller *stopped* sending (still
on the live object, so "desired ⊆ live" holds): `with_config_hash` stamps the
apply configuration with a hash of itself in an annotation, which changes
whenever the configuration does, so the subset test fails and the caller does
apply (and server-side apply removes the field it no longer owns).
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable

from .objects import meta_of
from .quantity import same_quantity

__all__ = ["needs_apply", "covers", "port_key", "LIST_MAP_KEYS", "with_config_hash",
           "config_hash"]


def port_key(item: dict) -> tuple:
    """The list-map key of a port: (containerPort or port, protocol defaulting to TCP).

    One function for container ports and Service ports: each list holds one kind,
    and the protocol the apiserver defaults is part of the key.
    """
    return (item.get("containerPort", item.get("port")), item.get("protocol") or "TCP")


# Lists the apiserver merges by key (their `listMapKeys`), by the field name
# that holds them: compared item by item on the key.
LIST_MAP_KEYS: dict[str, Callable[[dict], object]] = {
    "containers": lambda item: item.get("name"),
    "env": lambda item: item.get("name"),
    "ports": port_key,
    "ownerReferences": lambda item: item.get("uid"),
}

_QUANTITY_MAPS = (("resources", "requests"), ("resources", "limits"))


def covers(desired: object, live: object, path: tuple[str, ...] = ()) -> bool:
    """True when every field of `desired` is in `live` with the same value.

    `path`: the field names leading to `desired` ("[]" for a list item); it
    decides which lists are list-maps and which maps hold quantities.
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        if path[-2:] in _QUANTITY_MAPS:
            return all(key in live and same_quantity(want, live[key])
                       for key, want in desired.items())
        for key, want in desired.items():
            if key not in live:
                return False
            have = live[key]
            # Strings and integers, most of an apply configuration, are compared
            # here rather than by a call each (the same rules as the end of this
            # function: an int never covers or is covered by a bool).
            kind = want.__class__
            if kind is str:
                if want != have:
                    return False
            elif kind is int:
                if have.__class__ is bool or want != have:
                    return False
            elif not covers(want, have, path + (key,)):
                return False
        return True
    if isinstance(desired, list):
        if not isinstance(live, list):
            return False
        key_of_item = LIST_MAP_KEYS.get(path[-1]) if path else None
        if key_of_item is None:
            return len(desired) == len(live) and all(
                covers(d, l, path + ("[]",)) for d, l in zip(desired, live))
        live_index = {}
        for i, item in enumerate(live):
            if isinstance(item, dict):
                live_index.setdefault(key_of_item(item), i)
        positions = []
        for item in desired:
            i = live_index.get(key_of_item(item))
            if i is None or not covers(item, live[i], path + ("[]",)):
                return False
            positions.append(i)
        # Our items must also keep their order: it matters for env, where a
        # value may refer to an earlier variable as $(NAME).
        return positions == sorted(positions)
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live           # True == 1 in Python, not in JSON
    return desired == live


def needs_apply(desired: dict, live: dict | None) -> bool:
    """Whether applying `desired` could change `live` (None: the object is missing).

    Labels, annotations, ownerReferences and every spec field sent must be in
    `live` with the same value. An object lacking the caller's controller
    ownerReference needs an apply: whether the caller may take it over is the
    caller's decision, made before.
    """
    if live is None:
        return True
    return not covers(desired, live, ())


def with_config_hash(obj: dict, annotation: str) -> dict:
    """Stamp `obj` (an apply configuration, changed in place and returned) with a
    hash of everything else in it, in annotation `annotation`."""
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    obj["metadata"].setdefault("annotations", {})[annotation] = digest
    return obj


def config_hash(obj: dict | None, annotation: str) -> str | None:
    """The hash `with_config_hash` stamped on `obj`, or None."""
    annotations = meta_of(obj).get("annotations")
    return annotations.get(annotation) if isinstance(annotations, dict) else None
