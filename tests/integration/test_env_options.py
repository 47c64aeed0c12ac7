"""Options read PGQCTL_<OPTION>, except those that choose what a command changes."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.conftest import run_cli
from tests.integration.jobrows import add_jobs, expired


def test_format_and_schema_come_from_the_environment(dsn: str) -> None:
    result = run_cli("migrate", "--status", env={"PGQCTL_DSN": dsn, "PGQCTL_FORMAT": "csv"})
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("name,status,applied_at\n")
    other = run_cli("migrate", "--check", env={"PGQCTL_DSN": dsn, "PGQCTL_SCHEMA": "elsewhere"})
    assert other.exit_code == 3


def test_a_workers_queue_variable_does_not_narrow_requeue(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 2, status="failed", queue="mail", attempts=3)
    add_jobs(conn, 1, status="failed", queue="billing", attempts=3)
    env = {"PGQCTL_QUEUE": "mail", "PGQCTL_KIND": "nothing", "PGQCTL_DRY_RUN": "1"}
    result = run_cli("requeue", "--failed", "--dsn", dsn, env=env)
    assert result.exit_code == 0, result.stderr
    (pending,) = conn.execute("SELECT count(*) FROM jobs WHERE status = 'pending'").fetchone() or (
        0,
    )
    assert pending == 3


def test_a_stray_dry_run_variable_does_not_disable_reap(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    expired(conn, 1)
    result = run_cli("reap", "--dsn", dsn, env={"PGQCTL_DRY_RUN": "1"})
    assert result.exit_code == 0, result.stderr
    assert conn.execute("SELECT status FROM jobs").fetchone() == ("pending",)
