"""The package's one code generator: Python source written from a declaration or a
shape, compiled, and registered in linecache under a readable name.

Two kinds of function are written here: a projection's packing walk
(`compile_packer`, below) and a packed layout's builders (`compile_builder`,
`compile_fields_builder`: k8s_http.cache.packed). Each one's source is registered
in linecache as "<k8s_http generated N: kind>" (`_compile`), so a traceback
through it shows the line, and `generated_source(function)` prints it. Nothing
derived from an apiserver's data is ever part of a source: keys, key tuples,
tokens and subtrees are passed in as arguments; a source holds only local
names, integer literals and operators (tests check it).

A projection's packing walk, with a compact signature:

`Projection._pack_node`, the generic walk, visits an object against the
declaration's tree and appends, besides the kept leaves, a signature token for
every key and every leaf (k8s_http.cache.packed): ~160 appends per Deployment. The
tree is fixed when the projection is made, so most of that is known in advance:
`compile_packer(tree, ...)` writes the walk for one declaration as Python source
and compiles it. The compiled walk

  * reads each declared key with one `get` (a declared map's other keys, such
    as managedFields, are never visited), in declaration order, the order the
    generic walk uses too;
  * appends the same leaves as the generic walk, in the same order (tests hold
    them to it on random objects);
  * appends to its signature only what the declaration does not already say:
    nothing for a key that is there with the kind of value declared (a string or
    an integer for a leaf, a map for a declared map, a list for a declared
    list), a list's length, and for anything else (a key absent, a value of
    another kind) a token naming that place followed by the generic walk's
    tokens for the value.

A Deployment's signature is then ~60 entries instead of ~160 (all but ~10 of
them for the values kept whole, which the generic walk packs), and packing one takes
~16 us instead of ~20 with the per-key compiled walk this replaced (measured
offline over a dumped fleet of 3,000 Deployments).

Why the compact signature still identifies the shape: read together with the
declaration, it decides at every place what the value there was: expected
(nothing appended), a list of n items (the int n), or an exception (a token no
other place uses, then the generic walk's tokens, which are self-delimiting:
MAP ... END, LIST ... END, LEAF, DIGITS). So two objects with the same compact
signature have the same generic signature; the layout of a compact signature
is made once, from the generic walk of the first object that has it
(Projection.pack).

Invariants of the source: it is made only of local names, integer literals,
and the operators below; the declaration's keys, tokens and subtrees are
passed in as arguments (`k3`, `a3`, `t3`), so no key text of the declaration
or of an object is ever part of it.
"""

from __future__ import annotations

import itertools
import linecache
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["compile_packer", "compile_builder", "compile_fields_builder", "generated_source",
           "MAX_DEPTH", "PlaceToken", "DIGITS_SHAPE"]

# The shape of a packed DIGITS leaf (k8s_http.cache.packed): built as str(the stored int).
DIGITS_SHAPE = "digits"

# Sources kept in linecache: the newest this many (a layout table that starts
# over makes new builders; the old ones' sources go with them).
MAX_REGISTERED = 4096
_numbers = itertools.count(1)
_registered: deque[str] = deque()
_registered_lock = threading.Lock()


def _compile(text: str, kind: str, builtins: dict) -> dict:
    """Run `text` (a source written here) in a namespace of its own, with only
    `builtins`; its source registered in linecache under a readable name."""
    filename = f"<k8s_http generated {next(_numbers)}: {kind}>"
    lines = text.splitlines(keepends=True)
    with _registered_lock:
        linecache.cache[filename] = (len(text), None, lines, filename)
        _registered.append(filename)
        while len(_registered) > MAX_REGISTERED:
            linecache.cache.pop(_registered.popleft(), None)
    namespace: dict = {"__builtins__": builtins}
    exec(compile(text, filename, "exec"), namespace)
    return namespace


def generated_source(function: Callable) -> str:
    """The source a generated function was compiled from ("" once forgotten)."""
    return "".join(linecache.getlines(function.__code__.co_filename))


# ---- a packed layout's builders ----------------------------------------------


