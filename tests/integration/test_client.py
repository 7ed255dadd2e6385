"""ApiClient against the fake apiserver over TLS: verbs, paging, watches and their faults."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from k8s_http.core import errors
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig, StaticToken
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import CONFIGMAPS, DEPLOYMENTS, NAMESPACES
from k8s_http.wire.watchproto import WatchDecodeError
from tests.support.fake_apiserver import (
    LAST_CHUNK, TOKEN, call, chunk, http_head, raw, status, status_body, trickle,
    watch_line,
)
from tests.support.wait import eventually

CM = CONFIGMAPS.path("default")


@pytest.fixture
def client(server, pki):
    config = ClusterConfig(server=server.url, ca_data=pki.ca_pem, credentials=StaticToken(TOKEN))
    with ApiClient.from_config(config, metrics=Metrics(), sleep=lambda s: None) as c:
        yield c


def cm(name: str, **data) -> dict:
    return {"metadata": {"name": name, "namespace": "default"}, "data": data}


# ---------------------------------------------------------------------------
# Verbs


def test_create_get_replace_with_precondition(server, client):
    created = client.create(CONFIGMAPS, cm("a", k="1"))
    assert created["metadata"]["resourceVersion"] and created["kind"] == "ConfigMap"
    with pytest.raises(errors.AlreadyExistsError):
        client.create(CONFIGMAPS, cm("a"))

    got = client.get(CONFIGMAPS, "a", namespace="default")
    assert got["data"] == {"k": "1"}
    got["data"]["k"] = "2"
    replaced = client.replace(CONFIGMAPS, got)
    assert replaced["data"] == {"k": "2"}
    # `got` still carries the old resourceVersion: the precondition fails.
    got["data"]["k"] = "3"
    with pytest.raises(errors.ConflictError) as info:
        client.replace(CONFIGMAPS, got)
    assert not isinstance(info.value, errors.AlreadyExistsError)
    assert server.get_object(CONFIGMAPS.path("default", "a"))["data"] == {"k": "2"}
    put = server.requests_for("PUT")[0]
    assert put.path == CONFIGMAPS.path("default", "a")
    assert put.json()["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_dry_run_create_stores_nothing(server, client):
    out = client.create(CONFIGMAPS, cm("dry"), dry_run=True, field_manager="me")
    assert out["metadata"]["name"] == "dry"
    assert server.objects(CM) == []
    (post,) = server.requests_for("POST")
    assert post.query == {"dryRun": "All", "fieldManager": "me"}


@pytest.mark.parametrize("patch_type,content_type,patch", [
    ("merge", "application/merge-patch+json", {"data": {"b": "2"}}),
    ("strategic", "application/strategic-merge-patch+json", {"data": {"b": "2"}}),
    ("json", "application/json-patch+json", [{"op": "add", "path": "/data/b", "value": "2"}]),
])
def test_patch_types(server, client, patch_type, content_type, patch):
    server.create_object(CM, cm("p", a="1"))
    out = client.patch(CONFIGMAPS, "p", patch, namespace="default", patch_type=patch_type,
                       field_manager="mgr")
    assert out["data"] == {"a": "1", "b": "2"}
    (req,) = server.requests_for("PATCH")
    assert req.headers["content-type"] == content_type
    assert req.query == {"fieldManager": "mgr"}
    assert req.json() == patch


def test_unknown_patch_type_is_refused_locally(server, client):
    with pytest.raises(ValueError):
        client.patch(CONFIGMAPS, "p", {}, namespace="default", patch_type="yaml")
    assert server.requests == []


def test_server_side_apply(server, client):
    intent = {"metadata": {"name": "web", "namespace": "default",
                           "labels": {"app.kubernetes.io/managed-by": "my-controller"}},
              "spec": {"replicas": 2}}
    out = client.apply(DEPLOYMENTS, intent, field_manager="my-controller", force=True)
    assert out["spec"] == {"replicas": 2}
    client.apply(DEPLOYMENTS, intent, field_manager="my-controller", dry_run=True)
    first, second = server.requests_for("PATCH")
    assert first.path == "/apis/apps/v1/namespaces/default/deployments/web"
    assert first.headers["content-type"] == "application/apply-patch+yaml"
    assert first.query == {"fieldManager": "my-controller", "force": "true"}
    assert second.query == {"fieldManager": "my-controller", "dryRun": "All"}
    body = first.json()          # JSON (which is YAML), with apiVersion and kind filled in
    assert body["apiVersion"] == "apps/v1" and body["kind"] == "Deployment"
    with pytest.raises(ValueError):
        client.apply(DEPLOYMENTS, intent, field_manager="")


def test_status_subresource_writes(server, client):
    server.create_object(CM, {**cm("s"), "status": {"phase": "old"}})
    out = client.patch_status(CONFIGMAPS, "s", {"status": {"phase": "new"}}, namespace="default")
    assert out["status"] == {"phase": "new"}
    out["status"]["phase"] = "newer"
    out["data"] = {"ignored": "by /status"}
    out = client.replace_status(CONFIGMAPS, out)
    assert out["status"] == {"phase": "newer"} and out["data"] == {}
    assert [r.path for r in server.requests] == [CONFIGMAPS.path("default", "s", "status")] * 2


def test_delete_sends_delete_options(server, client):
    created = server.create_object(CM, cm("d"))
    with pytest.raises(errors.ConflictError):
        client.delete(CONFIGMAPS, "d", namespace="default", preconditions={"uid": "not-it"})
    out = client.delete(CONFIGMAPS, "d", namespace="default", propagation_policy="Foreground",
                        preconditions={"uid": created["metadata"]["uid"]})
    assert out["metadata"]["name"] == "d"
    body = server.requests_for("DELETE")[-1].json()
    assert body == {"kind": "DeleteOptions", "apiVersion": "v1",
                    "propagationPolicy": "Foreground",
                    "preconditions": {"uid": created["metadata"]["uid"]}}
    with pytest.raises(errors.NotFoundError):
        client.get(CONFIGMAPS, "d", namespace="default")


def test_cluster_scoped_and_namespace_checks(server, client):
    client.create(NAMESPACES, {"metadata": {"name": "team-a"}})
    assert client.get(NAMESPACES, "team-a")["metadata"]["name"] == "team-a"
    assert server.requests[0].path == "/api/v1/namespaces"
    with pytest.raises(ValueError, match="namespaced"):
        client.get(CONFIGMAPS, "x")


def test_write_guard_refuses_every_write(server, client):
    server.create_object(CM, cm("g"))
    calls = []

    def guard():
        calls.append(1)
        raise errors.NotLeaderError("lease lost")

    client.write_guard = guard
    writes = [
        lambda: client.create(CONFIGMAPS, cm("new")),
        lambda: client.replace(CONFIGMAPS, cm("g")),
        lambda: client.patch(CONFIGMAPS, "g", {"data": {}}, namespace="default"),
        lambda: client.apply(CONFIGMAPS, cm("g"), field_manager="m"),
        lambda: client.patch_status(CONFIGMAPS, "g", {"status": {}}, namespace="default"),
        lambda: client.replace_status(CONFIGMAPS, cm("g")),
        lambda: client.delete(CONFIGMAPS, "g", namespace="default"),
    ]
    for write in writes:
        with pytest.raises(errors.NotLeaderError):
            write()
    assert len(calls) == len(writes)
    assert server.requests == []
    # Reads are not guarded.
    assert client.get(CONFIGMAPS, "g", namespace="default")["metadata"]["name"] == "g"
    client.write_guard = lambda: calls.append(2)
    client.create(CONFIGMAPS, cm("allowed"))
    assert calls[-1] == 2


# ---------------------------------------------------------------------------
# Paged lists


@pytest.fixture
def many(server):
    for i in range(1200):
        server.create_object(CM, {"apiVersion": "v1", "kind": "ConfigMap",
                                  **cm(f"cm-{i:04d}", i=str(i))})
    return 1200


def test_list_merges_pages_and_fills_kind(server, client, many):
    result = client.list(CONFIGMAPS, namespace="default", limit=500)
    items = result["items"]
    assert len(items) == many
    assert len({o["metadata"]["name"] for o in items}) == many
    assert all(o["apiVersion"] == "v1" and o["kind"] == "ConfigMap" for o in items)
    assert result["kind"] == "ConfigMapList"
    assert result["metadata"]["resourceVersion"] == server.resource_version
    reqs = server.requests_for("GET", CM)
    assert [r.query.get("limit") for r in reqs] == ["500"] * 3
    assert "continue" not in reqs[0].query
    assert all(r.query.get("continue") for r in reqs[1:])


def test_expired_continue_token_falls_back_to_one_full_list(server, client, many):
    # The second page's token expires just before it is used (etcd compacted).
    server.script(call(lambda req: server.expire_continue_tokens()),
                  match=lambda req: "continue" in req.query)
    result = client.list(CONFIGMAPS, namespace="default", limit=500, label_selector="")
    assert len(result["items"]) == many
    assert len({o["metadata"]["name"] for o in result["items"]}) == many   # no page twice
    first, expired, full = server.requests_for("GET", CM)
    assert first.query.get("limit") == "500"
    assert "continue" in expired.query
    assert "continue" not in full.query and "limit" not in full.query


def test_410_on_the_first_page_is_raised(server, client):
    server.script(status(410, "Expired", "too old resource version: 1 (5)"))
    with pytest.raises(errors.GoneError):
        client.list(CONFIGMAPS, namespace="default", resource_version="1")
    assert len(server.requests) == 1


def test_list_selectors_are_sent_and_applied(server, client):
    server.create_object(CM, {"metadata": {"name": "mine", "labels": {"owner": "me"}}})
    server.create_object(CM, {"metadata": {"name": "theirs", "labels": {"owner": "you"}}})
    result = client.list(CONFIGMAPS, namespace="default", label_selector="owner=me",
                         field_selector="metadata.name=mine")
    assert [o["metadata"]["name"] for o in result["items"]] == ["mine"]
    assert server.requests[0].query["labelSelector"] == "owner=me"


# ---------------------------------------------------------------------------
# Watches


def _events(n: int) -> list[dict]:
    # Multi-byte UTF-8 in every event, so random splits land inside characters.
    return [{"type": "ADDED", "object": {"metadata": {"name": f"obj-{i}", "resourceVersion":
                                                      str(i + 1)},
                                         "data": {"text": "grüße ✓ 😀 " * (i % 4)}}}
            for i in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_watch_split_at_random_offsets_is_decoded_exactly_once(server, client, seed):
    rng = random.Random(seed)
    events = _events(40)
    payload = b"".join(json.dumps(e, ensure_ascii=False).encode() + b"\n" for e in events)
    body, i = b"", 0
    while i < len(payload):                     # random chunk sizes
        n = rng.randint(1, 64)
        body += chunk(payload[i:i + n])
        i += n
    body += LAST_CHUNK
    cuts = sorted(rng.sample(range(1, len(body)), 30))    # random TCP segment boundaries
    pieces = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
    server.script(raw(http_head(200, chunked=True), *pieces, delay_seconds=0.002))
    with client.watch(CONFIGMAPS, namespace="default", resource_version="0") as w:
        got = [(e.type, e.object) for e in w]
    assert got == [(e["type"], e["object"]) for e in events]


def test_watch_query_resume_bookmarks_and_clean_end(server, client):
    server.create_object(CM, {"metadata": {"name": "before", "labels": {"app": "x"}}})
    since = server.resource_version
    server.create_object(CM, {"metadata": {"name": "after", "labels": {"app": "x"}}})
    server.create_object(CM, {"metadata": {"name": "unlabelled"}})
    w = client.watch(CONFIGMAPS, namespace="default", label_selector="app=x",
                     resource_version=since, timeout_seconds=300)
    it = iter(w)
    first = next(it)
    assert (first.type, first.object["metadata"]["name"]) == ("ADDED", "after")
    server.bookmark()
    bookmark = next(it)
    assert bookmark.type == "BOOKMARK"
    assert bookmark.object["metadata"]["resourceVersion"] == server.resource_version
    server.update_object(CM, {"metadata": {"name": "after", "labels": {"app": "x"}},
                              "data": {"v": "2"}})
    modified = next(it)
    assert modified.type == "MODIFIED" and modified.object["data"] == {"v": "2"}
    server.end_watches()                         # as when timeoutSeconds runs out
    assert list(it) == []
    (req,) = server.requests
    assert req.query == {"watch": "1", "labelSelector": "app=x", "resourceVersion": since,
                         "allowWatchBookmarks": "true", "timeoutSeconds": "300"}


def test_watch_error_event_410_raises_gone(server, client):
    server.create_object(CM, cm("x"))
    old = server.resource_version
    server.create_object(CM, cm("y"))
    server.compact()
    with pytest.raises(errors.GoneError):
        for _ in client.watch(CONFIGMAPS, namespace="default", resource_version=old):
            pass


@pytest.mark.parametrize("status_obj,expected", [
    (status_body(500, "InternalError", "boom"), errors.ServerError),
    ({"kind": "Status", "status": "Failure"}, errors.ServerError),    # no code at all
    (status_body(504, "Timeout", "Too large resource version"), errors.ServerError),
])
def test_watch_error_events_are_typed(server, client, status_obj, expected):
    server.script(raw(http_head(200, chunked=True), chunk(watch_line("ERROR", status_obj)),
                      LAST_CHUNK))
    with pytest.raises(expected) as info:
        list(client.watch(CONFIGMAPS, namespace="default"))
    if status_obj.get("code") == 504:
        assert errors.is_too_large_resource_version(info.value)


def test_watch_stall_with_silence(server, client):
    line = watch_line("ADDED", cm("one"))
    server.script(raw(http_head(200, chunked=True), chunk(line), close_after=False))
    w = client.watch(CONFIGMAPS, namespace="default", stall_timeout_seconds=0.4)
    it = iter(w)
    assert next(it).object["metadata"]["name"] == "one"
    started = time.monotonic()
    with pytest.raises(errors.ApiTimeoutError, match="no complete event"):
        next(it)
    assert 0.3 < time.monotonic() - started < 2.5


def test_watch_stall_with_bytes_trickling_in(server, client):
    # Bytes keep arriving (each its own chunk), but never a whole event.
    partial = b'{"type":"ADDED","object":{"metadata":{"name":"' + b"x" * 500
    body = http_head(200, chunked=True) + b"".join(chunk(bytes([c])) for c in partial)
    server.script(trickle(body, interval_seconds=0.005, step=6))
    w = client.watch(CONFIGMAPS, namespace="default", stall_timeout_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(errors.ApiTimeoutError):
        list(w)
    assert time.monotonic() - started < 2.0      # the trickle itself would last ~3 s


def test_watch_disconnect_mid_event(server, client):
    line1, line2 = watch_line("ADDED", cm("one")), watch_line("ADDED", cm("two"))
    server.script(raw(http_head(200, chunked=True), chunk(line1), chunk(line2[:20])))
    got = []
    with pytest.raises(errors.ApiConnectionError):
        for event in client.watch(CONFIGMAPS, namespace="default"):
            got.append(event.object["metadata"]["name"])
    assert got == ["one"]


def test_watch_dropped_by_the_server_between_events(server, client):
    w = client.watch(CONFIGMAPS, namespace="default", resource_version="0")
    it = iter(w)
    server.create_object(CM, cm("one"))
    assert next(it).object["metadata"]["name"] == "one"
    server.drop_watches()
    with pytest.raises(errors.ApiConnectionError):
        next(it)


@pytest.mark.parametrize("framing", [
    b"0x1a\r\n", b"1_0\r\n", b"-5\r\n", b"zz\r\n", b"5\r\n{}\n\n\nXX", b"123456789\r\n",
])
def test_watch_malformed_chunk_framing_is_a_protocol_error(server, client, framing):
    good = watch_line("ADDED", cm("one"))
    server.script(raw(http_head(200, chunked=True), chunk(good), framing, close_after=False))
    got = []
    with pytest.raises(errors.ProtocolError):
        for event in client.watch(CONFIGMAPS, namespace="default", stall_timeout_seconds=5):
            got.append(event)
    assert len(got) == 1


@pytest.mark.parametrize("line,kind", [
    (b"not json\n", "json"), (b"[1,2]\n", "not_object"), (b"\xff\xfe{}\n", "utf8"),
    (b"[" * 100000 + b"\n", "json"),
])
def test_watch_malformed_lines(server, client, line, kind):
    server.script(raw(http_head(200, chunked=True), chunk(line), LAST_CHUNK))
    with pytest.raises(WatchDecodeError) as info:
        list(client.watch(CONFIGMAPS, namespace="default"))
    assert info.value.kind == kind


def test_watch_close_from_another_thread_ends_iteration(server, client):
    w = client.watch(CONFIGMAPS, namespace="default", stall_timeout_seconds=30)
    done = threading.Event()
    got = []

    def consume():
        got.extend(w)
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    eventually(lambda: server.active_watches == 1)
    w.close()
    assert done.wait(5), "close() did not unblock the reader"
    assert got == []


def test_unknown_event_types_are_skipped_and_counted(server, client):
    server.script(raw(http_head(200, chunked=True),
                      chunk(watch_line("SURPRISE", cm("x")) + watch_line("ADDED", cm("y"))),
                      LAST_CHUNK))
    w = client.watch(CONFIGMAPS, namespace="default")
    assert [e.object["metadata"]["name"] for e in w] == ["y"]
    assert w.skipped == 1
