#!/usr/bin/env python3
"""Start-up CPU without the apiserver: the operator's informers against a bare decoder,
over the same recorded streams.

    python -m bench startup_replay record --kubeconfig KC --namespace NS --out DIR
    python -m bench startup_replay replay DIR [--rounds 6]

`record` reads the three streaming lists the operator's informers make at
start-up (its `My`; its Deployments and Services, by the managed-by selector)
up to their initial-events-end bookmarks, and writes each one's de-chunked
bytes to DIR/<plural>.jsonl: the watch events as the apiserver sent them.

`replay` feeds those bytes, in one process, alternately to

  bare   k8s_http.client.WatchStream alone, every event decoded and dropped:
         what bench/scaling/bare.py's client does once bytes are off the socket;
  ours   the operator's three informers (controller.PROJECTIONS, the managed
         fields cut from the bytes, packing, the stores, the sync step, the
         owner mapping, the primary's urgent test, one work queue), each until
         it has synced;

and prints each round's process CPU and the ratio ours ÷ bare, then the median.

`instructions` runs each side once more, each in a fresh process under
valgrind's callgrind (`apt-get install valgrind`), and counts the machine
instructions it executes, less those of a process of the same checkout that
only loads the recording: per object, and ours ÷ bare. Each checkout is
byte-compiled first, so that every counted process reads the same .pyc files. Other checkouts
(`--root`, e.g. a `git worktree` of the commit before a change) are counted
for ours too. CPU seconds on this shared host move by a third from minute to
minute (other tenants take up to a third of its cycles); an instruction count
repeats to 0.1 %, so it tells a 1 % change apart, which seconds cannot. It is
not time: a cache miss costs more than an add. Each run takes ~40x its time
natively (~80 s for 10,000 My with their children).

Why: the live figure of issue 17 (ready ÷ bare client, bench/scale.py) moves
±20 % with this shared host's load and the apiserver's share of two cores;
CPU spent in one process over the same bytes, the two alternating, moves much
less and says where a change to the start-up path lands. It is not the goal's
figure: the operator's extra CPU shows in its ready time only where the
apiserver is not the slower side.
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from controller import PROJECTIONS
from my.spec import MY
from k8s_http.wire.client import ApiClient, WatchStream
from k8s_http.config.cluster import load_config
from k8s_http.core.errors import K8sHttpError
from k8s_http.core.objects import AWAITS_RECONCILE_READS, awaits_reconcile
from k8s_http.cache.informer import Informer, own_key, owner_key
from k8s_http.cache.store import Store
from k8s_http.cache.watchstep import INITIAL_EVENTS_END
from k8s_http.control.workqueue import WorkQueue
from bench.scaling import bare as bare_client

# What the operator's informers read at start-up (the bare client's reads), with
# the key mapper each informer hands its objects to: resource, label selector, mapper.
READS = tuple((resource, selector, own_key if resource is MY else owner_key(MY.kind, MY.group))
              for resource, selector in bare_client.READS)
# Replayed bytes come in reads of this size, as a socket hands them over.
READ_BYTES = 64 * 1024
_END_MARK = INITIAL_EVENTS_END.encode()


def record(client: ApiClient, namespace: str, out: Path) -> dict[str, int]:
    """Each read's bytes to out/<plural>.jsonl; bytes per resource."""
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for resource, selector, _ in READS:
        query = {"watch": "1", "labelSelector": selector, "allowWatchBookmarks": "true",
                 "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                 "timeoutSeconds": "600"}
        stream = client.transport.stream(resource.path(namespace), query=query,
                                         read_timeout_seconds=120)
        received = bytearray()
        try:
            while True:
                data = stream.read_payload(timeout_seconds=120)
                if not data:
                    raise SystemExit(f"{resource}: the stream ended before the end bookmark")
                searched = max(0, len(received) - len(_END_MARK))
                received += data
                # The end bookmark's line closes the initial events; what follows
                # is the watch going on (a fleet still growing), not recorded.
                mark = received.find(_END_MARK, searched)
                end = received.find(b"\n", mark) if mark >= 0 else -1
                if end >= 0:
                    del received[end + 1:]
                    break
        finally:
            stream.close()
        (out / f"{resource.plural}.jsonl").write_bytes(received)
        sizes[resource.plural] = len(received)
    return sizes


class _Recorded:
    """A transport stream over recorded bytes (WatchStream reads it)."""

    path = "/recorded"

    def __init__(self, data: bytes):
        self._data = memoryview(data)
        self._at = 0

    def read_payload(self, timeout_seconds: float | None = None) -> bytes:
        chunk = self._data[self._at:self._at + READ_BYTES]
        self._at += len(chunk)
        return bytes(chunk)

    def close(self) -> None:
        pass


class _RecordedClient:
    """What an Informer's watcher asks of its client, answered from the recordings:
    one streaming list per resource. A watcher asking for more (a paged list, a
    second stream) found no end bookmark: SystemExit, which no watcher retries."""

    def __init__(self, recordings: dict[str, bytes]):
        self._recordings = recordings
        self._streamed: set[str] = set()

    def watch(self, resource, **options) -> WatchStream:
        if resource.plural in self._streamed:
            self._incomplete(resource)
        self._streamed.add(resource.plural)
        return WatchStream(_Recorded(self._recordings[resource.plural]),
                           skip_managed_fields=options.get("skip_managed_fields", False))

    def list(self, resource, **_options) -> dict:
        self._incomplete(resource)

    @staticmethod
    def _incomplete(resource) -> None:
        raise SystemExit(f"{resource}: the recording did not end the initial events")


def bare(recordings: dict[str, bytes]) -> int:
    """Events decoded by a WatchStream alone (managed fields and all), dropped."""
    events = 0
    for resource, _, _ in READS:
        for _event in WatchStream(_Recorded(recordings[resource.plural])):
            events += 1
    return events


def ours(recordings: dict[str, bytes]) -> int:
    """Objects cached by the operator's informers, each run until it has synced."""
    client = _RecordedClient(recordings)
    queue = WorkQueue("my")
    cached = 0
    for resource, selector, mapper in READS:
        informer = Informer(client, resource, namespaces=["recorded"], label_selector=selector,
                            store=Store(transform=PROJECTIONS[resource]))
        if resource is MY:      # as Manager.add_controller adds the primary's handler
            informer.add_handler(mapper, queue, urgent=awaits_reconcile,
                                 urgent_reads=AWAITS_RECONCILE_READS)
        else:
            informer.add_handler(mapper, queue)
        synced = threading.Event()
        informer.add_sync_listener(synced.set)
        for watcher in informer.watchers:
            watcher.run(synced)             # returns once the stream's initial set is in
        cached += len(informer.store)
    queue.shutdown(drain=False)
    return cached


def replay(recordings: dict[str, bytes], rounds: int, log=print) -> dict:
    """`rounds` alternating rounds of bare and ours (order swapped each round)."""
    seconds: dict[str, list[float]] = {"bare": [], "ours": []}
    counts = {}
    for number in range(rounds):
        for name in (("bare", "ours") if number % 2 == 0 else ("ours", "bare")):
            gc.collect()
            started = time.process_time()
            counts[name] = (bare if name == "bare" else ours)(recordings)
            seconds[name].append(time.process_time() - started)
        log(f"round {number + 1}: bare {seconds['bare'][-1]:.2f} s, ours {seconds['ours'][-1]:.2f} s "
            f"of CPU, ours / bare {seconds['ours'][-1] / seconds['bare'][-1]:.2f}")
    ratios = [o / b for o, b in zip(seconds["ours"], seconds["bare"])]
    return {"bare_events": counts["bare"], "ours_objects": counts["ours"],
            "bare_seconds": seconds["bare"], "ours_seconds": seconds["ours"],
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios)}


