"""Packed objects: a cached JSON object as one flat tuple of its leaves and a shared layout.

A cache of 100,000 objects held as dicts and lists pays for every small
container (a dict is 100-360 bytes before its contents, a list ~60) and makes
the garbage collector walk millions of them. Objects of one kind mostly have
the same structure, so the structure is stored once, as a `Layout`, and each
object keeps only its leaves:

    pack({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": [1, 2]})
      == (layout, "a", "1", 1, 2)

Leaves are everything that is not a dict or a list: strings, numbers,
booleans, None (and, from a caller that is not JSON, any other object, kept as
is). The structure is written while walking as a flat signature, a tuple of
tokens, cheap to hash and compare when looking its layout up:

    MAP "metadata" MAP "name" "labels" MAP "x" END END "spec" LIST LEAF LEAF END END

A leaf that is a map's value has no token of its own: its key is followed by
the next key or END. (LEAF there is read the same way; leaves in a list and a
leaf alone need it.) Fewer tokens are fewer appends and a shorter signature
to hash, for every object of every list.

A layout turns it once into a nested shape for its builder: None for a leaf,
("{", keys, child shapes) for a dict, ("[", child shapes) for a list.

A string of decimal digits that a packer knows to be unique (a resourceVersion)
may be stored as an int, half the size, with the token DIGITS instead of LEAF
(shape `DIGITS_SHAPE`): the layout turns it back into the same string on the way out.

Invariants:
  * `unpack(pack(obj)) == obj`, with the same key order, and every dict and list
    in the answer is new: readers may edit what they get, the packed form is a
    tuple and cannot be edited;
  * layouts are shared through a bounded table (emptied when full, as the
    Interner is: objects keep the layouts they have), keyed by signature; a
    packer with a signature of its own (Projection's compiled walk, see
    k8s_http.cache.packcode) gives the shape itself the first time (`seal(..., shape_of)`);
  * a layout builds its objects with a function compiled from its shape
    (k8s_http.cache.packcode, the package's one code generator), whose source is made
    only of subscripts into the leaves and into the layout's own key tuple (no
    key text is ever part of the source). Shapes too large or too deep to
    compile are built by a recursive walk instead.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable

from .packcode import DIGITS_SHAPE, compile_builder, compile_fields_builder

__all__ = ["Layout", "pack", "pack_into", "seal", "unpack", "leaf", "is_packed", "nest",
           "same_apart_from", "digits_as_int", "MAP", "LIST", "END", "LEAF", "DIGITS"]

Shape = tuple | None


class _Token:
    """A structural token of a signature; map keys are the only other tokens."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


MAP, LIST, END, LEAF = _Token("MAP"), _Token("LIST"), _Token("END"), _Token("LEAF")
DIGITS = _Token("DIGITS")
# The shape of a DIGITS leaf (a leaf is None) is DIGITS_SHAPE: built as str(the stored int).
# At most this many digits (an int64, as etcd's revisions are): the int stays
# small and int() never meets Python's limit on digits.
_MAX_DIGITS = 18


def digits_as_int(value: str) -> int | None:
    """`value` as an int if `str(int(value)) == value` (ASCII digits, no leading
    zero, at most 18 of them), else None."""
    if (len(value) <= _MAX_DIGITS and value.isascii() and value.isdigit()
            and (value[0] != "0" or len(value) == 1)):
        return int(value)
    return None

# Compiling a builder costs ~0.1 ms and must stay well within Python's limits
# on nested expressions; larger shapes (a ConfigMap with thousands of keys, a
# deeply nested custom resource) are built by `_build_walk`.
_MAX_COMPILED_NODES = 4000
_MAX_COMPILED_DEPTH = 40


