"""Leader election between real electors over real sockets, on one fake apiserver.

Short timings (lease 1.5 s -> written as 2 s, deadline 1 s, retry 0.2 s) keep
each test to a few seconds. Each candidate has its own transport with its own
User-Agent, so faults can be scripted for one of them only.
"""

from __future__ import annotations

import threading
import time

import pytest

from k8s_http.core import errors
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import ClusterConfig
from k8s_http.control.leader import LeaderElector, LeaderRecord
from k8s_http.core.objects import CONFIGMAPS, LEASES
from tests.support.fake_apiserver import FakeApiServer, stall, status
from tests.support.wait import eventually

pytestmark = pytest.mark.timeout(60)

NS = "kube-system"
NAME = "my-controller"
LEASE_PATH = LEASES.path(NS, NAME)
TIMING = dict(lease_duration_seconds=1.5, renew_deadline_seconds=1.0, retry_period_seconds=0.2)


class Candidate:
    """One elector with its own client, thread and stop event, recording its callbacks."""

    def __init__(self, server: FakeApiServer, identity: str):
        self.identity = identity
        self.client = ApiClient.from_config(ClusterConfig(server=server.url),
                                            user_agent=f"candidate/{identity}")
        self.elector = LeaderElector(self.client, namespace=NS, name=NAME, identity=identity,
                                     **TIMING)
        self.stop = threading.Event()
        self.events: list[tuple[str, float]] = []
        self.thread = threading.Thread(target=self.elector.run, name=f"elector-{identity}",
                                       args=(self.stop, self._started, self._stopped),
                                       daemon=True)

    def _started(self):
        self.events.append(("started", time.monotonic()))

    def _stopped(self):
        self.events.append(("stopped", time.monotonic()))

    def is_leader(self) -> bool:
        return self.elector.is_leader()

    def sent_by_me(self, request) -> bool:
        return request.headers.get("user-agent", "").startswith(f"candidate/{self.identity}")

    def writes_by_me(self, request) -> bool:
        return self.sent_by_me(request) and request.method in ("PUT", "POST")


@pytest.fixture
def server():
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def candidates(server):
    made: list[Candidate] = []

    def make(*identities):
        new = [Candidate(server, i) for i in identities]
        made.extend(new)
        for c in new:
            c.thread.start()
        return new
    yield make
    for c in made:
        c.stop.set()
    server.stop()              # ends stalled requests too (a second stop() is harmless)
    for c in made:
        c.thread.join(timeout=10)
        assert not c.thread.is_alive(), f"elector {c.identity} did not stop"
        c.client.transport.close()


def holder(server) -> str:
    lease = server.get_object(LEASE_PATH)
    return LeaderRecord.from_lease(lease).holder if lease else ""


def transitions(server) -> int:
    return LeaderRecord.from_lease(server.get_object(LEASE_PATH)).transitions


