"""StatusHold: the window, its cap, the queue's delay, and the share of timely answers."""

from __future__ import annotations

import pytest

from k8s_http import StatusHold
from tests.support.clock import FakeClock


class Queue:
    """Plays runner.queued_seconds: how long the key being reconciled waited."""
    def __init__(self):
        self.seconds = None

    def __call__(self):
        return self.seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def queue():
    return Queue()


@pytest.fixture
def hold(clock, queue):
    return StatusHold(coalesce_seconds=0.5, cap_seconds=10.0, weight=0.2, clock=clock,
                      queued_seconds=queue)


def test_nothing_is_held_when_not_about_the_other_controller_or_it_is_done(hold):
    assert hold.wait("k", None) == 0.0
    assert hold.wait("k", False) == 0.0
    assert "k" not in hold and hold.held_until("k") is None


def test_a_pending_answer_holds_for_the_window_fixed_when_first_held(hold, clock):
    assert hold.wait("k", True) == 0.5
    assert hold.held_until("k") == clock() + 0.5
    clock.advance(0.3)
    assert hold.wait("k", True) == pytest.approx(0.2)      # the same window, not a new one
    clock.advance(0.3)
    assert hold.wait("k", True) == 0.0                     # over: write it as it stands
    hold.release("k")
    assert "k" not in hold


@pytest.mark.parametrize("waited, window", [(None, 0.5), (0.01, 0.5), (6.0, 6.0), (120.0, 10.0)])
def test_the_window_follows_the_queue_delay_up_to_the_cap(hold, queue, waited, window):
    queue.seconds = waited
    assert hold.wait("k", True) == window


def test_keys_are_held_apart(hold, clock):
    assert hold.wait("a", True) == 0.5
    clock.advance(0.4)
    assert hold.wait("b", True) == 0.5
    assert hold.wait("a", True) == pytest.approx(0.1)


def answer_after(hold, clock, key, seconds):
    """One episode of `key`: at work now, answered `seconds` later."""
    wait = hold.wait(key, True)
    hold.release(key)
    clock.advance(seconds)
    assert hold.wait(key, False) == 0.0
    return wait


def test_late_answers_stop_holding_and_timely_ones_bring_it_back(hold, clock):
    for _ in range(4):                    # the other controller answers after 10 s
        assert answer_after(hold, clock, "k", 10.0) == 0.5
    assert hold.hit_rate < 0.5
    assert hold.wait("next", True) == 0.0 and "next" not in hold
    hold.forget("next")
    # Not held, but still judged by the window it would have had: answers that
    # come at once are hits again, and holding resumes.
    assert answer_after(hold, clock, "k", 0.1) == 0.0
    assert hold.hit_rate >= 0.5
    assert hold.wait("next", True) == 0.5


def test_an_answer_that_waited_in_our_queue_was_still_on_time(hold, clock, queue):
    for _ in range(5):
        queue.seconds = 0.0
        hold.wait("k", True)
        hold.release("k")
        clock.advance(5.0)
        queue.seconds = 5.0               # the answer's event waited in our queue
        hold.wait("k", False)
    assert hold.hit_rate == 1.0


def test_the_share_of_hits_is_an_exponentially_weighted_mean(hold, clock):
    answer_after(hold, clock, "k", 1.0)
    assert hold.hit_rate == pytest.approx(0.8)
    answer_after(hold, clock, "k", 1.0)
    assert hold.hit_rate == pytest.approx(0.64)
    answer_after(hold, clock, "k", 0.2)
    assert hold.hit_rate == pytest.approx(0.64 + 0.2 * 0.36)


def test_forget_drops_the_hold_and_the_episode(hold, clock):
    hold.wait("k", True)
    hold.forget("k")
    assert "k" not in hold
    clock.advance(100.0)
    hold.wait("k", False)                 # no judgement: it was forgotten
    assert hold.hit_rate == 1.0


def test_a_window_that_ends_without_the_answer_is_a_miss_judged_once(hold, clock):
    assert hold.wait("k", True) == 0.5
    clock.advance(0.6)
    assert hold.wait("k", True) == 0.0 and "k" not in hold
    assert hold.hit_rate == pytest.approx(0.8)
    hold.release("k")                     # the caller's release after its write: a no-op
    clock.advance(5.0)
    assert hold.wait("k", False) == 0.0   # the late answer is not judged again
    assert hold.hit_rate == pytest.approx(0.8)


def test_a_long_rollout_is_held_once_per_window_and_judged_once(hold, clock):
    assert hold.wait("k", True) == 0.5
    clock.advance(0.5)
    assert hold.wait("k", True) == 0.0    # written as it stands
    hold.release("k")
    clock.advance(0.1)
    assert hold.wait("k", True) == 0.5    # the next change of the same rollout: a new window
    clock.advance(0.5)
    assert hold.wait("k", True) == 0.0
    assert hold.hit_rate == pytest.approx(0.8)


@pytest.mark.parametrize("queued", [None, 3.0])
def test_a_controller_that_never_answers_is_learnt_and_no_longer_waited_for(hold, clock, queue,
                                                                          queued):
    """As with the Deployment controller down: every window ends unanswered. The
    holds stop after a few windows, also when each window was stretched by a
    backlog's queue wait (a mean of answer times learnt only that the answer
    takes as long as the window, and every status of the backlog waited its
    whole window)."""
    held = 0
    for i in range(100):
        key = f"k{i}"
        queue.seconds = queued
        wait = hold.wait(key, True)
        if wait == 0.0:
            break
        held += 1
        clock.advance(wait + 0.01)        # the timer brings the key back a little late
        queue.seconds = 0.01
        assert hold.wait(key, True) == 0.0
    assert held == 4
    assert hold.wait("another", True) == 0.0 and "another" not in hold
