"""Leader election: the pure decisions as tables, then the loop on a fake clock and client.

No sockets and no sleeping: the fake stop event's wait() advances the fake clock.
"""

import copy
import logging
import datetime as dt
import threading

import pytest
from prometheus_client import CollectorRegistry

from k8s_http.core import errors
from k8s_http.control.leader import (LeaderElector, LeaderRecord, Observation, acquire_record,
                                     can_acquire, is_expired, is_leading, jittered, micro_time,
                                     observe, release_record)
from k8s_http.ops.metrics import Metrics
from k8s_http.core.objects import LEASES, ObjectKey
from tests.support.clock import FakeClock, FakeStopEvent
from tests.support.fake_client import InMemoryApiClient

T0 = "2024-05-01T12:00:00.000000Z"
T1 = "2024-05-01T12:00:02.000000Z"
A = LeaderRecord("a", 15, T0, T0, 3)


# ---------------------------------------------------------------------------
# Pure decisions


def test_observe_restarts_the_clock_only_when_the_record_changes():
    first = observe(None, A, now=100.0)
    assert first == Observation(A, 100.0)
    assert observe(first, A, now=110.0) is first               # unchanged: keeps 100
    renewed = LeaderRecord("a", 15, T0, T1, 3)
    assert observe(first, renewed, now=110.0) == Observation(renewed, 110.0)
    taken = LeaderRecord("b", 15, T1, T1, 4)
    assert observe(first, taken, now=111.0).observed_at == 111.0


@pytest.mark.parametrize("record, observed_at, now, expired", [
    # Expiry is measured on OUR clock from when the record last changed; the
    # wall-clock renewTime inside the record is never compared with anything.
    (A, 100.0, 100.0, False),
    (A, 100.0, 114.9, False),
    (A, 100.0, 115.0, True),
    (A, 100.0, 1e9, True),
    # A renewTime decades in the past does not make a fresh observation expired.
    (LeaderRecord("a", 15, "1999-01-01T00:00:00.000000Z", "1999-01-01T00:00:00.000000Z", 0),
     100.0, 101.0, False),
    # The record's own duration counts (a released lease says 1 s) ...
    (LeaderRecord("", 1, T0, T0, 3), 100.0, 101.0, True),
    # ... and a record without one gets ours (10 s in this table).
    (LeaderRecord("a", 0, T0, T0, 3), 100.0, 109.9, False),
    (LeaderRecord("a", 0, T0, T0, 3), 100.0, 110.0, True),
])
def test_is_expired(record, observed_at, now, expired):
    assert is_expired(Observation(record, observed_at), now,
                      default_duration_seconds=10.0) is expired


@pytest.mark.parametrize("holder, now, allowed", [
    ("", 100.0, True),        # held by nobody (released or never held)
    ("me", 100.0, True),      # ours already (a renewal, or re-taking after a blip)
    ("a", 100.0, False),      # someone else's, freshly observed
    ("a", 114.9, False),
    ("a", 115.0, True),       # someone else's, unchanged for a lease duration
])
def test_can_acquire(holder, now, allowed):
    obs = Observation(LeaderRecord(holder, 15, T0, T0, 3), 100.0)
    assert can_acquire(obs, "me", now, default_duration_seconds=15.0) is allowed


def test_takeover_counts_a_transition_and_resets_acquire_time():
    new = acquire_record(A, "b", 15.0, T1)
    assert new == LeaderRecord("b", 15, T1, T1, 4)


def test_taking_a_released_lease_counts_a_transition():
    released = LeaderRecord("", 1, T0, T0, 3)
    assert acquire_record(released, "b", 15.0, T1).transitions == 4


def test_renewal_keeps_acquire_time_and_transitions():
    new = acquire_record(A, "a", 15.0, T1)
    assert new == LeaderRecord("a", 15, T0, T1, 3)


def test_new_lease_starts_at_zero_transitions():
    assert acquire_record(None, "a", 15.0, T0) == LeaderRecord("a", 15, T0, T0, 0)


@pytest.mark.parametrize("seconds, written", [(15.0, 15), (1.5, 2), (0.2, 1)])
def test_lease_duration_written_in_whole_seconds_never_shorter(seconds, written):
    assert acquire_record(None, "a", seconds, T0).lease_duration_seconds == written


def test_release_record():
    assert release_record(A, T1) == LeaderRecord("", 1, T1, T1, 3)
    assert release_record(A, T1).to_spec() == {
        "holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 3,
        "acquireTime": T1, "renewTime": T1}


@pytest.mark.parametrize("renewed_at, now, leading", [
    (None, 0.0, False),
    (100.0, 100.0, True),
    (100.0, 109.99, True),
    (100.0, 110.0, False),     # the renew deadline is exclusive
    (100.0, 500.0, False),
])
def test_is_leading(renewed_at, now, leading):
    assert is_leading(renewed_at, 10.0, now) is leading


