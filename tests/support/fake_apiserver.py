"""A scriptable fake kube-apiserver on 127.0.0.1, for faults the real one cannot make on demand.

It speaks just enough of the Kubernetes REST API, for any resource path, to
run a client against it, and lets a test script what goes wrong: a response,
a reset, a stall, raw (broken) bytes, a trickle, a redirect, a 429.
One thread per connection; the HTTP is hand-written on raw sockets, so
nothing stands between a scripted action and the wire.

Starting one::

    from tests.support.certs import test_pki
    from tests.support.fake_apiserver import FakeApiServer

    with FakeApiServer(pki=test_pki(), token="s3cret") as server:   # TLS + bearer token
        server.url            # "https://127.0.0.1:PORT"
        server.host           # "127.0.0.1:PORT"
        client = ApiClient.from_config(server.config())   # URL, test CA, StaticToken(token)
        server.config(credentials=None, client_cert_pem=..., client_key_pem=...)  # overrides
    FakeApiServer()                                    # plain HTTP, no auth
    FakeApiServer(pki=pki, client_cert_auth=True)      # accept client certs signed by the CA
    FakeApiServer(pki=pki, server_cert=pki.expired)    # present another certificate

Objects (an in-memory store per collection path; resourceVersions are strings
from one global counter; every write is recorded in a watch history)::

    from k8s_http.core.objects import CONFIGMAPS
    server.create_object(CONFIGMAPS.path("default"), {"metadata": {"name": "a"}, "data": {}})
    server.update_object(CONFIGMAPS.path("default"), obj)      # MODIFIED
    server.delete_object(CONFIGMAPS.path("default", "a"))      # DELETED (or finalizers honoured)
    server.get_object(CONFIGMAPS.path("default", "a"))         # dict or None
    server.objects(CONFIGMAPS.path("default"))                 # list
    server.resource_version                                    # current global RV (str)

Over HTTP it serves GET (object, list with `limit`/`continue`, `labelSelector`,
`fieldSelector` on metadata.name/namespace), watch (`watch=1|true`,
`resourceVersion`, `timeoutSeconds`, `allowWatchBookmarks`; one event per
chunk), POST (create, 409 AlreadyExists), PUT (replace, 409 Conflict on a
stale resourceVersion), PATCH (merge, strategic -- treated as merge, json
patch, and apply -- a merge that creates, `fieldManager` required), DELETE
(DeleteOptions preconditions; finalizers set deletionTimestamp), the `status`
subresource (only `.status` changes; the main resource never changes status),
`dryRun=All`, and `/version`. List items come without apiVersion/kind, as the
real apiserver sends built-in types. A write that changes nothing does not bump
the resourceVersion. Not modelled: garbage collection, admission, RBAC,
server-side apply field ownership, consistent pagination snapshots (pages come
from the current state), resourceVersion semantics on list.

Streaming lists (client-go's WatchList: a watch with `sendInitialEvents=true`)::

    FakeApiServer(watch_list="support")    # default, as Kubernetes >= 1.34: the matching
                                           # objects as ADDED, then a BOOKMARK annotated
                                           # k8s.io/initial-events-end, then the watch goes on;
                                           # needs resourceVersionMatch=NotOlderThan and
                                           # allowWatchBookmarks=true (else 422)
    FakeApiServer(watch_list="ignore")     # an apiserver that does not know the parameters:
                                           # a plain watch (RV "" -> the state as ADDED, then
                                           # changes; an RV -> changes since it), no end bookmark
    FakeApiServer(watch_list="refuse")     # 422 Invalid "sendInitialEvents is forbidden ...",
                                           # as 1.27-1.33 with the WatchList gate off
    server.watch_list = "refuse"           # may be changed at run time

Watch controls::

    server.bookmark()                      # a BOOKMARK to every watch that allows them
    server.end_watches()                   # clean end, like timeoutSeconds expiring
    server.drop_watches()                  # close every watch mid-stream (no last chunk)
    server.inject_watch_event({"type": "ERROR", "object": status_body(410, "Expired", "...")})
    server.compact()                       # history before the current RV is gone: a watch
                                           # from an older RV gets an ERROR event 410, an
                                           # older continue token a 410 Expired
    server.compact("42")                   # the same, with an explicit compaction point
    server.expire_continue_tokens()        # only continue tokens -> 410 Expired
    server.active_watches                  # number of open watch streams

Requests (every one, in arrival order, scripted or not)::

    server.requests                        # list[Request]: method, path, query (dict of
                                           # str), headers (lower-case names), body (bytes),
                                           # json(), conn_id, client_cn
    server.requests_for("GET", "/api/v1/namespaces/default/configmaps")
    server.clear_requests()
    server.closed_connections              # connections that have ended, server side

Faults: rules are tried in order before the normal handling; the first whose
`match(request)` is true and which has hits left runs its action::

    rule = server.script(action=reset(), match=lambda r: r.method == "POST", times=1)
    server.script(too_many_requests(retry_after=1), times=2)   # match=None: any request
    server.script(respond(500, status_body(500, "InternalError", "boom")))
    server.script(redirect("https://elsewhere.example/"))
    server.script(stall(5))                          # wait 5 s (or until stop), then normal
    server.script(sequence(stall(0.5), close()))     # wait, then FIN without an answer
    server.script(raw(http_head(200, chunked=True), chunk(b'{"type":...}\\n'), b"zz\\r\\n"))
    server.script(trickle(http_head(200, length=10) + b"0123456789", interval_seconds=0.2))
    server.script(close_after_response())            # normal answer, then close silently
    server.script(call(lambda req: server.compact()))   # side effect, then normal
    rule.hits                                        # how often it fired
    server.clear_scripts()

An action is any callable `action(exchange) -> bool`: True means it answered
(or closed); False lets the next step run (the next action in a `sequence`,
else the normal handling). `Exchange` offers `request`, `server`,
`send(bytes)`, `respond(status, body, headers)`, `reset()`, `close()`.

Auth: with `token` set, a request needs `Authorization: Bearer <token>`; with
`client_cert_auth`, a verified client certificate also does. `server.token`
may be changed at run time (rotation tests). Otherwise anonymous is allowed.
Scripted actions run before the auth check.
"""

