"""The package's shape: wings that import one way, no cycle, and the public API pinned.

`k8s_http/` is the package root (`__init__.py`, the public API) and one
sub-package per wing, lowest first in WINGS (docs/ARCHITECTURE.md). A module may
import from its own wing and from the wings below it, never from a wing above,
and the imports inside a wing have no cycle. A wing's `__init__.py` is its
docstring only. The runtime may import only the standard library, PyYAML and
prometheus-client. The `my` package (the My resource) sits on k8s_http's root and
under controller.py: controller -> my.status, my.render -> my.spec -> k8s_http.
"""

import ast
import functools
import pathlib
import subprocess
import sys

import pytest

import k8s_http

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "k8s_http"

# Lowest first: each wing may import from itself and from those before it.
WINGS = ["core", "config", "ops", "wire", "cache", "control"]
RANK = {wing: rank for rank, wing in enumerate(WINGS)}

THIRD_PARTY_ALLOWED = {"yaml", "prometheus_client"}

MY_PACKAGE = ROOT / "my"
# What each module of `my` may import of `my` (docs/ARCHITECTURE.md, "The My package").
MY_IMPORTS = {"spec": set(), "render": {"spec"}, "status": {"spec"}}

# What the pure list-watch rules may never import, even through another module.
IO_MODULES = {"socket", "ssl", "select", "selectors", "http", "urllib", "threading", "time",
              "random", "subprocess", "os", "io", "logging"}


def _modules() -> list[str]:
    """Every module of every wing, as "wing.module"."""
    return sorted(f"{p.parent.name}.{p.stem}" for p in PACKAGE.glob("*/*.py")
                  if p.stem != "__init__")


def _path(module: str) -> pathlib.Path:
    return PACKAGE.joinpath(*module.split(".")).with_suffix(".py")


