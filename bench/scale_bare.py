#!/usr/bin/env python3
"""The bare-client baseline for bench/scale.py: the time a client that keeps
nothing needs to receive every object of one resource from the apiserver.

    python bench/scale_bare.py --kubeconfig KC --resource my.mine.jp/v1 [--namespace NS]
    {"resource": "my.mine.jp", "namespace": null, "mode": "streaming",
     "objects": 100000, "seconds": 12.3}

The goal it serves (issue 17): the operator is ready within 1.2x this time.
"Bare" is k8s_http's own transport and decoder and nothing else: one streaming
list (a watch with sendInitialEvents=true, resourceVersionMatch=NotOlderThan,
as the operator's informers make it), each event parsed into a dict and
dropped, timed from the request to the k8s.io/initial-events-end bookmark.
Where the apiserver does not stream lists (refused, or ignored: any event other
than an initial ADDED before the end bookmark) it times the paged list instead
(500 a page, as the informers fall back to), items dropped page by page, and
says so in "mode".

From Python (bench/scale.py)::

    from scale_bare import measure
    result = measure(client, resource, namespace=None)   # {"mode", "objects", "seconds"}

`--resource` is PLURAL[.GROUP]/VERSION ("deployments.apps/v1", "services/v1");
add --cluster-scoped for a cluster-scoped resource.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from k8s_http.wire.client import ApiClient  # noqa: E402
from k8s_http.config.cluster import load_config  # noqa: E402
from k8s_http.config.configerror import ConfigError  # noqa: E402
from k8s_http.core.errors import ApiError, K8sHttpError  # noqa: E402
from k8s_http.core.objects import Resource  # noqa: E402
from k8s_http.cache.watchstep import INITIAL_EVENTS_END  # noqa: E402

__all__ = ["measure", "parse_resource", "NotStreaming"]

PAGE_SIZE = 500


class NotStreaming(Exception):
    """The apiserver refused or ignored the streaming list."""


def parse_resource(text: str, *, namespaced: bool = True) -> Resource:
    """PLURAL[.GROUP]/VERSION -> Resource; ValueError with the expected form otherwise."""
    name, slash, version = text.partition("/")
    plural, _, group = name.partition(".")
    if not slash or not plural or not version or "/" in version:
        raise ValueError(f"--resource {text!r}: expected PLURAL[.GROUP]/VERSION, "
                         "e.g. deployments.apps/v1 or services/v1")
    return Resource(group, version, plural, namespaced, "")


def _stream(client: ApiClient, resource: Resource, namespace: str | None) -> int:
    """Objects received by one streaming list, up to its end bookmark."""
    objects = 0
    try:
        with client.watch(resource, namespace=namespace, send_initial_events=True,
                          timeout_seconds=600) as events:
            for event in events:
                if event.type == "ADDED":
                    objects += 1
                    continue
                annotations = event.object.get("metadata", {}).get("annotations") or {}
                if event.type == "BOOKMARK" and annotations.get(INITIAL_EVENTS_END) == "true":
                    return objects
                raise NotStreaming(f"a {event.type} event before the end bookmark")
    except ApiError as err:
        if err.code in (400, 403, 422):
            raise NotStreaming(str(err)) from None
        raise
    raise NotStreaming("the stream ended before the end bookmark")


def _paged(client: ApiClient, resource: Resource, namespace: str | None) -> int:
    """Objects received by a paged list, each dropped as its page arrives."""
    counted = [0]

    def drop(item: dict) -> None:
        counted[0] += 1          # None is not a dict: the merged list keeps nothing

    client.list(resource, namespace=namespace, limit=PAGE_SIZE, transform=drop)
    return counted[0]


def measure(client: ApiClient, resource: Resource, namespace: str | None = None) -> dict:
    """{"mode": "streaming" | "paged", "objects": n, "seconds": wall time to receive them}."""
    started = time.perf_counter()
    try:
        objects = _stream(client, resource, namespace)
        mode = "streaming"
    except NotStreaming:
        started = time.perf_counter()
        objects = _paged(client, resource, namespace)
        mode = "paged"
    return {"mode": mode, "objects": objects, "seconds": round(time.perf_counter() - started, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, then ~/.kube/config")
    parser.add_argument("--resource", required=True, help="PLURAL[.GROUP]/VERSION")
    parser.add_argument("--namespace", help="default: all namespaces")
    parser.add_argument("--cluster-scoped", action="store_true")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs; the best is reported, every run in 'runs'")
    args = parser.parse_args(argv)
    try:
        resource = parse_resource(args.resource, namespaced=not args.cluster_scoped)
        client = ApiClient.from_config(load_config(args.kubeconfig))
    except (ValueError, ConfigError) as err:
        print(f"scale_bare: {err}", file=sys.stderr)
        return 2
    try:
        runs = [measure(client, resource, args.namespace) for _ in range(max(args.repeat, 1))]
    except K8sHttpError as err:
        print(f"scale_bare: {err}", file=sys.stderr)
        return 1
    finally:
        client.close()
    best = min(runs, key=lambda r: r["seconds"])
    print(json.dumps({"resource": str(resource), "namespace": args.namespace, **best,
                      "runs": [r["seconds"] for r in runs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
