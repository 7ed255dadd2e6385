"""Configuration errors: one line naming the file at fault and the fix.

Everything that reads configuration (kubeconfig, in-cluster files, credential
plugins, TLS material) reports through `ConfigError`, so a command line can
print it and exit 2 instead of showing a traceback. Messages never contain a
token or a key.

A message that names a setting the caller chose (an argument of `load_config`
or `Manager`) writes it as `setting(name)`: the library cannot know whether the
value came from a flag, a file or code. Shown as it is, the error names the
argument (`kubeconfig=`); the layer that knows how the user spelled the setting
renames it (`k8s_http.ops.flags.with_flag_names`: `--kubeconfig`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping

from ..core.errors import K8sHttpError

__all__ = ["ConfigError", "CredentialError", "one_line", "clip", "read_file", "setting",
           "name_settings"]

# A setting's name travels in the message between two characters of Unicode's
# private use area, which no path, environment value or kubeconfig field a
# message quotes holds in practice (at worst such text would be re-spelled).
_MARK = "\ue000"
_SETTING = re.compile(f"{_MARK}([a-z_]+){_MARK}")


def setting(name: str) -> str:
    """How a message refers to the setting `name` (a load_config / Manager argument)."""
    return f"{_MARK}{name}{_MARK}"


def name_settings(text: str, names: Mapping[str, str] | None = None) -> str:
    """`text` with each setting(name) spelled as `names` says, else as the argument `name=`."""
    names = names or {}
    return _SETTING.sub(lambda m: names.get(m.group(1), f"{m.group(1)}="), text)


class ConfigError(K8sHttpError):
    """A configuration problem only the user can fix.

    str() is one line: ``<where>: <problem>; <fix>``, where `where` names the
    file (or variable, or setting) at fault. It never contains a token or a key.
    The parts may name settings with `setting(name)`: see `with_setting_names`.
    """

    def __init__(self, where: str, problem: str, fix: str = ""):
        super().__init__(where, problem, fix)   # args stay picklable
        self.where = where
        self.problem = problem
        self.fix = fix
        self.setting_names: Mapping[str, str] = {}

    def with_setting_names(self, names: Mapping[str, str]) -> "ConfigError":
        """A copy whose message spells setting(name) as names[name] (e.g. a flag)."""
        renamed = copy.copy(self)
        renamed.setting_names = dict(names)
        return renamed

    def __str__(self) -> str:
        text = f"{self.where}: {self.problem}" + (f"; {self.fix}" if self.fix else "")
        return one_line(name_settings(text, self.setting_names))


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
