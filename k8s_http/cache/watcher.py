"""List-watch: a pure state machine, and the thin loop that does its I/O.

The shape is kube-rs's `watcher`: the whole transition table is one pure
function, `step(state, input) -> (actions, state)`, with no sockets, clocks or
threads, so every rule below is tested as a table. `Watcher` is the loop: it
carries out the actions (list, watch, deliver, sleep), turns what happens on the
wire into inputs, and feeds them back.

The rules are client-go's reflector, with kube-rs's "a disconnect re-watches":

* A list is a streaming list where the apiserver offers it (client-go's
  WatchList; on by default since Kubernetes 1.34): one watch request with
  sendInitialEvents=true, resourceVersionMatch=NotOlderThan and bookmarks. Its
  initial ADDED events are collected into a fresh set, one object at a time
  (never a whole parsed list or page); the BOOKMARK annotated
  `k8s.io/initial-events-end: "true"` ends them: the store is replaced by that
  set at once, the watcher is synced, and the same stream goes on as the watch
  from the bookmark's RV. Where the apiserver does not offer it, the list is
  the paged list below, and stays so for this Watcher (see "Falling back").
* The first list is a consistent read (RV=""); the watch then starts from the
  list's resourceVersion, with bookmarks and a random timeoutSeconds in [300, 600].
* A watch the server ends cleanly re-watches at once from the last RV. A dropped,
  stalled or garbled one re-watches from the last RV too, at once the first time
  and after a backoff when failures repeat. Neither relists.
* 410 Gone relists from the last RV (not older than it, served from the watch
  cache); a 410 on that list relists with RV="". A 504 "too large resource
  version" relists with RV="". After a relist the store is replaced, and objects
  that vanished are delivered as DELETED.
* Any other error (403, 5xx, ...) backs off and tries again, for ever.
* An open watch that goes silent for the stall timeout is reopened like a drop,
  and counted: `Watching.stalls` is the number of stall periods in a row with no
  progress (event, bookmark or successful list). Other failures neither add to
  it nor clear it; liveness fails at STALLS_UNHEALTHY (see informer.py).
* BOOKMARK moves the RV and is never delivered.
* The RV advances only once an event has been delivered; malformed input never
  advances it.

Streaming list, the rules that differ (state `Streaming`):

* Falling back: the apiserver refuses the request (400, 422, or a status whose
  message names sendInitialEvents: an apiserver of 1.27-1.33 with the WatchList
  gate off answers 422 "sendInitialEvents is forbidden for watch unless the
  WatchList feature gate is enabled"), or shows that it ignored the parameters
  (an older apiserver does not know them: its watch sends no end bookmark, so
  the first plain BOOKMARK, a MODIFIED or DELETED event, the stream ending
  before the end bookmark, or -- where it sends no bookmarks either -- the
  stream stalling twice in a row gives it away). The collected set is dropped and a
  paged list made at once, from the same RV; every later relist of this Watcher
  is paged (`Watching.stream` False), so a refusing apiserver costs one refused
  request per Watcher, not one per relist.
* 410 or "too large resource version" streams again from RV "" (no backoff when
  the RV was not ""). Any other failure (drop, stall, 5xx, 403 ...) streams
  again from the same RV: at once the first time, with backoff when it repeats,
  always with backoff for an error status. The stream restarts from scratch, so
  initial events are no progress toward a list: they clear neither failures (a
  stream cut at the same place every time must not loop hot) nor stalls (a
  stream that stalls after its first objects every time fails liveness, as a
  silent watch does); the end bookmark clears both.
* /readyz: the watcher is synced only at the end bookmark.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from ..core.backoff import Backoff
from ..wire.defaults import WATCH_STALL_TIMEOUT_SECONDS
from ..core.errors import (ApiConnectionError, ApiError, ApiTimeoutError, GoneError, K8sHttpError,
                     ProtocolError, from_status, is_too_large_resource_version)
from ..ops.metrics import WATCH_EVENT_TYPES, Metrics
from ..core.objects import Resource
from .store import Store, StoreList
from ..wire.watchproto import WatchEvent

if TYPE_CHECKING:
    from ..wire.client import ApiClient

__all__ = [
    # states
    "Listing", "Streaming", "Watching", "State", "INITIAL", "INITIAL_STREAMING",
    # inputs
    "Listed", "Event", "Closed", "Failed", "Input", "failure",
    # actions
    "List", "Watch", "StreamList", "Replace", "Collect", "ReplaceCollected", "FallBack",
    "Deliver", "Progress", "Restart", "ListError", "Skip", "Sleep", "Action",
    # the machine
    "step", "resume", "Watcher",
    "MIN_WATCH_TIMEOUT_SECONDS", "MAX_WATCH_TIMEOUT_SECONDS", "STALL_TIMEOUT_SECONDS",
    "STALLS_UNHEALTHY", "STREAM_STALLS_FALLBACK", "INITIAL_EVENTS_END",
]

log = logging.getLogger(__name__)

# client-go's reflector: a random watch timeout in [5, 10) minutes spreads the
# reconnects of many clients so they do not hit the apiserver together.
MIN_WATCH_TIMEOUT_SECONDS = 300
MAX_WATCH_TIMEOUT_SECONDS = 600
# The apiserver sends a bookmark about every 60 s on a quiet watch; 90 s of no
# complete event means the connection is dead even if the socket says otherwise.
STALL_TIMEOUT_SECONDS = WATCH_STALL_TIMEOUT_SECONDS
# /healthz fails once a watch has gone this many stall periods in a row
# without progress while its connections succeed (docs/SPEC.md §4).
STALLS_UNHEALTHY = 3
# A streaming list that stalls this many times in a row falls back to paged
# lists (fewer than STALLS_UNHEALTHY: an apiserver that ignores streaming and
# sends no bookmarks must not cost the process its liveness).
STREAM_STALLS_FALLBACK = 2

DELIVERED_TYPES = ("ADDED", "MODIFIED", "DELETED")
# The annotation on the BOOKMARK that ends a streaming list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


# ---- states -------------------------------------------------------------------
# A state says what the loop does next: list, or watch from `resource_version`.

@dataclass(frozen=True)
class Listing:
    """A list is due. RV "" is a consistent read (quorum); any other RV means
    "not older than RV" (an unpaged list, which the apiserver serves from its
    watch cache)."""
    resource_version: str = ""


@dataclass(frozen=True)
class Streaming:
    """A streaming list from `resource_version` ("" = the current state, a
    consistent read; else not older than it) is due or under way: initial
    events are being collected. `failures`, `progressed` and `stalls` as in
    `Watching`, except that initial events clear neither `failures` nor
    `stalls`: only a completed list (the end bookmark) is progress."""
    resource_version: str = ""
    failures: int = 0
    progressed: bool = False
    stalls: int = 0


@dataclass(frozen=True)
class Watching:
    """A watch from `resource_version`, the RV of the last fully processed event.

    `failures`: watch attempts in a row that ended without progress (no event,
    no bookmark); 0 after any progress. It decides when a re-watch backs off.
    `progressed`: the current watch has delivered an event or a bookmark.
    `stalls`: watches in a row that opened and then went silent for the stall
    timeout, with no progress since; only an event, a bookmark or a list
    (which leaves this state) clears it, so a refused connection, a 5xx or a
    clean close between two stalls neither counts nor hides them.
    `stream`: a relist is a streaming list (else a paged one); False for good
    once the apiserver has shown it does not stream lists.
    """
    resource_version: str
    failures: int = 0
    progressed: bool = False
    stalls: int = 0
    stream: bool = False


State = Union[Listing, Streaming, Watching]
INITIAL: State = Listing("")
INITIAL_STREAMING: State = Streaming("")


# ---- inputs -------------------------------------------------------------------

@dataclass(frozen=True)
class Listed:
    """A (paged, merged) list came back."""
    items: list = field(repr=False)
    resource_version: str


# One decoded watch event: the decoder's own named tuple (type, object), `type`
# whatever the wire said. The machine takes it as the stream yields it, so an
# event costs no second object on its way in (a streaming list is nearly all events).
Event = WatchEvent


@dataclass(frozen=True)
class Closed:
    """The server ended the watch cleanly (its timeoutSeconds)."""


@dataclass(frozen=True)
class Failed:
    """A list or watch failed. `reason` is one of metrics.WATCH_RESTART_REASONS
    except "timeout": gone, too_large_rv, disconnect, stall, protocol, error."""
    reason: str
    error: BaseException | None = None


Input = Union[Listed, Event, Closed, Failed]


def failure(error: BaseException) -> Failed:
    """The one place an exception from a list or watch becomes a Failed input."""
    if isinstance(error, GoneError):
        reason = "gone"
    elif is_too_large_resource_version(error):
        reason = "too_large_rv"
    elif isinstance(error, ApiTimeoutError):
        reason = "stall"              # no complete event (or no answer) in time
    elif isinstance(error, ProtocolError):
        reason = "protocol"           # malformed framing or lines
    elif isinstance(error, (ApiConnectionError, OSError)):
        reason = "disconnect"
    else:
        reason = "error"              # 403, 5xx, other statuses, and the unexpected
    return Failed(reason, error)


# ---- actions --------------------------------------------------------------------
# Side effects first, then at most one Sleep, then at most one I/O action (List or
# Watch), always last. An action list without I/O means: keep reading the open watch.

@dataclass(frozen=True)
class List:
    resource_version: str


@dataclass(frozen=True)
class Watch:
    resource_version: str


@dataclass(frozen=True)
class StreamList:
    """Open a streaming list (a watch that first sends the state) from this RV."""
    resource_version: str


@dataclass(frozen=True)
class Replace:
    """Replace the cache with a fresh list (what vanished is deleted); synced."""
    items: list = field(repr=False)


@dataclass(slots=True)
class Collect:
    """Add one initial object of a streaming list to the fresh set being built;
    it is progress too (as `Progress`, which it saves an action per event).
    Not frozen, unlike the other actions: one is made per initial event, and a
    frozen dataclass's __init__ (object.__setattr__) costs twice as much."""
    object: dict = field(repr=False)


