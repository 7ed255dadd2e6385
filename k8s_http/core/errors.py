"""The exception tree, and the one place an HTTP status becomes an exception.

Loops branch on these types, never on message text. Every `ApiError` carries
the apiserver's `Status` (reason, message, details) when the server sent one.
Messages are cut short and never carry request headers, so a bearer token can
never leak through an exception.
"""

from __future__ import annotations

import json

__all__ = [
    "K8sHttpError",
    "ApiError",
    "BadRequestError",
    "UnauthorizedError",
    "ForbiddenError",
    "NotFoundError",
    "ConflictError",
    "AlreadyExistsError",
    "GoneError",
    "InvalidError",
    "TooManyRequestsError",
    "ServerError",
    "RedirectError",
    "TransportError",
    "ApiConnectionError",
    "ApiTimeoutError",
    "ProtocolError",
    "NotLeaderError",
    "from_status",
    "is_too_large_resource_version",
    "has_status_cause",
    "is_namespace_terminating",
]

# An error payload is evidence, not a log file: keep only this much of it.
MAX_MESSAGE_CHARS = 1024


class K8sHttpError(Exception):
    """Base of everything this package raises on purpose."""


class ApiError(K8sHttpError):
    """The apiserver answered with a non-success status.

    `code` is the HTTP status, `reason` the Status reason (``NotFound``,
    ``Conflict``, ...), `details` the Status details dict, `status` the
    whole Status object ({} when the body was not a Status).
    """

    def __init__(self, code: int, message: str = "", *, reason: str = "",
                 details: dict | None = None, status: dict | None = None,
                 method: str = "", path: str = "", retry_after_seconds: float | None = None):
        self.code = code
        self.reason = reason
        self.message = _clip(message)
        self.details = details or {}
        self.status = status or {}
        self.method = method
        self.path = path
        self.retry_after_seconds = retry_after_seconds
        where = f"{method} {path}: " if method else ""
        text = f"{where}{code} {reason}".rstrip()
        if self.message:
            text += f": {self.message}"
        super().__init__(text)


class BadRequestError(ApiError):
    """400: the request is malformed."""


class UnauthorizedError(ApiError):
    """401: the credentials were missing, wrong or expired."""


class ForbiddenError(ApiError):
    """403: RBAC (or admission) denied the request; the message names verb and resource."""


class NotFoundError(ApiError):
    """404."""


class ConflictError(ApiError):
    """409: optimistic-concurrency conflict (stale resourceVersion) or apply conflict."""


class AlreadyExistsError(ConflictError):
    """409 with reason AlreadyExists: a create found the name taken."""


class GoneError(ApiError):
    """410: the resourceVersion asked for is older than etcd's compaction."""


class InvalidError(ApiError):
    """422: the object failed validation."""


class TooManyRequestsError(ApiError):
    """429: priority and fairness (or a client limit) rejected the request."""


class ServerError(ApiError):
    """5xx."""


class RedirectError(ApiError):
    """3xx: never followed, so the token never leaves for another host."""


class TransportError(K8sHttpError):
    """The request did not get a usable HTTP answer."""


class ApiConnectionError(TransportError):
    """Connecting failed, or the connection was lost before a complete answer."""


class ApiTimeoutError(TransportError):
    """A connect, header, read or total deadline passed."""


class ProtocolError(TransportError):
    """The bytes on the wire broke HTTP or the watch protocol."""


class NotLeaderError(K8sHttpError):
    """A write was refused locally because this process no longer holds the lease."""


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    422: InvalidError,
    429: TooManyRequestsError,
}


def _clip(text: str) -> str:
    text = str(text)
    if len(text) > MAX_MESSAGE_CHARS:
        return text[:MAX_MESSAGE_CHARS] + "...(truncated)"
    return text


def _parse_status(body) -> dict:
    """Return the body as a Status dict, or {} if it is not one."""
    if isinstance(body, dict):
        obj = body
    elif isinstance(body, (bytes, bytearray, str)) and body:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return {}
    else:
        return {}
    if isinstance(obj, dict) and obj.get("kind") == "Status":
        return obj
    return {}


def from_status(code: int, body=None, *, method: str = "", path: str = "",
                retry_after_seconds: float | None = None) -> ApiError:
    """Map an HTTP status and body (bytes, str, dict or None) to a typed ApiError.

    This is the only place a status code becomes an exception type.
    """
    status = _parse_status(body)
    reason = str(status.get("reason", "") or "")
    message = status.get("message")
    if message is None:
        if isinstance(body, (bytes, bytearray)):
            message = bytes(body[:MAX_MESSAGE_CHARS]).decode("utf-8", "replace")
        elif isinstance(body, str):
            message = body
        else:
            message = ""
    details = status.get("details") if isinstance(status.get("details"), dict) else {}
    if 300 <= code < 400:
        cls: type[ApiError] = RedirectError
        message = message or "redirects are never followed"
    elif code == 409 and reason == "AlreadyExists":
        cls = AlreadyExistsError
    elif code in _BY_CODE:
        cls = _BY_CODE[code]
    elif code >= 500:
        cls = ServerError
    else:
        cls = ApiError
    return cls(code, str(message).strip(), reason=reason, details=details, status=status,
               method=method, path=path, retry_after_seconds=retry_after_seconds)


def is_too_large_resource_version(err: BaseException) -> bool:
    """True for the apiserver's 504 "Too large resource version" (client-go's check).

    The apiserver sends it when a list or watch asks for a resourceVersion newer
    than its cache has seen; the only way out is to relist with RV="".
    """
    if not isinstance(err, ApiError) or err.code != 504:
        return False
    if has_status_cause(err, "ResourceVersionTooLarge"):
        return True
    return "too large resource version" in err.message.lower()


def has_status_cause(err: BaseException, reason: str) -> bool:
    """The error's Status lists a cause with this reason (client-go's `HasStatusCause`).

    A typed cause, not message text: messages change between versions and
    languages, cause reasons are API.
    """
    if not isinstance(err, ApiError):
        return False
    causes = err.details.get("causes")
    if not isinstance(causes, list):    # the server's JSON: any value may stand here
        return False
    return any(isinstance(cause, dict) and cause.get("reason") == reason for cause in causes)


def is_namespace_terminating(err: BaseException) -> bool:
    """A create refused because its namespace is being deleted: nothing can be created
    there any more, so retrying is futile (client-go's controllers give up quietly)."""
    return has_status_cause(err, "NamespaceTerminating")
