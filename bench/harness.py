"""The main() every benchmark on the control plane shares: its flags for where
results go, the run's metadata, the plane started (or attached to) for the run,
the results JSON and the markdown written from it.

    def main(argv=None) -> int:
        return harness.main(argv, parse_args, measure=run, render=write_markdown, log=log)

`measure(args, argv)` runs the benchmark and returns (data, path of its JSON),
data["meta"] from `metadata()`; `render(args, data)` writes the markdown, and is
all that runs with --from-json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.convergence.cluster import BenchCluster
from tests.support import controlplane

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
CRD = ROOT / "manifests" / "base" / "crd.yaml"


def logger(name: str) -> Callable[[str], None]:
    """`log(message)`: "[NAME HH:MM:SS] message" on stderr, as every benchmark logs."""
    def log(message: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
    return log


def bench_python() -> str:
    """The repository's venv Python if there is one: the operators run under it."""
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


# ---------------------------------------------------------------- metadata

def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def source_changed() -> bool:
    """Uncommitted changes to tracked files other than benchmark outputs (make bench
    writes those first). Untracked files (a worktree's venv link) do not count."""
    # "XY path": git() strips the output, so the first line may have lost its leading
    # space; the path is what follows the status letters.
    return any(not line.split(maxsplit=1)[-1].startswith(("bench/results/", "bench/RESULTS"))
               for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
               if line.strip())


def revision() -> str:
    """The short commit, marked when the source differs from it. A snapshot (git
    archive) has no .git: then $BENCH_GIT, which the runner sets, names the commit."""
    commit = git("rev-parse", "--short", "HEAD")
    if commit == "?":
        return os.environ.get("BENCH_GIT", "?")
    return commit + (" (+ uncommitted changes)" if source_changed() else "")


def command(name: str, argv: list[str]) -> str:
    return f"python -m bench {name} " + " ".join(shlex.quote(a) for a in argv)


def go_requirement(module: str) -> str | None:
    """The version the controller-runtime peer's go.mod pins for `module`."""
    for line in (BENCH / "peers" / "crpeer" / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:1] == [module] and len(parts) > 1:
            return parts[1]
    return None


def metadata(name: str, argv: list[str], cluster: BenchCluster, **versions) -> dict:
    """Date, command, commit, machine, Python and versions (the plane's, the peer's,
    then `versions`, then where the binaries came from) of one run."""
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command(name, argv),
        "git": revision(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") *
                                        os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                    "load_average_at_start": os.getloadavg()},
        "python": platform.python_version(),
        "versions": {"kubernetes (control plane)": controlplane.K8S_VERSION,
                     "etcd": controlplane.ETCD_VERSION,
                     "controller-runtime (peer)": go_requirement("sigs.k8s.io/controller-runtime"),
                     **versions, "binaries": cluster.binaries_source()},
    }


def brief_metadata(name: str, argv: list[str]) -> dict:
    """The soak's and the chaos bench's shorter form: machine on one line, the load."""
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "git": revision(), "command": command(name, argv),
            "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
            "python": platform.python_version(), "loadavg": os.getloadavg()}


# ---------------------------------------------------------------- flags, plane, output

def add_output_arguments(parser: argparse.ArgumentParser, *, out_help: str,
                         markdown: Path) -> None:
    """--cluster-dir, --out, --markdown, --from-json and --keep-logs."""
    parser.add_argument("--cluster-dir", type=Path, default=None,
                        help="attach to the control plane running in this directory (`python "
                             "-m tests.support.controlplane up`, `python -m bench plane up`) "
                             "instead of starting one")
    parser.add_argument("--out", type=Path, default=None, help=out_help)
    parser.add_argument("--markdown", type=Path, default=markdown)
    parser.add_argument("--from-json", type=Path, default=None,
                        help="only write the markdown report from an earlier results file")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the operators' logs (their directory is printed)")


@contextlib.contextmanager
def control_plane(name: str, args, log: Callable[[str], None], *, pods: bool,
                  apiserver_args: tuple[str, ...] = (), what: str = "the control plane"
                  ) -> Iterator[tuple[BenchCluster, Path]]:
    """The plane (started here, or attached to with --cluster-dir) with the CRD, and a
    work directory for the operators' logs; the plane stopped and the directory removed
    (--keep-logs: kept) at the end."""
    work_dir = Path(tempfile.mkdtemp(prefix=f"my-controller-{name}-"))
    cluster = BenchCluster(work_dir, attach_dir=args.cluster_dir,
                           apiserver_args=apiserver_args, pods=pods)
    log(f"starting {what}" if args.cluster_dir is None else
        f"attaching to the control plane in {args.cluster_dir}")
    try:
        cluster.start()
        cluster.install_crd(CRD)
        yield cluster, work_dir
    finally:
        cluster.stop()
        if args.keep_logs:
            log(f"operator logs kept in {work_dir}")
        else:
            subprocess.run(["rm", "-rf", str(work_dir)], check=False)


def save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None, parse_args: Callable[[list[str]], argparse.Namespace], *,
         measure: Callable[[argparse.Namespace, list[str]], tuple[dict, Path]],
         render: Callable[[argparse.Namespace, dict], None],
         log: Callable[[str], None]) -> int:
    """Parse; --from-json: render only; else measure, then save the JSON and render."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json is not None:
        render(args, json.loads(args.from_json.read_text()))
        log(f"wrote {args.markdown} from {args.from_json}")
        return 0
    t_start = time.monotonic()
    data, out = measure(args, argv)
    data["meta"]["wall_seconds"] = time.monotonic() - t_start
    save(out, data)
    render(args, data)
    log(f"done in {(time.monotonic() - t_start) / 60:.1f} min: {out}, {args.markdown}")
    return 0