def consistently(predicate, seconds: float, message: str) -> None:
    """The opposite of eventually(): `predicate` holds at every look for `seconds`.

    (A window of observation, not a wait for a race to settle.)
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), message
        threading.Event().wait(0.02)


def leader_of(*cands: Candidate) -> Candidate | None:
    """The single leader, failing the test at once if two lead together."""
    leaders = [c for c in cands if c.is_leader()]
    assert len(leaders) <= 1, f"two leaders at once: {[c.identity for c in leaders]}"
    return leaders[0] if leaders else None


def test_exactly_one_leads_and_keeps_renewing(server, candidates):
    a, b = candidates("a", "b")
    first = eventually(lambda: leader_of(a, b), message="nobody became leader")
    other = b if first is a else a
    assert holder(server) == first.identity
    assert transitions(server) == 0
    renew_time = LeaderRecord.from_lease(server.get_object(LEASE_PATH)).renew_time

    # For longer than the lease as written (2 s): the leader never changes,
    # never two at once, and the lease keeps being renewed.
    consistently(lambda: leader_of(a, b) is first and not other.events, 2.5,
                 "leadership changed hands")
    assert holder(server) == first.identity
    assert LeaderRecord.from_lease(server.get_object(LEASE_PATH)).renew_time != renew_time
    assert first.events and first.events[0][0] == "started"
    assert transitions(server) == 0


def test_standby_takes_over_when_renewals_fail(server, candidates):
    a, = candidates("a")
    eventually(a.is_leader, message="a never became leader")
    b, = candidates("b")
    eventually(lambda: server.requests_for("GET", LEASE_PATH) and
               any(b.sent_by_me(r) for r in server.requests_for("GET", LEASE_PATH)),
               message="b never looked at the lease")

    # The apiserver starts refusing a's writes (as if a were partitioned away).
    server.script(status(500, "InternalError", "etcd timeout"), match=a.writes_by_me,
                  times=None)
    broken_at = time.monotonic()

    eventually(lambda: not a.is_leader(), timeout=TIMING["renew_deadline_seconds"] + 1,
               message="a still leads after its renew deadline")
    eventually(lambda: ("stopped" in [e for e, _ in a.events]), timeout=2,
               message="a's on_stopped_leading was not called")
    # b waits for the lease (2 s as written) to pass unchanged on ITS clock.
    eventually(lambda: leader_of(a, b) is b, timeout=10, message="b never took over")
    took = time.monotonic() - broken_at
    assert took >= 1.0, f"b took over after {took:.2f}s, before the lease could expire"
    assert holder(server) == "b"
    assert transitions(server) == 1

    # a went back to campaigning, sees b renewing, and stays a follower.
    consistently(lambda: leader_of(a, b) is b, 1.0, "b lost the lease to a")
    assert [e for e, _ in a.events] == ["started", "stopped"]


def test_release_hands_over_within_about_a_retry_period(server, candidates):
    a, = candidates("a")
    eventually(a.is_leader, message="a never became leader")
    b, = candidates("b")
    eventually(lambda: any(b.sent_by_me(r) for r in server.requests_for("GET", LEASE_PATH)),
               message="b never looked at the lease")

    released_at = time.monotonic()
    assert a.elector.release()
    assert not a.is_leader()                      # at once
    with pytest.raises(errors.NotLeaderError):
        a.elector.check()
    lease = server.get_object(LEASE_PATH)
    assert lease is not None

    eventually(b.is_leader, timeout=5, message="b never took the released lease")
    took = time.monotonic() - released_at
    # b retries every 0.2-0.44 s (jitter); far less than the 2 s lease.
    assert took < 1.0, f"handover took {took:.2f}s"
    assert holder(server) == "b"
    assert transitions(server) == 1
    # Released is final: a does not campaign again.
    a_writes = len([r for r in server.requests if a.writes_by_me(r)])
    consistently(lambda: len([r for r in server.requests if a.writes_by_me(r)]) == a_writes
                 and leader_of(a, b) is b, 0.5, "a wrote the lease after releasing it")


def test_a_stuck_renewal_ends_leadership_at_the_deadline(server, candidates):
    a, b = candidates("a", "b")
    first = eventually(lambda: leader_of(a, b), message="nobody became leader")
    other = b if first is a else a
    guarded = ApiClient.from_config(ClusterConfig(server=server.url))
    guarded.write_guard = first.elector.check
    guarded.create(CONFIGMAPS, {"metadata": {"name": "while-leading"}}, namespace="default")

    # The leader's next renewal hangs: no answer, no error, the thread is stuck.
    rule = server.script(stall(None), match=first.writes_by_me, times=None)
    eventually(lambda: rule.hits >= 1, timeout=2, message="the renewal never went out")
    stuck_at = time.monotonic()
    eventually(lambda: not first.is_leader(), timeout=2,
               message="still leader with its renew thread stuck")
    # The last renewal before the stall was sent < 1 retry period earlier.
    assert time.monotonic() - stuck_at <= TIMING["renew_deadline_seconds"] + 0.3
    with pytest.raises(errors.NotLeaderError):
        guarded.create(CONFIGMAPS, {"metadata": {"name": "after-loss"}}, namespace="default")
    assert server.get_object(CONFIGMAPS.path("default", "after-loss")) is None

    eventually(lambda: leader_of(a, b) is other, timeout=10,
               message="the standby never took over from a stuck leader")
    guarded.transport.close()