def compile_builder(shape: object, first_leaf: int = 1) -> Callable[[tuple], object] | None:
    """A function building the value of `shape` (packed's nested shape: None a
    leaf, ("{", keys, children), ("[", children), DIGITS_SHAPE) from a packed
    object whose leaves for it start at `first_leaf`; None past Python's limits."""
    keys: list = []
    return _builder_from(_source(shape, [first_leaf - 1], keys), keys, "packed layout")


def compile_fields_builder(tree: dict) -> Callable[[tuple], dict] | None:
    """A function building a dict of some fields alone (packed._fields_builder's
    tree: key -> subtree, or (first leaf, shape) where a kept value is)."""
    keys: list = []
    return _builder_from(_tree_source(tree, keys), keys, "packed fields")


def _builder_from(expression: str, keys: list, kind: str) -> Callable | None:
    """`lambda v: <expression>` over keys `k` and `s` (str). The expression holds
    only `v[i]`, `k[j]`, `s(...)`, braces, brackets, colons and commas."""
    text = f"def make(k, s):\n    def build(v):\n        return {expression}\n    return build\n"
    try:
        made = _compile(text, kind, {})
    except (RecursionError, MemoryError, SyntaxError):  # pragma: no cover - limits
        return None
    return made["make"](tuple(keys), str)


def _tree_source(tree: dict, keys: list) -> str:
    """Source building `tree` (see compile_fields_builder) from leaves `v`, keys `k`."""
    items = []
    for key, child in tree.items():
        keys.append(key)
        index = len(keys) - 1                   # before the value's own keys
        value = _tree_source(child, keys) if isinstance(child, dict) \
            else _source(child[1], [child[0] - 1], keys)
        items.append(f"k[{index}]: {value}")
    return "{" + ", ".join(items) + "}"


def _source(shape: object, leaf: list[int], keys: list) -> str:
    """Source building `shape` from leaves `v` (v[0] is the layout), keys `k`
    and `s` (str, for DIGITS leaves)."""
    if shape is None:
        leaf[0] += 1
        return f"v[{leaf[0]}]"
    if shape is DIGITS_SHAPE:
        leaf[0] += 1
        return f"s(v[{leaf[0]}])"
    if shape[0] == "{":
        items = []
        for key, child in zip(shape[1], shape[2]):
            keys.append(key)
            items.append(f"k[{len(keys) - 1}]: {_source(child, leaf, keys)}")
        return "{" + ", ".join(items) + "}"
    return "[" + ", ".join(_source(child, leaf, keys) for child in shape[1]) + "]"


# ---- a projection's packing walk -------------------------------------------------

# Declarations nested deeper than this are packed by the generic walk (Python
# limits how deeply blocks nest in one function; real declarations are ~8 deep).
MAX_DEPTH = 12

# The branches for one declared key; `x` is its value (`missing` when absent).
# {a}: the place's token for an absent key, {o}: for a value of another kind.
_KEY = """\
{prepare}if {expected}:
    leaf({kept})
elif x is missing:
    token({{a}})
else:
    token({{o}})
    {generic}"""
# Per kind of declared leaf: kept whole (strings and integers shared), distinct
# (digits kept as an int, see packed.DIGITS), repeated (Interner.repeated).
_LEAF_KEY = _KEY.format(prepare="", expected="x.__class__ is str or x.__class__ is int",
                        kept="intern(x, x)", generic="whole(x, intern, leaf, token)")
_DISTINCT_KEY = _KEY.format(prepare="n = digits(x) if x.__class__ is str else None\n",
                            expected="n is not None", kept="n",
                            generic="distinct(x, leaf, token)")
_REPEATED_KEY = _KEY.format(prepare="", expected="x.__class__ is str", kept="repeated(x, x)",
                            generic="whole(x, repeated, leaf, token)")


