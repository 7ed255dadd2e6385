"""k8s_http against a real kube-apiserver: what no fake server can vouch for.

Each test owns its namespace (the `namespace` fixture). The two apiserver
restart tests restart the shared apiserver, so they come last in this file.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from prometheus_client import CollectorRegistry

from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import load_config
from k8s_http.core.errors import (AlreadyExistsError, ConflictError, ForbiddenError, GoneError,
                                  InvalidError, NotFoundError, UnauthorizedError)
from k8s_http.cache.informer import Informer, own_key
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import (CONFIGMAPS, CRDS, DEPLOYMENTS, NAMESPACES, REPLICASETS, SECRETS,
                                   SERVICEACCOUNTS, ObjectKey, Resource, get_condition,
                                   owner_reference)
from tests.support.wait import eventually

ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", True, "Role")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", True, "RoleBinding")


def configmap(name: str, labels: dict | None = None, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels or {}}, "data": data}


def sample_sum(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels` (0 when none)."""
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


class RecordingQueue:
    """Stands in for a WorkQueue: the informer only calls add(key)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._keys: list[ObjectKey] = []

    def add(self, key: ObjectKey) -> None:
        with self._lock:
            self._keys.append(key)

    def seen(self) -> set[ObjectKey]:
        with self._lock:
            return set(self._keys)


# --------------------------------------------------------------------------- CRD

@pytest.fixture(scope="module")
def gadgets(control_plane, admin_kubeconfig):
    """A CRD with a status subresource, in a group unique to this session.

    Unique, so a leftover from an interrupted run on a reused cluster can never
    collide; deleted at the end of the module.
    """
    client = ApiClient.from_config(load_config(admin_kubeconfig))
    group = f"e2e{uuid.uuid4().hex[:6]}.k8s-http.test"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget",
                      "listKind": "GadgetList"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "properties": {
                            "size": {"type": "integer", "minimum": 0, "default": 1},
                            "color": {"type": "string"}}},
                        "status": {"type": "object", "properties": {
                            "phase": {"type": "string"},
                            "observedGeneration": {"type": "integer"}}},
                    }}},
            }],
        },
    }
    client.create(CRDS, crd)
    resource = Resource(group, "v1", "gadgets", True, "Gadget")
    yield resource, crd["metadata"]["name"]
    try:
        client.delete(CRDS, crd["metadata"]["name"])
    except NotFoundError:
        pass
    client.transport.close()


def test_crd_becomes_established_and_served(api, namespace, gadgets):
    resource, crd_name = gadgets

    def established():
        crd = api.get(CRDS, crd_name)
        cond = get_condition(crd, "Established")
        assert cond is not None, f"no Established condition yet: {crd.get('status')}"
        return cond["status"] == "True" and crd

    crd = eventually(established, timeout=30, message=f"CRD {crd_name} Established")
    assert get_condition(crd, "NamesAccepted")["status"] == "True"
    assert crd["status"]["acceptedNames"]["kind"] == "Gadget"

    # Established means served; discovery may lag a moment behind the condition.
    def served():
        try:
            return api.list(resource, namespace=namespace)
        except NotFoundError as err:
            raise AssertionError(str(err)) from err

    empty = eventually(served, timeout=30, message="gadgets served")
    assert empty["items"] == []
    created = api.create(resource, {"apiVersion": resource.api_version, "kind": "Gadget",
                                    "metadata": {"name": "g"}, "spec": {"color": "red"}},
                         namespace=namespace)
    assert created["spec"] == {"color": "red", "size": 1}   # schema default applied


# --------------------------------------------------------------------------- list

def test_paged_list_merges_every_page(admin_kubeconfig, api, namespace):
    total, labels = 1200, {"e2e/batch": "paged"}
    names = {f"cm-{i:04d}" for i in range(total)}
    # Four writers: the client is shared by a controller's workers, so it must
    # be thread-safe; this also keeps the setup to seconds.
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: api.create(CONFIGMAPS, configmap(n, labels, i=n),
                                           namespace=namespace), sorted(names)))

    registry = CollectorRegistry()
    client = ApiClient.from_config(load_config(admin_kubeconfig), metrics=Metrics(registry))
    try:
        result = client.list(CONFIGMAPS, namespace=namespace, label_selector="e2e/batch=paged",
                             limit=500)
        host = client.transport.host
    finally:
        client.transport.close()

    items = result["items"]
    assert len(items) == total
    assert {i["metadata"]["name"] for i in items} == names      # none twice, none missing
    assert all(i["apiVersion"] == "v1" and i["kind"] == "ConfigMap" for i in items)
    assert result["metadata"]["resourceVersion"]
    assert not result["metadata"].get("continue")
    # 1,200 items at limit=500: exactly three requests (500 + 500 + 200).
    gets = sample_sum(registry, "rest_client_requests_total", method="GET", host=host)
    assert gets == 3, f"expected 3 paged GETs, counted {gets}"


# --------------------------------------------------------------------------- watch

def test_watch_replays_from_resource_version_sends_bookmarks_and_resumes(api, namespace):
    api.create(CONFIGMAPS, configmap("a", v="1"), namespace=namespace)
    rv0 = api.list(CONFIGMAPS, namespace=namespace)["metadata"]["resourceVersion"]
    api.create(CONFIGMAPS, configmap("b", v="1"), namespace=namespace)
    api.patch(CONFIGMAPS, "b", {"data": {"v": "2"}}, namespace=namespace)
    api.delete(CONFIGMAPS, "a", namespace=namespace)

    # The watch cache sends a bookmark 2 s before a watch's deadline (and every
    # minute), but only if its resourceVersion moved past what the watcher has
    # seen -- which is what bookmarks are for: a change to the same resource
    # that this watch's filter (our namespace) hides. So make one, mid-watch.
    other = f"{namespace}-other"
    api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    hidden: list[dict] = []
    writer = threading.Timer(1.0, lambda: hidden.append(
        api.create(CONFIGMAPS, configmap("elsewhere"), namespace=other)))
    try:
        started = time.monotonic()
        with api.watch(CONFIGMAPS, namespace=namespace, resource_version=rv0,
                       allow_bookmarks=True, timeout_seconds=5) as stream:
            writer.start()
            events = list(stream)       # ends when the server closes the watch at 5 s
        elapsed = time.monotonic() - started
        writer.join()
    finally:
        api.delete(NAMESPACES, other)

    changes = [(e.type, e.object["metadata"]["name"]) for e in events if e.type != "BOOKMARK"]
    assert changes == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
    modified = next(e for e in events if e.type == "MODIFIED")
    assert modified.object["data"] == {"v": "2"}
    assert 4.0 <= elapsed < 30, f"the server should end the watch at 5 s, took {elapsed:.1f} s"
    bookmarks = [e for e in events if e.type == "BOOKMARK"]
    assert bookmarks, f"no BOOKMARK in {[e.type for e in events]}"
    assert events[-1].type == "BOOKMARK"          # sent just before the deadline
    bookmark_rv = bookmarks[-1].object["metadata"]["resourceVersion"]
    hidden_rv = hidden[0]["metadata"]["resourceVersion"]
    assert int(bookmark_rv) >= int(hidden_rv), (bookmark_rv, hidden_rv)

    # Resume from the bookmark: only what happened after it, nothing replayed.
    api.create(CONFIGMAPS, configmap("c", v="1"), namespace=namespace)
    with api.watch(CONFIGMAPS, namespace=namespace, resource_version=bookmark_rv,
                   allow_bookmarks=True, timeout_seconds=3) as stream:
        resumed = [(e.type, e.object["metadata"]["name"]) for e in stream if e.type != "BOOKMARK"]
    assert resumed == [("ADDED", "c")]


def test_watch_close_from_another_thread_unblocks_the_reader(api, namespace):
    stream = api.watch(CONFIGMAPS, namespace=namespace, timeout_seconds=60)
    received: list = []
    reader = threading.Thread(target=lambda: [received.append(e) for e in stream], daemon=True)
    reader.start()
    # One event through proves the reader is inside its blocking read loop.
    api.create(CONFIGMAPS, configmap("ping"), namespace=namespace)
    eventually(lambda: any(e.type == "ADDED" for e in received), timeout=10,
               message="the watch delivered nothing")
    stream.close()
    reader.join(timeout=5)
    assert not reader.is_alive(), "WatchStream.close() did not unblock the reading thread"
    assert [(e.type, e.object["metadata"].get("name")) for e in received
            if e.type != "BOOKMARK"] == [("ADDED", "ping")]


# --------------------------------------------------------------------------- apply

def test_server_side_apply_conflicts_without_force_and_wins_with_it(api, namespace):
    alice = api.apply(CONFIGMAPS, configmap("ssa", owner="alice", extra="1"),
                      field_manager="alice", namespace=namespace)
    assert alice["data"] == {"owner": "alice", "extra": "1"}
    managers = {(m["manager"], m["operation"]) for m in alice["metadata"]["managedFields"]}
    assert ("alice", "Apply") in managers

    # Applying the same content again changes nothing (no new resourceVersion).
    again = api.apply(CONFIGMAPS, configmap("ssa", owner="alice", extra="1"),
                      field_manager="alice", namespace=namespace)
    assert again["metadata"]["resourceVersion"] == alice["metadata"]["resourceVersion"]

    with pytest.raises(ConflictError) as conflict:
        api.apply(CONFIGMAPS, configmap("ssa", owner="bob"), field_manager="bob",
                  namespace=namespace)
    err = conflict.value
    assert err.code == 409 and err.reason == "Conflict"
    assert "alice" in str(err) and ".data.owner" in str(err), str(err)
    assert api.get(CONFIGMAPS, "ssa", namespace=namespace)["data"]["owner"] == "alice"

    bob = api.apply(CONFIGMAPS, configmap("ssa", owner="bob"), field_manager="bob",
                    force=True, namespace=namespace)
    assert bob["data"] == {"owner": "bob", "extra": "1"}   # alice keeps what bob did not take
    owned = {m["manager"]: m["fieldsV1"] for m in bob["metadata"]["managedFields"]}
    assert "f:owner" in owned["bob"]["f:data"]
    assert "f:owner" not in owned["alice"]["f:data"] and "f:extra" in owned["alice"]["f:data"]


def test_create_only_apply_creates_a_free_name_and_never_touches_a_taken_one(api, namespace):
    created = api.apply(CONFIGMAPS, configmap("fresh", v="1"), field_manager="e2e",
                        force=True, namespace=namespace, create_only=True)
    assert created["data"] == {"v": "1"}
    managers = [(m["manager"], m["operation"]) for m in created["metadata"]["managedFields"]]
    assert managers == [("e2e", "Apply")]          # a true apply: later applies can prune

    theirs = api.create(CONFIGMAPS, configmap("taken", v="theirs"), namespace=namespace)
    with pytest.raises(ConflictError) as refused:
        api.apply(CONFIGMAPS, configmap("taken", v="ours"), field_manager="e2e", force=True,
                  namespace=namespace, create_only=True)
    assert refused.value.code == 409 and not isinstance(refused.value, AlreadyExistsError)
    after = api.get(CONFIGMAPS, "taken", namespace=namespace)
    assert after["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert after["data"] == {"v": "theirs"}

    # ...nor one we made ourselves: create_only means exactly that.
    with pytest.raises(ConflictError):
        api.apply(CONFIGMAPS, configmap("fresh", v="2"), field_manager="e2e", force=True,
                  namespace=namespace, create_only=True)


def test_dry_run_apply_writes_nothing(api, namespace):
    result = api.apply(CONFIGMAPS, configmap("dry", v="1"), field_manager="e2e",
                       namespace=namespace, dry_run=True)
    assert result["data"] == {"v": "1"}
    with pytest.raises(NotFoundError):
        api.get(CONFIGMAPS, "dry", namespace=namespace)


def test_api_errors_arrive_as_typed_exceptions(api, namespace):
    with pytest.raises(NotFoundError) as missing:
        api.get(CONFIGMAPS, "missing", namespace=namespace)
    assert missing.value.code == 404 and missing.value.reason == "NotFound"

    created = api.create(CONFIGMAPS, configmap("one", v="1"), namespace=namespace)
    with pytest.raises(AlreadyExistsError):
        api.create(CONFIGMAPS, configmap("one", v="1"), namespace=namespace)

    api.patch(CONFIGMAPS, "one", {"data": {"v": "2"}}, namespace=namespace)
    stale = dict(created, data={"v": "3"})            # still carries the old resourceVersion
    with pytest.raises(ConflictError) as conflict:
        api.replace(CONFIGMAPS, stale, namespace=namespace)
    assert not isinstance(conflict.value, AlreadyExistsError)

    with pytest.raises(InvalidError) as invalid:
        api.create(CONFIGMAPS, configmap("Not_A_Valid_Name"), namespace=namespace)
    assert invalid.value.code == 422 and "Not_A_Valid_Name" in str(invalid.value)

    with pytest.raises(ConflictError):               # a uid precondition that does not hold
        api.delete(CONFIGMAPS, "one", namespace=namespace,
                   preconditions={"uid": "00000000-0000-0000-0000-000000000000"})
    api.delete(CONFIGMAPS, "one", namespace=namespace,
               preconditions={"uid": created["metadata"]["uid"]})
    with pytest.raises(NotFoundError):
        api.delete(CONFIGMAPS, "one", namespace=namespace)


# --------------------------------------------------------------------------- status

def test_status_subresource_is_written_only_through_status(api, namespace, gadgets):
    resource, crd_name = gadgets
    eventually(lambda: get_condition(api.get(CRDS, crd_name), "Established"), timeout=30)

    def create():
        try:
            return api.create(resource, {
                "apiVersion": resource.api_version, "kind": "Gadget",
                "metadata": {"name": "g1"}, "spec": {"size": 1},
                "status": {"phase": "ignored-on-create"}}, namespace=namespace)
        except NotFoundError as err:    # discovery catching up with a fresh CRD
            raise AssertionError(str(err)) from err

    created = eventually(create, timeout=30)
    generation = created["metadata"]["generation"]
    assert (created.get("status") or {}).get("phase") is None   # status dropped on create

    patched = api.patch_status(resource, "g1",
                               {"status": {"phase": "Ready", "observedGeneration": generation}},
                               namespace=namespace)
    assert patched["status"] == {"phase": "Ready", "observedGeneration": generation}
    assert patched["metadata"]["generation"] == generation     # status never bumps generation

    # The status endpoint ignores spec; the main endpoint ignores status.
    ignored_spec = api.patch_status(resource, "g1", {"spec": {"size": 5}}, namespace=namespace)
    assert ignored_spec["spec"]["size"] == 1
    main = api.patch(resource, "g1", {"spec": {"size": 2}, "status": {"phase": "Hacked"}},
                     namespace=namespace)
    assert main["spec"]["size"] == 2 and main["status"]["phase"] == "Ready"
    assert main["metadata"]["generation"] == generation + 1

    # replace_status with a stale resourceVersion is a conflict.
    stale = dict(patched, status={"phase": "Stale"})
    with pytest.raises(ConflictError):
        api.replace_status(resource, stale, namespace=namespace)
    fresh = api.get(resource, "g1", namespace=namespace)
    fresh["status"] = {"phase": "Replaced", "observedGeneration": generation + 1}
    assert api.replace_status(resource, fresh, namespace=namespace)["status"]["phase"] == \
        "Replaced"


# --------------------------------------------------------------------------- RBAC

def test_rbac_denial_is_a_forbidden_error_naming_who_and_what(control_plane, api, namespace,
                                                               tmp_path):
    api.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "e2e-nobody"}}, namespace=namespace)
    kubeconfig = control_plane.mint_service_account_kubeconfig(
        namespace, "e2e-nobody", tmp_path / "sa.kubeconfig", expiration_seconds=600)
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    client = ApiClient.from_config(load_config(str(kubeconfig)))
    try:
        with pytest.raises(ForbiddenError) as denied:
            client.list(CONFIGMAPS, namespace=namespace)
        err = denied.value
        assert err.code == 403 and err.reason == "Forbidden"
        text = str(err)
        assert f"system:serviceaccount:{namespace}:e2e-nobody" in text, text
        assert 'cannot list resource "configmaps"' in text, text
        assert f'in the namespace "{namespace}"' in text, text
        assert token not in text and token not in repr(err)

        # The token is good: a Role granting get makes get work (RBAC's cache is
        # eventually consistent, hence the wait), and list stays forbidden.
        api.create(CONFIGMAPS, configmap("visible", v="1"), namespace=namespace)
        api.create(ROLES, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                           "metadata": {"name": "get-configmaps"},
                           "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                                      "verbs": ["get"]}]}, namespace=namespace)
        api.create(ROLEBINDINGS, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "nobody-gets"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "get-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": "e2e-nobody",
                          "namespace": namespace}]}, namespace=namespace)

        def can_get():
            try:
                return client.get(CONFIGMAPS, "visible", namespace=namespace)
            except ForbiddenError as e:
                raise AssertionError(str(e)) from e

        assert eventually(can_get, timeout=30)["data"] == {"v": "1"}
        with pytest.raises(ForbiddenError):
            client.list(CONFIGMAPS, namespace=namespace)
    finally:
        client.transport.close()


def test_revoked_service_account_token_is_an_unauthorized_error(control_plane, api, namespace,
                                                                tmp_path):
    api.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "e2e-revoked"}}, namespace=namespace)
    kubeconfig = control_plane.mint_service_account_kubeconfig(
        namespace, "e2e-revoked", tmp_path / "sa.kubeconfig")
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    client = ApiClient.from_config(load_config(str(kubeconfig)))
    try:
        with pytest.raises(ForbiddenError):       # authenticated, not authorized
            client.get(CONFIGMAPS, "anything", namespace=namespace)
        # A bound token dies with its ServiceAccount.
        api.delete(SERVICEACCOUNTS, "e2e-revoked", namespace=namespace)

        def unauthorized():
            try:
                client.get(CONFIGMAPS, "anything", namespace=namespace)
            except UnauthorizedError as err:
                return err
            except ForbiddenError as err:    # the authenticator's cache has not caught up
                raise AssertionError(str(err)) from err

        err = eventually(unauthorized, timeout=30)
        assert err.code == 401
        assert token not in str(err) and token not in repr(err)
    finally:
        client.transport.close()


# --------------------------------------------------------------------------- controllers

def test_controller_manager_garbage_collects_and_runs_deployments(api, namespace):
    """The launcher's kube-controller-manager does what the operator's e2e relies on."""
    owner = api.create(CONFIGMAPS, configmap("owner"), namespace=namespace)
    child = configmap("child")
    child["metadata"]["ownerReferences"] = [owner_reference(owner)]
    api.create(CONFIGMAPS, child, namespace=namespace)

    labels = {"app": "e2e"}
    api.create(DEPLOYMENTS, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}},
        namespace=namespace)
    # No kubelet: the Pod never runs, but the ReplicaSet proves the controller works.
    eventually(lambda: api.list(REPLICASETS, namespace=namespace)["items"], timeout=60,
               message="the deployment controller made no ReplicaSet")

    api.delete(CONFIGMAPS, "owner", namespace=namespace)

    def child_gone():
        try:
            api.get(CONFIGMAPS, "child", namespace=namespace)
        except NotFoundError:
            return True
        return False

    eventually(child_gone, timeout=60, message="the garbage collector left the child")


# --------------------------------------------------------------------------- informer

class CuttableProxy:
    """A TCP forwarder in front of the apiserver that a test can cut.

    cut() drops every open connection mid-stream (a network blip, a load
    balancer reset) and, until restore(), resets new ones at once, while the
    apiserver itself stays up: the case where the informer's resourceVersion
    is still valid and it must resume without relisting.
    """

    def __init__(self, target_port: int):
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return      # listener closed
            if not self._open.is_set():
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _reset(sock)

    def restore(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._listener.close()
        self.cut()


def _reset(sock: socket.socket) -> None:
    """Close with an RST (linger 0), waking any thread blocked on the socket first."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def kubeconfig_via(admin_kubeconfig: str, port: int, path) -> str:
    """The admin kubeconfig pointed at 127.0.0.1:port (the serving cert covers 127.0.0.1)."""
    config = yaml.safe_load(open(admin_kubeconfig).read())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return str(path)


