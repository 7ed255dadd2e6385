"""bench/harness.py: the main() the benchmarks share, and the run's metadata."""

from __future__ import annotations

import argparse
import json

from bench import harness


def _parser(tmp_path):
    def parse_args(argv):
        parser = argparse.ArgumentParser()
        parser.add_argument("--size", type=int, default=1)
        harness.add_output_arguments(parser, out_help="x", markdown=tmp_path / "R.md")
        args = parser.parse_args(argv)
        args.out = args.out or tmp_path / "results" / "x.json"
        return args
    return parse_args


def test_a_run_measures_then_saves_the_json_and_renders_it(tmp_path):
    rendered, logged = [], []

    def measure(args, argv):
        assert argv == ["--size", "3"] and args.size == 3
        return {"meta": {"command": harness.command("x", argv)}, "figure": 42}, args.out

    def render(args, data):
        rendered.append(data)
        args.markdown.write_text(f"{data['figure']}\n")

    assert harness.main(["--size", "3"], _parser(tmp_path), measure=measure, render=render,
                        log=logged.append) == 0
    saved = json.loads((tmp_path / "results" / "x.json").read_text())
    assert saved["figure"] == 42 and saved["meta"]["wall_seconds"] >= 0
    assert saved["meta"]["command"] == "python -m bench x --size 3"
    assert rendered == [saved] and (tmp_path / "R.md").read_text() == "42\n"
    assert logged and logged[-1].startswith("done in ")


def test_from_json_only_renders(tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"figure": 7}))
    rendered = []

    def measure(args, argv):
        raise AssertionError("--from-json measures nothing")

    assert harness.main(["--from-json", str(earlier)], _parser(tmp_path), measure=measure,
                        render=lambda args, data: rendered.append(data), log=lambda m: None) == 0
    assert rendered == [{"figure": 7}] and not (tmp_path / "results").exists()


def test_a_snapshot_without_git_is_named_by_the_runner(monkeypatch):
    monkeypatch.setattr(harness, "git", lambda *args: "?")
    monkeypatch.setenv("BENCH_GIT", "abc1234")
    assert harness.revision() == "abc1234"
    monkeypatch.setattr(harness, "git", lambda *args: "" if args[0] == "status" else "def5678")
    assert harness.revision() == "def5678"


def test_benchmark_outputs_do_not_count_as_changed_source(monkeypatch):
    status = " M bench/results/scale.json\nM  bench/RESULTS.md\n"
    monkeypatch.setattr(harness, "git", lambda *args: status.strip())
    assert not harness.source_changed()
    status += " M k8s_http/store.py\n"
    assert harness.source_changed()
