"""`ApiClient`: the Kubernetes verbs on plain-dict objects, over a `Transport`.

Objects go in and come out as dicts with camelCase keys, exactly as on the
wire. Every write (create, replace, patch, apply, the status writes, delete)
first calls `write_guard`, so a process that has lost its leader lease cannot
write (`LeaderElector.check` raises NotLeaderError). Errors are the typed
exceptions of `errors`; nothing here retries beyond the transport's policy,
except the pager's one fallback when a continue token expires.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, MutableSequence

from ..core.errors import ApiConnectionError, ApiTimeoutError, GoneError, ProtocolError, from_status
from ..core.objects import Resource
from ..config.cluster import ClusterConfig
from .defaults import MAX_WATCH_LINE_BYTES, WATCH_STALL_TIMEOUT_SECONDS
from .transport import Stream, Transport
from .watchproto import LineDecoder, WatchEvent

__all__ = ["ApiClient", "WatchStream", "PATCH_CONTENT_TYPES", "APPLY_CONTENT_TYPE"]

log = logging.getLogger(__name__)

JSON = "application/json"
PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
# Server-side apply takes YAML, and JSON is YAML: we send JSON.
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
# See ApiClient.apply(create_only=True): a resourceVersion that no stored object has.
_NO_OBJECT_HAS_THIS_RV = "1"


def _encode(body) -> bytes:
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def _meta(obj: dict) -> dict:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        raise ValueError("the object has no metadata")
    return meta


def _name(meta: dict) -> str:
    name = meta.get("name")
    if not name:
        raise ValueError("the object has no metadata.name")
    return name


class ApiClient:
    def __init__(self, transport: Transport, *, write_guard: Callable[[], None] | None = None):
        self.transport = transport
        # Called before every write; raises (NotLeaderError) to refuse it.
        self.write_guard = write_guard

    @classmethod
    def from_config(cls, config: ClusterConfig, *, write_guard: Callable[[], None] | None = None,
                    **transport_kwargs) -> "ApiClient":
        return cls(Transport(config, **transport_kwargs), write_guard=write_guard)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "ApiClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reads

    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            subresource: str | None = None) -> dict:
        path = resource.path(self._object_namespace(resource, namespace), name, subresource)
        return self._json("GET", path)

    def list(self, resource: Resource, *, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None,
             limit: int | None = 500, resource_version: str | None = None,
             into: Callable[[], MutableSequence] = list,
             shard_selector: str | None = None) -> dict:
        """All pages merged: {"apiVersion", "kind", "metadata": {"resourceVersion"}, "items"}.

        Items get apiVersion and kind filled in (the apiserver leaves them out
        of list items). If a continue token expires (410) mid-way, the pages
        read so far are dropped and the list is made again in one unpaginated
        request at the same resourceVersion -- client-go's pager fallback --
        so the result is always one consistent snapshot.

        `into()` makes the container the items are appended to as each page
        arrives (made again if the list starts over): a Store's `StoreList`
        keeps each in the store's form, so a long list is never held as dicts.
        `shard_selector`: KEP-5866's `shardSelector` (k8s_http.core.shards); an
        apiserver without the feature ignores it, so the caller filters too.
        """
        path = resource.path(namespace if resource.namespaced else None)
        base = {"labelSelector": label_selector, "fieldSelector": field_selector,
                "resourceVersion": resource_version, "shardSelector": shard_selector}
        query = dict(base, limit=limit or None)
        pages = []
        items = into()
        while True:
            try:
                page = self._json("GET", path, query=query)
            except GoneError:
                if not query.get("continue"):
                    raise
                log.info("list %s: continue token expired after %d pages; listing again "
                         "in one request", path, len(pages))
                items = into()
                pages = [_prepare_items(self._json("GET", path, query=base), resource, items)]
                break
            pages.append(_prepare_items(page, resource, items))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            # resourceVersion travels inside the token; the apiserver rejects both at once.
            query = dict(base, resourceVersion=None, limit=limit or None)
            query["continue"] = token
        return _merge_pages(pages, resource, items)

    def watch(self, resource: Resource, *, namespace: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              resource_version: str | None = None, allow_bookmarks: bool = True,
              timeout_seconds: float | None = None,
              stall_timeout_seconds: float = WATCH_STALL_TIMEOUT_SECONDS,
              send_initial_events: bool = False,
              skip_managed_fields: bool = False,
              shard_selector: str | None = None) -> "WatchStream":
        """A watch from `resource_version` ("" or None: from now, with the current state).

        `send_initial_events`: a streaming list (client-go's WatchList): the
        server first sends the state not older than `resource_version` as
        ADDED events, then a BOOKMARK annotated `k8s.io/initial-events-end:
        "true"`, then carries on as a watch. It needs bookmarks, so they are
        requested whatever `allow_bookmarks` says. An apiserver without the
        feature refuses it (422) or ignores it (see watchstep.py).
        `shard_selector` (list and watch): KEP-5866's `shardSelector`
        (k8s_http.core.shards writes it); ignored by an apiserver without the
        gate, so callers filter too.

        `skip_managed_fields`: the objects come without
        metadata.managedFields, which are then never decoded
        (watchproto.cut_managed_fields), for a caller that drops them anyway.
        """
        path = resource.path(namespace if resource.namespaced else None)
        query = {"watch": "1", "labelSelector": label_selector,
                 "fieldSelector": field_selector, "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true" if allow_bookmarks or send_initial_events
                 else None,
                 "sendInitialEvents": "true" if send_initial_events else None,
                 "resourceVersionMatch": "NotOlderThan" if send_initial_events else None,
                 "timeoutSeconds": str(int(timeout_seconds)) if timeout_seconds else None,
                 "shardSelector": shard_selector}
        stream = self.transport.stream(path, query=query,
                                       read_timeout_seconds=stall_timeout_seconds)
        return WatchStream(stream, stall_timeout_seconds=stall_timeout_seconds,
                           skip_managed_fields=skip_managed_fields)

    # -- writes

    def create(self, resource: Resource, obj: dict, *, namespace: str | None = None,
               dry_run: bool = False, field_manager: str | None = None) -> dict:
        self._guard()
        ns = self._object_namespace(resource, namespace or _meta(obj).get("namespace"))
        query = {"dryRun": "All" if dry_run else None, "fieldManager": field_manager}
        return self._json("POST", resource.path(ns), query=query, body=_typed(obj, resource))

    def replace(self, resource: Resource, obj: dict, *, namespace: str | None = None,
                subresource: str | None = None) -> dict:
        """PUT; obj.metadata.resourceVersion is the precondition (ConflictError when stale)."""
        self._guard()
        meta = _meta(obj)
        ns = self._object_namespace(resource, namespace or meta.get("namespace"))
        return self._json("PUT", resource.path(ns, _name(meta), subresource),
                          body=_typed(obj, resource))

    def patch(self, resource: Resource, name: str, patch, *, namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None,
              field_manager: str | None = None) -> dict:
        """patch_type: "merge" (RFC 7386), "strategic" or "json" (RFC 6902, a list of ops)."""
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"unknown patch_type {patch_type!r}: use one of "
                             f"{', '.join(PATCH_CONTENT_TYPES)}") from None
        self._guard()
        path = resource.path(self._object_namespace(resource, namespace), name, subresource)
        return self._json("PATCH", path, query={"fieldManager": field_manager}, body=patch,
                          content_type=content_type)

    def apply(self, resource: Resource, obj: dict, *, field_manager: str, force: bool = False,
              namespace: str | None = None, subresource: str | None = None,
              dry_run: bool = False, create_only: bool = False) -> dict:
        """Server-side apply: `obj` is the full intent of `field_manager`.

        create_only: create the object, or raise ConflictError (409) without
        touching it when one of that name already exists -- one request where a
        GET-then-apply needs two and still races. It sends a resourceVersion
        precondition no stored object can meet: etcd starts at revision 1 and its
        first write is revision 2. (A precondition is checked against an existing
        object only; an apply that creates ignores it.)
        """
        if not field_manager:
            raise ValueError("server-side apply needs a field_manager")
        self._guard()
        if create_only:
            obj = {**obj, "metadata": {**_meta(obj), "resourceVersion": _NO_OBJECT_HAS_THIS_RV}}
        meta = _meta(obj)
        ns = self._object_namespace(resource, namespace or meta.get("namespace"))
        query = {"fieldManager": field_manager, "force": "true" if force else None,
                 "dryRun": "All" if dry_run else None}
        return self._json("PATCH", resource.path(ns, _name(meta), subresource),
                          query=query, body=_typed(obj, resource),
                          content_type=APPLY_CONTENT_TYPE)

    def patch_status(self, resource: Resource, name: str, patch, *,
                     namespace: str | None = None, patch_type: str = "merge") -> dict:
        return self.patch(resource, name, patch, namespace=namespace, patch_type=patch_type,
                          subresource="status")

    def replace_status(self, resource: Resource, obj: dict, *,
                       namespace: str | None = None) -> dict:
        return self.replace(resource, obj, namespace=namespace, subresource="status")

    def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
               propagation_policy: str | None = None,
               preconditions: dict | None = None) -> dict | None:
        """DELETE with DeleteOptions; returns what the server answered (the object or a Status)."""
        self._guard()
        path = resource.path(self._object_namespace(resource, namespace), name)
        options: dict = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            options["preconditions"] = preconditions
        resp = self.transport.request("DELETE", path, body=_encode(options), content_type=JSON)
        return resp.json() if resp.body else None

    # -- helpers

    def _guard(self) -> None:
        if self.write_guard is not None:
            self.write_guard()

    def _json(self, method: str, path: str, *, query: dict | None = None, body=None,
              content_type: str | None = None) -> dict:
        data = None if body is None else _encode(body)
        resp = self.transport.request(method, path, query=query, body=data,
                                      content_type=content_type or (JSON if data else None))
        return resp.json()

    @staticmethod
    def _object_namespace(resource: Resource, namespace: str | None) -> str | None:
        if not resource.namespaced:
            return None
        if not namespace:
            raise ValueError(f"{resource} is namespaced: give a namespace")
        return namespace


def _typed(obj: dict, resource: Resource) -> dict:
    """obj with apiVersion/kind filled in from the resource if missing (apply requires them)."""
    if obj.get("apiVersion") and obj.get("kind") or not resource.kind:
        return obj
    out = dict(obj)
    out.setdefault("apiVersion", resource.api_version)
    out.setdefault("kind", resource.kind)
    return out


def _list_type(page: dict, resource: Resource) -> tuple[str, str]:
    """A list page's apiVersion and kind, the resource's where the page has none."""
    return (page.get("apiVersion") or resource.api_version,
            page.get("kind") or f"{resource.kind}List")


def _item_type(page: dict, resource: Resource) -> tuple[str, str]:
    """The apiVersion and kind of a list page's items, from the list's own kind."""
    api_version, list_kind = _list_type(page, resource)
    item_kind = list_kind[:-4] if list_kind.endswith("List") and list_kind != "List" \
        else resource.kind
    return api_version, item_kind


def _prepare_items(page: dict, resource: Resource, into: MutableSequence) -> dict:
    """A page's items as they arrive, typed (the apiserver leaves apiVersion and
    kind out of list items) and appended to `into`; items that are not objects
    dropped. Typed first, so a container that converts each item on the way in
    (a `StoreList`) sees kind and apiVersion. The page is returned without its
    items (its metadata is still read)."""
    items = page.get("items") if isinstance(page, dict) else None
    if items is None:
        return page
    if not isinstance(items, list):
        raise ProtocolError(f"list {resource}: items is not a list")
    api_version, item_kind = _item_type(page, resource)
    for item in items:
        if isinstance(item, dict):
            item.setdefault("apiVersion", api_version)
            if item_kind:
                item.setdefault("kind", item_kind)
            into.append(item)
    del page["items"]
    return page


def _merge_pages(pages: list[dict], resource: Resource, items: MutableSequence) -> dict:
    first, last = pages[0], pages[-1]
    api_version, list_kind = _list_type(first, resource)
    rv = (last.get("metadata") or {}).get("resourceVersion", "")
    meta = {"resourceVersion": rv}
    # KEP-5866: the server's echo of a shardSelector it applied (on every page;
    # absent when it ignored the selector), for shards.is_server_filtered.
    shard_info = (first.get("metadata") or {}).get("shardInfo")
    if shard_info is not None:
        meta["shardInfo"] = shard_info
    return {"apiVersion": api_version, "kind": list_kind, "metadata": meta, "items": items}


class WatchStream:
    """The events of one watch request; iterable once, context manager.

    Iteration ends when the server ends the stream cleanly (timeoutSeconds)
    or after close(). It raises: an ERROR event as its typed error
    (`from_status`, 410 -> GoneError); malformed input as ProtocolError
    (WatchDecodeError, ChunkedFramingError); no complete event for
    `stall_timeout_seconds` -- silence, or bytes trickling in that never
    finish an event -- as ApiTimeoutError; a stream cut in the middle of an
    event as ApiConnectionError. After any of these the stream is closed and
    the caller reconnects.
    """

    def __init__(self, stream: Stream, *,
                 stall_timeout_seconds: float = WATCH_STALL_TIMEOUT_SECONDS,
                 max_line_bytes: int = MAX_WATCH_LINE_BYTES, clock=time.monotonic,
                 skip_managed_fields: bool = False):
        self._stream = stream
        self._decoder = LineDecoder(max_line_bytes=max_line_bytes,
                                    skip_managed_fields=skip_managed_fields)
        self.stall_timeout_seconds = stall_timeout_seconds
        # Real time by default: the stall bounds real socket waits.
        self._clock = clock
        self._closed = False

    @property
    def skipped(self) -> int:
        """Well-formed lines that were not usable events (unknown type, no object)."""
        return self._decoder.skipped

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            last_event = self._clock()
            while True:
                event = self._decoder.next_event()
                if event is not None:
                    last_event = self._clock()
                    if event.type == "ERROR":
                        raise _watch_error(event.object, self._stream.path)
                    yield event
                    continue
                # Read for no longer than what is left of the stall window,
                # so trickling bytes cannot keep a dead watch alive.
                left = self.stall_timeout_seconds - (self._clock() - last_event)
                if left <= 0:
                    raise self._stalled()
                try:
                    data = self._stream.read_payload(timeout_seconds=left)
                except ApiTimeoutError:
                    raise self._stalled() from None
                if not data:
                    if self._closed:
                        return
                    if self._decoder.partial:
                        raise ApiConnectionError(f"watch {self._stream.path}: stream ended in "
                                                 "the middle of an event")
                    return
                self._decoder.feed(data)
        finally:
            self.close()

    def _stalled(self) -> ApiTimeoutError:
        return ApiTimeoutError(f"watch {self._stream.path}: no complete event for "
                               f"{self.stall_timeout_seconds:g}s")

    def close(self) -> None:
        """Thread-safe; unblocks a reader (whose iteration then ends)."""
        self._closed = True
        self._stream.close()

    def __enter__(self) -> "WatchStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _watch_error(status: dict, path: str):
    code = status.get("code")
    if not isinstance(code, int) or code < 300:
        code = 500      # an ERROR event without a usable code is still an error
    return from_status(code, status, method="WATCH", path=path)