def _imports(path: pathlib.Path):
    """Every name `path` imports, absolute: relative imports resolved; a
    `from PACKAGE import name` yields PACKAGE.name when that is a module."""
    package = list(path.relative_to(ROOT).parent.parts)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            for alias in node.names:
                candidate = target + [alias.name]
                if ROOT.joinpath(*candidate).with_suffix(".py").exists():
                    yield ".".join(candidate)
                else:
                    yield ".".join(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name


@functools.cache
def _graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, both as "wing.module"."""
    graph = {}
    for module in _modules():
        deps = set()
        for name in _imports(_path(module)):
            parts = name.split(".")
            if parts[0] == "k8s_http":
                deps.add(".".join(parts[1:3]))         # "" for the root, "wing" for a wing
        graph[module] = deps
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports that point from a wing to a higher one, or at the package
    root, a wing's __init__ or a module that is in no wing."""
    bad = []
    for module, deps in sorted(graph.items()):
        wing = module.split(".")[0]
        for dep in sorted(deps):
            dep_wing, _, dep_module = dep.partition(".")
            if not dep_module or dep_wing not in RANK:
                bad.append(f"{module} imports k8s_http.{dep}".rstrip("."))
            elif RANK[dep_wing] > RANK[wing]:
                bad.append(f"{module} ({wing}) imports {dep} ({dep_wing}, higher)")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among the modules of each wing (one per strongly
    connected group, as a path that closes on its first module)."""
    found, done = [], set()
    for start in sorted(graph):
        stack, on_path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            module, deps = stack[-1]
            dep = next(deps, None)
            if dep is None:
                stack.pop(); on_path.pop(); done.add(module)
            elif dep.split(".")[0] != module.split(".")[0] or dep not in graph or dep in done:
                continue                               # other wings: upward_imports' business
            elif dep in on_path:
                cycle = on_path[on_path.index(dep):] + [dep]
                if not any(set(cycle) == set(c) for c in found):
                    found.append(cycle)
            else:
                stack.append((dep, iter(sorted(graph[dep])))); on_path.append(dep)
    return found


def test_the_package_root_is_the_api_and_the_wings():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"put these modules in a wing (WINGS, docs/ARCHITECTURE.md): {loose}"
    wings = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert wings == sorted(WINGS)


@pytest.mark.parametrize("wing", WINGS)
def test_a_wing_init_is_its_docstring_only(wing):
    tree = ast.parse((PACKAGE / wing / "__init__.py").read_text())
    assert ast.get_docstring(tree), f"say what the {wing} wing is for"
    assert len(tree.body) == 1, f"k8s_http/{wing}/__init__.py holds more than its docstring"


@pytest.mark.parametrize("module", _modules())
def test_imports_point_down(module):
    assert upward_imports({module: _graph()[module]}) == []
    for name in _imports(_path(module)):
        top = name.split(".")[0]
        if top != "k8s_http":
            assert top in sys.stdlib_module_names or top in THIRD_PARTY_ALLOWED, \
                f"{module} imports third-party {top}"


@pytest.mark.parametrize("wing", WINGS)
def test_no_import_cycle_in_a_wing(wing):
    graph = {m: deps for m, deps in _graph().items() if m.startswith(wing + ".")}
    assert cycles(graph) == []


def test_the_checks_find_an_upward_import_and_a_cycle():
    graph = {"core.objects": {"core.errors"}, "core.errors": {"core.names"},
             "core.names": {"core.objects"},                  # a cycle of three
             "wire.client": {"core.objects", "cache.store"},  # wire -> cache: up
             "cache.store": {"cache.store", "", "cache"},     # itself; the root; a wing
             "ops.log": {"gone.module"}}                      # in no wing
    assert upward_imports(graph) == [
        "cache.store imports k8s_http", "cache.store imports k8s_http.cache",
        "ops.log imports k8s_http.gone.module",
        "wire.client (wire) imports cache.store (cache, higher)"]
    assert cycles(graph) == [["cache.store", "cache.store"],
                             ["core.errors", "core.names", "core.objects", "core.errors"]]


def io_imports(start: str) -> set[str]:
    """The I/O modules of IO_MODULES that `start` imports, itself or through
    the package modules it imports."""
    seen, todo, stdlib = set(), [start], set()
    while todo:
        module = todo.pop()
        seen.add(module)
        for name in _imports(_path(module)):
            parts = name.split(".")
            if parts[0] == "k8s_http":
                dep = ".".join(parts[1:3])
                if dep not in seen:
                    todo.append(dep)
            else:
                stdlib.add(parts[0])
    return stdlib & IO_MODULES


def test_the_list_watch_rules_do_no_io():
    """cache/watchstep.py is pure: nothing it imports, however indirectly, does I/O."""
    assert io_imports("cache.watchstep") == set()
    assert io_imports("cache.watcher") >= {"threading", "time", "socket"}   # the check sees


def test_architecture_module_map_matches_the_folder():
    """docs/ARCHITECTURE.md's module map (one row per module, under its wing) and
    the folder are changed together."""
    rows = []
    for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in RANK and cells[1].startswith("`"):
            rows.append((cells[0], cells[1].strip("`")))
    assert sorted(f"{wing}/{name}" for wing, name in rows) == \
        sorted(m.replace(".", "/") + ".py" for m in _modules())
    assert list(dict.fromkeys(wing for wing, _ in rows)) == WINGS, "one block per wing, lowest first"


def test_controller_imports_only_the_package_root_and_my():
    for name in _imports(ROOT / "controller.py"):
        top = name.split(".")[0]
        if top == "k8s_http":
            assert name == "k8s_http", f"controller.py imports {name}; use the package root"
        elif top == "my":
            assert name.removeprefix("my.") in MY_IMPORTS, f"controller.py imports {name}"
        else:
            assert top in sys.stdlib_module_names or top in THIRD_PARTY_ALLOWED, top


def test_every_my_module_has_its_imports_declared():
    modules = {p.stem for p in MY_PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(MY_IMPORTS), "add the module to MY_IMPORTS and docs/ARCHITECTURE.md"
    assert list(_imports(MY_PACKAGE / "__init__.py")) == [], "my/__init__.py re-exports nothing"


@pytest.mark.parametrize("stem", sorted(MY_IMPORTS))
def test_my_imports_point_one_way(stem):
    """Only k8s_http's root, the `my` modules below it, the standard library; never
    controller (nothing in `my` knows the reconciler)."""
    for name in _imports(MY_PACKAGE / f"{stem}.py"):
        top = name.split(".")[0]
        if top == "k8s_http":
            assert name == "k8s_http", f"my/{stem}.py imports {name}; use the package root"
        elif top == "my":
            assert name.removeprefix("my.") in MY_IMPORTS[stem], f"my/{stem}.py imports {name}"
        else:
            assert top in sys.stdlib_module_names or top in THIRD_PARTY_ALLOWED, \
                f"my/{stem}.py imports {top}"


def test_public_api_is_pinned():
    assert sorted(k8s_http.__all__) == sorted(EXPECTED_API)
    for name in k8s_http.__all__:
        assert hasattr(k8s_http, name), name


def test_import_pulls_in_no_third_party_http_library_and_has_no_side_effects():
    code = ("import sys, threading, logging; import k8s_http, controller; "
            "bad = [m for m in ('requests', 'urllib3', 'aiohttp', 'httpx', 'kubernetes') "
            "if m in sys.modules]; "
            "assert not bad, bad; "
            "assert threading.active_count() == 1, threading.enumerate(); "
            "assert not logging.getLogger().handlers; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr


EXPECTED_API = [
    # running controllers
    "Manager", "Result", "TerminalError", "ObjectKey", "Resource", "Store", "queued_seconds",
    "current_work",
    # reconcile policies: hold a status for an answer on its way, skip what is
    # settled, remember renders per generation, read-your-writes
    "StatusHold", "SettledVersions", "GenerationMemo", "write_through",
    # workloads
    "pod_problem", "PodCheckSchedule",
    # talking to the apiserver
    "ApiClient", "load_config", "ClusterConfig", "ConfigError", "WatchEvent",
    # errors
    "ApiError", "BadRequestError", "UnauthorizedError", "ForbiddenError", "NotFoundError",
    "ConflictError", "AlreadyExistsError", "GoneError", "InvalidError",
    "TooManyRequestsError", "ServerError", "RedirectError", "TransportError",
    "ApiConnectionError", "ApiTimeoutError", "ProtocolError", "NotLeaderError",
    "K8sHttpError", "has_status_cause", "is_namespace_terminating",
    # resources
    "CONFIGMAPS", "SERVICES", "EVENTS", "NAMESPACES", "PODS", "SECRETS", "SERVICEACCOUNTS",
    "DEPLOYMENTS", "REPLICASETS", "LEASES", "CRDS",
    # object helpers
    "key_of", "controller_of", "is_controlled_by", "owner_reference", "get_condition",
    "set_condition", "has_finalizer", "add_finalizer", "remove_finalizer",
    "strip_managed_fields", "rfc3339_now", "meta_of", "resource_version_of",
    "awaits_reconcile", "AWAITS_RECONCILE_READS",
    # quantities, and whether a server-side apply would change an object
    "parse_quantity", "same_quantity", "needs_apply", "port_key", "with_config_hash",
    "slot_of", "slot_label_value",
    "config_hash",
    # the apiserver's name rules
    "is_dns1123_label", "is_dns1123_subdomain", "is_dns1035_label", "is_env_var_name",
    "is_resource_name",
    # what a cache keeps
    "Projection", "DroppedFieldRead",
    # logging and events
    "setup_logging", "EventRecorder",
    # command line: the standard manager flags
    "new_parser", "add_manager_flags", "manager_options", "parse_duration", "positive_int",
    "with_flag_names", "flag_error", "run_manager",
]
