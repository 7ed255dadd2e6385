"""A projection's packing walk compiled from its declaration: one function per Projection.

`Projection.pack` walks an object against the declaration's tree: at each map
it looks every key up, tests what kind of subtree it found, and calls itself
for each map and list below. The tree is fixed when the projection is made, so
those decisions can be made once instead: `compile_packer(tree, ...)` writes
the walk as Python source, one nested loop per declared map (and per declared
list of maps), with each key's handling chosen by a small integer from one dict
lookup, and compiles it: ~10 % less CPU to pack a Deployment (offline, on a dumped fleet).

The compiled walk must be exactly the generic one (tests compare them on
random objects): it appends the same leaves and the same signature tokens in
the same order. Anything it does not expect (a list where a map was declared,
a map where a list was, a dict subclass) it hands to the generic walk for that
value, which is what the generic walk would have done there.

Invariants of the source: it is made only of local names, integer literals,
subscripts into the constant tuples it is given, and the operators below; no
key text of the declaration or of an object is ever part of it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["compile_packer"]

# What a key's declared subtree asks for (the dispatch value of the generated walk).
_WHOLE, _DISTINCT, _REPEATED = 0, 1, 2       # a map or list subtree: 3 and up

# The loop over a map's keys; the branches for the keys' subtrees follow it
# (`elif case == 3:` ...), then `token(END)`. Cases as _WHOLE, _DISTINCT, _REPEATED.
_MAP_LOOP = """\
token(MAP)
{lookup} = {table}
for {key}, {item} in {var}.items():
    case = {lookup}({key}{default})
    if case is None:
        continue
    token({key})
    if case == 0:
        if {item}.__class__ is str or {item}.__class__ is int:
            leaf(intern({item}, {item}))
            token(LEAF)
        else:
            whole({item}, intern, leaf, token)
    elif case == 1:
        distinct({item}, leaf, token)
    elif case == 2:
        whole({item}, repeated, leaf, token)"""

# Declarations nested deeper than this are packed by the generic walk (Python
# limits how deeply blocks nest in one function; real declarations are ~8 deep).
MAX_DEPTH = 12


def compile_packer(tree: dict, list_nodes: set[int], *, distinct_marker: object,
                   repeated_marker: object, tokens: tuple, walk: Callable,
                   whole: Callable, distinct: Callable) -> Callable | None:
    """A function `pack(value, intern, repeated, leaf, token)` doing what
    `walk(value, tree, intern, leaf, token)` does for a value under `tree` (a
    compiled declaration: key -> subtree dict, None for kept whole, or a marker).

    `list_nodes`: the ids of the subtree dicts declared as lists ("containers[]").
    `tokens`: (MAP, LIST, END, LEAF). `walk`, `whole(value, intern, leaf, token)` and
    `distinct(value, leaf, token)` are the generic walk's pieces, for what the
    compiled one hands over. None when the declaration is too deep to compile.
    """
    source: list[str] = []
    constants: list = []                     # dispatch tables and subtrees, as c[i]

    def constant(value: object) -> int:
        constants.append(value)
        return len(constants) - 1

    def emit(depth: int, lines: str) -> None:
        source.extend("    " * depth + line for line in lines.splitlines())

    def value_under(node: dict, var: str, indent: int, level: int) -> None:
        """Code packing `var`, a value under the declared subtree `node`."""
        if level > MAX_DEPTH:
            raise _TooDeep
        here = constant(node)
        if id(node) in list_nodes:
            item = f"i{level}"
            emit(indent, f"if {var}.__class__ is list:")
            emit(indent + 1, "token(LIST)")
            emit(indent + 1, f"for {item} in {var}:")
            emit(indent + 2, f"if {item}.__class__ is dict:")
            map_under(node, item, indent + 3, level)
            emit(indent + 2, "else:")
            emit(indent + 3, f"walk({item}, c[{here}], intern, leaf, token)")
            emit(indent + 1, "token(END)")
        else:
            emit(indent, f"if {var}.__class__ is dict:")
            map_under(node, var, indent + 1, level)
        emit(indent, "else:")
        emit(indent + 1, f"walk({var}, c[{here}], intern, leaf, token)")

    def map_under(node: dict, var: str, indent: int, level: int) -> None:
        """Code packing the dict `var` under the declared subtree `node`."""
        key, item = f"k{level}", f"v{level}"
        cases: dict[str, int] = {}
        subtrees: list[dict] = []
        for name, sub in node.items():
            if sub is None:
                cases[name] = _WHOLE
            elif sub is distinct_marker:
                cases[name] = _DISTINCT
            elif sub is repeated_marker:
                cases[name] = _REPEATED
            else:
                if sub.__class__ is not dict:
                    raise ValueError(f"unexpected subtree {sub!r}")
                subtrees.append(sub)
                cases[name] = 2 + len(subtrees)
        every = cases.pop("*", None)
        lookup = constant(cases.get)
        emit(indent, _MAP_LOOP.format(
            key=key, item=item, var=var, lookup=f"d{level}", table=f"c[{lookup}]",
            default="" if every is None else f", {every}"))
        for number, sub in enumerate(subtrees, start=3):
            emit(indent + 1, f"elif case == {number}:")
            value_under(sub, item, indent + 2, level + 1)
        emit(indent, "token(END)")

    try:
        value_under(tree, "value", 1, 0)
    except _TooDeep:
        return None
    text = "\n".join(["def make(c, walk, whole, distinct, MAP, LIST, END, LEAF):",
                      "  def pack(value, intern, repeated, leaf, token):",
                      *("  " + line for line in source),
                      "  return pack"])
    namespace: dict = {"__builtins__": {"dict": dict, "list": list, "str": str, "int": int}}
    exec(compile(text, "<projection packer>", "exec"), namespace)
    return namespace["make"](tuple(constants), walk, whole, distinct, *tokens)


class _TooDeep(Exception):
    pass
