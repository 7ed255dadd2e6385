#!/usr/bin/env python3
"""The bare-client baseline: read what the operator's informers read at start-up, keep nothing.

    python -m bench bare --kubeconfig K --namespace NS [--mode paged]

Lists the namespace's `My`, and its Deployments and Services carrying the
operator's managed-by label (controller.MANAGED_SELECTOR: the operator's own
selectors), one thread per resource as the operator's informers do, with
k8s_http's client. Prints one JSON line: items per resource and seconds from
the first request to the last item. bench/scale.py runs it as a fresh process
and times it from spawn to exit too, as it times an operator from spawn to ready.

The seam: LISTERS maps a mode to a function (client, resource, namespace,
label_selector) -> items read. "paged" is the paged list every client has
(500 per page, each page parsed whole, then dropped). "stream" is issue 17a's
bench/scale_bare.py (a watch with sendInitialEvents=true up to the
initial-events-end bookmark, paged where refused): registered, and the default,
as soon as that module can be imported; until then "paged" is all there is.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from controller import MANAGED_SELECTOR, MY
from convergence.cluster import BENCH_USER_AGENT
from k8s_http.client import ApiClient
from k8s_http.config import load_config
from k8s_http.errors import K8sHttpError
from k8s_http.objects import DEPLOYMENTS, SERVICES

PAGE_SIZE = 500
# The bench's own prefix: the audit-log counter never takes these reads for the operator's.
USER_AGENT = BENCH_USER_AGENT + "-bare"


def paged_list(client: ApiClient, resource, namespace: str, label_selector: str | None) -> int:
    """Items read by a paged list; each item is dropped as its page arrives."""
    count = 0

    def drop(_item: dict) -> dict:
        nonlocal count
        count += 1
        return {}

    client.list(resource, namespace=namespace, label_selector=label_selector,
                limit=PAGE_SIZE, transform=drop)
    return count


def streaming_list(client: ApiClient, resource, namespace: str, label_selector: str | None) -> int:
    """Issue 17a's bench/scale_bare.measure: one streaming list (sendInitialEvents) up to
    its end bookmark, events dropped; it times a paged list itself where the apiserver
    refuses to stream. It takes no label selector: in the fleet's namespace every
    Deployment and Service carries the operator's label, so it reads the same objects."""
    from scale_bare import measure       # bench/scale_bare.py (issue 17a)
    return measure(client, resource, namespace)["objects"]


LISTERS = {"paged": paged_list}
try:                                      # present once issue 17a's branch is merged
    import scale_bare  # noqa: F401
except ImportError:
    DEFAULT_MODE = "paged"
else:
    LISTERS["stream"] = streaming_list
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
