"""A job completing itself: its program's writes and its "done" in one transaction.

Real worker processes run real programs that connect on their own and call
`pgqctl.complete_job` (or the plain SQL function) inside their transaction.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql

import pgqctl
from pgqctl.errors import BadInput
from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, job
from tests.support.processes import PgqctlProcess, start_worker

__all__ = ["start_worker"]  # the fixture, used by name

# A job's program: in one transaction, write a row to `notes`, then complete
# the job (through the Python API, or the plain SQL any language can send),
# then do what argv[2] says: exit with a status, or sleep that long first.
PROGRAM = r"""
import os, sys, time
import psycopg, pgqctl
how, then = sys.argv[1], sys.argv[2]
with psycopg.connect(os.environ["APP_DSN"], autocommit=True) as conn:
    with conn.transaction():
        conn.execute("INSERT INTO notes (job_id) VALUES (%s)", (int(os.environ["PGQCTL_JOB_ID"]),))
        if how == "api":
            pgqctl.complete_job(conn)
        else:
            conn.execute(
                "SELECT pgqctl_complete_job(%s, %s)",
                (int(os.environ["PGQCTL_JOB_ID"]), int(os.environ["PGQCTL_JOB_CLAIM"])),
            )
print("committed", flush=True)
if then.startswith("sleep"):
    time.sleep(float(then[5:]))
else:
    sys.exit(int(then))
"""


@pytest.fixture
def notes(conn: psycopg.Connection[Any]) -> Callable[[], list[int]]:
    conn.execute("CREATE TABLE notes (job_id bigint NOT NULL)")
    return lambda: [r[0] for r in conn.execute("SELECT job_id FROM notes ORDER BY 1")]


def program(dsn: str, how: str, then: str) -> dict[str, Any]:
    return {"argv": [sys.executable, "-c", PROGRAM, how, then], "env": {"APP_DSN": dsn}}


def events_of(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines()]


@pytest.mark.parametrize("how", ["api", "sql"])
def test_a_program_completes_its_job_with_its_own_writes(
    conn: psycopg.Connection[Any], dsn: str, notes: Callable[[], list[int]], how: str
) -> None:
    """Handed back twice before, the job runs its first try on its third
    claim: the claim (PGQCTL_JOB_CLAIM), not the try, fences the completion."""
    [job_id] = insert_jobs(conn, [program(dsn, how, "0")])
    conn.execute("UPDATE jobs SET attempts = 2, handbacks = 2 WHERE id = %s", (job_id,))
    result = run_cli("worker", "--dsn", dsn, "--burst", "--log-format", "json")
    assert result.exit_code == 0, result.stderr
    row = job(conn, job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("done", 3, None)
    assert row["finished_at"] is not None and row["locked_until"] is None
    assert notes() == [job_id]
    events = events_of(result.stderr)
    [done] = [e for e in events if e["event"] == "done"]
    assert done["completed_by"] == "job"
    assert done["message"].startswith(f"job {job_id} done by its own transaction")
    assert "error" not in done
    assert not [e for e in events if e["event"] in ("lease_lost", "failed", "retry")]


def test_a_program_that_completed_then_exits_nonzero_leaves_the_job_done(
    conn: psycopg.Connection[Any], dsn: str, notes: Callable[[], list[int]]
) -> None:
    [job_id] = insert_jobs(conn, [program(dsn, "api", "3")])
    result = run_cli("worker", "--dsn", dsn, "--burst", "--log-format", "json")
    assert result.exit_code == 0, result.stderr
    row = job(conn, job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("done", 1, None)
    assert notes() == [job_id]
    [done] = [e for e in events_of(result.stderr) if e["event"] == "done"]
    assert done["completed_by"] == "job"
    assert done["exit_code"] == 3
    assert "then its program ended with exit status 3 (it stays done)" in done["message"]


def test_a_program_running_on_after_completing_is_neither_renewed_nor_stopped(
    conn: psycopg.Connection[Any],
    dsn: str,
    notes: Callable[[], list[int]],
    start_worker: Callable[..., PgqctlProcess],
) -> None:
    """A renewal that finds the job done by its program lets the program
    finish: the lease it would renew is no longer the worker's to hold."""
    [job_id] = insert_jobs(conn, [program(dsn, "api", "sleep4")])
    worker = start_worker(dsn, "--burst", "--lease", "3s", "--log-format", "json")
    worker.wait_for_log('"completed_by_job"')
    assert job(conn, job_id)["status"] == "done"
    assert worker.proc.wait(60) == 0
    events = [json.loads(line) for line in worker.log.splitlines()]
    [done] = [e for e in events if e["event"] == "done"]
    assert done["completed_by"] == "job" and done["duration"] >= 3.5
    assert "error" not in done
    assert not [e for e in events if e["event"] in ("lease_lost", "cancelled", "failed")]
    assert notes() == [job_id]


