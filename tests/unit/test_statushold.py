"""StatusHold: the window, its cap, the queue's delay, and the answer-time estimate."""

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


def test_slow_answers_stop_holding_and_quick_ones_bring_it_back(hold, clock):
    for _ in range(3):                    # the other controller answers after 10 s
        hold.wait("k", True)
        hold.release("k")
        clock.advance(10.0)
        assert hold.wait("k", False) == 0.0
    assert hold.answer_seconds > 0.5
    assert hold.wait("next", True) == 0.0 and "next" not in hold
    hold.forget("next")
    for _ in range(30):                   # then it answers at once
        hold.wait("k", True)
        hold.release("k")
        assert hold.wait("k", False) == 0.0
    assert hold.answer_seconds < 0.5
    assert hold.wait("next", True) == 0.5


def test_the_answer_time_leaves_out_our_own_queue_wait(hold, clock, queue):
    for _ in range(5):
        queue.seconds = 0.0
        hold.wait("k", True)
        hold.release("k")
        clock.advance(5.0)
        queue.seconds = 5.0               # the answer's event waited in our queue
        hold.wait("k", False)
    assert hold.answer_seconds == 0.0


def test_the_estimate_is_an_exponentially_weighted_mean(hold, clock):
    hold.wait("k", True)
    clock.advance(1.0)
    hold.wait("k", False)
    assert hold.answer_seconds == pytest.approx(0.2)
    hold.wait("k", True)
    clock.advance(1.0)
    hold.wait("k", False)
    assert hold.answer_seconds == pytest.approx(0.2 + 0.2 * 0.8)


def test_forget_drops_the_hold_and_the_pending_start(hold, clock):
    hold.wait("k", True)
    hold.forget("k")
    assert "k" not in hold
    clock.advance(100.0)
    hold.wait("k", False)                 # no sample: it was forgotten
    assert hold.answer_seconds == 0.0


def test_a_window_that_ends_without_the_answer_counts_as_a_late_answer(hold, clock, queue):
    assert hold.wait("k", True) == 0.5
    clock.advance(0.6)
    queue.seconds = 0.05                  # the end of the window waited in our queue
    assert hold.wait("k", True) == 0.0 and "k" not in hold
    assert hold.answer_seconds == pytest.approx(0.2 * 0.55)
    hold.release("k")                     # the caller's release after its write: a no-op
    assert hold.answer_seconds == pytest.approx(0.2 * 0.55)


def test_a_controller_that_never_answers_is_learnt_and_no_longer_waited_for(hold, clock):
    """As with the Deployment controller down: every window ends unanswered. The
    holds stop once the estimate passes the window, instead of each status change
    waiting out its whole window for ever."""
    held = 0
    for i in range(100):
        key = f"k{i}"
        wait = hold.wait(key, True)
        if wait == 0.0:
            break
        held += 1
        clock.advance(wait + 0.01)        # the timer brings the key back a little late
        assert hold.wait(key, True) == 0.0
    assert 0 < held < 100
    assert hold.answer_seconds > 0.5
    assert hold.wait("another", True) == 0.0 and "another" not in hold