from __future__ import annotations

import base64
import bisect
import copy
import http
import json
import re
import select
import socket
import ssl
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = [
    "FakeApiServer", "Request", "Exchange", "Rule",
    "respond", "status", "too_many_requests", "redirect", "reset", "close", "stall", "raw",
    "trickle", "close_after_response", "call", "sequence",
    "status_body", "http_head", "chunk", "LAST_CHUNK", "watch_line",
]

# ---------------------------------------------------------------------------
# Wire helpers (also for tests building raw responses)

LAST_CHUNK = b"0\r\n\r\n"


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def status_body(code: int, reason: str = "", message: str = "", details: dict | None = None,
                *, success: bool = False) -> dict:
    """A metav1.Status, as the apiserver sends with errors (and in watch ERROR events)."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Success" if success else "Failure", "message": message,
            "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return body


def http_head(status_code: int, *, headers: dict | None = None, length: int | None = None,
              chunked: bool = False, content_type: str = "application/json") -> bytes:
    """A status line and headers, ending with the blank line."""
    phrase = _phrase(status_code)
    lines = [f"HTTP/1.1 {status_code} {phrase}", f"Content-Type: {content_type}"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def watch_line(type_: str, obj: dict) -> bytes:
    """One watch event line (newline included)."""
    return _dumps({"type": type_, "object": obj}) + b"\n"


def _phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return "Unknown"


# ---------------------------------------------------------------------------
# Requests and exchanges


@dataclass
class Request:
    method: str
    path: str                          # the path as sent (percent-encoded), without the query
    query: dict[str, str]              # last value wins
    headers: dict[str, str]            # lower-case names
    body: bytes
    conn_id: int                       # which TCP connection carried it
    client_cn: str | None = None       # CN of a verified client certificate
    target: str = ""                   # the raw request target

    def json(self):
        return json.loads(self.body) if self.body else None

    @property
    def bearer_token(self) -> str | None:
        value = self.headers.get("authorization", "")
        return value[7:] if value.startswith("Bearer ") else None


class Exchange:
    """One request in flight: what an action may do with it."""

    def __init__(self, server: "FakeApiServer", sock: socket.socket, rfile, request: Request):
        self.server = server
        self.request = request
        self._sock = sock
        self._rfile = rfile
        self.closed = False
        self.keep_alive = request.headers.get("connection", "").lower() != "close"
        self._silent_close = False      # close after the answer, without saying so

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def respond(self, status_code: int, body=None, headers: dict | None = None) -> bool:
        if isinstance(body, (dict, list)):
            payload = _dumps(body)
        elif isinstance(body, str):
            payload = body.encode()
        else:
            payload = body or b""
        hdrs = {"Content-Length": str(len(payload))}
        hdrs.update(headers or {})
        if not self.keep_alive:
            hdrs["Connection"] = "close"
        ctype = hdrs.pop("Content-Type", "application/json")
        self.send(http_head(status_code, headers=hdrs, content_type=ctype) + payload)
        return True

    def reset(self) -> bool:
        """Close with a TCP RST (SO_LINGER 0)."""
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self._release()
        return True

    def close(self) -> bool:
        """Close with a FIN, answering nothing more."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._release()
        return True

    def _release(self) -> None:
        # The read file holds a reference: the descriptor (and so the RST
        # or FIN) goes only when both are closed.
        self._rfile.close()
        self._sock.close()
        self.closed = True


Action = Callable[[Exchange], bool]


@dataclass
class Rule:
    action: Action
    match: Callable[[Request], bool] | None = None
    times: int | None = 1              # None: forever
    hits: int = 0


# ---------------------------------------------------------------------------
# Actions


def respond(status_code: int, body=None, headers: dict | None = None) -> Action:
    return lambda ex: ex.respond(status_code, body, headers)


