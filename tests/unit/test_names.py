"""k8s_http.core.names: the apiserver's name rules, checked before a request would be refused."""

import pytest

from k8s_http import (is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_env_var_name,
                      is_resource_name)


@pytest.mark.parametrize("name, label, subdomain, dns1035", [
    ("web", True, True, True),
    ("web-1", True, True, True),
    ("1web", True, True, False),             # a Service name must start with a letter
    ("a" * 63, True, True, True),
    ("a" * 64, False, True, False),          # too long for a label, not for a subdomain
    ("a.b", False, True, False),
    ("a" * 253, False, True, False),
    ("a" * 254, False, False, False),
    ("Web", False, False, False),
    ("web-", False, False, False),
    ("", False, False, False),
    (None, False, False, False),
    (7, False, False, False),
])
def test_dns_names(name, label, subdomain, dns1035):
    assert is_dns1123_label(name) is label
    assert is_dns1123_subdomain(name) is subdomain
    assert is_dns1035_label(name) is dns1035


@pytest.mark.parametrize("name, ok", [
    ("FOO", True), ("foo.bar-baz_1", True), ("-x", True), ("1ABC", False), ("A B", False),
    ("", False), (None, False), ("A=B", False),
])
def test_env_var_names(name, ok):
    assert is_env_var_name(name) is ok


@pytest.mark.parametrize("name, ok", [
    ("cpu", True), ("ephemeral-storage", True), ("hugepages-2Mi", True),
    ("example.com/gpu", True), ("Example.com/gpu", False), ("example.com/", False),
    ("-cpu", False), ("", False), (3, False),
])
def test_resource_names(name, ok):
    assert is_resource_name(name) is ok
