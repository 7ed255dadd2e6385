"""The list-watch rules: a pure state machine, `step(state, input) -> (actions, state)`.

The shape is kube-rs's `watcher`: the whole transition table is one pure
function, so every rule below is tested as a table (tests/unit/test_watcher_step.py).
The loop that carries out the actions against the apiserver is `watcher.Watcher`.

Invariants:

* Pure: no sockets, clocks, threads, randomness or logging; nothing this module
  imports does I/O (tests/unit/test_layers.py checks it). The same state and
  input always give the same actions and state.
* States, inputs and actions are plain values (frozen dataclasses, but for
  `Collect`); a state is never changed, only replaced.
* An action list holds side effects first, then at most one Sleep, then at most
  one I/O action (List, Watch or StreamList), always last. A list without I/O
  means: keep reading the open watch.
* The RV in a state is the RV of the last event delivered (or list replaced);
  it moves with the Deliver that carries the event, and malformed input (Skip)
  never moves it.
* `failure(error)` is the one place an exception from a list or watch becomes
  an input.

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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

from ..core.errors import (ApiConnectionError, ApiError, ApiTimeoutError, GoneError,
                           ProtocolError, from_status, is_too_large_resource_version)
from ..wire.watchproto import WatchEvent

__all__ = [
    # states
    "Listing", "Streaming", "Watching", "State", "INITIAL", "INITIAL_STREAMING",
    # inputs
    "Listed", "Event", "Closed", "Failed", "Input", "failure",
    # actions
    "List", "Watch", "StreamList", "Replace", "Collect", "ReplaceCollected", "FallBack",
    "Deliver", "Progress", "Restart", "ListError", "Skip", "Sleep", "Action",
    # the machine
    "step", "resume", "is_watching",
    "STALLS_UNHEALTHY", "STREAM_STALLS_FALLBACK", "INITIAL_EVENTS_END",
]

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


def is_watching(state: State) -> bool:
    """No attempt has failed since the watch last brought something: it is open
    (or reopened at once after a clean close), and the cache lags the server by
    the watch's delay alone. False while listing, and from any drop or error
    (reopened at once or after a backoff) until the reopened watch brings an
    event or a bookmark: a reader that needs the server's view asks it then."""
    return isinstance(state, Watching) and (state.failures == 0 or state.progressed)


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
