"""Leader election with several operator processes on the real control plane.

Two and three `controller.py` processes share one Lease (in the test's own
namespace) and watch only that namespace. The production timings are used
(lease 15 s, renew deadline 10 s, retry 2 s), since that is what users get.

What is proven, per process (each has its own metrics and log):

- exactly one process leads, and only it reconciles: only its log has lines
  from inside a reconcile, only it has successful writes;
- SIGTERM on the leader releases the Lease: a standby leads within ~5 s;
- SIGKILL on the leader: a standby leads once the lease expires (~15-22 s);
- SIGSTOP on the leader for 30 s (longer than the lease), with work created
  meanwhile: a standby takes over, and the frozen process, once resumed, sees
  on its own monotonic clock that its renew deadline has passed and writes
  nothing more.

Handover times are measured from the signal to the new holder's acquireTime
in the Lease (both wall clocks of this one host) and printed (`pytest -s`).
"""

from __future__ import annotations

import signal
import time

import pytest

from k8s_http.core.objects import DEPLOYMENTS
from tests.e2e.operator_process import (MY, OperatorProcess,
                                        install_manifests, is_available, lease_spec, make_my,
                                        micro_time_to_epoch, stays_true)
from tests.support.wait import eventually

LEASE = "my-controller-e2e"
LEASE_DURATION = 15.0
RETRY_PERIOD = 2.0
# A standby polls every 2-4.4 s (retry period with client-go's jitter). After a
# release the next poll takes over; after a crash the lease must first expire
# on the standby's clock, counted from when it last SAW a renewal.
SIGTERM_HANDOVER_MAX = RETRY_PERIOD * 2.2 + 1.6          # 6 s
CRASH_HANDOVER_MAX = LEASE_DURATION + 2 * RETRY_PERIOD * 2.2 + 1.2   # 25 s
FREEZE_SECONDS = 30.0
CONVERGE_TIMEOUT = 30.0

pytestmark = [pytest.mark.timeout(240), pytest.mark.mys_deleted_first]


@pytest.fixture(scope="module")
def installed(control_plane):
    install_manifests(control_plane)
    return control_plane


def start_candidates(fleet, kubeconfig, namespace, names) -> list[OperatorProcess]:
    ops = [fleet.start(name, kubeconfig, "--namespace", namespace, "--leader-elect",
                       "--leader-election-namespace", namespace,
                       "--leader-election-id", LEASE, "--graceful-shutdown-timeout", "10s")
           for name in names]
    for op in ops:
        op.wait_ready()
    return ops


def the_leader(ops: list[OperatorProcess]) -> OperatorProcess:
    """The one process whose leader_election_master_status is 1 (asserts there is one)."""
    leaders = [op for op in ops if op.is_leader()]
    assert len(leaders) == 1, f"leaders: {leaders} of {ops}"
    return leaders[0]


def wait_for_one_leader(ops) -> OperatorProcess:
    return eventually(lambda: the_leader(ops), timeout=30, interval=0.2,
                      message="no single leader")


def wait_handover(api, namespace, old: OperatorProcess, since_epoch: float,
                  timeout: float) -> tuple[str, float]:
    """Wait until someone other than `old` holds the Lease: (holder, seconds since the signal)."""
    old_identity = old.identity

    def new_holder():
        spec = lease_spec(api, namespace, LEASE)
        holder = spec.get("holderIdentity") or ""
        assert holder and holder != old_identity, f"holder is {holder!r}"
        return spec
    spec = eventually(new_holder, timeout=timeout + 5, interval=0.1,
                      message=f"nobody took the lease from {old}")
    return spec["holderIdentity"], micro_time_to_epoch(spec["acquireTime"]) - since_epoch


def by_identity(ops, identity) -> OperatorProcess:
    (op,) = [o for o in ops if o.identity == identity]
    return op


def settled_writes(op: OperatorProcess) -> dict[str, float]:
    """The process's successful write counts, once two reads a second apart agree."""
    def same_twice():
        first = op.successful_writes()
        time.sleep(1.0)
        second = op.successful_writes()
        # Lease renewals (PUT) go on; everything else must have stopped.
        return second if {m: v for m, v in first.items() if m != "PUT"} == \
            {m: v for m, v in second.items() if m != "PUT"} else None
    return eventually(same_twice, timeout=20, interval=0.1, message=f"{op} never went quiet")


