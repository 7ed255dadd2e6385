"""Configuration errors: one line naming the file at fault and the fix.

Everything that reads configuration (kubeconfig, in-cluster files, credential
plugins, TLS material) reports through `ConfigError`, so a command line can
print it and exit 2 instead of showing a traceback. Messages never contain a
token or a key.
"""

from __future__ import annotations

from .errors import K8sHttpError

__all__ = ["ConfigError", "CredentialError", "one_line", "clip", "read_file"]


class ConfigError(K8sHttpError):
    """A configuration problem only the user can fix.

    str() is one line: ``<where>: <problem>; <fix>``, where `where` names the
    file (or variable) at fault. It never contains a token or a key.
    """

    def __init__(self, where: str, problem: str, fix: str = ""):
        super().__init__(where, problem, fix)   # args stay picklable
        self.where = where
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return one_line(f"{self.where}: {self.problem}" + (f"; {self.fix}" if self.fix else ""))


class CredentialError(ConfigError):
    """A credential source failed while running (token file gone, exec plugin failed).

    Raised from `token()` / `client_cert()`, so possibly mid-run, not only at load.
    """


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def clip(text: str, limit: int) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[:limit] + "..."

def read_file(path: str, where: str, what: str, fix: str) -> bytes:
    """The file's bytes, or ConfigError "<where>: <what> not found; <fix>"."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        problem = "not found"
    except IsADirectoryError:
        problem = "is a directory, not a file"
    except OSError as e:
        problem = f"cannot be read ({e.strerror})"
    except ValueError:   # a NUL byte in the path
        problem = "is not a valid path"
    raise ConfigError(where, f"{what} {problem}", fix)
