"""The `My` resource (mine.jp/v1) and what the operator makes of it, as pure functions.

  * ``my.spec``: the resource, the names and defaults, what a usable spec is;
  * ``my.render``: the Deployment and Service a `My` asks for, and the patch
    that removes other managers' entries from the fields it decides;
  * ``my.status``: the status a `My` should report, from its Deployment.

No I/O, no clock, no threads: controller.py reads the caches, writes through
the client and calls these. Imports point one way, controller -> my.status,
my.render -> my.spec -> k8s_http; nothing here imports controller. The package
itself re-exports nothing: import from the module that owns a name.
"""
