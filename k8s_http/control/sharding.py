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
bitmap of SLOTS bits in hex (`encode_slots`). Every write of the Lease,
renewals included, carries the annotation, so the Lease catches up with the
member within a renewal period even when a write of the ring loop failed.

The ring's Leases are watched (an Informer over the label): a round runs
on every change of one and at least every `round_seconds`, which is what
lets a silent Lease expire on time. A round reads the watch's cache, so one
that finds nothing to do costs no request; one that would release or claim
first lists the ring (a consistent read) and acts on that list alone. Before
the watch's first list, and while its watch is down, every round lists. Each
round runs the handshake of docs/SHARDING.md section 4 (`plan` decides; rule 5
there, leaving, is `leave()`):

1. release first: a held slot the member no longer owns in `assign(live)` is
   released at once (no new reconcile of it starts: its keys are dropped),
   its in-flight reconciles are waited for (they finish, writes included:
   nobody else may write the slot yet), the informers drop it, and only then
   is the bitmap published without it. A slot whose reconciles outlive the
   wait stays published ("draining") until they return;
2. claim only what no other live Lease lists;
3. confirm after the claiming write: a list made after it returns shows every
   write that landed before it; a slot another live Lease lists by then is
   withdrawn (both claimants may withdraw: the next round settles it);
4. a Lease not seen changing for its duration (or with no holder: released)
   lists nothing; its holder stopped at its renew deadline, 5 s before. A
   Lease that vanished (deleted) lists what it last listed until then. The
   watch's cache and the lists are two views of the ring, one perhaps behind
   the other: a Lease's record is taken only from a view at least as recent
   (by resourceVersion) as the one it was last taken from, so a cache behind
   a list never makes a Lease look renewed (or expired) again. A member
   whose own Lease lapsed counts no Lease expired until REJOIN_GRACE_SECONDS
   after it is back: what it could not see renewed meanwhile was most likely
   as cut off as itself, and re-joins within that time.
6. an expired Lease is deleted (by any member, on condition that it is still
   the record found expired: a renewal in between makes the delete fail).
   Otherwise a replica that starts later, and has not seen the Lease
   unchanged for its duration on its own clock, would count a member that
   died long ago as live for a whole duration: a share too small, and slots
   moved again once it expires. An expired Lease gone from a view is kept in
   mind a while longer (`FORGET_SECONDS`), so that a view behind that one,
   still showing it, shows it expired and not new.

Fencing: the runner's reconcile runs inside `working(slot)`, which sets a
context variable; `check()` (the write guard) refuses a write unless the
member Lease is held within its renew deadline and that slot is still ours:
held, or released but still published because this very reconcile (or
another that began while it was held) has not returned. A reconcile of a key
whose object is not cached runs with `UNCACHED`, never ours: without an
object there is no slot to fence by, and nothing to write. Writes outside a
reconcile (Events) need only the Lease.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..cache.informer import Informer, own_key
from ..core import errors, shards
from ..core.objects import LEASES, is_older_version
from ..ops.metrics import Metrics
from .leader import (JITTER_FACTOR, LEASE_DURATION_SECONDS, RETRY_PERIOD_SECONDS,
                     LeaderElector, LeaderRecord, Observation, is_expired, observe)

__all__ = ["ShardMember", "NotOwnerError", "encode_slots", "decode_slots", "plan", "Plan",
           "SeenLease", "live_claims", "expired_leases", "counts_expired", "current_slot",
           "UNCACHED"]

log = logging.getLogger(__name__)

# The longest time between two rounds: a Lease that stopped changing is found
# expired within about this long after its duration. Changes of the ring come
# through the watch and start a round at once. A round that needs no request
# costs ~0.2 ms (the assignment of a set of members is remembered; ~2 ms without).
ROUND_SECONDS = 0.5

# How long an expired Lease is remembered once no view shows it (rule 6): a
# view behind the one that saw it deleted (the watch's cache behind a list)
# must find it expired, not new. Watch delivery lags by milliseconds; a
# stalled watch is restarted well within this.
FORGET_SECONDS = 4 * LEASE_DURATION_SECONDS

