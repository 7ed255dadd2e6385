"""Run controller.py with tracemalloc on; SIGUSR2 writes a snapshot (bench only).

    python bench/convergence/traced.py SNAPSHOT_DIR -- <controller.py flags>

For the soak's allocation tracking (issue 36 item 1). Nothing of this is in the
operator's own code or image: the bench starts this wrapper instead of
controller.py. tracemalloc starts before `controller` is imported (its module
objects are traced too), keeping `TRACE_FRAMES` frames per allocation. Each
SIGUSR2 writes SNAPSHOT_DIR/snapshot-PID-NNN.tracemalloc (`Snapshot.dump`; written
under a temporary name and renamed, so a reader sees only whole files). The
handler runs in the main thread, between two bytecodes of whatever it was
doing, as any Python signal handler does.

tracemalloc costs memory (about 40 bytes per live block for the trace) and
CPU on every allocation: RSS measured under it is higher than without it, by
an amount that grows with the number of live blocks, so it shows the same trend.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TRACE_FRAMES = 1
_taken = 0


def snapshot_path(directory: Path, pid: int, index: int) -> Path:
    return directory / f"snapshot-{pid}-{index:03d}.tracemalloc"


def _snapshot(directory: Path) -> None:
    global _taken
    path = snapshot_path(directory, os.getpid(), _taken)
    _taken += 1
    tmp = path.with_suffix(".tmp")
    # Unreachable cycles (an exception and its frames, say) live until the
    # collector's next full pass, which a large heap makes rare: collected
    # first, they do not pass for growth.
    gc.collect()
    tracemalloc.take_snapshot().dump(str(tmp))
    os.replace(tmp, path)


def main() -> int:
    directory = Path(sys.argv[1])
    args = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    directory.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(TRACE_FRAMES)
    signal.signal(signal.SIGUSR2, lambda signum, frame: _snapshot(directory))
    import controller
    return controller.main(args)


if __name__ == "__main__":
    sys.exit(main())
