"""Inputs bench/fuzz.py found that escaped as an exception other than the documented
one: each is fed here through the same entry point the fuzz target used."""

from __future__ import annotations

import pytest

from k8s_http.cache import watchstep
from k8s_http.wire.client import WatchStream
from k8s_http.config.configerror import ConfigError
from k8s_http.core.errors import ServerError, from_status, has_status_cause, is_namespace_terminating
from k8s_http.config.kubeconfig import read_kubeconfig

# YAML that parses, but whose plain scalars libyaml's resolver types as a date or an
# int that Python cannot build: PyYAML raises ValueError there, not a YAMLError.
UNCONSTRUCTIBLE_VALUES = [
    b"when: 2001-13-01\n",                      # the fuzzer's: month 13
    b"when: 2001-02-30\n",                      # no such day
    b"when: 2001-01-01 25:00:00\n",             # no such hour
    b"n: " + b"1" * 5000 + b"\n",               # over Python's int-from-text digit limit
    b"n: !!int not-a-number\n",                 # an explicit tag on a value that is not one
    b"x: !!float 1e\n",
    # The fuzzer's second: a timestamp tag on text no date pattern matches, where
    # PyYAML's constructor calls .groupdict() on None (AttributeError).
    b"clusters:\n- name: c\n  cluster:\n  !!timestamp  server: https://not-a-date\n",
    # Found reading PyYAML's other constructors after that: a KeyError and an IndexError.
    b"insecure-skip-tls-verify: !!bool maybe\n",
    b"n: !!int ''\n",
]


@pytest.mark.parametrize("text", UNCONSTRUCTIBLE_VALUES)
def test_kubeconfig_with_a_value_yaml_cannot_build_is_a_config_error(tmp_path, text):
    path = tmp_path / "config"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as e:
        read_kubeconfig([str(path)], None, {})
    message = str(e.value)
    assert str(path) in message and "not valid YAML" in message
    assert "\n" not in message
    # The value may be a secret: the message never quotes it.
    assert "not-a-number" not in message and "2001" not in message


class _Payload:
    """The transport's Stream (its reading half): these bytes, then the end."""

    path = "/api/v1/pods"

    def __init__(self, data: bytes):
        self._parts = [data]

    def read_payload(self, timeout_seconds=None):
        return self._parts.pop() if self._parts else b""

    def close(self):
        pass


@pytest.mark.parametrize("causes", ["5", "true", "1.5", '{"reason":"ResourceVersionTooLarge"}'])
def test_an_error_event_whose_causes_are_not_a_list_is_a_failure(causes):
    # A 504 ERROR event goes through is_too_large_resource_version, which looked for a
    # typed cause by iterating details.causes whatever it was: TypeError for a number.
    line = ('{"type":"ERROR","object":{"kind":"Status","code":504,"message":"x",'
            f'"details":{{"causes":{causes}}}}}}}\n').encode()
    with pytest.raises(ServerError) as e:
        list(WatchStream(_Payload(line), clock=lambda: 0.0))
    assert watchstep.failure(e.value).reason == "error"
    assert not is_namespace_terminating(e.value)


def test_a_write_refused_with_causes_that_are_not_a_list_is_no_namespace_termination():
    err = from_status(403, b'{"kind":"Status","code":403,"details":{"causes":7}}')
    assert not has_status_cause(err, "NamespaceTerminating")