def status(code: int, reason: str = "", message: str = "", *,
           headers: dict | None = None) -> Action:
    """Answer with a Status body (an API error)."""
    return respond(code, status_body(code, reason, message), headers)


def too_many_requests(retry_after: float | None = 1) -> Action:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return respond(429, status_body(429, "TooManyRequests", "too many requests"), headers)


def redirect(location: str, status_code: int = 302) -> Action:
    return respond(status_code, b"", {"Location": location})


def reset() -> Action:
    return lambda ex: ex.reset()


def close() -> Action:
    return lambda ex: ex.close()


def stall(seconds: float | None) -> Action:
    """Wait (None: until the server stops), then let the next step run."""
    def action(ex: Exchange) -> bool:
        ex.server._stopping.wait(seconds)
        return False
    return action


def raw(*pieces: bytes, delay_seconds: float = 0.0, close_after: bool = True) -> Action:
    """Send bytes verbatim, `delay_seconds` between pieces; then close (FIN) unless told not to."""
    def action(ex: Exchange) -> bool:
        for i, piece in enumerate(pieces):
            if i and delay_seconds and ex.server._stopping.wait(delay_seconds):
                break
            ex.send(piece)
        if close_after:
            ex.close()
        return True
    return action


def trickle(data: bytes, interval_seconds: float = 0.1, step: int = 1) -> Action:
    """Send `data` `step` bytes at a time, `interval_seconds` apart; then close."""
    def action(ex: Exchange) -> bool:
        for i in range(0, len(data), step):
            if ex.server._stopping.is_set():
                break
            try:
                ex.send(data[i:i + step])
            except OSError:
                break               # the client gave up: that is the point
            ex.server._stopping.wait(interval_seconds)
        ex.close()
        return True
    return action


def close_after_response() -> Action:
    """Answer normally, then close the connection without a `Connection: close` header."""
    def action(ex: Exchange) -> bool:
        ex._silent_close = True
        return False
    return action


def call(fn: Callable[[Request], object]) -> Action:
    """Run `fn(request)` for its side effect, then let the next step run."""
    def action(ex: Exchange) -> bool:
        fn(ex.request)
        return False
    return action


def sequence(*actions: Action) -> Action:
    """Run actions in order until one answers (or closes)."""
    def action(ex: Exchange) -> bool:
        for a in actions:
            if a(ex) or ex.closed:
                return True
        return False
    return action


# ---------------------------------------------------------------------------
# Paths, selectors, patches


@dataclass(frozen=True)
class _Route:
    prefix: str            # "/api/v1" or "/apis/GROUP/VERSION"
    namespace: str         # "" for cluster-scoped or all namespaces
    plural: str
    name: str | None
    sub: str | None

    @property
    def collection(self) -> tuple[str, str]:
        return self.prefix, self.plural

    @property
    def api_version(self) -> str:
        return self.prefix[len("/api/"):] if self.prefix.startswith("/api/") \
            else self.prefix[len("/apis/"):]


def _route(path: str) -> _Route | None:
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if len(parts) >= 2 and parts[0] == "api":
        prefix, rest = f"/api/{parts[1]}", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        prefix, rest = f"/apis/{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3 or not all(rest):
        return None
    return _Route(prefix, namespace, rest[0], rest[1] if len(rest) > 1 else None,
                  rest[2] if len(rest) > 2 else None)


_SET_REQ = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _label_matcher(selector: str) -> Callable[[dict], bool]:
    checks = []
    for part in re.split(r",(?![^()]*\))", selector or ""):
        part = part.strip()
        if not part:
            continue
        m = _SET_REQ.match(part)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            checks.append(lambda labels, k=key, vs=values, neg=(op == "notin"):
                          (labels.get(k) in vs) != neg if k in labels else neg)
        elif "!=" in part:
            k, v = (s.strip() for s in part.split("!=", 1))
            checks.append(lambda labels, k=k, v=v: labels.get(k) != v)
        elif "=" in part:
            k, v = (s.strip() for s in part.replace("==", "=").split("=", 1))
            checks.append(lambda labels, k=k, v=v: labels.get(k) == v)
        elif part.startswith("!"):
            checks.append(lambda labels, k=part[1:].strip(): k not in labels)
        else:
            checks.append(lambda labels, k=part: k in labels)
    return lambda obj: all(c((obj.get("metadata") or {}).get("labels") or {}) for c in checks)


def _field_matcher(selector: str) -> Callable[[dict], bool]:
    checks = []
    for part in (selector or "").split(","):
        if not part.strip():
            continue
        neg = "!=" in part
        k, v = (s.strip() for s in part.replace("!=", "=").replace("==", "=").split("=", 1))
        if k not in ("metadata.name", "metadata.namespace"):
            raise _StatusError(400, "BadRequest", f'field label not supported: "{k}"')
        field_name = k.split(".", 1)[1]
        checks.append(lambda obj, f=field_name, v=v, neg=neg:
                      ((obj.get("metadata") or {}).get(f, "") == v) != neg)
    return lambda obj: all(c(obj) for c in checks)


