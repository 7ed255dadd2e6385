"""`python -m bench`: one entry point that lists every benchmark and runs each with its flags."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from bench import __main__ as entry

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _has_main(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


def test_every_module_with_a_main_is_a_listed_benchmark_and_none_is_a_script():
    modules = {".".join(p.relative_to(BENCH).with_suffix("").parts)
               for p in BENCH.rglob("*.py") if ".venv" not in str(p)
               and p.parent.name != "peers" and p.name != "__main__.py" and _has_main(p)}
    # The two wrappers the bench starts in place of controller.py, by their path.
    wrappers = {"convergence.profiled", "convergence.traced"}
    # harness.main: the skeleton the benchmarks' mains share, no benchmark itself.
    assert modules - wrappers - {"harness"} == set(entry.BENCHMARKS.values())
    scripts = [p for p in BENCH.rglob("*.py") if ".venv" not in str(p) and p.parent.name != "peers"
               and p.name != "__main__.py" and 'if __name__ == "__main__"' in p.read_text()]
    assert {".".join(p.relative_to(BENCH).with_suffix("").parts) for p in scripts} == wrappers


def test_no_arguments_lists_every_benchmark_on_one_line_each(capsys):
    assert entry.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in entry.BENCHMARKS:
        line = next(line for line in lines if line.split()[:1] == [name])
        assert len(line.split(None, 1)[1]) > 20, line


def test_an_unknown_name_is_refused_with_the_list(capsys):
    assert entry.main(["nope"]) == 2
    assert "no benchmark 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(entry.BENCHMARKS))
def test_each_benchmark_shows_its_flags(name):
    proc = subprocess.run([sys.executable, "-m", "bench", name, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m bench {name} "), proc.stdout[:200]


def test_results_are_one_latest_file_per_benchmark_collected_into_results_md():
    from bench import collect_results
    names = set(entry.BENCHMARKS)
    for path in (BENCH / "results").glob("*.json"):
        # NAME.json or NAME_VARIANT.json (converge_ready): no dates, history is git's.
        assert path.stem in names or path.stem.rsplit("_", 1)[0] in names, path.name
    sections = {p.name[len("RESULTS."):-len(".md")] for p in BENCH.glob("RESULTS.*.md")}
    assert sections == set(collect_results.SECTIONS)
    hand_written = {"summary", "leader", "controlplane"}
    assert all(s in names or s.rsplit("_", 1)[0] in names for s in sections - hand_written)
