"""pgqctl.sql: the named queries as they are sent."""

from __future__ import annotations

import importlib

from pgqctl import claims
from pgqctl.sql import queries, query


def test_queries_are_sent_without_their_comment_lines() -> None:
    for name, text in queries().items():
        assert text, name
        assert not [line for line in text.splitlines() if line.lstrip().startswith("--")], name


def test_the_worker_exchange_fits_psycopgs_parse_cache() -> None:
    # Over the limit, psycopg parses the statement's placeholders again on
    # every call: thousands of times a second in a busy worker.
    limit = getattr(
        importlib.import_module("psycopg._queries"), "MAX_CACHED_STATEMENT_LENGTH", 4096
    )
    # Each worker sends it with the claim for its --queue and --kind in place.
    for queues, kinds in [((), ()), (("q",), ()), ((), ("k",)), (("q",), ("k",))]:
        statement = claims.exchange_statement(queues, kinds)
        assert "{claim}" in query("worker_exchange") and "{claim}" not in statement
        assert len(statement.encode()) <= limit, (queues, kinds)
    assert len(claims.exchange_statement(from_floor=True).encode()) <= limit


def test_spaces_are_dropped_after_commas_and_around_equals_but_not_in_literals() -> None:
    from pgqctl.sql import _without_comment_lines

    body = "-- a comment\n  SELECT a, b\n  FROM t WHERE c = 'x, y = z' AND d = 'it''s, = ok', e\n"
    assert _without_comment_lines(body) == (
        "SELECT a,b\nFROM t WHERE c='x, y = z' AND d='it''s, = ok',e"
    )