class Layout:
    """The structure shared by packed objects of one shape, and its builder."""

    __slots__ = ("shape", "leaves", "build", "_paths", "_digits", "_fields", "_getters")

    def __init__(self, shape: Shape, leaves: int):
        self.shape = shape
        self.leaves = leaves
        self.build: Callable[[tuple], object] = _builder(shape)
        self._paths: dict[tuple, int | None] = {}
        self._digits = frozenset(_digits_indices(shape))
        self._fields: dict[tuple, Callable[[tuple], dict]] = {}
        self._getters: dict[tuple, Callable[[tuple], tuple]] = {}

    def index_of(self, path: tuple[str, ...]) -> int | None:
        """Where the leaf at `path` (dict keys) is in a packed object of this layout;
        None when the path is absent or leads to a dict or list. Remembered per path."""
        try:
            return self._paths[path]
        except KeyError:
            pass
        found = _leaf_index(self.shape, path)
        self._paths[path] = found
        return found

    def fields_builder(self, only: tuple[tuple[str, ...], ...]) -> Callable[[tuple], dict]:
        """A function building, from a packed object of this layout, a new dict with
        the values at the paths `only` (dict keys) alone, nested as in the object:
        `(("metadata", "name"),)` builds `{"metadata": {"name": ...}}`. A path this
        layout lacks is left out; a path inside another one adds nothing; an empty
        path is the whole object. Compiled like `build`, once per `only`."""
        try:
            return self._fields[only]
        except KeyError:
            pass
        made = _fields_builder(self.shape, only)
        self._fields[only] = made
        return made

    def leaves_getter(self, paths: tuple[tuple[str, ...], ...]) -> Callable[[tuple], tuple]:
        """A function answering, for a packed object of this layout, the tuple of
        what `leaf(packed, path)` answers for each of `paths`, in one call: a C
        itemgetter when every path leads to a plain leaf (an object's key, read
        for every object of a relist). Made once per `paths`."""
        try:
            return self._getters[paths]
        except KeyError:
            pass
        indices = [self.index_of(path) for path in paths]
        made: Callable[[tuple], tuple]
        # (itemgetter of one index answers the item, not a tuple: two or more only.)
        if self.shape is not None and len(indices) >= 2 and all(
                index is not None and index not in self._digits for index in indices):
            made = operator.itemgetter(*indices)
        else:
            made = lambda packed: tuple(leaf(packed, path) for path in paths)  # noqa: E731
        self._getters[paths] = made
        return made

    def leaf(self, packed: tuple, index: int) -> object:
        """The leaf at `index` of `packed` as the object had it (DIGITS as the string)."""
        value = packed[index]
        return str(value) if index in self._digits else value


class _LayoutTable:
    """signature -> Layout, bounded: when full it starts over (see the module docstring)."""

    def __init__(self, max_entries: int = 1 << 14):
        self.max_entries = max_entries
        self._table: dict[tuple, Layout] = {}
        self._lock = threading.Lock()

    def find(self, signature: tuple) -> Layout | None:
        """The layout of `signature` if it has been made (and not emptied out since)."""
        return self._table.get(signature)

    def layout(self, signature: tuple, leaves: int,
               shape_of: Callable[[], Shape] | None = None) -> Layout:
        """The layout of `signature`; made on first sight from the shape the
        signature stands for (`nest`), or from `shape_of()` for a signature in
        another code (Projection's compact one, see k8s_http.cache.packcode)."""
        found = self._table.get(signature)
        if found is not None:
            return found
        made = Layout(nest(signature) if shape_of is None else shape_of(), leaves)
        with self._lock:
            if len(self._table) >= self.max_entries:
                self._table = {}
            return self._table.setdefault(signature, made)

    def __len__(self) -> int:
        return len(self._table)


LAYOUTS = _LayoutTable()


def pack_into(value: object, leaves: list, signature: list) -> None:
    """Append `value`'s leaves to `leaves` (depth first, in key order) and its
    structure's tokens to `signature`."""
    cls = value.__class__
    if cls is dict:
        signature.append(MAP)
        for key, item in value.items():
            signature.append(key)
            if item.__class__ is dict or item.__class__ is list:
                pack_into(item, leaves, signature)
            else:
                leaves.append(item)             # a map's leaf: its key alone
        signature.append(END)
    elif cls is list:
        signature.append(LIST)
        for item in value:
            pack_into(item, leaves, signature)
        signature.append(END)
    else:
        leaves.append(value)
        signature.append(LEAF)


