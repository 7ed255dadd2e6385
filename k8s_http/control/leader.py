"""Leader election on a coordination.k8s.io/v1 Lease, with local monotonic clocks only.

    elector = LeaderElector(client, namespace="ns", name="my-controller", identity=ident)
    threading.Thread(target=elector.run, args=(stop, started, stopped), daemon=True).start()
    client.write_guard = elector.check     # every write re-checks the lease

How it stays safe without trusting anybody's wall clock (client-go's approach):

- A candidate never compares the Lease's renewTime with its own clock. It
  remembers WHEN, on its own monotonic clock, it last saw the record change;
  the holder is presumed dead once `leaseDurationSeconds` have passed on that
  clock with no change. A fresh process therefore waits one full lease
  duration before taking over, even from a holder that died long ago.
- The leader measures its term from the moment it SENT its last successful
  write (which is no later than the moment anyone else saw it land) and stops
  acting `renew_deadline` after that. Others wait `lease_duration` (15 s) from
  when they saw it, so the 5 s margin absorbs clock-rate drift and latency.
- Every write is a replace carrying the resourceVersion that was read: two
  candidates racing for an expired lease cannot both win; the loser gets a
  409 and looks again.

The decisions are pure functions over (record, observation, now) below the
record type, table-tested without a server; `LeaderElector` is the thin loop
that does the I/O and the waiting.
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..core import errors
from ..core.objects import LEASES
from ..ops.metrics import Metrics

__all__ = [
    "LeaderElector",
    "LeaderRecord",
    "Observation",
    "observe",
    "is_expired",
    "can_acquire",
    "acquire_record",
    "release_record",
    "is_leading",
    "jittered",
    "micro_time",
    "LEASE_DURATION_SECONDS",
    "RENEW_DEADLINE_SECONDS",
    "RETRY_PERIOD_SECONDS",
    "JITTER_FACTOR",
]

log = logging.getLogger(__name__)

# controller-runtime's defaults. The leader gives up after 10 s without a
# successful renewal; a standby takes over 15 s after it last saw a change,
# so there is a 5 s window in which nobody leads rather than two leaders.
LEASE_DURATION_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_PERIOD_SECONDS = 2.0
# client-go's JitterUntil factor for acquire retries: wait between 1x and
# 2.2x the retry period, so standbys restarted together do not poll in step.
JITTER_FACTOR = 1.2
# What release() writes: a standby sees the lease expire one second after it
# notices the change (and an empty holder can be taken at once anyway).
RELEASED_LEASE_DURATION_SECONDS = 1


# ---------------------------------------------------------------------------
# The record and the pure decisions


@dataclass(frozen=True)
class LeaderRecord:
    """The election-relevant part of a Lease's spec. `holder` "" means nobody."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: dict) -> "LeaderRecord":
        """Read a Lease dict; garbage in odd fields reads as absent, never raises."""
        spec = lease.get("spec") if isinstance(lease, dict) else None
        spec = spec if isinstance(spec, dict) else {}

        def _int(value: object) -> int:
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        def _str(value: object) -> str | None:
            return value if isinstance(value, str) else None

        return cls(holder=_str(spec.get("holderIdentity")) or "",
                   lease_duration_seconds=_int(spec.get("leaseDurationSeconds")),
                   acquire_time=_str(spec.get("acquireTime")),
                   renew_time=_str(spec.get("renewTime")),
                   transitions=_int(spec.get("leaseTransitions")))

    def to_spec(self) -> dict:
        spec: dict = {"holderIdentity": self.holder,
                      "leaseDurationSeconds": self.lease_duration_seconds,
                      "leaseTransitions": self.transitions}
        if self.acquire_time is not None:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time is not None:
            spec["renewTime"] = self.renew_time
        return spec


@dataclass(frozen=True)
class Observation:
    """A record, and the time on OUR monotonic clock when it was first seen as it is."""

    record: LeaderRecord
    observed_at: float


def observe(previous: Observation | None, record: LeaderRecord, now: float) -> Observation:
    """Fold a freshly read record into what we know.

    The observation clock restarts only when the record changed (a renewal
    changes renewTime): an unchanged record keeps its old observation time,
    which is what lets it expire.
    """
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def is_expired(observation: Observation, now: float, *, default_duration_seconds: float) -> bool:
    """True once the record's own lease duration has passed on our clock since it last changed.

    A record without a usable duration gets ours.
    """
    duration = observation.record.lease_duration_seconds or default_duration_seconds
    return now >= observation.observed_at + duration


def can_acquire(observation: Observation, identity: str, now: float, *,
                default_duration_seconds: float) -> bool:
    """May `identity` write itself into this lease now?"""
    holder = observation.record.holder
    return (not holder or holder == identity
            or is_expired(observation, now, default_duration_seconds=default_duration_seconds))


