"""The bare-client baseline: read what the operator's informers read at start-up, keep nothing.

    python -m bench bare --kubeconfig K --namespace NS [--mode paged]

Lists the namespace's `My`, and its Deployments and Services carrying the
operator's managed-by label (controller.MANAGED_SELECTOR: the operator's own
selectors), one thread per resource as the operator's informers do, with
k8s_http's client. Prints one JSON line: items per resource and seconds from
the first request to the last item. `python -m bench scale` runs it as a fresh
process and times it from spawn to exit too, as it times an operator from spawn
to ready; `python -m bench startup_list` and `startup_replay` use its pieces.

"Bare" is k8s_http's own transport and decoder and nothing else. Two modes
(LISTERS: a function (client, resource, namespace, label_selector) -> items read):

  stream  one streaming list (a watch with sendInitialEvents=true,
          resourceVersionMatch=NotOlderThan, as the informers make it), each event
          parsed into a dict and dropped, up to the k8s.io/initial-events-end
          bookmark; where the apiserver does not stream lists (refused, or ignored:
          any event other than an initial ADDED before the end bookmark) the paged
          list instead. It takes no label selector: in the fleet's namespace every
          Deployment and Service carries the operator's label, so it reads the same
          objects. The default.
  paged   the paged list every client has (500 a page, as the informers fall back
          to), each page parsed whole, its items dropped as it arrives.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from bench.convergence.cluster import BENCH_USER_AGENT
from my.spec import MANAGED_SELECTOR, MY
from k8s_http.wire.client import ApiClient
from k8s_http.config.cluster import load_config
from k8s_http.core.errors import ApiError, K8sHttpError
from k8s_http.core.objects import DEPLOYMENTS, SERVICES, Resource
from k8s_http.cache.watchstep import INITIAL_EVENTS_END

PAGE_SIZE = 500
# The bench's own prefix: the audit-log counter never takes these reads for the operator's.
USER_AGENT = BENCH_USER_AGENT + "-bare"


class NotStreaming(Exception):
    """The apiserver refused or ignored the streaming list."""


def paged_list(client: ApiClient, resource: Resource, namespace: str | None,
               label_selector: str | None = None) -> int:
    """Items read by a paged list; each item is dropped as its page arrives."""
    sinks: list[_Counted] = []

    def new_sink() -> _Counted:          # made again if the list starts over
        sinks.append(_Counted())
        return sinks[-1]

    client.list(resource, namespace=namespace, label_selector=label_selector,
                limit=PAGE_SIZE, into=new_sink)
    return sinks[-1].count


class _Counted:
    """A list's container (ApiClient.list's `into`; `append` is all it calls)
    that keeps nothing but a count."""

    def __init__(self) -> None:
        self.count = 0

    def append(self, _item: dict) -> None:
        self.count += 1


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


def measure(client: ApiClient, resource: Resource, namespace: str | None = None) -> dict:
    """{"mode": "streaming" | "paged", "objects": n, "seconds": wall time to receive them}:
    the streaming list, or the paged one where the apiserver does not stream."""
    started = time.perf_counter()
    try:
        objects = _stream(client, resource, namespace)
        mode = "streaming"
    except NotStreaming:
        started = time.perf_counter()
        objects = paged_list(client, resource, namespace)
        mode = "paged"
    return {"mode": mode, "objects": objects, "seconds": round(time.perf_counter() - started, 4)}


def streaming_list(client: ApiClient, resource: Resource, namespace: str,
                   label_selector: str | None) -> int:
    """`measure`'s objects: the label selector is not needed (see the module's doc)."""
    return measure(client, resource, namespace)["objects"]


LISTERS = {"stream": streaming_list, "paged": paged_list}
DEFAULT_MODE = "stream"
READS = ((MY, None), (DEPLOYMENTS, MANAGED_SELECTOR), (SERVICES, MANAGED_SELECTOR))


def read_all(client: ApiClient, namespace: str, mode: str) -> dict:
    """The three reads in parallel threads; items per resource and seconds."""
    lister = LISTERS[mode]
    counts: dict[str, int] = {}
    errors: list[BaseException] = []

    def one(resource, selector) -> None:
        try:
            counts[resource.plural] = lister(client, resource, namespace, selector)
        except BaseException as err:      # re-raised below, in the main thread
            errors.append(err)

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=read) for read in READS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    if errors:
        raise errors[0]
    return {"mode": mode, "items": counts, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--mode", choices=sorted(LISTERS), default=DEFAULT_MODE)
    args = parser.parse_args(argv)
    try:
        config = load_config(args.kubeconfig)
        with ApiClient.from_config(config, user_agent=USER_AGENT, pool_size=len(READS)) as client:
            result = read_all(client, args.namespace, args.mode)
    except (K8sHttpError, OSError, ValueError) as err:
        print(f"bare client: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
