"""A row whose attempts counter plain SQL set to PostgreSQL's integer
maximum: every claim that met it failed with 'integer out of range', so no
job of the queue ever ran. Now the worker fails that job for good, saying
why, and runs the rest, with or without limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.conftest import cli_json
from tests.support.jobrows import add_jobs
from tests.support.processes import PgqctlProcess, start_worker

__all__ = ["start_worker"]  # a fixture


@pytest.mark.parametrize("limited", [False, True], ids=["no limit", "limited"])
def test_a_job_at_the_attempts_maximum_fails_alone_and_the_others_run(
    dsn: str,
    conn: psycopg.Connection[Any],
    start_worker: Callable[..., PgqctlProcess],
    limited: bool,
) -> None:
    if limited:
        cli_json(dsn, "limit", "set", "--kind", "k", "--concurrency", "2")
    [worn] = add_jobs(conn, 1, kind="k", payload='{"argv": ["true"]}')
    conn.execute(
        "UPDATE jobs SET attempts = 2147483647, max_attempts = 2147483647 WHERE id = %s",
        (worn,),
    )
    others = add_jobs(conn, 5, kind="k", payload='{"argv": ["true"]}')
    worker = start_worker(dsn, "--burst", "--concurrency", "4")
    assert worker.finish(60) == 0
    [(status, error)] = conn.execute(
        "SELECT status, last_error FROM jobs WHERE id = %s", (worn,)
    ).fetchall()
    assert status == "failed"
    assert "attempts counter is at its maximum" in error
    assert "integer out of range" not in worker.log
    done = conn.execute(
        "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'done'", (others,)
    ).fetchone()
    assert done == (5,)