def acquire_record(current: LeaderRecord | None, identity: str, lease_duration_seconds: float,
                   wall_time: str) -> LeaderRecord:
    """The record to write to acquire (or renew) the lease.

    A renewal keeps acquireTime and the transition count; a takeover (the
    holder was someone else, or nobody) counts one more transition, as
    client-go does. A new Lease starts at 0 transitions. The Lease API wants
    whole seconds, so the duration is rounded up (never shorter than asked).
    """
    duration = max(1, math.ceil(lease_duration_seconds))
    if current is not None and current.holder == identity:
        return LeaderRecord(identity, duration, current.acquire_time or wall_time, wall_time,
                            current.transitions)
    transitions = current.transitions + 1 if current is not None else 0
    return LeaderRecord(identity, duration, wall_time, wall_time, transitions)


def release_record(current: LeaderRecord, wall_time: str) -> LeaderRecord:
    """The record release() writes: nobody holds it, and it expires in a second."""
    return LeaderRecord("", RELEASED_LEASE_DURATION_SECONDS, wall_time, wall_time,
                        current.transitions)


def is_leading(renewed_at: float | None, renew_deadline_seconds: float, now: float) -> bool:
    """Leader until `renew_deadline` after the last successful write was sent.

    `renewed_at` is None when we do not hold the lease.
    """
    return renewed_at is not None and now < renewed_at + renew_deadline_seconds


def jittered(period_seconds: float, rng: Callable[[], float],
             factor: float = JITTER_FACTOR) -> float:
    """period * [1, 1 + factor): client-go's wait.Jitter."""
    return period_seconds * (1.0 + rng() * factor)


def micro_time(when: _dt.datetime) -> str:
    """metav1.MicroTime: RFC 3339 UTC with microseconds."""
    return when.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


# ---------------------------------------------------------------------------
# The loop


