"""my-controller: turns each `My` (mine.jp/v1) into a Deployment and a Service.

The contract is docs/SPEC.md §1-3. In short, for a `My` named N in namespace NS the
operator keeps, by server-side apply (field manager ``my-controller``, force):

  * Deployment N: our three labels, a selector on two of them, `replicas`, one
    container ``app`` with the image, the container port, env and resources;
  * Service N: `type`, the same selector, port -> targetPort, TCP;

both controlled by the `My` (so the garbage collector deletes them with it), and
reports `observedGeneration`, replica counts, the selector and a ``Ready``
condition on the `My`'s status subresource.

What a `My` means is the ``my`` package, pure and unit-tested on its own:
``my.spec`` (the resource, its defaults, validation), ``my.render`` (the
children's apply configurations, the foreign-entries patch) and ``my.status``
(the Ready condition, the status to write). This file is the I/O around them:

  1. the reconciler's numbers, and what the caches keep (``PROJECTIONS``);
  2. ``MyReconciler``: the level-based reconcile, reading caches, writing little
     (its generic policies are k8s_http's: ``StatusHold``, ``SettledVersions``,
     ``GenerationMemo``, ``PodCheckSchedule``, ``write_through``);
  3. ``main``: flags, configuration errors as one line, the Manager
     (``run_manager``: a port that cannot be bound is a flag error).

This module imports only the standard library, the ``k8s_http`` package root
and ``my``; nothing in ``my`` imports it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Callable, Mapping, NamedTuple

from k8s_http import (
    AWAITS_RECONCILE_READS,
    EventRecorder,
    GenerationMemo,
    DEPLOYMENTS,
    SERVICES,
    ApiError,
    ConfigError,
    ConflictError,
    InvalidError,
    Manager,
    NotFoundError,
    ObjectKey,
    PODS,
    PodCheckSchedule,
    Projection,
    Resource,
    Result,
    SettledVersions,
    StatusHold,
    Store,
    TerminalError,
    awaits_reconcile,
    config_hash,
    queued_seconds,
    controller_of,
    get_condition,
    is_controlled_by,
    is_namespace_terminating,
    load_config,
    meta_of,
    needs_apply,
    pod_problem,
    slot_label_value,
    slot_of,
    with_config_hash,
    resource_version_of,
    rfc3339_now,
    setup_logging,
    write_through,
)
from k8s_http import (add_manager_flags, flag_error, manager_options, new_parser, positive_int,
                      run_manager, with_flag_names)
from k8s_http import __version__

from my.render import foreign_entries_patch, render_deployment, render_service
from my.spec import (CONFIG_HASH_ANNOTATION, FIELD_MANAGER, SLOT_LABEL, LABEL_INSTANCE, LABEL_MANAGED_BY,
                     LABEL_NAME, MANAGED_SELECTOR, MAX_REPLICAS, MY, NAME, effective_spec,
                     selector_string, validate_my)
from my.status import (APPLY_FAILED, CONDITION_READY, CONFLICT, INVALID_SPEC,
                       PROGRESS_DEADLINE_EXCEEDED, REPLICA_FAILURE, WARNING_REASONS,
                       deployment_update_matters, desired_status, is_rollout_pending,
                       pods_worth_reading, ready_summary, same_inputs, status_changed)

log = logging.getLogger("my_controller")

# --------------------------------------------------------------------------
# 1. The reconciler's numbers, and what the caches keep

# A conflicting child that is not ours is not in our label-selected caches, so
# nothing we watch changes when its owner deletes it: the Manager watches that
# one name until it is deleted (watch_for_deletion). Only when it cannot (too
# many at once) do we look again this often: a refused create and a GET, never
# a write (the Conflict status is already there).
CONFLICT_RECHECK_SECONDS = 60.0

# How long a status that the Deployment controller is about to change may be
# held back, so that one write reports both (k8s_http.StatusHold):
# this long when our work queue is quick, as long as the key itself just
# waited in the queue when it is not (under a burst the user already waits
# that long, and the Deployment controller is behind by about as much), and
# never longer than the cap. So a user sees observedGeneration and a Ready
# condition for a generation the operator has acted on within about twice the
# queue's own delay, and within STATUS_COALESCE_SECONDS when it is idle.
STATUS_COALESCE_SECONDS = 0.5
STATUS_HOLD_CAP_SECONDS = 10.0

# A My that is not ready while its Deployment has caught up with its spec gets
# the cause its Pods show in the Ready message (k8s_http.pod_problem). Its Pods
# are listed (label-selected, one bounded read) only once it has been unready
# this long, so the few seconds Pods take to start cost no read, and then
# again at doubling intervals up to the maximum while it stays unready (a
# crash loop's restart count moves). A ready fleet costs no read at all.
POD_CHECK_FIRST_SECONDS = 5.0
POD_CHECK_MAX_SECONDS = 60.0
# One page: a My has at most MAX_REPLICAS Pods and a rollout's surge.
POD_LIST_LIMIT = 2 * MAX_REPLICAS

# How many My generations' validation and rendered children are remembered (a
# bounded memory, whatever the number of My objects; see MyReconciler._desired).
RENDER_MEMO_SIZE = 1024
# A status is held only while at least this share of the Deployment
# controller's recent answers came within their window (an exponentially
# weighted mean, this weight for the newest): four late answers in a row stop
# the holds, one or two timely ones bring them back.
ANSWER_HIT_RATE_MIN = 0.5
ANSWER_HIT_WEIGHT = 0.2

# What the caches keep (k8s_http.Projection): exactly the fields the reconciler
# and the ``my`` functions it hands cached objects to read, everything else is
# dropped on the way in (list, watch, our own write answers). Declared here,
# where the caches are made; a read of a field not listed fails
# tests/unit/test_controller.py, whose stores raise on dropped keys
# (Projection.guarded). Readers are named per group.
_CHILD_META = (
    "apiVersion", "kind",                               # needs_apply (desired has them)
    "metadata.name", "metadata.namespace",              # keys, needs_apply
    "metadata.resourceVersion",                         # Store.end_write, "Updated" events
    "metadata.generation",                              # my.status: readiness, rollout
    ("metadata", "labels", LABEL_NAME), ("metadata", "labels", LABEL_INSTANCE),
    ("metadata", "labels", LABEL_MANAGED_BY),           # needs_apply: our labels only
    ("metadata", "labels", SLOT_LABEL),                 # needs_apply, with --shards=auto
    ("metadata", "annotations", CONFIG_HASH_ANNOTATION),  # needs_apply, _ensure_child
    "metadata.ownerReferences",   # is_controlled_by, needs_apply, the informer's mapper
)
# Unique per object: sharing them would only grow the intern table.
_CHILD_DISTINCT = ("metadata.resourceVersion",
                   ("metadata", "annotations", CONFIG_HASH_ANNOTATION))
DEPLOYMENT_PROJECTION = Projection(_CHILD_META + (
    # needs_apply and foreign_entries_patch: what render_deployment sends, and
    # the names of the entries beside ours.
    "spec.replicas", "spec.selector", "spec.progressDeadlineSeconds",
    ("spec", "template", "metadata", "labels", LABEL_NAME),
    ("spec", "template", "metadata", "labels", LABEL_INSTANCE),
    ("spec", "template", "metadata", "labels", LABEL_MANAGED_BY),
    "spec.template.spec.securityContext",
    "spec.template.spec.containers[].name", "spec.template.spec.containers[].image",
    "spec.template.spec.containers[].ports", "spec.template.spec.containers[].resources",
    "spec.template.spec.containers[].securityContext",
    "spec.template.spec.containers[].env[].name", "spec.template.spec.containers[].env[].value",
    "spec.template.spec.containers[].env[].valueFrom",
    # my.status: desired_status, is_rollout_pending, pods_worth_reading
    "status.observedGeneration", "status.replicas", "status.readyReplicas",
    "status.updatedReplicas", "status.conditions[].type", "status.conditions[].status",
    "status.conditions[].reason", "status.conditions[].message",
), distinct=_CHILD_DISTINCT,
   # Often unique ('ReplicaSet "web-5d8f" has successfully progressed.'),
   # sometimes common to all ("Deployment has minimum availability.").
   repeated=("status.conditions[].message",))
SERVICE_PROJECTION = Projection(_CHILD_META + (
    "spec.type", "spec.selector",                       # needs_apply
    "spec.ports[].port", "spec.ports[].targetPort", "spec.ports[].protocol",  # + foreign ports
), distinct=_CHILD_DISTINCT)
MY_PROJECTION = Projection((
    "apiVersion", "kind",                               # EventRecorder's involvedObject
    "metadata.name", "metadata.namespace", "metadata.uid", "metadata.generation",
    "metadata.resourceVersion", "metadata.deletionTimestamp",
    "spec",            # validate_my checks every key, render_* copy it
    "status",          # desired_status keeps the fields it does not own
), distinct=("metadata.resourceVersion",))
PROJECTIONS = {MY: MY_PROJECTION, DEPLOYMENTS: DEPLOYMENT_PROJECTION,
               SERVICES: SERVICE_PROJECTION}

# --------------------------------------------------------------------------
# 2. The reconcile (Events go through k8s_http's EventRecorder)


def _unfixable(my: dict, reason: str, message: str) -> TerminalError:
    """The error a reconcile ends with when the My is Ready=False for a cause the
    operator cannot fix itself (InvalidSpec, Conflict): counted where
    controller-runtime users look (result="error", reconcile_errors_total), never
    retried (a change to the My or the deletion watch brings the key back), and
    logged at error level once, when the cause appears: quiet when the My's status
    (as this reconcile read it) already said the same."""
    cond = get_condition(my, CONDITION_READY) or {}
    seen = cond.get("status") == "False" and cond.get("reason") == reason and \
        cond.get("message") == message
    return TerminalError(f"{reason}: {message}", quiet=seen)


class _Blocked(NamedTuple):
    """A child we may not write (a name taken by someone else): stop the reconcile."""
    result: Result | None


def with_slot_label(my: dict, child: dict, slot_label: str) -> dict:
    """A rendered child of `my` (changed in place and returned) labelled `slot_label`
    with its owner's slot, and its config hash stamped again over the label: with
    --shards=auto a replica watches the children of its own slots only. The bench
    renders a sharded operator's converged fleet with it (bench/scaling/fleet.py)."""
    slot = slot_of(meta_of(my).get("uid") or "")
    annotations = child["metadata"].get("annotations") or {}
    annotations.pop(CONFIG_HASH_ANNOTATION, None)
    child["metadata"].setdefault("labels", {})[slot_label] = slot_label_value(slot)
    return with_config_hash(child, CONFIG_HASH_ANNOTATION)


