"""Inputs bench/fuzz.py found that escaped as an exception other than the documented
one: each is fed here through the same entry point the fuzz target used."""

from __future__ import annotations

import pytest

from k8s_http.configerror import ConfigError
from k8s_http.kubeconfig import read_kubeconfig

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

