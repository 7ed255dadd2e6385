"""An in-memory stand-in for `k8s_http.ApiClient`: the one fake client of the unit tests.

Not an HTTP server (that is `tests/support/fake_apiserver.FakeApiServer`, for the
integration tests): a Python object with the ApiClient methods, over a dict of
objects, that records every call. It answers the way the apiserver does where
a test depends on it, and refuses everything else, so that a test cannot pass
because the fake said yes to a call nobody expected:

- get: the stored object, or 404 NotFound;
- create: 409 AlreadyExists on an existing name; resources given to `answer()`
  (TokenReview, SubjectAccessReview) are answered and not stored, as the
  apiserver does; Events are recorded and not stored (nothing reads them back);
  with `creatable=` any other resource fails the test;
- replace: 409 Conflict on a stale resourceVersion (none sent: unconditional,
  as for the apiserver), 404 on a missing object;
- apply (server-side): needs `field_manager=` at construction and `force=True`;
  fills in the defaults `server_defaults` lists, keeps what others own, and
  moves the resourceVersion only when something changed; `create_only` is
  refused with 409 when the object exists;
- patch: strategic merge only (keyed lists, `$patch: delete`, nulls); any
  other patch type fails the test; `on_write` hooks play a mutating webhook;
- patch_status: replaces `.status`, 404 on a missing object;
- list: the stored objects of that resource, unless `lists` answers instead;
- watch: only what `watches` answers (there is no event history here).

Every call is appended to `calls` as a `Call`, equal to the tuple
(verb, plural, name) and carrying the keyword arguments in `.kwargs`.
resourceVersions come from one counter, as from etcd.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Collection

from k8s_http.core.errors import (AlreadyExistsError, ApiConnectionError, ConflictError,
                                  NotFoundError)
from k8s_http.core.objects import DEPLOYMENTS, EVENTS, SERVICES, ObjectKey, Resource


class Call(tuple):
    """(verb, plural, name), equal to that plain tuple; `.kwargs` holds the call's keywords."""

    kwargs: dict

    def __new__(cls, verb: str, plural: str, name: str, kwargs: dict | None = None) -> "Call":
        call = super().__new__(cls, (verb, plural, name))
        call.kwargs = dict(kwargs or {})
        return call


