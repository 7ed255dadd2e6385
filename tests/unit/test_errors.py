"""errors.from_status: the one place an HTTP status becomes an exception type."""

from __future__ import annotations

import json

import pytest

from k8s_http.core import errors
from k8s_http.core.errors import from_status, is_too_large_resource_version


def status(code: int, reason: str = "", message: str = "", **extra) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "code": code, "reason": reason, "message": message, **extra}


@pytest.mark.parametrize("code,cls", [
    (400, errors.BadRequestError),
    (401, errors.UnauthorizedError),
    (403, errors.ForbiddenError),
    (404, errors.NotFoundError),
    (409, errors.ConflictError),
    (410, errors.GoneError),
    (422, errors.InvalidError),
    (429, errors.TooManyRequestsError),
    (500, errors.ServerError),
    (502, errors.ServerError),
    (503, errors.ServerError),
    (504, errors.ServerError),
    (301, errors.RedirectError),
    (302, errors.RedirectError),
    (307, errors.RedirectError),
    (308, errors.RedirectError),
    (405, errors.ApiError),
    (418, errors.ApiError),
])
def test_every_code_maps_to_its_type(code, cls):
    err = from_status(code, status(code, "SomeReason", "some message"))
    assert type(err) is cls
    assert isinstance(err, errors.ApiError) and isinstance(err, errors.K8sHttpError)
    assert err.code == code


def test_already_exists_is_a_conflict_but_not_every_conflict_is_already_exists():
    exists = from_status(409, status(409, "AlreadyExists", 'configmaps "a" already exists'))
    conflict = from_status(409, status(409, "Conflict", "the object has been modified"))
    assert type(exists) is errors.AlreadyExistsError
    assert isinstance(exists, errors.ConflictError)
    assert type(conflict) is errors.ConflictError
    assert not isinstance(conflict, errors.AlreadyExistsError)


def test_status_fields_are_kept():
    details = {"name": "a", "kind": "configmaps", "causes": [{"reason": "FieldValueInvalid"}]}
    body = status(422, "Invalid", "ConfigMap \"a\" is invalid", details=details)
    err = from_status(422, json.dumps(body).encode(), method="POST",
                      path="/api/v1/namespaces/default/configmaps")
    assert err.reason == "Invalid"
    assert err.message == 'ConfigMap "a" is invalid'
    assert err.details == details
    assert err.status == body
    assert err.method == "POST" and err.path.endswith("/configmaps")
    assert str(err) == ('POST /api/v1/namespaces/default/configmaps: 422 Invalid: '
                        'ConfigMap "a" is invalid')


@pytest.mark.parametrize("body", [status(404, "NotFound", "gone"),
                                  json.dumps(status(404, "NotFound", "gone")),
                                  json.dumps(status(404, "NotFound", "gone")).encode()])
def test_body_may_be_dict_str_or_bytes(body):
    err = from_status(404, body)
    assert err.reason == "NotFound" and err.message == "gone"


def test_non_json_body_becomes_the_message():
    err = from_status(502, b"<html><body>Bad Gateway</body></html>\n")
    assert type(err) is errors.ServerError
    assert err.status == {} and err.reason == ""
    assert err.message == "<html><body>Bad Gateway</body></html>"


def test_json_that_is_not_a_status_is_not_taken_for_one():
    err = from_status(404, {"kind": "Pod", "reason": "NotFound"})
    assert err.status == {} and err.reason == ""


def test_empty_and_missing_bodies():
    for body in (None, b"", ""):
        err = from_status(503, body)
        assert type(err) is errors.ServerError and err.message == ""
        assert str(err) == "503"


def test_redirect_has_a_message_even_without_a_body():
    err = from_status(302, b"")
    assert "never followed" in str(err)


def test_long_messages_are_truncated():
    err = from_status(500, status(500, "InternalError", "x" * 100_000))
    assert len(err.message) < errors.MAX_MESSAGE_CHARS + 50
    assert err.message.endswith("...(truncated)")
    raw = from_status(500, b"y" * 1_000_000)
    assert len(str(raw)) < errors.MAX_MESSAGE_CHARS + 50


def test_deeply_nested_json_body_does_not_crash():
    err = from_status(500, b"[" * 200_000)
    assert type(err) is errors.ServerError and err.status == {}


def test_retry_after_is_carried():
    err = from_status(429, status(429, "TooManyRequests"), retry_after_seconds=3.0)
    assert err.retry_after_seconds == 3.0


@pytest.mark.parametrize("err,expected", [
    (from_status(504, status(504, "Timeout", "Too large resource version: 10, current: 5",
                             details={"causes": [{"reason": "ResourceVersionTooLarge",
                                                  "message": "Too large resource version"}]})),
     True),
    (from_status(504, status(504, "Timeout", "Too large resource version: 10, current: 5")),
     True),
    (from_status(504, status(504, "Timeout", "request timed out")), False),
    (from_status(500, status(500, "InternalError", "too large resource version")), False),
    (errors.ApiTimeoutError("too large resource version"), False),
    (ValueError("too large resource version"), False),
])
def test_is_too_large_resource_version(err, expected):
    assert is_too_large_resource_version(err) is expected


def test_status_causes_are_read_in_one_place():
    from k8s_http.core.errors import from_status, has_status_cause, is_namespace_terminating
    body = {"kind": "Status", "reason": "Forbidden", "message": "unable to create new content in "
            "namespace x because it is being terminated",
            "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]}}
    err = from_status(403, body)
    assert has_status_cause(err, "NamespaceTerminating") and is_namespace_terminating(err)
    assert not has_status_cause(err, "FieldValueInvalid")
    # the message alone is not the cause: messages change, cause reasons are API
    body["details"] = {}
    assert not is_namespace_terminating(from_status(403, body))
    assert not is_namespace_terminating(ValueError("namespace is being terminated"))
