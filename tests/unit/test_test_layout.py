"""The test tree itself: pytest imports test modules by basename (no packages), so two
files of one name in different directories stop the whole run at collection."""

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent.parent


def test_test_module_names_are_unique_across_directories():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
