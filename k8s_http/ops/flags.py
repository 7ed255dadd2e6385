"""The standard manager flags, so an operator gets them in one call.

    parser = new_parser("my-operator", description="...")
    add_manager_flags(parser, "my-operator", version="1.2.3")
    args = parser.parse_args()
    setup_logging(args.log_level, args.log_format)
    try:
        mgr = Manager(load_config(args.kubeconfig, context=args.context), "my-operator",
                      **manager_options(args))
    except ConfigError as err:
        parser.exit(2, f"my-operator: error: {with_flag_names(err)}\n")

The flags are controller-runtime's (--metrics-bind-address, --leader-elect,
...) plus the cluster connection and logging. A bad value is one line naming
the flag and exit code 2, never a traceback. The value parsers
(`parse_duration`, `parse_bind_address`) are usable on their own and raise
ValueError naming the value, not a flag: only argparse, which knows the flag,
adds its name. Likewise `load_config` and `Manager` name the argument a
problem is about (`kubeconfig=`); `with_flag_names` turns that into the flag.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
import sys

from ..core.names import is_dns1123_label, is_dns1123_subdomain
from ..config.configerror import ConfigError
from .log import LEVEL_NAMES, LOG_FORMATS

__all__ = [
    "new_parser",
    "add_manager_flags",
    "manager_options",
    "with_flag_names",
    "SETTING_FLAGS",
    "parse_duration",
    "parse_bind_address",
    "is_disabled",
    "duration",
    "bind_address",
    "positive_int",
    "non_negative_int",
    "non_negative_float",
    "namespace_name",
    "lease_name",
]

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                   "h": 3600.0}
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$")


# --------------------------------------------------------------------------
# Value parsers: ValueError naming the value


def parse_duration(text: str) -> float:
    """Seconds from a Go-style duration (25s, 1m30s, 500ms) or a bare number of seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ValueError(f"invalid duration {text!r}: use e.g. 25s, 1m30s, 500ms or "
                             "a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {text!r}: must be a finite, non-negative time")
    return seconds


def is_disabled(bind_address: str) -> bool:
    """True for "0" and "": the server is off (controller-runtime's convention)."""
    return bind_address.strip() in ("", "0")