@dataclass(frozen=True)
class ReplaceCollected:
    """Replace the cache with the fresh set the Collects built (then empty it); synced."""


@dataclass(frozen=True)
class _Reasoned:
    """An action about something that went wrong: why, and the error if there was one."""
    reason: str
    error: BaseException | None = None


@dataclass(frozen=True)
class FallBack(_Reasoned):
    """The apiserver does not stream lists: drop the fresh set, log it; a paged list follows."""


@dataclass(frozen=True)
class Deliver:
    type: str
    object: dict = field(repr=False)


@dataclass(frozen=True)
class Progress:
    """The watch is alive (event, bookmark, list or clean reconnect): for liveness."""


@dataclass(frozen=True)
class Restart(_Reasoned):
    """A watch ended and is reopened (or replaced by a list): count and log it."""


@dataclass(frozen=True)
class ListError(_Reasoned):
    """A list failed: log it; what follows (a Sleep, a List) says how it is retried."""


@dataclass(frozen=True)
class Skip:
    """Malformed input ignored (counted); the state does not move."""
    kind: str


@dataclass(frozen=True)
class Sleep:
    """Wait for the next backoff delay (interruptible by stop)."""


_PROGRESS = Progress()                  # no fields: one instance serves every transition

Action = Union[List, Watch, StreamList, Replace, Collect, ReplaceCollected, FallBack, Deliver,
               Progress, Restart, ListError, Skip, Sleep]