class InformerHarness:
    """An informer on one namespace's ConfigMaps, with its own metrics registry."""

    def __init__(self, kubeconfig: str, namespace: str):
        self.registry = CollectorRegistry()
        metrics = Metrics(self.registry)
        self.client = ApiClient.from_config(load_config(kubeconfig), metrics=metrics)
        self.informer = Informer(self.client, CONFIGMAPS, namespaces=[namespace], metrics=metrics)
        self.queue = RecordingQueue()
        self.informer.add_handler(own_key, self.queue)

    def names(self) -> set[str]:
        return {o["metadata"]["name"] for o in self.informer.store.list()}

    def metric(self, name: str, **labels: str) -> float:
        return sample_sum(self.registry, name, **labels)

    def relists(self) -> float:
        return self.metric("k8s_http_informer_relists_total")

    def __enter__(self) -> "InformerHarness":
        self.informer.start()
        eventually(self.informer.has_synced, timeout=30, message="informer synced")
        return self

    def __exit__(self, *exc) -> None:
        self.informer.stop()
        self.client.transport.close()


def test_informer_syncs_and_follows_creates_updates_deletes(admin_kubeconfig, api, namespace):
    for i in range(3):
        api.create(CONFIGMAPS, configmap(f"pre-{i}", v="1"), namespace=namespace)
    with InformerHarness(admin_kubeconfig, namespace) as h:
        assert h.names() == {"pre-0", "pre-1", "pre-2"}
        assert {ObjectKey(namespace, f"pre-{i}") for i in range(3)} <= h.queue.seen()
        assert h.metric("k8s_http_cache_objects") == 3

        api.create(CONFIGMAPS, configmap("live", v="1"), namespace=namespace)
        api.patch(CONFIGMAPS, "pre-0", {"data": {"v": "2"}}, namespace=namespace)
        api.delete(CONFIGMAPS, "pre-1", namespace=namespace)
        eventually(lambda: h.names() == {"pre-0", "pre-2", "live"}, timeout=10,
                   message="the cache followed the create and the delete")
        eventually(lambda: h.informer.store.get(ObjectKey(namespace, "pre-0"))["data"] ==
                   {"v": "2"}, timeout=10, message="the cache followed the update")
        assert {ObjectKey(namespace, "live"), ObjectKey(namespace, "pre-1")} <= h.queue.seen()
        cached = h.informer.store.get(ObjectKey(namespace, "pre-0"))
        assert "managedFields" not in cached["metadata"]     # the default transform
        assert h.relists() == 1
        assert h.metric("k8s_http_watch_events_total", type="ADDED") >= 1
        assert h.metric("k8s_http_watch_events_total", type="DELETED") >= 1