# For this long after its Lease lapsed and was held again, a member counts no
# other Lease expired (rule 4). Our Lease lapses when we cannot reach the
# apiserver, and then, most likely, neither could the others: their Leases
# look unchanged to us only because we could not see them renewed. Counted
# out at once, their slots would all be ours (after an outage the first
# member back claimed all 256, and listed every object, until the others
# re-joined a second later and it let their shares go). Each retries within
# RETRY_PERIOD x (1 + JITTER) of the apiserver's return (leader.py's
# campaign), and we re-joined after it returned; one round more to see their
# write. A member that died meanwhile has its share taken this much later.
REJOIN_GRACE_SECONDS = RETRY_PERIOD_SECONDS * (1 + JITTER_FACTOR) + ROUND_SECONDS

# The slot of a reconcile whose object is not cached: never held, so its
# writes are refused (see the module docstring).
UNCACHED = -1

_SLOT: contextvars.ContextVar[int | None] = contextvars.ContextVar("k8s_http_shard_slot",
                                                                   default=None)


class NotOwnerError(errors.NotLeaderError):
    """A write for a slot this replica does not hold (any more) was refused locally."""


def current_slot() -> int | None:
    """The slot of the reconcile running on this thread (`UNCACHED` for a key whose
    object is not cached; None outside a reconcile)."""
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


@dataclass(frozen=True)
class SeenLease:
    """Another member's Lease as we last saw it: its record (and when, on our
    clock, it last changed), the slots it listed, and the resourceVersion of
    the Lease we read them from."""

    observation: Observation
    slots: frozenset[int]
    resource_version: str | None = None
    unlisted_since: float | None = None     # our clock: since when no view shows it


def counts_expired(lease: SeenLease, now: float, not_before: float = -math.inf) -> bool:
    """Rule 4: the Lease has not changed for its duration on our clock, and we
    are past `not_before` (a re-joined member's grace: REJOIN_GRACE_SECONDS)."""
    return now >= not_before and is_expired(
        lease.observation, now, default_duration_seconds=LEASE_DURATION_SECONDS)


def live_claims(leases: Iterable[dict], own_lease: str, annotation: str,
                seen: dict[str, SeenLease], now: float, not_expired_before: float = -math.inf
                ) -> tuple[set[str], dict[str, frozenset[int]]]:
    """(live member identities but ours, identity -> slots its Lease lists).

    `seen` (lease name -> SeenLease) is updated in place. A Lease is live
    while its record changed less than its duration ago on OUR clock and it
    has a holder (a released Lease has none). A Lease missing from `leases`
    (deleted) stays in `seen`, live with what it last listed, until it would
    have expired: its member may work on until its renew deadline, and
    nothing else says it stopped. Expired ones still listed stay in `seen`
    too, or they would look new (and live) on the next round. A Lease older
    (by resourceVersion) than the one `seen` was taken from is skipped: the
    watch's cache may lag a list, and its older record would restart the
    clock of a member that stopped. An expired Lease no view shows any more
    is forgotten `FORGET_SECONDS` later (rule 6). Before `not_expired_before`
    (our clock) no Lease counts as expired.
    """
    listed = set()
    for lease in leases:
        meta = lease.get("metadata") or {}
        name = meta.get("name") or ""
        if name == own_lease:
            continue
        listed.add(name)
        before = seen.get(name)
        version = meta.get("resourceVersion")
        if before is not None and is_older_version(version, before.resource_version):
            continue
        seen[name] = SeenLease(
            observe(before.observation if before else None, LeaderRecord.from_lease(lease), now),
            decode_slots((meta.get("annotations") or {}).get(annotation)),
            version if isinstance(version, str) else None)
    members: set[str] = set()
    claims: dict[str, frozenset[int]] = {}
    for name, lease in list(seen.items()):
        unlisted_since = None if name in listed else (
            now if lease.unlisted_since is None else lease.unlisted_since)
        if unlisted_since != lease.unlisted_since:
            seen[name] = lease = dataclasses.replace(lease, unlisted_since=unlisted_since)
        if counts_expired(lease, now, not_expired_before):
            if unlisted_since is not None and now - unlisted_since >= FORGET_SECONDS:
                del seen[name]
            continue
        holder = lease.observation.record.holder
        if holder:
            members.add(holder)
            claims[holder] = lease.slots
    return members, claims


def expired_leases(seen: Mapping[str, SeenLease], now: float,
                   not_expired_before: float = -math.inf) -> dict[str, str]:
    """Rule 6: lease name -> resourceVersion of each Lease the last view showed
    that has not changed for its duration on our clock (or was released that
    long ago), past `not_expired_before`: what may be deleted, on condition that
    it is still that version."""
    return {name: lease.resource_version for name, lease in seen.items()
            if lease.unlisted_since is None and lease.resource_version is not None
            and counts_expired(lease, now, not_expired_before)}


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


