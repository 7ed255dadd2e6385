"""GenerationMemo: remembered per (key, uid, generation), bounded, a copy per answer."""

from __future__ import annotations

import copy

from k8s_http import GenerationMemo


def make(generation=1, rv="10", uid="u1", replicas=1):
    obj = {"metadata": {"name": "a", "uid": uid, "resourceVersion": rv},
           "spec": {"replicas": replicas}}
    if generation is not None:
        obj["metadata"]["generation"] = generation
    return obj


class Render:
    def __init__(self):
        self.calls = 0

    def __call__(self, obj):
        self.calls += 1
        return [], ({"spec": dict(obj["spec"])},)


def test_one_computation_per_generation_whatever_the_resource_version():
    memo, render = GenerationMemo(), Render()
    first = memo("k", make(), render)
    assert memo("k", make(rv="11"), render) == first and render.calls == 1
    assert memo("k", make(generation=2, replicas=5), render)[1][0]["spec"]["replicas"] == 5
    assert render.calls == 2


def test_another_uid_or_key_is_computed_anew():
    memo, render = GenerationMemo(), Render()
    memo("k", make(), render)
    memo("k", make(uid="u2"), render)
    memo("other", make(), render)
    assert render.calls == 3


def test_without_a_generation_the_resource_version_tells_versions_apart():
    memo, render = GenerationMemo(), Render()
    memo("k", make(generation=None, rv="1"), render)
    memo("k", make(generation=None, rv="1"), render)
    assert render.calls == 1
    assert memo("k", make(generation=None, rv="2", replicas=6), render)[1][0]["spec"] == \
        {"replicas": 6}


def test_an_object_without_a_version_is_never_remembered():
    memo, render = GenerationMemo(), Render()
    obj = make(generation=None, rv=None)
    memo("k", obj, render)
    memo("k", obj, render)
    assert render.calls == 2 and len(memo) == 0


def test_every_answer_is_the_callers_own_copy():
    memo, render = GenerationMemo(), Render()
    first = copy.deepcopy(memo("k", make(), render))
    again = memo("k", make(), render)
    again[1][0]["spec"]["replicas"] = 42
    assert memo("k", make(), render) == first


def test_bounded_least_recently_used_first_out():
    memo, render = GenerationMemo(size=3), Render()
    for generation in range(1, 6):
        memo("k", make(generation=generation), render)
    assert len(memo) == 3 and render.calls == 5
    memo("k", make(generation=3), render)      # still there, now the most recent
    memo("k", make(generation=6), render)      # pushes out 4
    assert render.calls == 6
    memo("k", make(generation=3), render)
    assert render.calls == 6
    memo("k", make(generation=4), render)
    assert render.calls == 7