def test_completion_is_fenced_by_the_claim(
    conn: psycopg.Connection[Any], notes: Callable[[], list[int]]
) -> None:
    """Only the running claim may complete: any other raises JobNotRunning,
    and its transaction's own writes roll back with it."""
    [job_id] = insert_jobs(conn, [{"argv": ["true"]}])

    def complete(claim: int) -> None:
        with conn.transaction():
            conn.execute("INSERT INTO notes (job_id) VALUES (%s)", (claim,))
            pgqctl.complete_job(conn, job_id=job_id, claim=claim)

    # Pending: nothing runs.
    with pytest.raises(pgqctl.JobNotRunning, match=f"job {job_id} claim 0 is not running"):
        complete(0)
    conn.execute("UPDATE jobs SET status = 'running', attempts = 2 WHERE id = %s", (job_id,))
    with pytest.raises(
        pgqctl.JobNotRunning,
        match=r"claim 1 is stale: it was claimed again since \(claim 2, now running\)",
    ):
        complete(1)
    with pytest.raises(pgqctl.JobNotRunning, match=r"has had only 2 claim\(s\), not 3"):
        complete(3)
    complete(2)
    assert job(conn, job_id)["status"] == "done"
    with pytest.raises(pgqctl.JobNotRunning, match="is not running: it is done") as caught:
        complete(2)
    assert (caught.value.job_id, caught.value.claim) == (job_id, 2)
    assert notes() == [2]
    with pytest.raises(pgqctl.JobNotRunning, match="does not exist"):
        pgqctl.complete_job(conn, job_id=job_id + 1000, claim=1)


def test_complete_job_reads_the_workers_environment_and_says_what_is_missing(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("CREATE SCHEMA other")
    with pytest.raises(BadInput, match="run this in a job started by"):
        pgqctl.complete_job(conn, environ={})
    with pytest.raises(BadInput, match="PGQCTL_JOB_CLAIM must be a whole number"):
        pgqctl.complete_job(conn, environ={"PGQCTL_JOB_ID": "1", "PGQCTL_JOB_CLAIM": "x"})
    # The schema comes from PGQCTL_JOB_SCHEMA, not the connection's search_path.
    with pytest.raises(psycopg.errors.UndefinedFunction):
        pgqctl.complete_job(
            conn,
            environ={"PGQCTL_JOB_ID": "1", "PGQCTL_JOB_CLAIM": "1", "PGQCTL_JOB_SCHEMA": "other"},
        )


def test_a_role_with_only_execute_completes_and_can_change_nothing_else(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """EXECUTE on the function is all a program's role needs; without it, or
    by the table, the role can change nothing."""
    role = f"invoicer_{conn.info.backend_pid}"
    schema = conn.execute("SELECT current_schema()").fetchone()
    assert schema is not None
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema[0]), sql.Identifier(role)
            )
        )
        [job_id] = insert_jobs(conn, [{"argv": ["true"]}])
        conn.execute("UPDATE jobs SET status = 'running', attempts = 1 WHERE id = %s", (job_id,))
        as_role = conninfo.make_conninfo(dsn, user=role)
        with psycopg.connect(as_role, autocommit=True) as other:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                pgqctl.complete_job(other, job_id=job_id, claim=1, schema=schema[0])
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {}(bigint, integer) TO {}").format(
                    sql.Identifier(schema[0], "pgqctl_complete_job"), sql.Identifier(role)
                )
            )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                other.execute(
                    sql.SQL("UPDATE {} SET status = 'done'").format(
                        sql.Identifier(schema[0], "jobs")
                    )
                )
            # A temporary `jobs` of the caller's cannot stand in for the queue's.
            other.execute("CREATE TEMP TABLE jobs (id bigint, status text, attempts int)")
            pgqctl.complete_job(other, job_id=job_id, claim=1, schema=schema[0])
        assert job(conn, job_id)["status"] == "done"
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_child_learns_its_schema(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "env"
    assert run_cli("migrate", "--dsn", dsn, "--schema", "billing").exit_code == 0
    script = f'echo "$PGQCTL_JOB_SCHEMA" > {out}'
    enqueued = run_cli(
        "enqueue",
        "--dsn",
        dsn,
        "--schema",
        "billing",
        "t",
        json.dumps({"argv": ["sh", "-c", script]}),
    )
    assert enqueued.exit_code == 0, enqueued.stderr
    result = run_cli("worker", "--dsn", dsn, "--schema", "billing", "--burst")
    assert result.exit_code == 0, result.stderr
    assert out.read_text() == "billing\n"