# ---- the machine ------------------------------------------------------------------

def resume(state: State) -> list[Action]:
    """The I/O that (re)starts a loop in `state`: a restarted thread resumes, it does not relist."""
    if isinstance(state, Listing):
        return [List(state.resource_version)]
    if isinstance(state, Streaming):
        return [StreamList(state.resource_version)]
    return [Watch(state.resource_version)]


def step(state: State, inp: Input) -> tuple[list[Action], State]:
    """The whole transition table. Pure: same state and input, same answer."""
    steppers = _STEPPERS.get(type(state))
    if steppers is None:
        raise TypeError(f"not a watcher state: {state!r}")
    stepper, event_stepper = steppers
    if event_stepper is not None and isinstance(inp, Event):
        screened = _screen(inp)
        if screened is None:
            return event_stepper(state, inp)
        if isinstance(screened, Skip):
            return [screened], state
        inp = screened                          # a Failed
    return stepper(state, inp)


def _step_listing(state: Listing, inp: Input) -> tuple[list[Action], State]:
    rv = state.resource_version
    if isinstance(inp, Listed):
        if not _is_rv(inp.resource_version):
            # A list without a resourceVersion cannot be watched from: malformed.
            err = ProtocolError("list response has no metadata.resourceVersion")
            return [ListError("protocol", err), Sleep(), List(rv)], state
        return ([Replace(inp.items), _PROGRESS, Watch(inp.resource_version)],
                Watching(inp.resource_version))
    if isinstance(inp, Failed):
        if inp.reason in ("gone", "too_large_rv") and rv != "":
            # Our RV is unusable (compacted, or ahead of this apiserver): a consistent
            # list needs no RV at all. A definite fix, so no backoff.
            return [ListError(inp.reason, inp.error), List("")], Listing("")
        return [ListError(inp.reason, inp.error), Sleep(), List(rv)], state
    raise TypeError(f"{type(inp).__name__} while listing")


