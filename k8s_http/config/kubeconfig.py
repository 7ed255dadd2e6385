"""Kubeconfig files: parsed, merged like kubectl, and turned into `ClusterConfig` arguments.

Everything that can be checked is checked here, at load time: a broken file
is one `ConfigError` line naming the file and the fix.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import yaml

from .configerror import ConfigError, clip, read_file, setting
from .credentials import CredentialSource, ExecCredential, StaticToken, TokenFile, is_valid_token
from .tls import load_ca, load_client_cert
from .urls import parse_server, proxy_from_env

__all__ = ["read_kubeconfig"]


@dataclass
class _Entry:
    """One named cluster, user or context, with the kubeconfig file that defined it."""
    name: str
    body: dict
    path: str

    @property
    def where(self) -> str:
        return f"kubeconfig {self.path}"

    def resolve(self, value: str) -> str:
        """A relative path in a kubeconfig is relative to that file's directory (as kubectl)."""
        if os.path.isabs(value):
            return value
        # Lexical cleaning, like Go's filepath.Join.
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.path)), value))

    def str_field(self, key: str, section: str) -> str | None:
        value = self.body.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(self.where, f"{section} {self.name!r}: {key} must be a string",
                              f"fix {key}")
        return value

    def bool_field(self, key: str, section: str) -> bool:
        value = self.body.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise ConfigError(self.where, f"{section} {self.name!r}: {key} must be true or false",
                              f"fix {key}")
        return value


# libyaml's safe loader when PyYAML was built with it: kubeconfigs with many
# clusters reach hundreds of KiB, and the pure-Python parser is ~10x slower.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_kubeconfig(path: str) -> dict:
    fix = f"fix the file, or name another one with {setting('kubeconfig')}"
    where = f"kubeconfig {path}"
    data = read_file(path, where, "file",
                     f"check the path ({setting('kubeconfig')} or $KUBECONFIG)")
    try:
        doc = yaml.load(data, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        # Only the position and the parser's complaint: the text may hold a token.
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = clip(getattr(e, "problem", "") or "", 80)
        raise ConfigError(where, f"not valid YAML{at}" + (f" ({problem})" if problem else ""),
                          fix) from None
    except RecursionError:
        raise ConfigError(where, "not valid YAML (nested too deeply)", fix) from None
    except (ValueError, AttributeError, LookupError):
        # A scalar typed as a date, number or bool that Python cannot build (2001-13-01,
        # an int over the digit limit, `!!int x`, `!!timestamp x`, `!!bool x`): PyYAML's
        # constructors let a ValueError, AttributeError, KeyError or IndexError through.
        # Its text may quote the value, which may be a token: not shown.
        raise ConfigError(where, "not valid YAML (a value does not fit its type)",
                          fix) from None
    if doc is None:
        return {}   # an empty file is an empty config, as for kubectl
    if not isinstance(doc, dict):
        raise ConfigError(where, f"not a kubeconfig (the YAML is a {type(doc).__name__}, "
                          "not a mapping)", fix)
    return doc


def _entries(doc: dict, path: str, section: str, inner: str) -> list[_Entry]:
    """The `section` list (clusters/users/contexts) of one file, shape-checked."""
    where = f"kubeconfig {path}"
    items = doc.get(section)
    if items is None:
        return []
    if not isinstance(items, list):
        raise ConfigError(where, f"{section} must be a list", f"fix {section}")
    entries = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not item["name"]:
            raise ConfigError(where, f"{section}[{i}] has no name",
                              f"give each entry of {section} a name")
        body = item.get(inner)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ConfigError(where, f"{section}[{i}].{inner} must be a mapping",
                              f"fix {section}[{i}]")
        entries.append(_Entry(item["name"], body, path))
    return entries


def read_kubeconfig(paths: list[str], context: str | None,
                    env: Mapping[str, str]) -> dict:
    """`ClusterConfig` keyword arguments from the merged kubeconfig `paths`, checked."""
    # Merge like kubectl: for each name the first file defining it wins, and
    # current-context comes from the first file that sets one.
    maps: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    current = None
    for path in paths:
        doc = _parse_kubeconfig(path)
        for section, inner in (("clusters", "cluster"), ("users", "user"),
                               ("contexts", "context")):
            for entry in _entries(doc, path, section, inner):
                maps[section].setdefault(entry.name, entry)
        cc = doc.get("current-context")
        if current is None and isinstance(cc, str) and cc:
            current = cc
    where = f"kubeconfig {os.pathsep.join(paths)}"
    names = ", ".join(sorted(maps["contexts"])) or "none"

    name = context or current
    if not name:
        if not maps["contexts"]:
            raise ConfigError(where, "defines no contexts",
                              f"add a context, or name another file with {setting('kubeconfig')}")
        raise ConfigError(where, f"no current-context is set (contexts: {names})",
                          f"pick one of them with {setting('context')}, or run kubectl config "
                          "use-context")
    ctx = maps["contexts"].get(name)
    if ctx is None:
        fix = f"pick one of them with {setting('context')}"
        if not context:
            fix += ", or run kubectl config use-context"
        raise ConfigError(where, f"context {name!r} not found (contexts: {names})", fix)

    cluster_name = ctx.str_field("cluster", "context")
    if not cluster_name:
        raise ConfigError(ctx.where, f"context {name!r} names no cluster",
                          "set contexts[].context.cluster")
    cluster = maps["clusters"].get(cluster_name)
    if cluster is None:
        known = ", ".join(sorted(maps["clusters"])) or "none"
        raise ConfigError(where, f"cluster {cluster_name!r} of context {name!r} not found "
                          f"(clusters: {known})", "fix the context's cluster or add the cluster")
    user_name = ctx.str_field("user", "context")
    user = None
    if user_name:
        user = maps["users"].get(user_name)
        if user is None:
            known = ", ".join(sorted(maps["users"])) or "none"
            raise ConfigError(where, f"user {user_name!r} of context {name!r} not found "
                              f"(users: {known})", "fix the context's user or add the user")

    tls = _cluster_settings(cluster, env)
    cert, key, credentials = None, None, None
    if user is not None:
        cert, key, credentials = _user_settings(user, cluster, tls, env)
    # Fail now on a CA or client certificate that cannot be loaded. An exec
    # plugin is not run at load (kubectl also waits for the first request).
    if urlsplit(tls["server"]).scheme == "https":
        if tls["ca_data"]:
            load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), tls["ca_data"],
                    f"{cluster.where}: cluster {cluster.name!r}")
        if cert is not None:
            load_client_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key,
                             f"{user.where}: user {user.name!r}")
    return dict(credentials=credentials, client_cert_pem=cert, client_key_pem=key,
                namespace=ctx.str_field("namespace", "context") or "default",
                source=f"kubeconfig {os.pathsep.join(paths)} (context {name})", **tls)