def test_record_round_trip_and_garbage_tolerance():
    lease = {"spec": A.to_spec()}
    assert LeaderRecord.from_lease(lease) == A
    junk = {"spec": {"holderIdentity": None, "leaseDurationSeconds": "15",
                     "leaseTransitions": True, "renewTime": 5}}
    assert LeaderRecord.from_lease(junk) == LeaderRecord()
    assert LeaderRecord.from_lease({}) == LeaderRecord()
    assert LeaderRecord.from_lease({"spec": "nonsense"}) == LeaderRecord()


def test_jitter_bounds():
    assert jittered(2.0, lambda: 0.0) == 2.0
    assert jittered(2.0, lambda: 0.999) == pytest.approx(2.0 * (1 + 0.999 * 1.2))


def test_micro_time():
    when = dt.datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert micro_time(when) == "2024-05-01T12:00:00.123456Z"


def test_timing_must_leave_a_gap():
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        LeaderElector(lease_client(), namespace="ns", name="l", identity="a",
                      lease_duration_seconds=10, renew_deadline_seconds=10)
    with pytest.raises(ValueError):
        LeaderElector(lease_client(), namespace="ns", name="l", identity="a",
                      retry_period_seconds=9)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(lease_client(), namespace="ns", name="l", identity="")


# ---------------------------------------------------------------------------
# The loop, on fakes


LEASE = ObjectKey("ns", "lease")


def lease_client():
    """The one Lease lives in the shared in-memory client: 404s, 409s, resourceVersions."""
    return InMemoryApiClient(creatable={LEASES})


def lease(client):
    """The stored Lease itself (None before anyone made it)."""
    return client.obj(LEASES, LEASE)


def holder(client):
    return lease(client)["spec"]["holderIdentity"] if lease(client) else None


def set_holder(client, holder, renew_time=T0):
    """Another process writes the lease."""
    spec = {"holderIdentity": holder, "leaseDurationSeconds": 15,
            "acquireTime": T0, "renewTime": renew_time, "leaseTransitions": 7}
    if lease(client) is None:
        client.put(LEASES, {"metadata": {"name": "lease", "namespace": "ns"}, "spec": spec})
    else:
        lease(client)["spec"] = spec
        touch(client)


def touch(client):
    """Another writer changed the stored lease: its resourceVersion moves."""
    lease(client)["metadata"]["resourceVersion"] = client.next_resource_version()


def elector(client, clock, identity="me", registry=None, **kw):
    return LeaderElector(client, namespace="ns", name="lease", identity=identity,
                         metrics=Metrics(registry or CollectorRegistry()), clock=clock,
                         rng=lambda: 0.0, **kw)


def test_creates_the_lease_when_missing():
    client, clock = lease_client(), FakeClock()
    registry = CollectorRegistry()
    e = elector(client, clock, registry=registry)
    assert registry.get_sample_value("leader_election_master_status", {"name": "lease"}) == 0
    assert e.try_acquire_or_renew()
    assert e.is_leader()
    e.check()
    spec = lease(client)["spec"]
    assert spec["holderIdentity"] == "me" and spec["leaseTransitions"] == 0
    assert spec["leaseDurationSeconds"] == 15
    assert lease(client)["metadata"] == {"name": "lease", "namespace": "ns",
                                        "resourceVersion": "1"}
    assert registry.get_sample_value("leader_election_master_status", {"name": "lease"}) == 1


def test_waits_a_full_lease_duration_on_its_own_clock_before_taking_over():
    client, clock = lease_client(), FakeClock()
    set_holder(client, "other", renew_time="1999-01-01T00:00:00.000000Z")  # ancient renewTime
    e = elector(client, clock)
    assert not e.try_acquire_or_renew()          # first sight: observation starts now
    assert e.holder == "other"
    clock.now += 14.9
    assert not e.try_acquire_or_renew()
    clock.now += 0.1                              # 15 s unchanged on our clock
    assert e.try_acquire_or_renew()
    assert holder(client) == "me"
    assert lease(client)["spec"]["leaseTransitions"] == 8


def test_a_renewing_holder_is_never_taken_over():
    client, clock = lease_client(), FakeClock()
    set_holder(client, "other")
    e = elector(client, clock)
    for i in range(20):
        clock.now += 10
        set_holder(client, "other", renew_time=f"2024-05-01T12:00:{i:02d}.000000Z")
        assert not e.try_acquire_or_renew()
    assert holder(client) == "other"
    assert not e.is_leader()
    with pytest.raises(errors.NotLeaderError):
        e.check()


