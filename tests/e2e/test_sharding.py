"""Active-active (issue 37, docs/SHARDING.md): 3 `controller.py --shards=auto` processes
on the real control plane, with the `ShardedListAndWatch` gate on and off.

Per gate, one plane of its own (pods=False, an audit log of every write to Mys
and their children; each replica's User-Agent ends in `shard/<its name>`):

- the replicas split the 256 slots between them, and every `My` converges;
- each object is written by exactly one replica while membership is steady
  (audit log), and by no two replicas interleaved across the handovers;
- SIGKILL of one replica: the others' slots go on being served (new `My`
  there converge as fast as before), its slots are claimed within the Lease
  duration + 2 s and its `My` converge;
- SIGTERM of one replica: its slots are claimed at once (goal <= 2 s).

The figures are printed (`pytest -s`).
"""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict

import pytest

from k8s_http.core.objects import LEASES
from k8s_http.core.shards import slot_of
from k8s_http.control.sharding import decode_slots
from tests.e2e.operator_process import MY, install_manifests, is_available, make_my
from tests.support.controlplane import ControlPlane, ControlPlaneError
from tests.support.wait import eventually

LEASE_DURATION = 15.0
APP = "my-controller"
SLOTS_ANNOTATION = "sharding.mine.jp/slots"
REPLICAS = ("shard-a", "shard-b", "shard-c")

pytestmark = [pytest.mark.timeout(420)]

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: "mine.jp"
    resources: ["mys", "mys/status"]
  - group: "apps"
    resources: ["deployments"]
  - group: ""
    resources: ["services"]