def non_lease_writes(op: OperatorProcess) -> dict[str, float]:
    return {m: v for m, v in op.successful_writes().items() if m != "PUT"}


def report(what: str, seconds: float) -> None:
    print(f"\nHANDOVER {what}: {seconds:.2f} s")


# ---------------------------------------------------------------------------


def test_one_leader_reconciles_and_sigterm_hands_over_in_seconds(installed, api, namespace,
                                                                  fleet, admin_kubeconfig):
    ops = start_candidates(fleet, admin_kubeconfig, namespace, ["a", "b"])
    leader = wait_for_one_leader(ops)
    (standby,) = [op for op in ops if op is not leader]
    assert lease_spec(api, namespace, LEASE)["holderIdentity"] == leader.identity

    for i in range(3):
        api.create(MY, make_my(f"m{i}", namespace))
    for i in range(3):
        eventually(lambda: is_available(api, f"m{i}", namespace), timeout=CONVERGE_TIMEOUT,
                   interval=0.2, message=f"m{i} never Available")

    # Only the leader reconciled and wrote; the standby only read.
    assert leader.reconcile_records(), "the leader logged no reconcile"
    assert leader.metric("controller_runtime_reconcile_total", controller="my") >= 3
    assert non_lease_writes(leader)["PATCH"] >= 9     # 3 x (Deployment, Service, status)
    assert standby.reconcile_records() == []
    assert standby.metric("controller_runtime_reconcile_total", controller="my") == 0
    assert standby.successful_writes() == dict.fromkeys(("POST", "PUT", "PATCH", "DELETE"), 0)
    # ... although its cache is as warm as the leader's. And its log does not say it
    # works: controller-runtime's "Starting workers" comes with the Lease.
    assert standby.metric("k8s_http_cache_objects", resource=str(MY)) == 3
    assert "Starting workers" in leader.messages()
    assert "Starting workers" not in standby.messages()

    # SIGTERM: the lease is released, the standby takes it at its next poll.
    mark = leader.log_mark()
    sent_at = time.time()
    leader.signal(signal.SIGTERM)
    holder, seconds = wait_handover(api, namespace, leader, sent_at, SIGTERM_HANDOVER_MAX)
    report("SIGTERM (lease released)", seconds)
    assert holder == standby.identity
    assert seconds <= SIGTERM_HANDOVER_MAX
    leader.expect_clean_exit()
    assert any(m.startswith("released lease") for m in leader.messages(mark)), \
        leader.log()[mark:]
    # A clean shutdown says nothing above info (the hand-back is not a loss).
    loud = [r for r in leader.log_records(mark) if r.get("level") not in ("debug", "info")]
    assert loud == [], loud

    # The new leader does the work now.
    eventually(standby.is_leader, timeout=10, interval=0.2)
    eventually(lambda: "Starting workers" in standby.messages(), timeout=10, interval=0.2,
               message="the new leader never said it starts its workers")
    api.patch(MY, "m0", {"spec": {"env": [{"name": "HANDED", "value": "over"}]}},
              namespace=namespace)
    eventually(lambda: api.get(DEPLOYMENTS, "m0", namespace=namespace)["spec"]["template"][
        "spec"]["containers"][0].get("env") == [{"name": "HANDED", "value": "over"}],
        timeout=CONVERGE_TIMEOUT, interval=0.2, message="the new leader did not reconcile")
    assert standby.reconcile_records()

    standby.signal(signal.SIGTERM)
    standby.expect_clean_exit()