def test_conflict_means_someone_else_won():
    client, clock = lease_client(), FakeClock()
    set_holder(client, "")
    e = elector(client, clock)

    def race(method):
        if method == "replace":   # another candidate writes between our get and replace
            client.on_call = None
            set_holder(client, "fast")
    client.on_call = race
    assert not e.try_acquire_or_renew()
    assert holder(client) == "fast" and not e.is_leader()


def test_renewal_uses_the_cached_lease_without_reading():
    client, clock = lease_client(), FakeClock()
    walls = iter([dt.datetime(2024, 5, 1, 12, 0, s, tzinfo=dt.timezone.utc) for s in (0, 2)])
    e = elector(client, clock, wall_clock=lambda: next(walls))
    assert e.try_acquire_or_renew()
    client.calls.clear()
    clock.now += 2
    assert e.try_acquire_or_renew()
    assert client.verbs() == ["replace"]
    assert LeaderRecord.from_lease(lease(client)) == LeaderRecord("me", 15, T0, T1, 0)


def test_a_failed_optimistic_renewal_takes_client_gos_slow_path_and_counts_it():
    client, clock = lease_client(), FakeClock()
    registry = CollectorRegistry()
    e = elector(client, clock, registry=registry)

    def slowpath():
        return registry.get_sample_value("leader_election_slowpath_total", {"name": "lease"})
    assert slowpath() == 0                       # pre-set, like every known series
    assert e.try_acquire_or_renew()
    clock.now += 2
    assert e.try_acquire_or_renew()              # the fast path: no read, not counted
    assert slowpath() == 0
    # Someone bumps the resourceVersion (an annotation, say): our cached copy is stale.
    lease(client)["metadata"]["labels"] = {"touched": "yes"}
    touch(client)
    clock.now += 2
    assert not e.try_acquire_or_renew()          # 409 on the cached copy
    assert e.is_leader()                         # still within the renew deadline
    clock.now += 2
    client.calls.clear()
    assert e.try_acquire_or_renew()              # read, still ours, write: the slow path
    assert client.verbs() == ["get", "replace"]
    assert slowpath() == 1


def test_handing_the_lease_back_is_info_but_losing_it_is_a_warning(caplog):
    client, clock = lease_client(), FakeClock()
    e = elector(client, clock)
    assert e.try_acquire_or_renew()
    with caplog.at_level(logging.DEBUG, logger="k8s_http.control.leader"):
        assert e.release()
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    caplog.clear()
    other = elector(client, clock, identity="other")
    assert other.try_acquire_or_renew()
    set_holder(client, "third")
    clock.now += 2
    with caplog.at_level(logging.DEBUG, logger="k8s_http.control.leader"):
        assert not other.try_acquire_or_renew()
        clock.now += 20
        assert not other.try_acquire_or_renew()
    assert logging.WARNING in [r.levelno for r in caplog.records]


def test_is_leader_turns_false_at_the_renew_deadline_without_any_call():
    client, clock = lease_client(), FakeClock()
    e = elector(client, clock)
    assert e.try_acquire_or_renew()
    clock.now += 9.99
    assert e.is_leader()
    clock.now += 0.01
    assert not e.is_leader()          # nothing ran: computed from the last renewal
    with pytest.raises(errors.NotLeaderError):
        e.check()


def test_deadline_counts_from_when_the_renewal_was_sent():
    client, clock = lease_client(), FakeClock()

    def slow(method):
        clock.now += 3.0              # every request takes 3 s
    client.on_call = slow
    e = elector(client, clock)
    assert e.try_acquire_or_renew()   # sent at 1000, answered at 1006 (get 404, create)
    assert clock.now == 1006.0
    clock.now = 1009.99
    assert e.is_leader()
    clock.now = 1010.0
    assert not e.is_leader()


def test_api_errors_are_a_failed_attempt_not_an_exception():
    client, clock = lease_client(), FakeClock()
    client.fail = errors.ApiConnectionError("connection refused")
    e = elector(client, clock)
    assert not e.try_acquire_or_renew()
    client.fail = RuntimeError("a bug")
    assert not e.try_acquire_or_renew()


def test_run_leads_renews_and_loses_on_deadline_then_campaigns_again():
    client, clock = lease_client(), FakeClock()
    e = elector(client, clock)
    events = []
    stop = FakeStopEvent(clock)

    def started():
        events.append(("started", clock.now))

    def stopped():
        events.append(("stopped", clock.now, e.is_leader()))
        client.fail = None            # the apiserver comes back

    def on_call(method):
        # The apiserver goes away 5 s after we started leading, for good until we lose.
        if events == [("started", 1000.0)] and clock.now >= 1005.0:
            client.fail = errors.ServerError(503, "unavailable")
        if len(events) == 3:          # re-acquired after the loss: stop the test
            stop.set()
    client.on_call = on_call
    e.run(stop, started, stopped)

    # Last success was the renewal sent at 1004; the deadline is 1014, noticed at once.
    assert events[0] == ("started", 1000.0)
    assert events[1] == ("stopped", 1014.0, False)
    assert events[2][0] == "started"
    # Renewals every retry period while leading.
    assert stop.waits[:2] == [2.0, 2.0]
    assert holder(client) == "me" and lease(client)["spec"]["leaseTransitions"] == 0