def test_informer_resumes_after_a_connection_loss_without_relisting(
        control_plane, admin_kubeconfig, api, namespace, tmp_path):
    api.create(CONFIGMAPS, configmap("before", v="1"), namespace=namespace)
    proxy = CuttableProxy(control_plane.apiserver_port)
    try:
        with InformerHarness(kubeconfig_via(admin_kubeconfig, proxy.port, tmp_path / "kc"),
                             namespace) as h:
            assert h.names() == {"before"}
            proxy.cut()
            eventually(lambda: h.metric("k8s_http_watch_restarts_total") >= 1, timeout=15,
                       message="the informer never noticed its connection was cut")
            # Changes while the informer cannot reach the apiserver: it must see
            # all of them by resuming its watch from the last resourceVersion.
            api.create(CONFIGMAPS, configmap("during", v="1"), namespace=namespace)
            api.patch(CONFIGMAPS, "before", {"data": {"v": "2"}}, namespace=namespace)
            restarts = h.metric("k8s_http_watch_restarts_total")
            eventually(lambda: h.metric("k8s_http_watch_restarts_total") > restarts, timeout=30,
                       message="the informer should retry (and be refused) during the cut")
            assert h.names() == {"before"}, "the proxy should have kept the informer out"
            proxy.restore()
            eventually(lambda: h.names() == {"before", "during"}, timeout=60,
                       message=f"informer caught up after the cut: {sorted(h.names())}")
            eventually(lambda: h.informer.store.get(ObjectKey(namespace, "before"))["data"] ==
                       {"v": "2"}, timeout=10, message="the update made during the cut")
            assert h.relists() == 1, "a dropped connection must re-watch, not relist"
            assert h.metric("k8s_http_watch_restarts_total", reason="gone") == 0
    finally:
        proxy.close()


