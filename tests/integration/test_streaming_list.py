"""The streaming list (WatchList) against the fake apiserver, in its three moods.

`support`: as Kubernetes >= 1.34, the informer lists by one watch request whose
initial events end with the k8s.io/initial-events-end bookmark. `ignore`: an
apiserver that does not know the parameters (a plain watch, no end bookmark).
`refuse`: 422, as 1.27-1.33 with the WatchList gate off. What the informer did
on the wire is asserted from the server's request log.
"""

from __future__ import annotations

import pytest

from k8s_http.core.objects import DEPLOYMENTS, ObjectKey
from k8s_http.cache.watchstep import Watching
from tests.integration.test_informer import (NS, PATH, deployment, is_watch, lists, running,
                                             sample, synced)
from tests.support.fake_apiserver import (FakeApiServer, call, chunk, http_head, raw, sequence,
                                          stall, status_body, watch_line)
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(60)


def is_streaming(req):
    return is_watch(req) and req.query.get("sendInitialEvents") == "true"


def streams(server):
    return [r for r in server.requests if is_streaming(r)]


def streaming(server, **kwargs):
    """test_informer's informer, listing by streaming unless told otherwise."""
    return running(server, **{"streaming_list": True, **kwargs})


def seeded(server, *names):
    for name in names:
        server.create_object(PATH, deployment(name))
    return server


def names(informer):
    return sorted(k.name for k in informer.store.keys())


