"""The docs stand on their own: what docs/ARCHITECTURE.md names exists, every
document the code and the docs cite is in the repository, and no path of one
machine is cited."""

import ast
import builtins
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "k8s_http"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
MY_PACKAGE = ROOT / "my"
SOURCES = sorted(PACKAGE.rglob("*.py")) + sorted(MY_PACKAGE.glob("*.py")) + [ROOT / "controller.py"]

# `name`, `name(...)`, `module.name`, `Class.name(...)` in backticks.
_SYMBOL = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)(\(|`)")


def _defined() -> tuple[dict[str, set[str]], set[str]]:
    """Per module (and class) the names it defines; and every name defined anywhere."""
    scopes: dict[str, set[str]] = {}
    everywhere: set[str] = set()
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        names = scopes.setdefault(path.stem, set())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                everywhere.add(node.name)
                if isinstance(node, ast.ClassDef):
                    members = scopes.setdefault(node.name, set())
                    for item in ast.walk(node):
                        if isinstance(item, (ast.FunctionDef, ast.ClassDef)):
                            members.add(item.name)
                        elif isinstance(item, (ast.Attribute, ast.Name)):
                            members.add(item.attr if isinstance(item, ast.Attribute) else item.id)
                        elif isinstance(item, ast.arg):
                            members.add(item.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                everywhere.add(node.id)
            elif isinstance(node, ast.alias):
                everywhere.add(node.asname or node.name.split(".")[-1])
            elif isinstance(node, ast.arg):
                everywhere.add(node.arg)            # a callable argument: `notify(owner)`
        for node in tree.body:
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                    names.add(item.id)
                elif isinstance(item, ast.alias):
                    names.add(item.asname or item.name.split(".")[-1])
    return scopes, everywhere


def missing_symbols(text: str) -> list[str]:
    """The backticked modules and public functions of `text` that do not exist."""
    scopes, everywhere = _defined()
    everywhere |= set(dir(builtins))
    missing = []
    # `store.py` (a module of some wing, or of the root), `cache/store.py` (exactly
    # there in k8s_http), `my/spec.py` (exactly there in the repository)
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    modules |= {p.relative_to(ROOT).as_posix() for p in MY_PACKAGE.glob("*.py")}
    modules |= {p.name for p in PACKAGE.rglob("*.py")} | {p.name for p in ROOT.glob("*.py")}
    for module in re.findall(r"`([a-z_]+(?:/[a-z_]+)?)\.py`", text):
        if f"{module}.py" not in modules:
            missing.append(f"{module}.py")
    for symbol, after in _SYMBOL.findall(text):
        owner, _, name = symbol.rpartition(".")
        if name == "py":
            continue                            # a module, checked above
        if owner:
            if owner in scopes and name not in scopes[owner]:
                missing.append(symbol)
        elif after == "(" and name not in everywhere:
            missing.append(symbol)
    return missing


def test_architecture_names_only_modules_and_functions_that_exist():
    assert missing_symbols(ARCHITECTURE.read_text()) == []


def test_the_check_finds_a_name_that_does_not_exist():
    text = ("`store.py`, `Store.get(key)`, `record_write(...)`, `gone.py`, "
            "`Store.record_write`, `packcode.compile_packer`, `packcode.nothing`, "
            "`my/spec.py`, `my/store.py`, `render.foreign_entries_patch`, `render.nothing`, "
            "`cache/store.py`, `wire/store.py`")
    assert missing_symbols(text) == ["gone.py", "my/store.py", "wire/store.py", "record_write",
                                     "Store.record_write", "packcode.nothing", "render.nothing"]


def test_every_document_cited_is_in_the_repository():
    cited = set()
    for path in SOURCES + sorted((ROOT / "docs").glob("*.md")):
        for name in re.findall(r"(?<![\w/.-])((?:docs/)?[A-Z][A-Z_]*\.md)\b", path.read_text()):
            cited.add((path.name, name))
    absent = [(source, name) for source, name in sorted(cited)
              if not (ROOT / name).exists() and not (ROOT / "docs" / name).exists()]
    assert absent == []


def test_no_path_of_one_machine_is_cited():
    for path in SOURCES + sorted((ROOT / "docs").glob("*.md")):
        found = re.findall(r"/(?:work|home|Users|root)/[\w.-]+/", path.read_text())
        assert found == [], (path.name, found)