def _step_watching(state: Watching, inp: Input) -> tuple[list[Action], State]:
    """What ends or breaks a watch (an event goes to _step_event, see step)."""
    rv = state.resource_version
    if isinstance(inp, Closed):
        # The healthy end of every watch. One that ended without a single event
        # counts as a failure, so a server that closes every watch at once cannot
        # make us spin.
        failures = 0 if state.progressed else state.failures + 1
        actions: list[Action] = [Restart("timeout"), _PROGRESS]
        if failures >= 2:
            actions.append(Sleep())
        return actions + [Watch(rv)], Watching(rv, failures, stalls=state.stalls,
                                                stream=state.stream)
    if isinstance(inp, Failed):
        if inp.reason in ("gone", "too_large_rv"):
            # gone: our RV was compacted away: relist not older than it (410 again
            # -> RV=""). too_large_rv: our RV is ahead of this apiserver: RV="".
            io, relisting = _relist(rv if inp.reason == "gone" else "", state.stream)
            return [Restart(inp.reason, inp.error)] + io, relisting
        failures = 0 if state.progressed else state.failures
        failures += 1
        stalls = state.stalls + (inp.reason == "stall")
        actions = [Restart(inp.reason, inp.error)]
        # A drop after progress re-watches at once; repeated failures back off. The
        # server answering with an error status always backs off: asking again at
        # once would get the same answer.
        if failures >= 2 or inp.reason == "error":
            actions.append(Sleep())
        return actions + [Watch(rv)], Watching(rv, failures, stalls=stalls, stream=state.stream)
    raise TypeError(f"{type(inp).__name__} while watching")


def _relist(rv: str, stream: bool) -> tuple[list[Action], State]:
    """The I/O and the state of a relist from `rv`, streaming or paged."""
    if stream:
        return [StreamList(rv)], Streaming(rv)
    return [List(rv)], Listing(rv)


def _screen(inp: Event) -> Failed | Skip | None:
    """What every event goes through first: an ERROR becomes a failure, malformed
    input a Skip; what passes has a dict object with metadata and a valid RV."""
    obj = inp.object
    if inp.type == "ERROR":
        # WatchStream raises ERROR events itself; this covers a decoder that passes them on.
        code = obj.get("code") if isinstance(obj, dict) else None
        return failure(from_status(code if isinstance(code, int) else 500, obj))
    if inp.type not in DELIVERED_TYPES and inp.type != "BOOKMARK":
        return Skip("unknown_type")
    if not isinstance(obj, dict):
        return Skip("not_object")
    meta = obj.get("metadata")
    new_rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if not isinstance(new_rv, str) or new_rv == "":      # _is_rv, inlined: every event
        return Skip("no_resource_version")
    return None


def _step_event(state: Watching, inp: Event) -> tuple[list[Action], State]:
    obj = inp.object                     # screened: a dict with metadata and an RV
    meta = obj["metadata"]
    new_rv = meta["resourceVersion"]
    if inp.type == "BOOKMARK":
        return [_PROGRESS], Watching(new_rv, 0, True, stream=state.stream)
    if not meta.get("name"):
        return [Skip("no_name")], state
    return [Deliver(inp.type, obj), _PROGRESS], Watching(new_rv, 0, True, stream=state.stream)