def test_stop_returns_without_ending_the_term():
    client, clock = lease_client(), FakeClock()
    e = elector(client, clock)
    events = []
    e.run(FakeStopEvent(clock, stop_at=1030.0), lambda: events.append("started"),
          lambda: events.append("stopped"))
    assert events == ["started"]      # stop does not end the term ...
    assert e.is_leader()              # ... it lapses at the deadline or on release()
    clock.now += 10
    assert not e.is_leader()


def test_run_steps_down_as_soon_as_another_holder_is_seen():
    client, clock = lease_client(), FakeClock()
    e = elector(client, clock)
    events = []

    def intrude(method):
        # At 1005 someone overwrites the lease (e.g. a twin with our lease name).
        if clock.now >= 1005.0 and holder(client) == "me":
            set_holder(client, "intruder")
    client.on_call = intrude
    e.run(FakeStopEvent(clock, stop_at=1012.0), lambda: events.append(("started", clock.now)),
          lambda: events.append(("stopped", clock.now)))
    # The 1006 renewal conflicts (stale resourceVersion); the 1008 one re-reads,
    # sees the intruder and steps down at once instead of waiting for 1014.
    assert events == [("started", 1000.0), ("stopped", 1008.0)]
    assert holder(client) == "intruder"
    assert not e.is_leader()


def test_acquire_retries_are_jittered():
    client, clock = lease_client(), FakeClock()
    set_holder(client, "other")
    e = LeaderElector(client, namespace="ns", name="lease", identity="me", clock=clock,
                      rng=lambda: 0.5)
    stop = FakeStopEvent(clock, stop_at=clock.now + 10)
    e.run(stop, lambda: None, lambda: None)
    assert set(stop.waits) == {2.0 * 1.6}


def test_release_hands_the_lease_over():
    client, clock = lease_client(), FakeClock()
    registry = CollectorRegistry()
    e = elector(client, clock, registry=registry)
    assert e.try_acquire_or_renew()
    assert e.release()
    assert not e.is_leader()
    spec = lease(client)["spec"]
    assert spec["holderIdentity"] == ""
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0
    assert registry.get_sample_value("leader_election_master_status", {"name": "lease"}) == 0
    # Released is final: no more writes.
    writes = len(client.calls)
    assert not e.try_acquire_or_renew()
    assert len(client.calls) == writes

    # A standby takes it at once (empty holder), counting a transition.
    standby = elector(client, clock, identity="standby")
    assert standby.try_acquire_or_renew()
    assert lease(client)["spec"]["leaseTransitions"] == 1


def test_release_does_nothing_when_not_holding():
    client, clock = lease_client(), FakeClock()
    set_holder(client, "other")
    e = elector(client, clock)
    assert not e.try_acquire_or_renew()
    before = copy.deepcopy(lease(client))
    assert not e.release()
    assert lease(client) == before


def test_release_does_not_clobber_a_newer_holder():
    client, clock = lease_client(), FakeClock()
    e = elector(client, clock)
    assert e.try_acquire_or_renew()
    clock.now += 30                   # we stalled; someone took over meanwhile
    set_holder(client, "newer")
    assert not e.release()            # 409 on our stale resourceVersion
    assert holder(client) == "newer"


def test_release_during_an_in_flight_renewal_does_not_lead_again():
    client, clock = lease_client(), FakeClock()
    e = elector(client, clock)
    assert e.try_acquire_or_renew()
    releaser = threading.Thread(target=e.release)

    def release_meanwhile(method):
        # SIGTERM arrives while our renewal is on the wire: release() steps
        # down at once, then waits for the write lock this renewal holds.
        client.on_call = None
        releaser.start()
        stepped_down = threading.Event()
        for _ in range(5000):
            if not e.is_leader():
                stepped_down.set()
                break
            stepped_down.wait(0.001)
        assert stepped_down.is_set()
    client.on_call = release_meanwhile
    clock.now += 2
    e.try_acquire_or_renew()        # the renewal itself succeeds on the server ...
    releaser.join(5)
    assert not e.is_leader()        # ... but starts no new term,
    assert holder(client) == ""      # and the lease is handed back after it.