def test_informer_survives_an_apiserver_restart_without_losing_an_event(
        control_plane, admin_kubeconfig, api, namespace):
    """Kills the session's kube-apiserver (SIGKILL) under the watch and starts it again."""
    for name in ("keep", "doomed"):
        api.create(CONFIGMAPS, configmap(name, v="1"), namespace=namespace)
    with InformerHarness(admin_kubeconfig, namespace) as h:
        assert h.names() == {"keep", "doomed"}
        rv_before = h.informer.watchers[0].resource_version

        control_plane.kill_apiserver()
        eventually(lambda: h.metric("k8s_http_watch_restarts_total") >= 1, timeout=15,
                   message="the informer never noticed the apiserver died")
        assert h.names() == {"keep", "doomed"}       # the cache is kept through the outage
        down_since = time.monotonic()
        control_plane.start_apiserver()
        down_for = time.monotonic() - down_since

        # Written while the informer is still backing off from refused
        # connections: seen only if it resumes (or relists) correctly.
        writer = ApiClient.from_config(load_config(admin_kubeconfig))
        try:
            for i in range(3):
                writer.create(CONFIGMAPS, configmap(f"after-{i}", v="1"), namespace=namespace)
            writer.delete(CONFIGMAPS, "doomed", namespace=namespace)
        finally:
            writer.transport.close()

        expected = {"keep", "after-0", "after-1", "after-2"}
        # Backoff tops out at 30 s (+ jitter) after a few seconds of outage.
        eventually(lambda: h.names() == expected, timeout=90,
                   message=f"informer caught up after the restart (apiserver down "
                           f"{down_for:.1f} s): {sorted(h.names())}")
        assert ObjectKey(namespace, "doomed") in h.queue.seen()

        # A restarted apiserver's watch cache starts at etcd's current revision,
        # so the old resourceVersion is normally "too old" (410) and one relist
        # is right (client-go does the same); if it is still valid, none is.
        # Ask the apiserver the same question the informer asked.
        try:
            with h.client.watch(CONFIGMAPS, namespace=namespace, resource_version=rv_before,
                                timeout_seconds=1) as probe:
                for _ in probe:
                    pass
            relists_expected = 1
        except GoneError:
            relists_expected = 2
        # Which way it went, for `pytest -rP`: both are correct, and both happen.
        restarts = {r: h.metric("k8s_http_watch_restarts_total", reason=r)
                    for r in ("disconnect", "error", "gone", "timeout")}
        print(f"apiserver down {down_for:.1f} s; resourceVersion {rv_before} "
              f"{'still valid' if relists_expected == 1 else 'expired (410)'} after the restart; "
              f"relists {h.relists():.0f}; watch restarts by reason: {restarts}")
        assert h.relists() == relists_expected, (
            f"relists {h.relists()}, expected {relists_expected} (rv {rv_before} "
            f"{'still valid' if relists_expected == 1 else 'expired'} after the restart)")

    # The old, pooled connections of the fixture's client died with the
    # apiserver: a GET must still work (it is retried once on a fresh connection).
    assert api.get(CONFIGMAPS, "keep", namespace=namespace)["metadata"]["name"] == "keep"