def seal(signature: list, leaves: list, shape_of: Callable[[], Shape] | None = None) -> tuple:
    """The packed object of the structure `signature` and its `leaves` (as pack_into
    made them; `shape_of`: see _LayoutTable.layout)."""
    leaves.insert(0, LAYOUTS.layout(tuple(signature), len(leaves), shape_of))
    return tuple(leaves)


def pack(value: object) -> tuple:
    """The packed form of a JSON-like value (usually an object: a dict)."""
    leaves: list = []
    signature: list = []
    pack_into(value, leaves, signature)
    return seal(signature, leaves)


def unpack(packed: tuple) -> object:
    """A new copy of the value `packed` was made from."""
    return packed[0].build(packed)


def is_packed(value: object) -> bool:
    return value.__class__ is tuple and bool(value) and value[0].__class__ is Layout


def leaf(packed: tuple, path: tuple[str, ...]) -> object | None:
    """The leaf at `path` of a packed object without unpacking it; None if there is none."""
    if packed[0].shape is None:         # a value packed whole (see Store): walk it
        value = packed[1]
        for step in path:
            value = value.get(step) if isinstance(value, dict) else None
        return None if isinstance(value, (dict, list)) else value
    layout = packed[0]
    index = layout.index_of(path)
    return None if index is None else layout.leaf(packed, index)


def same_apart_from(a: tuple, b: tuple, path: tuple[str, ...]) -> bool:
    """Whether packed `a` and `b` hold the same value, whatever their leaf at `path`.
    Objects of different layouts count as different (an equal layout made again
    after the table started over too: the safe answer)."""
    layout = a[0]
    if b[0] is not layout:
        return False
    index = layout.index_of(path)
    if index is None:
        return a == b
    return a[1:index] == b[1:index] and a[index + 1:] == b[index + 1:]


def _node_at(shape: Shape, path: tuple[str, ...]) -> tuple[int, Shape] | None:
    """(the index of its first leaf in a packed object, the shape) of the value at
    `path`; None when the path is absent."""
    index = 1                       # packed[0] is the layout
    for step in path:
        if shape is None or shape is DIGITS_SHAPE or shape[0] != "{" or step not in shape[1]:
            return None
        position = shape[1].index(step)
        index += sum(_leaf_count(child) for child in shape[2][:position])
        shape = shape[2][position]
    return index, shape


def _leaf_index(shape: Shape, path: tuple[str, ...]) -> int | None:
    found = _node_at(shape, path)
    if found is None or not (found[1] is None or found[1] is DIGITS_SHAPE):
        return None
    return found[0]


def _digits_indices(shape: Shape) -> list[int]:
    """The indices (in a packed object) of the DIGITS leaves of `shape`."""
    found: list[int] = []
    index = 0
    todo = [shape]
    while todo:                         # depth first, in key order, as the leaves are
        node = todo.pop()
        if node is None or node is DIGITS_SHAPE:
            index += 1
            if node is DIGITS_SHAPE:
                found.append(index)
        else:
            todo.extend(reversed(node[-1]))
    return found


def _leaf_count(shape: Shape) -> int:
    if shape is None or shape is DIGITS_SHAPE:
        return 1
    return sum(_leaf_count(child) for child in (shape[2] if shape[0] == "{" else shape[1]))


