"""Fixtures shared by the integration tests (fakes on 127.0.0.1, no control plane).

    pki        the test CA and its certificates (tests/support/certs.py)
    server     the HTTP fake apiserver over TLS from `pki`, taking the bearer
               TOKEN (tests/support/fake_apiserver.py); an exception in one of
               its handlers fails the test. A module that needs another server
               (plain HTTP, client certificates, objects made first) overrides
               `server` with its own.
    apiserver  a plain-HTTP fake apiserver that answers TokenReviews and
               SubjectAccessReviews as tests/support/reviews.py decides
"""

from __future__ import annotations

import pytest

from tests.support.certs import test_pki
from tests.support.fake_apiserver import TOKEN, FakeApiServer
from tests.support.reviews import answer_reviews, is_review


@pytest.fixture(scope="session")
def pki():
    return test_pki()


@pytest.fixture
def server(pki):
    with FakeApiServer(pki=pki, token=TOKEN) as srv:
        yield srv
    assert not srv.errors, srv.errors


@pytest.fixture
def apiserver():
    with FakeApiServer() as srv:
        srv.script(answer_reviews, match=is_review, times=None)
        yield srv
