"""k8s_http.core.quantity: Kubernetes quantities compared by exact value."""

from fractions import Fraction

import pytest

from k8s_http import parse_quantity, same_quantity


@pytest.mark.parametrize("a, b", [("1000m", "1"), ("1", 1), ("0.5", "500m"), ("1Gi", "1024Mi"),
                                  ("1k", "1000"), ("1e3", "1k"), ("100m", ".1"), ("+1", "1"),
                                  ("1E3", "1k"), ("2.", "2"),
                                  ("1E", "1000P"), ("1Ei", 2**60), ("2e0", "2")])
def test_spellings_of_one_quantity_are_equal(a, b):
    assert parse_quantity(a) == parse_quantity(b)


def test_values_are_exact():
    assert parse_quantity("250m") == Fraction(1, 4)
    assert parse_quantity("2Ki") == 2048
    assert parse_quantity("3u") == Fraction(3, 10**6)
    assert parse_quantity("1n") == Fraction(1, 10**9)
    assert parse_quantity("1e-3") == Fraction(1, 1000)
    # no float on the way: 0.1 + 0.2 is exactly 0.3 here
    assert parse_quantity("100m") + parse_quantity("200m") == parse_quantity("300m")


@pytest.mark.parametrize("value, message", [
    (True, "not a boolean"), (-1, "negative"), (1.5, "string such as"), (None, "string such as"),
    ("-1", "is not a quantity"), ("1.5.5", "is not a quantity"), ("lots", "is not a quantity"),
    ("1Gb", "is not a quantity"), ("", "is not a quantity"), ("1e", "is not a quantity"),
    ("Mi", "is not a quantity"), ("1e31", "exponent out of range"),
    ("1e-31", "exponent out of range"),
])
def test_what_is_not_a_quantity_says_why(value, message):
    with pytest.raises(ValueError, match=message):
        parse_quantity(value)


def test_same_quantity_falls_back_to_equality_for_non_quantities():
    assert same_quantity("1000m", "1") and same_quantity(1, "1")
    assert not same_quantity("1", "2")
    assert same_quantity("lots", "lots") and not same_quantity("lots", "1")


def test_a_remembered_parse_answers_the_same_and_a_bad_text_fails_every_time():
    for _ in range(2):
        assert parse_quantity("1500m") == Fraction(3, 2)
        with pytest.raises(ValueError, match="is not a quantity"):
            parse_quantity("12 apples")
    assert same_quantity("64Mi", "64Mi") and same_quantity("1Gi", "1024Mi")
    assert not same_quantity("64Mi", "65Mi")