def gone_event():
    return {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version")}


# ---- an apiserver that streams lists ------------------------------------------------

def test_start_up_streams_the_list_in_one_request_and_the_watch_goes_on_on_it():
    with seeded(FakeApiServer(), "a", "b", "c") as server:
        with streaming(server) as (informer, rec, metrics):
            synced(informer)
            assert names(informer) == ["a", "b", "c"]
            assert {k.name for k in rec.keys} == {"a", "b", "c"}
            # The cache transform ran on streamed objects too.
            assert "managedFields" not in informer.store.get(ObjectKey(NS, "a"))["metadata"]
            (req,) = [r for r in server.requests if is_watch(r)]
            assert req.query["sendInitialEvents"] == "true"
            assert req.query["resourceVersionMatch"] == "NotOlderThan"
            assert req.query["allowWatchBookmarks"] == "true"
            assert "resourceVersion" not in req.query            # the current state
            assert lists(server) == []
            # Changes come over the same stream: no second request.
            server.create_object(PATH, deployment("d"))
            eventually(lambda: names(informer) == ["a", "b", "c", "d"])
            assert len([r for r in server.requests if is_watch(r)]) == 1
            watcher = informer.watchers[0]
            assert isinstance(watcher.state, Watching) and watcher.state.stream
            assert sample(metrics, "k8s_http_cache_objects") == 4
            assert sample(metrics, "k8s_http_informer_relists_total") == 1


def test_relist_after_410_streams_not_older_than_the_last_rv_and_deletes_what_vanished():
    with seeded(FakeApiServer(), "a", "b", "c") as server:
        with streaming(server) as (informer, rec, metrics):
            synced(informer)
            last_rv = server.resource_version
            # b is deleted while the watcher relists: the new set comes without it.
            server.script(call(lambda req: server.delete_object(DEPLOYMENTS.path(NS, "b"))),
                          match=lambda r: is_streaming(r) and r.query.get("resourceVersion"))
            rec.clear()
            server.inject_watch_event(gone_event())
            eventually(lambda: names(informer) == ["a", "c"], message="b never vanished")
            first, relist = streams(server)
            assert relist.query["resourceVersion"] == last_rv
            assert lists(server) == []
            # Handlers see the vanished key (once: one-way, no DELETED echo) and the
            # listed ones; the gauge follows.
            eventually(lambda: {k.name for k in rec.keys} == {"a", "b", "c"})
            assert rec.count(ObjectKey(NS, "b")) == 1
            assert sample(metrics, "k8s_http_cache_objects") == 2
            assert sample(metrics, "k8s_http_informer_relists_total") == 2


def test_410_during_the_initial_stream_streams_again_from_the_current_state():
    with FakeApiServer() as server:
        server.create_object(PATH, deployment("a"))
        with streaming(server) as (informer, _, _):
            synced(informer)
            # The relist's stream from RV gets one object, then expires.
            server.script(raw(http_head(200, chunked=True),
                              chunk(watch_line("ADDED", server.get_object(
                                  DEPLOYMENTS.path(NS, "a")))),
                              chunk(watch_line("ERROR", gone_event()["object"]))),
                          match=lambda r: is_streaming(r) and r.query.get("resourceVersion"))
            server.create_object(PATH, deployment("b"))
            eventually(lambda: names(informer) == ["a", "b"])
            server.inject_watch_event(gone_event())
            eventually(lambda: len(streams(server)) == 3)
            third = streams(server)[2]
            assert "resourceVersion" not in third.query
            eventually(lambda: isinstance(informer.watchers[0].state, Watching))
            assert names(informer) == ["a", "b"]
            assert informer.watchers[0].state.stream


def test_a_stall_during_the_initial_stream_counts_and_readyz_waits_for_the_end_bookmark():
    with FakeApiServer() as server:
        a = server.create_object(PATH, deployment("a"))
        # The first stream sends one object, then nothing: a stall.
        server.script(sequence(raw(http_head(200, chunked=True), chunk(watch_line("ADDED", a)),
                                   close_after=False), stall(None)), match=is_streaming)
        with streaming(server, stall_timeout_seconds=0.3) as (informer, _, metrics):
            eventually(lambda: sample(metrics, "k8s_http_watch_restarts_total",
                                      reason="stall") == 1, message="the stall never counted")
            synced(informer)                   # by the second stream, at its end bookmark
            assert len(streams(server)) == 2 and lists(server) == []
            assert names(informer) == ["a"]
            assert informer.stalls() == 0 and informer.is_healthy() == (True, "ok")
            assert informer.watchers[0].state.stream


def test_initial_streams_that_stall_twice_fall_back_to_a_paged_list_before_liveness_fails():
    """An apiserver that ignores the parameters and sends no bookmarks (some
    aggregated APIs): its streams go silent after the state. Streaming again would
    stall for ever; two stalls in a row fall back instead."""
    with FakeApiServer() as server:
        a = server.create_object(PATH, deployment("a"))
        silent = server.script(sequence(raw(http_head(200, chunked=True),
                                            chunk(watch_line("ADDED", a)), close_after=False),
                                        stall(None)), match=is_streaming, times=None)
        with streaming(server, stall_timeout_seconds=0.3) as (informer, _, metrics):
            synced(informer)
            assert silent.hits == 2 and len(lists(server)) == 1
            # Two stalled streams; the plain watch after the paged list is silent
            # too (this fake sends no bookmarks), so on a loaded machine it may
            # have stalled and been resumed as well by the time this is read.
            assert sample(metrics, "k8s_http_watch_restarts_total", reason="stall") >= 2
            assert names(informer) == ["a"]
            watcher = informer.watchers[0]
            eventually(lambda: isinstance(watcher.state, Watching))
            assert not watcher.state.stream and informer.is_healthy() == (True, "ok")


# ---- an apiserver that ignores the parameters -----------------------------------------

def test_ignored_parameters_fall_back_at_the_first_plain_bookmark_and_stay_paged():
    with seeded(FakeApiServer(watch_list="ignore"), "a", "b") as server:
        with streaming(server) as (informer, _, _):
            eventually(lambda: streams(server) and server.active_watches == 1)
            assert not informer.has_synced()    # the ADDED events alone prove nothing
            server.bookmark()                   # an old apiserver's periodic bookmark
            synced(informer)
            assert names(informer) == ["a", "b"]
            assert len(lists(server)) == 1
            # The cache is filled before the watcher adopts its next state.
            eventually(lambda: isinstance(informer.watchers[0].state, Watching))
            # A relist after 410 is paged: the fallback is remembered.
            server.inject_watch_event(gone_event())
            eventually(lambda: len(lists(server)) == 2)
            assert len(streams(server)) == 1


def test_ignored_parameters_fall_back_when_the_stream_ends_before_the_end_bookmark():
    with FakeApiServer(watch_list="ignore") as server:
        server.create_object(PATH, deployment("a"))
        with streaming(server) as (informer, _, _):
            eventually(lambda: server.active_watches == 1)
            server.end_watches()
            synced(informer)
            assert len(lists(server)) == 1 and names(informer) == ["a"]


# ---- an apiserver that refuses them ---------------------------------------------------

def test_a_refusing_apiserver_costs_one_refused_request_per_watcher():
    with seeded(FakeApiServer(watch_list="refuse"), "a", "b") as server:
        with streaming(server) as (informer, rec, metrics):
            synced(informer)
            assert names(informer) == ["a", "b"]
            (refused,) = streams(server)
            (first_list,) = lists(server)
            assert "resourceVersion" not in first_list.query
            # Relists after 410, twice: paged lists, no new streaming request.
            for n in (2, 3):
                eventually(lambda: server.active_watches == 1)
                server.inject_watch_event(gone_event())
                eventually(lambda n=n: len(lists(server)) == n)
            assert len(streams(server)) == 1
            watcher = informer.watchers[0]
            eventually(lambda: isinstance(watcher.state, Watching))
            assert not watcher.state.stream


def test_streaming_can_be_turned_off_per_informer():
    with FakeApiServer() as server:
        server.create_object(PATH, deployment("a"))
        with streaming(server, streaming_list=False) as (informer, _, _):
            synced(informer)
            assert streams(server) == []
            assert len(lists(server)) == 1
            # The list fills the cache before the watcher adopts Watching (the
            # Replace runs first), so the state is read once it has moved.
            watcher = informer.watchers[0]
            eventually(lambda: isinstance(watcher.state, Watching))
            assert not watcher.state.stream and streams(server) == []