class MyReconciler:
    """reconcile(key) for `My` objects.

    Reads `stores`, the caches of My and of our children by resource (MY,
    DEPLOYMENTS, SERVICES; the children's selected by MANAGED_SELECTOR, see
    `main`), and writes through `client`. `watch_for_deletion(resource, key,
    owner) -> bool`, `cancel_deletion_watches(owner)` and `watching_deletion(resource,
    key) -> bool` are the Manager's
    narrow watches on a name outside the caches (a conflicting child).

    Level-based: every call looks at the current state (caches, and the server
    where a cache cannot know) and does what is missing, whatever the event
    that triggered it. When nothing differs it writes nothing.
    """

    CHILDREN = ((DEPLOYMENTS, render_deployment), (SERVICES, render_service))

    def __init__(self, client, stores: Mapping[Resource, Store], *,
                 watch_for_deletion: Callable[[Resource, ObjectKey, ObjectKey], bool],
                 cancel_deletion_watches: Callable[[ObjectKey], None],
                 watching_deletion: Callable[[Resource, ObjectKey], bool] = lambda r, k: False,
                 recorder: EventRecorder | None = None,
                 now: Callable[[], str] = rfc3339_now,
                 clock: Callable[[], float] = time.monotonic,
                 status_coalesce_seconds: float = STATUS_COALESCE_SECONDS,
                 slot_label: str | None = None):
        self.client = client
        # With --shards=auto: children carry their owner's slot in this label, so a
        # replica's label-selected watches hold the children of its own slots only.
        self._slot_label = slot_label
        self._stores = stores
        self._watch_for_deletion = watch_for_deletion
        self._cancel_deletion_watches = cancel_deletion_watches
        self._watching_deletion = watching_deletion
        # main() passes the manager's asynchronous recorder; this one waits for each Event.
        self.recorder = recorder or EventRecorder(client, component=NAME)
        self._now = now
        # (child plural, key) -> the foreign-entries patch a webhook undid (see
        # _remove_foreign_entries); dropped when the My goes.
        self._futile_patches: dict[tuple[str, ObjectKey], str] = {}
        self._clock = clock
        # A status change the Deployment controller is about to follow with its
        # answer is held back so that one write reports both (see _write_status).
        self._status_hold = StatusHold(
            coalesce_seconds=status_coalesce_seconds, cap_seconds=STATUS_HOLD_CAP_SECONDS,
            weight=ANSWER_HIT_WEIGHT, min_hit_rate=ANSWER_HIT_RATE_MIN, clock=clock,
            queued_seconds=queued_seconds)
        # The resourceVersions (My, Deployment, Service) a reconcile finished with:
        # everything written, or a status held. The same versions in the caches
        # again give the same answer (the reconcile reads nothing else once both
        # children exist, and a hold only depends on the time), so a resync, or an
        # echo of our own write that still wakes the key (one the store could not
        # name the writer of: see write_through), costs three cache reads.
        self._settled = SettledVersions(stores, (MY, DEPLOYMENTS, SERVICES))
        # When to read the Pods of a My that is not ready (see _pod_cause).
        self._pod_checks = PodCheckSchedule(first_seconds=POD_CHECK_FIRST_SECONDS,
                                            max_seconds=POD_CHECK_MAX_SECONDS, clock=clock)
        # Validation and rendered children per My generation: see _desired.
        self._rendered = GenerationMemo(RENDER_MEMO_SIZE)

    def __call__(self, key: ObjectKey) -> Result | None:
        if self._settled.unchanged(key):
            done, result = self._settled_result(key)
            if done:
                return result
        self._settled.forget(key)
        # The store answers with our own last write until its watch brings it.
        my = self._stores[MY].get(key)
        if my is None:
            self._forget(key)     # gone: the garbage collector deletes the children
            return None
        # Children our cache shows (or our last write of them).
        lives = {resource: self._cached_child(resource, key) for resource, _ in self.CHILDREN}
        if meta_of(my).get("deletionTimestamp"):
            # Being deleted (maybe in the foreground, children first): do not recreate them.
            return None

        problems, desired = self._desired(key, my)
        if problems:
            # Children are left as they are; no retry until the generation changes
            # (the My's update event brings us back). The same generation gives the
            # same status, so a repeat writes nothing.
            message = "; ".join(problems)
            self._write_status(key, my, self._our_cached_deployment(key, my),
                               condition=(INVALID_SPEC, message))
            raise _unfixable(my, INVALID_SPEC, message)

        # Children our cache shows under another controller (labelled, but owned by
        # another My) stop the reconcile before anything is written.
        for resource, live in lives.items():
            if live is not None and not is_controlled_by(live, my):
                return self._conflict(key, my, resource, live)

        # A child missing for a reason we know (its name taken, watched) is no sign
        # of a stale cache: no live read for it.
        if any(live is None and not self._watching_deletion(resource, key)
               for resource, live in lives.items()) and self._has_acted_on(my) \
                and not self._still_exists(key, my):
            return None

        blocked = self._ensure_children(key, my, desired, lives)
        if blocked is not None:
            return blocked.result
        return self._report(key, my, lives)

    def _settled_result(self, key: ObjectKey) -> tuple[bool, Result | None]:
        """(True, what to return) when nothing changed since a reconcile finished
        (an echo of our own writes, a resync), known from the caches'
        resourceVersions alone; (False, None) when a timer it set is due: a held
        status to write as it stands, or Pods to read again."""
        now = self._clock()
        until = self._status_hold.held_until(key)
        if until is None:
            due = self._pod_checks.due_at(key)
            if due is None:
                return True, None
            if due > now:      # handed out early: the promise to come back stands
                return True, Result(requeue_after_seconds=due - now, priority=1)
            return False, None          # its Pods are due to be read again
        if until > now:
            return True, Result(requeue_after_seconds=until - now, priority=1)
        return False, None              # the hold is over and nothing came

    def _forget(self, key: ObjectKey) -> None:
        """The My is gone: drop what was kept for it."""
        self.recorder.forget(key)
        self._cancel_deletion_watches(key)
        for resource, _ in self.CHILDREN:
            self._futile_patches.pop((resource.plural, key), None)
        self._status_hold.forget(key)
        self._settled.forget(key)
        self._pod_checks.stop(key)

    def _ensure_children(self, key: ObjectKey, my: dict, desired: tuple[dict, ...],
                         lives: dict) -> _Blocked | None:
        """Apply each child in turn (`lives` updated with what the server answered);
        _Blocked when one may not be written; one Event per kind of change."""
        changes: list[tuple[str, Resource]] = []      # ("Created" | "Updated", kind)
        try:
            for (resource, _), want in zip(self.CHILDREN, desired):
                live = self._ensure_child(key, my, resource, want, lives[resource], changes)
                if isinstance(live, _Blocked):
                    return live
                lives[resource] = live
        except ApiError as err:
            if is_namespace_terminating(err):
                # The namespace is being deleted (its controller removes the children
                # before the My): creating anything there is refused, and the My goes
                # next. As client-go's controllers do, give up quietly, no retry.
                log.info("not recreating %s %s: namespace %s is being deleted",
                         resource.kind, key.name, key.namespace)
                changes.clear()          # its Events would be refused the same way
                return _Blocked(None)
            message = f"applying {resource.kind} {key.name} failed: {err}"   # the failed one
            self.recorder.event(my, "Warning", "ReconcileError", message)
            try:
                self._write_status(key, my, self._our_cached_deployment(key, my),
                                   condition=(APPLY_FAILED, message))
            except Exception as status_err:  # the apply error is the one to report
                log.warning("could not record ApplyFailed on %s", key,
                            extra={"error": f"{type(status_err).__name__}: {status_err}"})
            raise  # the runner retries with backoff
        finally:
            self._report_changes(my, changes)
        return None

    def _report(self, key: ObjectKey, my: dict, lives: dict) -> Result | None:
        """Write the status the children now give (maybe held), and when to come back."""
        deployment = self._reported_deployment(key, my, lives[DEPLOYMENTS])
        pod_cause, recheck = self._pod_cause(key, my, deployment)
        wait, reported = self._write_status(key, my, deployment, pod_cause=pod_cause,
                                            pending=is_rollout_pending(deployment))
        # The versions this reconcile worked from or wrote, not a fresh cache read:
        # a version the watch brought meanwhile has not been reconciled yet.
        self._settled.settle(key, reported, deployment, lives[SERVICES])
        if wait:
            # Priority: the Deployment's update (or the end of the window) brings
            # the key back ahead of the queue, so holding costs no extra queue pass.
            return Result(requeue_after_seconds=min(wait, recheck or wait), priority=1)
        if recheck:
            # To read its Pods then. With priority, as a hold: the Deployment's update
            # saying they are ready brings the key back first, and then the timer is
            # dropped (no reconcile for nothing when Pods start in time).
            return Result(requeue_after_seconds=recheck, priority=1)
        return None

    def _pod_cause(self, key: ObjectKey, my: dict, deployment: dict | None
                   ) -> tuple[str | None, float | None]:
        """(why the My's Pods are not ready, seconds until they are to be read again).

        (None, None) while there is nothing to read them for (see
        pods_worth_reading). The first read comes POD_CHECK_FIRST_SECONDS after
        the My was first seen unready, the next ones at doubling intervals; in
        between, the cause the last read found is reported, so the message does
        not flap. A failed read keeps that cause: it never fails the reconcile.
        """
        if not pods_worth_reading(effective_spec(my.get("spec")), deployment):
            self._pod_checks.stop(key)
            return None, None

        def read(last: str | None) -> str | None:
            try:
                pods = self.client.list(PODS, namespace=key.namespace, limit=POD_LIST_LIMIT,
                                        label_selector=selector_string(key.name))["items"]
            except ApiError as err:
                log.info("could not read the Pods of %s to tell why it is not ready: %s",
                         key, err)
                return last
            return pod_problem(pods)
        return self._pod_checks.check(key, read)

    def _reported_deployment(self, key: ObjectKey, my: dict, deployment: dict | None
                             ) -> dict | None:
        """The Deployment the status reports on: `deployment` (as our apply answered or
        the cache showed it), or the informer's copy when that already carries the
        Deployment controller's answer for the same generation. The answer can arrive
        while this reconcile applies the Service and posts its Event; reporting it
        saves the status write that would follow. Same generation, so the same spec,
        and a status at or past ours. (The store answers with our own write until
        its watch has brought a newer version of the key.)"""
        if deployment is None or not is_rollout_pending(deployment):
            return deployment
        cached = self._stores[DEPLOYMENTS].get(key)
        if cached is not None and is_controlled_by(cached, my) and \
                meta_of(cached).get("generation") == meta_of(deployment).get("generation") and \
                not is_rollout_pending(cached):
            return cached
        return deployment

    # -- children -------------------------------------------------------

    def _desired(self, key: ObjectKey, my: dict) -> tuple[list[str], tuple[dict, ...]]:
        """validate_my(my), and the children rendered when it finds nothing.

        Remembered for the last RENDER_MEMO_SIZE generations of My objects
        (k8s_http.GenerationMemo): a new My is reconciled again when its
        Deployment's controller answers (after our status write, so from another
        resourceVersion of the same generation), and validating and rendering
        (with the canonical JSON of the config hash) was a fifth of a burst's CPU.
        Both read only the name, namespace, uid and spec, and the spec cannot
        change without the generation (the status subresource is on). Every
        answer is a new copy.
        """
        return self._rendered(key, my, self._validate_and_render)

    def _validate_and_render(self, my: dict) -> tuple[list[str], tuple[dict, ...]]:
        problems = validate_my(my)
        if problems:
            return problems, ()
        return problems, tuple(self._with_slot(my, render(my)) for _, render in self.CHILDREN)

    def _with_slot(self, my: dict, child: dict) -> dict:
        """Sharding: the child labelled with its owner's slot (and hashed again). A
        child made before sharding lacks it, so the slot-selected cache misses it:
        the create-only apply meets 409, the GET shows it ours, and the apply
        adds the label (once per child; see docs/SHARDING.md)."""
        if self._slot_label is None:
            return child
        return with_slot_label(my, child, self._slot_label)

    @staticmethod
    def _has_acted_on(my: dict) -> bool:
        """We reconciled this My before (its status says so): a missing child vanished."""
        return (my.get("status") or {}).get("observedGeneration") is not None

    def _still_exists(self, key: ObjectKey, my: dict) -> bool:
        """A live read before re-creating a child that vanished.

        The garbage collector deletes the children of a deleted My. If our My
        cache is stale (its watch down, say), the cached My is a ghost, and
        re-creating its children would fight the collector in a loop (create,
        collect, DELETED event, create...). One GET per repair settles it: the
        My must exist with the same uid. A new My (no status yet) costs no read.
        """
        try:
            live = self.client.get(MY, key.name, namespace=key.namespace)
        except NotFoundError:
            live = None
        if live is not None and meta_of(live).get("uid") == meta_of(my).get("uid"):
            return True
        log.info("not re-creating the children of %s: the My is gone (uid %s), the cache "
                 "is behind", key, meta_of(my).get("uid"))
        return False

    def _cached_child(self, resource: Resource, key: ObjectKey) -> dict | None:
        """The child named like the My as our cache (or our last write) shows it.

        Our caches hold only objects carrying our managed-by label, so None means
        (a) no object, (b) ours but not yet seen by the watch, or (c) someone
        else's unlabelled object of that name, or ours with the label removed.
        `_ensure_child` tells them apart with a create-only apply.
        """
        return self._stores[resource].get(key)

    def _ensure_child(self, key: ObjectKey, my: dict, resource: Resource, desired: dict,
                      live: dict | None, changes: list) -> dict | _Blocked | None:
        """Make the child say what `desired` says; returns it as the server has it
        (or the cached copy when nothing differed), or _Blocked when it is not ours.

        A child missing from the cache is created with a create-only apply: one
        request when the name is free, which is every new My. Only if the name is
        taken (409) do we read the object to see whose it is, and a foreign one is
        never touched -- a plain forced apply would take it over.
        """
        if live is not None and config_hash(live, CONFIG_HASH_ANNOTATION) == \
                config_hash(desired, CONFIG_HASH_ANNOTATION):
            # Our spec is what the child was last applied with, so list entries
            # we do not send now are someone else's: remove them first (a forced
            # apply would merge ours with theirs, maybe into a 422).
            live = self._remove_foreign_entries(key, resource, desired, live, changes)
        if not needs_apply(desired, live):
            return live
        if live is None and self._watching_deletion(resource, key):
            self._conflict_stands(key, my)
        if live is None:
            try:
                applied = self._apply(resource, desired, key, create_only=True)
            except ConflictError:
                try:
                    live = self.client.get(resource, key.name, namespace=key.namespace)
                except NotFoundError:
                    return _Blocked(Result(requeue=True))   # deleted in between: look again soon
                if not is_controlled_by(live, my):
                    return _Blocked(self._conflict(key, my, resource, live))
                if not needs_apply(desired, live):
                    return live
                applied = self._apply(resource, desired, key, base=live)
        else:
            applied = self._apply_over(key, resource, desired, live, changes)
        if live is None:
            changes.append(("Created", resource))
        elif resource_version_of(applied) != resource_version_of(live):
            changes.append(("Updated", resource))
        else:
            # The server found nothing to change: needs_apply saw a difference that
            # is not one (a normalisation it does not model). Harmless but a write.
            log.debug("apply of %s %s changed nothing", resource.kind, key.name)
        return applied

    def _conflict_stands(self, key: ObjectKey, my: dict) -> None:
        """The name is known to be taken (found so, and its squatter's deletion not
        yet reported): another create would only be refused. The Conflict status
        stands (written again only for a new generation), and the reconcile ends
        with it; the deletion watch brings the key back when the squatter goes."""
        cond = get_condition(my, CONDITION_READY) or {}
        if cond.get("reason") == CONFLICT:
            self._write_status(key, my, None, condition=(CONFLICT, cond.get("message", "")))
            raise _unfixable(my, CONFLICT, cond.get("message", ""))

    def _apply_over(self, key: ObjectKey, resource: Resource, desired: dict, live: dict,
                    changes: list) -> dict:
        """Apply a changed spec over an existing child, then remove foreign entries.

        Applied first, because the apply itself drops the entries of our
        previous spec (we own them), so a port change costs one write. What
        remains beside ours in the answer is someone else's. If the merge with
        their entries is invalid (a 422: two unnamed Service ports), they are
        removed first and the apply made again.
        """
        try:
            applied = self._apply(resource, desired, key, base=live)
        except InvalidError:
            if foreign_entries_patch(desired, live) is None:
                raise
            live = self._remove_foreign_entries(key, resource, desired, live, changes)
            applied = self._apply(resource, desired, key, base=live)
        return self._remove_foreign_entries(key, resource, desired, applied, changes)

    def _remove_foreign_entries(self, key: ObjectKey, resource: Resource, desired: dict,
                                live: dict, changes: list) -> dict:
        """Delete other managers' entries in the fields the spec decides (one patch).

        A mutating admission webhook may put them back on every write (an env
        var injected into each container, say). Then the patch is futile and
        repeating it would be a write per reconcile for ever: a patch that left
        the same foreign entries behind is not sent again until what it would
        remove changes.
        """
        patch = foreign_entries_patch(desired, live)
        if patch is None:
            self._futile_patches.pop((resource.plural, key), None)
            return live
        fingerprint = json.dumps(patch, sort_keys=True)
        if self._futile_patches.get((resource.plural, key)) == fingerprint:
            return live
        patched = self._write(resource, live, lambda: self.client.patch(
            resource, key.name, patch, namespace=key.namespace, patch_type="strategic",
            field_manager=FIELD_MANAGER))
        if resource_version_of(patched) != resource_version_of(live):
            changes.append(("Updated", resource))
        if foreign_entries_patch(desired, patched) == patch:
            log.warning("%s %s: other entries in fields the My decides came back at once "
                        "(a mutating admission webhook?); leaving them: %s",
                        resource.kind, key.name, fingerprint)
            self._futile_patches[(resource.plural, key)] = fingerprint
        return patched

    def _apply(self, resource: Resource, desired: dict, key: ObjectKey, *,
               create_only: bool = False, base: dict | None = None) -> dict:
        return self._write(resource, base, lambda: self.client.apply(
            resource, desired, field_manager=FIELD_MANAGER, force=True,
            namespace=key.namespace, create_only=create_only))

    def _write(self, resource: Resource, base: dict | None, send: Callable[[], dict]) -> dict:
        """Send a write the cache answers with at once (k8s_http.write_through)."""
        return write_through(self._stores[resource], send, base=base)

    def _conflict(self, key: ObjectKey, my: dict, resource: Resource, live: dict) -> Result:
        owner = controller_of(live)
        held = f" (controlled by {owner.get('kind')} {owner.get('name')})" if owner else ""
        message = (f"{resource.kind} {key.name} already exists and is not controlled "
                   f"by this My{held}; delete or rename it")
        self._write_status(key, my, None, condition=(CONFLICT, message))
        # Its deletion is invisible to our label-selected watches: watch its name.
        if self._watch_for_deletion(resource, key, key):
            raise _unfixable(my, CONFLICT, message)
        return Result(requeue_after_seconds=CONFLICT_RECHECK_SECONDS)

    def _our_cached_deployment(self, key: ObjectKey, my: dict) -> dict | None:
        cached = self._cached_child(DEPLOYMENTS, key)
        return cached if cached is not None and is_controlled_by(cached, my) else None

    # -- writing --------------------------------------------------------

    def _report_changes(self, my: dict, changes: list[tuple[str, Resource]]) -> None:
        """One Event per kind of change in a reconcile ("Created Deployment x and
        Service x"), not one per child: Events are writes too."""
        name = meta_of(my).get("name")
        for verb in ("Created", "Updated"):
            kinds = list(dict.fromkeys(resource.kind for done, resource in changes
                                       if done == verb))
            if kinds:
                what = " and ".join(f"{kind} {name}" for kind in kinds)
                log.info("%s %s", verb.lower(), what)
                self.recorder.event(my, "Normal", verb, f"{verb} {what}")

    def _write_status(self, key: ObjectKey, my: dict, deployment: dict | None, *,
                      condition: tuple[str, str] | None = None, pod_cause: str | None = None,
                      pending: bool | None = None) -> tuple[float, dict | None]:
        """Write the status `my` should have, if it differs. Returns the seconds
        the caller should come back after when the write is held, and the My as
        it now stands (the server's answer when written; None when it was
        deleted meanwhile).

        `pending`: whether the Deployment controller is still at work on the
        Deployment (is_rollout_pending); None when the status is not about the
        Deployment (a failure condition), which is never held. While it is at
        work, its next status update would need a write of its own, so a change
        may wait for it (k8s_http.StatusHold): within STATUS_COALESCE_SECONDS
        when our queue is idle, about the queue's own delay under a burst, and
        not at all while most of its recent answers came later than that. Idle, a new
        My costs one status write.
        """
        old = my.get("status") or {}
        new = desired_status(my, deployment, condition=condition, now=self._now(),
                             pod_cause=pod_cause)
        wait = self._status_hold.wait(key, pending)
        if not status_changed(old, new):
            self._status_hold.release(key)
            return 0.0, my
        if wait > 0:
            return wait, my
        self._status_hold.release(key)
        try:
            written = self._write(MY, my, lambda: self.client.patch_status(
                MY, key.name, {"status": new}, namespace=key.namespace))
        except NotFoundError:
            return 0.0, None  # deleted meanwhile: nothing to report on
        summary = ready_summary(new) or ()
        # debug: the status itself says it (kubectl get my); at info every status
        # write of a burst was a log line.
        log.debug("status of %s: Ready=%s %s", key, *summary[:2])
        self._warn_on_news(my, old, new)
        # A merge patch of /status lands on whatever the My is by then: if someone
        # changed it after our read, the answer carries a spec this reconcile never
        # saw. Then it is not what we settled on: the input is, and the change's own
        # event brings us back.
        return 0.0, written if same_inputs(written, my) else my

    def _warn_on_news(self, my: dict, old: dict, new: dict) -> None:
        """Warning events follow the condition, not each write: an InvalidSpec,
        Conflict or workload failure is reported once when it appears, not at
        every replica change. A workload failure's message carries replica
        counts that move: only a new reason is news there."""
        old_summary, new_summary = ready_summary(old) or (), ready_summary(new) or ()
        reason = new_summary[1] if len(new_summary) > 1 else None
        if reason in WARNING_REASONS:
            compared = 2 if reason in (REPLICA_FAILURE, PROGRESS_DEADLINE_EXCEEDED) else 3
            if old_summary[:compared] != new_summary[:compared]:
                self.recorder.event(my, "Warning", reason, new_summary[2])


