"""MetricsAuthorizer: TokenReview + SubjectAccessReview decisions and their caches (fake client)."""

import pytest

from k8s_http.core import errors
from k8s_http.ops.authn import MetricsAuthorizer, server_tls_context
from k8s_http.core.objects import SUBJECTACCESSREVIEWS, TOKENREVIEWS
from tests.support.clock import FakeClock
from tests.support.fake_client import InMemoryApiClient

PROMETHEUS = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
              "groups": ["system:serviceaccounts", "system:authenticated"],
              "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]}}


class Cluster:
    """What the apiserver decides from: tokens and their users, users RBAC lets get /metrics."""

    def __init__(self):
        self.tokens = {"good": PROMETHEUS}
        self.allowed = {PROMETHEUS["username"]}

    def token_review(self, review):
        user = self.tokens.get(review["spec"]["token"])
        return {"authenticated": True, "user": user} if user else {}

    def access_review(self, review):
        allowed = review["spec"]["user"] in self.allowed
        return {"allowed": allowed, "reason": "" if allowed else "no RBAC rule"}


@pytest.fixture
def cluster():
    return Cluster()


@pytest.fixture
def setup(cluster):
    client, clock = InMemoryApiClient(creatable={TOKENREVIEWS, SUBJECTACCESSREVIEWS}), \
        FakeClock(100.0)
    client.answer(TOKENREVIEWS, cluster.token_review)
    client.answer(SUBJECTACCESSREVIEWS, cluster.access_review)
    return MetricsAuthorizer(client, clock=clock), client, clock


def count(client, resource):
    """Reviews sent (failed ones included)."""
    return sum(1 for call in client.calls if call[:2] == ("create", resource.plural))


def test_allowed_scrape_and_the_reviews_sent(setup):
    authz, client, _ = setup
    decision = authz.check("Bearer good")
    assert (decision.code, decision.user) == (200, PROMETHEUS["username"])
    (_, review), (_, sar) = client.created
    assert review == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                      "metadata": {}, "spec": {"token": "good"}}
    assert sar == {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                   "metadata": {}, "spec": {"user": PROMETHEUS["username"], "uid": "u-1",
                            "groups": PROMETHEUS["groups"], "extra": PROMETHEUS["extra"],
                            "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}


@pytest.mark.parametrize("header", [None, "", "Basic dXNlcjpwYXNz", "Bearer", "Bearer   "])
def test_no_bearer_token_is_401_without_asking(setup, header):
    authz, client, _ = setup
    assert authz.check(header).code == 401
    assert client.created == []


def test_rejected_token_is_401(setup):
    authz, _, _ = setup
    assert authz.check("Bearer forged").code == 401


def test_authenticated_but_not_authorized_is_403(setup, cluster):
    authz, client, _ = setup
    cluster.tokens["other"] = {"username": "alice", "groups": []}
    decision = authz.check("bearer other")
    assert decision.code == 403
    assert "'alice' may not get /metrics: no RBAC rule" in decision.reason


def test_token_reviews_cached_one_minute(setup):
    authz, client, clock = setup
    for _ in range(5):
        assert authz.check("Bearer good").allowed
    assert count(client, TOKENREVIEWS) == 1
    clock.now += 59.9
    authz.check("Bearer good")
    assert count(client, TOKENREVIEWS) == 1
    clock.now += 0.1
    authz.check("Bearer good")
    assert count(client, TOKENREVIEWS) == 2


def test_rejected_tokens_are_cached_too(setup):
    authz, client, _ = setup
    authz.check("Bearer forged")
    authz.check("Bearer forged")
    assert count(client, TOKENREVIEWS) == 1


def test_allow_cached_five_minutes(setup, cluster):
    authz, client, clock = setup
    authz.check("Bearer good")
    cluster.allowed.clear()              # RBAC revoked: seen after the allow TTL
    clock.now += 299
    cluster.tokens = {"good": PROMETHEUS}
    assert authz.check("Bearer good").code == 200
    clock.now += 1
    assert authz.check("Bearer good").code == 403
    assert count(client, SUBJECTACCESSREVIEWS) == 2


def test_deny_cached_thirty_seconds(setup, cluster):
    authz, client, clock = setup
    cluster.allowed.clear()
    assert authz.check("Bearer good").code == 403
    cluster.allowed.add(PROMETHEUS["username"])   # a RoleBinding is created
    clock.now += 29.9
    assert authz.check("Bearer good").code == 403
    clock.now += 0.1
    assert authz.check("Bearer good").code == 200


def test_api_errors_are_500_and_not_cached(setup):
    authz, client, _ = setup
    client.fail = errors.ApiConnectionError("connection refused")
    assert authz.check("Bearer good").code == 500
    client.fail = errors.NotLeaderError("a guarded client")
    assert authz.check("Bearer good").code == 500
    client.fail = None
    assert authz.check("Bearer good").code == 200


def test_the_token_is_not_kept_in_the_cache(setup):
    authz, _, _ = setup
    authz.check("Bearer good-token-value")
    assert "good-token-value" not in repr(authz._tokens._items)


def test_cache_is_bounded(setup):
    authz, client, _ = setup
    for i in range(5000):
        authz.check(f"Bearer random-{i}")
    assert len(authz._tokens._items) <= 4096


def test_tls_context_names_the_files_when_missing(tmp_path):
    with pytest.raises(ValueError, match="cannot load the metrics certificate"):
        server_tls_context(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
