"""Durations as operators type them."""

from __future__ import annotations

import pytest

from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 30),
        ("2.5", 2.5),
        ("30s", 30),
        ("5m", 300),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        ("250ms", 0.25),
        (" 7D ", 604800),
        ("0", 0),
    ],
)
def test_accepted(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "abc", "5x", "-3", "m5", "1h 30m", "nan", "inf", "1e300", "36501d"]
)
def test_rejected_with_an_example(text: str) -> None:
    with pytest.raises(BadInput) as err:
        parse_duration(text, what="--delay")
    assert "--delay" in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.parametrize("text", ["5M", "250MS", "1h5M", "2Ms"])
def test_minutes_are_lower_case_never_guessed(text: str) -> None:
    with pytest.raises(BadInput, match="case-sensitive for minutes"):
        parse_duration(text, what="--delay")


def test_weeks_and_upper_case_units_that_cannot_be_misread() -> None:
    assert parse_duration("1w") == parse_duration("7D") == parse_duration("168H") == 604800


@pytest.mark.parametrize("text", ["7", "0", "1.5"])
def test_an_age_needs_a_unit(text: str) -> None:
    with pytest.raises(BadInput, match="has no unit: give one of ms, s, m, h, d, w"):
        parse_duration(text, what="--older-than", age=True)
    assert parse_duration(f"{text}d", age=True) == float(text) * 86400
