"""k8s_http.core.shards: the hash the apiserver computes, the ranges, the slot map.

What the real apiserver does with the selectors is tests/e2e/test_shard_selector.py;
here, the pure rules, with hypothesis where a rule is a property.
"""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_http.core.shards import (
    HASH_SPACE, NAMESPACE, SLOTS, Ranges, assign, fnv1a_64, is_server_filtered, keeps,
    object_hash, ranges_of, ranges_of_slots, slot_label_selector, slot_label_value, slot_of,
    slot_of_hash, slot_span, slots_of)

hashes = st.integers(min_value=0, max_value=HASH_SPACE - 1)
bounds = st.integers(min_value=0, max_value=HASH_SPACE)
spans = st.lists(st.tuples(bounds, bounds).map(sorted).map(tuple), max_size=12)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=30)
memberships = st.lists(names, min_size=1, max_size=8, unique=True)


# --- the hash


@pytest.mark.parametrize("value, expected", [
    # Go's hash/fnv golden values for New64a (fnv_test.go).
    ("", 0xCBF29CE484222325),
    ("a", 0xAF63DC4C8601EC8C),
    ("ab", 0x089C4407B545986A),
    ("abc", 0xE71FA2190541574B),
    # A uid the v1.36.3 apiserver placed by this value (probe, docs/SHARDING.md).
    ("c6d32f1a-14d2-46ab-8be8-8d55aadfe93a", 0x502CE0CC12D8E752),
])
def test_fnv1a_64_matches_go(value, expected):
    assert fnv1a_64(value) == expected


def test_the_hash_is_of_the_utf8_bytes():
    # Namespaces and uids are ASCII; the rule for the rest is Go's []byte(string).
    assert fnv1a_64("é") == fnv1a_64("\u00e9")
    assert fnv1a_64("é") != fnv1a_64("e")


def test_object_hash_reads_uid_or_namespace_and_hashes_missing_as_empty():
    obj = {"metadata": {"uid": "u-1", "namespace": "ns"}}
    assert object_hash(obj) == fnv1a_64("u-1")
    assert object_hash(obj, NAMESPACE) == fnv1a_64("ns")
    assert object_hash({"metadata": {"uid": "u-1"}}, NAMESPACE) == fnv1a_64("")
    with pytest.raises(ValueError):
        object_hash(obj, "object.metadata.name")


# --- Ranges


@given(spans)
def test_ranges_are_sorted_merged_and_non_empty(raw):
    r = Ranges.of(raw)
    for start, end in r.spans:
        assert 0 <= start < end <= HASH_SPACE
    for (_, end), (start, _) in zip(r.spans, r.spans[1:]):
        assert end < start                         # neither overlapping nor touching


@given(spans, hashes)
def test_contains_is_membership_in_some_half_open_span(raw, h):
    assert Ranges.of(raw).contains(h) == any(start <= h < end for start, end in raw)


@given(spans)
def test_equal_sets_have_equal_ranges_whatever_the_order(raw):
    assert Ranges.of(raw) == Ranges.of(reversed(raw)) == Ranges.of(raw + raw)


def test_bounds_are_half_open_and_the_end_of_the_space_is_2_to_the_64():
    r = Ranges.of([(10, 20)])
    assert not r.contains(9) and r.contains(10) and r.contains(19) and not r.contains(20)
    assert Ranges.everything().contains(HASH_SPACE - 1)
    assert Ranges.of([(0, 5), (5, HASH_SPACE)]).is_everything()
    with pytest.raises(ValueError):
        Ranges.of([(0, HASH_SPACE + 1)])
    with pytest.raises(ValueError):
        Ranges.of([(-1, 3)])


def test_shard_selector_is_the_servers_canonical_spelling():
    # The spelling the v1.36.3 apiserver echoes in shardInfo.selector (e2e checks it).
    assert Ranges.of([(0, 1 << 62), (3 << 62, HASH_SPACE)]).shard_selector() == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000') || "
        "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')")
    assert Ranges.of([(0xAB, 0xCD)]).shard_selector(NAMESPACE) == (
        "shardRange(object.metadata.namespace, '0x00000000000000ab', '0x00000000000000cd')")


def test_no_selector_for_nothing_or_for_fields_the_server_does_not_know():
    with pytest.raises(ValueError, match="empty share"):
        Ranges().shard_selector()
    with pytest.raises(ValueError, match="shards only by"):
        Ranges.everything().shard_selector("object.metadata.name")


# --- slots


