"""pgqctl.sql: the named queries as they are sent."""

from __future__ import annotations

import importlib

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
    assert len(query("worker_exchange")) <= limit
