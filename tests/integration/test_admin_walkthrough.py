"""The seed's lease walkthrough, end to end, with pgqctl as the operator.

Rows come from the seed's own INSERTs; workers are the seed's plain SQL.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.conftest import run_cli
from tests.support.seed import SEED_CLAIM, SEED_ROWS


def cli_json(dsn: str, *args: str) -> Any:
    result = run_cli(*args, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_the_seed_walkthrough(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute(SEED_ROWS)

    # Worker A claims job 1 with a fresh lease.
    assert conn.execute(SEED_CLAIM).fetchone() == (1, "send_receipt", {"order_id": 1}, 1)

    leases = cli_json(dsn, "leases")
    assert [(j["id"], j["expired"]) for j in leases] == [(4, True), (5, True), (1, False)]
    assert all(j["seconds_left"] < -290 for j in leases[:2])
    assert 0 < leases[2]["seconds_left"] <= 300
    assert {j["id"] for j in cli_json(dsn, "leases", "--expired")} == {4, 5}

    reaped = cli_json(dsn, "reap")
    assert [(j["id"], j["kind"], j["status"], j["attempts"]) for j in reaped] == [
        (4, "send_receipt", "pending", 1),
        (5, "sync_crm", "failed", 3),
    ]
    assert all(j["last_error"].startswith("lease expired at ") for j in reaped)
    job5 = conn.execute(
        "SELECT locked_until, locked_by, finished_at IS NOT NULL FROM jobs WHERE id = 5"
    ).fetchone()
    assert job5 == (None, None, True)

    # Worker C claims: job 4 again, as its attempt 2.
    assert conn.execute(SEED_CLAIM).fetchone() == (4, "send_receipt", {"order_id": 3}, 2)
    # Job 4's first worker was only slow: its report of attempt 1 is fenced off.
    stale = conn.execute(
        "UPDATE jobs SET status = 'done', locked_until = NULL"
        " WHERE id = 4 AND attempts = 1 RETURNING id, status"
    ).fetchall()
    assert stale == []
    # Worker A reports job 1 done.
    done = conn.execute(
        "UPDATE jobs SET status = 'done', locked_until = NULL"
        " WHERE id = 1 AND attempts = 1 RETURNING id, status"
    ).fetchall()
    assert done == [(1, "done")]

    # The operator gives job 5 one more try; attempts (the fence) stays 3.
    requeued = cli_json(dsn, "requeue", "--id", "5")
    assert [(j["id"], j["status"], j["attempts"], j["max_attempts"]) for j in requeued] == [
        (5, "pending", 3, 4)
    ]
    # It is due now: a worker for its kind claims it as attempt 4.
    claim_crm = SEED_CLAIM.replace(
        "AND run_at <= now()", "AND run_at <= now() AND kind = 'sync_crm'"
    )
    assert conn.execute(claim_crm).fetchone() == (5, "sync_crm", {"customer": "carol"}, 4)

    stats = cli_json(dsn, "stats")
    assert stats["totals"] == {"pending": 2, "running": 2, "done": 1, "failed": 0, "cancelled": 0}
    assert stats["expired_leases"] == 0
