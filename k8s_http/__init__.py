"""k8s_http: a Kubernetes operator runtime on the Python standard library.

The public API, and nothing else. A minimal operator:

    mgr = Manager(load_config(), "my-controller")
    mgr.add_controller(MY, reconcile, owns=[DEPLOYMENTS, SERVICES], workers=4)
    mgr.run()            # blocks until SIGTERM; start() returns, stop() is idempotent

Importing this package connects to nothing, starts no thread, reads no
configuration and configures no logging.
"""

from .core.applydiff import config_hash, needs_apply, port_key, with_config_hash
from .core.errors import (AlreadyExistsError, ApiConnectionError, ApiError, ApiTimeoutError,
                          BadRequestError, ConflictError, ForbiddenError, GoneError, InvalidError,
                          K8sHttpError, NotFoundError, NotLeaderError, ProtocolError,
                          RedirectError, ServerError, TooManyRequestsError, TransportError,
                          UnauthorizedError, has_status_cause, is_namespace_terminating)
from .core.names import (is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_env_var_name,
                         is_resource_name)
from .core.objects import (AWAITS_RECONCILE_READS, CONFIGMAPS, CRDS, DEPLOYMENTS, EVENTS,
                           LEASES, NAMESPACES, PODS, REPLICASETS, SECRETS, SERVICEACCOUNTS,
                           SERVICES, ObjectKey, Resource, add_finalizer, awaits_reconcile,
                           controller_of, get_condition, has_finalizer,
                           is_controlled_by, key_of, meta_of, owner_reference, remove_finalizer,
                           resource_version_of, rfc3339_now, set_condition, strip_managed_fields)
from .core.quantity import parse_quantity, same_quantity
from .core.shards import slot_label_value, slot_of
from .config.cluster import ClusterConfig, ConfigError, load_config
from .ops.cli import flag_error, run_manager
from .ops.flags import (add_manager_flags, manager_options, new_parser, parse_duration,
                        positive_int, with_flag_names)
from .ops.log import setup_logging
from .wire.client import ApiClient
from .wire.watchproto import WatchEvent
from .cache.projection import DroppedFieldRead, Projection
from .cache.store import Store
from .control.events import EventRecorder
from .control.manager import VERSION as __version__
from .control.manager import Manager
from .control.memo import GenerationMemo
from .control.podstatus import PodCheckSchedule, pod_problem
from .control.runner import Result, TerminalError, current_work, queued_seconds
from .control.settled import SettledVersions
from .control.statushold import StatusHold
from .control.writethrough import write_through

__all__ = [
    "Manager", "Result", "TerminalError", "ObjectKey", "Resource", "Store", "queued_seconds",
    "current_work", "pod_problem", "PodCheckSchedule",
    "StatusHold", "SettledVersions", "GenerationMemo", "write_through",
    "ApiClient", "load_config", "ClusterConfig", "ConfigError", "WatchEvent",
    "ApiError", "BadRequestError", "UnauthorizedError", "ForbiddenError", "NotFoundError",
    "ConflictError", "AlreadyExistsError", "GoneError", "InvalidError",
    "TooManyRequestsError", "ServerError", "RedirectError", "TransportError",
    "ApiConnectionError", "ApiTimeoutError", "ProtocolError", "NotLeaderError",
    "K8sHttpError", "has_status_cause", "is_namespace_terminating",
    "CONFIGMAPS", "SERVICES", "EVENTS", "NAMESPACES", "PODS", "SECRETS", "SERVICEACCOUNTS",
    "DEPLOYMENTS", "REPLICASETS", "LEASES", "CRDS",
    "key_of", "controller_of", "is_controlled_by", "owner_reference", "get_condition",
    "set_condition", "has_finalizer", "add_finalizer", "remove_finalizer",
    "strip_managed_fields", "rfc3339_now", "meta_of", "resource_version_of",
    "awaits_reconcile", "AWAITS_RECONCILE_READS",
    "parse_quantity", "same_quantity", "needs_apply", "port_key", "with_config_hash",
    "slot_of", "slot_label_value",
    "config_hash",
    "is_dns1123_label", "is_dns1123_subdomain", "is_dns1035_label", "is_env_var_name",
    "is_resource_name",
    "setup_logging", "EventRecorder", "Projection", "DroppedFieldRead",
    "new_parser", "add_manager_flags", "manager_options", "parse_duration", "positive_int",
    "with_flag_names", "flag_error", "run_manager",
]
