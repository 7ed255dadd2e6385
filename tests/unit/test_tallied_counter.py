"""metrics.TalliedCounter: watch events counted in per-watcher tallies, summed at scrape."""

import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from k8s_http.ops.metrics import TalliedCounter


def family(registry=None):
    registry = registry if registry is not None else CollectorRegistry()
    return registry, TalliedCounter("t_events_total", "Events", ["resource", "type"],
                                    registry=registry)


def test_preset_keys_are_exported_as_zero_from_the_first_scrape():
    registry, events = family()
    events.tally("pods", keys=("ADDED", "DELETED"))
    assert registry.get_sample_value("t_events_total", {"resource": "pods", "type": "ADDED"}) == 0
    text = generate_latest(registry).decode()
    assert "# TYPE t_events_total counter" in text
    assert 't_events_total{resource="pods",type="DELETED"} 0.0' in text


def test_tallies_of_one_resource_are_summed_and_resources_kept_apart():
    registry, events = family()
    a, b = events.tally("pods", keys=("ADDED",)), events.tally("pods", keys=("ADDED",))
    c = events.tally("services", keys=("ADDED",))
    a["ADDED"] += 2
    b["ADDED"] += 3
    b["BOOKMARK"] = 1                      # a key nobody preset still counts
    c["ADDED"] += 7
    value = registry.get_sample_value
    assert value("t_events_total", {"resource": "pods", "type": "ADDED"}) == 5
    assert value("t_events_total", {"resource": "pods", "type": "BOOKMARK"}) == 1
    assert value("t_events_total", {"resource": "services", "type": "ADDED"}) == 7


def test_a_tally_needs_every_label_but_the_last():
    _, events = family()
    with pytest.raises(ValueError, match="1 leading label"):
        events.tally("pods", "ADDED")


def test_a_second_family_of_the_same_name_is_refused_by_the_registry():
    registry, _ = family()
    with pytest.raises(ValueError, match="Duplicated"):
        family(registry)


def test_scrapes_while_a_thread_counts_never_go_down_and_end_exact():
    registry, events = family()
    tally = events.tally("pods", keys=("ADDED",))
    done = threading.Event()

    def count():
        for _ in range(200_000):
            tally["ADDED"] += 1
        done.set()

    writer = threading.Thread(target=count)
    writer.start()
    seen = []
    while not done.is_set():
        seen.append(registry.get_sample_value("t_events_total",
                                              {"resource": "pods", "type": "ADDED"}))
    writer.join()
    assert seen == sorted(seen)
    assert registry.get_sample_value("t_events_total",
                                     {"resource": "pods", "type": "ADDED"}) == 200_000
