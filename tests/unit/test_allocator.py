"""k8s_http.ops.allocator: the glibc calls never raise; memory is released when a burst ends."""

from k8s_http.ops import allocator
from k8s_http.ops.allocator import TrimAfterBursts
from tests.support.clock import FakeClock


def test_the_glibc_calls_answer_without_raising():
    assert isinstance(allocator.release_free_memory(), bool)
    assert allocator.limit_arenas(0) is False            # refused, not sent to mallopt


def test_without_glibc_they_are_no_ops(monkeypatch):
    monkeypatch.setattr(allocator, "_LIBC", None)
    assert allocator.limit_arenas(2) is False and allocator.release_free_memory() is False


def _trimmer(busy_states, clock):
    states = iter(busy_states)
    released = []
    trimmer = TrimAfterBursts(lambda: next(states), release=lambda: released.append(clock()),
                              clock=clock, min_interval_seconds=10.0)
    return trimmer, released


def test_released_when_a_burst_ends_and_not_while_idle():
    clock = FakeClock(0.0)
    trimmer, released = _trimmer([True, True, False, False, False, True, False], clock)
    for _ in range(5):
        trimmer.tick()
        clock.advance(1.0)
    assert released == [2.0]            # once, at the first idle tick after the burst
    clock.advance(20.0)
    trimmer.tick()                      # busy again
    trimmer.tick()                      # idle: the second burst's memory goes too
    assert released == [2.0, 25.0] and trimmer.releases == 2


def test_bursts_closer_than_the_interval_wait_for_it():
    clock = FakeClock(0.0)
    trimmer, released = _trimmer([False, True, False, True, False, False], clock)
    for _ in range(6):
        trimmer.tick()
        clock.advance(4.0)
    # Start-up counts as a burst (released at 0). The burst that ends at 8 s is
    # too close to it; at 12 s another is running; the idle tick at 16 s releases.
    assert released == [0.0, 16.0]
