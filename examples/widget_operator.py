"""A complete operator on k8s_http: every Widget gets a ConfigMap of its name."""
import sys

from k8s_http import CONFIGMAPS, Manager, Resource, load_config, owner_reference, setup_logging

WIDGETS = Resource("example.com", "v1", "widgets", namespaced=True, kind="Widget")


def build(config, **manager_options) -> Manager:
    mgr = Manager(config, "widget-controller", **manager_options)
    widgets, client = mgr.store_for(WIDGETS), mgr.client   # what the reconcile reads, writes

    def reconcile(key):
        widget = widgets.get(key)                     # from the informer cache
        if widget is None:
            return None                               # deleted: the GC removes its ConfigMap
        desired = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": key.name, "namespace": key.namespace,
                                # controller=True: changes to the ConfigMap map back to this key
                                "ownerReferences": [owner_reference(widget)]},
                   "data": {"size": str(widget["spec"].get("size", 1))}}
        client.apply(CONFIGMAPS, desired, field_manager="widget-controller", force=True)

    mgr.add_controller(WIDGETS, reconcile, owns=[CONFIGMAPS], workers=4)
    return mgr


if __name__ == "__main__":
    setup_logging("info")
    sys.exit(build(load_config()).run())      # blocks until SIGTERM; start()/stop() to embed
