"""Rebuild bench/RESULTS.md from the summary and each benchmark's own section.

Every benchmark NAME (`python -m bench NAME`) writes its section,
bench/RESULTS.NAME.md, with its command, versions and date, from its latest
results, bench/results/NAME*.json: one file per benchmark, the latest run only
(earlier runs are in git's history; `--from-json` renders one again). The
summary, leader (tests/e2e) and controlplane (tests/support/build_testbin.sh)
sections are written by hand. This only puts them together, in a fixed order.
"""

import argparse
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SECTIONS = ["summary", "watch_decode", "gil_switch", "pipeline", "converge", "scale", "shards", "startup_list", "write_memory", "leader",
            "image_footprint", "footprint", "controlplane", "soak", "soak_sharded", "chaos", "fuzz"]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    parts = []
    for name in SECTIONS:
        path = BENCH / f"RESULTS.{name}.md"
        if path.exists():
            parts.append(path.read_text().strip())
        else:
            parts.append(f"## {name}\n\n(not measured yet: {path.name} is missing)")
    (BENCH / "RESULTS.md").write_text("\n\n---\n\n".join(parts) + "\n")
    print(f"wrote {BENCH / 'RESULTS.md'}")
    return 0