# --------------------------------------------------------------------------
# 3. Command line


def build_parser() -> argparse.ArgumentParser:
    """The library's manager flags under this operator's name, plus --workers."""
    parser = new_parser(
        NAME,
        description="A Kubernetes operator: keeps a Deployment and a Service for every\n"
                    "My (mine.jp/v1) and reports their state in its status.",
        epilog="Examples:\n"
               "  my-controller --kubeconfig ~/.kube/config --namespace default\n"
               "  my-controller --leader-elect --leader-election-namespace my-controller-system\n"
               "Endpoints: /metrics on the metrics address; /healthz and /readyz on\n"
               "the health-probe address.",
    )
    groups = add_manager_flags(parser, NAME, version=__version__)
    groups["reconciling"].add_argument("--workers", type=positive_int, default=4, metavar="N",
                                       help="concurrent reconciles")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup_logging(args.log_level, args.log_format)
        config = load_config(args.kubeconfig, context=args.context)
        options = manager_options(args)
        if options.get("shards"):
            options["shard_label"] = SLOT_LABEL
        mgr = Manager(config, NAME, **options)
    except ConfigError as err:
        return flag_error(NAME, with_flag_names(err))
    # The caches the reconciler reads, made before it is registered, each keeping
    # only what the reconcile reads (PROJECTIONS); the controller's own watches (MY,
    # and the owned kinds under the same selector) share them.
    stores = {MY: mgr.store_for(MY, transform=PROJECTIONS[MY]),
              DEPLOYMENTS: mgr.store_for(DEPLOYMENTS, MANAGED_SELECTOR,
                                         transform=PROJECTIONS[DEPLOYMENTS]),
              SERVICES: mgr.store_for(SERVICES, MANAGED_SELECTOR,
                                      transform=PROJECTIONS[SERVICES])}
    reconciler = MyReconciler(mgr.client, stores, watch_for_deletion=mgr.watch_for_deletion,
                              cancel_deletion_watches=mgr.cancel_deletion_watches,
                              watching_deletion=mgr.watching_deletion,
                              recorder=mgr.event_recorder(NAME),
                              slot_label=SLOT_LABEL if args.shards == "auto" else None)
    mgr.add_controller(MY, reconciler, owns=[DEPLOYMENTS, SERVICES],
                       owns_label_selector=MANAGED_SELECTOR, workers=args.workers,
                       transforms=PROJECTIONS, urgent=awaits_reconcile,
                       urgent_reads=AWAITS_RECONCILE_READS,
                       # A Deployment's update that changes nothing its My reads
                       # (its controller's Progressing=True) queues no reconcile.
                       owned_update_filters={DEPLOYMENTS: deployment_update_matters})
    # A port in use or an address this host does not have is a flag problem,
    # reported as one.
    return run_manager(mgr, NAME)

if __name__ == "__main__":
    sys.exit(main())
