"""Server and proxy URLs: checked, proxies chosen from the environment, redacted for display."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from .configerror import ConfigError

__all__ = ["parse_server", "redact_userinfo", "proxy_from_env"]


def parse_server(server, where: str):
    fix = "set the cluster's server to https://HOST:PORT"
    if not isinstance(server, str) or not server:
        raise ConfigError(where, "no server URL", fix)
    try:
        url = urlsplit(server)
        url.port   # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise ConfigError(where, f"server {server!r} is not a valid URL", fix) from None
    if url.scheme not in ("https", "http"):
        raise ConfigError(where, f"server {server!r} is not an http(s) URL", fix)
    if any(c.isspace() or not c.isprintable() for c in server):
        raise ConfigError(where, f"server {server!r} contains spaces or control characters", fix)
    if not url.hostname:
        raise ConfigError(where, f"server {server!r} has no host", fix)
    if url.username or url.password:
        raise ConfigError(where, "server URL carries a user name or password",
                          "remove it and use a token, certificate or exec plugin")
    return url


def redact_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"<redacted>@{host}").geturl()

# --------------------------------------------------------------------------
# Proxies from the environment (as Go's http.ProxyFromEnvironment, which client-go uses)


def proxy_from_env(env: Mapping[str, str], scheme: str, host: str) -> str | None:
    names = ("HTTPS_PROXY", "https_proxy") if scheme == "https" else ("HTTP_PROXY", "http_proxy")
    proxy = next((env[n] for n in names if env.get(n)), None)
    if not proxy or _is_loopback(host) or _is_no_proxy(host, env):
        return None
    return proxy if "://" in proxy else "http://" + proxy


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_no_proxy(host: str, env: Mapping[str, str]) -> bool:
    """NO_PROXY: "*", IPs and CIDRs, "name" (itself and subdomains), ".name" (subdomains)."""
    host = host.lower()
    entries = (env.get("NO_PROXY") or env.get("no_proxy") or "").split(",")
    for entry in (e.strip().lower() for e in entries):
        if entry == "*":
            return True
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                return True
            continue
        except ValueError:
            pass   # not an IP host, or not an IP entry: compare as names
        if entry.count(":") == 1:
            entry = entry.rsplit(":", 1)[0]   # "name:port": the port is not compared
        if entry.startswith("."):
            if host.endswith(entry):
                return True
        elif entry and (host == entry or host.endswith("." + entry)):
            return True
    return False