class LeaderElector:
    """Campaigns for, holds and releases one Lease.

    `client` must be an ApiClient whose write guard does not call `check()`
    (the elector's own writes are what keeps it leader): the manager gives
    it a second ApiClient over the same transport.
    """

    def __init__(self, client, *, namespace: str, name: str, identity: str,
                 lease_duration_seconds: float = LEASE_DURATION_SECONDS,
                 renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS,
                 retry_period_seconds: float = RETRY_PERIOD_SECONDS,
                 metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], _dt.datetime] = _utc_now,
                 rng: Callable[[], float] = random.random,
                 decorate: Callable[[dict], None] | None = None):
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if not 0 < retry_period_seconds * JITTER_FACTOR < renew_deadline_seconds \
                < lease_duration_seconds:
            # client-go's rules: the leader must give up before a standby may
            # take over, and must get more than one renewal try before that.
            raise ValueError(
                "leader election timing must satisfy 0 < retry period x "
                f"{JITTER_FACTOR} < renew deadline < lease duration (got retry "
                f"{retry_period_seconds}s, deadline {renew_deadline_seconds}s, "
                f"lease {lease_duration_seconds}s)")
        self._client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_seconds = lease_duration_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self.retry_period_seconds = retry_period_seconds
        self.metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng
        # Called on every Lease body we are about to write (create, renew,
        # release), to set labels or annotations of the caller's (sharding.py
        # publishes a member's slots this way); None: the body as it is.
        self._decorate = decorate
        self.metrics.init_leader(name)

        self._lock = threading.Lock()           # guards the four fields below
        # The last record read or written, and when (our clock) it last changed.
        self._observed: Observation | None = None
        # The last Lease object read or written: its resourceVersion is the
        # precondition of our next write.
        self._lease: dict | None = None
        # clock() when the last successful acquire/renew was SENT; None while
        # we do not hold the lease. is_leader() is computed from it alone.
        self._renewed_at: float | None = None
        # Set by release(), never cleared: no more writes, no more campaigning,
        # and no new term even from a renewal that was in flight.
        self._released = False

        # One lease write at a time: the run thread's renewals vs release().
        self._write_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"LeaderElector({self.namespace}/{self.name}, identity={self.identity!r}, "
                f"leader={self.is_leader()})")

    # ---- what others ask --------------------------------------------------

    def is_leader(self) -> bool:
        """False the moment the renew deadline passes, even if the renew thread is stuck."""
        with self._lock:
            renewed_at = self._renewed_at
        return is_leading(renewed_at, self.renew_deadline_seconds, self._clock())

    def check(self) -> None:
        """The write guard: raises NotLeaderError unless this process holds the lease."""
        if not self.is_leader():
            raise errors.NotLeaderError(
                f"not the leader of lease {self.namespace}/{self.name}: write refused")

    @property
    def holder(self) -> str:
        """The holder in the last record we saw ("" for nobody or not seen yet)."""
        with self._lock:
            return self._observed.record.holder if self._observed else ""

    # ---- one attempt --------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One read-decide-write round. True if we hold the lease afterwards.

        API and connection errors count as a failed attempt (logged); they
        do not raise: the loop retries, and the deadline decides.
        """
        with self._write_lock:
            if self._released:
                return False
            start = self._clock()
            try:
                return self._attempt_locked(start)
            except (errors.ApiError, errors.TransportError) as exc:
                log.warning("lease %s/%s: %s failed", self.namespace, self.name,
                            "renewal" if self.is_leader() else "acquire attempt",
                            extra={"error": str(exc)})
                return False
            except Exception:
                # A bug (or a fake client's surprise) must not kill the election
                # thread: log the traceback and let the deadline decide.
                log.exception("lease %s/%s: attempt failed unexpectedly", self.namespace,
                              self.name)
                return False

    def _attempt_locked(self, start: float) -> bool:
        with self._lock:
            # While leading we renew from our own last write without reading
            # first (client-go does the same); a 409 sends us back to reading.
            lease = self._lease if self._renewed_at is not None else None
        if lease is None:
            try:
                lease = self._client.get(LEASES, self.name, namespace=self.namespace)
            except errors.NotFoundError:
                return self._create_locked(start)
            current = LeaderRecord.from_lease(lease)
            with self._lock:
                self._lease = lease
                self._see_locked(current, start)
                observation = self._observed
            assert observation is not None
            if not can_acquire(observation, self.identity, start,
                               default_duration_seconds=self.lease_duration_seconds):
                self._lose(f"lease is held by {current.holder!r}")
                return False
            if current.holder == self.identity:
                # client-go's slow path: the Lease names us, but we had to read
                # it first (our optimistic renewal of the cached copy failed).
                self.metrics.leader_election_slowpath_total.labels(self.name).inc()
        else:
            current = LeaderRecord.from_lease(lease)

        record = acquire_record(current, self.identity, self.lease_duration_seconds,
                                micro_time(self._wall_clock()))
        body = copy.deepcopy(lease)
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        body["spec"] = {**spec, **record.to_spec()}   # keep fields we do not manage
        self._decorated(body)
        try:
            written = self._client.replace(LEASES, body, namespace=self.namespace)
        except errors.ConflictError:
            # Someone wrote in between (another candidate won, or our cached
            # copy was stale): read again on the next attempt.
            with self._lock:
                self._lease = None
            log.debug("lease %s/%s: conflict, will re-read", self.namespace, self.name)
            return False
        self._hold(written, start, takeover=current.holder != self.identity)
        return True

    def _create_locked(self, start: float) -> bool:
        record = acquire_record(None, self.identity, self.lease_duration_seconds,
                                micro_time(self._wall_clock()))
        body = {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": record.to_spec()}
        self._decorated(body)
        try:
            written = self._client.create(LEASES, body, namespace=self.namespace)
        except errors.ConflictError:   # AlreadyExists: another candidate created it first
            return False
        self._hold(written, start, takeover=True)
        return True

    def _decorated(self, body: dict) -> None:
        if self._decorate is not None:
            if not isinstance(body.get("metadata"), dict):
                body["metadata"] = {}
            self._decorate(body)

    def _see_locked(self, record: LeaderRecord, now: float) -> None:
        previous = self._observed
        self._observed = observe(previous, record, now)
        if record.holder and record.holder != self.identity and (
                previous is None or previous.record.holder != record.holder):
            log.info("lease %s/%s is held by %s", self.namespace, self.name, record.holder)

    def _hold(self, lease: dict, start: float, *, takeover: bool) -> None:
        with self._lock:
            self._lease = lease
            self._see_locked(LeaderRecord.from_lease(lease), start)
            if self._released:
                # release() ran while this write was in flight and is waiting
                # for the write lock to hand the lease back: do not lead again.
                return
            was_leading = self._renewed_at is not None
            # `start`, not now: the term counts from when the write was sent,
            # which is no later than when anyone else can have seen it.
            self._renewed_at = start
        if not was_leading:
            log.info("acquired lease %s/%s as %s%s", self.namespace, self.name, self.identity,
                     "" if takeover else " (already ours)")
            self.metrics.leader_election_master_status.labels(self.name).set(1)

    def _lose(self, reason: str, *, handing_back: bool = False) -> None:
        """Give up leadership now (a no-op when not leading).

        A loss is a warning; handing the lease back on a clean shutdown
        (`handing_back`) is the normal way a term ends, and logs at info.
        """
        with self._lock:
            was_leading = self._renewed_at is not None
            self._renewed_at = None
        self.metrics.leader_election_master_status.labels(self.name).set(0)
        if was_leading and handing_back:
            log.info("stopped leading lease %s/%s: %s", self.namespace, self.name, reason)
        elif was_leading:
            log.warning("lost lease %s/%s: %s", self.namespace, self.name, reason)

    # ---- the loop -------------------------------------------------------------

    def run(self, stop: threading.Event, on_started_leading: Callable[[], None],
            on_stopped_leading: Callable[[], None]) -> None:
        """Campaign, lead, and campaign again after a loss, until `stop` is set.

        on_started_leading() is called when a term starts, on_stopped_leading()
        when it ends while run() is running (renew deadline missed, someone
        else took the lease, or release()). Both run on this thread: they
        should return promptly (on_stopped_leading may wait for in-flight
        work; renewals are moot by then). When `stop` is set, run() returns
        without ending the term: is_leader() stays true until the renew
        deadline or release(), so in-flight work can finish its writes.
        """
        log.info("campaigning for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            if not self._campaign(stop):
                break
            _call(on_started_leading, "on_started_leading")
            self._keep_renewing(stop)
            if stop.is_set():
                break
            self._lose(self._loss_reason())
            _call(on_stopped_leading, "on_stopped_leading")
        log.info("leader election for %s/%s stopped", self.namespace, self.name)

    def _campaign(self, stop: threading.Event) -> bool:
        """Try until we lead (True) or `stop` is set (False)."""
        while True:
            if self._released:   # release() is final: wait for stop, write nothing
                stop.wait()
                return False
            if self.try_acquire_or_renew():
                return True
            if stop.wait(jittered(self.retry_period_seconds, self._rng)):
                return False

    def _keep_renewing(self, stop: threading.Event) -> None:
        """Renew every retry period; return once no longer leading or when `stop` is set."""
        while self.is_leader():
            with self._lock:
                renewed_at = self._renewed_at
            if renewed_at is None:
                return
            # Wake for the next renewal, or at the deadline if that comes first,
            # so a loss is acted on at once.
            until_deadline = renewed_at + self.renew_deadline_seconds - self._clock()
            if stop.wait(max(0.0, min(self.retry_period_seconds, until_deadline))):
                return
            if self.is_leader():
                self.try_acquire_or_renew()

    def _loss_reason(self) -> str:
        if self._released:
            return "released"
        holder = self.holder
        if holder and holder != self.identity:
            return f"lease is held by {holder!r}"
        return f"no successful renewal within {self.renew_deadline_seconds:g}s"

    # ---- shutdown -------------------------------------------------------------

    def release(self) -> bool:
        """Hand the lease back so a standby takes over in about a retry period.

        Stops leading at once (is_leader() is False from here on) and ends
        campaigning for good. If the last record we saw names us, writes it
        with no holder and a 1 s duration, preconditioned on its
        resourceVersion (a 409 means someone else already has it: left alone).
        Best effort: returns True if the lease was released, never raises for
        API or connection errors. Call it only once the work the lease guards
        has stopped (a standby may lead a second later); otherwise stop run()
        and let the lease expire (the Manager does so when a reconcile outlives
        the graceful timeout).
        """
        with self._lock:       # _hold() checks it under the same lock
            self._released = True
        self._lose("releasing it", handing_back=True)
        # A renewal stuck in I/O holds the write lock; do not wait longer than
        # its own deadline (the lease then simply expires).
        if not self._write_lock.acquire(timeout=self.renew_deadline_seconds):
            log.warning("lease %s/%s: not released (a renewal is stuck)", self.namespace,
                        self.name)
            return False
        try:
            with self._lock:
                lease = self._lease
            if lease is None:
                return False
            current = LeaderRecord.from_lease(lease)
            if current.holder != self.identity:
                return False
            body = copy.deepcopy(lease)
            spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
            body["spec"] = {**spec,
                            **release_record(current, micro_time(self._wall_clock())).to_spec()}
            self._decorated(body)
            try:
                written = self._client.replace(LEASES, body, namespace=self.namespace)
            except (errors.ApiError, errors.TransportError) as exc:
                log.warning("lease %s/%s: release failed", self.namespace, self.name,
                            extra={"error": str(exc)})
                return False
            with self._lock:
                self._lease = written
                self._observed = observe(self._observed, LeaderRecord.from_lease(written),
                                         self._clock())
            log.info("released lease %s/%s", self.namespace, self.name)
            return True
        finally:
            self._write_lock.release()


def _call(callback: Callable[[], None], what: str) -> None:
    try:
        callback()
    except Exception:
        log.exception("leader election: %s raised", what)