def _step_streaming(state: Streaming, inp: Input) -> tuple[list[Action], State]:
    """What ends or breaks a streaming list (an event goes to _step_initial_event,
    see step)."""
    rv = state.resource_version
    if isinstance(inp, Closed):
        # A streaming-capable apiserver ends the initial events with the bookmark
        # before anything else; a stream that ends first is one that ignored the
        # parameters (client-go treats it as a failed watch-list and lists).
        return _fall_back(state, "the stream ended before the initial-events-end bookmark")
    if isinstance(inp, Failed):
        if _refuses_streaming(inp.error):
            return _fall_back(state, "the apiserver refused it", inp.error)
        if inp.reason in ("gone", "too_large_rv") and rv != "":
            # The RV to be not older than is unusable: stream the current state.
            return [Restart(inp.reason, inp.error), StreamList("")], Streaming("")
        # The stream starts over from scratch: count the failure even if initial
        # events came, so a stream cut at the same place every time backs off.
        failures = state.failures + 1
        stalls = state.stalls + (inp.reason == "stall")
        actions: list[Action] = [Restart(inp.reason, inp.error)]
        if stalls >= STREAM_STALLS_FALLBACK:
            # A streaming apiserver sends the end bookmark right after the state;
            # silence instead, twice, is an apiserver that ignored the parameters
            # and sends no bookmarks (some aggregated APIs): streaming again would
            # stall for ever and fail liveness. A paged list works everywhere.
            fallback, listing = _fall_back(state, "the initial events stalled twice", inp.error)
            return actions + fallback, listing
        if failures >= 2 or inp.reason not in ("disconnect", "stall", "protocol"):
            actions.append(Sleep())
        return actions + [StreamList(rv)], Streaming(rv, failures, stalls=stalls)
    raise TypeError(f"{type(inp).__name__} while streaming a list")


def _step_initial_event(state: Streaming, inp: Event) -> tuple[list[Action], State]:
    meta = inp.object["metadata"]        # screened: a dict with metadata and an RV
    new_rv = meta["resourceVersion"]
    if inp.type == "BOOKMARK":
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END) == "true":
            # The set is complete and consistent at new_rv: swap it in, and the
            # same stream goes on as the watch from there.
            return ([ReplaceCollected(), _PROGRESS],
                    Watching(new_rv, 0, True, stream=True))
        # A streaming apiserver sends no other bookmark before this one.
        return _fall_back(state, "a bookmark came before the initial-events-end bookmark")
    if inp.type != "ADDED":
        # Initial events are all ADDED: this is a plain watch from our RV.
        return _fall_back(state, f"a {inp.type} event came among the initial events")
    if not meta.get("name"):
        return [Skip("no_name")], state
    # After the first event the state no longer changes: no new one per event.
    return ([Collect(inp.object)],
            state if state.progressed else
            Streaming(state.resource_version, state.failures, True, stalls=state.stalls))


# The states are final classes (frozen dataclasses nobody subclasses): one
# lookup per input instead of an isinstance chain.
# Per state: its stepper, and the one a screened event goes straight to (None:
# an event is no input of that state, and its stepper says so).
_Stepper = Callable[..., tuple[list[Action], State]]
_STEPPERS: dict[type, tuple[_Stepper, _Stepper | None]] = {
    Listing: (_step_listing, None),
    Watching: (_step_watching, _step_event),
    Streaming: (_step_streaming, _step_initial_event)}


def _fall_back(state: Streaming, reason: str,
               error: BaseException | None = None) -> tuple[list[Action], State]:
    # From now on this watcher lists page by page (Listing -> Watching(stream=False)).
    rv = state.resource_version
    return [FallBack(reason, error), List(rv)], Listing(rv)


def _refuses_streaming(error: BaseException | None) -> bool:
    """The apiserver said no to the streaming parameters (not to the watch itself).

    400 and 422 are answers to the request's parameters. A 403 is RBAC unless its
    message is about the parameters: falling back for an ordinary 403 would give
    up streaming for good over an RBAC rule that may be fixed a minute later.
    """
    if not isinstance(error, ApiError):
        return False
    if error.code in (400, 422):
        return True
    return error.code == 403 and "sendInitialEvents" in error.message


def _is_rv(value: object) -> bool:
    # An RV is an opaque non-empty string; never compared as a number.
    return isinstance(value, str) and value != ""


# ---- the loop ----------------------------------------------------------------------