class InMemoryApiClient:
    """See the module docstring."""

    def __init__(self, *, field_manager: str | None = None,
                 creatable: Collection[Resource] | None = None,
                 first_resource_version: int = 1):
        self.objects: dict[tuple[str, ObjectKey], dict] = {}
        self.calls: list[Call] = []
        self.created: list[tuple[Resource, dict]] = []   # every create() body, in order
        self.field_manager = field_manager
        self.creatable = None if creatable is None else set(creatable)
        self.fail: Exception | None = None         # raised by every call (after recording it)
        self.fail_on: dict[str, Exception] = {}    # verb -> raised by that verb's calls
        self.on_call: Callable[[str], Any] | None = None   # hook(verb) before each call
        self.on_write: list = []                   # hooks(resource, obj) on patch: a webhook
        self.lists: Callable[..., dict] | None = None      # (resource, **kwargs) -> a list
        self.watches: Callable[..., Any] | None = None     # (resource, **kwargs) -> a stream
        self.script: list = []                     # the steps play() has left
        self._answers: dict[Resource, Callable[[dict], dict]] = {}
        self._last_rv = first_resource_version - 1

    # -- setting up

    def next_resource_version(self) -> str:
        self._last_rv += 1
        return str(self._last_rv)

    def put(self, resource: Resource, obj: dict) -> dict:
        """Store `obj` as another writer would, keeping its resourceVersion if it has one."""
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("resourceVersion", self.next_resource_version())
        self.objects[self._key(resource, obj["metadata"]["name"],
                               obj["metadata"].get("namespace"))] = obj
        return obj

    def answer(self, resource: Resource, status: Callable[[dict], dict]) -> None:
        """create() of `resource` returns the body with `status(body)` as its status, unstored."""
        self._answers[resource] = status

    def play(self, steps: list, *, then: Callable[[], Any]) -> None:
        """list() and watch() answer from `steps` in order, each a (verb, answer) pair.

        An answer that is an exception is raised; a watch's list of items becomes
        a `ScriptedWatchStream`. A call of the other verb than the next step's
        fails the test. Once the steps run out, `then()` runs (a test stops its
        loop there) and the call fails as an unreachable apiserver would.
        """
        self.script = list(steps)

        def answer(verb):
            def next_step(resource, **kwargs):
                if not self.script:
                    then()
                    raise ApiConnectionError("script exhausted")
                want, result = self.script.pop(0)
                assert want == verb, (want, verb, kwargs)
                if isinstance(result, BaseException):
                    raise result
                return ScriptedWatchStream(result) if verb == "watch" else result
            return next_step
        self.lists, self.watches = answer("list"), answer("watch")

    # -- the ApiClient surface

    def get(self, resource, name, *, namespace=None, subresource=None):
        assert subresource is None, "the fake has no subresources to read"
        self._call("get", resource, name)
        obj = self.objects.get(self._key(resource, name, namespace))
        if obj is None:
            raise NotFoundError(404, f"{resource.plural} {name!r} not found", reason="NotFound")
        return copy.deepcopy(obj)

    def create(self, resource, obj, *, namespace=None, **_):
        name = obj.get("metadata", {}).get("name", "")
        if self.creatable is not None:
            assert resource in self.creatable, f"unexpected create of {resource.plural}"
        self._check_namespace(resource, obj, namespace)
        self._call("create", resource, name)
        self.created.append((resource, copy.deepcopy(obj)))
        if resource in self._answers:
            return {**copy.deepcopy(obj), "status": self._answers[resource](obj)}
        if resource == EVENTS:
            return obj
        namespace = namespace or obj["metadata"].get("namespace")
        key = self._key(resource, name, namespace)
        if key in self.objects:
            raise AlreadyExistsError(409, f"{resource.plural} {name!r} already exists",
                                     reason="AlreadyExists")
        return self._store(key, obj)

    def replace(self, resource, obj, *, namespace=None):
        name = obj["metadata"]["name"]
        self._check_namespace(resource, obj, namespace)
        self._call("replace", resource, name)
        key = self._key(resource, name, namespace or obj["metadata"].get("namespace"))
        old = self.objects.get(key)
        if old is None:
            raise NotFoundError(404, f"{resource.plural} {name!r} not found", reason="NotFound")
        sent_rv = obj["metadata"].get("resourceVersion")
        if sent_rv is not None and sent_rv != old["metadata"]["resourceVersion"]:
            raise ConflictError(409, "the object has been modified", reason="Conflict")
        return self._store(key, obj)

    def delete(self, resource, name, *, namespace=None, propagation_policy=None,
               preconditions=None):
        """404 if absent; 409 if `preconditions` name another resourceVersion."""
        self._call("delete", resource, name, {"preconditions": preconditions})
        key = self._key(resource, name, namespace)
        old = self.objects.get(key)
        if old is None:
            raise NotFoundError(404, f"{resource.plural} {name!r} not found", reason="NotFound")
        wanted = (preconditions or {}).get("resourceVersion")
        if wanted is not None and wanted != old["metadata"]["resourceVersion"]:
            raise ConflictError(409, "Precondition failed: the resourceVersion differs",
                                reason="Conflict")
        del self.objects[key]
        return {"kind": "Status", "status": "Success"}

    def apply(self, resource, obj, *, field_manager, force=False, namespace=None,
              create_only=False, **_):
        assert self.field_manager is not None, "construct with field_manager= to accept applies"
        assert field_manager == self.field_manager and force is True
        assert obj["metadata"]["namespace"] == namespace
        assert "resourceVersion" not in obj["metadata"]
        name = obj["metadata"]["name"]
        key = self._key(resource, name, namespace)
        old = self.objects.get(key)
        if create_only and old is not None:
            # the apiserver refuses it (409) and changes nothing: not a write
            self.calls.append(Call("apply-refused", resource.plural, name))
            raise ConflictError(409, "the object has been modified", reason="Conflict")
        self._call("apply-create" if create_only else "apply", resource, name, verb="apply")
        new = server_defaults(resource, obj)
        if old is None:
            new["metadata"].update(uid=f"uid-{resource.plural}", generation=1)
            new["status"] = {}
        else:
            # Keep what the server and other managers own; ours replaces ours.
            merged = copy.deepcopy(old)
            merged["metadata"]["labels"] = {**old["metadata"].get("labels", {}),
                                            **new["metadata"]["labels"]}
            merged["metadata"]["annotations"] = {**old["metadata"].get("annotations", {}),
                                                 **new["metadata"]["annotations"]}
            merged["metadata"]["ownerReferences"] = new["metadata"]["ownerReferences"]
            merged["spec"] = new["spec"]
            if merged == old:
                return copy.deepcopy(old)   # no change: same resourceVersion
            if merged["spec"] != old["spec"]:
                merged["metadata"]["generation"] = old["metadata"]["generation"] + 1
            new = merged
        new["metadata"]["resourceVersion"] = self.next_resource_version()
        self.objects[key] = new
        return copy.deepcopy(new)

    def patch(self, resource, name, patch, *, namespace=None, patch_type="merge",
              field_manager=None):
        assert patch_type == "strategic", f"the fake implements no {patch_type!r} patch"
        assert field_manager == self.field_manager
        self._call("patch", resource, name)
        key = self._key(resource, name, namespace)
        old = self.objects.get(key)
        if old is None:
            raise NotFoundError(404, f"{resource.plural} {name!r} not found", reason="NotFound")
        new = strategic_merge(copy.deepcopy(old), patch)
        for hook in self.on_write:
            hook(resource, new)
        if new != old:
            new["metadata"]["resourceVersion"] = self.next_resource_version()
            self.objects[key] = new
        return copy.deepcopy(new)

    def patch_status(self, resource, name, patch, *, namespace=None, patch_type="merge"):
        assert set(patch) == {"status"}, f"a status patch with {sorted(patch)}"
        self._call("patch_status", resource, name)
        obj = self.objects.get(self._key(resource, name, namespace))
        if obj is None:
            raise NotFoundError(404, "gone", reason="NotFound")
        obj["status"] = copy.deepcopy(patch["status"])
        obj["metadata"]["resourceVersion"] = self.next_resource_version()
        return copy.deepcopy(obj)

    def list(self, resource, **kwargs):
        self._call("list", resource, "", kwargs)
        if self.lists is not None:
            return self.lists(resource, **kwargs)
        namespace = kwargs.get("namespace")
        items = [copy.deepcopy(o) for (plural, key), o in self.objects.items()
                 if plural == resource.plural and namespace in (None, key.namespace)]
        # As of the latest revision handed out; never "0", which a watch reads as "any".
        return {"metadata": {"resourceVersion": str(max(self._last_rv, 1))}, "items": items}

    def watch(self, resource, **kwargs):
        self._call("watch", resource, "", kwargs)
        assert self.watches is not None, "a watch the test did not script"
        return self.watches(resource, **kwargs)

    # -- views for assertions

    @property
    def events(self) -> list[dict]:
        """The Events created, in order."""
        return [obj for resource, obj in self.created if resource == EVENTS]

    def verbs(self) -> list[str]:
        return [call[0] for call in self.calls]

    def writes(self) -> list[Call]:
        """Object writes (Events and reviews are not writes of objects)."""
        return [c for c in self.calls if c[0] in ("apply", "apply-create", "patch_status",
                                                  "patch", "replace")
                or (c[0] == "create" and c[1] != EVENTS.plural)]

    def reset(self) -> None:
        self.calls.clear()
        self.created.clear()

    def obj(self, resource: Resource, key: ObjectKey | None = None) -> dict | None:
        """The stored object itself (not a copy): a test may edit it as another writer.

        Without a key: the one object of that resource (None if there is none;
        several fail the test, which then has to say which it means).
        """
        if key is not None:
            return self.objects.get((resource.plural, key))
        found = [o for (plural, _), o in self.objects.items() if plural == resource.plural]
        assert len(found) <= 1, f"{len(found)} {resource.plural}: name the key"
        return found[0] if found else None

    # -- internals

    @staticmethod
    def _key(resource: Resource, name: str, namespace: str | None) -> tuple[str, ObjectKey]:
        return (resource.plural, ObjectKey(namespace, name))

    @staticmethod
    def _check_namespace(resource: Resource, obj: dict, namespace: str | None) -> None:
        """A namespaced object is sent to its own namespace (the apiserver refuses others)."""
        if resource.namespaced:
            assert namespace is not None and obj["metadata"].get("namespace") in (None, namespace), \
                (resource.plural, namespace, obj["metadata"].get("namespace"))

    def _call(self, recorded: str, resource: Resource, name: str, kwargs: dict | None = None,
              *, verb: str | None = None) -> None:
        verb = verb or recorded
        self.calls.append(Call(recorded, resource.plural, name, kwargs))
        if self.on_call is not None:
            self.on_call(verb)
        failure = self.fail_on.get(verb) or self.fail
        if failure is not None:
            raise failure

    def _store(self, key: tuple[str, ObjectKey], obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self.next_resource_version()
        self.objects[key] = obj
        return copy.deepcopy(obj)


class ScriptedWatchStream:
    """A watch stream that yields `items` in order; an exception among them is raised there.

    Given a clock, `silent_for` seconds pass on it after the last event and
    before the stream ends (cleanly, or with its exception): the time a real
    stream spends waiting for bytes that never come. `skipped` is what the
    watcher reads of a decoder's skipped lines (none here).
    """

    def __init__(self, items=(), *, clock=None, silent_for: float = 0.0):
        self.items, self.clock, self.silent_for = list(items), clock, silent_for
        self.closed = False
        self.skipped = 0

    def __iter__(self):
        for item in self.items:
            if isinstance(item, BaseException):
                self._fall_silent()
                raise item
            yield item
        self._fall_silent()

    def _fall_silent(self) -> None:
        if self.silent_for:
            self.clock.advance(self.silent_for)

    def close(self) -> None:
        self.closed = True


# ---------------------------------------------------------------------------
# What the apiserver does to an applied Deployment or Service


# Quantities as the apiserver canonicalises them (only the spellings the tests use).
_CANONICAL = {"1000m": "1", "0.5": "500m", "1024Mi": "1Gi", "2000m": "2", "0.1": "100m"}


def _canonical_quantities(obj: dict) -> None:
    for container in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        for section in (container.get("resources") or {}).values():
            for name, value in section.items():
                section[name] = _CANONICAL.get(value, value)


def server_defaults(resource: Resource, obj: dict) -> dict:
    """What the apiserver adds to an applied child (a copy; other resources come back as sent)."""
    obj = copy.deepcopy(obj)
    if resource not in (DEPLOYMENTS, SERVICES):
        return obj
    spec = obj.setdefault("spec", {})
    if resource == DEPLOYMENTS:
        spec.setdefault("strategy", {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        pod = spec["template"]["spec"]
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("dnsPolicy", "ClusterFirst")
        pod.setdefault("schedulerName", "default-scheduler")
        pod.setdefault("securityContext", {})
        pod.setdefault("terminationGracePeriodSeconds", 30)
        spec["template"]["metadata"].setdefault("creationTimestamp", None)
        for c in pod["containers"]:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("resources", {})
            for p in c.get("ports", []):
                p.setdefault("protocol", "TCP")
        _canonical_quantities(obj)
    else:
        spec.setdefault("clusterIP", "10.0.0.17")
        spec.setdefault("clusterIPs", ["10.0.0.17"])
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        for p in spec["ports"]:
            p.setdefault("protocol", "TCP")
            if spec.get("type") in ("NodePort", "LoadBalancer"):
                p.setdefault("nodePort", 31234)
    return obj


# List items are matched on the first of these keys the patch's items carry.
_MERGE_KEYS = ("name", "containerPort", "port")


def strategic_merge(target, patch):
    """Just enough of a strategic merge patch: keyed lists, `$patch: delete`, nulls."""
    if isinstance(patch, dict) and isinstance(target, dict):
        for k, v in patch.items():
            if v is None:
                target.pop(k, None)
            elif k in target:
                target[k] = strategic_merge(target[k], v)
            else:
                target[k] = copy.deepcopy(v)
        return target
    if isinstance(patch, list) and isinstance(target, list) and patch \
            and all(isinstance(i, dict) for i in patch + target):
        mk = next(k for k in _MERGE_KEYS if k in patch[0])
        for item in patch:
            at = [i for i, t in enumerate(target) if t.get(mk) == item[mk]]
            if item.get("$patch") == "delete":
                target[:] = [t for t in target if t.get(mk) != item[mk]]
            elif at:
                target[at[0]] = strategic_merge(target[at[0]], item)
            else:
                target.append(copy.deepcopy(item))
        return target
    return copy.deepcopy(patch)
