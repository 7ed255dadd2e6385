"""Projection: a cache keeps only the fields its code reads, with repeated strings stored once.

An application declares, per informer, the paths it reads; `Projection(paths)`
is then the Store's transform. A path is a dotted string ("metadata.name") or a
tuple of segments for keys that contain dots (("metadata", "annotations",
"mine.jp/config-hash")). A segment ending in "[]" says the value is a list: the
rest of the path applies to each of its items ("spec.ports[].port"). "*"
stands for every key of a map ("metadata.labels.*" is the same as
"metadata.labels"). The last segment keeps its whole value. A projected map
has its declared keys in declaration order (the packing walk reads them so,
see k8s_http.cache.packcode); a map under "*" and a value kept whole keep the
object's order.

Invariants the Store relies on:
  * the projection is a pure function of the object and idempotent
    (projecting a projected object gives an equal object): the watcher
    projects listed pages and the Store projects again on the way in;
  * it builds new containers and never mutates its input, and it keeps a
    value of an unexpected shape (a list where a map was declared, say) whole,
    so the code reading it sees the real value, not an absence.

Interning: every map key, and every string and integer value except those
under `distinct` and `repeated` paths, is looked up in a bounded table shared
by all projections, so namespaces, label keys and values, image names, kinds
and apiVersions, condition types and reasons, ports, and the name and uid a
child shares with its owner are stored once for the whole process.

`distinct` paths hold strings unique to one object (a resourceVersion, a
hash): adding them to the table would only grow it, so they are never shared,
and a packed projection keeps one of decimal digits as an int (packed.DIGITS),
half the size of the string. `repeated` paths hold strings that are often
unique and sometimes common to many objects (condition messages: 'ReplicaSet
"web-5d8f" has successfully progressed.', "Deployment has minimum
availability."): a packed projection shares one from its second sighting
within a short window (Interner.repeated).

`Projection.guarded(obj)` is for tests: the projected object in which reading a
key the projection dropped (present in `obj`, not kept) raises DroppedFieldRead,
so a new read of an unprojected field fails a test instead of comparing as missing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable

from .packcode import PlaceToken, compile_packer
from .packed import DIGITS, END, LAYOUTS, LEAF, LIST, MAP, digits_as_int, nest, seal

__all__ = ["Projection", "Interner", "DroppedFieldRead", "INTERNER"]

Path = str | tuple[str, ...]


class Interner:
    """A bounded table of shared strings (sys.intern's strings are immortal on some
    Pythons, and a cache must not pin the names of objects deleted long ago).

    Invariant: the table holds the strings some object still holds, plus those
    added since the last sweep. A sweep drops every entry nothing but the table
    refers to (the names, uids and values of objects deleted since: under churn
    they would otherwise pile up to `max_entries`). It runs when the table has
    doubled since the last one (never below `sweep_floor`), so its cost is
    proportional to what was added. If, at `max_entries`, the live strings
    alone still fill more than half of it, the table is emptied instead:
    strings already shared stay shared (their objects hold them), new ones
    start a new generation.

    Lookups are dict operations, atomic under the GIL; the lock only keeps two
    sweeps apart. A sweep racing a lookup may drop a string just handed out:
    that string stays correct where it went, and is merely not shared with the
    next equal one. Integers are shared the same way (a key never equals a str
    and an int both).

    `repeated(s, _)` is for strings that are mostly unique: it shares `s` only
    when it has met it before among its last `window` first sightings, and so
    adds to the table only strings that do repeat.
    """

    def __init__(self, max_entries: int = 1 << 18, window: int = 1 << 12,
                 sweep_floor: int = 1 << 12):
        self.max_entries = max_entries
        self.window = window
        self.sweep_floor = sweep_floor
        self._table: dict[str, str] = {}
        self._first_seen: dict[str, str] = {}
        self._sweep_at = min(sweep_floor, max_entries)
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        table = self._table
        found = table.get(value)
        if found is not None:
            return found
        if len(table) >= self._sweep_at:
            self._sweep()
            table = self._table
        return table.setdefault(value, value)

    def _sweep(self) -> None:
        """Drop the entries only the table refers to (see the class invariant)."""
        if not self._lock.acquire(blocking=False):
            return                          # another thread is sweeping
        try:
            table = self._table
            if len(table) < self._sweep_at:
                return
            at_the_bound = self._sweep_at >= self.max_entries
            for value in list(table):
                # References to an unheld entry: the table's key and value (one
                # object), the list, the loop variable and getrefcount's argument.
                if sys.getrefcount(value) <= _HELD_BY_THE_SWEEP_ALONE:
                    table.pop(value, None)
            if at_the_bound and len(table) > self.max_entries // 2:
                self._table = table = {}
            self._sweep_at = min(self.max_entries, max(self.sweep_floor, 2 * len(table)))
        finally:
            self._lock.release()

    def __len__(self) -> int:
        return len(self._table)

    def repeated(self, value: str, _default: object = None) -> str:
        """`value`, or the equal string shared before it; shared from its second sighting.
        (Same signature as `bound()`'s answer.) Races between threads may at worst
        leave an equal string unshared."""
        found = self._table.get(value)
        if found is not None:
            return found
        first = self._first_seen.pop(value, None)
        if first is not None:
            return self(first)              # seen again: the first one is shared from now on
        seen = self._first_seen
        if len(seen) >= self.window:
            self._first_seen = seen = {}
        seen[value] = value
        return value

    def bound(self) -> Callable[[str, str], str]:
        """The current table's `setdefault`, for interning many strings in a row
        (`intern(s, s)`: one C call each, where `self(s)` is a Python call). The
        size limit is checked here, once per batch: a batch may overshoot it."""
        if len(self._table) >= self._sweep_at:
            self._sweep()
        return self._table.setdefault


# sys.getrefcount of a string only the table and a sweep's loop refer to.
_HELD_BY_THE_SWEEP_ALONE = 5

INTERNER = Interner()


class DroppedFieldRead(AssertionError):
    """A read of a field the projection dropped (only raised by `Projection.guarded`)."""


# A compiled declaration: key -> subtree, where None keeps the whole value.
# "*" applies to every key not named. `_DISTINCT` marks a leaf whose strings are
# not interned, `_REPEATED` one whose strings are shared from their second sighting.
_DISTINCT = "\0distinct"
_REPEATED = "\0repeated"


_RESOURCE_VERSION = ("metadata", "resourceVersion")
_IDENTITY = (("metadata", "name"), ("metadata", "namespace"), _RESOURCE_VERSION)


def _segments(path: Path) -> tuple[str, ...]:
    parts = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
    if not parts or any(not p for p in parts):
        raise ValueError(f"bad projection path {path!r}")
    return tuple(p[:-2] if p.endswith("[]") else p for p in parts)


def _compile(keep: Iterable[Path], distinct: Iterable[Path],
             repeated: Iterable[Path] = ()) -> dict:
    tree: dict = {}

    def add(parts: tuple[str, ...], leaf: object) -> None:
        node = tree
        for part in parts[:-1]:
            child = node.get(part, {})
            if child is None or child.__class__ is str:
                return              # an ancestor is kept whole already
            node = node.setdefault(part, child)
        last = parts[-1]
        if leaf is not None:
            if last not in node:
                raise ValueError(f"{leaf[1:]} path {'.'.join(parts)!r} is not kept")
            node[last] = leaf
        else:
            node[last] = None       # whole value: replaces any narrower declaration

    for path in sorted(keep, key=lambda p: len(_segments(p))):
        add(_segments(path), None)
    for path in distinct:
        add(_segments(path), _DISTINCT)
    for path in repeated:
        add(_segments(path), _REPEATED)
    return tree


def _list_nodes(tree: dict, paths: Iterable[Path]) -> set[int]:
    """The ids of the subtrees of `tree` that `paths` declare as lists ("containers[]")."""
    found: set[int] = set()
    for path in paths:
        node: object = tree
        for part in (path.split(".") if isinstance(path, str) else path):
            name = part[:-2] if part.endswith("[]") else part
            node = node.get(name) if node.__class__ is dict else None
            if node.__class__ is not dict:
                break
            if part.endswith("[]"):
                found.add(id(node))
    return found


class Projection:
    """A Store transform keeping only `keep` paths (see the module docstring)."""

    def __init__(self, keep: Iterable[Path], *, distinct: Iterable[Path] = (),
                 repeated: Iterable[Path] = (), interner: Interner | None = INTERNER):
        keep, distinct, repeated = list(keep), list(distinct), list(repeated)
        # The declaration as segments, for tests that drop one path on purpose.
        self.paths = tuple(_segments(p) for p in keep)
        self.distinct = tuple(_segments(p) for p in distinct)
        self.repeated = tuple(_segments(p) for p in repeated)
        # The Store itself reads an object's name, namespace and resourceVersion
        # (its key; read-your-writes): kept whatever the declaration says, and a
        # resourceVersion not declared is not interned (it is unique).
        implicit = [p for p in _IDENTITY if p not in self.paths]
        self._tree = _compile(keep + list(implicit),
                              distinct + [p for p in implicit if p == _RESOURCE_VERSION],
                              repeated)
        self._interner = interner
        self._list_nodes = _list_nodes(self._tree, keep + distinct + repeated)
        # The packing walk compiled for this declaration (k8s_http.cache.packcode); None
        # when too deep to compile, and then `_pack_node` walks the tree itself.
        self._packer = compile_packer(
            self._tree, self._list_nodes,
            distinct_marker=_DISTINCT, repeated_marker=_REPEATED, walk=self._pack_node,
            whole=self._pack_whole, distinct=self._pack_distinct, digits=digits_as_int)
        # The compiled walk's signatures start with this projection's own token:
        # they are in a code of their own (packcode), never equal to another's.
        self._signature_head = PlaceToken("projection")

    def keeps(self, path: Path) -> bool:
        """Whether any of the value at `path` can be in the projection: the path,
        an ancestor or a descendant of it is declared."""
        node: object = self._tree
        for part in _segments(path):
            if node.__class__ is not dict:
                return True         # an ancestor is kept whole (or as a leaf)
            if part not in node:
                return False
            node = node[part]
        return True

    def _bound_intern(self) -> Callable[[str, str], str]:
        return self._interner.bound() if self._interner is not None else _keep_as_is

    def _repeated_intern(self) -> Callable[[str, str], str]:
        return self._interner.repeated if self._interner is not None else _keep_as_is

    def __call__(self, obj: dict) -> dict:
        return self._node(obj, self._tree, self._bound_intern())

    def pack(self, obj: dict) -> tuple:
        """The projection of `obj` in packed form (k8s_http.cache.packed), made in one walk:
        `unpack(self.pack(obj)) == self(obj)`, without building the projected dicts.
        By the walk compiled for the declaration, or the generic one when the
        declaration is too deep to compile."""
        # (Written out rather than through _bound_intern and seal: this runs once
        # per object of every list and event, and the calls and the closure it
        # saves were 1,800 of ~280,000 instructions an object at start-up.)
        interner = self._interner
        if interner is None:
            intern = repeated = _keep_as_is
        else:
            intern, repeated = interner.bound(), interner.repeated
        leaves: list = []
        if self._packer is None:
            signature: list = []
            self._pack_node(obj, self._tree, intern, repeated, leaves.append, signature.append)
            return seal(signature, leaves)
        signature = [self._signature_head]
        self._packer(obj, intern, repeated, leaves.append, signature.append)
        key = tuple(signature)
        layout = LAYOUTS.find(key) or LAYOUTS.layout(
            key, len(leaves), lambda: self._shape_of(obj, len(leaves)))
        return (layout, *leaves)

    def _shape_of(self, obj: dict, leaves: int) -> object:
        """The shape of `obj`'s projection, from the generic walk's signature (for
        the layout of a compact signature seen for the first time). Its strings
        are not interned: only the structure is wanted, and a repeated string
        must not count as seen twice."""
        signature: list = []
        walked: list = []
        self._pack_node(obj, self._tree, _keep_as_is, _keep_as_is, walked.append,
                        signature.append)
        if len(walked) != leaves:       # the two walks disagree: a bug, never a wrong object
            raise AssertionError("the compiled packing walk and the generic one disagree")
        return nest(tuple(signature))

    def guarded(self, obj: dict) -> dict:
        """The projection of `obj` where reading a dropped key raises DroppedFieldRead."""
        return self._node(obj, self._tree, self._bound_intern(), guard=True)

    # ---- the walk -----------------------------------------------------------
    # `intern(s, s)` is the interner's table's setdefault (Interner.bound): one C
    # call per string, which matters at fifty-odd strings per Deployment event.

    def _node(self, value: object, tree: dict | None | str, intern, guard: bool = False,
              where: str = "") -> object:
        if tree is None:
            return self._whole(value, intern)
        if tree.__class__ is str:                    # distinct or repeated: as it is
            return value
        if isinstance(value, list):
            inner = f"{where}[]" if guard else ""
            return [self._node(item, tree, intern, guard, inner) for item in value]
        if not isinstance(value, dict):
            return self._whole(value, intern)       # unexpected shape: keep it as it is
        out = {}
        if "*" in tree:
            every = tree["*"]
            entries = [(key, item, tree.get(key, every)) for key, item in value.items()]
            dropped = []
        else:                                        # declaration order, as packing has it
            entries = [(key, value[key], sub) for key, sub in tree.items() if key in value]
            dropped = [key for key in value if key not in tree] if guard else []
        for key, item, sub in entries:
            # Leaves are handled here rather than by a call per field.
            if sub is None and (item.__class__ is str or item.__class__ is int):
                kept = intern(item, item)
            elif sub is None and not isinstance(item, (dict, list)):
                kept = item
            elif sub is None:
                kept = self._whole(item, intern)
            elif sub.__class__ is str:               # distinct or repeated: as it is
                kept = item
            else:
                # The path text only matters to a guarded projection's error messages.
                inner = (f"{where}.{key}" if where else key) if guard else ""
                kept = self._node(item, sub, intern, guard, inner)
            out[intern(key, key) if key.__class__ is str else key] = kept
        if guard and dropped:
            return _Guarded(out, dropped, where)
        return out

    # ---- the same walks, packing: leaves and signature tokens appended
    # (`leaf`, `token`: the two lists' append). Map keys are not interned here:
    # a packed object keeps no keys, its layout does.

    def _pack_node(self, value: object, tree: dict, intern, repeated, leaf, token) -> None:
        """`value` under a declared subtree (a dict: callers handle kept-whole and
        distinct and repeated ones). A declared map's keys in declaration order (as
        the compiled walk reads them), a map under "*" in its own order."""
        cls = value.__class__
        if cls is not dict and cls is not list:
            if isinstance(value, dict):
                cls = dict
            elif isinstance(value, list):
                cls = list
            else:                                    # unexpected shape: kept whole
                self._pack_whole(value, intern, leaf, token)
                return
        if cls is list:
            token(LIST)
            for item in value:
                self._pack_node(item, tree, intern, repeated, leaf, token)
            token(END)
            return
        token(MAP)
        if "*" in tree:
            every = tree["*"]
            entries = ((key, item, tree.get(key, every)) for key, item in value.items())
        else:
            entries = ((key, value[key], sub) for key, sub in tree.items() if key in value)
        for key, item, sub in entries:
            token(key)
            if sub is None:
                kind = item.__class__
                if kind is str or kind is int:
                    leaf(intern(item, item))        # a map's leaf: its key alone
                else:
                    self._pack_whole(item, intern, leaf, token)
            elif sub.__class__ is dict:
                self._pack_node(item, sub, intern, repeated, leaf, token)
            elif sub is _DISTINCT:
                self._pack_distinct(item, leaf, token)
            else:                                    # _REPEATED
                self._pack_whole(item, repeated, leaf, token)
        token(END)

    def _pack_whole(self, value: object, intern, leaf, token) -> None:
        cls = value.__class__
        if cls is dict:
            token(MAP)
            for key, item in value.items():
                token(key)
                # Leaves inline: most values kept whole are maps of strings.
                kind = item.__class__
                if kind is str or kind is int:
                    leaf(intern(item, item))        # a map's leaf: its key alone
                elif kind is dict or kind is list or isinstance(item, str):
                    self._pack_whole(item, intern, leaf, token)
                else:
                    leaf(item)
            token(END)
        elif cls is list:
            token(LIST)
            for item in value:
                self._pack_whole(item, intern, leaf, token)
            token(END)
        else:
            leaf(intern(value, value) if isinstance(value, str) or cls is int else value)
            token(LEAF)

    def _pack_distinct(self, value: object, leaf, token) -> None:
        """A value under a `distinct` path: never shared; digits as an int."""
        if value.__class__ is str:
            number = digits_as_int(value)
            leaf(value if number is None else number)
            token(LEAF if number is None else DIGITS)
            return
        self._pack_whole(value, _keep_as_is, leaf, token)

    def _whole(self, value: object, intern) -> object:
        """A copy with every string interned (keys and values)."""
        cls = value.__class__
        if cls is str or cls is int:
            return intern(value, value)
        if cls is dict:
            whole = self._whole
            return {(intern(k, k) if k.__class__ is str else k):
                    (intern(v, v) if v.__class__ is str or v.__class__ is int else
                     whole(v, intern) if v.__class__ in (dict, list) else v)
                    for k, v in value.items()}
        if cls is list:
            return [self._whole(v, intern) for v in value]
        if isinstance(value, str):                   # a str subclass: as str would be
            return intern(value, value)
        return value


def _keep_as_is(value: str, _default: str) -> str:
    """The intern function of a Projection without an interner."""
    return value


class _Guarded(dict):
    """A projected map that remembers the keys it dropped and raises on reading them.

    Iterating it (keys, items, values, len, copy) would read the dropped keys'
    absence too, so it raises as well: code that walks a whole map must have it kept whole.
    Its truth value is the original's (non-empty), so `x.get("metadata") or {}` still works.
    """

    def __init__(self, kept: dict, dropped: list, where: str):
        super().__init__(kept)
        self._dropped = frozenset(dropped)
        self._where = where

    def _check(self, key: object) -> None:
        if key in self._dropped:
            where = f"{self._where}.{key}" if self._where else str(key)
            raise DroppedFieldRead(f"read of {where}, which the projection drops")

    def _whole(self, what: str):
        where = self._where or "the object"
        raise DroppedFieldRead(f"{what} of {where}, whose keys "
                               f"{sorted(map(str, self._dropped))} the projection drops")

    def __getitem__(self, key):
        self._check(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self._check(key)
        return super().__contains__(key)

    def __iter__(self):
        self._whole("iteration")

    def keys(self):
        self._whole("keys()")

    def items(self):
        self._whole("items()")

    def values(self):
        self._whole("values()")

    def __len__(self) -> int:
        self._whole("len()")

    def __bool__(self) -> bool:
        return True          # the object's map had keys (the dropped ones at least)

    def __reduce_ex__(self, protocol):
        self._whole("a copy")
