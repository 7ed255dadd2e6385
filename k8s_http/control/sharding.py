"""Active-active: each replica works on its share of the slots (issue 37, docs/SHARDING.md).

    member = ShardMember(ApiClient(client.transport), namespace="ns", app="my-controller",
                         member_name="pod-0", label_domain="sharding.mine.jp", ...)
    client.write_guard = member.check           # writes fenced by slot
    member.start(); ...; member.leave()         # leave() on SIGTERM: handover at once

Membership: every replica holds its own Lease `<app>-member-<member name>`,
labelled `<domain>/ring=<app>`, through a `LeaderElector` (leader.py: the
same monotonic-clock rules, renewals and release; the Lease has one holder,
us, so "leading" it means "being a member"). The Lease's annotation
`<domain>/slots` publishes the slots the member works on (or claims), as a
bitmap of SLOTS bits in hex (`encode_slots`).

The ring loop lists the ring's Leases every `poll_seconds` (a consistent
read) and runs the handshake of docs/SHARDING.md section 4 (`plan` decides):

1. release first: a held slot the member no longer owns in `assign(live)` is
   fenced at once (the guard refuses its writes, its keys are dropped), its
   in-flight reconciles are waited for, the informers drop it, and only then
   is the bitmap published without it;
2. claim only what no other live Lease lists;
3. confirm after the claiming write: a list made after it returns shows every
   write that landed before it; a slot another live Lease lists by then is
   withdrawn (both claimants may withdraw: the next round settles it);
4. a Lease not seen changing for its duration (or with no holder: released)
   lists nothing; its holder stopped at its renew deadline, 5 s before.

Fencing: the runner's reconcile runs inside `working(slot)`, which sets a
context variable; `check()` (the write guard) refuses a write unless the
member Lease is held within its renew deadline and that slot (if any) is
held. Writes outside a reconcile (Events) need only the Lease.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..core import errors, shards
from ..core.objects import LEASES
from ..ops.metrics import Metrics
from .leader import (LEASE_DURATION_SECONDS, LeaderElector, LeaderRecord, Observation,
                     is_expired, observe)

__all__ = ["ShardMember", "NotOwnerError", "encode_slots", "decode_slots", "plan", "Plan",
           "live_claims", "current_slot"]

log = logging.getLogger(__name__)

# How often the ring's Leases are listed: a released slot is claimed within
# about this long (plus a claim write and a list).
POLL_SECONDS = 0.5

_SLOT: contextvars.ContextVar[int | None] = contextvars.ContextVar("k8s_http_shard_slot",
                                                                   default=None)


class NotOwnerError(errors.NotLeaderError):
    """A write for a slot this replica does not hold (any more) was refused locally."""


def current_slot() -> int | None:
    """The slot of the reconcile running on this thread (None outside one)."""
    return _SLOT.get()


# ---------------------------------------------------------------------------
# Pure parts


def encode_slots(slots: Iterable[int]) -> str:
    """SLOTS bits as hex, slot 0 the lowest bit: 64 digits for 256 slots."""
    bits = 0
    for slot in slots:
        if not 0 <= slot < shards.SLOTS:
            raise ValueError(f"slot {slot} is not in [0, {shards.SLOTS})")
        bits |= 1 << slot
    return f"{bits:0{shards.SLOTS // 4}x}"


def decode_slots(text: object) -> frozenset[int]:
    """The slots of an annotation; garbage reads as none (never raises)."""
    if not isinstance(text, str) or not text:
        return frozenset()
    try:
        bits = int(text, 16)
    except ValueError:
        return frozenset()
    return frozenset(s for s in range(shards.SLOTS) if bits >> s & 1)


def live_claims(leases: Iterable[dict], own_lease: str, annotation: str,
                observed: dict[str, Observation], now: float
                ) -> tuple[set[str], dict[str, frozenset[int]]]:
    """(live member identities but ours, identity -> slots its Lease lists).

    `observed` (lease name -> Observation) is updated in place: a Lease is live
    while its record changed less than its duration ago on OUR clock, and it
    has a holder (a released Lease has none).
    """
    members: set[str] = set()
    claims: dict[str, frozenset[int]] = {}
    seen = set()
    for lease in leases:
        meta = lease.get("metadata") or {}
        name = meta.get("name") or ""
        if name == own_lease:
            continue
        seen.add(name)
        record = LeaderRecord.from_lease(lease)
        observation = observe(observed.get(name), record, now)
        observed[name] = observation
        if not record.holder or is_expired(observation, now,
                                           default_duration_seconds=LEASE_DURATION_SECONDS):
            continue
        members.add(record.holder)
        claims[record.holder] = decode_slots((meta.get("annotations") or {}).get(annotation))
    for gone in set(observed) - seen:
        del observed[gone]
    return members, claims


@dataclass(frozen=True)
class Plan:
    want: frozenset[int]       # the slots assign() gives us
    release: frozenset[int]    # held, no longer ours: stop, then publish without them
    claim: frozenset[int]      # ours, not held, listed by no other live Lease


def plan(me: str, others: Iterable[str], held: frozenset[int],
         claims: Mapping[str, frozenset[int]]) -> Plan:
    """Rules 1 and 2 of the handshake: what to release and what to claim now."""
    want = shards.slots_of(me, {me, *others})
    taken = frozenset().union(*claims.values()) if claims else frozenset()
    return Plan(want, held - want, (want - held) - taken)


# ---------------------------------------------------------------------------
# The member


class ShardMember:
    """One replica's membership, its slots, the handshake and the write fence.

    `on_change(held)` is called (on the ring thread) with the new held set
    after a release has fenced the slots and after a claim is confirmed: it
    re-selects the informers. `slot_of(obj)` gives an object's slot.
    """

    def __init__(self, client, *, namespace: str, app: str, member_name: str, identity: str,
                 label_domain: str, on_change: Callable[[frozenset[int]], None],
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic,
                 poll_seconds: float = POLL_SECONDS, drain_timeout_seconds: float = 25.0):
        self._client = client
        self.namespace = namespace
        self.app = app
        self.identity = identity
        self.ring_label = f"{label_domain}/ring"
        self.slots_annotation = f"{label_domain}/slots"
        self.lease_name = f"{app}-member-{member_name}"
        self._on_change = on_change
        self._clock = clock
        self._poll_seconds = poll_seconds
        self._drain_timeout_seconds = drain_timeout_seconds
        self.metrics = metrics if metrics is not None else Metrics()
        self.elector = LeaderElector(client, namespace=namespace, name=self.lease_name,
                                     identity=identity, metrics=self.metrics, clock=clock,
                                     decorate=self._decorate)
        self._cond = threading.Condition()
        self._held: frozenset[int] = frozenset()        # work allowed (guarded by _cond)
        self._published: frozenset[int] = frozenset()   # what our Lease says
        self._in_flight: dict[int, int] = {}             # slot -> reconciles running
        self._observed: dict[str, Observation] = {}
        self._members: set[str] = set()
        self._listed = False
        self._left = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.metrics.init_shards()
        self._m_slots = self.metrics.shard_slots_held
        self._m_members = self.metrics.shard_members
        self._m_conflicts = self.metrics.shard_claim_conflicts_total
        self._m_server = self.metrics.shard_server_filtered

    # ---- what others ask --------------------------------------------------

    @property
    def held(self) -> frozenset[int]:
        with self._cond:
            return self._held

    def is_member(self) -> bool:
        return self.elector.is_leader()

    def ready(self) -> tuple[bool, str]:
        if not self.is_member():
            return False, f"member lease {self.lease_name} not held"
        if not self._listed:
            return False, "ring not listed yet"
        return True, f"{len(self.held)} slots held"

    def check(self) -> None:
        """The write guard: our Lease is current, and the reconcile's slot is ours."""
        if not self.elector.is_leader():
            raise NotOwnerError(f"member lease {self.namespace}/{self.lease_name} not held: "
                                "write refused")
        slot = _SLOT.get()
        if slot is not None and slot not in self.held:
            raise NotOwnerError(f"slot {slot} is not held by this replica: write refused")

    @contextlib.contextmanager
    def working(self, slot: int | None):
        """Around a reconcile: yields False (skip it) when `slot` is not held; else
        counts it in flight (a release waits for it) and fences its writes."""
        with self._cond:
            allowed = slot is None or slot in self._held
            if allowed and slot is not None:
                self._in_flight[slot] = self._in_flight.get(slot, 0) + 1
        if not allowed:
            yield False
            return
        token = _SLOT.set(slot)
        try:
            yield True
        finally:
            _SLOT.reset(token)
            if slot is not None:
                with self._cond:
                    self._in_flight[slot] -= 1
                    if not self._in_flight[slot]:
                        del self._in_flight[slot]
                    self._cond.notify_all()

    # ---- the lease ----------------------------------------------------------

    def _decorate(self, body: dict) -> None:
        meta = body["metadata"]
        meta.setdefault("labels", {})[self.ring_label] = self.app
        meta.setdefault("annotations", {})[self.slots_annotation] = encode_slots(
            () if self._left else self._published)

    def _publish(self) -> bool:
        return self.elector.try_acquire_or_renew()

    # ---- running --------------------------------------------------------------

    def start(self) -> None:
        lease = threading.Thread(target=self.elector.run, name="shard-member-lease",
                                 args=(self._stop, self._on_member, self._on_not_member),
                                 daemon=True)
        ring = threading.Thread(target=self._run_ring, name="shard-ring", daemon=True)
        self._threads = [lease, ring]
        for thread in self._threads:
            thread.start()

    def _on_member(self) -> None:
        log.info("joined the ring as %s (lease %s/%s)", self.identity, self.namespace,
                 self.lease_name)

    def _on_not_member(self) -> None:
        """Our Lease lapsed (renew deadline): everything is fenced already (check()
        reads the deadline); let the slots go so a new term starts from nothing."""
        log.warning("member lease lost: dropping every slot")
        self._release(self.held, publish=False)

    def _run_ring(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            try:
                self.tick()
            except (errors.ApiError, errors.TransportError) as exc:
                log.warning("shard ring round failed", extra={"error": str(exc)})
            except Exception:
                log.exception("shard ring round failed unexpectedly")

    def _list_claims(self) -> tuple[set[str], dict[str, frozenset[int]]]:
        result = self._client.list(LEASES, namespace=self.namespace,
                                   label_selector=f"{self.ring_label}={self.app}")
        members, claims = live_claims(result.get("items") or [], self.lease_name,
                                      self.slots_annotation, self._observed, self._clock())
        return members, claims

    def tick(self) -> None:
        """One round of the handshake."""
        if self._left or not self.elector.is_leader():
            return
        if not self._listed:
            self._probe_server_filtering()
        others, claims = self._list_claims()
        if others != self._members:
            log.info("ring members: %s", sorted({self.identity, *others}))
        self._members = others
        self._m_members.set(len(others) + 1)
        step = plan(self.identity, others, self.held, claims)
        if step.release:
            self._release(step.release)
        if step.claim and not self._stop.is_set():
            self._claim(step.claim)
        self._listed = True

    def _release(self, slots: frozenset[int], *, publish: bool = True) -> None:
        if not slots:
            return
        started = self._clock()
        with self._cond:
            self._held = self._held - slots          # fenced from here on
            self._m_slots.set(len(self._held))
            drained = self._cond.wait_for(
                lambda: not any(self._in_flight.get(s) for s in slots),
                timeout=self._drain_timeout_seconds)
            held = self._held
        if not drained:
            log.error("reconciles of released slots still running after %.0f s",
                      self._drain_timeout_seconds)
        self._on_change(held)
        self._published = held
        if publish:
            self._publish()
        log.info("released %d slots (%d held) in %.3f s", len(slots), len(held),
                 self._clock() - started)

    def _claim(self, slots: frozenset[int]) -> None:
        started = self._clock()
        held = self.held
        self._published = held | slots
        if not self._publish():
            self._published = held
            return
        # Rule 3: this list is made after our write landed, so it shows every
        # claim that landed before ours.
        _, claims = self._list_claims()
        taken = frozenset().union(*claims.values()) if claims else frozenset()
        conflict = slots & taken
        if conflict:
            self._m_conflicts.inc(len(conflict))
            log.info("withdrawing %d claimed slots another member claimed too", len(conflict))
            slots = slots - conflict
            self._published = held | slots
            self._publish()
        if not slots or not self.elector.is_leader():
            return
        with self._cond:
            self._held = self._held | slots
            self._m_slots.set(len(self._held))
            held = self._held
        self._on_change(held)
        log.info("claimed %d slots (%d held) in %.3f s", len(slots), len(held),
                 self._clock() - started)

    def _probe_server_filtering(self) -> None:
        """Does the apiserver apply shardSelector? Lists of built-ins echo it (docs/SHARDING.md)."""
        selector = shards.Ranges.everything().shard_selector()
        try:
            result = self._client.list(LEASES, namespace=self.namespace, limit=1,
                                       label_selector=f"{self.ring_label}={self.app}",
                                       shard_selector=selector)
        except (errors.ApiError, errors.TransportError) as exc:
            log.info("shardSelector probe failed: %s", exc)
            return
        on = shards.is_server_filtered(result.get("metadata"), selector)
        self._m_server.set(1 if on else 0)
        log.info("the apiserver %s shardSelector%s", "applies" if on else "ignores",
                 "" if on else ": every replica lists everything and filters itself")

    def leave(self) -> None:
        """On shutdown, after the workers stopped: publish nothing and release the Lease."""
        self._left = True
        self._stop.set()
        with self._cond:
            self._held = frozenset()
            self._m_slots.set(0)
        self._published = frozenset()
        try:
            self.elector.release()
        except Exception:
            log.exception("releasing the member lease failed")
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)
