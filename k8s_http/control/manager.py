"""The Manager: wires informers, queues, workers, probes and leader election.

Start order (each step needs the one before):
  1. probe and metrics servers, so the kubelet sees the process at once
     (`/readyz` says 503 until the caches have synced);
  2. informers, which list and then watch;
  3. leader election, when asked for;
  4. workers, which start reconciling only once every cache has synced and,
     with leader election, while the lease is held;
  5. a supervisor that restarts dead threads, keeps the queue gauges fresh and
     re-enqueues every primary object once per resync period.

Stop order is the reverse, and `stop()` is idempotent: `/readyz` turns 503,
no new reconcile starts, in-flight ones get the graceful timeout, the lease is
released if they all finished (else left to expire: one still running may
write), then the watches close.

Secure metrics (`metrics_secure=True`, controller-runtime's `--metrics-secure`):
`/metrics` is served over HTTPS and each scrape's bearer token is checked with
a TokenReview and a SubjectAccessReview for `get /metrics` (see authn.py). The
certificate is `tls.crt` / `tls.key` in `metrics_cert_dir`; without one, a
self-signed certificate is made with openssl (development only). Health probes
stay plain HTTP on their own address: the kubelet probes them anonymously.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, disable_created_metrics

from ..core.objects import ObjectKey, Resource, strip_managed_fields
from ..config.cluster import ClusterConfig, ConfigError
from ..config.configerror import setting
from ..ops.allocator import TrimAfterBursts, limit_arenas
from ..ops.authn import MetricsAuthorizer, self_signed_cert, server_tls_context
from ..ops.gctuning import CacheFill
from ..ops.log import reconcile_context
from ..ops.metrics import Metrics
from ..ops.probes import HealthChecks, ProbeServer
from ..wire.client import ApiClient
from ..wire.transport import user_agent
from ..cache.informer import LOW_PRIORITY, Informer, UpdateFilter, own_key, owner_key
from ..cache.store import Store
from .deletionwatch import DeletionWatches
from .shardcaches import ShardCaches
from .events import EventRecorder
from .leader import LeaderElector
from .runner import Result, Runner
from .sharding import UNCACHED, ShardMember
from ..core import shards as _shards
from .workqueue import WorkQueue

__all__ = ["Manager"]

log = logging.getLogger(__name__)

VERSION = "0.1.0"
# The version in the User-Agent (the application's name comes first).
_MAJOR_MINOR = ".".join(VERSION.split(".")[:2])
# How often the supervisor looks at thread health (a dead worker or watch thread
# is restarted within this; /healthz reports it at once), trims memory after a
# burst and merges shard parts. Each wake-up of an idle process's thread costs
# ~0.1-0.2 ms of CPU: at 1 s the supervisor was a fifth of an idle operator's.
SUPERVISE_INTERVAL_SECONDS = 5.0
# How long the main thread waits between looks at the stop flag. A signal
# interrupts the wait (the kernel hands a process's signal to its main thread
# unless that one blocks it), and stop() from another thread sets the event it
# waits on: this bounds only what neither wakes.
MAIN_WAIT_SECONDS = 5.0
# malloc arenas the process's threads share (glibc's default: 8 per core). The
# GIL lets one thread run Python at a time, so more arenas buy little speed and
# each keeps its own free memory.
MALLOC_ARENAS = 2
# How long a thread keeps the GIL while another waits for it (CPython's default:
# 5 ms). A watcher decoding a large list (start-up, slots taken over, a relist)
# runs Python without pause, and each time a worker's request wakes up (its
# answer has come) it waits for the GIL for up to this long. Beside a thread
# packing objects, a 5.6 ms request took 11.3 ms (p90 18 ms) at 5 ms and 6.8 ms
# (p90 8 ms) at 1 ms, the packing 0.89x as fast meanwhile; one thread alone is
# not affected (`python -m bench gil_switch`, bench/RESULTS.gil_switch.md).
# (A survivor listing the slots it took over still serves its own new `My`
# slower: its host is saturated; docs/SHARDING.md, section 10.)
GIL_SWITCH_SECONDS = 0.001


@dataclass
class _Controller:
    name: str
    resource: Resource
    queue: WorkQueue
    runner: Runner
    primary: Informer
    informers: list[Informer] = field(default_factory=list)


def _controller_keys(controller: _Controller) -> dict[str, str]:
    """controller-runtime's keys on a controller's own lines (its LogConstructor(nil))."""
    return {"controller": controller.name, "controllerGroup": controller.resource.group,
            "controllerKind": controller.resource.kind}


class Manager:
    """Runs controllers: `add_controller(...)`, then `run()` (or `start()`/`stop()`)."""

    def __init__(self, config: ClusterConfig, name: str, *,
                 namespaces: Iterable[str] | None = None,
                 metrics_bind_address: str = ":8080",
                 health_probe_bind_address: str = ":8081",
                 leader_elect: bool = False,
                 leader_election_namespace: str | None = None,
                 leader_election_id: str | None = None,
                 qps: float = 0.0, burst: int = 0,
                 graceful_shutdown_timeout_seconds: float = 25.0,
                 registry: CollectorRegistry | None = None,
                 resync_period_seconds: float = 36000.0,
                 metrics_secure: bool = False,
                 metrics_cert_dir: str | None = None,
                 shards: bool = False,
                 shard_label: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 exit_process: Callable[[int], None] = os._exit):
        self.name = name
        self.config = config
        self.namespaces = list(namespaces) if namespaces else None
        self.metrics_bind_address = metrics_bind_address
        self.health_probe_bind_address = health_probe_bind_address
        self.metrics_secure = metrics_secure
        self.metrics_cert_dir = metrics_cert_dir
        self.graceful_shutdown_timeout_seconds = graceful_shutdown_timeout_seconds
        self.resync_period_seconds = resync_period_seconds
        self._clock = clock
        self._exit_process = exit_process

        # A registry of our own unless the caller shares one; the process and
        # platform collectors belong to the process, so only ours gets them.
        # The *_created series prometheus-client adds by default are not in
        # controller-runtime's exposition and double the series count; this
        # switch is process-wide, and a manager owns its process.
        disable_created_metrics()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = Metrics(self.registry, process_collectors=registry is None)
        self.metrics.init_build_info(name, VERSION)

        # Sharding (docs/SHARDING.md): each replica a member of the ring by its
        # own Lease, named after the pod ($POD_NAME, else the host name).
        member_name = (os.environ.get("POD_NAME") or socket.gethostname()).lower()
        agent = user_agent(name, _MAJOR_MINOR)
        if shards:
            if leader_elect:
                raise ConfigError("--shards", "sharding and leader election exclude each other",
                                  "drop --leader-elect: with --shards=auto every replica works")
            if not shard_label or "/" not in shard_label:
                raise ConfigError("shard_label", f"{shard_label!r} is not a label key with a "
                                  "domain", "pass the children's slot label, e.g. "
                                  "sharding.example.com/slot")
            agent += f" shard/{member_name}"     # who wrote what, in the audit log
        self.client = ApiClient.from_config(config, qps=qps, burst=burst, metrics=self.metrics,
                                            user_agent=agent)
        self._shard_label = shard_label
        self._member: ShardMember | None = None
        self._shard_caches: ShardCaches | None = None
        if shards:
            self._shard_caches = ShardCaches(shard_label, clock=clock,
                                             on_cached=self._on_cache_synced)
            self._member = ShardMember(
                ApiClient(self.client.transport),
                namespace=leader_election_namespace or config.namespace, app=name,
                member_name=member_name,
                identity=f"{member_name}_{uuid.uuid4().hex[:10]}",
                label_domain=shard_label.partition("/")[0], on_change=self._shard_caches.select,
                on_drain_timeout=self._on_drain_timeout, metrics=self.metrics, clock=clock,
                drain_timeout_seconds=graceful_shutdown_timeout_seconds)
            self.client.write_guard = self._member.check
            self.metrics.init_shard_ranges(self._shard_caches.objects_per_range)
        self._elector: LeaderElector | None = None
        if leader_elect:
            lease_name = leader_election_id or name
            # The elector writes the Lease itself, so it gets a client without
            # the write guard (which would refuse the renewal that keeps it leader).
            self._elector = LeaderElector(
                ApiClient(self.client.transport),
                namespace=leader_election_namespace or config.namespace,
                name=lease_name,
                identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}",
                metrics=self.metrics, clock=clock)
            # Every write checks that the lease is still held.
            self.client.write_guard = self._elector.check

        # Secure metrics: the TLS context is built now, so a missing or broken
        # certificate is a configuration error before anything starts. The
        # reviews are creates: they go through a client without the write
        # guard, so a standby answers scrapes too.
        self._metrics_tls: ssl.SSLContext | None = None
        self._metrics_auth: MetricsAuthorizer | None = None
        if metrics_cert_dir and not metrics_secure:
            raise ConfigError(setting("metrics_cert_dir"), "a certificate directory was given "
                              f"without {setting('metrics_secure')}, so /metrics would be "
                              "plain HTTP", f"add {setting('metrics_secure')}, or drop "
                              f"{setting('metrics_cert_dir')}")
        if metrics_secure and metrics_bind_address.strip() not in ("", "0"):
            if metrics_bind_address == health_probe_bind_address:
                raise ConfigError(
                    "metrics bind address", f"{metrics_bind_address!r} is also the health "
                    "probe address, and secure metrics would put the probes behind TLS",
                    "give /metrics an address of its own")
            self._metrics_tls = _metrics_tls_context(metrics_cert_dir)
            self._metrics_auth = MetricsAuthorizer(ApiClient(self.client.transport))

        self._informers: dict[tuple[Resource, str | None], Informer] = {}
        # The informers' parts added after start (a sharded replica's slots taken
        # over) make their first lists one at a time (Informer: list_gate).
        self._list_gate = threading.Lock()
        self._controllers: list[_Controller] = []
        self._deletion_watches: dict[str, DeletionWatches] = {}   # by controller name
        self._threads: list[threading.Thread] = []
        self._servers: list[ProbeServer] = []
        self._recorders: list[tuple[EventRecorder, float]] = []
        self._stop = threading.Event()          # set: the manager is stopping
        self._stop_requested = threading.Event()  # wakes run(): a signal, or stop()
        # Set by the signal handler itself, before the main thread wakes up to
        # call stop(): readiness and the worker gate close at the signal.
        self._draining = threading.Event()
        # The elector keeps renewing until the drain is over (as controller-runtime
        # cancels election last): stopping it with _stop would let the lease lapse
        # under slow in-flight reconciles. Then the lease is released, or left
        # to expire if a reconcile outlived the drain (see stop()).
        self._elector_stop = threading.Event()
        self._stopped = threading.Event()       # set: stop() has finished
        self._stop_lock = threading.Lock()
        self._started = False
        self._started_at = 0.0
        self._synced_lock = threading.Lock()
        self._synced_logged = False      # "caches synced" is logged once (guarded by _synced_lock)
        # Whether "Starting workers" was logged for the current term (guarded by
        # _synced_lock): once the caches are synced and, with leader election, the
        # Lease is held -- when workers may really start, as controller-runtime says it.
        self._workers_announced = False
        # The garbage collector while the caches fill, and frozen once they have (gctuning.py).
        self._cache_fill = CacheFill()
        self._exit_code = 0
        self._signals_received = 0

        self.healthz = HealthChecks()
        self.readyz = HealthChecks()
        self.readyz.add("shutdown", lambda: (not self._is_stopping(),
                                              "shutting down" if self._is_stopping() else "ok"))
        if self._member is not None:
            self.readyz.add("shards", self._member.ready)
            # The ring's watch: a wedged one is cured by a restart like any other
            # (without it, every ring round lists: slower, never wrong).
            ring = self._member.ring
            self.healthz.add("informer-shard-ring", lambda: ring.is_healthy(now=self._clock()))

    # ---- building -------------------------------------------------------

    def _informer(self, resource: Resource, label_selector: str | None,
                  transform: Callable[[dict], dict] | None = None) -> Informer:
        key = (resource, label_selector)
        informer = self._informers.get(key)
        if informer is None:
            store = Store(transform=transform or strip_managed_fields)
            informer = Informer(self.client, resource, namespaces=self.namespaces,
                                label_selector=label_selector, store=store,
                                metrics=self.metrics, clock=self._clock,
                                list_gate=self._list_gate)
            self._informers[key] = informer
            informer.add_sync_listener(self._on_cache_synced)
            check_name = f"informer-{resource}"
            if label_selector:
                check_name += f"[{label_selector}]"
            self.readyz.add(check_name, lambda i=informer: (i.has_synced(),
                                                            "synced" if i.has_synced()
                                                            else "initial list not finished"))
            self.healthz.add(check_name, lambda i=informer: i.is_healthy(now=self._clock()))
        return informer

    def add_controller(self, resource: Resource,
                       reconcile: Callable[[ObjectKey], Result | None], *,
                       owns: Iterable[Resource] = (), owns_label_selector: str | None = None,
                       label_selector: str | None = None, workers: int = 4,
                       name: str | None = None,
                       reconcile_timeout_seconds: float | None = None,
                       transforms: Mapping[Resource, Callable[[dict], dict]] | None = None,
                       urgent: Callable[[dict], bool] | None = None,
                       urgent_reads: Iterable[Iterable[str]] | None = None,
                       owned_update_filters: Mapping[Resource, UpdateFilter] | None = None
                       ) -> None:
        """Reconcile `resource` objects; changes to `owns` objects map to their controlling owner.

        `transforms`: per resource (primary or owned), what its cache keeps of each
        object (a k8s_http.Projection); default: everything but managedFields.
        `owns_label_selector` narrows the owned watches server-side so the
        cache holds only our children (e.g. a managed-by label).
        `reconcile_timeout_seconds`: failures past it count as timeouts (runner.py).
        `urgent` (with the fields it reads, `urgent_reads`): the primary objects
        of a list it is true of are queued ahead of the list's others (which go
        low), e.g. `awaits_reconcile` with `AWAITS_RECONCILE_READS`: a `My`
        created while the operator restarted, or while its slot's owner was
        dead, is not served after thousands of unchanged ones.
        `owned_update_filters`: per owned resource, `filter(old, new)` of a watch's
        update (objects as its cache keeps them): False when the owner's reconcile
        reads nothing that changed, so the owner is not queued (controller-runtime's
        `Owns(..., builder.WithPredicates(...))`). Adds and deletes always queue it.
        """
        if self._started:
            raise RuntimeError("add_controller() after start()")
        if workers < 1:
            raise ValueError("workers must be at least 1")
        name = name or (resource.kind or resource.plural).lower()
        transforms = transforms or {}
        for watched, selector in [(resource, label_selector),
                                  *((owned, owns_label_selector) for owned in owns)]:
            shared = self._informers.get((watched, selector))
            wanted = transforms.get(watched)
            if shared is not None and wanted is not None and shared.store.transform is not wanted:
                # One cache per (resource, selector): controllers sharing it must agree on
                # what it keeps, or one would read fields the other's projection dropped.
                raise ValueError(f"the informer for {watched} already has another transform")
        queue = WorkQueue(name, metrics=self.metrics, clock=self._clock)
        primary = self._informer(resource, label_selector, transforms.get(resource))
        primary.add_handler(own_key, queue, urgent=urgent, urgent_reads=urgent_reads)
        informers = [primary]
        for owned in owns:
            informer = self._informer(owned, owns_label_selector, transforms.get(owned))
            informer.add_handler(owner_key(resource.kind, resource.group), queue,
                                 update_filter=(owned_update_filters or {}).get(owned))
            informers.append(informer)
            if self._shard_caches is not None:
                self._shard_caches.add_children(informer, owns_label_selector)
        if self._shard_caches is not None:
            self._shard_caches.add_primary(primary)
            reconcile = self._sharded(reconcile, primary, queue, urgent)
        runner = Runner(name, queue, reconcile, workers=workers, metrics=self.metrics,
                        clock=self._clock, can_start=self._may_reconcile,
                        log_context=functools.partial(reconcile_context, kind=resource.kind,
                                                      group=resource.group),
                        reconcile_timeout_seconds=reconcile_timeout_seconds)
        self._controllers.append(_Controller(name, resource, queue, runner, primary, informers))
        self.healthz.add(f"workers-{name}", lambda r=runner: (r.threads_alive(),
                                                               "ok" if r.threads_alive()
                                                               else "a worker thread died"))

    def _sharded(self, reconcile: Callable[[ObjectKey], Result | None], primary: Informer,
                 queue: WorkQueue, urgent: Callable[[dict], bool] | None
                 ) -> Callable[[ObjectKey], Result | None]:
        """The reconcile of a sharded controller: only for objects of held slots
        (a key of another slot is dropped: its owner has it), writes fenced by
        slot, and counted in flight so a release waits for it. A key of a slot
        whose caches are still listing waits for them (ShardCaches.defer). A
        key whose object is not cached reconciles as before (to "gone":
        nothing to write), with every write refused: should its object reach
        the cache meanwhile (the watch of a slot just released still
        delivering), the reconcile must not write for a slot it was never
        counted in."""
        member, caches = self._member, self._shard_caches
        assert member is not None and caches is not None

        def reconcile_in_slot(key: ObjectKey) -> Result | None:
            obj = primary.store.get(key)
            slot = (_shards.slot_of_hash(_shards.object_hash(obj)) if obj is not None
                    else UNCACHED)
            if slot != UNCACHED and caches.defer(slot, queue, key,
                                                 urgent=urgent is not None and urgent(obj)):
                return None
            with member.working(slot) as mine:
                if not mine:
                    return None
                return reconcile(key)
        return reconcile_in_slot

    def event_recorder(self, component: str | None = None, *,
                       timeout_seconds: float = 5.0) -> EventRecorder:
        """An EventRecorder that posts from its own thread (a reconcile does not wait
        for its Events), named `component` (default: the manager's name). On stop,
        after the in-flight reconciles, what it still holds is sent for at most
        `timeout_seconds`, while the lease is still ours (Events are writes too)."""
        recorder = EventRecorder(self.client, component=component or self.name,
                                 asynchronous=True)
        self._recorders.append((recorder, timeout_seconds))
        return recorder
    def store_for(self, resource: Resource, label_selector: str | None = None, *,
                  transform: Callable[[dict], dict] | None = None) -> Store:
        """The cache of `resource` (objects matching `label_selector`), created now if new.

        For a reconciler to receive its caches before it is registered: a later
        `add_controller` watching the same resource with the same selector (as
        primary or in `owns` with `owns_label_selector`) shares this informer.
        A cache no controller watches is still filled and counts for readiness.
        `transform`: what the cache keeps of each object (a k8s_http.Projection),
        as add_controller's `transforms`; a cache made with another is refused.
        """
        if self._started:
            raise RuntimeError("store_for() after start()")
        shared = self._informers.get((resource, label_selector))
        if shared is not None and transform is not None and shared.store.transform is not transform:
            raise ValueError(f"the informer for {resource} already has another transform")
        return self._informer(resource, label_selector, transform).store

    def store(self, resource: Resource, label_selector: str | None = None) -> Store:
        """The existing cache of `resource`; with one informer per resource the selector
        may be omitted. (`store_for` creates one.)"""
        informer = self._informers.get((resource, label_selector))
        if informer is None:
            matches = [i for (r, _), i in self._informers.items() if r == resource]
            if len(matches) != 1:
                raise KeyError(f"no single informer for {resource}; add it to a controller first")
            informer = matches[0]
        return informer.store

    def watch_for_deletion(self, resource: Resource, key: ObjectKey, owner: ObjectKey, *,
                           controller: str | None = None) -> bool:
        """Enqueue `owner` in `controller`'s queue once the object `key` is deleted.

        For an object outside every cache that blocks a reconcile (a name taken
        by someone else): one narrow watch per name, no polling. False when it
        cannot be watched (too many at once, or stopping): look again later.
        """
        ctrl = self._controller(controller)
        watches = self._deletion_watches.get(ctrl.name)
        if watches is None:
            watches = self._deletion_watches.setdefault(
                ctrl.name, DeletionWatches(self.client, ctrl.queue.add))
        if self._stop.is_set():
            return False
        return watches.watch(resource, key, owner)

    def watching_deletion(self, resource: Resource, key: ObjectKey, *,
                          controller: str | None = None) -> bool:
        """Whether `watch_for_deletion` watches `key` now: it was taken when last seen,
        and its deletion has not been reported (the owner is enqueued when it is)."""
        watches = self._deletion_watches.get(self._controller(controller).name)
        return watches is not None and watches.watching(resource, key)

    def cancel_deletion_watches(self, owner: ObjectKey, *, controller: str | None = None) -> None:
        """Drop the watches `watch_for_deletion` made for `owner` (it is gone, say)."""
        watches = self._deletion_watches.get(self._controller(controller).name)
        if watches is not None:
            watches.cancel(owner)

    def _controller(self, name: str | None) -> _Controller:
        matches = [c for c in self._controllers if name is None or c.name == name]
        if len(matches) != 1:
            raise KeyError(f"no single controller named {name!r}")
        return matches[0]

    # ---- running --------------------------------------------------------

    def _caches_synced(self) -> bool:
        return all(i.has_synced() for i in self._informers.values())

    def _unsharded_caches_synced(self) -> bool:
        """The worker gate's: a sharded cache's slots are gated one by one
        (ShardCaches.defer), so one still listing gained slots holds back no other."""
        sharded = self._shard_caches.informers() if self._shard_caches is not None else ()
        return all(i.has_synced() for i in self._informers.values() if i not in sharded)

    def _on_cache_synced(self) -> None:
        """Logged once, when the last cache has synced: from then on /readyz is 200
        (a standby's too: its caches are warm for a takeover). Sharded, once the
        first share is cached too: the caches start empty and synced (nothing is
        selected before slots are claimed), and the collector's fill settings
        (gctuning.CacheFill) must last until the share's lists are in."""
        with self._synced_lock:
            if self._synced_logged or not self._caches_synced() or (
                    self._shard_caches is not None and not self._shard_caches.filled()):
                return
            self._synced_logged = True
        self._cache_fill.end()
        log.info("caches synced", extra={
            "seconds_since_start": round(self._clock() - self._started_at, 3),
            "objects": {str(i.resource): len(i.store) for i in self._informers.values()}})
        self._announce_workers()

    def _announce_workers(self) -> None:
        """controller-runtime's "Starting Controller" / "Starting workers" lines, with
        its keys, when the workers may start: caches synced and, under leader
        election, the Lease held (a standby's log does not say it works). Again in
        each new term after a lost Lease."""
        with self._synced_lock:
            if self._workers_announced or not self._synced_logged or (
                    self._elector is not None and not self._elector.is_leader()):
                return
            self._workers_announced = True
        for controller in self._controllers:
            log.info("Starting Controller", extra=_controller_keys(controller))
            log.info("Starting workers", extra={**_controller_keys(controller),
                                                "worker count": controller.runner.workers})

    def _is_stopping(self) -> bool:
        return self._draining.is_set() or self._stop.is_set()

    def _may_reconcile(self) -> bool:
        """The gate every worker checks before it starts a reconcile. Sharded: a
        member, with some held slot cached (ShardCaches.serving); slots gained
        later are gated one by one (ShardCaches.defer)."""
        if self._is_stopping() or not self._unsharded_caches_synced():
            return False
        if self._member is not None and not (self._member.is_member()
                                             and self._shard_caches.serving()):
            return False
        return self._elector is None or self._elector.is_leader()

    def is_leader(self) -> bool:
        return self._elector is None or self._elector.is_leader()

    def _start_servers(self) -> None:
        metrics_addr, probe_addr = self.metrics_bind_address, self.health_probe_bind_address
        if metrics_addr != "0" and metrics_addr == probe_addr:
            self._servers.append(ProbeServer(metrics_addr, registry=self.registry,
                                             healthz=self.healthz, readyz=self.readyz,
                                             server_name=self.name))
        else:
            if metrics_addr != "0":
                auth = self._metrics_auth.check if self._metrics_auth is not None else None
                self._servers.append(ProbeServer(metrics_addr, registry=self.registry,
                                                 healthz=None, readyz=None,
                                                 tls=self._metrics_tls, metrics_auth=auth,
                                                 server_name=self.name))
            if probe_addr != "0":
                self._servers.append(ProbeServer(probe_addr, registry=None,
                                                 healthz=self.healthz, readyz=self.readyz,
                                                 server_name=self.name))
        for server in self._servers:
            server.start()

    @property
    def server_ports(self) -> list[int]:
        """Bound ports of the metrics/probe servers, in start order (for tests on port 0)."""
        return [s.port for s in self._servers]

    def start(self) -> None:
        """Start everything and return; `stop()` undoes it."""
        if self._started:
            return
        self._started = True
        self._started_at = self._clock()
        # Before any thread of ours allocates: threads share MALLOC_ARENAS arenas
        # (allocator.py; an operator's MALLOC_ARENA_MAX in the environment wins).
        if "MALLOC_ARENA_MAX" not in os.environ:
            limit_arenas(MALLOC_ARENAS)
        # Process-wide, as the arenas: the Manager owns its process.
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        self._start_servers()
        self._cache_fill.begin()
        if self._shard_caches is not None:
            self._shard_caches.select(frozenset())     # nothing until slots are claimed
        for informer in self._informers.values():
            informer.start()
        if self._member is not None:
            self._member.start()
        if self._elector is not None:
            t = threading.Thread(target=self._elector.run, name="leader-election",
                                 args=(self._elector_stop, self._on_started_leading,
                                       self._on_stopped_leading), daemon=True)
            t.start()
            self._threads.append(t)
        for controller in self._controllers:
            controller.runner.start()
        supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        supervisor.start()
        self._threads.append(supervisor)
        self.healthz.add("supervisor", lambda: (supervisor.is_alive() or self._stop.is_set(),
                                                "ok" if supervisor.is_alive() else "dead"))
        log.info("manager started", extra={"manager": self.name,
                                           "controllers": [c.name for c in self._controllers]})

    def _on_started_leading(self) -> None:
        log.info("became leader; reconciling")
        self._announce_workers()

    def _on_stopped_leading(self) -> None:
        """Lease lost: new reconciles already stopped (the gate reads is_leader()).

        Wait for the in-flight ones, then return so the elector campaigns again
        with warm caches. If they do not finish in time, the process cannot
        promise it is no longer writing: exit non-zero and let the kubelet restart it.
        """
        if self._stop.is_set():
            return
        with self._synced_lock:
            self._workers_announced = False
        log.warning("lost the leader lease; waiting for in-flight reconciles before campaigning")
        if not self._wait_idle(self.graceful_shutdown_timeout_seconds):
            log.error("in-flight reconciles did not finish within %.0f s after losing the "
                      "lease; exiting", self.graceful_shutdown_timeout_seconds)
            self._exit_process(1)

    def _on_drain_timeout(self, slots: frozenset[int]) -> None:
        """Reconciles of released slots outlived the graceful timeout. The slots
        stay published, so nobody takes them while those may still write; exit
        so that they end, and the member Lease expires (as when a lost leader's
        reconciles do not finish), rather than leave the slots unserved."""
        if self._stop.is_set():
            return
        log.error("reconciles of %d released slots did not finish within %.0f s; exiting",
                  len(slots), self.graceful_shutdown_timeout_seconds)
        self._exit_process(1)

    def _wait_idle(self, timeout_seconds: float) -> bool:
        deadline = self._clock() + timeout_seconds
        for controller in self._controllers:
            remaining = max(0.0, deadline - self._clock())
            if not controller.runner.wait_idle(remaining):
                return False
        return True

    def _busy(self) -> bool:
        """A key is ready in a queue or a reconcile is in flight."""
        return any(len(c.queue) or not c.runner.wait_idle(0.0) for c in self._controllers)

    def _supervise(self) -> None:
        next_resync = self._clock() + self.resync_period_seconds
        # The memory a burst of reconciles (or the initial lists) freed goes back
        # to the kernel when it ends, so RSS follows the cache, not the last burst.
        trimmer = TrimAfterBursts(self._busy, clock=self._clock)
        while not self._stop.wait(SUPERVISE_INTERVAL_SECONDS):
            try:
                trimmer.tick()
                for informer in self._informers.values():
                    informer.restart_if_dead()
                if self._member is not None:
                    self._member.ring.restart_if_dead()
                if self._shard_caches is not None:
                    self._shard_caches.consolidate_if_due()
                for controller in self._controllers:
                    restarted = controller.runner.restart_dead_threads()
                    if restarted:
                        log.error("restarted %d dead worker thread(s) of %s", restarted,
                                  controller.name)
                if self._clock() >= next_resync:
                    next_resync = self._clock() + self.resync_period_seconds
                    self.resync()
            except Exception:  # the supervisor must outlive any one bad round
                log.exception("supervisor round failed")

    def resync(self) -> None:
        """Re-enqueue every primary object (level-based: converged objects cost no writes),
        low: behind the keys of watch events, as controller-runtime queues a resync."""
        for controller in self._controllers:
            controller.queue.add_many(controller.primary.store.keys(), priority=LOW_PRIORITY)

    def stop(self) -> int:
        """Graceful stop; idempotent and safe from any thread. Returns the exit code."""
        with self._stop_lock:
            if self._stopped.is_set() or self._stop.is_set():
                first = False
            else:
                first = True
                self._stop.set()        # readyz 503 and the worker gate close at once
                self._stop_requested.set()          # run(), parked on it, wakes
        if not first:
            self._stopped.wait(self.graceful_shutdown_timeout_seconds + 5)
            return self._exit_code
        self._cache_fill.end(freeze=False)     # synced or not: the thresholds are put back
        log.info("stopping: draining in-flight reconciles (up to %.0f s)",
                 self.graceful_shutdown_timeout_seconds)
        for controller in self._controllers:
            log.info("Shutdown signal received, waiting for all workers to finish",
                     extra=_controller_keys(controller))
            controller.runner.stop()
        idle = self._wait_idle(self.graceful_shutdown_timeout_seconds)
        if not idle:
            log.error("in-flight reconciles did not finish within the graceful timeout")
            self._exit_code = 1
        else:
            for controller in self._controllers:
                log.info("All workers finished", extra=_controller_keys(controller))
        for controller in self._controllers:
            controller.queue.shutdown(drain=False)
        for recorder, timeout_seconds in self._recorders:
            recorder.close(timeout_seconds)
        # Idle: the Lease is handed back, so a standby leads (or the others claim
        # our slots) at once. Not idle: a reconcile may still write, so nothing
        # is written and the Lease expires as after a crash; the elector stops
        # renewing either way, and the write guard closes at the renew deadline.
        if self._elector is not None:
            self._elector_stop.set()
            if idle:
                try:
                    self._elector.release()
                except Exception:
                    log.exception("releasing the leader lease failed")
            else:
                log.warning("leader lease %s/%s not released: left to expire",
                            self._elector.namespace, self._elector.name)
        if self._member is not None:
            self._member.leave(release=idle)
        for watches in self._deletion_watches.values():
            watches.stop()
        for informer in self._informers.values():
            informer.stop()
        for server in self._servers:
            server.stop()
        self.client.transport.close()
        self._stopped.set()
        log.info("stopped", extra={"exit_code": self._exit_code})
        return self._exit_code

    def _on_signal(self, signum, _frame) -> None:
        self._signals_received += 1
        if self._signals_received > 1:
            log.warning("second signal (%s): exiting at once", signal.Signals(signum).name)
            self._exit_process(1)
        log.info("received %s; shutting down", signal.Signals(signum).name)
        # The handler runs on the main thread, which run() parks on
        # _stop_requested; readiness is withdrawn here, not when it wakes.
        self._draining.set()
        self._stop_requested.set()

    def run(self) -> int:
        """Start, block until SIGTERM/SIGINT (or stop() from elsewhere), stop; the exit code."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        while not self._stop_requested.wait(MAIN_WAIT_SECONDS):
            pass
        return self.stop()


def _metrics_tls_context(cert_dir: str | None) -> ssl.SSLContext:
    """The HTTPS context for secure metrics: `tls.crt` / `tls.key` from `cert_dir`,
    else a throw-away self-signed pair. Raises ConfigError naming the fix."""
    if cert_dir:
        cert, key = os.path.join(cert_dir, "tls.crt"), os.path.join(cert_dir, "tls.key")
        try:
            return server_tls_context(cert, key)
        except ValueError as exc:
            raise ConfigError(cert_dir, f"cannot load tls.crt / tls.key ({exc.__cause__ or exc})",
                              "mount a TLS Secret there (e.g. from cert-manager)") from None
    # The key exists on disk only while openssl writes it and ssl loads it:
    # a private directory (mkdtemp: mode 0700), removed at once.
    directory = None
    try:
        directory = tempfile.mkdtemp(prefix="metrics-cert-")
        cert, key = self_signed_cert(directory)
        context = server_tls_context(cert, key)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfigError(setting("metrics_secure"), "no certificate directory was given and "
                          f"a self-signed certificate could not be made ({exc})",
                          f"give one holding tls.crt and tls.key with "
                          f"{setting('metrics_cert_dir')}") from None
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
    log.warning("secure metrics: serving a self-signed certificate (development only; "
                "scrapers cannot verify it); give a certificate directory for a real one")
    return context