def test_informer_relists_once_when_a_restart_expired_its_resource_version(
        control_plane, admin_kubeconfig, api, namespace):
    """The 410 path, made certain: a write to another resource after the informer's
    last event moves etcd's revision past the informer's resourceVersion, so the
    restarted apiserver's watch cache (which starts at etcd's current revision)
    answers its resumed watch with 410. One relist, and what vanished meanwhile
    is delivered as a delete."""
    for name in ("keep", "doomed"):
        api.create(CONFIGMAPS, configmap(name, v="1"), namespace=namespace)
    with InformerHarness(admin_kubeconfig, namespace) as h:
        assert h.names() == {"keep", "doomed"}
        rv_before = h.informer.watchers[0].resource_version
        api.create(SECRETS, {"apiVersion": "v1", "kind": "Secret",
                             "metadata": {"name": "moves-the-revision"}}, namespace=namespace)

        control_plane.restart_apiserver()
        writer = ApiClient.from_config(load_config(admin_kubeconfig))
        try:
            writer.create(CONFIGMAPS, configmap("after", v="1"), namespace=namespace)
            writer.delete(CONFIGMAPS, "doomed", namespace=namespace)
            with pytest.raises(GoneError):       # the premise: the old RV has expired
                with writer.watch(CONFIGMAPS, namespace=namespace, resource_version=rv_before,
                                  timeout_seconds=1) as probe:
                    for _ in probe:
                        pass
        finally:
            writer.transport.close()

        eventually(lambda: h.names() == {"keep", "after"}, timeout=90,
                   message=f"informer caught up after the restart: {sorted(h.names())}")
        assert ObjectKey(namespace, "doomed") in h.queue.seen()
        assert h.relists() == 2, f"expected exactly one relist after the 410, got {h.relists()}"
        eventually(lambda: h.metric("k8s_http_watch_restarts_total", reason="gone") >= 1,
                   timeout=5, message="the 410 should be counted as reason=gone")