- level: None
"""


@pytest.fixture(scope="module", params=["true", "false"], ids=["gate-on", "gate-off"])
def plane(request, tmp_path_factory):
    audit_dir = tmp_path_factory.mktemp("audit")
    policy = audit_dir / "policy.yaml"
    policy.write_text(AUDIT_POLICY)
    log_path = audit_dir / "audit.log"
    plane = ControlPlane(pods=False, apiserver_args=[
        f"--feature-gates=ShardedListAndWatch={request.param}",
        f"--audit-policy-file={policy}", f"--audit-log-path={log_path}"])
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    plane.audit_log = log_path
    plane.gate = request.param
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def admin_kubeconfig(plane) -> str:
    """This module's plane, for conftest's `api`, `namespace` and `fleet`."""
    return str(plane.admin_kubeconfig)


def writes(plane) -> list[tuple[float, str, str, str]]:
    """(time, replica, namespace/name, resource) of every successful write by a replica."""
    out = []
    for line in plane.audit_log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        agent = event.get("userAgent") or ""
        code = (event.get("responseStatus") or {}).get("code", 0)
        if " shard/" not in agent or not 200 <= code < 300 or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        when = event.get("stageTimestamp") or ""
        out.append((when, agent.rsplit("shard/", 1)[1], f"{ref.get('namespace')}/{ref.get('name')}",
                    ref.get("resource", "")))
    out.sort()
    return out


def owners_by_object(plane, namespace) -> dict[str, list[str]]:
    """Per My in `namespace` (its children share its name): the sequence of
    replicas that wrote it."""
    seq: dict[str, list[str]] = defaultdict(list)
    for _, replica, obj, _ in writes(plane):
        if not obj.startswith(f"{namespace}/"):
            continue
        if not seq[obj] or seq[obj][-1] != replica:
            seq[obj].append(replica)
    return seq


def lease_slots(client, namespace, replica) -> frozenset[int]:
    lease = client.get(LEASES, f"{APP}-member-{replica}", namespace=namespace)
    return decode_slots(((lease.get("metadata") or {}).get("annotations") or {})
                        .get(SLOTS_ANNOTATION))


def held(op) -> float:
    return op.metric("k8s_http_shard_slots_held")


def create_mys(client, namespace, prefix, count) -> dict[str, int]:
    """name -> slot of each new My."""
    out = {}
    for i in range(count):
        made = client.create(MY, make_my(f"{prefix}-{i}", namespace), namespace=namespace)
        out[made["metadata"]["name"]] = slot_of(made["metadata"]["uid"])
    return out


def wait_available(client, namespace, names, timeout) -> float:
    start = time.monotonic()
    eventually(lambda: all(is_available(client, n, namespace) for n in names),
               timeout=timeout, interval=0.2,
               message=f"not all of {len(names)} My available")
    return time.monotonic() - start


@pytest.mark.mys_deleted_first
def test_three_replicas_share_fail_over_and_hand_over(plane, api, namespace, fleet, monkeypatch):
    install_manifests(plane)
    client = api
    figures = {}
    try:
        ops = {name: start_replica(fleet, plane, namespace, monkeypatch, name)
               for name in REPLICAS}
        for op in ops.values():
            op.wait_ready()
        eventually(lambda: sum(held(op) for op in ops.values()) == 256
                   and all(held(op) > 0 for op in ops.values()),
                   timeout=30, interval=0.2, message="the slots were not shared out")
        shares = {n: lease_slots(client, namespace, n) for n in REPLICAS}
        assert sum(len(s) for s in shares.values()) == 256
        assert frozenset().union(*shares.values()) == frozenset(range(256))
        figures["slots per replica"] = {n: len(s) for n, s in shares.items()}

        # Steady state: every My converges, each written by one replica only.
        steady = create_mys(client, namespace, "steady", 30)
        figures["steady: converge s"] = round(wait_available(client, namespace, steady, 60), 2)
        seq = owners_by_object(plane, namespace)
        doubled = {o: s for o, s in seq.items() if len(s) > 1}
        assert not doubled, f"written by two replicas: {doubled}"
        for name, slot in steady.items():
            (writer,) = seq[f"{namespace}/{name}"]
            assert slot in shares[writer], f"{name} (slot {slot}) written by {writer}"
        per_replica = defaultdict(int)
        for obj, s in seq.items():
            per_replica[s[0]] += 1
        figures["steady: My per replica"] = dict(per_replica)
        for name, op in ops.items():
            assert op.metric("k8s_http_cache_objects", resource=str(MY)) == \
                sum(1 for n, s in steady.items() if s in shares[name])

        # SIGKILL one replica: the others keep serving; its slots move after expiry.
        victim, survivors = "shard-a", ("shard-b", "shard-c")
        ops[victim].signal(signal.SIGKILL)
        killed = time.monotonic()
        after_kill = create_mys(client, namespace, "kill", 30)
        theirs = [n for n, s in after_kill.items() if s not in shares[victim]]
        orphans = [n for n, s in after_kill.items() if s in shares[victim]]
        figures["kill: others' My converge s"] = round(
            wait_available(client, namespace, theirs, 10), 2)
        eventually(lambda: sum(held(ops[n]) for n in survivors) == 256, timeout=30,
                   interval=0.1, message="the dead replica's slots were not claimed")
        figures["kill: slots claimed after s"] = round(time.monotonic() - killed, 2)
        wait_available(client, namespace, orphans, 30)
        figures["kill: its My converged after s"] = round(time.monotonic() - killed, 2)
        assert figures["kill: slots claimed after s"] <= LEASE_DURATION + 2 + 1.0

        # SIGTERM another: handover through the released Lease.
        leaving, staying = "shard-b", "shard-c"
        before = lease_slots(client, namespace, leaving)
        ops[leaving].signal(signal.SIGTERM)
        termed = time.monotonic()
        eventually(lambda: held(ops[staying]) == 256, timeout=20, interval=0.05,
                   message="the leaving replica's slots were not claimed")
        figures["term: slots claimed after s"] = round(time.monotonic() - termed, 2)
        after_term = create_mys(client, namespace, "term", 10)
        moved = [n for n, s in after_term.items() if s in before]
        wait_available(client, namespace, list(after_term), 30)
        figures["term: claimed + new My converged s"] = round(time.monotonic() - termed, 2)
        ops[leaving].expect_clean_exit(20)

        # Everything converged; no object ever had two writers interleaved.
        everything = [*steady, *after_kill, *after_term]
        wait_available(client, namespace, everything, 30)
        seq = owners_by_object(plane, namespace)
        interleaved = {o: s for o, s in seq.items() if len(s) > 2 or (
            len(s) == 2 and s[0] not in (victim, leaving))}
        figures["objects written by two replicas at once"] = len(interleaved)
        figures["moved on SIGTERM (new My)"] = len(moved)
        assert not interleaved, interleaved
        assert figures["term: slots claimed after s"] <= 2.0
        # What the replica found out about the apiserver, said in a metric.
        assert ops[staying].metric("k8s_http_shard_server_filtered") == \
            (1.0 if plane.gate == "true" else 0.0)
    finally:
        print(f"\nsharding e2e, gate {plane.gate}:")
        for key, value in figures.items():
            print(f"  {key}: {value}")
        fleet.close()


def start_replica(fleet, plane, namespace, monkeypatch, name):
    monkeypatch.setenv("POD_NAME", name)
    return fleet.start(name, plane.admin_kubeconfig, "--namespace", namespace,
                       "--shards", "auto", "--leader-election-namespace", namespace,
                       "--graceful-shutdown-timeout", "10s")


@pytest.mark.mys_deleted_first
def test_one_to_three_to_one_under_a_stream_of_new_my(plane, api, namespace, fleet, monkeypatch):
    """Scale 1 -> 3 -> 1 (processes standing in for `kubectl scale`) while My keep
    coming: the first replica hands slots over by the release handshake, then
    takes them back; nothing is lost, nothing written by two replicas at once."""
    install_manifests(plane)
    first = start_replica(fleet, plane, namespace, monkeypatch, "solo")
    first.wait_ready()
    eventually(lambda: held(first) == 256, timeout=20, interval=0.1, message="solo not at 256")
    made: dict[str, int] = {}
    made.update(create_mys(api, namespace, "one", 10))
    wait_available(api, namespace, made, 60)
    more = [start_replica(fleet, plane, namespace, monkeypatch, n) for n in ("two", "three")]
    for op in more:
        op.wait_ready()
    batch = 0
    deadline = time.monotonic() + 30
    while not (all(held(op) > 0 for op in more)
               and sum(held(op) for op in (first, *more)) == 256):
        assert time.monotonic() < deadline, "the slots were not shared out"
        made.update(create_mys(api, namespace, f"up{batch}", 2))
        batch += 1
        time.sleep(0.2)
    made.update(create_mys(api, namespace, "three", 10))
    # Every My changes while 3 replicas run: each writes its own share.
    roll_out(api, namespace, made, "nginx:1.28")
    for op in more:
        op.signal(signal.SIGTERM)
    for n in range(5):
        made.update(create_mys(api, namespace, f"down{n}", 2))
        time.sleep(0.2)
    for op in more:
        op.expect_clean_exit(20)
    eventually(lambda: held(first) == 256, timeout=10, interval=0.1,
               message="solo did not take every slot back")
    roll_out(api, namespace, made, "nginx:1.29")     # and solo writes all of them again
    seq = owners_by_object(plane, namespace)
    # Each object's writers may change once per handover (solo -> another ->
    # solo), never back and forth within one.
    interleaved = {o: s for o, s in seq.items() if len(s) > 3 or (len(s) == 3 and s[0] != s[2])}
    print(f"\nscale 1 -> 3 -> 1, gate {plane.gate}: {len(made)} My converged, "
          f"objects by replicas {dict(_count_by_writer(seq))}, "
          f"interleaved {len(interleaved)}")
    assert not interleaved, interleaved
    by_writer = _count_by_writer(seq)
    assert by_writer["two"] and by_writer["three"] and by_writer["solo"] == len(made)


def roll_out(api, namespace, names, image) -> None:
    """Change every My's image and wait until each is Available at its new generation."""
    generations = {n: api.patch(MY, n, {"spec": {"image": image}}, namespace=namespace)
                   ["metadata"]["generation"] for n in names}
    eventually(lambda: all(is_available(api, n, namespace, g) for n, g in generations.items()),
               timeout=60, interval=0.3, message=f"not all My rolled out to {image}")


def _count_by_writer(seq):
    out = defaultdict(int)
    for writers in seq.values():
        for w in set(writers):
            out[w] += 1
    return out