def _merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = _merge_patch(result.get(k), v)
    return result


def _json_patch(doc, ops):
    """RFC 6902, the add / remove / replace / test operations."""
    doc = copy.deepcopy(doc)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        parent = doc
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last = tokens[-1]
        kind = op["op"]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(idx, op["value"])
            elif kind == "remove":
                del parent[idx]
            elif kind == "replace":
                parent[idx] = op["value"]
            elif kind == "test" and parent[idx] != op["value"]:
                raise ValueError("test failed")
        else:
            if kind in ("add", "replace"):
                if kind == "replace" and last not in parent:
                    raise KeyError(last)
                parent[last] = op["value"]
            elif kind == "remove":
                del parent[last]
            elif kind == "test" and parent.get(last) != op["value"]:
                raise ValueError("test failed")
    return doc


class _StatusError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.body = status_body(code, reason, message)
        self.code = code


def _spec_of(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------------------
# The server

# The bearer token tests give a server that takes one: distinctive, so that a
# leak is found by substring.
TOKEN = "t0ken-Sekrit-4f1c9a"



@dataclass
class _Event:
    rv: int
    type: str
    collection: tuple[str, str]
    obj: dict


@dataclass
class _Watch:
    route: _Route
    matches: Callable[[dict], bool]
    bookmarks: bool
    cursor: int                                   # last RV this watch has caught up to
    sock: socket.socket                           # to notice a client that went away
    pending: list = field(default_factory=list)   # ("raw", event) | "bookmark" | "end" | "drop"


class FakeApiServer:
    """See the module docstring. Not started until start() (or `with`)."""

    def __init__(self, *, pki=None, server_cert=None, token: str | None = None,
                 client_cert_auth: bool = False, watch_timeout_seconds: float = 1800.0,
                 watch_list: str = "support"):
        if watch_list not in ("support", "ignore", "refuse"):
            raise ValueError(f"watch_list must be support, ignore or refuse, not {watch_list!r}")
        self.watch_list = watch_list
        self.token = token
        self.client_cert_auth = client_cert_auth
        self.watch_timeout_seconds = watch_timeout_seconds
        self._ctx = None
        self._ca_pem = pki.ca_pem if pki is not None else None
        if pki is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            leaf = server_cert or pki.server
            ctx.load_cert_chain(leaf.cert, leaf.key)
            if client_cert_auth:
                ctx.load_verify_locations(pki.ca_cert)
                ctx.verify_mode = ssl.CERT_OPTIONAL
            self._ctx = ctx
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"{'https' if self._ctx else 'http'}://{self.host}"

        self._stopping = threading.Event()
        # One lock (and condition) guards everything below; watch threads wait on it.
        self._cond = threading.Condition()
        # The global resourceVersion counter. Starts at 1, a fresh etcd's
        # revision, so that no list ever reports "0" (which means "any" to a watch).
        self._rv = 1
        self._store: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
        self._history: list[_Event] = []      # sorted by rv
        self._history_rvs: list[int] = []     # parallel to _history, for bisect
        self._compacted_rv = 0                # watches and continue tokens from before: 410
        self._token_epoch = 0                 # continue tokens from an older epoch: 410
        self._watches: list[_Watch] = []
        self._rules: list[Rule] = []
        self._requests: list[Request] = []
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._next_conn_id = 0
        self.closed_connections = 0
        self.tls_errors: list[str] = []       # handshakes that failed, server side
        self.errors: list[Exception] = []     # exceptions in actions or handlers (bugs)
        self._accept_thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> "FakeApiServer":
        self._listener.listen(64)
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name=f"fake-apiserver-{self.port}")
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)   # wakes a blocked accept() on Linux
        except OSError:
            pass
        self._listener.close()
        with self._cond:
            socks = list(self._sockets)
            self._cond.notify_all()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._accept_thread is not None:
            self._accept_thread.join(5)
        for t in list(self._threads):
            t.join(5)

    def __enter__(self) -> "FakeApiServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- scripting and inspection

    def script(self, action: Action, match: Callable[[Request], bool] | None = None,
               times: int | None = 1) -> Rule:
        rule = Rule(action, match, times)
        with self._cond:
            self._rules.append(rule)
        return rule

    def clear_scripts(self) -> None:
        with self._cond:
            self._rules.clear()

    @property
    def requests(self) -> list[Request]:
        with self._cond:
            return list(self._requests)

    def requests_for(self, method: str | None = None, path: str | None = None) -> list[Request]:
        return [r for r in self.requests
                if (method is None or r.method == method) and (path is None or r.path == path)]

    def clear_requests(self) -> None:
        with self._cond:
            self._requests.clear()

    def config(self, **overrides):
        """A `ClusterConfig` for this server: its URL, the test CA, and its token if set."""
        from k8s_http.config.cluster import ClusterConfig, StaticToken
        settings = {"server": self.url, "ca_data": self._ca_pem,
                    "credentials": StaticToken(self.token) if self.token else None}
        settings.update(overrides)
        return ClusterConfig(**settings)

    @property
    def resource_version(self) -> str:
        with self._cond:
            return str(self._rv)

    @property
    def active_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    # -- the store, directly (same effects as the HTTP verbs, watch events included)

    def create_object(self, collection_path: str, obj: dict) -> dict:
        route = self._must_route(collection_path)
        with self._cond:
            return copy.deepcopy(self._create_locked(route, copy.deepcopy(obj), dry_run=False))

    def update_object(self, collection_path: str, obj: dict) -> dict:
        """Replace unconditionally (the object's resourceVersion is ignored)."""
        route = self._must_route(collection_path)
        name = obj["metadata"]["name"]
        r = _Route(route.prefix, route.namespace, route.plural, name, None)
        new = copy.deepcopy(obj)
        new["metadata"].pop("resourceVersion", None)
        with self._cond:
            return copy.deepcopy(self._update_locked(r, new, dry_run=False))

    def delete_object(self, object_path: str) -> dict:
        route = self._must_route(object_path)
        with self._cond:
            return copy.deepcopy(self._delete_locked(route, {}, dry_run=False))

    def get_object(self, object_path: str) -> dict | None:
        route = self._must_route(object_path)
        with self._cond:
            obj = self._store.get(route.collection, {}).get((route.namespace, route.name))
            return copy.deepcopy(obj)

    def objects(self, collection_path: str) -> list[dict]:
        route = self._must_route(collection_path)
        with self._cond:
            return [copy.deepcopy(o) for (ns, _), o in
                    sorted(self._store.get(route.collection, {}).items())
                    if not route.namespace or ns == route.namespace]

    def _must_route(self, path: str) -> _Route:
        route = _route(path)
        if route is None:
            raise ValueError(f"not an API path: {path}")
        return route

    # -- watch controls

    def bookmark(self) -> None:
        self._to_watches("bookmark")

    def end_watches(self) -> None:
        self._to_watches("end")

    def drop_watches(self) -> None:
        self._to_watches("drop")

    def inject_watch_event(self, event: dict) -> None:
        self._to_watches(("raw", event))

    def _to_watches(self, item) -> None:
        with self._cond:
            for w in self._watches:
                w.pending.append(item)
            self._cond.notify_all()

    def compact(self, resource_version: str | int | None = None) -> None:
        """Forget history before `resource_version` (default: the current one)."""
        with self._cond:
            self._compacted_rv = self._rv if resource_version is None else int(resource_version)

    def expire_continue_tokens(self) -> None:
        with self._cond:
            self._token_epoch += 1

    # -- connections

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._cond:
                self._next_conn_id += 1
                conn_id = self._next_conn_id
                self._sockets.add(sock)
                t = threading.Thread(target=self._serve_connection, args=(sock, conn_id),
                                     daemon=True, name=f"fake-apiserver-conn-{conn_id}")
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _serve_connection(self, sock: socket.socket, conn_id: int) -> None:
        plain = sock
        rfile = None
        try:
            sock.settimeout(10.0)
            client_cn = None
            if self._ctx is not None:
                sock = self._ctx.wrap_socket(sock, server_side=True,
                                             do_handshake_on_connect=False)
                try:
                    sock.do_handshake()
                except (ssl.SSLError, OSError) as e:
                    with self._cond:
                        self.tls_errors.append(str(e))
                    return
                client_cn = _cn(sock.getpeercert())
                with self._cond:
                    self._sockets.discard(plain)
                    self._sockets.add(sock)
            sock.settimeout(None)   # stop() shuts sockets down; reads need no timeout
            rfile = sock.makefile("rb")
            while not self._stopping.is_set():
                req = _read_request(rfile, conn_id, client_cn)
                if req is None:
                    return
                with self._cond:
                    self._requests.append(req)
                ex = Exchange(self, sock, rfile, req)
                self._dispatch(ex)
                if ex.closed or not ex.keep_alive or ex._silent_close:
                    return
        except (OSError, ValueError):
            return              # the client went away, or sent garbage
        except Exception as e:  # a bug in a scripted action or in this server: keep it
            with self._cond:
                self.errors.append(e)
            raise
        finally:
            try:
                if rfile is not None:
                    rfile.close()
                sock.close()
            except OSError:
                pass
            with self._cond:
                self._sockets.discard(sock)
                self._sockets.discard(plain)
                self.closed_connections += 1

    def _dispatch(self, ex: Exchange) -> None:
        with self._cond:
            rule = next((r for r in self._rules
                         if (r.times is None or r.hits < r.times)
                         and (r.match is None or r.match(ex.request))), None)
            if rule is not None:
                rule.hits += 1
        if rule is not None and (rule.action(ex) or ex.closed):
            return
        self._handle(ex)

    # -- the normal API behaviour

    def _authorized(self, req: Request) -> bool:
        if self.token is None and not self.client_cert_auth:
            return True
        if self.token is not None and req.bearer_token == self.token:
            return True
        return self.client_cert_auth and req.client_cn is not None

    def _handle(self, ex: Exchange) -> None:
        req = ex.request
        if not self._authorized(req):
            ex.respond(401, status_body(401, "Unauthorized", "Unauthorized"))
            return
        if req.path == "/version":
            ex.respond(200, {"major": "1", "minor": "36", "gitVersion": "v1.36.0-fake"})
            return
        route = _route(req.path)
        if route is None:
            ex.respond(404, status_body(404, "NotFound",
                                        "the server could not find the requested resource"))
            return
        try:
            if req.method == "GET" and route.name is None:
                if req.query.get("watch") in ("1", "true"):
                    self._serve_watch(ex, route)
                else:
                    ex.respond(200, self._list(route, req.query))
                return
            code, body = self._write_or_get(route, req)
            ex.respond(code, body)
        except _StatusError as e:
            ex.respond(e.code, e.body)

    def _write_or_get(self, route: _Route, req: Request) -> tuple[int, dict]:
        dry_run = req.query.get("dryRun") == "All"
        if route.name is None:
            if req.method != "POST":
                raise _StatusError(405, "MethodNotAllowed", f"{req.method} on a collection")
            obj = _body_json(req)
            with self._cond:
                return 201, copy.deepcopy(self._create_locked(route, obj, dry_run=dry_run))
        if route.sub not in (None, "status"):
            raise _StatusError(404, "NotFound", f"subresource {route.sub} not found")
        with self._cond:
            if req.method == "GET":
                return 200, copy.deepcopy(self._get_locked(route))
            if req.method == "PUT":
                obj = _body_json(req)
                if (obj.get("metadata") or {}).get("name") != route.name:
                    raise _StatusError(400, "BadRequest", "the name of the object does not "
                                       "match the name on the URL")
                return 200, copy.deepcopy(self._update_locked(route, obj, dry_run=dry_run))
            if req.method == "PATCH":
                return 200, copy.deepcopy(self._patch_locked(route, req, dry_run=dry_run))
            if req.method == "DELETE":
                opts = _body_json(req) if req.body else {}
                return 200, copy.deepcopy(self._delete_locked(route, opts, dry_run=dry_run))
        raise _StatusError(405, "MethodNotAllowed", f"{req.method} not allowed")

    def _get_locked(self, route: _Route) -> dict:
        obj = self._store.get(route.collection, {}).get((route.namespace, route.name))
        if obj is None:
            raise _StatusError(404, "NotFound", f'{route.plural} "{route.name}" not found')
        return obj

    def _commit_locked(self, route: _Route, type_: str, obj: dict) -> dict:
        """Give obj the next resourceVersion, store (or remove) it, record the event."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        objects = self._store.setdefault(route.collection, {})
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if type_ == "DELETED":
            objects.pop(key, None)
        else:
            objects[key] = obj
        self._history.append(_Event(self._rv, type_, route.collection, copy.deepcopy(obj)))
        self._history_rvs.append(self._rv)
        self._cond.notify_all()
        return obj

    def _create_locked(self, route: _Route, obj: dict, *, dry_run: bool) -> dict:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _StatusError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if route.namespace:
            if meta.get("namespace", route.namespace) != route.namespace:
                raise _StatusError(400, "BadRequest", "the namespace of the object does not "
                                   "match the namespace on the request")
            meta["namespace"] = route.namespace
        key = (route.namespace, meta["name"])
        if key in self._store.get(route.collection, {}):
            raise _StatusError(409, "AlreadyExists",
                               f'{route.plural} "{meta["name"]}" already exists')
        meta.pop("resourceVersion", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        if dry_run:
            return obj
        return self._commit_locked(route, "ADDED", obj)

    def _update_locked(self, route: _Route, obj: dict, *, dry_run: bool) -> dict:
        old = self._get_locked(route)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise _StatusError(409, "Conflict", f'Operation cannot be fulfilled on {route.plural} '
                               f'"{route.name}": the object has been modified; please apply '
                               'your changes to the latest version and try again')
        new = copy.deepcopy(obj)
        # Only the status subresource changes status, and it changes nothing else.
        if route.sub == "status":
            new = dict(copy.deepcopy(old), status=new.get("status"))
            if new["status"] is None:
                del new["status"]
        elif "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
        meta["generation"] = old["metadata"].get("generation", 1) + \
            (1 if _spec_of(new) != _spec_of(old) else 0)
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return old              # a no-op write: no new resourceVersion, no event
        if dry_run:
            return new
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._commit_locked(route, "DELETED", new)
        return self._commit_locked(route, "MODIFIED", new)

    def _patch_locked(self, route: _Route, req: Request, *, dry_run: bool) -> dict:
        ctype = req.headers.get("content-type", "").split(";")[0].strip()
        objects = self._store.get(route.collection, {})
        old = objects.get((route.namespace, route.name))
        try:
            patch = json.loads(req.body)
        except ValueError:
            raise _StatusError(400, "BadRequest", "the patch is not JSON") from None
        if ctype == "application/apply-patch+yaml":
            if not req.query.get("fieldManager"):
                raise _StatusError(400, "BadRequest",
                                   "PATCH with apply requires fieldManager")
            if old is None:
                if route.sub:
                    raise _StatusError(404, "NotFound", f'{route.plural} "{route.name}" '
                                       'not found')
                obj = copy.deepcopy(patch)
                obj.setdefault("metadata", {})["name"] = route.name
                return self._create_locked(route, obj, dry_run=dry_run)
            new = _merge_patch(old, patch)
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if old is None:
                self._get_locked(route)
            new = _merge_patch(old, patch)
        elif ctype == "application/json-patch+json":
            if old is None:
                self._get_locked(route)
            try:
                new = _json_patch(old, patch)
            except (KeyError, IndexError, ValueError, TypeError) as e:
                raise _StatusError(422, "Invalid", f"json patch failed: {e}") from None
        else:
            raise _StatusError(415, "UnsupportedMediaType",
                               f"the body of the request was in an unknown format: {ctype}")
        # A resourceVersion in the patch is a precondition (as on the real apiserver).
        want = (patch.get("metadata") or {}).get("resourceVersion") \
            if isinstance(patch, dict) else None
        if not want:
            new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self._update_locked(route, new, dry_run=dry_run)

    def _delete_locked(self, route: _Route, opts: dict, *, dry_run: bool) -> dict:
        old = self._get_locked(route)
        pre = opts.get("preconditions") or {}
        for k in ("uid", "resourceVersion"):
            if pre.get(k) and pre[k] != old["metadata"].get(k):
                raise _StatusError(409, "Conflict", f'Precondition failed: {k} in precondition: '
                                   f'{pre[k]}, {k} in object meta: {old["metadata"].get(k)}')
        new = copy.deepcopy(old)
        if dry_run:
            return new
        if new["metadata"].get("finalizers"):
            if new["metadata"].get("deletionTimestamp"):
                return old
            new["metadata"]["deletionTimestamp"] = _now()
            return self._commit_locked(route, "MODIFIED", new)
        return self._commit_locked(route, "DELETED", new)

    def _matching_locked(self, route: _Route, query: dict) -> tuple[list, Callable]:
        labels = _label_matcher(query.get("labelSelector", ""))
        fields = _field_matcher(query.get("fieldSelector", ""))

        def matches(obj: dict) -> bool:
            ns = (obj.get("metadata") or {}).get("namespace", "")
            return (not route.namespace or ns == route.namespace) and labels(obj) and fields(obj)

        objects = self._store.get(route.collection, {})
        return [o for _, o in sorted(objects.items()) if matches(o)], matches

    def _list(self, route: _Route, query: dict) -> dict:
        limit = int(query.get("limit") or 0)
        with self._cond:
            items, _ = self._matching_locked(route, query)
            rv = self._rv
            start = None
            if query.get("continue"):
                try:
                    token = json.loads(base64.urlsafe_b64decode(query["continue"]))
                    start = tuple(token["start"])
                    token_rv, epoch = int(token["rv"]), int(token["epoch"])
                except (ValueError, KeyError, TypeError):
                    raise _StatusError(400, "BadRequest", "invalid continue token") from None
                if token_rv < self._compacted_rv or epoch < self._token_epoch:
                    raise _StatusError(
                        410, "Expired", "The provided continue parameter is too old to display "
                        "a consistent list result. You can start a new list without the "
                        "continue parameter.")
                rv = token_rv
                items = [o for o in items if _key(o) > start]
            kind = next((o.get("kind") for o in items if o.get("kind")), None)
            metadata = {"resourceVersion": str(rv)}
            if limit and len(items) > limit:
                token = {"rv": rv, "epoch": self._token_epoch,
                         "start": list(_key(items[limit - 1]))}
                metadata["continue"] = base64.urlsafe_b64encode(_dumps(token)).decode()
                metadata["remainingItemCount"] = len(items) - limit
                items = items[:limit]
            out_items = []
            for o in items:
                o = copy.deepcopy(o)
                o.pop("apiVersion", None)
                o.pop("kind", None)
                out_items.append(o)
        return {"kind": f"{kind}List" if kind else "List", "apiVersion": route.api_version,
                "metadata": metadata, "items": out_items}

    def _serve_watch(self, ex: Exchange, route: _Route) -> None:
        q = ex.request.query
        rv_param = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds") or self.watch_timeout_seconds)
        deadline = time.monotonic() + timeout
        streaming = q.get("sendInitialEvents") == "true" and self.watch_list != "ignore"
        if streaming:
            _check_watch_list(q, self.watch_list)
        with self._cond:
            _, matches = self._matching_locked(route, q)
            watch = _Watch(route, matches, q.get("allowWatchBookmarks") == "true", self._rv,
                           ex._sock)
            if streaming:
                # The current state is "not older than" any RV the client can have;
                # the end bookmark carries the RV it is consistent at.
                initial = [{"type": "ADDED", "object": o}
                           for o in self._matching_locked(route, q)[0]]
                initial.append({"type": "BOOKMARK", "object": {
                    "kind": "Bookmark", "apiVersion": route.api_version,
                    "metadata": {"resourceVersion": str(self._rv),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}})
            elif rv_param in ("", "0"):
                initial = [{"type": "ADDED", "object": o}
                           for o in self._matching_locked(route, q)[0]]
            else:
                try:
                    since = int(rv_param)
                except ValueError:
                    raise _StatusError(400, "BadRequest", "invalid resourceVersion") from None
                if since < self._compacted_rv:
                    initial = [{"type": "ERROR", "object": status_body(
                        410, "Expired", f"too old resource version: {since} "
                        f"({self._compacted_rv})")}]
                    watch.pending.append("end")
                else:
                    initial = []
                    watch.cursor = since
            initial = copy.deepcopy(initial)
            self._watches.append(watch)
        try:
            ex.send(http_head(200, chunked=True))
            for event in initial:
                ex.send(chunk(_dumps(event) + b"\n"))
            while True:
                out, finish = self._next_watch_items(watch, route, deadline)
                for event in out:
                    ex.send(chunk(_dumps(event) + b"\n"))
                if finish == "end":
                    ex.send(LAST_CHUNK)
                    ex.close()
                    return
                if finish == "drop":
                    ex.close()
                    return
        finally:
            with self._cond:
                self._watches.remove(watch)

    def _next_watch_items(self, watch: _Watch, route: _Route, deadline: float):
        """Wait for something to send; return (events, None | "end" | "drop")."""
        with self._cond:
            while True:
                out = []
                if self._rv > watch.cursor:
                    i = bisect.bisect_right(self._history_rvs, watch.cursor)
                    for ev in self._history[i:]:
                        if ev.collection == route.collection and watch.matches(ev.obj):
                            out.append({"type": ev.type, "object": copy.deepcopy(ev.obj)})
                    watch.cursor = self._rv
                finish = None
                while watch.pending and finish is None:
                    item = watch.pending.pop(0)
                    if item == "bookmark":
                        if watch.bookmarks:
                            out.append({"type": "BOOKMARK", "object": {
                                "kind": "Bookmark", "apiVersion": route.api_version,
                                "metadata": {"resourceVersion": str(watch.cursor)}}})
                    elif item in ("end", "drop"):
                        finish = item
                    else:
                        out.append(item[1])
                remaining = deadline - time.monotonic()
                if self._stopping.is_set() or _peer_closed(watch.sock):
                    finish = finish or "drop"
                elif remaining <= 0:
                    finish = finish or "end"
                if out or finish:
                    return out, finish
                # Wake at least every second to notice a client that hung up.
                self._cond.wait(min(remaining, 1.0))


def _check_watch_list(query: dict, mode: str) -> None:
    """Refuse a streaming list as the real apiserver does (ValidateListOptions)."""
    if mode == "refuse":
        raise _StatusError(422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: "
                           "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for "
                           "watch unless the WatchList feature gate is enabled")
    if query.get("resourceVersionMatch") != "NotOlderThan":
        raise _StatusError(422, "Invalid", "resourceVersionMatch: Forbidden: sendInitialEvents "
                           "requires setting resourceVersionMatch to NotOlderThan")
    if query.get("allowWatchBookmarks") != "true":
        raise _StatusError(422, "Invalid", "allowWatchBookmarks: Required value: "
                           "allowWatchBookmarks must be set to true when sendInitialEvents is set")


def _peer_closed(sock: socket.socket) -> bool:
    """A watch client sends nothing after its request: readable means it hung up."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _key(obj: dict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def _cn(peercert) -> str | None:
    for rdn in (peercert or {}).get("subject", ()):
        for k, v in rdn:
            if k == "commonName":
                return v
    return None


def _body_json(req: Request) -> dict:
    try:
        obj = json.loads(req.body)
    except ValueError:
        raise _StatusError(400, "BadRequest", "the body is not JSON") from None
    if not isinstance(obj, dict):
        raise _StatusError(400, "BadRequest", "the body is not a JSON object")
    return obj


_MAX_HEAD = 64 * 1024


def _read_request(rfile, conn_id: int, client_cn: str | None) -> Request | None:
    """Read one HTTP/1.1 request; None at a clean EOF between requests."""
    line = rfile.readline(_MAX_HEAD)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: dict[str, str] = {}
    total = len(line)
    while True:
        line = rfile.readline(_MAX_HEAD)
        total += len(line)
        if not line or total > _MAX_HEAD:
            raise ValueError("truncated or oversized request head")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    body = rfile.read(length) if length else b""
    if len(body) < length:
        raise ValueError("truncated request body")
    url = urlsplit(target)
    return Request(method=method, path=url.path, query=dict(parse_qsl(url.query)),
                   headers=headers, body=body, conn_id=conn_id, client_cn=client_cn,
                   target=target)
