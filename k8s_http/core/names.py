"""The apiserver's rules for names, as predicates: what it would refuse, checked first.

An operator that builds objects from a user's spec (a Service named after a
custom resource, env vars from a list) can report a bad name once, in the
custom resource's status, instead of failing every apply with a 422. The rules
are apimachinery's validation (IsDNS1123Label, IsDNS1035Label, ...); each
predicate takes any value and is False for a non-string.
"""

from __future__ import annotations

import re

__all__ = ["is_dns1123_label", "is_dns1123_subdomain", "is_dns1035_label", "is_env_var_name",
           "is_resource_name", "ENV_VAR_NAME", "MAX_LABEL_CHARS", "MAX_SUBDOMAIN_CHARS"]

MAX_LABEL_CHARS = 63            # a DNS label, and a label value
MAX_SUBDOMAIN_CHARS = 253

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# RFC 1035: starts with a letter (Service names).
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The apiserver's (legacy, strict) environment variable name rule; a CRD schema
# may carry the same pattern (manifests/base/crd.yaml does).
ENV_VAR_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# A resource name: `cpu`, `memory`, `ephemeral-storage`, `hugepages-2Mi`, or a
# domain-prefixed extended resource such as `example.com/gpu`.
_RESOURCE_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_dns1123_label(name: object) -> bool:
    """Namespaces and most names: at most 63 of a-z, 0-9, '-', alphanumeric at both ends."""
    return isinstance(name, str) and len(name) <= MAX_LABEL_CHARS and \
        bool(_DNS1123_LABEL.match(name))


def is_dns1123_subdomain(name: object) -> bool:
    """Names of most objects (Leases, ConfigMaps, ...): dot-separated labels, at most 253."""
    return isinstance(name, str) and len(name) <= MAX_SUBDOMAIN_CHARS and \
        bool(_DNS1123_SUBDOMAIN.match(name))


def is_dns1035_label(name: object) -> bool:
    """Service names: a DNS-1123 label that starts with a letter."""
    return isinstance(name, str) and len(name) <= MAX_LABEL_CHARS and \
        bool(_DNS1035_LABEL.match(name))


def is_env_var_name(name: object) -> bool:
    return isinstance(name, str) and bool(ENV_VAR_NAME.match(name))


def is_resource_name(name: object) -> bool:
    """A container resource name (requests / limits keys)."""
    return isinstance(name, str) and bool(_RESOURCE_NAME.match(name))
