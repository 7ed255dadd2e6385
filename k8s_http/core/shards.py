"""Who owns which object when several replicas share the work (issue 37), pure.

The hash space and how the apiserver reads it (KEP-5866, alpha in 1.36, gate
`ShardedListAndWatch`; every fact below checked against a real v1.36.3
apiserver, see docs/SHARDING.md and tests/e2e/test_shard_selector.py):

- An object's hash is FNV-1a 64 of the UTF-8 bytes of `metadata.uid` (or of
  `metadata.namespace`, "" for a cluster-scoped object) exactly as they are,
  an integer in [0, 2**64).
- `shardSelector=shardRange(object.metadata.uid, '0x<16 hex>', '0x<16 hex>')`
  keeps the objects with start <= hash < end; `||` joins ranges over the same
  field; the end of the space is written '0x10000000000000000'. Bounds must
  be lowercase and exactly 16 digits: anything else is a 500 from the server,
  so only this module writes selectors.
- A list of a built-in resource echoes `metadata.shardInfo.selector` in the
  server's canonical spelling, which is the one `Ranges.shard_selector` writes.
  Lists of custom resources are filtered but echo nothing, and no watch event
  (not even the initial-events-end bookmark) carries it; with the gate off the
  parameter is ignored without a word. So the client-side filter (`keeps`)
  is the source of truth and server-side filtering only saves bytes.

Ownership, the same on every replica:

- The space is cut into SLOTS equal slots; an object's slot is the top
  SLOT_BITS bits of its uid hash, so a slot is one hash range and a set of
  slots is a `Ranges`.
- Each slot goes to the live member with the highest rendezvous weight
  blake2b(slot, member). The map depends only on the SET of member names
  (not their order, not who computes it), and when a member joins or leaves
  only the slots it gains or loses change owner (about 1/N of them).
- Children do not share their owner's uid, and `shardSelector` knows only uid
  and namespace; so the operator labels each child with its owner's slot
  (`slot_label_value`) at creation, and a member selects its children with
  the set-based label selector `slot_label_selector`, which every apiserver
  understands.

Invariants (tests/unit/test_shards.py checks them with hypothesis):
- `Ranges.spans` is sorted, non-overlapping, non-adjacent (merged), and every
  span is non-empty inside [0, 2**64).
- For any non-empty member list, each slot has exactly one owner, so every
  hash lies in exactly one member's `ranges_of`.
- `assign(members)` == `assign(reversed(members))`, and with a member added
  or removed only the slots it gains or loses move.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "HASH_SPACE",
    "SLOTS",
    "SLOT_BITS",
    "UID",
    "NAMESPACE",
    "fnv1a_64",
    "Ranges",
    "slot_of_hash",
    "slot_of",
    "slot_span",
    "span_text",
    "ranges_of_slots",
    "assign",
    "slots_of",
    "ranges_of",
    "object_hash",
    "keeps",
    "is_server_filtered",
    "slot_label_value",
    "slot_of_label",
    "slot_label_selector",
]

HASH_SPACE = 1 << 64
# 256 slots (8 bits). The share of the busiest of 3 replicas under rendezvous
# hashing is ~1.08/3 of the objects at the median and ~1.15/3 at p90 of
# random member names (64 slots: 1.17/3 and 1.31/3), which keeps the issue's
# "RSS <= 0.4x with 3 replicas" within reach. The price is selector length: a
# member of 3 holds ~57 runs of slots (~4.5 KB of shardSelector), at worst
# 128 (every other slot, ~10 KB, accepted by the apiserver: e2e test); its
# label selector lists ~85 numbers. A power of two, so a slot is a hash prefix.
# A wire constant: children carry slot labels, so changing it relabels them all.
SLOT_BITS = 8
SLOTS = 1 << SLOT_BITS

UID = "object.metadata.uid"
NAMESPACE = "object.metadata.namespace"
_FIELDS = (UID, NAMESPACE)

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = HASH_SPACE - 1


def fnv1a_64(value: str) -> int:
    """FNV-1a 64 of value's UTF-8 bytes: Go's hash/fnv New64a, as the apiserver hashes."""
    h = _FNV_OFFSET
    for byte in value.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def _bound(value: int) -> str:
    # The server's canonical spelling: 16 lowercase digits; 2**64 has 17.
    return f"'0x{value:016x}'"


@dataclass(frozen=True)
class Ranges:
    """A set of hashes as half-open spans [start, end) over [0, 2**64).

    spans: sorted, each start < end, and span i ends strictly before span i+1
    starts (touching spans are merged), so equal sets have equal spans.
    Build with `Ranges.of(...)`, which normalizes; the constructor trusts.
    """

    spans: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, spans: Iterable[tuple[int, int]]) -> "Ranges":
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            if not 0 <= start <= end <= HASH_SPACE:
                raise ValueError(f"span [{start:#x}, {end:#x}) is not inside [0, 2**64)")
            if start == end:
                continue
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return cls(tuple(merged))

    @classmethod
    def everything(cls) -> "Ranges":
        return cls(((0, HASH_SPACE),))

    def __bool__(self) -> bool:
        return bool(self.spans)

    def is_everything(self) -> bool:
        return self.spans == ((0, HASH_SPACE),)

    def contains(self, hash_value: int) -> bool:
        # The last span starting at or before hash_value is the only candidate.
        i = bisect.bisect_right(self.spans, (hash_value, HASH_SPACE)) - 1
        return i >= 0 and hash_value < self.spans[i][1]

    def size(self) -> int:
        """How many hashes: HASH_SPACE for everything."""
        return sum(end - start for start, end in self.spans)

    def shard_selector(self, field: str = UID) -> str:
        """The `shardSelector` value, spelled as the server echoes it.

        Empty ranges have no selector (the server rejects start == end): a
        member that owns nothing must not watch at all; ValueError.
        """
        if field not in _FIELDS:
            raise ValueError(f"the apiserver shards only by {' or '.join(_FIELDS)}, not {field!r}")
        if not self.spans:
            raise ValueError("no selector selects nothing: do not list or watch an empty share")
        return " || ".join(f"shardRange({field}, {_bound(start)}, {_bound(end)})"
                           for start, end in self.spans)


def slot_of_hash(hash_value: int) -> int:
    return hash_value >> (64 - SLOT_BITS)


def slot_of(uid: str) -> int:
    """The slot of the object with this uid (and of every child labelled for it)."""
    return slot_of_hash(fnv1a_64(uid))


def slot_span(slot: int) -> tuple[int, int]:
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot {slot} is not in [0, {SLOTS})")
    width = HASH_SPACE // SLOTS
    return slot * width, (slot + 1) * width


def span_text(span: tuple[int, int]) -> str:
    """A span [start, end) as metrics and logs name it: "0x<start>-0x<end>", the
    bounds spelled as in shardRange (the end of the space is 0x10000000000000000)."""
    return f"0x{span[0]:016x}-0x{span[1]:016x}"


def ranges_of_slots(slots: Iterable[int]) -> Ranges:
    return Ranges.of(slot_span(slot) for slot in slots)


def _weight(key: bytes) -> int:
    # blake2b, not FNV: FNV-1a's high bits barely move when only the last
    # characters differ (pod names do), which would correlate the weights.
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def assign(members: Iterable[str]) -> dict[int, str]:
    """slot -> owner for every slot, by rendezvous hashing; {} without members.

    Ties (astronomically unlikely) go to the greater name, so the answer never
    depends on the order of `members`; duplicates count once.
    """
    encoded = [(m, m.encode()) for m in set(members)]
    if not encoded:
        return {}
    # The weight of (slot, m) is the hash of b"<slot>/<m>".
    return {slot: max((_weight(b"%d/" % slot + raw), m) for m, raw in encoded)[1]
            for slot in range(SLOTS)}


def slots_of(member: str, members: Iterable[str]) -> frozenset[int]:
    """The slots `member` owns among `members` (empty if it is not one of them)."""
    return _slots_of(member, frozenset(members))


# A ring round asks this for the same members again and again (every change
# of a Lease, at least twice a second): ~1.8 ms to work out, ~1 us to recall.
@functools.lru_cache(maxsize=16)
def _slots_of(member: str, members: frozenset[str]) -> frozenset[int]:
    return frozenset(slot for slot, owner in assign(members).items() if owner == member)


def ranges_of(member: str, members: Iterable[str]) -> Ranges:
    return ranges_of_slots(slots_of(member, members))


def object_hash(obj: Mapping, field: str = UID) -> int:
    """The hash the server computes for obj; a missing value hashes as ""."""
    meta = obj.get("metadata") or {}
    if field == UID:
        return fnv1a_64(meta.get("uid") or "")
    if field == NAMESPACE:
        return fnv1a_64(meta.get("namespace") or "")
    raise ValueError(f"the apiserver shards only by {' or '.join(_FIELDS)}, not {field!r}")


def keeps(obj: Mapping, ranges: Ranges, field: str = UID) -> bool:
    """The client-side filter: does obj belong to ranges, as the server would say."""
    return ranges.contains(object_hash(obj, field))


def is_server_filtered(list_metadata: Mapping | None, selector: str) -> bool:
    """Did the server apply `selector` to this list? Only if it echoed it back.

    False also for lists the server did filter without saying so (custom
    resources): callers filter with `keeps` whatever this answers.
    """
    info = (list_metadata or {}).get("shardInfo") or {}
    return info.get("selector") == selector


def slot_label_value(slot: int) -> str:
    """The value of the slot label a child carries: its owner's slot, in decimal."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot {slot} is not in [0, {SLOTS})")
    return str(slot)


def slot_of_label(value: object) -> int | None:
    """The slot a child's slot label names (`slot_label_value`'s inverse), None if
    it names none (a value the operator never writes: not a decimal slot)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 3:
        slot = int(value)
        if slot < SLOTS:
            return slot
    return None


def slot_label_selector(key: str, slots: Iterable[int]) -> str:
    """`key in (3,17,...)`: the children of the owners in `slots`.

    Empty slots have no selector (`in ()` is invalid): ValueError, as above.
    """
    values = sorted(set(slots))
    if not values:
        raise ValueError("no selector selects nothing: do not list or watch an empty share")
    return f"{key} in ({','.join(slot_label_value(s) for s in values)})"
