"""The ServiceAccount token never reaches the operator's output, even at --log-level debug.

The operator runs as its own ServiceAccount (a bound token from the
TokenRequest API, as a Pod gets), with leader election and debug logging,
through a short life: it starts, reconciles a My to Available, and stops on
SIGTERM. Its whole output (stdout and stderr) is then searched for the token
and for each of its three JWT parts.

The log formatter masks anything that looks like a token as a safety net;
this test also requires that the net caught nothing: the code must not try
to log a token in the first place.
"""

from __future__ import annotations

import signal

import pytest

from tests.e2e.operator_process import (MY, SA, SYSTEM_NS, close_fleet_and_delete_lease,
                                        install_manifests, is_available,
                                        kubeconfig_token, make_my)
from tests.support.wait import eventually

pytestmark = [pytest.mark.timeout(120), pytest.mark.mys_deleted_first]


def test_the_token_is_in_no_line_of_a_debug_run(control_plane, api, namespace, fleet, tmp_path):
    install_manifests(control_plane)
    kubeconfig = control_plane.mint_service_account_kubeconfig(SYSTEM_NS, SA,
                                                               tmp_path / "sa.kubeconfig")
    token = kubeconfig_token(kubeconfig)
    parts = token.split(".")
    assert len(parts) == 3 and all(len(p) > 16 for p in parts), "not a JWT"

    lease = f"e2e-token-{namespace[-5:]}"      # the SA may use Leases in its own namespace
    op = fleet.start("debug", kubeconfig, "--namespace", namespace, "--log-level", "debug",
                     "--leader-elect", "--leader-election-namespace", SYSTEM_NS,
                     "--leader-election-id", lease)
    try:
        op.wait_ready()
        eventually(op.is_leader, timeout=30, interval=0.2, message="never became leader")
        api.create(MY, make_my("secret-keeper", namespace))
        eventually(lambda: is_available(api, "secret-keeper", namespace), timeout=30,
                   interval=0.2, message="never Available")
        op.signal(signal.SIGTERM)
        op.expect_clean_exit(timeout=30)
    finally:
        close_fleet_and_delete_lease(fleet, api, lease)

    output = op.log()
    # The run did log its requests at debug level: there was something to leak.
    debug_lines = [r for r in op.log_records() if r.get("level") == "debug"]
    messages = [str(r.get("msg")) for r in debug_lines]
    # every kind of request the run made, each with the token on its way out
    for request in ("/leases/", "PATCH /apis/apps/v1/namespaces/", "/my/secret-keeper/status",
                    "POST /api/v1/namespaces/", "-> 200 (stream)"):     # the last: watches
        assert any(request in m for m in messages), f"no debug line for {request!r}: {messages}"
    assert op.reconcile_records()

    assert token not in output
    for i, part in enumerate(parts):
        assert part not in output, f"JWT part {i} of the token is in the output"
    assert "[REDACTED]" not in output, "the code logged a credential (the redaction net caught it)"
    assert "Bearer" not in output and "Authorization" not in output
