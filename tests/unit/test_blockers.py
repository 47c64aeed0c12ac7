"""The timeouts as PostgreSQL takes them and as messages spell them, and
which server errors are timeouts."""

from __future__ import annotations

import pytest

from pgqctl.blockers import Timeouts, spelled, timeout_kind


def test_timeouts_become_whole_milliseconds() -> None:
    assert Timeouts(lock=2, statement=90).settings() == {
        "lock_timeout": "2000",
        "statement_timeout": "90000",
    }
    # 0 lifts the limit; a positive one never rounds down to it.
    assert Timeouts(lock=0, statement=0.0001).settings() == {
        "lock_timeout": "0",
        "statement_timeout": "1",
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250ms"), (1, "1s"), (59.6, "1m"), (90, "1m30s"), (600, "10m"), (3600, "60m")],
)
def test_a_timeout_is_spelled_as_the_options_take_it(seconds: float, text: str) -> None:
    assert spelled(seconds) == text


class ServerError(Exception):
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def test_only_the_timeouts_are_timeouts() -> None:
    assert timeout_kind(ServerError("55P03", "canceling statement due to lock timeout")) == "lock"
    statement = ServerError("57014", "canceling statement due to statement timeout")
    assert timeout_kind(statement) == "statement"
    # A cancel asked for (pg_cancel_backend, Ctrl-C) shares the SQLSTATE.
    assert timeout_kind(ServerError("57014", "canceling statement due to user request")) is None
    assert timeout_kind(ServerError("40001", "could not serialize access")) is None
    assert timeout_kind(ValueError("no sqlstate")) is None