class _Wake:
    """The ring informer's queue: a change of any ring Lease wakes the ring thread."""

    def __init__(self, event: threading.Event):
        self._event = event

    def add(self, _key) -> None:
        self._event.set()


class ShardMember:
    """One replica's membership, its slots, the handshake and the write fence.

    `on_change(held)` is called with the new held set after a release has
    fenced the slots and after a claim is confirmed: it re-selects the
    informers. `on_drain_timeout(slots)` is called when reconciles of released
    slots are still running after `drain_timeout_seconds` (the slots stay
    published until they return; the Manager exits, as when a lost leader's
    reconciles do not finish).

    The slots, each set guarded by `_cond`:

    - `_held`: new reconciles of these slots may start (and write);
    - `_draining`: released, so no new reconcile starts, but one that began
      while they were held is still running: they stay published, nobody
      may claim them, and that reconcile may finish its writes;
    - `_published`: what every write of our Lease says.

    Invariants: `_held` and `_draining` are disjoint; the Lease lists (or is
    about to list) every slot of both, so no other member claims a slot we may
    still write; outside a claim in progress `_published` is exactly
    `_held | _draining`. The sets change only under `_transition`, one change
    at a time: the ring thread's rounds, the lease thread's drop when the
    Lease lapses, and leave() never interleave.
    """

    def __init__(self, client, *, namespace: str, app: str, member_name: str, identity: str,
                 label_domain: str, on_change: Callable[[frozenset[int]], None],
                 on_drain_timeout: Callable[[frozenset[int]], None] | None = None,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic,
                 round_seconds: float = ROUND_SECONDS, drain_timeout_seconds: float = 25.0,
                 ring: Informer | None = None):
        self._client = client
        self.namespace = namespace
        self.app = app
        self.identity = identity
        self.ring_label = f"{label_domain}/ring"
        self._ring_selector = f"{self.ring_label}={app}"     # the ring's Leases
        self.slots_annotation = f"{label_domain}/slots"
        self.lease_name = f"{app}-member-{member_name}"
        self._on_change = on_change
        self._on_drain_timeout = on_drain_timeout
        self._clock = clock
        self._round_seconds = round_seconds
        self._drain_timeout_seconds = drain_timeout_seconds
        self.metrics = metrics if metrics is not None else Metrics()
        self.elector = LeaderElector(client, namespace=namespace, name=self.lease_name,
                                     identity=identity, metrics=self.metrics, clock=clock,
                                     decorate=self._decorate)
        # The ring's Leases, watched: any change of one wakes the ring thread.
        # (`ring`: a stand-in the tests fill; it needs has_synced(), is_watching()
        # and store.)
        self._wake = threading.Event()
        self.ring = ring if ring is not None else Informer(
            client, LEASES, namespaces=[namespace],
            label_selector=self._ring_selector, metrics=self.metrics, clock=clock)
        if ring is None:
            self.ring.add_handler(own_key, _Wake(self._wake))
        self._transition = threading.Lock()
        self._cond = threading.Condition()
        self._held: frozenset[int] = frozenset()
        self._draining: frozenset[int] = frozenset()
        self._published: frozenset[int] = frozenset()
        self._in_flight: dict[int, int] = {}             # slot -> reconciles running
        # What the informers were last re-selected for, and what assign() gave
        # us in the last round (None: no round in this term yet): readiness.
        self._selected: frozenset[int] = frozenset()
        self._want: frozenset[int] | None = None
        # slot -> when a round first found it ours but not held (the handover metric).
        self._wanted_since: dict[int, float] = {}
        self._seen: dict[str, SeenLease] = {}
        # (lease name, resourceVersion) of the expired Leases we tried to delete:
        # each record once. None: the Role grants no delete, so we no longer try.
        self._deleted: set[tuple[str, str]] | None = set()
        self._members: set[str] = set()
        # Our clock: no other Lease counts as expired before this. Infinite
        # from a lapse of our Lease until it is held again, then that time plus
        # REJOIN_GRACE_SECONDS (set on the lease thread, read by the ring's).
        self._not_expired_before = -math.inf
        self._probed = False
        self._failing = False     # the last round failed (the next failure logs at debug)
        self._left = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.metrics.init_shards()
        self._m_slots = self.metrics.shard_slots_held
        self._m_members = self.metrics.shard_members
        self._m_conflicts = self.metrics.shard_claim_conflicts_total
        self._m_server = self.metrics.shard_server_filtered
        self._m_handover = self.metrics.shard_handover_seconds

    # ---- what others ask --------------------------------------------------

    @property
    def held(self) -> frozenset[int]:
        with self._cond:
            return self._held

    def is_member(self) -> bool:
        return self.elector.is_leader()

    def ready(self) -> tuple[bool, str]:
        """Member, and the informers select every slot assign() gives us (the
        Manager's informer checks add: and their lists are in). A replica
        whose share is still held by its previous owner is not ready yet."""
        if not self.is_member():
            return False, f"member lease {self.lease_name} not held"
        with self._cond:
            want, selected = self._want, self._selected
        if want is None:
            return False, "ring not listed yet"
        missing = want - selected
        if missing:
            return False, (f"{len(missing)} of its {len(want)} slots not held yet "
                           "(their previous owner has not released them)")
        return True, f"{len(selected)} slots held"

    def check(self) -> None:
        """The write guard: our Lease is current, and the reconcile's slot is ours
        (held, or draining: published until the reconciles that began while it
        was held return; no other reconcile of it can be running)."""
        if not self.elector.is_leader():
            raise NotOwnerError(f"member lease {self.namespace}/{self.lease_name} not held: "
                                "write refused")
        slot = _SLOT.get()
        if slot is None:
            return
        if slot == UNCACHED:
            raise NotOwnerError("the reconciled object is not cached, so its slot is "
                                "unknown: write refused")
        with self._cond:
            ours = slot in self._held or slot in self._draining
        if not ours:
            raise NotOwnerError(f"slot {slot} is not held by this replica: write refused")

    @contextlib.contextmanager
    def working(self, slot: int):
        """Around a reconcile: yields False (skip it) when `slot` is not held; else
        counts it in flight (a release waits for it) and fences its writes.
        `UNCACHED` runs (to find its object gone) with every write refused."""
        with self._cond:
            allowed = slot == UNCACHED or slot in self._held
            counted = allowed and slot != UNCACHED
            if counted:
                self._in_flight[slot] = self._in_flight.get(slot, 0) + 1
        if not allowed:
            yield False
            return
        token = _SLOT.set(slot)
        try:
            yield True
        finally:
            _SLOT.reset(token)
            if counted:
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
            self._published)

    def _publish(self) -> bool:
        """Write our Lease now (it carries `_published`); False if that failed."""
        return self.elector.try_acquire_or_renew()

    # ---- running --------------------------------------------------------------

    def start(self) -> None:
        self.ring.start()
        lease = threading.Thread(target=self.elector.run, name="shard-member-lease",
                                 args=(self._stop, self._on_member, self._on_not_member),
                                 daemon=True)
        ring = threading.Thread(target=self._run_ring, name="shard-ring", daemon=True)
        self._threads = [lease, ring]
        for thread in self._threads:
            thread.start()

    def _on_member(self) -> None:
        rejoined = self._not_expired_before == math.inf
        self._not_expired_before = self._clock() + REJOIN_GRACE_SECONDS
        log.info("%s the ring as %s (lease %s/%s)%s", "re-joined" if rejoined else "joined",
                 self.identity, self.namespace, self.lease_name,
                 f": no other member counted out for {REJOIN_GRACE_SECONDS:g} s, the time "
                 "they take to re-join" if rejoined else "")

    def _on_not_member(self) -> None:
        """Our Lease lapsed (renew deadline), on the lease thread: everything is
        fenced already (check() reads the deadline); drop every slot so that a
        new term starts from nothing, through the handshake."""
        log.warning("member lease lost: dropping every slot")
        self._not_expired_before = math.inf     # blind until we are back (see _on_member)
        with self._transition:
            with self._cond:
                self._want = None
            self._wanted_since.clear()
            self._release_locked(self.held, publish=False)

    def _run_ring(self) -> None:
        while True:
            self._wake.wait(self._round_seconds)
            self._wake.clear()          # a change during the round wakes the next one
            if self._stop.is_set():
                return
            self.run_round()

    def run_round(self) -> None:
        """One round, never raising: a failed one (a 500, a timeout) changes
        nothing. The held slots stay held: our own Lease guards them, renewed
        on its own thread, and its renew deadline fences them if the apiserver
        stays away. The first failure of a series is a warning."""
        try:
            self.tick()
        except (errors.ApiError, errors.TransportError) as exc:
            log.log(logging.DEBUG if self._failing else logging.WARNING,
                    "shard ring round failed; held slots kept, retrying every %.1f s",
                    self._round_seconds, extra={"error": str(exc)})
            self._failing = True
            return
        except Exception:
            log.exception("shard ring round failed unexpectedly")
            return
        if self._failing:
            log.info("shard ring rounds work again")
            self._failing = False

    def _list_claims(self) -> tuple[set[str], dict[str, frozenset[int]]]:
        """The live members and their claims from a list of the ring: a consistent
        read, made after every write that returned before it."""
        result = self._client.list(LEASES, namespace=self.namespace,
                                   label_selector=self._ring_selector)
        return self._claims_in(result.get("items") or [])

    def _claims_in(self, leases: Iterable[dict]) -> tuple[set[str], dict[str, frozenset[int]]]:
        return live_claims(leases, self.lease_name, self.slots_annotation, self._seen,
                           self._clock(), self._not_expired_before)

    def _ring_view(self) -> tuple[set[str], dict[str, frozenset[int]]]:
        """What this round plans with: the watch's cache when it has listed, its
        watch is open, and it shows nothing to do (no request); otherwise a list,
        so that every release and claim is decided on a consistent read. A cache
        whose watch is down (backing off after an outage) cannot show a member
        that joined since: trusted, it would keep that member's share from it
        until the watch came back (seconds after an outage of the apiserver)."""
        if self.ring.has_synced() and self.ring.is_watching():
            others, claims = self._claims_in(self.ring.store.list())
            step = plan(self.identity, others, self.held, claims)
            if not step.release and not (step.claim - self._draining):
                return others, claims
        return self._list_claims()

    def tick(self) -> None:
        """One round of the handshake; raises the apiserver's errors (run_round logs them)."""
        if self._left or not self.elector.is_leader():
            return
        if not self._probed:
            self._probe_server_filtering()
        others, claims = self._ring_view()
        if others != self._members:
            log.info("ring members: %s", sorted({self.identity, *others}))
        self._members = others
        self._m_members.set(len(others) + 1)
        with self._transition:
            if self._left or not self.elector.is_leader():
                return
            self._publish_drained()
            step = plan(self.identity, others, self.held, claims)
            with self._cond:
                self._want = step.want
            self._note_wanted(step)
            if step.release:
                self._release_locked(step.release)
            # A slot still draining comes back once its reconciles returned.
            claim = step.claim - self._draining
            if claim and not self._stop.is_set():
                self._claim_locked(claim)
        self._delete_expired()

    def _delete_expired(self) -> None:
        """Rule 6: delete the Leases found expired, each record once, on condition
        that it is still the record found expired. Gone already (another member
        was first) or renewed meanwhile: nothing to do. Refused by RBAC: said
        once, and the ring works as before (a later replica waits a duration
        before it counts an expired member out)."""
        if self._deleted is None:
            return
        expired = expired_leases(self._seen, self._clock(), self._not_expired_before)
        self._deleted &= set(expired.items())
        for name, version in expired.items():
            if (name, version) in self._deleted or self._stop.is_set():
                continue
            self._deleted.add((name, version))
            try:
                self._client.delete(LEASES, name, namespace=self.namespace,
                                    preconditions={"resourceVersion": version})
            except (errors.NotFoundError, errors.ConflictError):
                continue
            except errors.ForbiddenError as exc:
                log.warning("cannot delete expired member Leases (grant delete on leases): "
                            "they stay, and a replica that starts later counts their "
                            "members out only after one Lease duration: %s", exc)
                self._deleted = None
                return
            except (errors.ApiError, errors.TransportError) as exc:
                self._deleted.discard((name, version))      # tried again next round
                log.debug("deleting the expired member lease %s failed: %s", name, exc)
                continue
            log.info("deleted the expired member lease %s/%s", self.namespace, name)

    def _note_wanted(self, step: Plan) -> None:
        now = self._clock()
        waiting = step.want - self.held
        for slot in waiting:
            self._wanted_since.setdefault(slot, now)
        for slot in set(self._wanted_since) - waiting:
            del self._wanted_since[slot]

    def _reselect(self, held: frozenset[int]) -> None:
        self._on_change(held)
        with self._cond:
            self._selected = held

    def _release_locked(self, slots: frozenset[int], *, publish: bool = True) -> None:
        """Rule 1: start no new reconcile of `slots`, wait (bounded) for those in
        flight, drop the slots from the informers, then publish without the
        drained ones."""
        if not slots:
            return
        started = self._clock()
        with self._cond:
            self._held = self._held - slots          # no new reconcile of them from here on
            self._draining = self._draining | slots
            self._m_slots.set(len(self._held))
            self._cond.wait_for(lambda: not self._running_locked(slots),
                                timeout=self._drain_timeout_seconds)
            held = self._held
        self._reselect(held)
        self._publish_drained(publish=publish)
        log.info("released %d slots (%d held) in %.3f s", len(slots), len(held),
                 self._clock() - started)
        with self._cond:
            stuck = self._draining & slots
        if stuck:
            log.error("reconciles of %d released slots still running after %.0f s: they "
                      "stay published until those return", len(stuck),
                      self._drain_timeout_seconds)
            if self._on_drain_timeout is not None:
                self._on_drain_timeout(stuck)

    def _running_locked(self, slots: Iterable[int]) -> bool:
        return any(self._in_flight.get(s) for s in slots)

    def _publish_drained(self, *, publish: bool = True) -> None:
        """Draining slots whose reconciles have returned stop being published."""
        with self._cond:
            drained = frozenset(s for s in self._draining if not self._in_flight.get(s))
            if not drained:
                return
            self._draining = self._draining - drained
            self._published = self._held | self._draining
        if publish:
            self._publish()

    def _claim_locked(self, slots: frozenset[int]) -> None:
        """Rules 2 and 3: publish the claim, confirm it with a list made after that
        write, and only then hold what no other live Lease listed by then."""
        started = self._clock()
        claimed: frozenset[int] = frozenset()
        with self._cond:
            self._published = self._held | self._draining | slots
        try:
            if not self._publish():
                return
            # Rule 3: this list is made after our write landed, so it shows
            # every claim that landed before ours.
            _, claims = self._list_claims()
            taken = frozenset().union(*claims.values()) if claims else frozenset()
            conflict = slots & taken
            if conflict:
                self._m_conflicts.inc(len(conflict))
                log.info("withdrawing %d claimed slots another member claimed too",
                         len(conflict))
            with self._cond:
                if self.elector.is_leader():
                    claimed = slots - conflict
                    self._held = self._held | claimed
                    self._m_slots.set(len(self._held))
                held = self._held
        finally:
            # Whatever happened, the Lease goes back to listing what we work on:
            # a claim left published would keep its slots from their next owner.
            with self._cond:
                self._published = self._held | self._draining
            if claimed != slots:
                self._publish()
        if not claimed:
            return
        self._reselect(held)
        now = self._clock()
        waited = [self._wanted_since.pop(s) for s in claimed if s in self._wanted_since]
        if waited:
            self._m_handover.observe(now - min(waited))
        log.info("claimed %d slots (%d held) in %.3f s", len(claimed), len(held),
                 now - started)

    def _probe_server_filtering(self) -> None:
        """Does the apiserver apply shardSelector? Lists of built-ins echo it
        (docs/SHARDING.md). Said once, in the log and in a metric; tried again
        next round if the probe itself failed."""
        selector = shards.Ranges.everything().shard_selector()
        try:
            result = self._client.list(LEASES, namespace=self.namespace, limit=1,
                                       label_selector=self._ring_selector,
                                       shard_selector=selector)
        except (errors.ApiError, errors.TransportError) as exc:
            # Said once per series of failed rounds, as run_round does.
            log.log(logging.DEBUG if self._failing else logging.INFO,
                    "shardSelector probe failed (tried again next round): %s", exc)
            return
        self._probed = True
        on = shards.is_server_filtered(result.get("metadata"), selector)
        self._m_server.set(1 if on else 0)
        log.info("the apiserver %s shardSelector%s", "applies" if on else "ignores",
                 "" if on else ": every replica lists everything and filters itself")

    def leave(self, *, release: bool = True) -> None:
        """On shutdown, after the workers stopped: no more rounds, every slot fenced.

        `release`: publish nothing and hand the Lease back, so the others claim
        our slots at once. False (reconciles still running past the graceful
        timeout): write nothing, so the Lease expires as after a crash and no
        slot moves while one of its reconciles may still write.
        """
        self._left = True
        self._stop.set()
        self._wake.set()
        with self._transition:
            with self._cond:
                self._held = frozenset()
                self._m_slots.set(0)
                if release:
                    self._draining = frozenset()
                    self._published = frozenset()
        if release:
            try:
                self.elector.release()
            except Exception:
                log.exception("releasing the member lease failed")
        self.ring.stop()            # after the release: the handover waits for no watch
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)
