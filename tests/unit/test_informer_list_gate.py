"""Informer's list gate: parts added after start make their first lists one at a time."""

from __future__ import annotations

import threading

from k8s_http.cache.informer import Informer
from k8s_http.core.objects import DEPLOYMENTS, Resource

MYS = Resource("mine.jp", "v1", "my", "My")
WAIT = 5.0


class FakeWatcher:
    """Stands in for a part's Watcher: says when it starts, lists when told to
    (delivering an empty list as the real one delivers its first list), then
    watches until stopped."""

    def __init__(self, informer: Informer, part):
        self.informer, self.part = informer, part
        self.started = threading.Event()
        self.may_list = threading.Event()
        self.listed = threading.Event()

    def run(self, stop: threading.Event) -> None:
        self.started.set()
        while not self.may_list.wait(0.01):
            if stop.is_set():
                return
        self.informer._deliver_list(self.part, "ns", self.informer.store.new_list([]))
        self.listed.set()
        stop.wait()

    def stop(self) -> None:
        pass


class FakeInformer(Informer):
    def _new_watcher(self, part, ns, label_selector, shard_selector):
        return FakeWatcher(self, part)


def gated_part(informer: Informer) -> FakeWatcher:
    """A part added to a started informer (its first part never runs), its thread running."""
    with informer._lock:
        informer._started = True                    # as after start(), without its watchers
    part_id = informer.add_part(label_selector="x in (1)")
    return informer._parts[part_id].watchers["ns"]


def first_listing_second_added():
    """Two informers sharing a gate: a part of the first's listing, then one of the second's."""
    gate = threading.Lock()
    mys = FakeInformer(None, MYS, namespaces=["ns"], list_gate=gate)
    deployments = FakeInformer(None, DEPLOYMENTS, namespaces=["ns"], list_gate=gate)
    first = gated_part(mys)
    assert first.started.wait(WAIT)
    return gate, mys, deployments, first, gated_part(deployments)


def test_parts_added_after_start_list_one_at_a_time_across_informers():
    gate, mys, deployments, first, second = first_listing_second_added()
    assert not second.started.wait(0.3)             # waits for the first one's list
    first.may_list.set()
    assert first.listed.wait(WAIT)
    assert second.started.wait(WAIT)                # the gate passed on once it was in
    second.may_list.set()
    assert second.listed.wait(WAIT)
    assert not gate.locked()                        # watching does not hold it
    for informer in (mys, deployments):
        informer.stop()


def test_a_part_stopped_before_its_list_gives_the_gate_back_and_one_waiting_gives_up():
    gate, mys, deployments, _, second = first_listing_second_added()
    deployments.stop()                              # stopped while waiting: never runs
    mys.stop()                                      # stopped while listing: the gate goes back
    assert not second.started.is_set()
    assert not gate.locked()


def test_parts_there_at_start_and_informers_without_a_gate_do_not_wait():
    gate = threading.Lock()
    gate.acquire()                                  # someone else's list in progress
    mys = FakeInformer(None, MYS, namespaces=["ns"], list_gate=gate)
    assert not any(p.gated for p in mys._parts.values())
    ungated = gated_part(FakeInformer(None, DEPLOYMENTS, namespaces=["ns"]))
    assert ungated.started.wait(WAIT)
    ungated.informer.stop()
    gate.release()
