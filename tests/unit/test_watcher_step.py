"""The list-watch transition table, row by row: (state, input) -> (actions, state).

No sockets, no threads, no clocks: `step` is pure. The streaming-list rows
(state `Streaming`, and `Watching(stream=True)`) come after the paged ones: a
streaming list is one watch request whose initial ADDED events are the state,
ended by the bookmark annotated k8s.io/initial-events-end; where the apiserver
refuses or ignores it, the watcher falls back to the paged list for good.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http.core.errors import (ApiConnectionError, ApiTimeoutError, ForbiddenError, GoneError,
                                  InvalidError, ProtocolError, ServerError, TooManyRequestsError,
                                  from_status)
from k8s_http.ops.metrics import WATCH_RESTART_REASONS
from k8s_http.cache.watchstep import (INITIAL, INITIAL_STREAMING, Closed, Collect, Deliver, Event,
                                      Failed, FallBack, List, ListError, Listed, Listing, Progress,
                                      Replace, ReplaceCollected, Restart, Skip, Sleep, StreamList,
                                      Streaming, Watch, Watching, failure, is_watching, resume,
                                      step)

GONE = GoneError(410, "too old resource version: 5 (10)", reason="Expired")
TOO_LARGE = from_status(504, {"kind": "Status", "code": 504, "reason": "Timeout",
                              "message": "Too large resource version: 12, current: 10",
                              "details": {"causes": [{"reason": "ResourceVersionTooLarge"}]}})
FORBIDDEN = ForbiddenError(403, 'deployments.apps is forbidden: cannot "watch"')
# What an apiserver of 1.27-1.33 with the WatchList gate off answers.
REFUSED = InvalidError(422, "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: "
                       "Forbidden: sendInitialEvents is forbidden for watch unless the "
                       "WatchList feature gate is enabled", reason="Invalid")
BAD_REQUEST = from_status(400, {"kind": "Status", "code": 400, "reason": "BadRequest",
                                "message": "unknown parameter"})
FORBIDDEN_PARAM = ForbiddenError(403, "sendInitialEvents is forbidden for watch")
SERVER = ServerError(500, "etcd leader changed")
DROP = ApiConnectionError("connection reset mid-chunk")
STALL = ApiTimeoutError("no complete event in 90 s")
GARBLED = ProtocolError("invalid chunk size line")
BUG = RuntimeError("unexpected")

ITEMS = [{"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7"}}]


def obj(name="a", rv="11", ns="ns"):
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}}


A11 = obj(rv="11")
BOOKMARK = {"kind": "Deployment", "metadata": {"resourceVersion": "20"}}

F = failure  # Failed input from an exception, classified the way the loop does it


def bookmark(rv, end=False):
    meta = {"resourceVersion": rv}
    if end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return Event("BOOKMARK", {"kind": "Deployment", "metadata": meta})


A = obj("a", "7")
END = bookmark("20", end=True)

TABLE = [
    # ---- listing ----
    ("first list ok -> replace, watch from its RV",
     Listing(""), Listed(ITEMS, "10"),
     [Replace(ITEMS), Progress(), Watch("10")], Watching("10")),
    ("relist ok -> replace, watch from the new RV",
     Listing("5"), Listed(ITEMS, "12"),
     [Replace(ITEMS), Progress(), Watch("12")], Watching("12")),
    ("list without RV is malformed -> back off, same list",
     Listing(""), Listed(ITEMS, ""),
     [ListError("protocol", ...), Sleep(), List("")], Listing("")),
    ("list with a non-string RV is malformed",
     Listing("5"), Listed(ITEMS, 12),
     [ListError("protocol", ...), Sleep(), List("5")], Listing("5")),
    ("410 on relist from RV -> relist with RV='' at once",
     Listing("5"), F(GONE),
     [ListError("gone", GONE), List("")], Listing("")),
    ("410 on a consistent list -> back off, list again",
     Listing(""), F(GONE),
     [ListError("gone", GONE), Sleep(), List("")], Listing("")),
    ("too-large RV on list -> relist with RV=''",
     Listing("12"), F(TOO_LARGE),
     [ListError("too_large_rv", TOO_LARGE), List("")], Listing("")),
    ("403 on list -> back off, same list",
     Listing(""), F(FORBIDDEN),
     [ListError("error", FORBIDDEN), Sleep(), List("")], Listing("")),
    ("5xx on relist keeps its RV",
     Listing("5"), F(SERVER),
     [ListError("error", SERVER), Sleep(), List("5")], Listing("5")),
    ("connection refused on list -> back off",
     Listing(""), F(DROP),
     [ListError("disconnect", DROP), Sleep(), List("")], Listing("")),
    ("unexpected exception on list -> back off",
     Listing(""), F(BUG),
     [ListError("error", BUG), Sleep(), List("")], Listing("")),

    # ---- watch events ----
    ("ADDED -> deliver, RV advances",
     Watching("10"), Event("ADDED", A11),
     [Deliver("ADDED", A11), Progress()], Watching("11", 0, True)),
    ("MODIFIED -> deliver",
     Watching("10"), Event("MODIFIED", A11),
     [Deliver("MODIFIED", A11), Progress()], Watching("11", 0, True)),
    ("DELETED -> deliver",
     Watching("10"), Event("DELETED", A11),
     [Deliver("DELETED", A11), Progress()], Watching("11", 0, True)),
    ("event resets the failure count",
     Watching("10", 3), Event("ADDED", A11),
     [Deliver("ADDED", A11), Progress()], Watching("11", 0, True)),
    ("BOOKMARK -> RV only, never delivered",
     Watching("10"), Event("BOOKMARK", BOOKMARK),
     [Progress()], Watching("20", 0, True)),
    ("BOOKMARK without RV is skipped",
     Watching("10"), Event("BOOKMARK", {"metadata": {}}),
     [Skip("no_resource_version")], Watching("10")),
    ("event without metadata is skipped, RV kept",
     Watching("10", 1, True), Event("ADDED", {"kind": "Deployment"}),
     [Skip("no_resource_version")], Watching("10", 1, True)),
    ("event with an empty RV is skipped",
     Watching("10"), Event("MODIFIED", obj(rv="")),
     [Skip("no_resource_version")], Watching("10")),
    ("event with a numeric RV is skipped (RVs are opaque strings)",
     Watching("10"), Event("MODIFIED", obj(rv=11)),
     [Skip("no_resource_version")], Watching("10")),
    ("event without a name is skipped",
     Watching("10"), Event("ADDED", obj(name="")),
     [Skip("no_name")], Watching("10")),
    ("object that is not a dict is skipped",
     Watching("10"), Event("ADDED", ["x"]),
     [Skip("not_object")], Watching("10")),
    ("unknown event type is skipped, RV kept",
     Watching("10"), Event("SYNC", A11),
     [Skip("unknown_type")], Watching("10")),
    ("unknown event type without an object is skipped as unknown",
     Watching("10"), Event("", None),
     [Skip("unknown_type")], Watching("10")),
    ("ERROR event 410 -> relist from the last RV",
     Watching("10"), Event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}),
     [Restart("gone", ...), List("10")], Listing("10")),
    ("ERROR event 500 -> back off, re-watch",
     Watching("10", 0, True), Event("ERROR", {"kind": "Status", "code": 500}),
     [Restart("error", ...), Sleep(), Watch("10")], Watching("10", 1)),

    # ---- watch endings ----
    ("clean end after progress -> re-watch at once, no relist",
     Watching("11", 0, True), Closed(),
     [Restart("timeout"), Progress(), Watch("11")], Watching("11", 0)),
    ("clean end of a quiet watch -> re-watch at once",
     Watching("11", 0), Closed(),
     [Restart("timeout"), Progress(), Watch("11")], Watching("11", 1)),
    ("watches closed at once, repeatedly -> back off",
     Watching("11", 1), Closed(),
     [Restart("timeout"), Progress(), Sleep(), Watch("11")], Watching("11", 2)),
    ("drop after progress -> re-watch at once from the last RV",
     Watching("11", 0, True), F(DROP),
     [Restart("disconnect", DROP), Watch("11")], Watching("11", 1)),
    ("first drop -> re-watch at once",
     Watching("11"), F(DROP),
     [Restart("disconnect", DROP), Watch("11")], Watching("11", 1)),
    ("repeated drop -> back off, no relist",
     Watching("11", 1), F(DROP),
     [Restart("disconnect", DROP), Sleep(), Watch("11")], Watching("11", 2)),
    ("stall -> reconnect from the last RV, one stall counted",
     Watching("11", 0, True), F(STALL),
     [Restart("stall", STALL), Watch("11")], Watching("11", 1, stalls=1)),
    ("repeated stall -> back off, stalls counted",
     Watching("11", 2, stalls=2), F(STALL),
     [Restart("stall", STALL), Sleep(), Watch("11")], Watching("11", 3, stalls=3)),
    # ---- the stall count (liveness): only progress clears it ----
    ("refused connection between stalls -> neither counted nor cleared",
     Watching("11", 2, stalls=2), F(DROP),
     [Restart("disconnect", DROP), Sleep(), Watch("11")], Watching("11", 3, stalls=2)),
    ("5xx between stalls -> neither counted nor cleared",
     Watching("11", 1, stalls=1), F(SERVER),
     [Restart("error", SERVER), Sleep(), Watch("11")], Watching("11", 2, stalls=1)),
    ("clean close without events between stalls -> not cleared",
     Watching("11", 0, stalls=2), Closed(),
     [Restart("timeout"), Progress(), Watch("11")], Watching("11", 1, stalls=2)),
    ("an event after stalls -> cleared",
     Watching("11", 3, stalls=3), Event("ADDED", obj(rv="12")),
     [Deliver("ADDED", obj(rv="12")), Progress()], Watching("12", 0, True)),
    ("a bookmark after stalls -> cleared",
     Watching("11", 3, stalls=3), Event("BOOKMARK", BOOKMARK),
     [Progress()], Watching("20", 0, True)),
    ("a malformed line after stalls -> not progress, not cleared",
     Watching("11", 1, stalls=2), Event("WHATEVER", obj()),
     [Skip("unknown_type")], Watching("11", 1, stalls=2)),
    ("410 after stalls -> relist (a successful list starts a fresh count)",
     Watching("11", 2, stalls=2), F(GONE),
     [Restart("gone", GONE), List("11")], Listing("11")),
    ("malformed bytes -> reconnect, RV kept",
     Watching("11", 0, True), F(GARBLED),
     [Restart("protocol", GARBLED), Watch("11")], Watching("11", 1)),
    ("410 on watch -> relist from the last RV",
     Watching("11", 0, True), F(GONE),
     [Restart("gone", GONE), List("11")], Listing("11")),
    ("too-large RV on watch -> relist with RV=''",
     Watching("11"), F(TOO_LARGE),
     [Restart("too_large_rv", TOO_LARGE), List("")], Listing("")),
    ("403 on watch -> back off and keep trying",
     Watching("11"), F(FORBIDDEN),
     [Restart("error", FORBIDDEN), Sleep(), Watch("11")], Watching("11", 1)),
    ("5xx on watch -> back off",
     Watching("11", 0, True), F(SERVER),
     [Restart("error", SERVER), Sleep(), Watch("11")], Watching("11", 1)),
    ("429 on watch -> back off",
     Watching("11", 4), F(TooManyRequestsError(429)),
     [Restart("error", ...), Sleep(), Watch("11")], Watching("11", 5)),
    ("unexpected exception on watch -> back off",
     Watching("11"), F(BUG),
     [Restart("error", BUG), Sleep(), Watch("11")], Watching("11", 1)),

    # ======== streaming list ========
    # ---- the initial events ----
    ("initial ADDED -> collected, not delivered; RV and failures kept",
     Streaming("", 1), Event("ADDED", A),
     [Collect(A)], Streaming("", 1, True)),
    ("initial ADDED does not clear stalls: only a completed list is progress",
     Streaming("5", 0, False, 2), Event("ADDED", A),
     [Collect(A)], Streaming("5", 0, True, 2)),
    ("end bookmark clears stalls and failures",
     Streaming("5", 2, True, 2), END,
     [ReplaceCollected(), Progress()], Watching("20", 0, True, stream=True)),
    ("end bookmark -> replace with the collected set, keep reading the same stream",
     Streaming("", 0, True), END,
     [ReplaceCollected(), Progress()], Watching("20", 0, True, stream=True)),
    ("end bookmark on an empty collection (nothing to list) -> replace with nothing",
     Streaming("5"), END,
     [ReplaceCollected(), Progress()], Watching("20", 0, True, stream=True)),
    ("annotation not 'true' is a plain bookmark -> fall back",
     Streaming(""), Event("BOOKMARK", {"metadata": {
         "resourceVersion": "9", "annotations": {"k8s.io/initial-events-end": "false"}}}),
     [FallBack("...", None), List("")], Listing("")),
    ("initial object without a name is skipped",
     Streaming(""), Event("ADDED", obj(name="")),
     [Skip("no_name")], Streaming("")),
    ("initial object without an RV is skipped",
     Streaming(""), Event("ADDED", {"metadata": {"name": "a"}}),
     [Skip("no_resource_version")], Streaming("")),
    ("unknown event type is skipped",
     Streaming(""), Event("SYNC", A),
     [Skip("unknown_type")], Streaming("")),

    # ---- an apiserver that ignored the parameters (older than 1.27) ----
    ("plain bookmark before the end bookmark -> fall back to a paged list from the same RV",
     Streaming("5", 0, True), bookmark("30"),
     [FallBack("...", None), List("5")], Listing("5")),
    ("MODIFIED among the initial events (a plain watch from our RV) -> fall back",
     Streaming("5"), Event("MODIFIED", obj(rv="12")),
     [FallBack("...", None), List("5")], Listing("5")),
    ("DELETED among the initial events -> fall back",
     Streaming("5"), Event("DELETED", obj(rv="12")),
     [FallBack("...", None), List("5")], Listing("5")),
    ("the stream ends before the end bookmark -> fall back",
     Streaming("", 0, True), Closed(),
     [FallBack("...", None), List("")], Listing("")),

    # ---- an apiserver that refuses them ----
    ("422 sendInitialEvents is forbidden -> fall back at once, no backoff",
     Streaming(""), F(REFUSED),
     [FallBack("...", REFUSED), List("")], Listing("")),
    ("400 -> fall back",
     Streaming("5"), F(BAD_REQUEST),
     [FallBack("...", BAD_REQUEST), List("5")], Listing("5")),
    ("403 naming sendInitialEvents -> fall back",
     Streaming(""), F(FORBIDDEN_PARAM),
     [FallBack("...", FORBIDDEN_PARAM), List("")], Listing("")),
    ("403 from RBAC is not a refusal of streaming: back off, stream again",
     Streaming(""), F(FORBIDDEN),
     [Restart("error", FORBIDDEN), Sleep(), StreamList("")], Streaming("", 1)),

    # ---- failures during the initial stream ----
    ("410 during the initial stream from an RV -> stream from RV '' at once",
     Streaming("5", 0, True), F(GONE),
     [Restart("gone", GONE), StreamList("")], Streaming("")),
    ("410 with RV '' -> back off, stream again",
     Streaming("", 0, True), F(GONE),
     [Restart("gone", GONE), Sleep(), StreamList("")], Streaming("", 1)),
    ("ERROR event 410 in the initial stream -> stream from RV ''",
     Streaming("5", 0, True), Event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}),
     [Restart("gone", ...), StreamList("")], Streaming("")),
    ("too large RV -> stream from RV ''",
     Streaming("12"), F(TOO_LARGE),
     [Restart("too_large_rv", TOO_LARGE), StreamList("")], Streaming("")),
    ("first drop -> stream again at once from the same RV",
     Streaming("5", 0, True), F(DROP),
     [Restart("disconnect", DROP), StreamList("5")], Streaming("5", 1)),
    ("a drop after initial events still counts: the second one backs off",
     Streaming("5", 1, True), F(DROP),
     [Restart("disconnect", DROP), Sleep(), StreamList("5")], Streaming("5", 2)),
    ("stall during the initial stream counts toward liveness, streams again",
     Streaming("", 0, True), F(STALL),
     [Restart("stall", STALL), StreamList("")], Streaming("", 1, stalls=1)),
    ("second stall in a row: an apiserver that ignored it and sends no bookmarks -> fall back",
     Streaming("5", 1, True, 1), F(STALL),
     [Restart("stall", STALL), FallBack("...", STALL), List("5")], Listing("5")),
    ("a drop between two stalls neither counts nor clears them",
     Streaming("", 1, False, 1), F(DROP),
     [Restart("disconnect", DROP), Sleep(), StreamList("")], Streaming("", 2, stalls=1)),
    ("garbled stream -> stream again",
     Streaming(""), F(GARBLED),
     [Restart("protocol", GARBLED), StreamList("")], Streaming("", 1)),
    ("5xx -> back off",
     Streaming(""), F(SERVER),
     [Restart("error", SERVER), Sleep(), StreamList("")], Streaming("", 1)),

    # ---- the watch after a streaming list ----
    ("410 on the watch -> relist by streaming, not older than the last RV",
     Watching("30", 0, True, stream=True), F(GONE),
     [Restart("gone", GONE), StreamList("30")], Streaming("30")),
    ("too large RV on the watch -> stream from RV ''",
     Watching("30", stream=True), F(TOO_LARGE),
     [Restart("too_large_rv", TOO_LARGE), StreamList("")], Streaming("")),
    ("events on the watch keep the streaming mode",
     Watching("30", stream=True), Event("MODIFIED", obj(rv="31")),
     [Deliver("MODIFIED", obj(rv="31")), Progress()], Watching("31", 0, True, stream=True)),
    ("a clean end keeps the streaming mode",
     Watching("30", 0, True, stream=True), Closed(),
     [Restart("timeout"), Progress(), Watch("30")], Watching("30", stream=True)),
    ("a drop keeps the streaming mode",
     Watching("30", 0, True, stream=True), F(DROP),
     [Restart("disconnect", DROP), Watch("30")], Watching("30", 1, stream=True)),
    ("after a fallback, the list goes to a watch that relists page by page",
     Listing("5"), Listed([A], "40"),
     [Replace([A]), Progress(), Watch("40")], Watching("40")),
    ("fallback remembered: 410 on that watch relists page by page",
     Watching("40", 0, True), F(GONE),
     [Restart("gone", GONE), List("40")], Listing("40")),
]


def _same(actual, expected):
    """Action equality where `...` in an error slot means "any error"."""
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, FallBack):      # any reason; an error iff one is expected
        return actual.reason != "" and (expected.error is None) == (actual.error is None)
    if isinstance(expected, (Restart, ListError)) and expected.error is ...:
        return actual.reason == expected.reason and actual.error is not None
    return actual == expected


@pytest.mark.parametrize("name,state,inp,actions,new_state", TABLE, ids=[r[0] for r in TABLE])
def test_transition(name, state, inp, actions, new_state):
    got_actions, got_state = step(state, inp)
    assert got_state == new_state
    assert len(got_actions) == len(actions), got_actions
    for got, want in zip(got_actions, actions):
        assert _same(got, want), (got, want)


def test_table_covers_every_failure_reason_in_both_states():
    reasons = {r for r in WATCH_RESTART_REASONS if r != "timeout"}
    for kind in (Listing, Watching, Streaming):
        seen = {row[2].reason for row in TABLE
                if isinstance(row[1], kind) and isinstance(row[2], Failed)}
        if kind is Listing:
            seen.add("protocol")       # the malformed-list rows
            seen.add("stall")          # same branch as disconnect, tested below
        assert reasons <= seen, (kind.__name__, reasons - seen)


@pytest.mark.parametrize("error,reason", [
    (GONE, "gone"), (TOO_LARGE, "too_large_rv"), (STALL, "stall"), (GARBLED, "protocol"),
    (DROP, "disconnect"), (ConnectionResetError(), "disconnect"), (FORBIDDEN, "error"),
    (SERVER, "error"), (from_status(504, {"kind": "Status", "message": "gateway"}), "error"),
    (BUG, "error"),
])
def test_failure_classifies_errors(error, reason):
    assert failure(error) == Failed(reason, error)


def test_stall_on_list_backs_off():
    assert step(Listing("3"), F(STALL)) == ([ListError("stall", STALL), Sleep(), List("3")],
                                           Listing("3"))


def test_initial_state_lists_consistently():
    assert INITIAL == Listing("")
    assert resume(INITIAL) == [List("")]


def test_resume_rewatches_without_relisting():
    assert resume(Watching("42", 3, True)) == [Watch("42")]
    assert resume(Listing("42")) == [List("42")]


def test_initial_streaming_state_streams_a_consistent_list_and_resume_streams_again():
    assert INITIAL_STREAMING == Streaming("")
    assert resume(INITIAL_STREAMING) == [StreamList("")]
    # A watcher thread restarted mid-stream starts the stream over (the set is gone).
    assert resume(Streaming("9", 1, True, 2)) == [StreamList("9")]


@pytest.mark.parametrize("state,inp", [
    (Listing(""), Event("ADDED", A11)),
    (Listing(""), Closed()),
    (Watching("1"), Listed([], "2")),
    (Streaming(""), Listed([], "2")),
])
def test_impossible_inputs_are_rejected(state, inp):
    with pytest.raises(TypeError):
        step(state, inp)


def test_a_full_life_relist_after_gone_then_gone_again():
    """Walk a realistic sequence through the table."""
    s = INITIAL
    script = [
        (Listed(ITEMS, "10"), Watch("10")),
        (Event("ADDED", obj("b", "11")), None),
        (Event("BOOKMARK", {"metadata": {"resourceVersion": "15"}}), None),
        (Closed(), Watch("15")),
        (F(GONE), List("15")),
        (F(GONE), List("")),
        (Listed([], "30"), Watch("30")),
    ]
    for inp, io in script:
        actions, s = step(s, inp)
        last = actions[-1]
        if io is None:
            assert not isinstance(last, (List, Watch))
        else:
            assert last == io
    assert s == Watching("30")


def test_a_full_life_stream_watch_gone_stream_again():
    s = INITIAL_STREAMING
    script = [
        (Event("ADDED", obj("a", "3")), [Collect(obj("a", "3"))]),
        (Event("ADDED", obj("b", "4")), [Collect(obj("b", "4"))]),
        (bookmark("10", end=True), [ReplaceCollected(), Progress()]),
        (Event("ADDED", obj("c", "11")), [Deliver("ADDED", obj("c", "11")), Progress()]),
        (F(GONE), [Restart("gone", GONE), StreamList("11")]),
        (F(GONE), [Restart("gone", GONE), StreamList("")]),
        (bookmark("30", end=True), [ReplaceCollected(), Progress()]),
    ]
    for inp, want in script:
        actions, s = step(s, inp)
        assert actions == want, (inp, actions)
    assert s == Watching("30", 0, True, stream=True)


# ---- properties -----------------------------------------------------------------

_rvs = st.sampled_from(["", "1", "2", "99", 7, None])
_annotations = st.sampled_from([None, {}, {"k8s.io/initial-events-end": "true"},
                                {"k8s.io/initial-events-end": "false"}])
_objects = st.one_of(
    st.builds(lambda n, rv: {"metadata": {"name": n, "resourceVersion": rv}},
              st.sampled_from(["", "a"]), _rvs),
    st.builds(lambda rv, ann: {"metadata": {"resourceVersion": rv, "annotations": ann}},
              _rvs, _annotations),
    st.just({}), st.just(None), st.just([1]))
_events = st.builds(Event, st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK",
                                            "ERROR", "SYNC", ""]), _objects)
_failures = st.sampled_from([GONE, TOO_LARGE, FORBIDDEN, SERVER, DROP, STALL, GARBLED, BUG,
                             REFUSED, BAD_REQUEST]).map(F)
_inputs = st.one_of(_events, st.just(Closed()), _failures,
                    st.builds(Listed, st.just(ITEMS), _rvs))


@pytest.mark.parametrize("start", [INITIAL, INITIAL_STREAMING], ids=["paged", "streaming"])
@settings(max_examples=300, deadline=None)
@given(inputs=st.lists(_inputs, max_size=30))
def test_properties_of_any_sequence(start, inputs):
    s = start
    fell_back = False
    for inp in inputs:
        # Feed only what the loop can produce in this state.
        if isinstance(s, Listing) and not isinstance(inp, (Listed, Failed)):
            continue
        if not isinstance(s, Listing) and isinstance(inp, Listed):
            continue
        actions, new = step(s, inp)
        io = [a for a in actions if isinstance(a, (List, Watch, StreamList))]
        # At most one I/O action, and it comes last; Sleep comes right before it.
        assert len(io) <= 1 and (not io or actions[-1] is io[0])
        if any(isinstance(a, Sleep) for a in actions):
            assert isinstance(actions[-2], Sleep) and io
        # The state says what the I/O does.
        if io:
            assert io[0].resource_version == new.resource_version
            assert isinstance(io[0], List) == isinstance(new, Listing)
            assert isinstance(io[0], StreamList) == isinstance(new, Streaming)
        # The RV only ever moves to an RV the server handed us in a valid list,
        # event or bookmark; otherwise it stays, or resets to "" for a consistent relist.
        if new.resource_version != s.resource_version and new.resource_version != "":
            delivered = (isinstance(inp, Listed) and inp.resource_version == new.resource_version) \
                or (isinstance(inp, Event) and isinstance(inp.object, dict)
                    and inp.object["metadata"]["resourceVersion"] == new.resource_version)
            assert delivered, (s, inp, new)
        # Skipped (malformed) input changes nothing.
        if any(isinstance(a, Skip) for a in actions):
            assert actions == [actions[0]] and new == s
        # Only valid ADDED/MODIFIED/DELETED are delivered, never bookmarks.
        for a in actions:
            if isinstance(a, Deliver):
                assert a.type in ("ADDED", "MODIFIED", "DELETED") and a.object["metadata"]["name"]
            if isinstance(a, Collect):
                assert inp.type == "ADDED" and a.object["metadata"]["name"]
        # Initial events are collected, never delivered; the set is swapped in only
        # by the end bookmark, which leaves a watch that relists by streaming.
        if isinstance(s, Streaming):
            assert not any(isinstance(a, Deliver) for a in actions)
            if any(isinstance(a, ReplaceCollected) for a in actions):
                assert isinstance(inp, Event) and inp.type == "BOOKMARK"
                assert isinstance(new, Watching) and new.stream
        # Paged from the start, or once fallen back: never streaming again.
        fell_back = fell_back or start is INITIAL or any(isinstance(a, FallBack) for a in actions)
        if fell_back:
            assert not isinstance(new, Streaming) and not getattr(new, "stream", False)
        s = new


def test_is_watching_from_a_failed_attempt_until_the_reopened_watch_brings_something():
    """What a reader of the cache may trust (the shard ring plans on it): open, or
    reopened after a clean close; not while listing, nor after a failure until
    the reopened watch has brought something."""
    drop = failure(ApiConnectionError("connection lost mid-stream"))
    assert not is_watching(INITIAL) and not is_watching(INITIAL_STREAMING)
    state = Watching("10")
    assert is_watching(state)
    _, state = step(state, drop)                  # a drop without progress: backs off
    assert not is_watching(state)
    _, state = step(state, drop)                  # the reopened watch fails again
    assert not is_watching(state)
    _, state = step(state, Event("BOOKMARK", {"kind": "Deployment",
                                             "metadata": {"resourceVersion": "11"}}))
    assert is_watching(state)                     # the reopened watch brought a bookmark
    _, state = step(state, Closed())              # the server ends it: reopened at once
    assert is_watching(state)
    _, state = step(state, drop)                  # a drop: reopened at once, not yet heard
    assert not is_watching(state)
