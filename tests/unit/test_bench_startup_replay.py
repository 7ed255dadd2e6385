"""bench/startup_replay.py over a small synthetic recording: both sides read every
event, ours caches every object, and a recording cut before the end bookmark is
refused rather than timed. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import startup_replay
from my.render import render_deployment, render_service

ROOT = Path(__file__).resolve().parents[2]

END = {"type": "BOOKMARK", "object": {"kind": "My", "apiVersion": "mine.jp/v1", "metadata": {
    "resourceVersion": "900", "annotations": {"k8s.io/initial-events-end": "true"}}}}


def _line(obj: dict) -> bytes:
    return json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"


def _recordings(n: int, *, end: bool = True) -> dict[str, bytes]:
    lines: dict[str, list[bytes]] = {"my": [], "deployments": [], "services": []}
    for i in range(n):
        my = {"apiVersion": "mine.jp/v1", "kind": "My", "metadata": {
            "name": f"m{i}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": str(10 + i),
            "generation": 1, "managedFields": [{"manager": "x"}]},
            "spec": {"image": "app:1", "replicas": 1}}
        owner = {"apiVersion": "mine.jp/v1", "kind": "My", "name": f"m{i}", "uid": f"u{i}",
                 "controller": True, "blockOwnerDeletion": True}
        deployment = render_deployment(my)
        service = render_service(my)
        for child in (deployment, service):
            child["metadata"].update(namespace="ns", resourceVersion=str(500 + i),
                                     ownerReferences=[owner])
        lines["my"].append(_line(my))
        lines["deployments"].append(_line(deployment))
        lines["services"].append(_line(service))
    if end:
        for each in lines.values():
            each.append(json.dumps(END).encode() + b"\n")
    return {plural: b"".join(each) for plural, each in lines.items()}


def test_both_sides_read_every_event_and_ours_caches_every_object():
    result = startup_replay.replay(_recordings(40), rounds=2, log=lambda line: None)
    assert result["bare_events"] == 3 * 41            # objects and end bookmarks
    assert result["ours_objects"] == 3 * 40
    assert len(result["ours_seconds"]) == len(result["bare_seconds"]) == 2
    assert result["ratio_min"] <= result["ratio_median"] <= result["ratio_max"]


def test_a_recording_without_its_end_bookmark_is_refused():
    with pytest.raises(SystemExit, match="did not end the initial events"):
        startup_replay.ours(_recordings(3, end=False))


def test_recordings_are_read_back_per_resource(tmp_path):
    for plural, data in _recordings(2).items():
        (tmp_path / f"{plural}.jsonl").write_bytes(data)
    assert startup_replay.load(tmp_path) == _recordings(2)


# A stand-in for valgrind: runs the command it is given (the `count` of one side,
# for real) and reports a made-up count per side, as callgrind words it.
FAKE_VALGRIND = """#!/bin/sh
for last; do :; done
while [ "${1#--}" != "$1" ]; do shift; done
"$@" >/dev/null || exit 1
case "$last" in load) n=1000;; bare) n=4000;; ours) n=6400;; esac
echo "==42== Collected : $n" >&2
"""


def test_instructions_count_each_side_in_a_fresh_process_less_the_load(tmp_path, monkeypatch):
    for plural, data in _recordings(5).items():
        (tmp_path / f"{plural}.jsonl").write_bytes(data)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "valgrind").write_text(FAKE_VALGRIND)
    (bin_dir / "valgrind").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    result = startup_replay.instructions(tmp_path, [ROOT], log=lambda line: None)
    assert result["objects"] == 15
    assert result["bare"] == 3000
    assert result["ours"] == {str(ROOT): 5400}


def test_the_counted_program_runs_one_side_of_a_checkout(tmp_path):
    for plural, data in _recordings(4).items():
        (tmp_path / f"{plural}.jsonl").write_bytes(data)
    for side, printed in (("ours", "12"), ("bare", "15"), ("load", "3")):
        proc = subprocess.run(startup_replay.count_command(ROOT, tmp_path, side),
                              capture_output=True, text=True, cwd=ROOT, check=True)
        assert proc.stdout.strip() == printed


def test_a_checkout_is_byte_compiled_before_it_is_counted(tmp_path):
    # A load run that compiles and an ours run that reads .pyc files would not
    # subtract: every counted process must find them written.
    (tmp_path / "k8s_http").mkdir()
    (tmp_path / "k8s_http" / "wire.py").write_text("X = 1\n")
    (tmp_path / "controller.py").write_text("Y = 2\n")
    startup_replay.compile_checkout(tmp_path)
    tag = sys.implementation.cache_tag
    assert (tmp_path / "k8s_http" / "__pycache__" / f"wire.{tag}.pyc").is_file()
    assert (tmp_path / "__pycache__" / f"controller.{tag}.pyc").is_file()


def test_callgrinds_total_is_read_from_its_summary_line():
    assert startup_replay.callgrind_total("==7== Events    : Ir\n==7== Collected : 8080568350\n"
                                          "==7==\n==7== I   refs:      8,080,568,350\n") \
        == 8080568350
    assert startup_replay.callgrind_total("valgrind: command not found") is None
