"""bench/fuzz.py without atheris: its seeds are the inputs they claim to be, and its
results file says how each run stopped."""

from __future__ import annotations


from bench import fuzz
from k8s_http.config.configerror import ConfigError
from k8s_http.config.kubeconfig import read_kubeconfig
from k8s_http.wire.watchproto import ChunkedDecoder, LineDecoder


def test_chunked_seeds_are_whole_valid_bodies():
    for seed in fuzz.seeds("chunked"):
        dec = ChunkedDecoder()
        payload = dec.feed(seed[1:])          # the first byte only says how to cut
        assert dec.done and payload


def test_line_seeds_hold_usable_events_of_every_kind():
    types = set()
    for seed in fuzz.seeds("lines"):
        dec = LineDecoder()
        dec.feed(seed[1:])
        types |= {event.type for event in dec.events()}
    assert types == {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}


def test_kubeconfig_seeds_reach_past_the_yaml(tmp_path):
    (tmp_path / "token").write_text("file-token\n")
    loaded = 0
    for seed in fuzz.seeds("kubeconfig"):
        (tmp_path / "config").write_bytes(seed)
        try:
            read_kubeconfig([str(tmp_path / "config")], None, {"PATH": str(tmp_path)})
            loaded += 1
        except ConfigError as err:
            # Only the certificate check (the seeds' PEM is a stub) or the missing plugin.
            assert "certificate" in str(err) or "exec plugin" in str(err), str(err)
    assert loaded == 3


def _record(target, **kw):
    base = {"target": target, "started": "2026-12-03 20:11 UTC", "git": "abc1234",
            "load_at_start": 5.0, "seconds_asked": 600, "seconds": 600, "execs": 1234567,
            "execs_per_second": 2057, "corpus_files": 88, "coverage": 61, "features": 352,
            "peak_rss_mb": 60, "exit_code": 0, "artifacts": [], "problem": "", "timeout": 10,
            "command": "nice -n 19 python -m bench fuzz all --seconds 600 --jobs 2",
            "atheris": "3.0.0", "pyyaml": "6.0.4", "python": "3.11.7"}
    return dict(base, **kw)


def test_results_say_which_runs_ran_their_time_and_which_stopped_on_a_crash():
    text = fuzz.render({"runs": {
        "lines": _record("lines"),
        "events": _record("events", exit_code=77, seconds=41, problem="uncaught TypeError: x",
                          artifacts=["crash-0f"])}})
    runs_table = text.split("### Crashes found")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in runs_table.splitlines()
            if line.startswith("| lines") or line.startswith("| events")}
    assert rows["lines"].rstrip().endswith("| time |")
    assert "1,234,567" in rows["lines"]
    assert "**uncaught TypeError: x** (crash-0f)" in rows["events"]
