"""k8s_http.ops.cli: one-line errors, and a failed bind as a flag error."""

from __future__ import annotations

import errno

import pytest

from k8s_http import flag_error, run_manager


class Manager:
    def __init__(self, error=None, code=0):
        self.error, self.code, self.stopped = error, code, 0

    def run(self):
        if self.error is not None:
            raise self.error
        return self.code

    def stop(self):
        self.stopped += 1
        raise RuntimeError("stop may fail; the bind error is the one reported")


def test_flag_error_is_one_line_and_exit_2(capsys):
    assert flag_error("app", "bad\n  value\tthere") == 2
    assert capsys.readouterr().err == "app: error: bad value there\n"


def test_run_manager_returns_the_managers_exit_code():
    assert run_manager(Manager(code=3), "app") == 3


@pytest.mark.parametrize("code", [errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES])
def test_a_failed_bind_is_a_flag_error(capsys, code):
    mgr = Manager(OSError(code, "cannot listen on ':8080': Address already in use"))
    assert run_manager(mgr, "app") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("app: error: cannot listen on ':8080'")
    assert "--metrics-bind-address" in err and "--health-probe-bind-address" in err
    assert mgr.stopped == 1


def test_other_os_errors_go_on():
    with pytest.raises(OSError):
        run_manager(Manager(OSError(errno.ENOENT, "no such file")), "app")
