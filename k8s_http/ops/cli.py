"""The end of an operator's command line: errors as one line, and running the Manager.

`flag_error(app_name, message)` prints "<app>: error: <message>" on one line
(whitespace folded) to stderr and returns 2, argparse's exit status for a
usage error; a ConfigError goes through `with_flag_names` first, so it names
the flag rather than the Manager's argument.

`run_manager(mgr, app_name)` runs the Manager and returns its exit code. The
only bind happens in its start(), first thing in run(): a port in use, an
address this host does not have, or a privileged port is a flag problem and
is reported as one (naming the two bind-address flags, and "0" to disable),
without a traceback, after the Manager has stopped what it started. Any
other OSError goes on.
"""

from __future__ import annotations

import errno
import sys

__all__ = ["flag_error", "run_manager", "BIND_ERRNOS"]

BIND_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def flag_error(app_name: str, message: object) -> int:
    print(f"{app_name}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def run_manager(mgr, app_name: str) -> int:
    """mgr.run(), with a failed bind of a listening address as a flag error."""
    try:
        return mgr.run()
    except OSError as err:
        if err.errno not in BIND_ERRNOS:
            raise
        try:
            mgr.stop()
        except Exception:
            pass
        # The runtime's message names the address ("cannot listen on ':8080': ...").
        return flag_error(app_name, f"{err.strerror or err}; choose another "
                          "--metrics-bind-address or --health-probe-bind-address (0 disables)")