def test_slots_cut_the_space_into_equal_prefixes():
    assert slot_span(0) == (0, HASH_SPACE // SLOTS)
    assert slot_span(SLOTS - 1)[1] == HASH_SPACE
    assert ranges_of_slots(range(SLOTS)).is_everything()
    with pytest.raises(ValueError):
        slot_span(SLOTS)


@given(hashes)
def test_a_hash_lies_in_its_slots_span(h):
    start, end = slot_span(slot_of_hash(h))
    assert start <= h < end


def test_slot_of_an_object_is_the_slot_of_its_uid_hash():
    uid = "c6d32f1a-14d2-46ab-8be8-8d55aadfe93a"
    assert slot_of(uid) == 0x50                   # top 8 bits of 0x502ce0cc...


# --- assignment


# assign() hashes SLOTS x members names: ~ms each, so no per-example deadline.
slow = settings(deadline=None, max_examples=30)


@slow
@given(memberships, hashes)
def test_every_hash_is_in_exactly_one_members_ranges(members, h):
    owners = [m for m in members if ranges_of(m, members).contains(h)]
    assert len(owners) == 1


@slow
@given(memberships)
def test_every_slot_has_one_owner_among_the_members(members):
    owners = assign(members)
    assert sorted(owners) == list(range(SLOTS))
    assert set(owners.values()) <= set(members)


@slow
@given(memberships, st.randoms(use_true_random=False))
def test_the_map_does_not_depend_on_member_order_or_duplicates(members, rnd):
    shuffled = list(members)
    rnd.shuffle(shuffled)
    assert assign(members) == assign(shuffled) == assign(shuffled + members)


@slow
@given(memberships, names)
def test_a_joining_member_takes_slots_only_and_nobody_else_trades(members, newcomer):
    if newcomer in members:
        return
    before, after = assign(members), assign(members + [newcomer])
    moved = [s for s in range(SLOTS) if before[s] != after[s]]
    assert all(after[s] == newcomer for s in moved)


@slow
@given(memberships.filter(lambda m: len(m) >= 2), st.data())
def test_a_leaving_member_gives_away_its_slots_only(members, data):
    gone = data.draw(st.sampled_from(members))
    before = assign(members)
    after = assign([m for m in members if m != gone])
    moved = [s for s in range(SLOTS) if before[s] != after[s]]
    assert moved == [s for s in range(SLOTS) if before[s] == gone]


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=2 ** 32))
def test_a_membership_change_moves_about_one_nth_of_the_slots(n, seed):
    # Pod-like names from a seeded generator: hypothesis's own randoms shrink
    # to equal names, which is not a membership change.
    rnd = random.Random(seed)
    members = [f"my-controller-{rnd.getrandbits(40):010x}" for _ in range(n + 1)]
    newcomer = members.pop()
    before, after = assign(members), assign(members + [newcomer])
    moved = sum(before[s] != after[s] for s in range(SLOTS))
    # Expected SLOTS/(n+1); the bound is ~5 standard deviations of the binomial.
    expected = SLOTS / (n + 1)
    assert abs(moved - expected) <= 5 * (SLOTS * (1 / (n + 1)) * (n / (n + 1))) ** 0.5


def test_no_members_no_owners():
    assert assign([]) == {}
    assert slots_of("a", []) == frozenset()
    assert not ranges_of("a", ["b"])


def test_three_pod_names_share_the_work_evenly_enough():
    # The balance the slot count was chosen for (docs/SHARDING.md): pod-like
    # names, so the rendezvous weights must not correlate on a shared prefix.
    members = ["my-controller-7d9f8b6c4-x2k9p", "my-controller-7d9f8b6c4-q8m4t",
               "my-controller-7d9f8b6c4-z5n7w"]
    counts = sorted(len(slots_of(m, members)) for m in members)
    assert sum(counts) == SLOTS
    assert counts[-1] <= 0.42 * SLOTS, counts


# --- what the client does with the server's answer


def test_the_client_side_filter_agrees_with_the_ranges():
    uids = [str(uuid.UUID(int=i * 0x9E3779B97F4A7C15 % (1 << 128), version=4)) for i in range(200)]
    r = Ranges.of([(0, 1 << 63)])
    kept = [u for u in uids if keeps({"metadata": {"uid": u}}, r)]
    assert kept == [u for u in uids if fnv1a_64(u) < 1 << 63]
    assert 0 < len(kept) < len(uids)
    assert keeps({"metadata": {"namespace": "ns"}}, Ranges.everything(), NAMESPACE)
    assert not keeps({"metadata": {"uid": uids[0]}}, Ranges())


def test_server_filtered_only_when_it_echoed_our_selector():
    sel = Ranges.of([(0, 1 << 63)]).shard_selector()
    assert is_server_filtered({"resourceVersion": "1", "shardInfo": {"selector": sel}}, sel)
    assert not is_server_filtered({"resourceVersion": "1"}, sel)              # gate off, or a CR
    assert not is_server_filtered(None, sel)
    other = Ranges.of([(1 << 63, HASH_SPACE)]).shard_selector()
    assert not is_server_filtered({"shardInfo": {"selector": other}}, sel)


# --- children's slot labels


def test_slot_label_selector_is_a_set_based_selector_of_the_slots():
    assert slot_label_value(7) == "7"
    assert slot_label_selector("shards.mine.jp/slot", [9, 3, 3]) == "shards.mine.jp/slot in (3,9)"
    with pytest.raises(ValueError, match="empty share"):
        slot_label_selector("k", [])
    with pytest.raises(ValueError):
        slot_label_value(SLOTS)


@slow
@given(memberships)
def test_each_slot_label_is_selected_by_exactly_one_member(members):
    selected = {}
    for m in members:
        slots = slots_of(m, members)
        if slots:
            inside = slot_label_selector("k", slots).removeprefix("k in (").removesuffix(")")
            for value in inside.split(","):
                selected.setdefault(value, []).append(m)
    assert sorted(selected, key=int) == [slot_label_value(s) for s in range(SLOTS)]
    assert all(len(owners) == 1 for owners in selected.values())
