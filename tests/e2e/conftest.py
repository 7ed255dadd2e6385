"""Fixtures for tests against a real etcd + kube-apiserver + kube-controller-manager,
with kube-scheduler and kwok running Pods on 3 fake Nodes.

    control_plane     session: attaches to the plane `make cluster` runs (state in
                      $MY_CONTROLLER_CLUSTER_DIR or .cluster/) if one is serving,
                      else starts a private one for the session and stops it after
    admin_kubeconfig  path of a system:masters client-cert kubeconfig
    api               an ApiClient built from it, the way users build one
    namespace         a fresh namespace per test, deleted afterwards; in a test marked
                      `mys_deleted_first`, its Mys are deleted (and their children
                      collected) before it goes

Every test under tests/e2e is marked `e2e`. Missing binaries are built before
the first test (progress shown), outside any per-test timeout; if they cannot
be had, every e2e test errors with the reason. Never skipped: a skip would hide
the missing coverage from CI.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from tests.support.controlplane import ControlPlane, ControlPlaneError, default_state_dir, \
    find_binaries

_E2E_DIR = Path(__file__).resolve().parent

# Set by pytest_collection_finish, read by the control_plane fixture.
_binaries_error: str | None = None
_session_plane: ControlPlane | None = None


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "mys_deleted_first: the test's namespace is emptied of Mys (their children "
        "collected) before it is deleted")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # A conftest hook sees the whole session's items: mark only ours.
    for item in items:
        if _E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session):
    """Find or build the binaries now, so a cold build (20-40 min) is not cut by
    the per-test timeout and its progress reaches the terminal."""
    global _binaries_error
    if not any(item.get_closest_marker("e2e") for item in session.items):
        return
    if ControlPlane.attach(default_state_dir()) is not None:
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    try:
        if capture is not None:
            with capture.global_and_fixture_disabled():
                find_binaries(need_pods=True)
        else:
            find_binaries(need_pods=True)
    except ControlPlaneError as exc:
        _binaries_error = str(exc)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("e2e") and _session_plane is not None:
        # Keep the logs of a session that failed, and say where they are.
        _session_plane.keep_logs = True
        report.sections.append(("control plane", _session_plane.describe_failure()))


@pytest.fixture(scope="session")
def control_plane():
    global _session_plane
    if _binaries_error:
        pytest.fail(f"no control plane for the e2e tests: {_binaries_error}", pytrace=False)
    attached = ControlPlane.attach(default_state_dir())
    if attached is not None:
        _session_plane = attached
        yield attached
        return
    plane = ControlPlane()
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    _session_plane = plane
    try:
        yield plane
    finally:
        _session_plane = None
        plane.stop()


@pytest.fixture(scope="session")
def admin_kubeconfig(control_plane) -> str:
    return str(control_plane.admin_kubeconfig)


@pytest.fixture
def api(admin_kubeconfig):
    from k8s_http.wire.client import ApiClient
    from k8s_http.config.cluster import load_config

    client = ApiClient.from_config(load_config(admin_kubeconfig))
    try:
        yield client
    finally:
        client.transport.close()


@pytest.fixture
def namespace(api, request) -> str:
    """A namespace of its own for each test, named after it (deletion is not awaited)."""
    from k8s_http.core.errors import NotFoundError
    from k8s_http.core.objects import NAMESPACES

    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    name = f"e2e-{slug[:40].rstrip('-')}-{uuid.uuid4().hex[:5]}"
    api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": name, "labels": {"e2e.my-controller/test": "1"}}})
    try:
        yield name
        if request.node.get_closest_marker("mys_deleted_first"):
            # A namespace deletion removes Deployments and Mys in no particular
            # order: an operator still running would put a child back and be
            # refused (403) by the terminating namespace. Real and handled, but
            # noise in a test that counts writes, 403s or log lines.
            from tests.e2e.operator_process import delete_mys_and_wait

            delete_mys_and_wait(api, name)
    finally:
        try:
            api.delete(NAMESPACES, name)
        except NotFoundError:
            pass


@pytest.fixture
def fleet(tmp_path):
    """Operator processes started by a test, all killed when it ends (pass or fail)."""
    from tests.e2e.operator_process import Fleet

    fleet = Fleet(tmp_path)
    try:
        yield fleet
    finally:
        fleet.close()

