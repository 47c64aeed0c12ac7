"""A job completing itself: its program's writes and its "done" in one transaction.

A job's program connects with its own credentials and, inside the
transaction that does its work, marks its job done::

    with psycopg.connect(my_dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO invoices ...")
        pgqctl.complete_job(conn)

Both commit together or not at all. The job and its claim come from the
worker's PGQCTL_JOB_ID and PGQCTL_JOB_CLAIM, the schema from
PGQCTL_JOB_SCHEMA. The completion is fenced as the worker's own report: when
the claim is no longer the one running (reaped, claimed again, cancelled,
done already), it raises JobNotRunning and the transaction cannot commit, so
a stale run's writes roll back. Any language does the same with
``SELECT pgqctl_complete_job($1, $2)`` (sql/migrations/0011_complete_job.sql).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pgqctl.errors import BadInput, PgqctlError

if TYPE_CHECKING:
    import psycopg

# What the SQL function raises when the claim is not the one running.
NOT_RUNNING_SQLSTATE = "PGQ01"


class JobNotRunning(PgqctlError):
    """The job's claim is not the running one: nothing may commit.

    `job_id` and `claim` are what the call gave; the message says where the
    job stands instead (the database's words).
    """

    def __init__(self, job_id: int, claim: int, message: str) -> None:
        self.job_id, self.claim = job_id, claim
        super().__init__(message)


def complete_job(
    conn: psycopg.Connection[Any],
    *,
    job_id: int | None = None,
    claim: int | None = None,
    schema: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Mark the running job done in the caller's open transaction.

    Without arguments, the job, claim and schema are the ones the worker
    put in this process's environment (`claim`: the job's attempts counter
    as this run's claim left it, PGQCTL_JOB_CLAIM). Nothing is committed here: the
    caller's commit makes the job done together with its own writes.
    Raises JobNotRunning when the claim is stale (roll back), BadInput
    when the job or claim is unknown to this process.
    """
    from psycopg import errors, sql

    env = os.environ if environ is None else environ
    job_id = _number("job_id", job_id, env, "PGQCTL_JOB_ID")
    claim = _number("claim", claim, env, "PGQCTL_JOB_CLAIM")
    if schema is None:
        schema = env.get("PGQCTL_JOB_SCHEMA") or None
    function = (
        sql.Identifier("pgqctl_complete_job")
        if schema is None
        else sql.Identifier(schema, "pgqctl_complete_job")
    )
    statement = sql.SQL("SELECT {}(%s, %s)").format(function)
    try:
        # Never prepared: behind a transaction pooler a prepared statement
        # stays on a server connection that other clients get.
        conn.execute(statement, (job_id, claim), prepare=False)
    except errors.DatabaseError as exc:
        if exc.sqlstate == NOT_RUNNING_SQLSTATE:
            raise JobNotRunning(job_id, claim, exc.diag.message_primary or str(exc)) from exc
        raise


def _number(name: str, given: int | None, env: Mapping[str, str], variable: str) -> int:
    if given is not None:
        return given
    text = env.get(variable)
    if text is None:
        raise BadInput(
            f"no {name}: pass {name}= or run this in a job started by `pgqctl worker` "
            f"(it sets {variable})"
        )
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"{variable} must be a whole number, not {text!r}") from None
