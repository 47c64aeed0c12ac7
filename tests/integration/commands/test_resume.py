"""`pgqctl resume`: pauses ended, by the command or by their own end."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.integration.commands.test_pause import pauses


def test_resume_ends_pauses_and_a_queue_not_paused_is_a_no_op(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert run_cli("pause", "--force", "emails", "--reason", "down", "--dsn", dsn).exit_code == 0
    result = run_cli("resume", "emails", "nothing", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    [resumed] = json.loads(result.stdout)
    assert (resumed["queue"], resumed["reason"], resumed["until"]) == ("emails", "down", None)
    assert "queue nothing is not paused: nothing to do" in result.stderr
    assert "resumed 1 queue (emails)" in result.stderr
    assert pauses(conn) == []
    again = run_cli("resume", "emails", "--json", "--dsn", dsn)
    assert (again.exit_code, again.stdout) == (0, "[]\n")
    assert "queue emails is not paused" in again.stderr


def test_a_pause_that_has_ended_is_no_pause(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO paused_queues (queue, reason, paused_at, until) "
        "VALUES ('old', 'gone by', now() - interval '1 hour', now() - interval '1 minute')"
    )
    assert cli_json(dsn, "stats")["paused"] == []
    assert "is not paused" in run_cli("resume", "old", "--dsn", dsn).stderr
    [paused] = cli_json(dsn, "pause", "--force", "old")
    # A new pause, not the old one's reason or start.
    assert paused["updated"] is False and paused["reason"] is None