def _cluster_settings(cluster: _Entry, env: Mapping[str, str]) -> dict:
    """ClusterConfig keyword arguments from one clusters[] entry."""
    label = f"cluster {cluster.name!r}"
    server = cluster.str_field("server", "cluster")
    if not server:
        raise ConfigError(cluster.where, f"{label} has no server",
                          "set clusters[].cluster.server to https://HOST:PORT")
    url = parse_server(server, f"{cluster.where}: {label}")

    ca_data, ca_file = None, None
    data = cluster.str_field("certificate-authority-data", "cluster")
    path = cluster.str_field("certificate-authority", "cluster")
    if data:   # the -data form wins over the path, as in client-go
        ca_data = _b64(data, cluster, "certificate-authority-data")
    elif path:
        ca_file = cluster.resolve(path)
        ca_data = read_file(ca_file, cluster.where, f"{label}: certificate-authority {ca_file}",
                            "fix the path (a relative path is resolved from the kubeconfig's "
                            "directory) or use certificate-authority-data")
    insecure = cluster.bool_field("insecure-skip-tls-verify", "cluster")
    if insecure and ca_data:
        # kubectl refuses this too: it is never clear which one the user meant.
        raise ConfigError(cluster.where, f"{label} sets both a certificate authority and "
                          "insecure-skip-tls-verify", "remove one of them")

    proxy = cluster.str_field("proxy-url", "cluster")
    if proxy:
        try:
            parsed = urlsplit(proxy)
            parsed.port   # noqa: B018 -- raises ValueError on a bad port
        except ValueError:
            parsed = None
        if parsed is None or parsed.scheme != "http" or not parsed.hostname:
            raise ConfigError(cluster.where, f"{label}: proxy-url must be an http:// URL",
                              "use an HTTP CONNECT proxy: http://HOST:PORT")
    else:
        proxy = proxy_from_env(env, url.scheme, url.hostname)
    return {"server": server.rstrip("/"), "ca_data": ca_data, "ca_file": ca_file,
            "insecure_skip_tls_verify": insecure,
            "tls_server_name": cluster.str_field("tls-server-name", "cluster"),
            "proxy_url": proxy}