class Watcher:
    """Runs the state machine against the apiserver for one resource (and namespace).

    `on_sync(items)` is called after every (re)list with the whole fresh set: it
    replaces the cache, and what vanished from it is its business (nothing comes
    back to the watcher); `on_event(type, obj)` gets ADDED / MODIFIED / DELETED.
    `store`: the Store the lists are for. A list's items go into a StoreList of
    it one by one as they arrive (Store.new_list), so a long list is never held
    as dicts, and a store that drops managedFields gets watch events decoded
    without them. Without one, the fresh set is a plain list of dicts.
    Both run on the watcher's thread; an exception in either is logged with its
    traceback, counted in `handler_errors`, and the loop goes on.

    `streaming_list`: list by streaming (see the module docstring) until the
    apiserver shows it does not offer it; False: paged lists only.
    `on_synced()` is called after each (re)list once `has_synced` is True.
    """

    def __init__(self, client: ApiClient, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 on_sync: Callable[[list], list], on_event: Callable[[str, dict], None],
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random,
                 stall_timeout_seconds: float = STALL_TIMEOUT_SECONDS, page_size: int = 500,
                 backoff: Backoff | None = None,
                 store: Store | None = None,
                 streaming_list: bool = True,
                 on_synced: Callable[[], None] | None = None):
        self._client = client
        # Watches ask for objects without managedFields when the store drops them.
        self._skip_managed_fields = store is not None and store.drops_managed_fields
        self._on_synced = on_synced
        # A fresh set for a list: filled page by page or event by event.
        self._new_list: Callable[[], StoreList | list] = \
            store.new_list if store is not None else list
        self._resource = resource
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._on_sync = on_sync
        self._on_event = on_event
        self._metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._rng = rng
        self._stall_timeout_seconds = stall_timeout_seconds
        self._page_size = page_size
        self._backoff = backoff if backoff is not None else Backoff(clock=clock, rng=rng)
        # Its series are pre-set once per resource by the Informer, which owns the
        # label for all of its watchers (one per namespace).
        self._label = str(resource)

        self._state: State = INITIAL_STREAMING if streaming_list else INITIAL
        # The initial objects of the streaming list in progress (in the store's
        # form as they arrive); meaningful only while the state is Streaming,
        # emptied when it is swapped into the cache or abandoned.
        self._collected = self._new_list()
        # This watcher's counts of watch_events_total by event type; only this
        # watcher's loop adds to it (see metrics.TalliedCounter).
        self._event_counts = self._metrics.watch_events_total.tally(
            self._label, keys=WATCH_EVENT_TYPES)
        self.has_synced = False
        # Liveness: last_progress moves on an event, a bookmark, a list or a clean
        # reconnect; last_retry on a failure the loop is about to retry.
        self.last_progress = clock()          # a fresh watcher gets a full deadline
        self.last_retry = float("-inf")       # clock() of the last failure being retried
        self.watch_timeout_seconds = MAX_WATCH_TIMEOUT_SECONDS   # of the current watch
        self.handler_errors = 0

        # The open stream, shared with stop() on another thread.
        self._stream_lock = threading.Lock()
        self._stream = None                   # guarded by _stream_lock
        self._events = None                   # iterator over _stream; loop thread only
        self._stop_event: threading.Event | None = None
        self._stopping = False                # guarded by _stream_lock

    @property
    def resource_version(self) -> str:
        """The RV of the last fully processed event (or list); "" before the first list."""
        return self._state.resource_version

    @property
    def state(self) -> State:
        return self._state

    @property
    def stalls(self) -> int:
        """Stall periods in a row without progress (0 while listing: a list clears it)."""
        state = self._state
        return state.stalls if isinstance(state, (Watching, Streaming)) else 0

    def __repr__(self) -> str:
        where = self._namespace or "all namespaces"
        return f"<Watcher {self._label} in {where} {self._state!r}>"

    # ---- running ----

    def run(self, stop: threading.Event) -> None:
        """List, then watch, until `stop` is set. Resumes from the current state."""
        with self._stream_lock:
            self._stop_event = stop
            self._stopping = False
        try:
            actions = resume(self._state)
            next_state = self._state
            while True:
                inp = self._perform(actions, next_state, stop)
                # Drop the transition (and the error a Restart carries) before
                # blocking on the wire: an exception keeps its traceback's frames
                # and their buffers alive, here for the whole next watch.
                actions = None
                if stop.is_set():
                    return
                if inp is None:
                    inp = self._read()
                    if stop.is_set():
                        return
                actions, next_state = step(self._state, inp)
        finally:
            self._close_stream()

    def stop(self) -> None:
        """Make run() return soon; safe from any thread. Closes the open stream.

        A list in flight is not interrupted: it ends within the transport's
        request deadline, and run() returns right after it.
        """
        with self._stream_lock:
            self._stopping = True
            if self._stop_event is not None:
                self._stop_event.set()
            stream = self._stream
        if stream is not None:
            _close_quietly(stream)

    def _perform(self, actions: list[Action], next_state: State,
                 stop: threading.Event) -> Input | None:
        """Carry out one transition's actions, adopting `next_state` once its effects are done.

        Returns the input an I/O action produced. The state moves only after the
        deliveries: the RV an event carries becomes ours once the event has been
        handled, so a crash in between replays the event rather than losing it.
        Effects come first in every action list, then Sleep, then the I/O.
        """
        for action in actions:
            # The state moves before any wait or I/O (Sleep, List, Watch, StreamList),
            # and a list starts afresh: a partial set is dropped before it.
            # The cases of every event come first: they are nearly all of them.
            match action:
                case Collect(object=obj):
                    self._collected.append(obj)
                    self.last_progress = self._clock()
                case Progress():
                    self.last_progress = self._clock()
                case Deliver(type=type_, object=obj):
                    self._deliver(type_, obj)
                case Replace(items=items):
                    self._replace(items)
                case ReplaceCollected():
                    items, self._collected = self._collected, self._new_list()
                    self._replace(items)
                case FallBack(reason=reason, error=error):
                    self._collected = self._new_list()
                    self._fell_back(reason, error)
                case Restart(reason=reason, error=error):
                    if reason != "timeout":
                        self.last_retry = self._clock()
                    self._restarted(reason, error)
                case ListError(reason=reason, error=error):
                    self.last_retry = self._clock()
                    self._list_failed(reason, error)
                case Skip(kind=kind):
                    self._metrics.watch_decode_errors_total.labels(self._label, kind).inc()
                case Sleep():
                    self._state, self._collected = next_state, self._new_list()
                    delay = self._backoff.next_delay()
                    log.debug("%s: backing off %.1f s", self, delay)
                    stop.wait(delay)
                case List(resource_version=rv):
                    self._state, self._collected = next_state, self._new_list()
                    return None if stop.is_set() else self._list(rv)
                case Watch(resource_version=rv):
                    self._state = next_state
                    return None if stop.is_set() else self._open_watch(rv)
                case StreamList(resource_version=rv):
                    self._state, self._collected = next_state, self._new_list()
                    if stop.is_set():
                        return None
                    self._metrics.informer_relists_total.labels(self._label).inc()
                    return self._open_watch(rv, send_initial_events=True)
        self._state = next_state
        return None

    # ---- I/O ----

    def _list(self, rv: str) -> Input:
        self._close_stream()
        self._metrics.informer_relists_total.labels(self._label).inc()
        # RV "": a paged consistent read from etcd. Any other RV: one unpaged request,
        # as client-go's reflector does. Without `limit` a non-zero RV means "not older
        # than" (with `limit` it would mean "exactly", and 410 far more often), and the
        # apiserver serves it from its watch cache instead of etcd: a herd of clients
        # relisting after an apiserver restart does not land on etcd.
        try:
            result = self._client.list(
                self._resource, namespace=self._namespace, label_selector=self._label_selector,
                field_selector=self._field_selector,
                limit=self._page_size if not rv else None, resource_version=rv or None,
                into=self._new_list)
        except Exception as err:  # every failure is an input; the table decides
            return failure(err)
        meta = result.get("metadata") if isinstance(result, dict) else None
        items = result.get("items") if isinstance(result, dict) else None
        if not isinstance(items, (list, StoreList)) or not isinstance(meta, dict):
            return Failed("protocol", ProtocolError("list response is not a list"))
        return Listed(items, meta.get("resourceVersion"))

    def _open_watch(self, rv: str, *, send_initial_events: bool = False) -> Input | None:
        """Open a watch from `rv` (with `send_initial_events`: a streaming list, RV
        "" meaning the current state); None once it is open, else the failure."""
        self._close_stream()
        span = MAX_WATCH_TIMEOUT_SECONDS - MIN_WATCH_TIMEOUT_SECONDS
        self.watch_timeout_seconds = MIN_WATCH_TIMEOUT_SECONDS + int(self._rng() * span)
        try:
            stream = self._client.watch(
                self._resource, namespace=self._namespace, label_selector=self._label_selector,
                field_selector=self._field_selector, resource_version=rv or None,
                allow_bookmarks=True, timeout_seconds=self.watch_timeout_seconds,
                stall_timeout_seconds=self._stall_timeout_seconds,
                **({"send_initial_events": True} if send_initial_events else {}),
                **({"skip_managed_fields": True} if self._skip_managed_fields else {}))
        except Exception as err:
            inp = failure(err)
            if inp.reason == "stall":
                # No connection or no response headers in time: an apiserver we
                # cannot reach, which a restart does not cure. "stall" is kept for
                # an open watch that goes silent (the only kind that counts toward
                # liveness).
                inp = Failed("disconnect", err)
            return inp
        with self._stream_lock:
            self._stream = stream
            stopping = self._stopping
        if stopping:                       # stop() ran while we were connecting
            self._close_stream()
            return None
        try:
            self._events = iter(stream)
        except Exception as err:
            self._close_stream()
            return failure(err)
        return None

    def _read(self) -> Input:
        """The next input from the open watch."""
        if self._events is None:
            return Failed("disconnect", ApiConnectionError("no open watch"))
        try:
            event = next(self._events)
        except StopIteration:
            self._close_stream()
            return Closed()
        except Exception as err:
            if isinstance(err, ApiError):      # an ERROR event, raised by the stream
                self._event_counts["ERROR"] += 1
            self._close_stream()
            return failure(err)
        if type(event) is not Event:     # not from our decoder: a test's or a wrapper's stream
            event = Event(str(getattr(event, "type", None)), getattr(event, "object", None))
        counts = self._event_counts
        type_ = event.type
        if type_ in counts:
            counts[type_] += 1
        else:                            # an unknown type: counted under its name, as before
            counts[type_] = 1
        return event

    def _close_stream(self) -> None:
        with self._stream_lock:
            stream, self._stream = self._stream, None
        self._events = None
        if stream is not None:
            skipped = getattr(stream, "skipped", 0)
            if isinstance(skipped, int) and skipped > 0:
                self._metrics.watch_decode_errors_total.labels(self._label, "skipped").inc(skipped)
            _close_quietly(stream)

    # ---- effects ----

    def _deliver(self, type_: str, obj: dict) -> None:
        try:
            self._on_event(type_, obj)
        except Exception:
            self.handler_errors += 1
            log.exception("%s: event handler failed on %s %s; going on", self, type_,
                          _name_of(obj))

    def _replace(self, items: list) -> None:
        try:
            self._on_sync(items)
        except Exception:
            self.handler_errors += 1
            log.exception("%s: sync handler failed on a list of %d; going on", self, len(items))
        self.has_synced = True
        log.debug("%s: listed %d objects", self, len(items))
        if self._on_synced is not None:
            try:
                self._on_synced()
            except Exception:
                self.handler_errors += 1
                log.exception("%s: synced handler failed; going on", self)

    def _fell_back(self, reason: str, error: BaseException | None) -> None:
        self.last_retry = self._clock()
        log.warning("%s: the apiserver does not offer streaming lists (%s%s); listing page "
                    "by page from now on", self, reason, f": {error}" if error else "")

    def _restarted(self, reason: str, error: BaseException | None) -> None:
        self._metrics.watch_restarts_total.labels(self._label, reason).inc()
        if reason == "protocol" and error is not None:
            kind = getattr(error, "kind", None) or "framing"
            self._metrics.watch_decode_errors_total.labels(self._label, kind).inc()
        if reason == "timeout":
            log.debug("%s: watch ended at its timeout; re-watching", self)
        elif error is not None and not isinstance(error, K8sHttpError):
            log.warning("%s: watch failed unexpectedly (%s); re-watching", self, reason,
                        exc_info=error)
        elif reason in ("gone", "too_large_rv"):
            log.info("%s: watch expired (%s: %s); relisting", self, reason, error)
        elif reason == "disconnect":
            log.info("%s: watch dropped (%s); re-watching", self, error)
        else:
            log.warning("%s: watch restarting (%s: %s)", self, reason, error)

    def _list_failed(self, reason: str, error: BaseException | None) -> None:
        if error is not None and not isinstance(error, K8sHttpError):
            log.warning("%s: list failed unexpectedly", self, exc_info=error)
        else:
            log.warning("%s: list failed (%s: %s)", self, reason, error)


def _close_quietly(stream) -> None:
    try:
        stream.close()
    except Exception:
        log.debug("closing a watch stream failed", exc_info=True)


def _name_of(obj: object) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "?"
    ns, name = meta.get("namespace"), meta.get("name")
    return f"{ns}/{name}" if ns else str(name)
