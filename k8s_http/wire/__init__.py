"""The wire: HTTP to the apiserver and the Kubernetes verbs on top of it.

`connection` (deadline-aware HTTP/1.1), `stream` (bodies, the watch stream),
`watchproto` (sans-I/O watch decoding), `transport` (pool, retries, auth),
`client` (`ApiClient`: the verbs on plain dicts), `defaults` (limits shared
with the cache). Imports `core`, `config` and `ops`; knows nothing of caches.
"""