def _user_settings(user: _Entry, cluster: _Entry, tls: dict, env: Mapping[str, str]):
    """(client cert PEM, client key PEM, CredentialSource) from one users[] entry."""
    label = f"user {user.name!r}"
    provider = user.body.get("auth-provider")
    if provider:
        kind = provider.get("name") if isinstance(provider, dict) else None
        raise ConfigError(user.where, f"{label} uses auth-provider {kind!r}, which is not "
                          "supported (it was removed from kubectl too)",
                          "switch the user to an exec plugin (e.g. gke-gcloud-auth-plugin, "
                          "kubelogin)")
    acting = [k for k in ("as", "as-uid", "as-groups", "as-user-extra") if user.body.get(k)]
    if acting:
        # Ignoring it would silently act as a different identity than configured.
        raise ConfigError(user.where, f"{label} asks for impersonation ({', '.join(acting)}), "
                          "which is not supported", "remove it, or use that identity's own "
                          "credentials")
    if user.body.get("username") or user.body.get("password"):
        raise ConfigError(user.where, f"{label} uses basic auth (username/password), which "
                          "is not supported", "use a token, a client certificate or an exec plugin")

    cert = _pem_field(user, "client-certificate")
    key = _pem_field(user, "client-key")
    if (cert is None) != (key is None):
        missing = "client-key" if key is None else "client-certificate"
        raise ConfigError(user.where, f"{label} has no {missing} to go with its "
                          f"{'client-certificate' if key is None else 'client-key'}",
                          f"set {missing} (or {missing}-data)")

    token = user.str_field("token", "user")
    token_file = user.str_field("tokenFile", "user")
    plugin = user.body.get("exec")
    if plugin and (token or token_file or cert):
        raise ConfigError(user.where, f"{label} sets an exec plugin and also a token or "
                          "client certificate", "keep only one way to authenticate")

    credentials: CredentialSource | None = None
    if plugin:
        credentials = _exec_source(plugin, user, cluster, tls, env)
    elif token_file:   # a token file wins over an inline token, as in client-go
        path = user.resolve(token_file)
        read_file(path, user.where, f"{label}: tokenFile {path}",
                  "fix the path (a relative path is resolved from the kubeconfig's directory)")
        credentials = TokenFile(path)
        credentials.token()   # an empty file is a load-time error too
    elif token:
        if not is_valid_token(token.strip()):
            raise ConfigError(user.where, f"{label}: the token contains spaces or non-ASCII "
                              "characters", "set token to the bearer token alone")
        credentials = StaticToken(token.strip())
    return cert, key, credentials


def _pem_field(user: _Entry, key: str) -> bytes | None:
    data = user.str_field(f"{key}-data", "user")
    if data:
        return _b64(data, user, f"{key}-data")
    path = user.str_field(key, "user")
    if path:
        path = user.resolve(path)
        return read_file(path, user.where, f"user {user.name!r}: {key} {path}",
                         "fix the path (a relative path is resolved from the kubeconfig's "
                         f"directory) or use {key}-data")
    return None


def _exec_source(spec, user: _Entry, cluster: _Entry, tls: dict,
                 env: Mapping[str, str]) -> ExecCredential:
    label = f"user {user.name!r}"

    def bad(what: str):
        return ConfigError(user.where, f"{label}: exec.{what}", "fix users[].user.exec")

    if not isinstance(spec, dict):
        raise bad("must be a mapping")
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise bad("command is missing")
    if os.sep in command:
        command = user.resolve(command)   # kubectl resolves it only when it is a path
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad("args must be a list of strings")
    items = spec.get("env") or []
    if not isinstance(items, list):
        raise bad("env must be a list of {name, value} strings")
    pairs = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                and isinstance(item.get("value"), str)):
            raise bad("env must be a list of {name, value} strings")
        pairs.append((item["name"], item["value"]))
    api_version = spec.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        raise bad("apiVersion is missing (e.g. client.authentication.k8s.io/v1)")
    hint = spec.get("installHint") if isinstance(spec.get("installHint"), str) else ""
    if shutil.which(command, path=env.get("PATH", os.defpath)) is None:
        raise ConfigError(user.where, f"{label}: exec plugin {command!r} not found "
                          "or not executable",
                          clip(hint, 200) or "install it, or fix users[].user.exec.command")

    cluster_info = None
    if spec.get("provideClusterInfo") is True:
        # The plugin gets the cluster as client.authentication.k8s.io's Cluster type.
        cluster_info = {"server": tls["server"],
                        "insecure-skip-tls-verify": tls["insecure_skip_tls_verify"]}
        if tls["ca_data"]:
            cluster_info["certificate-authority-data"] = base64.b64encode(tls["ca_data"]).decode()
        if tls["tls_server_name"]:
            cluster_info["tls-server-name"] = tls["tls_server_name"]
        if tls["proxy_url"]:
            cluster_info["proxy-url"] = tls["proxy_url"]
        extensions = cluster.body.get("extensions")
        for ext in extensions if isinstance(extensions, list) else []:
            if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
                cluster_info["config"] = ext.get("extension")
    return ExecCredential(command, args, api_version=api_version, env=pairs,
                          interactive_mode=spec.get("interactiveMode") or None,
                          install_hint=hint, cluster_info=cluster_info, base_env=env,
                          where=f"{user.where}: {label}")


def _b64(value: str, entry: _Entry, key: str) -> bytes:
    try:
        # Go's decoder skips line breaks; so do we, but nothing else.
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(entry.where, f"{key} of {entry.name!r} is not valid base64",
                          "set it to the base64 of the PEM file (base64 -w0 FILE)") from None