# `instructions`: the program a fresh process runs for one side, with the
# checkout under test first on its path (its startup_replay, its k8s_http): a
# checkout from before this command existed is counted the same way.
COUNTED = ("load", "bare", "ours")
COUNT_PROGRAM = """
import sys
from pathlib import Path
root, directory, side = sys.argv[1:4]
sys.path[:0] = [root + "/bench", root]
import startup_replay as replay
recordings = replay.load(Path(directory))
print({"load": len, "bare": replay.bare, "ours": replay.ours}[side](recordings))
"""


def count_command(root: Path, directory: Path, side: str) -> list[str]:
    """The command running one side (COUNTED) over `directory` at checkout `root`."""
    if side not in COUNTED:
        raise ValueError(f"side {side!r} is not one of {COUNTED}")
    return [sys.executable, "-c", COUNT_PROGRAM, str(root), str(directory), side]


def count_instructions(root: Path, directory: Path, side: str) -> int:
    """Instructions callgrind counts for one side at checkout `root`, run fresh."""
    if shutil.which("valgrind") is None:
        raise OSError("valgrind is not installed (apt-get install valgrind)")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         *count_command(root, directory, side)],
        capture_output=True, text=True, cwd=root, check=False)
    total = callgrind_total(proc.stderr)
    if proc.returncode != 0 or total is None:
        raise OSError(f"counting {side} at {root} under callgrind failed "
                      f"(exit {proc.returncode}): {proc.stderr[-800:]}")
    return total