class PlaceToken:
    """A compact signature's token for one place of a declaration and one exception
    there (absent, of another kind); compared by identity."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


def compile_packer(tree: dict, list_nodes: set[int], *, distinct_marker: object,
                   repeated_marker: object, walk: Callable, whole: Callable,
                   distinct: Callable, digits: Callable[[str], int | None]) -> Callable | None:
    """A function `pack(value, intern, repeated, leaf, token)` appending the leaves
    `walk(value, tree, intern, repeated, leaf, token)` appends, and the compact
    signature described above.

    `tree`: a compiled declaration (key -> subtree dict, None for kept whole, or
    a marker; "*" for every key). `list_nodes`: the ids of the subtree dicts
    declared as lists ("containers[]"). `walk`, `whole(value, intern, leaf, token)`
    and `distinct(value, leaf, token)` are the generic walk's pieces; `digits` is
    packed.digits_as_int. None when the declaration is too deep to compile.
    """
    source: list[str] = []
    arguments: dict[str, object] = {}

    def argument(prefix: str, value: object) -> str:
        name = f"{prefix}{len(arguments)}"
        arguments[name] = value
        return name

    def emit(depth: int, lines: str) -> None:
        source.extend("    " * depth + line for line in lines.splitlines())

    def place(where: str) -> tuple[str, str]:
        return (argument("a", PlaceToken(f"{where} absent")),
                argument("o", PlaceToken(f"{where} other")))

    def value_under(node: dict, var: str, indent: int, level: int, where: str) -> None:
        """Code packing `var`, present, under the declared subtree `node`;
        `var` is already known not to be missing."""
        if level > MAX_DEPTH:
            raise _TooDeep
        subtree = argument("t", node)
        other = argument("o", PlaceToken(f"{where} other"))
        if id(node) in list_nodes:
            item = f"i{level}"
            item_other = argument("o", PlaceToken(f"{where}[] other"))
            emit(indent, f"if {var}.__class__ is list:")
            emit(indent + 1, f"token(len({var}))")
            emit(indent + 1, f"for {item} in {var}:")
            emit(indent + 2, f"if {item}.__class__ is dict:")
            map_under(node, item, indent + 3, level, f"{where}[]")
            emit(indent + 2, "else:")
            emit(indent + 3, f"token({item_other})")
            emit(indent + 3, f"walk({item}, {subtree}, intern, repeated, leaf, token)")
        else:
            emit(indent, f"if {var}.__class__ is dict:")
            map_under(node, var, indent + 1, level, where)
        emit(indent, "else:")
        emit(indent + 1, f"token({other})")
        emit(indent + 1, f"walk({var}, {subtree}, intern, repeated, leaf, token)")

    def map_under(node: dict, var: str, indent: int, level: int, where: str) -> None:
        """Code packing the dict `var` under the declared subtree `node`."""
        if "*" in node:
            # Every key: the generic walk, in the object's order (self-delimiting).
            emit(indent, f"walk({var}, {argument('t', node)}, intern, repeated, leaf, token)")
            return
        getter = f"g{level}"
        emit(indent, f"{getter} = {var}.get")
        for name, sub in node.items():
            key = argument("k", name)
            here = f"{where}.{name}" if where else name
            emit(indent, f"x = {getter}({key}, missing)")
            if sub is None or sub is distinct_marker or sub is repeated_marker:
                absent, other = place(here)
                text = _LEAF_KEY if sub is None else \
                    _DISTINCT_KEY if sub is distinct_marker else _REPEATED_KEY
                emit(indent, text.format(a=absent, o=other))
                continue
            if sub.__class__ is not dict:
                raise ValueError(f"unexpected subtree {sub!r}")
            absent = argument("a", PlaceToken(f"{here} absent"))
            emit(indent, "if x is missing:")
            emit(indent + 1, f"token({absent})")
            emit(indent, "else:")
            # The value is bound to a name of its level: `x` is the next key's.
            value = f"v{level}"
            emit(indent + 1, f"{value} = x")
            value_under(sub, value, indent + 1, level + 1, here)

    try:
        value_under(tree, "value", 1, 0, "")
    except _TooDeep:
        return None
    helpers = {"walk": walk, "whole": whole, "distinct": distinct, "digits": digits,
               "missing": _MISSING}
    parameters = ", ".join([*helpers, *arguments])
    text = "\n".join([f"def make({parameters}):",
                      "  def pack(value, intern, repeated, leaf, token):",
                      *("  " + line for line in source),
                      "  return pack"])
    namespace = _compile(text, "projection packer", {"dict": dict, "list": list, "str": str,
                                                      "int": int, "len": len})
    return namespace["make"](**helpers, **arguments)


# What `get` answers for an absent key (None is a value a key may hold).
_MISSING = PlaceToken("missing")


class _TooDeep(Exception):
    pass
