"""One entry point for every benchmark: `python -m bench NAME [its flags]`.

    python -m bench                      # the benchmarks, one line each
    python -m bench converge --quick     # one of them, with its own flags
    python -m bench scale --help

Run from the repository's root (or with it on PYTHONPATH): the benchmarks import
`controller`, `k8s_http` and `tests.support` from there. Each name is a module
of this package with a `main(argv) -> int`; the line shown for it is the first
paragraph of its docstring.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# NAME -> module (relative to this package), in the order `python -m bench` lists them.
BENCHMARKS = {
    "converge": "converge",
    "scale": "scale",
    "bare": "scaling.bare",
    "plane": "scaling.plane",
    "startup_replay": "startup_replay",
    "startup_list": "startup_list",
    "soak": "soak",
    "soak_alloc": "soak_alloc",
    "chaos": "chaos",
    "shards": "shards",
    "fuzz": "fuzz",
    "watch_decode": "watch_decode",
    "gil_switch": "gil_switch",
    "pipeline": "pipeline",
    "write_memory": "write_memory",
    "footprint": "footprint",
    "image_footprint": "image_footprint",
    "collect_results": "collect_results",
}


def summary(module: str) -> str:
    """The first paragraph of the module's docstring, on one line, read without importing it."""
    import ast       # here: a benchmark's child process (its memory measured) never loads it
    path = HERE.joinpath(*module.split(".")).with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    lines = ["usage: python -m bench NAME [flags]   (python -m bench NAME --help)", ""]
    lines += [f"  {name:<{width}}  {summary(module)}" for name, module in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"python -m bench: no benchmark {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    # argparse names the program after sys.argv[0]: "python -m bench NAME" in usage lines.
    sys.argv = [f"python -m bench {name}", *rest]
    module = importlib.import_module(f"{__package__ or 'bench'}.{BENCHMARKS[name]}")
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