def parse_bind_address(bind_address: str) -> tuple[str, int] | None:
    """':8080' -> ('', 8080); '127.0.0.1:0' -> ('127.0.0.1', 0); '[::1]:9' -> ('::1', 9);
    '0' or '' -> None (disabled). Raises ValueError naming the problem otherwise."""
    text = bind_address.strip()
    if is_disabled(text):
        return None
    fix = "use HOST:PORT such as :8080 or 127.0.0.1:8080, or 0 to disable"
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"bind address {bind_address!r} has no port: {fix}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"bind address {bind_address!r}: {host} is not an IPv6 address; "
                             f"{fix}") from None
    elif ":" in host:
        raise ValueError(f"bind address {bind_address!r}: put an IPv6 address in brackets, "
                         f"e.g. '[::1]:8080'")
    elif host and not _HOSTNAME.match(host):
        raise ValueError(f"bind address {bind_address!r}: {host!r} is not a host name or "
                         f"address; {fix}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"bind address {bind_address!r}: port must be a number 0-65535")
    return host, int(port_text)


# --------------------------------------------------------------------------
# argparse types: argparse adds the flag's name to the message


def _argument_type(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    convert.__name__ = parse.__name__
    return convert


duration = _argument_type(parse_duration)


def _bind_address(text: str) -> str:
    # The text itself is what the Manager gets; an empty or padded value is a
    # typo on a command line, not a way to disable an endpoint.
    if not text or text != text.strip():
        raise ValueError(f"bind address {text!r} has no port: use HOST:PORT such as :8080 "
                         "or 127.0.0.1:8080, or 0 to disable")
    parse_bind_address(text)
    return text


bind_address = _argument_type(_bind_address)


def _at_least(text: str, convert, minimum: float, what: str):
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    return _at_least(text, int, 1, "a whole number >= 1 (e.g. 4)")


def non_negative_int(text: str) -> int:
    return _at_least(text, int, 0, "a whole number >= 0 (0 = no limit)")


def non_negative_float(text: str) -> float:
    return _at_least(text, float, 0, "a number >= 0 (0 = no limit)")


def namespace_name(text: str) -> str:
    if not is_dns1123_label(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace name: use at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit")
    return text


def lease_name(text: str) -> str:
    if not is_dns1123_subdomain(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid Lease name: use lowercase letters, digits, '-' and '.'")
    return text


# --------------------------------------------------------------------------
# The parser and the flags


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keep the epilog's line breaks; show each default worth showing."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=36)

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def new_parser(app_name: str, *, description: str = "",
               epilog: str = "") -> argparse.ArgumentParser:
    """A parser named `app_name` whose errors are one line and exit 2; no abbreviations."""
    return _Parser(prog=app_name, allow_abbrev=False,  # a typo must not pick another flag
                   formatter_class=_HelpFormatter, description=description, epilog=epilog)


def add_manager_flags(parser: argparse.ArgumentParser, app_name: str, *,
                      version: str | None = None) -> dict[str, argparse._ArgumentGroup]:
    """Add the standard flags; returns their groups by name, for the application's own flags.

    Groups: "cluster connection", "reconciling", "leader election",
    "endpoints", "logging". `app_name` is the default Lease name and the
    name `--version` prints (with `version`; no --version flag without it).
    """
    conn = parser.add_argument_group("cluster connection")
    conn.add_argument("--kubeconfig", metavar="PATH", default=None,
                      help="kubeconfig file (default: $KUBECONFIG, then the in-cluster "
                           "service account, then ~/.kube/config)")
    conn.add_argument("--context", metavar="NAME", default=None,
                      help="kubeconfig context to use (default: its current-context)")
    conn.add_argument("--qps", type=non_negative_float, default=0.0, metavar="N",
                      help="client-side request rate limit, requests per second; 0 = none "
                           "(rely on the apiserver's priority and fairness)")
    conn.add_argument("--burst", type=non_negative_int, default=0, metavar="N",
                      help="client-side burst above --qps; 0 = none")

    work = parser.add_argument_group("reconciling")
    work.add_argument("--namespace", dest="namespaces", action="append", type=namespace_name,
                      metavar="NS", default=None,
                      help="watch only this namespace; repeat for several (default: all "
                           "namespaces)")
    work.add_argument("--graceful-shutdown-timeout", type=duration, default="25s",
                      metavar="DURATION",
                      help="on SIGTERM/SIGINT, how long in-flight reconciles may take "
                           "(e.g. 25s, 1m, 500ms, or seconds)")

    ha = parser.add_argument_group("leader election")
    ha.add_argument("--leader-elect", action="store_true",
                    help="run as one of several replicas, only the Lease holder reconciling")
    ha.add_argument("--leader-election-namespace", type=namespace_name, metavar="NS",
                    default=None,
                    help="namespace of the Lease (default: the in-cluster namespace, or the "
                         "kubeconfig context's)")
    ha.add_argument("--leader-election-id", type=lease_name, metavar="NAME", default=app_name,
                    help="name of the Lease")
    ha.add_argument("--shards", choices=("off", "auto"), default="off",
                    help="auto: every replica works on its share of the objects, each with "
                         "a member Lease in --leader-election-namespace (instead of "
                         "--leader-elect; docs/SHARDING.md)")

    serve = parser.add_argument_group("endpoints")
    serve.add_argument("--metrics-bind-address", type=bind_address, default=":8080",
                       metavar="ADDR", help="where /metrics listens; 0 disables it")
    serve.add_argument("--health-probe-bind-address", type=bind_address, default=":8081",
                       metavar="ADDR", help="where /healthz and /readyz listen; 0 disables them")
    serve.add_argument("--metrics-secure", action="store_true",
                       help="serve /metrics over HTTPS, only to bearer tokens allowed to get "
                            "/metrics (checked by TokenReview and SubjectAccessReview)")
    serve.add_argument("--metrics-cert-dir", metavar="PATH", default=None,
                       help="directory with tls.crt and tls.key for --metrics-secure (default: "
                            "a self-signed certificate made with openssl, for development)")

    if version is not None:
        parser.add_argument("--version", action="version",
                            version=f"{app_name} {version} (Python {sys.version.split()[0]})",
                            help="print the version and exit")

    logs = parser.add_argument_group("logging")
    logs.add_argument("--log-level", choices=LEVEL_NAMES, default="info",
                      help="least severe level logged")
    logs.add_argument("--log-format", choices=LOG_FORMATS, default="auto",
                      help="auto = text on a terminal, JSON lines otherwise")
    return {"cluster connection": conn, "reconciling": work, "leader election": ha,
            "endpoints": serve, "logging": logs}


def manager_options(args: argparse.Namespace) -> dict:
    """The `Manager` keyword arguments the flags of `add_manager_flags` set."""
    return dict(
        namespaces=args.namespaces,
        metrics_bind_address=args.metrics_bind_address,
        health_probe_bind_address=args.health_probe_bind_address,
        leader_elect=args.leader_elect,
        leader_election_namespace=args.leader_election_namespace,
        leader_election_id=args.leader_election_id,
        qps=args.qps, burst=args.burst,
        graceful_shutdown_timeout_seconds=args.graceful_shutdown_timeout,
        metrics_secure=args.metrics_secure, metrics_cert_dir=args.metrics_cert_dir,
        # Only when asked for: without it the options are what they always were.
        **({"shards": True} if getattr(args, "shards", "off") == "auto" else {}),
    )


# The settings k8s_http's messages name (load_config and Manager arguments,
# see configerror.setting) and the flags add_manager_flags gives them.
SETTING_FLAGS = {
    "kubeconfig": "--kubeconfig",
    "context": "--context",
    "metrics_secure": "--metrics-secure",
    "metrics_cert_dir": "--metrics-cert-dir",
}


def with_flag_names(err: ConfigError) -> ConfigError:
    """`err` as a command-line user reads it: the flags, where it names settings they set."""
    return err.with_setting_names(SETTING_FLAGS)