def nest(signature: tuple) -> Shape:
    """The nested shape a signature stands for (iterative: any depth)."""
    root: Shape = None
    open_: list[tuple[str, list, list]] = []       # containers being read: kind, keys, children
    for token in signature:
        if open_ and len(open_[-1][1]) > len(open_[-1][2]) and (
                token is END or token.__class__ is not _Token):
            open_[-1][2].append(None)               # the key before had a leaf: no token
        if token is MAP or token is LIST:
            open_.append(("{" if token is MAP else "[", [], []))
            continue
        if token is END:
            kind, keys, children = open_.pop()
            node: Shape = ("{", tuple(keys), tuple(children)) if kind == "{" \
                else ("[", tuple(children))
        elif token is LEAF:
            node = None
        elif token is DIGITS:
            node = DIGITS_SHAPE
        else:                                       # a key of the innermost map
            open_[-1][1].append(token)
            continue
        if open_:
            open_[-1][2].append(node)
        else:
            root = node
    return root


# ---- builders -----------------------------------------------------------------


def _builder(shape: Shape, first_leaf: int = 1) -> Callable[[tuple], object]:
    """A function building the value of `shape` from a packed object whose leaves
    for it start at index `first_leaf` (1: the whole object)."""
    if _fits_compiling(shape):
        made = compile_builder(shape, first_leaf)
        if made is not None:
            return made
    return lambda packed: _build_walk(shape, iter(packed[first_leaf:]).__next__)


def _fields_builder(shape: Shape, paths: tuple[tuple[str, ...], ...]) -> Callable[[tuple], dict]:
    """See Layout.fields_builder."""
    if any(not path for path in paths):
        return _builder(shape)                  # the whole object
    if shape is None or shape is DIGITS_SHAPE or shape[0] != "{":
        return lambda packed: {}                # not an object: it has no fields
    # The fields kept, as a tree of their keys: a key maps to its subtree (a dict)
    # or to where its value is, (first leaf, shape), once a path ends there.
    tree: dict = {}
    for path in paths:
        found = _node_at(shape, path)
        if found is None:
            continue
        node = tree
        for step in path[:-1]:
            node = node.setdefault(step, {})
            if not isinstance(node, dict):    # inside a value already kept whole
                break
        else:
            node[path[-1]] = found
    kept = _kept_values(tree)
    if all(_fits_compiling(value_shape) for _, value_shape in kept) \
            and len(kept) <= _MAX_COMPILED_NODES:
        made = compile_fields_builder(tree)
        if made is not None:
            return made                         # type: ignore[return-value]
    builders = _tree_builders(tree)

    def fill(node: dict, packed: tuple) -> dict:
        return {key: fill(child, packed) if isinstance(child, dict) else child(packed)
                for key, child in node.items()}
    return lambda packed: fill(builders, packed)


def _tree_builders(tree: dict) -> dict:
    """`tree` (see _fields_builder) with each kept value's place turned into its builder."""
    return {key: _tree_builders(child) if isinstance(child, dict)
            else _builder(child[1], first_leaf=child[0]) for key, child in tree.items()}


def _kept_values(tree: dict) -> list[tuple[int, Shape]]:
    found: list[tuple[int, Shape]] = []
    for child in tree.values():
        found.extend(_kept_values(child) if isinstance(child, dict) else [child])
    return found


def _fits_compiling(shape: Shape) -> bool:
    """Whether the shape has at most _MAX_COMPILED_NODES nodes (leaves, keys and
    items) and _MAX_COMPILED_DEPTH levels. Iterative: a shape may be deeper than
    the recursion limit allows from here."""
    nodes, todo = 0, [(shape, 0)]
    while todo:
        node, depth = todo.pop()
        nodes += 1
        if nodes > _MAX_COMPILED_NODES or depth > _MAX_COMPILED_DEPTH:
            return False
        if node is not None and node is not DIGITS_SHAPE:
            todo.extend((child, depth + 1) for child in node[-1])
    return True


def _build_walk(shape: Shape, next_leaf: Callable[[], object]) -> object:
    if shape is None:
        return next_leaf()
    if shape is DIGITS_SHAPE:
        return str(next_leaf())
    if shape[0] == "{":
        return {key: _build_walk(child, next_leaf) for key, child in zip(shape[1], shape[2])}
    return [_build_walk(child, next_leaf) for child in shape[1]]
