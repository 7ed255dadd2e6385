"""`--version` and `make help` (the two small promises of issue 14), and configuration
errors that name the flags the user has (the library names its arguments)."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

import controller
from k8s_http import __version__

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_prints_the_package_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        controller.build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(rf"my-controller {re.escape(__version__)} \(Python \d+\.\d+\.\d+\S*\)",
                        out), out
    # the same version as the package metadata (setup.cfg) and the build-info metric
    assert f"version = {__version__}" in (ROOT / "setup.cfg").read_text()


def test_version_is_documented_in_help():
    assert "--version" in controller.build_parser().format_help()



def test_make_help_prints_dollar_signs_once():
    out = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "demo" in out and "$KUBECONFIG" in out
    assert "$$" not in out, out


def test_a_configuration_error_names_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(controller, "setup_logging", lambda *a, **k: None)
    rc = controller.main(["--kubeconfig", str(tmp_path / "missing")])
    assert rc == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("my-controller: error: kubeconfig ") and "not found" in line
    assert line.endswith("check the path (--kubeconfig or $KUBECONFIG)"), line
