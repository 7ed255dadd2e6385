"""The apiserver's half of a metrics scrape's authn/authz, as a FakeApiServer action.

TokenReviews are answered from TOKENS (bearer token -> user name);
SubjectAccessReviews allow exactly the users in ALLOWED to `get` the
non-resource path /metrics, and nothing else.

    server.script(answer_reviews, match=is_review, times=None)
"""

from __future__ import annotations

from k8s_http.core.objects import SUBJECTACCESSREVIEWS, TOKENREVIEWS

PROMETHEUS = "system:serviceaccount:monitoring:prometheus"
TOKENS = {"prom-token": PROMETHEUS, "reader-token": PROMETHEUS,
          "alice-token": "alice", "other-token": "someone"}
ALLOWED = {PROMETHEUS}


def is_review(request) -> bool:
    return request.method == "POST" and request.path in (TOKENREVIEWS.path(),
                                                         SUBJECTACCESSREVIEWS.path())


def answer_reviews(ex) -> bool:
    body = ex.request.json()
    if ex.request.path == TOKENREVIEWS.path():
        user = TOKENS.get(body["spec"]["token"])
        status = {"authenticated": True, "user": {"username": user, "groups": []}} \
            if user else {"authenticated": False}
    else:
        attrs = body["spec"]["nonResourceAttributes"]
        status = {"allowed": body["spec"]["user"] in ALLOWED
                  and attrs == {"path": "/metrics", "verb": "get"}}
    return ex.respond(201, {**body, "status": status})
