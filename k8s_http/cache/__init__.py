"""The cache: list-watch into a Store, one per resource.

`watchstep` (the list-watch rules as a pure state machine), `watcher` (its
I/O loop), `informer` (watchers feeding one `Store`, changes becoming keys),
`store` (the cache and its indexes), `projection`, `packed` and `packcode`
(what the store keeps of each object, and how compactly). Imports `core`,
`config`, `ops` and `wire`; knows nothing of queues or reconcilers.
"""
