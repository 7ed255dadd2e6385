"""KEP-5866 `shardSelector` on the real kube-apiserver v1.36, gate on and gate off.

What k8s_http.core.shards assumes, held against the server it was written for:
- gate on: the server keeps exactly the objects our FNV-1a 64 of the uid (or
  namespace) puts in the ranges, for lists (from etcd, from the watch cache,
  paginated), streaming lists (`sendInitialEvents=true`, as our watcher
  sends) and live watches, for built-in and custom resources; a built-in
  list echoes our selector verbatim in `metadata.shardInfo.selector`, a
  custom resource's list does not, and no watch event carries it; malformed
  selectors are answered 500; the longest selector our slots can make passes.
- gate off: the parameter is ignored without a word (even a malformed one),
  nothing is echoed, and `keeps` alone gives each member its share; OpenAPI
  v3 still advertises the parameter, so it cannot tell whether the gate is on.

Each class owns its plane (Pod-less, no controller-manager), one at a time.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from k8s_http.core.shards import (
    HASH_SPACE, NAMESPACE, SLOTS, Ranges, fnv1a_64, is_server_filtered, keeps, ranges_of,
    ranges_of_slots)
from tests.support.controlplane import ControlPlane, ControlPlaneError
from tests.support.wait import eventually

CRD = Path(__file__).resolve().parents[2] / "manifests" / "base" / "crd.yaml"
NS = "shards"
FLEET = 300
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
MYS = f"/apis/mine.jp/v1/namespaces/{NS}/my"
MEMBERS = ["my-controller-7d9f8b6c4-x2k9p", "my-controller-7d9f8b6c4-q8m4t",
           "my-controller-7d9f8b6c4-z5n7w"]
HALVES = [Ranges.of([(0, HASH_SPACE // 2)]), Ranges.of([(HASH_SPACE // 2, HASH_SPACE)])]
SOME_RANGES = [
    *HALVES,
    Ranges.of([(0, 1 << 62), (3 << 62, HASH_SPACE)]),        # two spans: `||`
    Ranges.of([(0x1234567890ABCDEF, 0x9000000000000000)]),    # bounds inside a slot
    Ranges.everything(),
    *(ranges_of(m, MEMBERS) for m in MEMBERS),               # what the replicas would ask
]
WATCH_LIST = {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
              "allowWatchBookmarks": "true"}
MALFORMED = "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')"


def _path(path: str, query: dict) -> str:
    return f"{path}?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}"


@pytest.fixture(scope="class")
def plane(request):
    """A plane with the gate as the test class says (its GATE), for that class alone."""
    plane = ControlPlane(pods=False, controller_manager=False,
                         apiserver_args=[f"--feature-gates=ShardedListAndWatch={request.cls.GATE}"])
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="class")
def fleet(plane) -> dict[str, dict[str, str]]:
    """FLEET ConfigMaps and FLEET Mys in NS: {collection path: {name: uid}}."""
    plane.api_request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                      yaml.safe_load(CRD.read_text()))
    plane.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})

    def served() -> bool:
        try:
            return plane.api_request("GET", MYS).get("kind") == "MyList"
        except (ControlPlaneError, ValueError):
            return False     # a plain-text 404 until the CRD is served, 429 while it initializes
    eventually(served, timeout=60, message="the My CRD was never served")

    def create(args):
        path, body = args
        obj = plane.api_request("POST", path, body)
        return path, obj["metadata"]["name"], obj["metadata"]["uid"]

    bodies = [(CONFIGMAPS, {"metadata": {"name": f"cm-{i:03d}"}}) for i in range(FLEET)]
    bodies += [(MYS, {"apiVersion": "mine.jp/v1", "kind": "My", "metadata": {"name": f"my-{i:03d}"},
                      "spec": {"image": "x"}}) for i in range(FLEET)]
    fleet: dict[str, dict[str, str]] = {CONFIGMAPS: {}, MYS: {}}
    with ThreadPoolExecutor(4) as pool:
        for path, name, uid in pool.map(create, bodies):
            fleet[path][name] = uid
    return fleet


def _names_in(uids: dict[str, str], ranges: Ranges) -> set[str]:
    return {name for name, uid in uids.items() if keeps({"metadata": {"uid": uid}}, ranges)}


def _kept_of_all(plane: ControlPlane, path: str, ranges: Ranges) -> set[str]:
    """What our filter keeps of the whole, unfiltered collection."""
    every = plane.api_request("GET", path)["items"]
    return {o["metadata"]["name"] for o in every if keeps(o, ranges)}


class _Watch:
    """One watch request, read a line at a time (no deadline games: a socket timeout)."""

    def __init__(self, plane: ControlPlane, path: str, query: dict, *, timeout: float = 60):
        self._conn = http.client.HTTPSConnection("127.0.0.1", plane.apiserver_port,
                                                 context=plane.admin_ssl_context(), timeout=timeout)
        self._conn.request("GET", _path(path, query), headers={"Accept": "application/json"})
        self.response = self._conn.getresponse()

    def until(self, stop) -> list[dict]:
        """Events up to and including the first for which stop(event) holds."""
        events = []
        while True:
            line = self.response.readline()
            assert line, f"the watch ended before the awaited event; got {len(events)}"
            events.append(json.loads(line))
            if stop(events[-1]):
                return events

    def close(self):
        self._conn.close()


def _initial_end(event: dict) -> bool:
    annotations = event["object"]["metadata"].get("annotations") or {}
    return event["type"] == "BOOKMARK" and annotations.get("k8s.io/initial-events-end") == "true"


class TestGateOn:
    GATE = "true"

    @pytest.mark.parametrize("rv", [None, "0"], ids=["from-etcd", "from-watch-cache"])
    @pytest.mark.parametrize("ranges", SOME_RANGES, ids=lambda r: f"{len(r.spans)}-spans")
    def test_a_list_keeps_what_our_hash_keeps_and_a_builtin_list_echoes_our_selector(
            self, plane, fleet, ranges, rv):
        selector = ranges.shard_selector()
        for path, uids in fleet.items():
            query = {"shardSelector": selector, "resourceVersion": rv}
            page = plane.api_request("GET", _path(path, {k: v for k, v in query.items() if v}))
            expected = _kept_of_all(plane, path, ranges)
            assert {o["metadata"]["name"] for o in page["items"]} == expected
            assert _names_in(uids, ranges) <= expected           # the uids as created
            # Built-in resources say so; custom resources are filtered but silent.
            assert is_server_filtered(page["metadata"], selector) == (path == CONFIGMAPS), \
                page["metadata"]

    def test_the_replicas_shares_are_disjoint_and_cover_the_fleet(self, plane, fleet):
        seen: list[str] = []
        for member in MEMBERS:
            page = plane.api_request("GET", _path(MYS, {
                "shardSelector": ranges_of(member, MEMBERS).shard_selector()}))
            seen += [o["metadata"]["name"] for o in page["items"]]
        every = plane.api_request("GET", MYS)["items"]
        assert sorted(seen) == sorted(o["metadata"]["name"] for o in every)
        assert set(fleet[MYS]) <= set(seen)

    def test_every_page_of_a_paginated_list_is_filtered_and_echoed(self, plane, fleet):
        selector = HALVES[0].shard_selector()
        names, token = [], None
        while True:
            page = plane.api_request("GET", _path(CONFIGMAPS, {
                "shardSelector": selector, "limit": "50", **({"continue": token} if token else {})}))
            assert is_server_filtered(page["metadata"], selector)
            names += [o["metadata"]["name"] for o in page["items"]]
            token = page["metadata"].get("continue")
            if not token:
                break
        assert sorted(names) == sorted(_kept_of_all(plane, CONFIGMAPS, HALVES[0]))

    def test_by_namespace_over_a_cluster_wide_list(self, plane, fleet):
        namespaces = [f"team-{c}" for c in "abcdefgh"]
        for ns in namespaces:
            plane.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            plane.api_request("POST", f"/api/v1/namespaces/{ns}/configmaps",
                              {"metadata": {"name": "probe"}})
        for ranges in HALVES:
            selector = ranges.shard_selector(NAMESPACE)
            page = plane.api_request("GET", _path("/api/v1/configmaps", {
                "shardSelector": selector, "fieldSelector": "metadata.name=probe"}))
            assert is_server_filtered(page["metadata"], selector)
            assert sorted(o["metadata"]["namespace"] for o in page["items"]) == \
                [ns for ns in namespaces if keeps({"metadata": {"namespace": ns}}, ranges, NAMESPACE)]
        # FNV-1a's top bits hardly move with a name's last character: these
        # eight namespaces all land in one half (docs/SHARDING.md).
        assert len({fnv1a_64(ns) >> 63 for ns in namespaces}) == 1

    @pytest.mark.parametrize("path", [CONFIGMAPS, MYS], ids=["configmaps", "my"])
    def test_a_streaming_list_then_the_watch_carry_only_the_range_and_no_shard_info(
            self, plane, fleet, path):
        ranges = HALVES[1]
        watch = _Watch(plane, path, {**WATCH_LIST, "shardSelector": ranges.shard_selector()})
        try:
            assert watch.response.status == 200
            initial = watch.until(_initial_end)
            added = {e["object"]["metadata"]["name"] for e in initial if e["type"] == "ADDED"}
            assert added == _kept_of_all(plane, path, ranges)
            assert "shardInfo" not in json.dumps(initial[-1])      # the bookmark says nothing

            # Live: create until one lands in the range; every event before it
            # (in resourceVersion order) must be one of ours in the range.
            created: dict[str, str] = {}
            while not created or not keeps({"metadata": {"uid": uid}}, ranges):
                name = f"live-{len(created):03d}"
                body = {"metadata": {"name": name}}
                if path == MYS:
                    body.update(apiVersion="mine.jp/v1", kind="My", spec={"image": "x"})
                uid = plane.api_request("POST", path, body)["metadata"]["uid"]
                created[name] = uid
            live = watch.until(lambda e: e["object"]["metadata"].get("name") == name)
            got = [e["object"]["metadata"]["name"] for e in live if e["type"] != "BOOKMARK"]
            assert sorted(got) == sorted(_names_in(created, ranges))
            assert len(created) == 1 or len(got) < len(created)
        finally:
            watch.close()

    def test_a_malformed_selector_is_a_500_on_list_and_watch(self, plane, fleet):
        # A 500 (not 400): a client retrying 5xx would retry it forever, so only
        # shards.Ranges writes selectors, in the server's canonical spelling.
        with pytest.raises(ControlPlaneError, match=r"500 .*16-digit hex"):
            plane.api_request("GET", _path(CONFIGMAPS, {"shardSelector": MALFORMED}))
        watch = _Watch(plane, CONFIGMAPS, {**WATCH_LIST, "shardSelector": MALFORMED})
        try:
            assert watch.response.status == 500
        finally:
            watch.close()

    def test_the_longest_selector_our_slots_can_make_is_accepted(self, plane, fleet):
        every_other = ranges_of_slots(range(0, SLOTS, 2))
        assert len(every_other.spans) == SLOTS // 2
        selector = every_other.shard_selector()
        page = plane.api_request("GET", _path(MYS, {"shardSelector": selector}))
        assert {o["metadata"]["name"] for o in page["items"]} == _kept_of_all(plane, MYS, every_other)
        assert len(_path(MYS, {"shardSelector": selector})) < 16 * 1024


class TestGateOff:
    GATE = "false"

    @pytest.mark.parametrize("path", [CONFIGMAPS, MYS], ids=["configmaps", "my"])
    def test_the_selector_is_ignored_silently_and_our_filter_gives_the_share(
            self, plane, fleet, path):
        selector = HALVES[0].shard_selector()
        page = plane.api_request("GET", _path(path, {"shardSelector": selector}))
        assert len(page["items"]) == FLEET
        assert not is_server_filtered(page["metadata"], selector)
        kept = {o["metadata"]["name"] for o in page["items"] if keeps(o, HALVES[0])}
        assert kept == _names_in(fleet[path], HALVES[0])
        assert 0 < len(kept) < FLEET

    def test_even_a_malformed_selector_is_ignored(self, plane, fleet):
        page = plane.api_request("GET", _path(CONFIGMAPS, {"shardSelector": MALFORMED}))
        assert len(page["items"]) == FLEET and "shardInfo" not in page["metadata"]

    def test_a_streaming_list_is_unfiltered(self, plane, fleet):
        watch = _Watch(plane, MYS, {**WATCH_LIST, "shardSelector": HALVES[0].shard_selector()})
        try:
            initial = watch.until(_initial_end)
            assert sum(e["type"] == "ADDED" for e in initial) == FLEET
        finally:
            watch.close()

    def test_openapi_advertises_the_parameter_anyway(self, plane, fleet):
        # So OpenAPI cannot tell a client whether the gate is on (the KEP suggests it could).
        assert "shardSelector" in json.dumps(plane.api_request("GET", "/openapi/v3/api/v1"))
