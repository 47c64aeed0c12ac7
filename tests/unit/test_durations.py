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