def test_a_frozen_leader_writes_nothing_after_it_thaws_and_a_crash_hands_over(
        installed, api, namespace, fleet, admin_kubeconfig):
    ops = start_candidates(fleet, admin_kubeconfig, namespace, ["a", "b", "c"])
    frozen = wait_for_one_leader(ops)
    api.create(MY, make_my("before", namespace))
    eventually(lambda: is_available(api, "before", namespace), timeout=CONVERGE_TIMEOUT,
               interval=0.2, message="'before' never Available")
    for op in ops:
        if op is not frozen:
            assert op.reconcile_records() == [], f"{op} reconciled as a standby"

    # Freeze the leader while it is idle, with a longer pause than the lease.
    writes_before = settled_writes(frozen)
    events_before = frozen.metric("k8s_http_watch_events_total")
    mark = frozen.log_mark()
    frozen_at = time.time()
    frozen_clock = time.monotonic()
    frozen.signal(signal.SIGSTOP)
    try:
        # Work for whoever leads: a new My, then a change to an existing one.
        api.create(MY, make_my("during", namespace))
        holder, seconds = wait_handover(api, namespace, frozen, frozen_at, CRASH_HANDOVER_MAX)
        report("SIGSTOP (leader frozen, lease expired)", seconds)
        assert seconds <= CRASH_HANDOVER_MAX
        successor = by_identity(ops, holder)
        eventually(lambda: is_available(api, "during", namespace), timeout=CONVERGE_TIMEOUT,
                   interval=0.2, message="the successor did not reconcile 'during'")
        api.patch(MY, "before", {"spec": {"env": [{"name": "WHILE", "value": "frozen"}]}},
                  namespace=namespace)
        eventually(lambda: is_available(api, "before", namespace, generation=2),
                   timeout=CONVERGE_TIMEOUT, interval=0.2)
        # The scenario is a 30 s pause: wait out the rest of it.
        time.sleep(max(0.0, FREEZE_SECONDS - (time.monotonic() - frozen_clock)))
    finally:
        frozen.signal(signal.SIGCONT)

    # Resumed: it receives the events buffered in its watch sockets, notices on
    # its own that the renew deadline passed, and goes back to campaigning.
    eventually(lambda: frozen.metric("k8s_http_watch_events_total") > events_before,
               timeout=15, interval=0.2, message="the thawed process saw no watch event")
    eventually(lambda: any(m.startswith("lost lease") and "no successful renewal" in m
                           for m in frozen.messages(mark)), timeout=15, interval=0.2,
               message=f"no 'lost lease' line; log since the freeze:\n{frozen.log()[mark:]}")
    assert not frozen.is_leader()

    def frozen_made_no_write():
        now = frozen.successful_writes()
        # Only successes count: a renewal sent after the thaw would carry a
        # stale resourceVersion (409). One renewal may have been in flight
        # when the process stopped; its answer is counted after the thaw.
        assert {m: v for m, v in now.items() if m != "PUT"} == \
            {m: v for m, v in writes_before.items() if m != "PUT"}, (writes_before, now)
        assert now["PUT"] <= writes_before["PUT"] + 1, (writes_before, now)
        assert frozen.reconcile_records(mark) == [], frozen.reconcile_records(mark)
        return True
    stays_true(frozen_made_no_write, seconds=3.0,
               message="the thawed ex-leader wrote or reconciled")
    assert lease_spec(api, namespace, LEASE)["holderIdentity"] == successor.identity
    assert frozen.proc.poll() is None, "the thawed process exited"
    print(f"\nthawed ex-leader: writes {writes_before} -> {frozen.successful_writes()}")

    # SIGKILL the successor: the lease expires, one of the other two takes over.
    killed_at = time.time()
    successor.signal(signal.SIGKILL)
    api.patch(MY, "during", {"spec": {"port": 9090}}, namespace=namespace)
    holder, seconds = wait_handover(api, namespace, successor, killed_at, CRASH_HANDOVER_MAX)
    report("SIGKILL (leader crashed, lease expired)", seconds)
    assert seconds <= CRASH_HANDOVER_MAX
    third = by_identity(ops, holder)
    eventually(lambda: is_available(api, "during", namespace, generation=2),
               timeout=CONVERGE_TIMEOUT, interval=0.2, message="nobody reconciled after the kill")
    assert api.get(DEPLOYMENTS, "during", namespace=namespace)["spec"]["template"]["spec"][
        "containers"][0]["ports"] == [{"containerPort": 9090, "protocol": "TCP"}]
    assert third.is_leader()
    survivors = [op for op in ops if op is not successor]
    assert [op for op in survivors if op.is_leader()] == [third]
    for op in survivors:
        op.signal(signal.SIGTERM)
    for op in survivors:
        op.expect_clean_exit()
