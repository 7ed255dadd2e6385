"""Run controller.py under cProfile, every thread included.

    python bench/convergence/profiled.py OUT.prof -- <controller.py flags>

`python -m cProfile controller.py` sees only the main thread, and the
operator's work happens in its informer and worker threads. Here every
thread's run() gets its own cProfile.Profile, enabled and disabled in that
thread; when controller.main() returns (after SIGTERM) the profiles of the
finished threads and of the main thread are merged into one pstats file.

With BENCH_PROFILE_CPU=1 in the environment, each thread's profile counts that
thread's CPU time (time.thread_time) instead of wall time: where the CPU goes,
without the threads' waits on sockets and locks.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()
_original_run = threading.Thread.run
_TIMER = (time.thread_time,) if os.environ.get("BENCH_PROFILE_CPU") == "1" else ()


def _profiled_run(self: threading.Thread) -> None:
    profile = cProfile.Profile(*_TIMER)
    profile.enable()
    try:
        _original_run(self)
    finally:
        profile.disable()
        with _lock:
            _profiles.append(profile)


def main() -> int:
    out = Path(sys.argv[1])
    args = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    threading.Thread.run = _profiled_run
    import controller           # after the patch: no thread exists yet

    main_profile = cProfile.Profile(*_TIMER)
    main_profile.enable()
    try:
        code = controller.main(args)
    finally:
        main_profile.disable()
        time.sleep(1.0)        # let stopping threads finish and hand in their profiles
        with _lock:
            stats = pstats.Stats(main_profile)
            for profile in _profiles:
                stats.add(profile)
        stats.dump_stats(out)
        print(f"profile of {1 + len(_profiles)} threads written to {out}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
