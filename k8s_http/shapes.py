"""Packing by shape: straight-line code compiled for the shapes a projection's objects come in.

The compiled walk (k8s_http.packcode) packs any object: for each declared key
a lookup, a branch on the kind of value found, an append per leaf and per
signature token, then a lookup of the layout by signature; values kept whole
are walked generically. Objects of one kind in a fleet mostly have the same
shape under a projection: the same declared keys present, lists of the same
lengths, the same kinds of leaves, the values kept whole alike in structure.
`LearnedShapes`, one per projection, learns a shape once it has seen it twice
and compiles for it an extractor: code that checks that an object has exactly
that shape, at every place the projection reads, and returns its packed form
(the layout the walk made for that shape, then the leaves), or None at the
first difference. An object of no learned shape is packed by the walk, as
before. Over a recorded start-up of 30,000 `My` the walk was about a third of
the operator's CPU; with the extractors that start-up takes ~0.9x the CPU.

Why an extractor's answer equals the walk's: its checks fix everything the
walk branches on (a key there or not, a leaf's class, a list's length, a
whole value's keys in order and its leaves' classes), so on an object that
passes them the walk appends the same leaves in the same order, in the
layout it made for the object the shape was learned from (same shape, same
compact signature, same layout). `Projection` learns a shape only when its
extractor's leaf count is the walk's, and tests compare the two on random objects.

A shape is made of exact classes only: dict, list, and leaves of class str,
int (interned, as the walk does), bool, float or None (kept as they are). A
value holding anything else (a subclass, an object not from JSON), a declared
map that is not a map, or a "*" map makes the object unlearnable: walked.

Invariants of the compiled source, as in packcode: it is made only of local
names, integer literals and the operators below; keys, key tuples, classes
and the layout are passed in as arguments, so no key text is ever part of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

__all__ = ["LearnedShapes", "shape_under", "compile_extractor"]

# Objects larger than this (leaves, containers and declared keys) are not
# compiled: the source stays small, and an object that large is rare.
MAX_NODES = 400
MAX_DEPTH = 24
# Shapes kept per projection, tried in turn (most recently learned first).
MAX_SHAPES = 4
# After this many objects of no learned shape, a projection learns from one in
# LEARN_EVERY only, unless learned shapes matched more often than not: objects
# that all differ in shape then cost little more than the walk.
LEARN_FREELY = 256
LEARN_EVERY = 16
_MAX_PENDING = 256           # shapes seen once, waiting for a second sighting

_INTERNED = (str, int)
_AS_IS = (bool, float, type(None))

# Shapes (hashable). Under a declaration: ("{", child shapes in declaration
# order) for a declared map, ("[", item shapes) for a declared list, ABSENT for
# a declared key that is not there, DIGITS / TEXT for a distinct string stored
# as an int / as it is, REPEATED for a repeated string, and for a value kept
# whole ("w", its shape): a leaf's class, ("{", keys, child shapes), ("[", child shapes).
ABSENT, DIGITS, TEXT, REPEATED = "absent", "digits", "text", "repeated"


class _Unlearnable(Exception):
    pass


def shape_under(value: object, tree: dict, list_nodes: set[int], *, distinct_marker: object,
                repeated_marker: object, digits: Callable[[str], int | None]) -> tuple | None:
    """The shape of `value` under the compiled declaration `tree` (as packcode
    reads it); None when it cannot be learned (see the module docstring)."""
    budget = [MAX_NODES]

    def spend(depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_DEPTH:
            raise _Unlearnable

    def whole(item: object, depth: int) -> object:
        spend(depth)
        cls = item.__class__
        if cls is dict:
            return ("{", tuple(item), tuple(whole(child, depth + 1) for child in item.values()))
        if cls is list:
            return ("[", tuple(whole(child, depth + 1) for child in item))
        if cls in _INTERNED or cls in _AS_IS:
            return cls
        raise _Unlearnable

    def declared(item: object, node: dict, depth: int) -> tuple:
        spend(depth)
        if id(node) in list_nodes:
            if item.__class__ is not list:
                raise _Unlearnable
            return ("[", tuple(declared_map(each, node, depth + 1) for each in item))
        return declared_map(item, node, depth)

    def declared_map(item: object, node: dict, depth: int) -> tuple:
        if item.__class__ is not dict or "*" in node:
            raise _Unlearnable
        children = []
        for key, sub in node.items():
            spend(depth)
            child = item.get(key, _MISSING)
            if child is _MISSING:
                children.append(ABSENT)
            elif sub is None:
                children.append(("w", whole(child, depth + 1)))
            elif sub is distinct_marker:
                if child.__class__ is not str:
                    raise _Unlearnable
                children.append(TEXT if digits(child) is None else DIGITS)
            elif sub is repeated_marker:
                if child.__class__ is not str:
                    raise _Unlearnable
                children.append(REPEATED)
            else:
                children.append(declared(child, sub, depth + 1))
        return ("{", tuple(children))

    try:
        return declared(value, tree, 0)
    except (_Unlearnable, RecursionError):
        return None


def compile_extractor(shape: tuple, tree: dict, layout: object, *, distinct_marker: object,
                      repeated_marker: object, digits: Callable[[str], int | None]
                      ) -> tuple[Callable[[object, Callable, Callable], tuple | None], int]:
    """(`extract(value, intern, repeated)`, its leaf count): the packed form
    `(layout, *leaves)` of a value of exactly `shape` under `tree`, else None.
    `intern(s, s)` shares strings and integers, `repeated(s, s)` repeated strings."""
    lines: list[str] = []
    arguments: dict[str, object] = {"layout": layout, "digits": digits, "missing": _MISSING}
    leaves: list[str] = []
    counter = itertools.count()

    def name(prefix: str) -> str:
        return f"{prefix}{next(counter)}"

    def argument(value: object) -> str:
        label = name("a")
        arguments[label] = value
        return label

    def whole(var: str, node: object) -> None:
        if node.__class__ is tuple and node[0] == "{":
            lines.append(f"if {var}.__class__ is not dict or tuple({var}) != "
                         f"{argument(node[1])}: return None")
            children, source = node[2], f"{var}.values()"
        elif node.__class__ is tuple:
            lines.append(f"if {var}.__class__ is not list or len({var}) != {len(node[1])}: "
                         "return None")
            children, source = node[1], var
        else:
            lines.append(f"if {var}.__class__ is not {argument(node)}: return None")
            leaves.append(f"intern({var}, {var})" if node in _INTERNED else var)
            return
        unpack(source, children, whole)

    def unpack(source: str, children: tuple, visit: Callable) -> None:
        if not children:
            return
        parts = [name("x") for _ in children]
        lines.append(f"{', '.join(parts)}{',' if len(parts) == 1 else ''} = {source}")
        for part, child in zip(parts, children):
            visit(part, child)

    def declared(var: str, node: dict, shape: tuple) -> None:
        if shape[0] == "[":
            lines.append(f"if {var}.__class__ is not list or len({var}) != {len(shape[1])}: "
                         "return None")
            unpack(var, shape[1], lambda part, item: declared_map(part, node, item))
        else:
            declared_map(var, node, shape)

    def declared_map(var: str, node: dict, shape: tuple) -> None:
        lines.append(f"if {var}.__class__ is not dict: return None")
        getter = name("g")
        lines.append(f"{getter} = {var}.get")
        for (key, sub), child in zip(node.items(), shape[1]):
            value = name("x")
            lines.append(f"{value} = {getter}({argument(key)}, missing)")
            if child == ABSENT:
                lines.append(f"if {value} is not missing: return None")
            elif sub is None:
                whole(value, child[1])
            elif child == DIGITS:
                number = name("n")
                lines.append(f"if {value}.__class__ is not str: return None")
                lines.append(f"{number} = digits({value})")
                lines.append(f"if {number} is None: return None")
                leaves.append(number)
            elif child == TEXT:
                lines.append(f"if {value}.__class__ is not str or digits({value}) is not None: "
                             "return None")
                leaves.append(value)
            elif child == REPEATED:
                lines.append(f"if {value}.__class__ is not str: return None")
                leaves.append(f"repeated({value}, {value})")
            else:
                declared(value, sub, child)

    declared("value", tree, shape)
    text = "\n".join([f"def make({', '.join(arguments)}):",
                      "  def extract(value, intern, repeated):",
                      *("    " + line for line in lines),
                      f"    return (layout, {', '.join(leaves)})",
                      "  return extract"])
    namespace: dict = {"__builtins__": {"dict": dict, "list": list, "tuple": tuple,
                                        "len": len, "str": str}}
    exec(compile(text, "<shape extractor>", "exec"), namespace)
    return namespace["make"](**arguments), len(leaves)


class LearnedShapes:
    """The shapes learned for one projection, as extractors (most recent first).

    Shared by the watcher threads of one projection: `known` is replaced, never
    changed in place, and the counters may undercount under a race, which only
    changes when a shape is learned."""

    __slots__ = ("known", "hits", "misses", "_pending")

    def __init__(self):
        self.known: tuple[Callable, ...] = ()
        self.hits = 0           # objects packed by an extractor
        self.misses = 0         # objects packed by the walk
        self._pending: set[tuple] = set()

    def should_learn(self) -> bool:
        """Whether to look at the shape of the object that just missed (and count it)."""
        self.misses += 1
        misses = self.misses
        return misses <= LEARN_FREELY or self.hits >= misses or not misses % LEARN_EVERY

    def seen(self, shape: tuple) -> bool:
        """Note a sighting of `shape`; True on its second one (then learn it)."""
        pending = self._pending
        if shape in pending:
            pending.discard(shape)
            return True
        if len(pending) >= _MAX_PENDING:
            self._pending = pending = set()
        pending.add(shape)
        return False

    def learn(self, extract: Callable) -> None:
        self.known = (extract,) + self.known[:MAX_SHAPES - 1]


_MISSING = object()
