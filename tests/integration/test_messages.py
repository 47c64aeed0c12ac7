"""Mistakes that looked like success and messages that led nowhere, each as
an operator meets it through the CLI."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.integration.jobrows import add_jobs

# --- schema names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # Advised `migrate --schema ''`, which then failed with a raw error.
        (["stats", "--schema", ""], "a schema name cannot be empty"),
        (["migrate", "--schema", ""], "a schema name cannot be empty"),
        # "database error: unacceptable schema name "pg_temp"".
        (["migrate", "--schema", "pg_temp"], "'pg_temp' is reserved by PostgreSQL"),
        # Cut to 63 bytes by the server without a word.
        (["migrate", "--schema", "s" * 64], "at most 63 bytes, this one has 64"),
        (["--schema", "é" * 32, "stats"], "at most 63 bytes, this one has 64"),
    ],
)
def test_a_schema_name_postgresql_would_refuse_or_cut_is_bad_input(
    dsn: str, args: list[str], message: str
) -> None:
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    with psycopg.connect(dsn) as conn:
        made = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sss%'"
        ).fetchone()
    assert made == (0,)


def test_a_63_byte_schema_name_is_kept_whole(dsn: str) -> None:
    name = "s" * 63
    assert run_cli("migrate", "--schema", name, "--dsn", dsn).exit_code == 0
    result = run_cli("stats", "--schema", name, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr


# --- options that disagree -----------------------------------------------------------


def test_on_conflict_error_speaks_the_cli_spelling(dsn: str) -> None:
    args = ("enqueue", "k", '{"argv": ["true"]}', "--unique-key", "a", "--dsn", dsn)
    assert run_cli(*args).exit_code == 0
    result = run_cli(*args, "--on-conflict", "error")
    assert result.exit_code == 1
    assert "`--on-conflict skip` gives its id instead" in result.stderr
    assert "on_conflict=" not in result.stderr  # was: (on_conflict="skip")


@pytest.mark.parametrize("order", [("--json", "--format", "csv"), ("--format", "csv", "--json")])
def test_json_and_another_format_are_refused(dsn: str, order: tuple[str, ...]) -> None:
    """Was: exit 0 with JSON, where the script expected CSV."""
    result = run_cli("list", *order, "--dsn", dsn)
    assert result.exit_code == 2
    assert "--json and --format csv disagree" in result.stderr
    assert result.stdout == ""


def test_json_with_format_json_is_fine(dsn: str) -> None:
    result = run_cli("list", "--json", "--format", "json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_requeue_limit_0_means_every_match_as_list_does(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """Was: exit 2, "0 is not in the range x>=1"."""
    add_jobs(conn, 3, status="failed", attempts=3)
    result = run_cli("requeue", "--failed", "--limit", "0", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)) == 3


def test_a_kind_with_a_newline_keeps_one_line_in_a_piped_table(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    add_jobs(conn, 1, kind="two\nlines")
    result = run_cli("list", "--format", "plain", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3  # header, rule, the job
    assert "two\\x0alines" in result.stdout
