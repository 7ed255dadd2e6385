"""k8s_http.ops.gctuning: the collector while the caches fill, and frozen once they have."""

from __future__ import annotations

import gc

import pytest

from k8s_http.ops.gctuning import CacheFill


@pytest.fixture(autouse=True)
def collector_as_it_was():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)
    gc.unfreeze()


def test_young_collections_are_rare_while_the_caches_fill_then_as_before():
    gc.set_threshold(700, 10, 10)
    fill = CacheFill(threshold=50_000)
    fill.begin()
    assert gc.get_threshold() == (50_000, 10, 10)
    fill.begin()                                # once
    assert gc.get_threshold() == (50_000, 10, 10)
    frozen = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]           # a cache being filled
    fill.end()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() >= frozen + len(kept)      # out of every later collection
    fill.begin()                                # over: nothing changes any more
    assert gc.get_threshold() == (700, 10, 10)


def test_a_stop_before_the_caches_synced_puts_the_thresholds_back_without_freezing():
    gc.set_threshold(700, 10, 10)
    fill = CacheFill(threshold=50_000)
    fill.begin()
    frozen = gc.get_freeze_count()
    fill.end(freeze=False)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == frozen


def test_a_collector_turned_off_or_already_lazier_is_left_alone():
    for thresholds in ((0, 10, 10), (200_000, 10, 10)):
        gc.set_threshold(*thresholds)
        fill = CacheFill(threshold=50_000)
        fill.begin()
        assert gc.get_threshold() == thresholds
        fill.end(freeze=False)
        assert gc.get_threshold() == thresholds