def callgrind_total(stderr: str) -> int | None:
    """The count in callgrind's "==PID== Collected : N" line."""
    match = re.search(r"^==\d+== Collected : (\d+)$", stderr, re.MULTILINE)
    return int(match.group(1)) if match else None


def instructions(directory: Path, roots: list[Path], log=print) -> dict:
    """Instructions per object of bare and of ours at each root (the first: this
    checkout), each less a process of the same checkout that only loads the
    recording."""
    directory = directory.resolve()
    objects = sum(data.count(b"\n") for data in load(directory).values()) - len(READS)
    checkouts = list(dict.fromkeys([ROOT, *roots]))
    for root in checkouts:
        compile_checkout(root)
    # Each checkout's own loading process: it imports that checkout's modules,
    # which are no part of a side.
    loads = {root: count_instructions(root, directory, "load") for root in checkouts}
    bare_count = count_instructions(ROOT, directory, "bare") - loads[ROOT]
    result = {"objects": objects, "load": {str(r): n for r, n in loads.items()},
              "bare": bare_count, "ours": {}}
    log(f"bare: {bare_count / objects:,.0f} instructions an object")
    for root in roots:
        ours_count = count_instructions(root, directory, "ours") - loads[root]
        result["ours"][str(root)] = ours_count
        log(f"ours at {root}: {ours_count / objects:,.0f} instructions an object, "
            f"ours / bare {ours_count / bare_count:.3f}")
    return result


# What a counted process imports from a checkout.
COMPILED = ("k8s_http", "my", "bench", "controller.py")


def compile_checkout(root: Path) -> None:
    """Write the .pyc files of `root`'s modules, so that every counted process
    reads them. Without them (a fresh `git worktree`, or PYTHONDONTWRITEBYTECODE)
    the first process to import a module compiles it and the next ones may not:
    a load run that compiled, subtracted from an ours run that did not, made a
    checkout ~25,000 instructions an object too cheap (sessions 27 and 28)."""
    for name in COMPILED:
        path = root / name
        if path.is_dir():
            compileall.compile_dir(str(path), quiet=1)
        elif path.is_file():
            compileall.compile_file(str(path), quiet=1)


def load(directory: Path) -> dict[str, bytes]:
    return {resource.plural: (directory / f"{resource.plural}.jsonl").read_bytes()
            for resource, _, _ in READS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record the three start-up streams")
    rec.add_argument("--kubeconfig", required=True)
    rec.add_argument("--namespace", required=True)
    rec.add_argument("--out", type=Path, required=True, help="a directory")
    rep = commands.add_parser("replay", help="ours against the bare decoder, CPU per round")
    rep.add_argument("directory", type=Path)
    rep.add_argument("--rounds", type=int, default=6)
    ins = commands.add_parser("instructions",
                              help="instructions per object of each side, under callgrind")
    ins.add_argument("directory", type=Path)
    ins.add_argument("--root", type=Path, action="append", default=[],
                     help="another checkout whose ours to count too (repeatable)")
    args = parser.parse_args(argv)
    try:
        if args.command == "record":
            with ApiClient.from_config(load_config(args.kubeconfig)) as client:
                print(json.dumps(record(client, args.namespace, args.out)))
            return 0
        if args.command == "instructions":
            roots = [ROOT] + [root.resolve() for root in args.root]
            print(json.dumps(instructions(args.directory, roots)))
            return 0
        result = replay(load(args.directory), args.rounds)
    except (K8sHttpError, OSError, ValueError) as err:
        print(f"startup_replay: {err}", file=sys.stderr)
        return 1
    objects = result["ours_objects"]
    print(f"{objects:,} objects: ours / bare CPU {result['ratio_median']:.2f} "
          f"(median of {args.rounds}; {result['ratio_min']:.2f}-{result['ratio_max']:.2f}); "
          f"ours {statistics.median(result['ours_seconds']) / objects * 1e6:.1f} us an object, "
          f"bare {statistics.median(result['bare_seconds']) / objects * 1e6:.1f}")
    return 0
