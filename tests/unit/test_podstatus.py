"""k8s_http.pod_problem: why a workload's Pods are not ready, read off their status."""

from __future__ import annotations

from k8s_http import pod_problem
from k8s_http.control.podstatus import MAX_PROBLEM_CHARS


def pod(name, *, created="2026-12-03T10:00:00Z", containers=(), init=(), conditions=(),
        deleting=False):
    meta = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T10:05:00Z"
    return {"metadata": meta, "status": {"containerStatuses": list(containers),
                                         "initContainerStatuses": list(init),
                                         "conditions": list(conditions)}}


def waiting(reason, message=None, *, restarts=0, last=None, name="app"):
    status = {"name": name, "restartCount": restarts,
              "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}
    if last:
        status["lastState"] = {"terminated": {"reason": last, "exitCode": 137}}
    return status


RUNNING = {"name": "app", "ready": True, "restartCount": 0, "state": {"running": {}}}


def test_healthy_and_starting_pods_have_no_problem():
    assert pod_problem([]) is None
    assert pod_problem([pod("a", containers=[RUNNING])]) is None
    assert pod_problem([pod("a", containers=[waiting("ContainerCreating")])]) is None
    assert pod_problem([pod("a", init=[waiting("PodInitializing")])]) is None


def test_an_image_that_cannot_be_pulled_is_named_with_the_kubelets_message():
    problem = pod_problem([pod("web-1", containers=[
        waiting("ImagePullBackOff", 'Back-off pulling image "nope:1"')])])
    assert problem == 'Pod web-1: container app ImagePullBackOff: Back-off pulling image "nope:1"'


def test_a_crash_loop_says_how_often_and_how_it_last_ended():
    problem = pod_problem([pod("web-1", containers=[
        waiting("CrashLoopBackOff", "back-off 40s", restarts=4, last="OOMKilled")])])
    assert problem == ("Pod web-1: container app CrashLoopBackOff (restarted 4 times, "
                       "last exit OOMKilled): back-off 40s")
    one = pod_problem([pod("w", containers=[waiting("CrashLoopBackOff", restarts=1)])])
    assert one == "Pod w: container app CrashLoopBackOff (restarted 1 time)"


def test_a_missing_secret_key_is_a_create_container_config_error():
    problem = pod_problem([pod("w", containers=[waiting(
        "CreateContainerConfigError", "couldn't find key password in Secret default/db")])])
    assert "CreateContainerConfigError: couldn't find key password in Secret default/db" in problem


def test_a_terminated_container_names_its_reason_and_exit_code_but_completed_is_fine():
    oom = {"name": "app", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    assert pod_problem([pod("w", containers=[oom])]) == \
        "Pod w: container app terminated: OOMKilled (exit code 137)"
    done = {"name": "app", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}
    assert pod_problem([pod("w", containers=[done])]) is None


def test_an_unschedulable_pod_gives_the_schedulers_message():
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient cpu."}
    assert pod_problem([pod("w", conditions=[cond])]) == \
        "Pod w: Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."


def test_init_containers_come_first_and_the_newest_pod_wins():
    old = pod("old", created="2026-12-03T09:00:00Z", containers=[waiting("ErrImagePull")])
    new = pod("new", created="2026-12-03T10:00:00Z",
              init=[waiting("CrashLoopBackOff", name="migrate", restarts=2)],
              containers=[waiting("PodInitializing")])
    assert pod_problem([old, new]).startswith("Pod new: container migrate CrashLoopBackOff")
    # A Pod on its way out is no longer the workload's problem.
    assert pod_problem([old, pod("gone", created="2026-12-03T11:00:00Z", deleting=True,
                                 containers=[waiting("ErrImagePull")])]).startswith("Pod old:")


def test_the_line_is_bounded_and_malformed_status_is_ignored():
    problem = pod_problem([pod("w", containers=[waiting("ErrImagePull", "x" * 5000)])])
    assert len(problem) == MAX_PROBLEM_CHARS and problem.endswith("...")
    junk = [None, "pod", {"metadata": None, "status": None},
            {"status": {"containerStatuses": [None, {"state": None}], "conditions": [3]}}]
    assert pod_problem(junk) is None


# ---------------------------------------------------------------------------
# PodCheckSchedule: when to read the Pods again, and what the last read found


def test_pod_checks_start_with_a_wait_then_double_up_to_the_maximum():
    from k8s_http import PodCheckSchedule
    from tests.support.clock import FakeClock
    clock = FakeClock()
    checks = PodCheckSchedule(first_seconds=5.0, max_seconds=60.0, clock=clock)
    reads = []

    def read(last):
        reads.append(last)
        return f"cause {len(reads)}"
    assert checks.check("k", read) == (None, 5.0) and reads == []
    assert checks.due_at("k") == clock() + 5.0
    clock.advance(2.0)
    assert checks.check("k", read) == (None, 3.0) and reads == []      # not due yet
    clock.advance(3.0)
    assert checks.check("k", read) == ("cause 1", 10.0)
    clock.advance(4.0)
    assert checks.check("k", read) == ("cause 1", 6.0)                # the last cause stands
    intervals = []
    for _ in range(4):
        clock.advance(checks.due_at("k") - clock())
        intervals.append(checks.check("k", read)[1])
    assert intervals == [20.0, 40.0, 60.0, 60.0]
    assert reads == [None, "cause 1", "cause 2", "cause 3", "cause 4"]


def test_a_failed_read_keeps_the_last_cause_and_stop_forgets_it():
    from k8s_http import PodCheckSchedule
    from tests.support.clock import FakeClock
    clock = FakeClock()
    checks = PodCheckSchedule(first_seconds=5.0, max_seconds=60.0, clock=clock)
    checks.check("k", lambda last: "x")
    clock.advance(5.0)
    assert checks.check("k", lambda last: "OOMKilled")[0] == "OOMKilled"
    clock.advance(10.0)
    assert checks.check("k", lambda last: last)[0] == "OOMKilled"     # the read failed
    checks.stop("k")
    assert checks.due_at("k") is None
    assert checks.check("k", lambda last: "x") == (None, 5.0)         # starts over
