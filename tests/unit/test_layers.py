"""The package's shape: dependencies point one way, and the public API is pinned.

A module may import only from layers strictly below its own (docs/ARCHITECTURE.md).
The runtime may import only the standard library, PyYAML and prometheus-client.
The `my` package (the My resource) sits on k8s_http's root and under controller.py:
controller -> my.status, my.render -> my.spec -> k8s_http.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

import k8s_http

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "k8s_http"

LAYERS = {
    "errors": 0, "objects": 0, "defaults": 0, "quantity": 0, "names": 0, "podstatus": 0, "statushold": 0, "packcode": 0, "packed": 1, "allocator": 0, "gctuning": 0,
    "shards": 0,
    "projection": 2, "applydiff": 1, "settled": 1, "memo": 1, "configerror": 1, "connection": 1, "watchproto": 1, "backoff": 1, "metrics": 1, "log": 1,
    "credentials": 2, "tls": 2, "urls": 2, "stream": 2, "flags": 2,
    "kubeconfig": 3,
    "config": 4,
    "transport": 5,
    "client": 6, "store": 6, "workqueue": 6,
    "watcher": 7, "leader": 7, "runner": 7, "events": 7, "authn": 7,
    "informer": 8, "probes": 8, "writethrough": 8,
    "deletionwatch": 9,
    "manager": 10,
    "cli": 11,
}

THIRD_PARTY_ALLOWED = {"yaml", "prometheus_client"}

MY_PACKAGE = ROOT / "my"
# What each module of `my` may import of `my` (docs/ARCHITECTURE.md, "The My package").
MY_IMPORTS = {"spec": set(), "render": {"spec"}, "status": {"spec"}}


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y / from . import x
                if node.module:
                    yield "k8s_http." + node.module.split(".")[0]
                else:
                    for alias in node.names:
                        yield "k8s_http." + alias.name
            elif node.module:
                yield node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name


def _modules():
    return sorted(p for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def test_every_module_has_a_layer():
    unknown = [p.stem for p in _modules() if p.stem not in LAYERS]
    assert not unknown, f"add these modules to LAYERS and docs/ARCHITECTURE.md: {unknown}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.stem)
def test_imports_point_down(path):
    mine = LAYERS[path.stem]
    for name in _imports(path):
        top = name.split(".")[0]
        if top == "k8s_http":
            dep = name.split(".")[1] if "." in name else "__init__"
            assert dep != "__init__", f"{path.stem} imports the package root"
            assert LAYERS[dep] < mine, f"{path.stem} (layer {mine}) imports {dep} (layer {LAYERS[dep]})"
        else:
            assert top in sys.stdlib_module_names or top in THIRD_PARTY_ALLOWED, \
                f"{path.stem} imports third-party {top}"


def test_architecture_table_matches_layers():
    """docs/ARCHITECTURE.md's layer table and LAYERS are changed together."""
    rows = {}
    for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit() and cells[1].startswith("`"):
            rows[cells[1].strip("`").removesuffix(".py")] = int(cells[0])
    assert rows == LAYERS


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
    # quantities, and whether a server-side apply would change an object
    "parse_quantity", "same_quantity", "needs_apply", "port_key", "with_config_hash",
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
