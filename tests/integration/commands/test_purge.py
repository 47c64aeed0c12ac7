"""`pgqctl purge` as an operator runs it: finished jobs deleted in batches."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, expired


def test_purge_deletes_old_done_rows_in_batches_and_nothing_else(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 25, status="done", attempts=1, finished_at=ago("8 days"))
    recent = add_jobs(conn, 2, status="done", attempts=1)
    failed = add_jobs(conn, 3, status="failed", attempts=3, finished_at=ago("8 days"))
    live = add_jobs(conn, 4) + expired(conn, 2)

    dry = cli_json(dsn, "purge", "--older-than", "7d", "--dry-run")
    assert dry == {"deleted": 0, "dry_run": True, "matched": 25}

    result = run_cli("purge", "--older-than", "7d", "--batch-size", "7", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"deleted": 25}
    assert "deleted 25 done jobs finished more than 7d00h ago" in result.stderr
    remaining = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")]
    assert remaining == sorted(recent + failed + live)

    assert cli_json(dsn, "purge", "--status", "failed") == {"deleted": 3}
    assert cli_json(dsn, "purge", "--status", "all") == {"deleted": 2}
    remaining = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")]
    assert remaining == sorted(live)
